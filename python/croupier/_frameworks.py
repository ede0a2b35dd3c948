"""How croupier's rank-aware samplers notice the training frameworks that would deal their data
a second time, and refuse loudly instead of losing it.

A croupier sampler already holds only its rank's share. Frameworks built around
single-process samplers shard whatever they are given again:

- Accelerate's ``prepare`` wraps every map-style loader's batches in ``BatchSamplerShard``,
  which gives rank ``r`` of ``P`` processes every ``P``-th batch of what it iterates: with a
  croupier sampler, each rank trains on ``1 / P`` of its own share (the HF Trainer prepares its
  loaders the same way). ``croupier.integrations.accelerate.prepare`` (and the HF Trainer
  mixin) turn that wrapper into a pass-through.
- Lightning (``use_distributed_sampler=True``) re-creates a loader's batch sampler as
  ``cls(DistributedSampler(dataset), batch_size=..., drop_last=...)``.

Both are detected here: the first when iteration starts (the wrapper is one of the few frames
above the sampler's ``__iter__``; once per epoch), the second when a sampler arrives where a
croupier batch sampler takes its data.
"""

from __future__ import annotations

import sys
from types import FrameType

__all__ = [
    "ahead_of_training",
    "check_not_batched_again",
    "check_not_sharded_again",
    "prefetching_loader",
    "refuse_a_sampler",
]

# How many frames above a sampler's __iter__ a sharding wrapper can sit (torch's BatchSampler
# and the wrapper's two generator frames in between).
_FRAMES = 6
# The methods of BatchSamplerShard that iterate the batch sampler it wraps.
_WRAPPER_METHODS = frozenset({"__iter__", "_iter_with_no_split", "_iter_with_split"})
# Accelerate's skip_first_batches wraps the batch sampler in SkipBatchSampler, whose __iter__
# is among those methods: a count of batches from the checkpoint's run is checked there.


def check_not_sharded_again(sampler: object) -> None:
    """Raises ``RuntimeError`` when ``sampler`` (with more than one rank) is being iterated by
    Accelerate's ``BatchSamplerShard`` over more than one process: every rank would train on a
    fraction of its share, silently. Under Accelerate's ``skip_first_batches``, checks its
    count (:func:`croupier.integrations.accelerate.check_skip`)."""
    try:
        frame = sys._getframe(2)  # above the sampler's own __iter__
    except ValueError:  # called from the top of a stack
        return
    for _ in range(_FRAMES):
        if frame is None:
            return
        if frame.f_code.co_name not in _WRAPPER_METHODS:
            frame = frame.f_back  # type: ignore[assignment]
            continue
        owner = frame.f_locals.get("self")
        if type(owner).__name__ == "SkipBatchSampler":
            skip = getattr(owner, "skip_batches", 0)
            if isinstance(skip, int) and skip > 0:
                from croupier.integrations.accelerate import check_skip

                check_skip(sampler, skip)
            return
        processes = getattr(owner, "num_processes", 1)
        if (
            type(owner).__name__ == "BatchSamplerShard"
            and processes > 1
            and getattr(sampler, "num_replicas", 1) > 1
        ):
            raise RuntimeError(
                f"{type(sampler).__name__} (rank {getattr(sampler, 'rank', '?')} of "
                f"{getattr(sampler, 'num_replicas', '?')}) is being sharded a second time by "
                f"accelerate's BatchSamplerShard over {processes} processes: each rank "
                "would train on a fraction of its own share. It already deals the data to the "
                "ranks: prepare the loader with croupier.integrations.accelerate.prepare("
                "accelerator, loader) (with the HF Trainer, use "
                "croupier.integrations.transformers.CroupierTrainerMixin)"
            )
        frame = frame.f_back  # type: ignore[assignment]


