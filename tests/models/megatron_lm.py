"""Megatron-LM's pretraining samplers as Megatron-LM's ``data_samplers.py`` describes them,
written from the algorithm (not from croupier): Python lists and ``torch.randperm`` with a
generator seeded with the epoch, one step at a time.

The sequential sampler: from ``consumed_samples`` to ``total_samples``, groups of
``mbs * dp`` consecutive samples, rank ``r`` taking the group's ``[r * mbs, (r + 1) * mbs)``;
an incomplete last group dropped, or (``drop_last=False``) each rank's slice of it, even empty.

The random sampler: ``active = total - total % (mbs * dp)``; each iteration computes
``epoch, current = divmod(consumed, active)``, seeds a generator with ``epoch``; with sharding
each rank takes ``rank * bucket + x`` for ``x`` in ``randperm(bucket)[current // dp:]``, where
``bucket = total // (mbs * dp) * mbs``; without, ``randperm(total // mbs * mbs)[current:]`` taken
from the rank on in strides of ``dp``. Whole micro-batches only; each adds ``mbs * dp`` to
``consumed`` before it is handed out.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch


def sequential(
    total: int, consumed: int, mbs: int, rank: int, dp: int, drop_last: bool = True
) -> Iterator[list[int]]:
    group = []
    for idx in range(consumed, total):
        group.append(idx)
        if len(group) == mbs * dp:
            yield group[rank * mbs : rank * mbs + mbs]
            group = []
    if group and not drop_last:
        yield group[rank * mbs : rank * mbs + mbs]


class RandomModel:
    """The random sampler, its ``consumed`` advanced as Megatron's is."""

    def __init__(
        self, total: int, consumed: int, mbs: int, rank: int, dp: int, sharding: bool
    ) -> None:
        self.total, self.consumed, self.mbs, self.rank, self.dp = total, consumed, mbs, rank, dp
        self.sharding = sharding
        self.epochs_started: list[int] = []

    def __iter__(self) -> Iterator[list[int]]:
        group = self.mbs * self.dp
        active = self.total - self.total % group
        epoch, current = divmod(self.consumed, active)
        assert current % group == 0
        self.epochs_started.append(epoch)
        g = torch.Generator()
        g.manual_seed(epoch)
        if self.sharding:
            bucket = self.total // group * self.mbs
            perm = torch.randperm(bucket, generator=g).tolist()
            order = [self.rank * bucket + x for x in perm[current // self.dp :]]
        else:
            perm = torch.randperm(self.total // self.mbs * self.mbs, generator=g).tolist()
            order = perm[current:][self.rank :: self.dp]
        batch: list[int] = []
        for idx in order:
            batch.append(idx)
            if len(batch) == self.mbs:
                self.consumed += group
                yield batch
                batch = []
