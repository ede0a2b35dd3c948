"""RankAwareSampler: TransferQueue's behaviour call for call, threads, memory, checkpoints."""

from __future__ import annotations

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
    assert s.save_checkpoint() == {"_states": {"p": {"t": {0: {}}}}}


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
