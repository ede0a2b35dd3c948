"""lhotse's ``DynamicBucketingSampler`` as ``croupier bench`` and ``benches/`` run it: an optional
baseline (lhotse is imported only when these functions are called, so this module imports
without it).

The data is a lazy ``CutSet`` of N cuts, cut ``i`` a ``MonoCut`` with id ``str(i)`` and the
duration ``lengths[i]`` (a token count taken as seconds), made as the sampler reads it, as
``CutSet.from_jsonl_lazy`` makes them from a manifest (without the JSON decoding, about 19 us a
cut): the streaming sampler is meant to read a lazy ``CutSet`` (it warns that an eager one brings
none of its benefits), and its memory stays that of its buffer. Making a cut costs about 4 us,
roughly a tenth of what the sampler spends per cut. The batches are croupier's: a token budget
of ``max_tokens`` padded tokens (``max_duration``, lhotse's rule ``len(batch) * longest``) over
``buckets`` buckets (``num_buckets``, lhotse's boundaries: equal total duration in its first
10,000 cuts), shuffled, the sampler's own defaults otherwise (a buffer of 20,000 cuts, buckets
in step across ranks).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

__all__ = ["batch_indices", "lazy_cuts", "mid_epoch_state", "sampler"]

_CHUNK = 1 << 16  # lengths read into Python ints this many at a time


class _Cuts:
    """The cuts of ``lengths``, made afresh on every pass (the source of a lazy ``CutSet``)."""

    def __init__(self, lengths: Any) -> None:
        self.lengths = lengths

    def __iter__(self) -> Iterator[Any]:
        from lhotse import MonoCut

        lengths = self.lengths
        for lo in range(0, len(lengths), _CHUNK):
            for i, d in enumerate(lengths[lo : lo + _CHUNK].tolist(), lo):
                yield MonoCut(id=str(i), start=0.0, duration=float(d), channel=0)


def lazy_cuts(lengths: Any) -> Any:
    """A lazy ``lhotse.CutSet`` of ``len(lengths)`` cuts, cut ``i`` of duration ``lengths[i]``."""
    from lhotse import CutSet

    return CutSet(_Cuts(lengths))


def sampler(
    cuts: Any,
    max_tokens: int,
    buckets: int,
    num_replicas: int,
    rank: int,
    seed: int,
    epoch: int,
    drop_last: bool = False,
) -> Any:
    """``DynamicBucketingSampler`` over ``cuts`` for one rank, set to ``epoch``. Constructing it
    reads the first 10,000 cuts (lhotse's estimate of the bucket boundaries)."""
    from lhotse.dataset import DynamicBucketingSampler

    s = DynamicBucketingSampler(
        cuts,
        max_duration=max_tokens,
        num_buckets=buckets,
        shuffle=True,
        drop_last=drop_last,
        world_size=num_replicas,
        rank=rank,
        seed=seed,
    )
    s.set_epoch(epoch)
    return s


def batch_indices(batch: Any) -> list[int]:
    """The sample indices of a batch (a ``CutSet``). At the end of an epoch lhotse may repeat
    cuts so that every rank gets one, with ``_dup<k>`` appended to their ids."""
    return [int(c.id.partition("_")[0]) for c in batch]


def mid_epoch_state(s: Any, batches: list[list[int]], position: int) -> dict[str, Any]:
    """The checkpoint ``s.state_dict()`` gives after this rank took ``position`` of its epoch's
    ``batches``, made from the state of ``s`` at any point of that epoch: lhotse's checkpoint
    of a position is the count of batches and cuts the rank took, which ``load_state_dict``
    replays the epoch up to (its fast-forward)."""
    state: dict[str, Any] = s.state_dict()
    diagnostics = state["diagnostics"]
    epoch = diagnostics["current_epoch"]
    diagnostics["stats_per_epoch"][epoch] = {
        "epoch": epoch,
        "kept_cuts": sum(len(b) for b in batches[:position]),
        "discarded_cuts": 0,
        "kept_batches": position,
        "discarded_batches": 0,
    }
    return state
