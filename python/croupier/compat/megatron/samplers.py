"""Megatron-LM's pretraining samplers, by their names: the same micro-batches from the same
``consumed_samples``, with a state.

Megatron-LM (``megatron/training/datasets/data_samplers.py``, not on PyPI) builds its training
loader around one of two batch samplers, each yielding one rank's micro-batches:

- :class:`MegatronPretrainingSampler` (``--dataloader-type single``): the samples in their
  order, from ``consumed_samples`` on, in groups of ``micro_batch_size * data_parallel_size``,
  each rank taking its contiguous ``micro_batch_size`` of every group;
- :class:`MegatronPretrainingRandomSampler` (``--dataloader-type cyclic``): an epoch's
  ``torch.randperm`` seeded with the epoch, dealt to the ranks in strides, or with
  ``data_sharding`` (Megatron's default) each rank shuffling its own contiguous bucket of the
  samples; the epoch and the place in it follow from ``consumed_samples``, which every
  micro-batch advances by ``micro_batch_size * data_parallel_size``, so iterating again goes
  on into the next epoch.

Here the permutation is the Rust core's ``torch.randperm`` (the variant of the torch in use, or
the one named), and an epoch's batches reach Python as lists cut from numpy arrays, not from one
Python list of every index. Each sampler keeps ``state_dict()``: ``consumed_samples`` as its
iterator has handed batches out, which a new sampler (or Megatron's) resumes from. A loader
whose workers prefetch draws batches ahead of training: resume from the trainer's own count
(Megatron's ``args.consumed_train_samples``), as Megatron-LM does.

Megatron's arithmetic is kept where it surprises: without ``data_sharding``, when
``total_samples`` leaves a partial group, the first ranks can get one micro-batch more than the
others in an epoch, and their counts (and next epochs) drift apart, rank by rank, as they do
in Megatron-LM: checkpoint the trainer's count, not one rank's sampler.

Megatron's assertions are ``ValueError``/``TypeError`` here, raised when the sampler is made
or a state loaded, before anything is computed; where Megatron would fail only at the first
batch (a ``consumed_samples`` inside a micro-batch group of the random sampler) or divide by
zero (fewer samples than one group), croupier refuses at once.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from croupier import _core
from croupier._torch_order import TORCH_ORDERS, torch_randperm_order
from croupier._validate import MAX_LEN, check_bool, check_choice, check_int

__all__ = ["MegatronPretrainingRandomSampler", "MegatronPretrainingSampler"]

# Batches converted to Python lists at a time: one numpy-to-list call per this many indices.
_CHUNK = 1 << 16
_STATE_VERSION = 1


def _common(
    total_samples: object,
    consumed_samples: object,
    micro_batch_size: object,
    data_parallel_rank: object,
    data_parallel_size: object,
) -> tuple[int, int, int, int, int]:
    """Megatron's shared checks: ``total_samples``, ``micro_batch_size`` and
    ``data_parallel_size`` at least 1, the rank below the size, ``consumed_samples`` at least
    0 (Megatron would yield negative indices)."""
    total = check_int("total_samples", total_samples, 1, MAX_LEN)
    consumed = check_int("consumed_samples", consumed_samples, 0, MAX_LEN)
    mbs = check_int("micro_batch_size", micro_batch_size, 1, MAX_LEN)
    size = check_int("data_parallel_size", data_parallel_size, 1, MAX_LEN)
    rank = check_int("data_parallel_rank", data_parallel_rank, 0, size - 1)
    return total, consumed, mbs, rank, size


def _chunks(flat: np.ndarray, mbs: int, add: int = 0) -> Iterator[list[list[int]]]:
    """The whole micro-batches of ``flat`` (plus ``add``) as lists of lists, a chunk of
    about ``_CHUNK`` indices at a time."""
    whole = len(flat) // mbs * mbs
    step = max(_CHUNK // mbs, 1) * mbs
    for at in range(0, whole, step):
        chunk = flat[at : min(at + step, whole)].reshape(-1, mbs)
        yield (chunk.astype(np.int64) + add if add else chunk).tolist()


# Where Megatron-LM defines RandomSeedDataset (megatron.legacy before it moved).
_RANDOM_SEED_DATASET = {
    ("megatron.training.datasets.data_samplers", "RandomSeedDataset"),
    ("megatron.legacy.data.data_samplers", "RandomSeedDataset"),
}


def _is_random_seed_dataset(dataset: object) -> bool:
    """Whether ``dataset`` is a Megatron-LM ``RandomSeedDataset`` (or of a subclass), what
    Megatron's sampler tests with ``isinstance``: its class or a base is the one Megatron-LM
    defines."""
    return any(
        (getattr(c, "__module__", None), c.__name__) in _RANDOM_SEED_DATASET
        for c in type(dataset).__mro__
    )


def _check_state(state: Mapping[str, Any], kind: str, mine: Mapping[str, Any]) -> int:
    """The ``consumed_samples`` of ``state``, once its kind and configuration match ``mine``,
    values and types (its ``data_parallel_size`` is not compared: the count is the whole
    world's)."""
    if not isinstance(state, Mapping):
        raise TypeError(f"state must be a mapping, got {type(state).__name__}")
    missing = [k for k in ("kind", "version", "consumed_samples", *mine) if k not in state]
    if missing:
        raise ValueError(f"state lacks {', '.join(map(repr, missing))}: not a {kind} state")
    if state.get("kind") != kind:
        raise ValueError(f"state is of {state.get('kind')!r}, this sampler is {kind!r}")
    if state.get("version") != _STATE_VERSION:
        raise ValueError(f"state version {state.get('version')!r}, expected {_STATE_VERSION}")
    differences = [
        f"{k}: state has {state.get(k)!r}, this sampler has {v!r}"
        for k, v in mine.items()
        if state[k] != v or type(state[k]) is not type(v)
    ]
    if differences:
        raise ValueError("state is of another configuration: " + "; ".join(differences))
    return check_int("state['consumed_samples']", state.get("consumed_samples"), 0, MAX_LEN)


def _state(sampler: Any, consumed: int) -> dict[str, Any]:
    """A Megatron sampler's state: its kind, the format version, ``consumed_samples``, the
    world it was saved on and its configuration (``sampler._config()``)."""
    return {
        "kind": sampler._KIND,
        "version": _STATE_VERSION,
        "consumed_samples": consumed,
        "data_parallel_size": sampler.data_parallel_size,
        **sampler._config(),
    }


class MegatronPretrainingSampler:
    """Megatron-LM's ``MegatronPretrainingSampler``: the samples ``consumed_samples`` to
    ``total_samples - 1`` in order, in groups of ``micro_batch_size * data_parallel_size``;
    rank ``r`` takes items ``r * micro_batch_size`` to ``(r + 1) * micro_batch_size - 1`` of
    each group. A last, incomplete group is dropped, or with ``drop_last=False`` each rank
    gets its part of it (short or empty, as Megatron yields it). Iterating again starts again
    at ``consumed_samples``, as Megatron's does.

    Args:
        total_samples: samples in the dataset (at least 1).
        consumed_samples: samples the whole world consumed before (below ``total_samples``).
        micro_batch_size: samples per rank per micro-batch (at least 1).
        data_parallel_rank: this rank, in ``[0, data_parallel_size)``.
        data_parallel_size: data-parallel ranks (at least 1).
        drop_last: drop the last incomplete group (Megatron's training loader always does).

    ``len()`` is ``total_samples``, as Megatron's. ``state_dict()`` records
    ``consumed_samples`` as far as the current iterator has handed batches out.

    Example:
        >>> s = MegatronPretrainingSampler(10, 2, 2, 1, 2)
        >>> list(s)
        [[4, 5], [8, 9]]
        >>> s.state_dict()["consumed_samples"]  # both groups handed out
        10
    """

    _KIND = "megatron-pretraining"

    def __init__(
        self,
        total_samples: int,
        consumed_samples: int,
        micro_batch_size: int,
        data_parallel_rank: int,
        data_parallel_size: int,
        drop_last: bool = True,
    ) -> None:
        total, consumed, mbs, rank, size = _common(
            total_samples, consumed_samples, micro_batch_size, data_parallel_rank,
            data_parallel_size,
        )  # fmt: skip
        if consumed >= total:
            raise ValueError(
                f"consumed_samples must be below total_samples ({total}): no samples left to "
                f"consume, got {consumed}"
            )
        self.total_samples = total
        self.consumed_samples = consumed
        self.micro_batch_size = mbs
        self.data_parallel_rank = rank
        self.data_parallel_size = size
        self.drop_last = check_bool("drop_last", drop_last)
        self.micro_batch_times_data_parallel_size = mbs * size
        self._handed_out = consumed  # where the latest iterator stands

    def __len__(self) -> int:
        return self.total_samples

    def __iter__(self) -> Iterator[list[int]]:
        self._handed_out = self.consumed_samples  # a new iterator has handed out nothing
        return self._batches(self.consumed_samples)

    def _batches(self, start: int) -> Iterator[list[int]]:
        total = self.total_samples
        mbs, group = self.micro_batch_size, self.micro_batch_times_data_parallel_size
        groups = (total - start) // group
        first = start + self.data_parallel_rank * mbs
        per_chunk = max(_CHUNK // mbs, 1)
        handed_out = start
        for g in range(0, groups, per_chunk):
            # Group k's part for this rank: first + k * group, ... mbs of them.
            flat = _core.micro_batches(first, group, mbs, g, min(g + per_chunk, groups))
            for batch in flat.reshape(-1, mbs).tolist():
                handed_out += group
                self._handed_out = handed_out
                yield batch
        tail = start + groups * group
        if tail < total and not self.drop_last:
            lo = min(tail + self.data_parallel_rank * mbs, total)
            self._handed_out = total
            yield list(range(lo, min(lo + mbs, total)))

    def _config(self) -> dict[str, Any]:
        return {
            "total_samples": self.total_samples,
            "micro_batch_size": self.micro_batch_size,
            "drop_last": self.drop_last,
        }

    def state_dict(self) -> dict[str, Any]:
        """``{"consumed_samples", ...}``: the samples the whole world consumed once this rank's
        latest iterator handed out what it has (the start, before one), and the
        configuration."""
        return _state(self, self._handed_out)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """The next iteration starts at the state's ``consumed_samples`` (saved on any number
        of ranks; at ``total_samples``, the end of a ``drop_last=False`` run, it yields
        nothing, where Megatron's constructor refuses the count). Refused, the sampler
        unchanged, if the state is of another configuration."""
        consumed = _check_state(state, self._KIND, self._config())
        if consumed > self.total_samples:
            raise ValueError(
                f"state['consumed_samples'] must be at most total_samples "
                f"({self.total_samples}), got {consumed}"
            )
        self.consumed_samples = self._handed_out = consumed

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(total_samples={self.total_samples}, "
            f"consumed_samples={self.consumed_samples}, "
            f"micro_batch_size={self.micro_batch_size}, "
            f"data_parallel_rank={self.data_parallel_rank}, "
            f"data_parallel_size={self.data_parallel_size}, drop_last={self.drop_last})"
        )


class MegatronPretrainingRandomSampler:
    """Megatron-LM's ``MegatronPretrainingRandomSampler``: epoch after epoch, the samples
    shuffled by ``torch.randperm`` with a generator seeded with the epoch, one micro-batch of
    ``micro_batch_size`` per rank per step.

    The epoch is ``consumed_samples // active`` and its consumed part ``consumed_samples %
    active``, ``active`` being ``total_samples`` rounded down to whole groups of
    ``micro_batch_size * data_parallel_size``. With ``data_sharding`` each rank shuffles its
    own ``total_samples // group * micro_batch_size`` contiguous samples (the same permutation
    on every rank); without, one permutation of ``total_samples // micro_batch_size *
    micro_batch_size`` samples is dealt to the ranks in strides. Every micro-batch handed out
    adds ``micro_batch_size * data_parallel_size`` to ``consumed_samples``, so iterating again
    goes on where the last iteration stopped: Megatron's cyclic loader, epoch after epoch.

    Args:
        dataset: the dataset; a Megatron-LM ``RandomSeedDataset`` gets ``set_epoch(epoch)``
            as each iteration starts, as Megatron's sampler gives it.
        total_samples: samples in the dataset, at least one group
            (``micro_batch_size * data_parallel_size``).
        consumed_samples: samples the whole world consumed before; its part of an epoch must
            be whole groups.
        micro_batch_size: samples per rank per micro-batch (at least 1).
        data_parallel_rank: this rank, in ``[0, data_parallel_size)``.
        data_parallel_size: data-parallel ranks (at least 1).
        data_sharding: each rank shuffles its own bucket (Megatron's default), or one
            permutation is dealt in strides.
        randperm: the ``torch.randperm`` to reproduce, ``"torch>=2.6"`` or ``"torch<2.6"``
            (they differ from ``2**32 // 20`` samples on); ``None``: the torch in use.

    ``len()`` is ``total_samples``, as Megatron's.

    Example:
        >>> s = MegatronPretrainingRandomSampler(None, 8, 0, 2, 0, 2, data_sharding=True)
        >>> batches = list(s)  # 2 micro-batches of this rank's half, shuffled
        >>> sorted(i for b in batches for i in b)
        [0, 1, 2, 3]
        >>> s.consumed_samples  # both ranks' 2 micro-batches of 2: the next epoch is next
        8
    """

    _KIND = "megatron-pretraining-random"

    def __init__(
        self,
        dataset: Any,
        total_samples: int,
        consumed_samples: int,
        micro_batch_size: int,
        data_parallel_rank: int,
        data_parallel_size: int,
        data_sharding: bool,
        *,
        randperm: str | None = None,
    ) -> None:
        total, consumed, mbs, rank, size = _common(
            total_samples, consumed_samples, micro_batch_size, data_parallel_rank,
            data_parallel_size,
        )  # fmt: skip
        group = mbs * size
        if total < group:
            raise ValueError(
                f"total_samples must be at least micro_batch_size * data_parallel_size "
                f"({group}): an epoch of whole micro-batches, got {total}"
            )
        sharding = check_bool("data_sharding", data_sharding)
        variant = torch_randperm_order() if randperm is None else randperm
        variant = check_choice("randperm", variant, tuple(TORCH_ORDERS))
        self.dataset = dataset
        self.total_samples = total
        self.micro_batch_size = mbs
        self.data_parallel_rank = rank
        self.data_parallel_size = size
        self.data_sharding = sharding
        self.randperm = variant
        self.micro_batch_times_data_parallel_size = group
        self.last_batch_size = total % group
        self._check_consumed("consumed_samples", consumed)
        self._consumed = consumed
        #: The epoch of the latest iteration (set as it starts, as Megatron's is; before the
        #: first, the epoch ``consumed_samples`` is in).
        self.epoch = consumed // (total - self.last_batch_size)
        self._perm: tuple[int, np.ndarray] | None = None  # the running epoch's permutation
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return self.total_samples

    @property
    def consumed_samples(self) -> int:
        """Megatron's count: the samples the whole world consumed, as this rank's iterators
        handed micro-batches out. Assigned, it must leave whole groups of the epoch consumed;
        the next iteration goes on from it."""
        return self._consumed

    @consumed_samples.setter
    def consumed_samples(self, value: int) -> None:
        consumed = check_int("consumed_samples", value, 0, MAX_LEN)
        self._check_consumed("consumed_samples", consumed)
        self._consumed = consumed

    def _check_consumed(self, name: str, consumed: int) -> None:
        active = self.total_samples - self.last_batch_size
        group = self.micro_batch_times_data_parallel_size
        if consumed % active % group:
            raise ValueError(
                f"{name} must leave whole micro-batch groups of the epoch consumed "
                f"(consumed_samples % {active} a multiple of {group}), got {consumed}"
            )

    def _permutation(self, epoch: int, n: int) -> np.ndarray:
        """``torch.randperm(n)`` seeded with ``epoch``, kept until the epoch's iteration ends
        (a new iterator inside the epoch reads it again)."""
        with self._lock:
            if self._perm is None or self._perm[0] != epoch:
                self._perm = None  # the previous epoch's memory goes first
                self._perm = (epoch, _core.torch_randperm(n, epoch, TORCH_ORDERS[self.randperm]))
            return self._perm[1]

    def __iter__(self) -> Iterator[list[int]]:
        active = self.total_samples - self.last_batch_size
        epoch, current = divmod(self._consumed, active)
        self.epoch = epoch
        if _is_random_seed_dataset(self.dataset):
            self.dataset.set_epoch(epoch)
        mbs, size = self.micro_batch_size, self.data_parallel_size
        group = self.micro_batch_times_data_parallel_size
        if self.data_sharding:
            bucket = self.total_samples // group * mbs
            perm = self._permutation(epoch, bucket)
            chunks = _chunks(perm[current // size :], mbs, self.data_parallel_rank * bucket)
        else:
            perm = self._permutation(epoch, self.total_samples // mbs * mbs)
            # perm[current:][rank::size]: `current` is whole groups, a multiple of size.
            chunks = _chunks(perm[self.data_parallel_rank :: size][current // size :], mbs)
        for batches in chunks:
            for batch in batches:
                self._consumed += group
                yield batch
        with self._lock:
            if self._perm is not None and self._perm[0] == epoch:
                self._perm = None  # the epoch is done: its permutation's memory goes

    def _config(self) -> dict[str, Any]:
        return {
            "total_samples": self.total_samples,
            "micro_batch_size": self.micro_batch_size,
            "data_sharding": self.data_sharding,
            "randperm": self.randperm,
        }

    def state_dict(self) -> dict[str, Any]:
        """``{"consumed_samples", ...}``: Megatron's count as this rank's iterators advanced it
        (the epoch follows from it), and the configuration."""
        return _state(self, self._consumed)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Goes on from the state's ``consumed_samples``, as a Megatron sampler made with that
        count would. A state saved on another number of ranks loads when the count is whole
        groups of this world: without ``data_sharding`` the epoch then goes on exactly (one
        permutation, dealt anew); with it each rank's bucket depends on the number of ranks,
        so the rest of that epoch is the new buckets' (as in Megatron: some samples come
        twice, some wait for the next epoch). Refused, the sampler unchanged, if the state is
        of another configuration or its count is inside a group of this world."""
        consumed = _check_state(state, self._KIND, self._config())
        self._check_consumed("state['consumed_samples']", consumed)
        self._consumed = consumed

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        del state["_lock"]
        state["_perm"] = None  # recomputed where needed, not pickled
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(total_samples={self.total_samples}, "
            f"consumed_samples={self.consumed_samples}, "
            f"micro_batch_size={self.micro_batch_size}, "
            f"data_parallel_rank={self.data_parallel_rank}, "
            f"data_parallel_size={self.data_parallel_size}, "
            f"data_sharding={self.data_sharding}, randperm={self.randperm!r})"
        )
