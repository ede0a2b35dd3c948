"""Stateful test of ``croupier.SequentialBucketSampler`` against its reference model
(``tests/models/sequential_bucket.py``): every rank of a world in lockstep, partial iteration
from live (lazy) iterators, NeMo-state round trips into fresh samplers (also through JSON),
``set_epoch``, ``set_skip``, pickling, a forked child finishing the epoch, and bad input that
must change nothing. After every step: ``len``, ``state_dict()`` and what a fresh sampler loaded
with it yields agree with the model; ``get_batch_info`` answers in the sorted bucket order."""

from __future__ import annotations

import copy
import json
import pickle

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from croupier import SequentialBucketSampler
from models._fork import in_fork
from models.sequential_bucket import (
    Buckets,
    Config,
    Dataset,
    RankModel,
    check_fast_epoch,
    torch_epoch,
)

pytest.importorskip("torch")

RESOLUTIONS = [(64, 64), (128, 64), (32, 32), (128, 128), (96, 64)]


@st.composite
def configs(draw):
    n = draw(st.integers(1, 4))
    spec = Buckets(
        sizes=tuple(draw(st.lists(st.integers(0, 30), min_size=n, max_size=n))),
        resolutions=tuple(draw(st.lists(st.sampled_from(RESOLUTIONS), min_size=n, max_size=n))),
        with_calculator=draw(st.booleans()),
    )
    return Config(
        spec=spec,
        base_batch_size=draw(st.integers(1, 6)),
        base_resolution=draw(st.sampled_from([(64, 64), (128, 64)])),
        drop_last=draw(st.booleans()),
        shuffle_buckets=draw(st.booleans()),
        shuffle_within_bucket=draw(st.booleans()),
        dynamic_batch_size=draw(st.booleans()),
        seed=draw(st.integers(0, 2**32)),
        order=draw(st.sampled_from(["torch", "fast"])),
    )


def build(config: Config, world: int, rank: int) -> SequentialBucketSampler:
    return SequentialBucketSampler(
        Dataset(config.spec),
        base_batch_size=config.base_batch_size,
        base_resolution=config.base_resolution,
        drop_last=config.drop_last,
        shuffle_buckets=config.shuffle_buckets,
        shuffle_within_bucket=config.shuffle_within_bucket,
        dynamic_batch_size=config.dynamic_batch_size,
        seed=config.seed,
        num_replicas=world,
        rank=rank,
        order=config.order,
    )


def take(it, k):
    out = []
    for _ in range(k):
        try:
            out.append(next(it))
        except StopIteration:
            break
    return out