def check_not_batched_again(sampler: object) -> None:
    """Raises ``TypeError`` when batch sampler ``sampler`` is being iterated by torch's
    ``BatchSampler``: a ``DataLoader`` given it as ``sampler=`` batches its batches again, and
    the dataset would get lists where it expects indices (torch's own error says nothing of
    the cause)."""
    try:
        frame = sys._getframe(2)  # above the sampler's own __iter__
    except ValueError:  # called from the top of a stack
        return
    owner = None
    for _ in range(3):  # past the sampler's own frames (SequentialBucketSampler's generator)
        if frame is None:
            return
        owner = frame.f_locals.get("self")
        if owner is not sampler:
            break
        frame = frame.f_back  # type: ignore[assignment]
    batcher = type(owner)
    if (
        batcher.__name__ == "BatchSampler"
        and batcher.__module__.startswith("torch.utils.data")
        and getattr(owner, "sampler", None) is sampler
        # (not a BatchSampler built around it on purpose)
        and _iterator_above(frame, "DataLoaderIter") is not None
    ):
        name = type(sampler).__name__
        raise TypeError(
            f"{name} is a batch sampler (it yields lists of indices), given to a DataLoader as "
            "sampler=, which batches what it yields again: pass it as batch_sampler= "
            f"(DataLoader(dataset, batch_sampler={name}(...)), or croupier.StatefulDataLoader("
            f"dataset, batch_sampler={name}(...)) to checkpoint the loader)"
        )


# How many frames above a sampler's __iter__ a DataLoader's iterator can sit (torch's
# BatchSampler generator, its _next_index, and a sampler's own generator in between).
_LOADER_FRAMES = 5


def _iterator_above(frame: FrameType | None, kind: str) -> object | None:
    """The first ``self`` among the few frames from ``frame`` up whose class (or a base)
    is named ``...kind``: torch's DataLoader iterators, or torchdata's (not subclasses of
    torch's)."""
    for _ in range(_LOADER_FRAMES):
        if frame is None:
            return None
        owner = frame.f_locals.get("self")
        if any(c.__name__.endswith(kind) for c in type(owner).__mro__):
            return owner
        frame = frame.f_back
    return None


def prefetching_loader() -> object | None:
    """The iterator of the torch ``DataLoader`` with worker processes that is starting to
    iterate the calling sampler (``None`` without workers, or outside a ``DataLoader``): it
    reads the sampler ahead of training, by up to ``prefetch_factor`` batches per worker.
    Called from a sampler's ``__iter__``."""
    try:
        frame = sys._getframe(2)  # above the sampler's own __iter__
    except ValueError:
        return None
    return _iterator_above(frame, "MultiProcessingDataLoaderIter")


def ahead_of_training(loader: object) -> int:
    """Batches a DataLoader iterator has sent to its workers that training has not taken yet
    (0 when it cannot tell)."""
    sent, taken = getattr(loader, "_send_idx", 0), getattr(loader, "_rcvd_idx", 0)
    return sent - taken if isinstance(sent, int) and isinstance(taken, int) else 0


def refuse_a_sampler(cls: str, argument: str, value: object) -> None:
    """Raises ``TypeError`` when ``value``, given as ``argument`` of batch sampler ``cls``, is a
    sampler: a framework re-creating the batch sampler around its own index sampler (Lightning
    with ``use_distributed_sampler=True``)."""
    from croupier._torch import Sampler

    if not isinstance(value, Sampler):
        return
    raise TypeError(
        f"{cls} got a sampler ({type(value).__name__}) as its {argument}: a framework is "
        f"re-creating it around a sampler of its own (Lightning does with "
        f"use_distributed_sampler=True, and for every loader in trainer.predict and with "
        f"overfit_batches), which would deal the data a second time. {cls} is already "
        "rank-aware: pass it in a croupier.StatefulDataLoader (which Lightning leaves alone "
        "when training), or build the Trainer with use_distributed_sampler=False (predict: "
        "pass a croupier.DistributedSampler in a DataLoader instead)"
    )
