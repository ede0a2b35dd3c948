"""RankAwareSampler: TransferQueue's behaviour call for call, threads, memory, checkpoints."""

from __future__ import annotations

import copy
import json
import pickle
import threading

import pytest

from croupier import RankAwareSampler
from croupier.compat.transfer_queue import RankAwareSampler as Compat


def upstream_sample(states, ready, batch_size, dp_rank, batch_index, task_name, partition_id):
    """TransferQueue's documented behaviour, step by step, as the reference."""
    if dp_rank < 0:
        raise ValueError("dp_rank must be >= 0")
    entry = states.setdefault(partition_id, {}).setdefault(task_name, {}).setdefault(dp_rank, {})
    if batch_index not in entry:
        sampled = ready[:batch_size]
        if len(sampled) < batch_size:
            return [], []
        entry[batch_index] = sampled
        return sampled, sampled
    return entry[batch_index], entry[batch_index]


def test_call_for_call_like_upstream():
    ours, states = Compat(), {}
    calls = [
        (list(range(10)), 4, 0, 0, "train", "p0"),
        (list(range(4, 10)), 4, 0, 0, "train", "p0"),  # same group, same batch: cached
        (list(range(4, 10)), 4, 1, 0, "train", "p0"),  # another group samples
        (list(range(8, 10)), 4, 0, 1, "train", "p0"),  # too few ready
        (list(range(8, 14)), 4, 0, 1, "train", "p0"),
        (list(range(3)), 2, 0, 0, "eval", "p0"),
        (list(range(3)), 2, 0, 0, "train", "p1"),
    ]
    for call in calls:
        assert ours.sample(*call) == upstream_sample(states, *call)
        assert ours(
            *call[:2],
            dp_rank=call[2],
            batch_index=call[3],
            task_name=call[4],
            partition_id=call[5],
            partition=object(),
        ) == upstream_sample(states, *call)
    assert ours.save_checkpoint() == {"_states": states}
    assert ours.has_cached_result("p0", "train", {"dp_rank": 0, "batch_index": 1})
    assert not ours.has_cached_result("p0", "train", {"dp_rank": 0, "batch_index": 7})
    assert not ours.has_cached_result("p0", "train", {})
    ours.clear_cache("p0")
    assert not ours.has_cached_result("p0", "train", {"dp_rank": 0, "batch_index": 1})
    with pytest.raises(ValueError, match="dp_rank"):
        ours.sample([1, 2], 1, -1, 0, "train", "p0")


