"""Reference model of ``croupier.BucketBatchSampler`` (orders "global" and "per_rank"), in batches.

Encodes: an epoch is one sequence of batches dealt like torch deals indices (rank ``r``
takes batches ``r, r + W, ...``; ``drop_last=False`` pads by repeating the first batches,
``drop_last=True`` keeps ``floor(B / W) * W``); positions, ``len`` and states count batches
(:mod:`models.world`).

- ``order="global"``: the batch sequence is the same for every world size, read once from a
  fresh ``num_replicas=1`` sampler iterated uninterrupted (the pseudorandom oracle).
- ``order="per_rank"``: a sequence per world size: its ranks' fresh sequences interleaved, the
  first batches up to the one that completes the samples (its padding after them). Elastic
  resume of the per-rank order re-deals the remaining batches in an unspecified order, so the
  model covers it on one world size only.

Every sequence the model uses is checked against the documented multiset: with
``drop_last=False`` or a ``max_tokens`` budget every sample is in exactly one batch; with
``batch_size`` alone and ``drop_last=True`` every batch holds exactly ``batch_size`` samples
and no sample twice; with ``max_tokens`` every batch of more than one sample keeps
``len(batch) * max(lengths) <= max_tokens``.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from models.world import WorldModel, interleave


@lru_cache(maxsize=256)
def _ranks(
    lengths: tuple[int, ...], kw: tuple[tuple[str, Any], ...], epoch: int, world: int
) -> tuple[tuple[tuple[int, ...], ...], ...]:
    import croupier

    out = []
    for r in range(world):
        s = croupier.BucketBatchSampler(list(lengths), num_replicas=world, rank=r, **dict(kw))
        s.set_epoch(epoch)
        out.append(tuple(tuple(int(i) for i in b) for b in s))
    return tuple(out)


class BucketModel(WorldModel):
    def __init__(self, lengths: list[int], world: int, **kw: Any) -> None:
        self.lengths = tuple(lengths)
        self.kw = tuple(sorted(kw.items()))
        self.max_tokens = kw.get("max_tokens")
        self.batch_size = kw.get("batch_size")
        self.order = kw.get("order", "global")
        super().__init__(world, kw.get("drop_last", False))

    def check_batches(self, batches: list[tuple[int, ...]], complete: bool) -> None:
        n = len(self.lengths)
        flat = [i for b in batches for i in b]
        assert all(b for b in batches), "an empty batch"
        assert len(set(flat)) == len(flat), "a sample twice in an epoch's batches"
        assert set(flat) <= set(range(n))
        exact = self.drop_last and self.max_tokens is None and self.batch_size is not None
        if exact:
            assert all(len(b) == self.batch_size for b in batches), "a short batch"
        elif complete:
            assert sorted(flat) == list(range(n)), "a sample in no batch"
        if self.batch_size is not None:
            assert all(len(b) <= self.batch_size for b in batches)
        if self.max_tokens is not None:
            for b in batches:
                cost = len(b) * max(self.lengths[i] for i in b)
                assert len(b) == 1 or cost <= self.max_tokens, f"over budget: {b}"

    def order_of(self, epoch: int, origin: int, extra: Any) -> tuple[tuple[int, ...], ...]:
        if self.order == "global":
            (seq,) = _ranks(self.lengths, self.kw, epoch, 1)
            self.check_batches(list(seq), complete=True)
            return seq
        seq = interleave([list(x) for x in _ranks(self.lengths, self.kw, epoch, origin)])
        # The distinct batches come first, the padding (repeats of the first ones) after.
        seen: set[int] = set()
        kept = []
        for b in seq:
            if seen & set(b):
                break
            kept.append(b)
            seen |= set(b)
        if not self.drop_last:
            pad = seq[len(kept) :]
            assert pad == (kept * (1 + len(pad)))[: len(pad)], "padding is not the head"
        self.check_batches(kept, complete=not self.drop_last)
        return tuple(kept)
