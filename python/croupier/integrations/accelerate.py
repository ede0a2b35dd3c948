"""Accelerate: ``prepare`` loaders of croupier samplers without dealing their data twice.

``Accelerator.prepare`` wraps every map-style loader's batches in ``BatchSamplerShard``, which
hands process ``p`` of ``P`` every ``P``-th batch: right for a sampler that yields the whole
dataset, a loss of ``(P - 1) / P`` of the data for a croupier sampler, which already yields only
its rank's share (croupier's samplers refuse to be iterated that way). :func:`prepare` calls
``accelerator.prepare`` and turns the wrapper of every loader whose sampler is croupier's into a
pass-through: every batch of the rank's share, in order, whatever its size. The prepared loader
keeps everything else Accelerate does (device placement, gradient accumulation's end of epoch,
``skip_first_batches``), and ``set_epoch`` on it reaches the croupier sampler, also after
``skip_first_batches``::

    from croupier.integrations.accelerate import prepare

    sampler = croupier.DistributedSampler(dataset, num_replicas=accelerator.num_processes,
                                          rank=accelerator.process_index, seed=0)
    loader = DataLoader(dataset, batch_size=8, sampler=sampler)
    model, optimizer, loader = prepare(accelerator, model, optimizer, loader)

To resume mid-epoch, Accelerate's documented way is exact here: ``accelerator.load_state``, then
for the epoch in progress ``loader.set_epoch(epoch)`` and iterate
``accelerator.skip_first_batches(loader, batches_done)`` (the loader itself from the next epoch
on).
"""

from __future__ import annotations

import functools
from typing import Any

from croupier.samplers._base import StatefulSampler

__all__ = ["check_skip", "croupier_sampler_of", "pass_through", "prepare"]


def prepare(accelerator: Any, *objects: Any, **kwargs: Any) -> Any:
    """``accelerator.prepare(*objects, **kwargs)``, then :func:`pass_through` on every prepared
    loader whose sampler is croupier's. Returns what ``accelerator.prepare`` returns."""
    prepared = accelerator.prepare(*objects, **kwargs)
    for obj in prepared if isinstance(prepared, tuple) else (prepared,):
        if croupier_sampler_of(obj) is not None:
            pass_through(obj)
    return prepared


def croupier_sampler_of(loader: Any) -> StatefulSampler[Any, Any] | None:
    """The croupier sampler a (prepared) loader draws from, if any: its index sampler, or its
    batch sampler, found through Accelerate's and torch's wrappers."""
    seen: set[int] = set()
    todo = [getattr(loader, "batch_sampler", None), getattr(loader, "sampler", None)]
    while todo:
        obj = todo.pop()
        if obj is None or id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, StatefulSampler):
            return obj
        todo += [getattr(obj, "batch_sampler", None), getattr(obj, "sampler", None)]
    return None


def pass_through(loader: Any) -> None:
    """Makes the ``BatchSamplerShard`` of an Accelerate-prepared ``loader`` a pass-through for
    its croupier sampler: every batch of the rank's share, in order, whatever its size (a
    croupier batch sampler's sizes differ by bucket), no padding. The wrapper keeps its
    ``num_processes`` and ``batch_size``, so ``total_batch_size`` (and with it
    ``gather_for_metrics``' cut of the last batch) stays right, and gets a ``sampler`` link so
    that the loader's ``set_epoch`` reaches the croupier sampler through
    ``skip_first_batches`` too.

    Raises ``TypeError`` if the loader draws from no croupier sampler, and ``ValueError`` for
    the two Accelerate modes that cannot serve a rank-aware sampler: ``split_batches=True``
    (the loader's batch size would be the global one, split between processes: give the
    loader the per-process batch size instead) and ``dispatch_batches=True`` (process 0 would
    iterate its own share and hand it out to every process)."""
    sampler = croupier_sampler_of(loader)
    if sampler is None:
        raise TypeError(f"{type(loader).__name__} draws from no croupier sampler")
    if type(loader).__name__ == "DataLoaderDispatcher":
        raise ValueError(
            "dispatch_batches=True: process 0 would iterate its own croupier sampler and deal "
            "its batches to every process, so the other ranks' shares are never trained. "
            "Build the Accelerator with DataLoaderConfiguration(dispatch_batches=False)"
        )
    shard = getattr(loader, "batch_sampler", None)
    while shard is not None and not _is_shard(shard):
        shard = getattr(shard, "batch_sampler", None)
    if shard is not None:
        _shard_pass_through(shard, sampler)
    _checkpointable(loader, sampler)


