"""Reference model of ``croupier.RankAwareSampler`` (TransferQueue's ``RankAwareSampler``, seed
file 004, plus croupier's documented extras).

The semantics encoded:

- The cache maps ``(partition_id, task_name, dp_rank, batch_index)`` to a batch. The first
  ``sample`` of a key takes ``ready_indexes[:batch_size]`` (in the order given) and caches it;
  later calls of the key return the cached batch whatever ``ready_indexes`` they pass. Too few
  ready indices gives ``([], [])`` and caches nothing. The result is ``(batch, batch)``.
- A negative ``dp_rank`` is a ``ValueError``; nothing changes.
- ``group_size=None`` (upstream): a cached batch is served until ``clear_cache``. A
  ``group_size=g``: the entry is freed once ``g`` calls (the sampling one included) have read
  it; a further call samples afresh (``g == 1``: nothing is ever cached).
- ``clear_cache(pid)`` forgets every batch of ``pid``; ``has_cached_result(pid, task,
  {"dp_rank", "batch_index"})`` says whether the key is cached (``False`` without a dp_rank).
- ``save_checkpoint()`` is ``{"_states": pid -> task -> dp_rank -> batch_index -> batch}``
  (with ``"_reads"``, the same nesting of read counts, when there is a ``group_size``);
  ``load_checkpoint`` replaces the cache with it; a checkpoint without ``"_reads"`` counts each
  batch as read once. A JSON round trip restores it (integer keys come back from strings).
- ``shuffle=True``: the batch is ``batch_size`` distinct ready indices chosen by a seeded
  function of the key and the ready list (the model takes the choice from the sampler and only
  checks its shape; determinism is checked against a second sampler).
"""

from __future__ import annotations

from typing import Any

Key = tuple[Any, Any, int, Any]


class RankAwareModel:
    """The cache as a flat dict, with read counts."""

    def __init__(self, group_size: int | None = None) -> None:
        self.group_size = group_size
        self.cache: dict[Key, list[int]] = {}
        self.reads: dict[Key, int] = {}

    def sample(
        self,
        ready: list[int],
        batch_size: int,
        dp_rank: int,
        batch_index: Any,
        task_name: Any,
        partition_id: Any,
        chosen: list[int] | None = None,
    ) -> tuple[list[int], list[int]]:
        """What the call returns; ``chosen`` is the sampler's choice under ``shuffle=True``."""
        if dp_rank < 0:
            raise ValueError("dp_rank must be >= 0")
        key = (partition_id, task_name, dp_rank, batch_index)
        if key in self.cache:
            batch = list(self.cache[key])
            if self.group_size is not None:
                self.reads[key] += 1
                if self.reads[key] >= self.group_size:
                    del self.cache[key], self.reads[key]
            return batch, batch
        if len(ready) < batch_size:
            return [], []
        batch = list(ready[:batch_size]) if chosen is None else list(chosen)
        if self.group_size == 1:
            return batch, batch
        self.cache[key] = batch
        if self.group_size is not None:
            self.reads[key] = 1
        return list(batch), list(batch)

    def clear_cache(self, partition_id: Any) -> None:
        for key in [k for k in self.cache if k[0] == partition_id]:
            del self.cache[key]
            self.reads.pop(key, None)

    def has_cached_result(self, partition_id: Any, task_name: Any, config: dict) -> bool:
        if config.get("dp_rank") is None:
            return False
        return (partition_id, task_name, config["dp_rank"], config.get("batch_index")) in self.cache

    def checkpoint(self) -> dict[str, Any]:
        """The documented checkpoint (no empty levels)."""
        out: dict[str, Any] = {"_states": nest(self.cache)}
        if self.group_size is not None:
            out["_reads"] = nest(self.reads)
        return out

    def load(self, checkpoint: dict[str, Any]) -> None:
        self.cache = flatten(checkpoint["_states"])
        if self.group_size is None:
            self.reads = {}
        else:
            got = flatten(checkpoint.get("_reads", {}))
            self.reads = {k: got.get(k, 1) for k in self.cache}


def nest(flat: dict[Key, Any]) -> dict[Any, Any]:
    out: dict[Any, Any] = {}
    for (p, t, d, b), v in flat.items():
        out.setdefault(p, {}).setdefault(t, {}).setdefault(d, {})[b] = v
    return out


def flatten(nested: dict[Any, Any]) -> dict[Key, Any]:
    """Leaves of a nested checkpoint (empty levels carry nothing)."""
    return {
        (p, t, d, b): v
        for p, tasks in nested.items()
        for t, groups in tasks.items()
        for d, batches in groups.items()
        for b, v in batches.items()
    }
