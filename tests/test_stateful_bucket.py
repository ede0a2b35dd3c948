"""Stateful test of croupier.BucketBatchSampler against its reference model (issue 42).

The machine drives a whole world of batch samplers (orders "global" and "per_rank", a token
budget or a fixed batch size, ``drop_last`` and ``shuffle`` both ways) and
:class:`models.bucket.BucketModel` through iteration, partial iteration, set_epoch,
set_skip, state_dict/load (on another world size in the global order, several hops; the fast
order re-deals its remaining batches in an unspecified order, so it stays on one world size),
pickling, fork and refused input; positions count batches. See tests/stateful_support.py for
the invariants checked after every step; every epoch's batches are checked against the
documented multiset and budget.
"""

from __future__ import annotations

from hypothesis import strategies as st
from hypothesis.stateful import initialize

import croupier
from models.bucket import BucketModel
from stateful_support import LockstepMachine, budget


class BucketMachine(LockstepMachine):
    worlds = (1, 2, 3, 4)

    @initialize(
        lengths=st.lists(st.integers(1, 64), min_size=1, max_size=150),
        world=st.sampled_from((1, 2, 3, 4)),
        seed=st.integers(0, 2**64 - 1),
        shuffle=st.booleans(),
        drop_last=st.booleans(),
        order=st.sampled_from(("global", "global", "per_rank")),
        sizing=st.sampled_from(("max_tokens", "batch_size", "both")),
        buckets=st.sampled_from((1, 3, 8)),
    )
    def configure(self, lengths, world, seed, shuffle, drop_last, order, sizing, buckets):
        self.lengths = lengths
        cfg = dict(seed=seed, shuffle=shuffle, drop_last=drop_last, order=order, buckets=buckets)
        if sizing in ("max_tokens", "both"):
            cfg["max_tokens"] = 160
        if sizing in ("batch_size", "both"):
            cfg["batch_size"] = 5
        self.cfg = cfg
        self.elastic = order == "global"
        self.setup_world(world)

    def make(self, world, rank):
        return croupier.BucketBatchSampler(self.lengths, num_replicas=world, rank=rank, **self.cfg)

    def new_model(self, world):
        return BucketModel(self.lengths, world, **self.cfg)


BucketMachine.TestCase.settings = budget(80, 25)
TestBucketStateful = BucketMachine.TestCase
