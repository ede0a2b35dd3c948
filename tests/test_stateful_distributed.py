"""Stateful test of croupier.DistributedSampler against its reference model (issue 42).

The machine drives a whole world of samplers (every order: "global", "torch", "per_rank";
``drop_last`` and ``shuffle`` both ways) and :class:`models.distributed.DistributedModel`
through iteration, partial iteration, set_epoch, set_skip, state_dict/load on the same or
another world size (elastic, several hops), pickling, fork and refused input; see
tests/stateful_support.py for the invariants checked after every step. With
``order="torch"`` every fresh epoch is also compared with torch's own DistributedSampler.
"""

from __future__ import annotations

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import initialize, invariant

import croupier

# order="torch" is checked against torch's own DistributedSampler.
pytest.importorskip("torch")
from models.distributed import DistributedModel
from stateful_support import LockstepMachine, budget


class DistributedMachine(LockstepMachine):
    worlds = (1, 2, 3, 4, 5)

    @initialize(
        n=st.integers(0, 120),
        world=st.sampled_from((1, 2, 3, 4, 5)),
        seed=st.integers(0, 2**64 - 1),
        shuffle=st.booleans(),
        drop_last=st.booleans(),
        order=st.sampled_from(("global", "torch", "per_rank")),
    )
    def configure(self, n, world, seed, shuffle, drop_last, order):
        if order == "torch":
            seed %= 2**62  # torch's own sampler (the oracle) overflows at seed + epoch >= 2**63
        self.cfg = dict(seed=seed, shuffle=shuffle, drop_last=drop_last, order=order)
        self.n = n
        self.torch_checked: set[tuple[int, int]] = set()
        self.setup_world(world)

    def make(self, world, rank):
        return croupier.DistributedSampler(self.n, num_replicas=world, rank=rank, **self.cfg)

    def new_model(self, world):
        return DistributedModel(self.n, world, **self.cfg)

    @invariant()
    def torch_order_is_torchs(self):
        """order="torch": each rank's fresh epoch is torch's DistributedSampler's."""
        if self.model is None or self.cfg["order"] != "torch":
            return
        key = (self.model.state.seg.epoch, self.world)
        if key in self.torch_checked:
            return
        self.torch_checked.add(key)
        assert self.model.fresh_deal(key[0]) == self.model.torch_ranks(key[0])
        for r in range(self.world):
            s = self.make(self.world, r)
            s.set_epoch(key[0])
            assert [int(i) for i in s] == self.model.torch_ranks(key[0])[r]


DistributedMachine.TestCase.settings = budget(100, 30)
TestDistributedStateful = DistributedMachine.TestCase
