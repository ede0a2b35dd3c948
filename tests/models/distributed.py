"""Reference model of ``croupier.DistributedSampler`` (orders "global", "torch", "per_rank").

Encodes: the epoch is one global order of ``range(N)`` (a permutation: every sample once),
dealt by torch's striding and padding (:mod:`models.world`). Where the order comes from:

- ``order="torch"``: ``torch.randperm(N)`` seeded with ``seed + epoch`` (torch's own
  ``DistributedSampler`` with one replica), an independent oracle; ``shuffle=False``:
  ``range(N)``. Every world size's ranks are also checked against torch's
  ``DistributedSampler`` with the same arguments (:meth:`DistributedModel.torch_ranks`).
- ``order="global"``: the same for every world size; the pseudorandom permutation is read
  once from a fresh ``num_replicas=1`` croupier sampler iterated uninterrupted (the only use of
  croupier), checked to be a permutation; ``shuffle=False``: ``range(N)``.
- ``order="per_rank"``: depends on the world size: the ranks' uninterrupted fresh sequences of
  the first world, interleaved (position t of every rank, rank after rank), the first
  ``min(N, kept)`` of them (padding counted once), checked to be distinct samples.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from models.world import WorldModel, deal, interleave


@lru_cache(maxsize=256)
def _torch_perm(n: int, seed: int, epoch: int, shuffle: bool) -> tuple[int, ...]:
    import torch.utils.data

    ref = torch.utils.data.DistributedSampler(
        range(n), num_replicas=1, rank=0, shuffle=shuffle, seed=seed, drop_last=False
    )
    ref.set_epoch(epoch)
    return tuple(int(i) for i in ref)


@lru_cache(maxsize=256)
def _croupier_ranks(
    n: int, seed: int, epoch: int, shuffle: bool, drop_last: bool, order: str, world: int
) -> tuple[tuple[int, ...], ...]:
    import croupier

    out = []
    for r in range(world):
        s = croupier.DistributedSampler(
            n,
            num_replicas=world,
            rank=r,
            shuffle=shuffle,
            seed=seed,
            drop_last=drop_last,
            order=order,
        )
        s.set_epoch(epoch)
        out.append(tuple(int(i) for i in s))
    return tuple(out)


class DistributedModel(WorldModel):
    def __init__(
        self, n: int, world: int, *, seed: int, shuffle: bool, drop_last: bool, order: str
    ) -> None:
        self.n, self.seed, self.shuffle, self.order = n, seed, shuffle, order
        super().__init__(world, drop_last)

    def order_of(self, epoch: int, origin: int, extra: Any) -> tuple[int, ...]:
        n = self.n
        if self.order == "per_rank":
            seq = interleave(
                [
                    list(x)
                    for x in _croupier_ranks(
                        n, self.seed, epoch, self.shuffle, self.drop_last, "per_rank", origin
                    )
                ]
            )
            kept = seq[: min(n, len(seq))]
            assert len(set(kept)) == len(kept), "per-rank order: a sample twice in an epoch"
            assert set(kept) <= set(range(n))
            if not self.drop_last:
                assert sorted(kept) == list(range(n)), "per-rank order: not every sample"
                assert seq[n:] == (kept * (1 + len(seq) // max(n, 1)))[: len(seq) - n]
            return tuple(kept)
        if not self.shuffle:
            perm: tuple[int, ...] = tuple(range(n))
        elif self.order == "torch":
            perm = _torch_perm(n, self.seed, epoch, True)
        else:
            (perm,) = _croupier_ranks(n, self.seed, epoch, True, False, "global", 1)
        assert sorted(perm) == list(range(n)), "the epoch's order is not a permutation"
        return perm

    def torch_ranks(self, epoch: int) -> list[list[int]]:
        """torch's own DistributedSampler on this world (order="torch"'s independent oracle)."""
        import torch.utils.data

        out = []
        for r in range(self.world):
            ref = torch.utils.data.DistributedSampler(
                range(self.n),
                num_replicas=self.world,
                rank=r,
                shuffle=self.shuffle,
                seed=self.seed,
                drop_last=self.drop_last,
            )
            ref.set_epoch(epoch)
            out.append([int(i) for i in ref])
        return out

    def fresh_deal(self, epoch: int) -> list[list[int]]:
        return deal(list(self.order_of(epoch, self.world, None)), self.world, self.drop_last)