class SequentialBucketMachine(RuleBasedStateMachine):
    forks = 0

    @initialize(config=configs(), world=st.integers(1, 4))
    def setup(self, config, world):
        self.config, self.world = config, world
        self.length = config.length(world)
        self.samplers = [build(config, world, r) for r in range(world)]
        self.iters = None
        self.model = RankModel()
        self.epochs = {}

    def batches(self, epoch):
        """The epoch's batches of every rank."""
        if epoch not in self.epochs:
            if self.config.order == "torch":
                per_rank = [
                    torch_epoch(self.config, self.world, r, epoch) for r in range(self.world)
                ]
            else:  # the permitted oracle: a fresh sampler's uninterrupted epoch
                per_rank = []
                for r in range(self.world):
                    s = build(self.config, self.world, r)
                    s.set_epoch(epoch)
                    per_rank.append(list(s))
            check_fast_epoch(self.config, self.world, per_rank)
            self.epochs[epoch] = per_rank
        return self.epochs[epoch]

    def remaining(self):
        """What each rank's next fresh iteration yields, by the model."""
        start = self.model.next_start()
        return [b[start:] for b in self.batches(self.model.epoch)]

    @rule(k=st.integers(0, 6), new_iterator=st.booleans())
    def take_items(self, k, new_iterator):
        if new_iterator or self.iters is None:
            self.iters = [iter(s) for s in self.samplers]
            self.model.new_iterator()
        got = [take(it, k) for it in self.iters]
        a, b = self.model.advance(k, self.length)
        want = [x[a:b] for x in self.batches(self.model.epoch)]
        assert got == want

    @rule(through_json=st.booleans(), from_rank=st.integers(0, 3))
    def save_and_load_into_fresh(self, through_json, from_rank):
        state = self.samplers[from_rank % self.world].state_dict()
        if through_json:
            state = json.loads(json.dumps(state))
        self.samplers = [build(self.config, self.world, r) for r in range(self.world)]
        for s in self.samplers:
            s.load_state_dict(state)
        self.iters = None
        self.model.loaded(state["epoch"], state["batches_yielded"])

    @rule(epoch=st.integers(0, 3))
    def set_epoch(self, epoch):
        for s in self.samplers:
            s.set_epoch(epoch)
        self.iters = None
        self.model.set_epoch(epoch)

    @rule(data=st.data())
    def set_skip(self, data):
        skip = data.draw(st.integers(0, self.length))
        for s in self.samplers:
            s.set_skip(skip)
        self.iters = None
        self.model.live, self.model.started = None, False
        self.model.set_skip(skip)

    @rule()
    def pickle_round_trip(self):
        self.samplers = [pickle.loads(pickle.dumps(s)) for s in self.samplers]
        self.iters = None
        if self.model.skip is None:
            self.model.loaded(self.model.epoch, self.model.position)
        else:
            self.model.live, self.model.started = None, False

    @precondition(lambda self: self.forks < 1)
    @rule()
    def fork_child_finishes_the_epoch(self):
        self.forks += 1
        iters = self.iters if self.iters is not None else [iter(s) for s in self.samplers]
        got = in_fork(lambda: [list(it) for it in iters])
        model = copy.deepcopy(self.model)
        if self.iters is None:
            model.new_iterator()
        a, b = model.advance(self.length + 1, self.length)
        assert got == [x[a:b] for x in self.batches(model.epoch)]

    @rule(
        bad=st.sampled_from(
            ["past_end", "negative", "not_int", "missing", "not_mapping", "skip_past", "epoch"]
        )
    )
    def bad_operation_changes_nothing(self, bad):
        s = self.samplers[0]
        before = s.state_dict()
        with pytest.raises((ValueError, TypeError)):
            if bad == "skip_past":
                s.set_skip(self.length + 1)
            elif bad == "epoch":
                s.set_epoch(-1)
            else:
                s.load_state_dict(
                    {
                        "past_end": {"epoch": 0, "batches_yielded": self.length + 1},
                        "negative": {"epoch": 0, "batches_yielded": -1},
                        "not_int": {"epoch": "0", "batches_yielded": 0},
                        "missing": {"epoch": 1},
                        "not_mapping": [("epoch", 0)],
                    }[bad]
                )
        assert s.state_dict() == before

    @invariant()
    def length_and_state(self):
        want = {"epoch": self.model.epoch, "batches_yielded": self.model.reported}
        for s in self.samplers:
            assert len(s) == self.length
            state = s.state_dict()
            assert state == want
            assert all(type(v) is int for v in state.values())

    @invariant()
    def state_resumes_with_what_remains(self):
        state = self.samplers[0].state_dict()
        for r in {0, self.world - 1}:
            fresh = build(self.config, self.world, r)
            fresh.load_state_dict(state)
            assert len(fresh) == self.length
            assert list(fresh) == self.batches(state["epoch"])[r][state["batches_yielded"] :]

    @invariant()
    def batch_info_in_sorted_order(self):
        s = self.samplers[-1]
        j = 0
        for i, key in enumerate(self.config.spec.keys()):
            for _ in range(self.config.bucket_batches(i, self.world)):
                info = s.get_batch_info(j)
                assert info["bucket_key"] == key
                assert info["batch_size"] == self.config.batch_size(i)
                assert tuple(info["resolution"]) == self.config.spec.resolutions[i]
                j += 1
        assert j == self.length
        assert s.get_batch_info(j) == {}


_profile = settings()
SequentialBucketMachine.TestCase.settings = settings(
    _profile,
    max_examples=max(10, _profile.max_examples * 2 // 3),
    stateful_step_count=25,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestSequentialBucketMachine = SequentialBucketMachine.TestCase
