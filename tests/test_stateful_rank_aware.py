"""Stateful test of ``croupier.RankAwareSampler`` against its reference model
(``tests/models/rank_aware.py``): random sequences of ``sample`` calls from random groups,
batches, tasks and partitions, ``clear_cache``, checkpoint round trips (also through JSON and in
TransferQueue's format without read counts), pickling, concurrent members in threads, a forked
child, and bad input that must change nothing. After every step the checkpoint equals the
model's and ``has_cached_result`` agrees with it."""

from __future__ import annotations

import copy
import json
import pickle
import threading

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from croupier import RankAwareSampler
from models._fork import in_fork
from models.rank_aware import RankAwareModel, flatten, nest

PIDS = ["p0", "p1", "p2"]
TASKS = ["train", "eval"]
dp_ranks = st.integers(0, 3)
batch_indexes = st.integers(0, 4)
ready_lists = st.lists(st.integers(0, 60), unique=True, max_size=10)
batch_sizes = st.integers(0, 6)


def normalised(checkpoint, group_size):
    """A checkpoint without empty levels (upstream creates some, croupier does not), with the
    read count of a batch that has none filled in as 1 (what loading it gives)."""
    cache = flatten(checkpoint["_states"])
    out = {"_states": nest(cache)}
    if group_size is not None:
        reads = flatten(checkpoint.get("_reads", {}))
        out["_reads"] = nest({k: reads.get(k, 1) for k in cache})
    return out


