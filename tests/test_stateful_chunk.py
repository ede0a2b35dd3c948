"""Stateful test of ``croupier.ChunkSampler`` against its reference model
(``tests/models/chunk.py``): every rank of a world in lockstep, partial passes over
``sample(n_obs)`` (lazy generators), states at request and batch granularity
(``batches_consumed``) loaded into fresh samplers (also through JSON), ``set_epoch``, pickling,
a forked child finishing the pass, and bad input that must change nothing. After every step the
state agrees with the model and a fresh sampler loaded with it yields what the model says
remains."""

from __future__ import annotations

import copy
import json
import pickle

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from croupier import ChunkSampler
from models._fork import in_fork
from models.chunk import (
    ChunkModel,
    as_request,
    check_chunk_order,
    check_requests,
    rank_slices,
)


def take(it, k):
    out = []
    for _ in range(k):
        try:
            out.append(as_request(next(it)))
        except StopIteration:
            break
    return out


class ChunkMachine(RuleBasedStateMachine):
    forks = 0

    @initialize(
        chunk_size=st.integers(1, 6),
        preload=st.integers(1, 3),
        per_batch=st.integers(1, 3),
        n_obs=st.integers(0, 80),
        world=st.integers(1, 4),
        shuffle=st.booleans(),
        drop_last=st.booleans(),
        seed=st.integers(0, 2**64 - 1),
    )
    def setup(self, chunk_size, preload, per_batch, n_obs, world, shuffle, drop_last, seed):
        # batch_size divides chunk_size * preload_nchunks (annbatch's rule)
        memory = chunk_size * preload
        divisors = [d for d in range(1, memory + 1) if memory % d == 0]
        batch_size = divisors[min(per_batch, len(divisors)) - 1]
        self.cfg = {
            "chunk_size": chunk_size,
            "preload_nchunks": preload,
            "batch_size": batch_size,
            "shuffle": shuffle,
            "drop_last": drop_last,
            "seed": seed,
        }
        self.n_obs, self.world = n_obs, world
        self.samplers = [self.build(r) for r in range(world)]
        self.total = self.samplers[0].n_iters(n_obs)
        self.iters = None
        self.model = ChunkModel()
        self.epochs = {}

    def build(self, rank, world=None):
        return ChunkSampler(**self.cfg, num_replicas=world or self.world, rank=rank)

    def requests(self, epoch):
        """Every rank's requests of ``epoch``, read once from fresh uninterrupted samplers, their
        shape checked against the chunk order of a one-rank sampler."""
        if epoch not in self.epochs:
            one = ChunkSampler(**{**self.cfg, "drop_last": False}, num_replicas=1, rank=0)
            one.set_epoch(epoch)
            order = [s for req in one.sample(self.n_obs) for s in as_request(req)[0]]
            check_chunk_order(order, 0, self.n_obs, self.cfg["chunk_size"])
            per_rank = []
            for r in range(self.world):
                s = self.build(r)
                s.set_epoch(epoch)
                reqs = [as_request(q) for q in s.sample(self.n_obs)]
                slices = rank_slices(
                    order, self.world, r, self.cfg["drop_last"], self.cfg["preload_nchunks"]
                )
                check_requests(reqs, slices, self.cfg["batch_size"], self.total)
                per_rank.append(reqs)
            self.epochs[epoch] = per_rank
        return self.epochs[epoch]

    def remaining(self, r, epoch, position):
        """What a pass starting at ``position`` yields on rank ``r`` (by the model)."""
        m = ChunkModel()
        m.loaded(epoch, position)
        m.new_pass()
        return m.take(10**6, self.requests(epoch))[r]

    @rule(k=st.integers(0, 4), new_pass=st.booleans())
    def take_requests(self, k, new_pass):
        if new_pass or self.iters is None:
            self.iters = [s.sample(self.n_obs) for s in self.samplers]
            self.model.new_pass()
        got = [take(it, k) for it in self.iters]
        assert got == self.model.take(k, self.requests(self.model.epoch))

    @rule(data=st.data(), through_json=st.booleans(), from_rank=st.integers(0, 3))
    def save_and_load_into_fresh(self, data, through_json, from_rank):
        src = self.samplers[from_rank % self.world]
        handed = self.model.position - self.model.first
        consumed = data.draw(st.one_of(st.none(), st.integers(0, max(handed, 0))))
        state = src.state_dict(batches_consumed=consumed)
        if through_json:
            state = json.loads(json.dumps(state))
        self.samplers = [self.build(r) for r in range(self.world)]
        for s in self.samplers:
            s.load_state_dict(state)
        self.iters = None
        position = self.model.position if consumed is None else self.model.first + consumed
        self.model.loaded(self.model.epoch, position)

    @rule(epoch=st.integers(0, 3))
    def set_epoch(self, epoch):
        for s in self.samplers:
            s.set_epoch(epoch)
        self.iters = None
        self.model.set_epoch(epoch)

    @rule()
    def pickle_round_trip(self):
        self.samplers = [pickle.loads(pickle.dumps(s)) for s in self.samplers]
        self.iters = None
        m = self.model
        m.pending = m.pending or m.position > 0
        m.live, m.created = None, False

    @precondition(lambda self: self.forks < 1)
    @rule()
    def fork_child_finishes_the_pass(self):
        self.forks += 1
        iters = self.iters
        model = copy.deepcopy(self.model)
        if iters is None:
            iters = [s.sample(self.n_obs) for s in self.samplers]
            model.new_pass()
        got = in_fork(lambda: [take(it, 10**6) for it in iters])
        assert got == model.take(10**6, self.requests(model.epoch))

    @rule(
        bad=st.sampled_from(
            ["consumed", "past_end", "other_world", "other_config", "rank", "n_obs", "type"]
        )
    )
    def bad_operation_changes_nothing(self, bad):
        s = self.samplers[0]
        before = s.state_dict()
        state = dict(before)
        with pytest.raises((ValueError, TypeError)):
            if bad == "consumed":
                s.state_dict(batches_consumed=self.total + 1)
            elif bad == "n_obs":
                if before["n_obs"] < 0:
                    raise ValueError("not applicable")
                state["n_obs"] = before["n_obs"] + 1
                t = self.build(0)
                t.load_state_dict(state)
                t.validate(self.n_obs)  # the data changed since the checkpoint
                raise AssertionError("unreachable")
            else:
                if bad == "past_end":
                    state["n_obs"], state["position"] = self.n_obs, self.total + 1
                elif bad == "other_world":
                    state["num_replicas"] = self.world + 1
                elif bad == "other_config":
                    state["chunk_size"] += 1
                elif bad == "rank":
                    state["rank"] = self.world
                else:
                    state["position"] = "0"
                s.load_state_dict(state)
        assert s.state_dict() == before

    @invariant()
    def state_is_the_models(self):
        m = self.model
        for s in self.samplers:
            state = s.state_dict()
            assert state["epoch"] == m.epoch
            assert state["position"] == m.position
            assert state["num_replicas"] == self.world
            assert s.n_iters(self.n_obs) == self.total

    @invariant()
    def state_resumes_with_what_remains(self):
        state = self.samplers[0].state_dict()
        for r in {0, self.world - 1}:
            fresh = self.build(r)
            fresh.load_state_dict(state)
            got = [as_request(q) for q in fresh.sample(self.n_obs)]
            assert got == self.remaining(r, state["epoch"], state["position"])


_profile = settings()
ChunkMachine.TestCase.settings = settings(
    _profile,
    max_examples=max(10, _profile.max_examples * 2 // 3),
    stateful_step_count=25,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestChunkMachine = ChunkMachine.TestCase
