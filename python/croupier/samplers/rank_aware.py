"""``croupier.RankAwareSampler``: the ranks of one data-replica group get the same samples
(TransferQueue's sampler protocol).

With tensor or pipeline parallelism every rank of a data-replica group must train on the same
batch. The first member of a group to ask for batch ``batch_index`` takes it from the ready
indices and caches it; the other members get the cached batch.
"""

from __future__ import annotations

import copy
import hashlib
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from croupier._validate import U64_MAX, as_int, check_bool, check_int

__all__ = ["RankAwareSampler"]


class _MissingKeyError(TypeError, KeyError):
    """A checkpoint without ``"_states"``: croupier's ``TypeError`` with its message, and the
    ``KeyError`` TransferQueue's sampler raises on it, for code written against that."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""  # KeyError's would quote the message


class RankAwareSampler:
    """Coordinates the members of each data-replica group (TransferQueue's
    ``RankAwareSampler``, call for call, plus thread safety and bounded memory).

    ``sample(ready_indexes, batch_size, dp_rank, batch_index, task_name, partition_id)``
    returns ``(sampled, consumed)`` (the same indices twice, as TransferQueue's samplers do):
    the first call for a ``(partition_id, task_name, dp_rank, batch_index)`` takes
    ``ready_indexes[:batch_size]`` (in the order given; with ``shuffle=True`` a seeded random
    choice, see below) and caches it; later calls for the same key return the cached batch.
    Fewer than ``batch_size`` ready indices gives ``([], [])`` and caches nothing. A negative
    ``dp_rank`` is refused (``ValueError``).

    Args:
        group_size: members per data-replica group. ``None`` (the default, as upstream): a
            cached batch is served until :meth:`clear_cache`. A number: the entry is freed once
            that many calls (the first included) have read it, so memory stays bounded; a
            further call for the same key samples afresh.
        shuffle: choose the batch as ``batch_size`` uniformly random ready indices (croupier's
            Rust permutation of the ready list, seeded by ``seed`` and the key, so every
            process that samples the same key chooses the same) instead of the first ones.
        seed: non-negative integer below ``2**64`` for ``shuffle``.

    Thread-safe: one lock guards the cache, so concurrent members of a group never sample
    twice. :meth:`save_checkpoint`/:meth:`load_checkpoint` use TransferQueue's format
    (``{"_states": {partition_id: {task_name: {dp_rank: {batch_index: [indices]}}}}}``); with
    a ``group_size``, the checkpoint also has ``"_reads"``, the same nesting with how many
    members have read each cached batch, so an entry is still freed after a restore.

    Picklable (TransferQueue's controller, a Ray actor, receives sampler instances) and
    copyable: the copy has the configuration and a snapshot of the cache and read counts, taken
    under the lock, and a lock of its own.
    """

    def __init__(self, *, group_size: int | None = None, shuffle: bool = False, seed: int = 0):
        self.group_size = None if group_size is None else check_int("group_size", group_size, 1)
        self.shuffle = check_bool("shuffle", shuffle)
        self.seed = check_int("seed", seed, 0, U64_MAX)
        self._states: dict[Any, Any] = {}
        self._reads: dict[tuple[Any, Any, int, Any], int] = {}
        self._lock = threading.RLock()

    def _choose(self, ready: Sequence[int], batch_size: int, key: tuple[Any, ...]) -> list[int]:
        if not self.shuffle:
            return list(ready[:batch_size])
        from croupier import permutation

        # The permutation's epoch word is a stable hash of the key (not Python's hash(), which
        # differs between processes).
        digest = hashlib.sha256(repr(key).encode()).digest()
        order = permutation(len(ready), seed=self.seed, epoch=int.from_bytes(digest[:8], "little"))
        return [ready[i] for i in order[:batch_size].tolist()]

    def sample(
        self,
        ready_indexes: list[int],
        batch_size: int,
        dp_rank: int,
        batch_index: int,
        task_name: str,
        partition_id: str,
        *args: Any,
        **kwargs: Any,
    ) -> tuple[list[int], list[int]]:
        """The batch ``batch_index`` of data-replica group ``dp_rank``: sampled by the first
        caller, cached for the others. Returns ``(sampled, consumed)``; ``([], [])`` when fewer
        than ``batch_size`` indices are ready. Extra arguments are ignored, as upstream."""
        dp_rank = as_int("dp_rank", dp_rank)
        if dp_rank < 0:
            raise ValueError(f"dp_rank {dp_rank} must be greater than or equal to 0")
        batch_size = check_int("batch_size", batch_size, 0)
        with self._lock:
            key = (partition_id, task_name, dp_rank, batch_index)
            batches = self._states.get(partition_id, {}).get(task_name, {}).get(dp_rank, {})
            if batch_index not in batches:
                sampled = self._choose(ready_indexes, batch_size, key)
                # Nothing cached (too few ready, or a group of one): no entry is created.
                if len(sampled) < batch_size:
                    return [], []
                if self.group_size == 1:
                    return sampled, sampled
                groups = self._states.setdefault(partition_id, {}).setdefault(task_name, {})
                groups.setdefault(dp_rank, {})[batch_index] = sampled
                if self.group_size is not None:
                    self._reads[key] = 1
                return sampled, sampled
            sampled = batches[batch_index]
            if self.group_size is not None:
                # A cached batch was read at least by the member that sampled it (a checkpoint
                # without read counts, such as TransferQueue's, gives no more).
                reads = self._reads.get(key, 1) + 1
                if reads >= self.group_size:
                    del batches[batch_index]
                    self._reads.pop(key, None)
                    self._prune(partition_id, task_name, dp_rank)
                else:
                    self._reads[key] = reads
            return sampled, sampled

    def _prune(self, partition_id: Any, task_name: Any, dp_rank: int) -> None:
        """Drops the levels of the cache left empty above a freed batch (memory stays
        bounded by the batches cached)."""
        tasks = self._states[partition_id]
        groups = tasks[task_name]
        if not groups[dp_rank]:
            del groups[dp_rank]
        if not groups:
            del tasks[task_name]
        if not tasks:
            del self._states[partition_id]

    def __call__(self, *args: Any, **kwargs: Any) -> tuple[list[int], list[int]]:
        """``sample(*args, **kwargs)``: how TransferQueue's controller calls a sampler."""
        return self.sample(*args, **kwargs)

    def has_cached_result(
        self,
        partition_id: str,
        task_name: str,
        sampling_config: Mapping[str, Any] | None = None,
    ) -> bool:
        """Whether a batch is cached for ``sampling_config``'s ``dp_rank`` and ``batch_index``
        (``False`` without a ``dp_rank``), as TransferQueue's controller asks."""
        config = sampling_config or {}
        dp_rank = config.get("dp_rank")
        if dp_rank is None:
            return False
        with self._lock:
            states = self._states.get(partition_id, {}).get(task_name, {})
            return dp_rank in states and config.get("batch_index") in states[dp_rank]

    def clear_cache(self, partition_id: str) -> None:
        """Forgets every cached batch of ``partition_id``."""
        with self._lock:
            self._states.pop(partition_id, None)
            for key in [k for k in self._reads if k[0] == partition_id]:
                del self._reads[key]

    def save_checkpoint(self) -> dict[str, Any]:
        """A snapshot of the cache in TransferQueue's format (a deep copy, consistent even
        while other threads sample). With a ``group_size`` it also holds ``"_reads"``:
        ``{partition_id: {task_name: {dp_rank: {batch_index: reads}}}}``, the members that
        have read each cached batch (the one that sampled it included)."""
        with self._lock:
            checkpoint: dict[str, Any] = {"_states": copy.deepcopy(self._states)}
            if self.group_size is not None:
                reads: dict[Any, Any] = {}
                for (partition_id, task_name, dp_rank, batch_index), n in self._reads.items():
                    tasks = reads.setdefault(partition_id, {}).setdefault(task_name, {})
                    tasks.setdefault(dp_rank, {})[batch_index] = n
                checkpoint["_reads"] = reads
            return checkpoint

    def load_checkpoint(self, state: Mapping[str, Any]) -> None:
        """Replaces the cache with a :meth:`save_checkpoint` (or TransferQueue's own).

        Read counts (``"_reads"``) are restored when this sampler has a ``group_size``;
        a cached batch without one (a checkpoint of TransferQueue's or of a sampler without
        ``group_size``) counts as read once, by the member that sampled it, so it is freed
        after ``group_size - 1`` more reads.

        The cache is checked entry by entry: ``{partition_id: {task_name: {dp_rank:
        {batch_index: [indices]}}}}`` with mappings at every level, ``dp_rank`` an integer
        ``>= 0`` and each batch a list (or tuple) of integer indices. JSON turns integer keys
        into strings, so a ``dp_rank`` or ``batch_index`` key that is a string of decimal
        digits (``"0"``) loads as that integer (``0``), as :meth:`save_checkpoint` saved it: a
        JSON round trip restores the cache exactly (a ``batch_index`` that was itself such a
        string is therefore not supported). Raises ``TypeError`` for a state of the wrong shape
        or type (without ``"_states"``, a ``TypeError`` that is also the ``KeyError``
        TransferQueue's sampler raises there, so callers' ``except KeyError`` still holds) and
        ``ValueError`` for a negative ``dp_rank``, two keys that become the same, or a read
        count outside ``[1, group_size - 1]`` or of a batch not in the cache; nothing changes
        then.
        """
        if isinstance(state, Mapping) and "_states" not in state:
            raise _MissingKeyError(
                f"state must be a save_checkpoint() dict with a '_states' mapping, got keys "
                f"{sorted(map(str, state))}"
            )
        if not isinstance(state, Mapping) or not isinstance(state["_states"], Mapping):
            raise TypeError("state must be a save_checkpoint() dict with a '_states' mapping")
        states = _checked_states(state["_states"])
        reads = {} if self.group_size is None else _checked_reads(state, states, self.group_size)
        with self._lock:
            self._states = states
            self._reads = reads

    def __getstate__(self) -> dict[str, Any]:
        # The lock is not picklable: the copy gets its own. The cache is copied under the lock,
        # as a checkpoint is, so a copy taken while other threads sample is consistent.
        with self._lock:
            state = self.__dict__.copy()
            state["_states"] = copy.deepcopy(self._states)
            state["_reads"] = dict(self._reads)
        del state["_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.RLock()


def _mapping(name: str, value: object) -> Mapping[Any, Any]:
    if not isinstance(value, Mapping):
        raise TypeError(f"{name} must be a mapping, got {type(value).__name__}")
    return value


def _json_key(key: Any) -> Any:
    """An integer key that JSON made a string (``"3"``) as the integer again."""
    if isinstance(key, str) and key.isascii() and key.isdigit():
        return int(key)
    return key


def _levels(where: str, value: object, dp_rank: bool) -> dict[Any, Any]:
    """The mapping ``value`` with its keys restored from JSON (``dp_rank`` keys checked)."""
    out: dict[Any, Any] = {}
    for raw, item in _mapping(where, value).items():
        key = _json_key(raw)
        if dp_rank:
            key = check_int(f"{where}: dp_rank {raw!r}", key, 0)
        if key in out:
            raise ValueError(f"{where}: keys {raw!r} and {key!r} are the same once loaded")
        out[key] = item
    return out


def _checked_states(value: object) -> dict[Any, Any]:
    """``state["_states"]`` checked and copied: mappings down to lists of integer indices."""
    where = "state['_states']"
    states: dict[Any, Any] = {}
    for partition_id, tasks in _mapping(where, value).items():
        at_p = f"{where}[{partition_id!r}]"
        for task_name, groups in _mapping(at_p, tasks).items():
            at_t = f"{at_p}[{task_name!r}]"
            for dp_rank, batches in _levels(at_t, groups, dp_rank=True).items():
                at_r = f"{at_t}[{dp_rank!r}]"
                cached = {}
                for batch_index, batch in _levels(at_r, batches, dp_rank=False).items():
                    name = f"{at_r}[{batch_index!r}]"
                    if not isinstance(batch, (list, tuple)):
                        raise TypeError(
                            f"{name} must be a list of indices, got {type(batch).__name__}"
                        )
                    cached[batch_index] = [as_int(f"{name} index", i) for i in batch]
                states.setdefault(partition_id, {}).setdefault(task_name, {})[dp_rank] = cached
            states.setdefault(partition_id, {}).setdefault(task_name, {})
        states.setdefault(partition_id, {})
    return states


def _checked_reads(
    state: Mapping[str, Any], states: Mapping[Any, Any], group_size: int
) -> dict[tuple[Any, Any, int, Any], int]:
    """``state["_reads"]`` (absent: none) as flat read counts, each of a batch cached in
    ``states`` and in ``[1, group_size - 1]`` (a batch read by the whole group is freed)."""
    out: dict[tuple[Any, Any, int, Any], int] = {}
    where = "state['_reads']"
    for partition_id, tasks in _mapping(where, state.get("_reads", {})).items():
        for task_name, groups in _mapping(f"{where}[{partition_id!r}]", tasks).items():
            at = f"{where}[{partition_id!r}][{task_name!r}]"
            for dp_rank, batches in _levels(at, groups, dp_rank=True).items():
                for batch_index, n in _levels(f"{at}[{dp_rank!r}]", batches, False).items():
                    name = f"{at}[{dp_rank!r}][{batch_index!r}]"
                    cached: object = states
                    for k in (partition_id, task_name, dp_rank):
                        cached = cached.get(k) if isinstance(cached, Mapping) else None
                    if not isinstance(cached, Mapping) or batch_index not in cached:
                        raise ValueError(f"{name}: no such batch in state['_states']")
                    key = (partition_id, task_name, dp_rank, batch_index)
                    out[key] = check_int(name, n, 1, max(1, group_size - 1))
    return out