class RankAwareMachine(RuleBasedStateMachine):
    forks = 0

    @initialize(
        group_size=st.sampled_from([None, None, 1, 2, 3]),
        shuffle=st.sampled_from([False, False, False, True]),
        seed=st.integers(0, 2**64 - 1),
    )
    def setup(self, group_size, shuffle, seed):
        self.config = {"group_size": group_size, "shuffle": shuffle, "seed": seed}
        self.sampler = RankAwareSampler(**self.config)
        self.model = RankAwareModel(group_size)

    def _fresh(self):
        return RankAwareSampler(**self.config)

    def _choice(self, ready, batch_size, dp, bi, task, pid):
        """Under shuffle, the batch a fresh sample of the key chooses: read from a fresh sampler
        of the same seed (the permitted oracle, deterministic in the seed, the key and the ready
        list), its shape checked; the model uses it wherever it samples."""
        if not self.config["shuffle"] or len(ready) < batch_size:
            return None
        sampled, consumed = self._fresh().sample(list(ready), batch_size, dp, bi, task, pid)
        assert sampled == consumed
        assert len(sampled) == batch_size
        assert len(set(sampled)) == batch_size and set(sampled) <= set(ready)
        return sampled

    @rule(
        ready=ready_lists,
        batch_size=batch_sizes,
        dp=dp_ranks,
        bi=batch_indexes,
        task=st.sampled_from(TASKS),
        pid=st.sampled_from(PIDS),
        as_controller=st.booleans(),
    )
    def sample(self, ready, batch_size, dp, bi, task, pid, as_controller):
        if as_controller:  # how TransferQueue's controller calls it
            got = self.sampler(
                list(ready),
                batch_size,
                partition=object(),
                dp_rank=dp,
                batch_index=bi,
                task_name=task,
                partition_id=pid,
            )
        else:
            got = self.sampler.sample(list(ready), batch_size, dp, bi, task, pid, "extra", x=1)
        chosen = self._choice(ready, batch_size, dp, bi, task, pid)
        want = self.model.sample(list(ready), batch_size, dp, bi, task, pid, chosen)
        assert tuple(got) == want

    @rule(pid=st.sampled_from([*PIDS, "never"]))
    def clear_cache(self, pid):
        self.sampler.clear_cache(pid)
        self.model.clear_cache(pid)

    @rule(
        through_json=st.booleans(),
        upstream_format=st.booleans(),
        into_fresh=st.booleans(),
    )
    def checkpoint_round_trip(self, through_json, upstream_format, into_fresh):
        state = self.sampler.save_checkpoint()
        if upstream_format:
            state = {"_states": state["_states"]}  # TransferQueue's: no read counts
        if through_json:
            state = json.loads(json.dumps(state))
        target = self._fresh() if into_fresh else self.sampler
        target.load_checkpoint(state)
        self.sampler = target
        self.model.load(state)
        # JSON made the integer keys strings; they load as the integers again
        self.model.cache = {
            (p, t, int(d), int(b)): v for (p, t, d, b), v in self.model.cache.items()
        }
        self.model.reads = {
            (p, t, int(d), int(b)): v for (p, t, d, b), v in self.model.reads.items()
        }

    @rule()
    def pickle_round_trip(self):
        self.sampler = pickle.loads(pickle.dumps(self.sampler))

    @rule()
    def deepcopy_is_independent(self):
        before = self.model.checkpoint()
        clone = copy.deepcopy(self.sampler)
        clone.clear_cache("p0")
        clone.sample(list(range(10)), 2, 9, 9, "train", "p1")
        assert normalised(self.sampler.save_checkpoint(), self.config["group_size"]) == before

    @rule(
        ready=ready_lists,
        batch_size=batch_sizes,
        dp=dp_ranks,
        bi=batch_indexes,
        task=st.sampled_from(TASKS),
        pid=st.sampled_from(PIDS),
        members=st.integers(2, 4),
    )
    def concurrent_members(self, ready, batch_size, dp, bi, task, pid, members):
        """The members of a group ask for the same batch at once, from threads."""
        results = [None] * members
        barrier = threading.Barrier(members)

        def member(i):
            barrier.wait()
            results[i] = self.sampler.sample(list(ready), batch_size, dp, bi, task, pid)

        threads = [threading.Thread(target=member, args=(i,)) for i in range(members)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        chosen = self._choice(ready, batch_size, dp, bi, task, pid)
        want = [self.model.sample(list(ready), batch_size, dp, bi, task, pid, chosen)]
        for _ in range(members - 1):
            want.append(self.model.sample(list(ready), batch_size, dp, bi, task, pid, chosen))
        # Calls with the same ready list: the order among threads cannot change the answers.
        assert sorted(map(tuple, results)) == sorted(want)

    @precondition(lambda self: self.forks < 1)
    @rule(
        calls=st.lists(
            st.tuples(ready_lists, batch_sizes, dp_ranks, batch_indexes, st.sampled_from(PIDS)),
            min_size=1,
            max_size=4,
        )
    )
    def fork_child_samples(self, calls):
        """A forked child (a DataLoader worker, a Ray actor's fork) carries the cache."""
        self.forks += 1
        sampler = self.sampler

        def child():
            return [sampler.sample(list(r), b, d, i, "train", p) for r, b, d, i, p in calls]

        got = in_fork(child)
        model = copy.deepcopy(self.model)
        for (r, b, d, i, p), result in zip(calls, got, strict=True):
            chosen = self._choice(r, b, d, i, "train", p)
            assert tuple(result) == model.sample(list(r), b, d, i, "train", p, chosen)

    @rule(
        bad=st.sampled_from(
            [
                "negative_dp",
                "no_states",
                "not_mapping",
                "batch_not_list",
                "negative_dp_key",
                "bad_reads",
                "index_not_int",
            ]
        )
    )
    def bad_operation_changes_nothing(self, bad):
        before = normalised(self.sampler.save_checkpoint(), self.config["group_size"])
        if bad == "negative_dp":
            with pytest.raises(ValueError):
                self.sampler.sample([1, 2, 3], 1, -1, 0, "train", "p0")
        else:
            state = {
                "no_states": {"states": {}},
                "not_mapping": ["_states"],
                "batch_not_list": {"_states": {"p0": {"train": {0: {0: 5}}}}},
                "negative_dp_key": {"_states": {"p0": {"train": {-1: {0: [1]}}}}},
                "bad_reads": {
                    "_states": {"p0": {"train": {0: {0: [1]}}}},
                    "_reads": {"p0": {"train": {0: {1: 1}}}},
                },
                "index_not_int": {"_states": {"p0": {"train": {0: {0: ["x"]}}}}},
            }[bad]
            if bad == "bad_reads" and self.config["group_size"] is None:
                return  # read counts are only read with a group size
            with pytest.raises((TypeError, ValueError)):
                self.sampler.load_checkpoint(state)
        assert normalised(self.sampler.save_checkpoint(), self.config["group_size"]) == before

    @invariant()
    def checkpoint_is_the_models(self):
        assert (
            normalised(self.sampler.save_checkpoint(), self.config["group_size"])
            == self.model.checkpoint()
        )

    @invariant()
    def cached_results_agree(self):
        for pid in PIDS:
            for task in TASKS:
                assert not self.sampler.has_cached_result(pid, task, {})
                for dp in range(4):
                    for bi in range(5):
                        config = {"dp_rank": dp, "batch_index": bi}
                        assert self.sampler.has_cached_result(
                            pid, task, config
                        ) == self.model.has_cached_result(pid, task, config)


_profile = settings()
RankAwareMachine.TestCase.settings = settings(
    _profile,
    max_examples=max(10, _profile.max_examples * 2 // 3),
    stateful_step_count=30,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestRankAwareMachine = RankAwareMachine.TestCase