def test_threads_of_one_group_get_one_batch():
    s = RankAwareSampler()
    results = []
    barrier = threading.Barrier(16)

    def member(i):
        barrier.wait()
        # every member sees a different ready list; only the first sampler's choice counts
        results.append(s.sample(list(range(i, i + 50)), 8, 3, 0, "train", "p")[0])

    threads = [threading.Thread(target=member, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 16 and all(r == results[0] for r in results)


def test_group_size_bounds_memory():
    s = RankAwareSampler(group_size=3)
    first = s.sample(list(range(10)), 4, 0, 0, "t", "p")
    assert s.sample(list(range(5, 10)), 4, 0, 0, "t", "p") == first
    assert s.has_cached_result("p", "t", {"dp_rank": 0, "batch_index": 0})
    assert s.sample(list(range(5, 10)), 4, 0, 0, "t", "p") == first  # the third member
    assert not s.has_cached_result("p", "t", {"dp_rank": 0, "batch_index": 0})
    for b in range(1000):
        for _ in range(3):
            s.sample(list(range(100)), 4, 0, b, "t", "p")
    assert s.save_checkpoint() == {"_states": {}, "_reads": {}}  # no empty levels left


def test_seeded_shuffle_is_deterministic_and_uniformish():
    a = RankAwareSampler(shuffle=True, seed=3).sample(list(range(100)), 10, 0, 5, "t", "p")[0]
    b = RankAwareSampler(shuffle=True, seed=3).sample(list(range(100)), 10, 0, 5, "t", "p")[0]
    c = RankAwareSampler(shuffle=True, seed=3).sample(list(range(100)), 10, 0, 6, "t", "p")[0]
    assert a == b and a != c and len(set(a)) == 10 and a != list(range(10))
    counts = [0] * 20
    for batch_index in range(2000):
        for i in RankAwareSampler(shuffle=True).sample(
            list(range(20)), 1, 0, batch_index, "t", "p"
        )[0]:
            counts[i] += 1
    expected = 2000 / 20
    assert sum((c - expected) ** 2 / expected for c in counts) < 45  # df 19, p < 1e-3


def test_checkpoints_roundtrip_and_pickle():
    s = RankAwareSampler()
    s.sample(list(range(10)), 4, 0, 0, "t", "p")
    state = pickle.loads(pickle.dumps(s.save_checkpoint()))
    t = RankAwareSampler()
    t.load_checkpoint(state)
    assert t.sample([99, 98, 97, 96], 4, 0, 0, "t", "p")[0] == [0, 1, 2, 3]
    with pytest.raises(TypeError):
        t.load_checkpoint({"states": {}})


@pytest.mark.parametrize("state", [{}, {"states": {}}, {"_reads": {}}, {0: 1}])
@pytest.mark.parametrize("cls", [RankAwareSampler, "compat"])
def test_a_checkpoint_without_states_is_a_key_error_too(state, cls):
    """TransferQueue's sampler raises KeyError on a checkpoint without '_states': code written
    for it catches that; croupier's error is also the TypeError it documents, with its message,
    and the cache stays as it was."""
    if cls == "compat":
        from croupier.compat.transfer_queue import RankAwareSampler as cls
    s = cls()
    s.sample(list(range(10)), 4, 0, 0, "t", "p")
    before = s.save_checkpoint()
    for kind in (KeyError, TypeError):
        with pytest.raises(kind) as info:
            s.load_checkpoint(state)
        assert str(info.value).startswith("state must be a save_checkpoint() dict with a '_states'")
    assert s.save_checkpoint() == before


@pytest.mark.parametrize(
    ("kwargs", "exc"),
    [({"group_size": 0}, ValueError), ({"seed": -1}, ValueError), ({"shuffle": 1}, TypeError)],
)
def test_bad_arguments(kwargs, exc):
    with pytest.raises(exc):
        RankAwareSampler(**kwargs)


def test_bad_sample_arguments():
    s = RankAwareSampler()
    with pytest.raises(TypeError, match="dp_rank"):
        s.sample([1], 1, 0.5, 0, "t", "p")
    with pytest.raises(ValueError, match="batch_size"):
        s.sample([1], -1, 0, 0, "t", "p")


@pytest.mark.parametrize("cls", [RankAwareSampler, Compat])
def test_configured_instances_pickle_and_copy_with_their_cache(cls):
    s = cls(group_size=3, shuffle=True, seed=7)
    first = s.sample(list(range(50)), 4, 1, 0, "t", "p")
    assert s.sample(list(range(50)), 4, 1, 0, "t", "p") == first  # two of three members read
    for make_copy in (lambda x: pickle.loads(pickle.dumps(x)), copy.deepcopy, copy.copy):
        clone = make_copy(s)
        assert type(clone) is cls
        assert (clone.group_size, clone.shuffle, clone.seed) == (3, True, 7)
        assert clone.save_checkpoint() == s.save_checkpoint()
        assert clone._lock is not s._lock
        # the third member reads from the copy: served, then freed there only
        assert clone.sample([], 4, 1, 0, "t", "p") == first
        assert not clone.has_cached_result("p", "t", {"dp_rank": 1, "batch_index": 0})
        assert s.has_cached_result("p", "t", {"dp_rank": 1, "batch_index": 0})
        # a new key is sampled as the original samples it
        assert clone.sample(list(range(50)), 4, 1, 1, "t", "p") == s.sample(
            list(range(50)), 4, 1, 1, "t", "p"
        )
        s.clear_cache("other")  # the original's lock still works
    assert pickle.loads(pickle.dumps(Compat())).save_checkpoint() == {"_states": {}}


@pytest.mark.parametrize(
    ("group_size", "read_before"), [(2, 1), (3, 1), (3, 2), (5, 1), (5, 2), (5, 4)]
)
def test_group_size_bound_holds_after_restore(group_size, read_before):
    s = RankAwareSampler(group_size=group_size)
    batch = s.sample(list(range(10)), 4, 0, 0, "t", "p")
    for _ in range(read_before - 1):
        s.sample([], 4, 0, 0, "t", "p")
    state = pickle.loads(pickle.dumps(s.save_checkpoint()))
    t = RankAwareSampler(group_size=group_size)
    t.load_checkpoint(state)
    for _ in range(group_size - read_before - 1):  # every member but the last
        assert t.sample([], 4, 0, 0, "t", "p") == batch
        assert t.has_cached_result("p", "t", {"dp_rank": 0, "batch_index": 0})
    assert t.sample([], 4, 0, 0, "t", "p") == batch  # the last member
    assert t.save_checkpoint() == {"_states": {}, "_reads": {}}


@pytest.mark.parametrize("group_size", [2, 3])
def test_checkpoints_without_read_counts_still_load(group_size):
    upstream = {"_states": {"p": {"t": {0: {0: [0, 1, 2, 3]}, 1: {5: [4, 5]}}}}}  # the seed's
    t = RankAwareSampler(group_size=group_size)
    t.load_checkpoint(upstream)
    # each cached batch counts as read once (by the member that sampled it)
    for _ in range(group_size - 1):
        assert t.has_cached_result("p", "t", {"dp_rank": 0, "batch_index": 0})
        assert t.sample([], 4, 0, 0, "t", "p") == ([0, 1, 2, 3], [0, 1, 2, 3])
    assert not t.has_cached_result("p", "t", {"dp_rank": 0, "batch_index": 0})
    assert t.save_checkpoint() == {
        "_states": {"p": {"t": {1: {5: [4, 5]}}}},
        "_reads": {},
    }
    # and a sampler without group_size keeps TransferQueue's shape exactly
    u = RankAwareSampler()
    u.load_checkpoint(upstream)
    assert u.save_checkpoint() == upstream


@pytest.mark.parametrize(
    ("reads", "exc", "match"),
    [
        ({"p": {"t": {0: {0: 0}}}}, ValueError, r"\[1, 2\]"),
        ({"p": {"t": {0: {0: 3}}}}, ValueError, r"\[1, 2\]"),
        ({"p": {"t": {0: {0: 1.0}}}}, TypeError, "_reads"),
        ({"p": {"t": {0: {9: 1}}}}, ValueError, "no such batch"),
        ({"q": {"t": {0: {0: 1}}}}, ValueError, "no such batch"),
        ({"p": {"t": [1]}}, TypeError, "_reads"),
        ([1], TypeError, "_reads"),
    ],
)
def test_bad_read_counts_are_refused(reads, exc, match):
    t = RankAwareSampler(group_size=3)
    t.sample(list(range(8)), 2, 0, 0, "x", "y")
    before = t.save_checkpoint()
    with pytest.raises(exc, match=match):
        t.load_checkpoint({"_states": {"p": {"t": {0: {0: [1, 2]}}}}, "_reads": reads})
    assert t.save_checkpoint() == before


def test_freed_and_uncached_keys_leave_no_empty_levels():
    s = RankAwareSampler(group_size=2)
    for step in range(100):
        for _ in range(2):
            s.sample([1, 2, 3], 2, 0, 0, "train", f"step{step}")
    s.sample([1], 2, 0, 0, "train", "few")  # too few ready: nothing cached, no entry
    assert s.save_checkpoint() == {"_states": {}, "_reads": {}}
    s.sample([1, 2], 2, 3, 0, "t", "p")
    s.sample([1, 2], 2, 4, 0, "t", "p")
    s.sample([], 2, 3, 0, "t", "p")  # group 3 freed, group 4 still cached
    assert s.save_checkpoint() == {
        "_states": {"p": {"t": {4: {0: [1, 2]}}}},
        "_reads": {"p": {"t": {4: {0: 1}}}},
    }
    u = RankAwareSampler(group_size=1)
    u.sample([1, 2], 2, 0, 0, "t", "p")
    assert u.save_checkpoint() == {"_states": {}, "_reads": {}}


@pytest.mark.parametrize(
    ("states", "exc", "match"),
    [
        ({"p": 1}, TypeError, "mapping"),
        ({"p": {"t": [1]}}, TypeError, "mapping"),
        ({"p": {"t": {0: [1]}}}, TypeError, "mapping"),
        ({"p": {"t": {0: {0: 5}}}}, TypeError, "list of indices"),
        ({"p": {"t": {0: {0: [1.5]}}}}, TypeError, "must be an int"),
        ({"p": {"t": {0: {0: [True]}}}}, TypeError, "must be an int"),
        ({"p": {"t": {-1: {0: [1]}}}}, ValueError, "dp_rank"),
        ({"p": {"t": {True: {0: [1]}}}}, TypeError, "dp_rank"),
        ({"p": {"t": {"x": {0: [1]}}}}, TypeError, "dp_rank"),
        ({"p": {"t": {0: {0: [1]}, "0": {}}}}, ValueError, "the same"),
    ],
)
def test_malformed_checkpoints_are_refused_unchanged(states, exc, match):
    t = RankAwareSampler(group_size=3)
    t.sample([1, 2], 2, 0, 0, "t", "p")
    before = t.save_checkpoint()
    with pytest.raises(exc, match=match):
        t.load_checkpoint({"_states": states})
    assert t.save_checkpoint() == before


def test_json_roundtripped_checkpoint_restores_integer_keys():
    s = RankAwareSampler(group_size=3)
    s.sample([1, 2, 3, 4], 2, 0, 7, "t", "p")
    saved = s.save_checkpoint()
    t = RankAwareSampler(group_size=3)
    t.load_checkpoint(json.loads(json.dumps(saved)))
    assert t.save_checkpoint() == saved
    assert t.has_cached_result("p", "t", {"dp_rank": 0, "batch_index": 7})
    assert t.sample([7, 8], 2, 0, 7, "t", "p") == ([1, 2], [1, 2])  # the group's batch
    assert t.sample([7, 8], 2, 0, 7, "t", "p") == ([1, 2], [1, 2])
    assert t.save_checkpoint() == {"_states": {}, "_reads": {}}


def test_the_samplers_that_are_no_torch_sampler_import_without_torch():
    # torch's import takes seconds and hundreds of MiB: only the torch Samplers pay it.
    import subprocess
    import sys

    code = (
        "import sys\n"
        "import croupier\n"
        "from croupier import ChunkSampler, RankAwareSampler, StateError\n"
        "from croupier.samplers import check_int\n"
        "RankAwareSampler(group_size=2)\n"
        "ChunkSampler(chunk_size=4, preload_nchunks=2, batch_size=4, num_replicas=1, rank=0)\n"
        "print('torch' in sys.modules)\n"
        "croupier.DistributedSampler(10, num_replicas=1, rank=0)\n"
        "from croupier._torch import HAVE_TORCH\n"
        "print('torch' in sys.modules, HAVE_TORCH)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    first, second = out.stdout.splitlines()
    assert first == "False"
    assert second in ("True True", "False False")  # a torch Sampler once torch is installed