def _shard_pass_through(shard: Any, sampler: StatefulSampler[Any, Any]) -> None:
    if shard.split_batches:
        raise ValueError(
            "split_batches=True: the loader's batch size would be split between the "
            "processes, but a croupier sampler already gives each process its own batches. "
            "Use split_batches=False and give the loader the per-process batch size"
        )
    shard.__class__ = _pass_through_class()
    shard.sampler = (
        sampler  # DataLoaderShard.set_epoch reaches batch_sampler(.batch_sampler).sampler
    )


def _checkpointable(loader: Any, sampler: StatefulSampler[Any, Any]) -> None:
    """Makes the prepared ``loader`` (Accelerate's ``DataLoaderShard``) save and restore
    croupier's loader state with ``accelerator.save_state``/``load_state``: its inner torch
    loader counts the batches it hands out (Accelerate snapshots its state before each
    look-ahead fetch, so the snapshot counts the batches training received), and the loader is
    flagged as stateful, which is what makes Accelerate save it (``dl_state_dict.bin``)."""
    base = getattr(loader, "base_dataloader", None)
    if base is None or not _is_adapter(loader):
        return  # not Accelerate's DataLoaderShard (a dispatcher was refused above)
    from croupier.loader import StatefulDataLoader, _count_batches_of

    if not isinstance(base, StatefulDataLoader):
        inner = base.batch_sampler
        while _is_shard(inner):
            inner = inner.batch_sampler
        if inner is sampler:  # a croupier batch sampler: its items are batches
            per_batch, drop_last = 1, False
        else:  # torch's BatchSampler (or a StatefulDataLoader's) over the index sampler
            per_batch, drop_last = int(inner.batch_size), bool(inner.drop_last)
        _count_batches_of(base, sampler, per_batch, drop_last)
    loader.use_stateful_dataloader = True
    loader.dl_state_dict = base.state_dict()
    loader.load_state_dict = functools.partial(_load, loader)


def _is_adapter(loader: Any) -> bool:
    return any(c.__name__ == "DataLoaderAdapter" for c in type(loader).__mro__)


def _load(loader: Any, state: Any) -> None:
    """``load_state_dict`` of a prepared croupier loader: restores croupier's loader state (on
    any number of processes: an elastic resume continues the epoch) and makes the snapshot
    Accelerate saves, and the loader's epoch, the restored ones."""
    base = loader.base_dataloader
    base.load_state_dict(state)
    loader.dl_state_dict = base.state_dict()
    loader.iteration = base.epoch  # DataLoaderShard passes its own epoch on at each iteration


def check_skip(sampler: Any, skip: int) -> None:
    """Called when Accelerate's ``skip_first_batches`` (its ``SkipBatchSampler``) starts
    iterating ``sampler`` to skip ``skip`` batches counted from the epoch's start. The count
    comes from the run that saved the checkpoint: after a restored loader state of another
    number of processes it names other batches, so this refuses with the way that is exact.
    After a restored state of the same world the loader's position is dropped (the skip
    counts from the epoch's start, Accelerate's meaning), so nothing is skipped twice."""
    epoch = sampler.epoch
    el = sampler.elastic_rest(epoch)
    start = sampler.next_start()
    if el is not None and start == el.resumed_at and start < len(sampler):
        raise ValueError(
            f"accelerator.skip_first_batches(loader, {skip}) after a checkpoint of "
            f"num_processes={el.origin} on {sampler.num_replicas}: the count is in batches of "
            f"the old world and would skip the wrong samples here. accelerator.load_state "
            f"restored the loader's own state (croupier's prepare saves it with save_state), "
            f"which continues the epoch on this world: iterate the loader itself "
            f"(loader.set_epoch(epoch); for batch in loader: ...) without skip_first_batches"
        )
    if start and el is None:
        sampler.set_skip(0)  # the skip counts from the epoch's start


def _is_shard(obj: Any) -> bool:
    return any(c.__name__ == "BatchSamplerShard" for c in type(obj).__mro__)


@functools.cache
def _pass_through_class() -> type:
    """``BatchSamplerShard`` whose iteration is its batch sampler's, whole: what a croupier
    sampler's loader needs (made on first use, so accelerate is imported only then)."""
    from accelerate.data_loader import BatchSamplerShard

    class CroupierPassThrough(BatchSamplerShard):  # type: ignore[misc]
        """Accelerate's ``BatchSamplerShard`` over a croupier sampler, which already deals the
        data to the processes: every batch, in order; ``num_processes`` and ``batch_size`` stay
        for what Accelerate computes from them."""

        def __iter__(self) -> Any:
            return iter(self.batch_sampler)

        def __len__(self) -> int:
            return len(self.batch_sampler)

    return CroupierPassThrough
