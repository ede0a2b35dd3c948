"""Elastic resume: an epoch checkpointed mid-way on W ranks continues on W' ranks.

The property every test checks, for every sampler: the items the old ranks consumed and the
items the new ranks yield together cover the epoch exactly once, apart from torch's rules on
the remainder (``drop_last=False`` pads with fewer than W' repeats of the remainder's head,
``drop_last=True`` drops fewer than W' of its tail); the new ranks yield equal counts and are
disjoint; nothing consumed before the checkpoint comes again.
"""

from __future__ import annotations

import itertools
import json
import pickle
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from croupier import BucketBatchSampler, DistributedSampler, MixtureSampler, StateError


def _positions(length):
    """Checkpoint positions: the start, one in, the middle, the last item, the end."""
    return sorted({0, min(1, length), length // 2, max(length - 1, 0), length})


def _run(make, world, positions, key=lambda x: x):
    """Runs one epoch through a sequence of worlds: ``world[i]`` ranks consume
    ``positions[i]`` items each (``None``: to the end), the state of rank 0 going to the next
    world. Returns the items consumed per world (a list per rank) and the final lengths."""
    state = None
    consumed = []
    for w, pos in zip(world, positions, strict=True):
        ranks = []
        for r in range(w):
            s = make(w, r)
            s.set_epoch(3)
            if state is not None:
                s.load_state_dict(json.loads(json.dumps(state)))
            ranks.append(s)
        lengths = {len(s) for s in ranks}
        assert len(lengths) == 1, f"unequal lengths on {w} ranks: {lengths}"
        took = []
        for s in ranks:
            took.append([key(x) for x in itertools.islice(iter(s), pos)])
        # Ranks move in lockstep: any rank's state will do, and all ranks' agree.
        states = [s.state_dict() for s in ranks]
        assert all({**st, "rank": 0} == {**states[0], "rank": 0} for st in states)
        state = states[0]
        consumed.append(took)
    return consumed, state


def _check_cover(full, consumed, worlds, drop_last):
    """``full``: the items of the uninterrupted epoch (all ranks of the first world, padding
    included). ``consumed``: per world, per rank, what was taken."""
    # Consecutive worlds of one size are one world resumed (its own padding may repeat).
    merged_w, merged = [worlds[0]], [consumed[0]]
    for w, c in zip(worlds[1:], consumed[1:], strict=True):
        if w == merged_w[-1]:
            merged[-1] = [a + b for a, b in zip(merged[-1], c, strict=True)]
        else:
            merged_w.append(w)
            merged.append(c)
    worlds, consumed = merged_w, merged
    if len(set(worlds)) == 1:
        # No change of world: a plain resume, the uninterrupted epoch with its own padding.
        assert Counter(x for world in consumed for r in world for x in r) == Counter(full)
        return
    first = Counter(x for rank in consumed[0] for x in rank)
    later = [Counter(x for rank in world for x in rank) for world in consumed[1:]]
    distinct_full = set(full)
    seen = set(first)
    for i, c in enumerate(later):
        assert not (set(c) & seen), f"world {i + 1} repeats items consumed before"
        seen |= set(c)
    assert seen <= distinct_full
    lost = distinct_full - seen
    # Each change of world may drop (drop_last) fewer than W' items of its remainder.
    if drop_last:
        assert len(lost) < sum(worlds[1:]) + worlds[0]
    else:
        assert not lost, f"{len(lost)} items lost"
    # Padding: fewer than W' repeats per world (the first world's own padding as torch's).
    for w, c in zip(worlds[1:], later, strict=True):
        assert sum(c.values()) - len(c) < w


# -- DistributedSampler ---------------------------------------------------------------------------


def _dist(n, drop_last, order="fast", shuffle=True):
    def make(w, r):
        return DistributedSampler(
            n,
            num_replicas=w,
            rank=r,
            seed=11,
            drop_last=drop_last,
            order=order,
            shuffle=shuffle,
        )

    return make


def _full_epoch(make, w):
    out = []
    for r in range(w):
        s = make(w, r)
        s.set_epoch(3)
        out.extend(list(s))
    return out


@pytest.mark.parametrize("n", [1, 2, 7, 97, 1009, 4099])
@pytest.mark.parametrize("w0,w1", [(8, 6), (6, 8), (1, 5), (5, 1), (3, 7), (4, 4)])
@pytest.mark.parametrize("drop_last", [False, True])
def test_distributed_resumes_on_another_world(n, w0, w1, drop_last):
    make = _dist(n, drop_last)
    full = _full_epoch(make, w0)
    length = len(make(w0, 0))
    for pos in _positions(length):
        consumed, _ = _run(make, [w0, w1], [pos, None])
        new = consumed[1]
        assert len({len(r) for r in new}) == 1
        taken = [x for r in consumed[0] for x in r]
        rest = [x for r in new for x in r]
        if 0 < pos < length:
            # The rest is what the old ranks had not consumed, dealt with torch's rules.
            remainder = len(set(full)) - len(set(taken))
            want = remainder // w1 * w1 if drop_last else -(-remainder // w1) * w1
            assert len(rest) == want, (pos, len(rest), want)
        if pos == 0:
            # Nothing consumed: the new world starts the epoch afresh, drawn for its size.
            assert Counter(rest) == Counter(_full_epoch(make, w1))
        else:
            _check_cover(full, consumed, [w0, w1], drop_last)


@pytest.mark.parametrize("order", ["fast", "torch"])
@pytest.mark.parametrize("shuffle", [True, False])
def test_distributed_both_orders_and_unshuffled(order, shuffle):
    pytest.importorskip("torch") if order == "torch" else None
    n = 2003
    for drop_last in (False, True):
        make = _dist(n, drop_last, order, shuffle)
        full = _full_epoch(make, 4)
        for pos in _positions(len(make(4, 0)))[1:]:
            consumed, _ = _run(make, [4, 3], [pos, None])
            _check_cover(full, consumed, [4, 3], drop_last)


def test_distributed_rest_keeps_the_global_order():
    # The rest is the epoch's global order (rank r at positions r, r + W, ...) from the
    # consumed prefix on, dealt with torch's arithmetic: new rank r takes its r-th, (r+W')-th,
    # ... item, so the order is the original one, not a reshuffle.
    n, w0, w1, pos = 1000, 4, 3, 37
    make = _dist(n, False)
    shares = []
    for r in range(w0):
        s = make(w0, r)
        s.set_epoch(3)
        shares.append(list(s))
    glob = [shares[g % w0][g // w0] for g in range(n)]
    consumed, _ = _run(make, [w0, w1], [pos, None])
    rest = glob[pos * w0 :]
    for r, got in enumerate(consumed[1]):
        want = [rest[h % len(rest)] for h in range(r, len(got) * w1, w1)]
        assert got == want


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 3000),
    worlds=st.lists(st.integers(1, 9), min_size=2, max_size=4),
    fractions=st.lists(st.floats(0, 1), min_size=4, max_size=4),
    drop_last=st.booleans(),
)
def test_distributed_successive_changes(n, worlds, fractions, drop_last):
    make = _dist(n, drop_last)
    full = _full_epoch(make, worlds[0])
    # Each world consumes a fraction of its share before the next change; the last runs out.
    positions = []
    state = None
    for w, f in zip(worlds[:-1], fractions, strict=False):
        s = make(w, 0)
        s.set_epoch(3)
        if state is not None:
            s.load_state_dict(state)
        positions.append(int(f * len(s)))
        s.set_skip(positions[-1])
        state = {**s.state_dict(), "position": positions[-1]}
    positions.append(None)
    consumed, final = _run(make, worlds, positions)
    # Worlds that consumed nothing before the first change hand over the start of the epoch:
    # the next world draws the epoch for its own size.
    while positions[0] == 0 and len(worlds) > 1:
        worlds, positions, consumed = worlds[1:], positions[1:], consumed[1:]
        full = _full_epoch(make, worlds[0])
    _check_cover(full, consumed, worlds, drop_last)
    # O(1) state: however many changes, it records the first world and one offset.
    assert set(final.get("elastic", {})) <= {"origin_num_replicas", "offset"}


def test_distributed_same_world_resume_has_no_elastic_entry():
    make = _dist(1000, False)
    _, state = _run(make, [4, 4], [10, 5])
    assert "elastic" not in state and state["position"] == 15


def test_distributed_elastic_state_round_trips_and_pickles():
    make = _dist(5000, False)
    _, state = _run(make, [8, 6], [100, 17])
    assert state["elastic"] == {"origin_num_replicas": 8, "offset": 800}
    s = make(6, 2)
    s.load_state_dict(state)
    assert s.state_dict() == {**state, "rank": 2}
    t = pickle.loads(pickle.dumps(s))
    assert list(t) == list(s) and len(t) == len(s)
    # The next epoch is a whole epoch on the new world again.
    s.set_epoch(4)
    assert len(s) == len(make(6, 2)) and "elastic" not in s.state_dict()


def test_distributed_end_of_epoch_state_on_another_world_is_done():
    make = _dist(1000, False)
    _, state = _run(make, [8, 6], [100, None])
    s = make(3, 1)
    s.load_state_dict(state)
    assert list(s) == []


@pytest.mark.parametrize(
    "elastic,message",
    [
        ({"origin_num_replicas": 8}, "must be a mapping with keys"),
        ({"origin_num_replicas": 0, "offset": 5}, "origin_num_replicas'] must be in [1,"),
        ({"origin_num_replicas": 8, "offset": 1001}, "offset'] must be in [0, 1000]"),
        ({"origin_num_replicas": 8, "offset": -1}, "offset'] must be in [0, 1000]"),
        ("8", "must be a mapping"),
    ],
)
def test_bad_elastic_entries_are_refused(elastic, message):
    make = _dist(1000, False)
    _, state = _run(make, [8, 6], [10, 5])
    s = make(6, 0)
    s.set_epoch(3)
    s.set_skip(2)
    before = s.state_dict()
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        s.load_state_dict({**state, "elastic": elastic})
    assert s.state_dict() == before


def test_a_position_past_the_rest_is_refused():
    make = _dist(1000, False)
    _, state = _run(make, [8, 6], [10, 5])
    s = make(6, 0)
    rest = len(make(6, 0)) - 0  # per rank: ceil((1000 - 80) / 6) = 154
    with pytest.raises(StateError, match="for the rest of the epoch"):
        s.load_state_dict({**state, "position": rest + 100})


# -- BucketBatchSampler ---------------------------------------------------------------------------


def _buckets(lengths, drop_last):
    def make(w, r):
        return BucketBatchSampler(
            lengths,
            max_tokens=2048,
            buckets=8,
            num_replicas=w,
            rank=r,
            seed=5,
            drop_last=drop_last,
        )

    return make


@pytest.mark.parametrize("w0,w1", [(4, 3), (3, 4), (1, 3), (3, 1), (2, 7)])
@pytest.mark.parametrize("drop_last", [False, True])
def test_buckets_resume_on_another_world_with_equal_batch_counts(w0, w1, drop_last):
    rng = np.random.default_rng(1)
    lengths = np.minimum(rng.lognormal(4, 1, 3001).astype(np.int64) + 1, 2048)
    make = _buckets(lengths, drop_last)
    full = [tuple(b) for b in _full_epoch(make, w0)]
    for pos in _positions(len(make(w0, 0)))[1:]:
        consumed, _ = _run(make, [w0, w1], [pos, None], key=tuple)
        assert len({len(r) for r in consumed[1]}) == 1, "unequal batch counts"
        _check_cover(full, consumed, [w0, w1], drop_last)
        # Every sample still comes at most once outside padding batches.
        samples = Counter(i for world in consumed for r in world for b in r for i in b)
        assert all(c == 1 for c in samples.values()) or not drop_last


def test_buckets_two_changes_in_one_epoch():
    lengths = (np.arange(5000) * 7919) % 900 + 1
    make = _buckets(lengths, False)
    full = [tuple(b) for b in _full_epoch(make, 5)]
    consumed, state = _run(make, [5, 2, 3], [7, 11, None], key=tuple)
    _check_cover(full, consumed, [5, 2, 3], False)
    assert state["elastic"]["origin_num_replicas"] == 5


# -- MixtureSampler -------------------------------------------------------------------------------


def _mixture(drop_last, num_samples=None):
    sizes = [0, 700, 750, 3750, 3761]
    weights = [1.0, 3.0, 2.0, 0.5]

    def make(w, r):
        return MixtureSampler(
            sizes,
            weights,
            num_replicas=w,
            rank=r,
            seed=4,
            drop_last=drop_last,
            num_samples=num_samples,
        )

    return make


@pytest.mark.parametrize("w0,w1", [(4, 3), (3, 4), (1, 3), (3, 1)])
@pytest.mark.parametrize("drop_last", [False, True])
def test_mixture_resumes_on_another_world(w0, w1, drop_last):
    make = _mixture(drop_last, num_samples=900)
    full = Counter(_full_epoch(make, w0))
    length = len(make(w0, 0))
    for pos in _positions(length)[1:]:
        consumed, _ = _run(make, [w0, w1], [pos, None])
        got = Counter(x for world in consumed for r in world for x in r)
        total_new = sum(len(r) for r in consumed[1])
        rest = w0 * (length - pos)
        assert total_new == (rest // w1 * w1 if drop_last else -(-rest // w1) * w1)
        # Exact: the multiset of the uninterrupted epoch (so every dataset's count and every
        # pass as it would have been), less (drop_last) fewer than W' items of the
        # remainder's tail, plus (padding) fewer than W' repeats of its head.
        missing = full - got
        extra = got - full
        assert sum(missing.values()) == (rest % w1 if drop_last else 0)
        assert sum(extra.values()) == (0 if drop_last else total_new - rest)


def test_mixture_two_changes_in_one_epoch():
    make = _mixture(False, num_samples=1000)
    full = Counter(_full_epoch(make, 4))
    consumed, state = _run(make, [4, 2, 5], [100, 300, None])
    got = Counter(x for world in consumed for r in world for x in r)
    assert not (full - got)
    assert sum((got - full).values()) < 2 + 5
    assert state["elastic"] == {"origin_num_replicas": 4, "offset": 4 * 100 + 2 * 300}


def test_mixture_with_a_schedule_keeps_the_epochs_phases():
    sizes = [0, 700, 750, 3750, 3761]

    def make(w, r):
        s = MixtureSampler(sizes, [1.0, 1.0, 1.0, 1.0], num_replicas=w, rank=r, seed=2)
        s.set_schedule([(0, [1.0, 3.0, 2.0, 0.5]), (len(s) // 3, [0.0, 1.0, 0.0, 5.0])])
        return s

    full = Counter(_full_epoch(make, 4))
    consumed, state = _run(make, [4, 3], [len(make(4, 0)) // 2, None])
    got = Counter(x for world in consumed for r in world for x in r)
    rest = 4 * (len(make(4, 0)) - len(make(4, 0)) // 2)
    # MixtureSampler drops by default (kempnerforge's drop_last=True): the rest's tail.
    assert sum((full - got).values()) == rest % 3 and not (got - full)
    # The state of the rest names the first world's phases; a reload gives it back.
    s = make(3, 1)
    s.load_state_dict(state)
    assert s.state_dict() == {**state, "rank": 1}
    assert len(state["phases"]) == 2 and state["phases"][1][0] == len(make(4, 0)) // 3


def test_mixture_elastic_state_pickles_and_next_epoch_is_whole():
    make = _mixture(True)
    _, state = _run(make, [4, 3], [50, 10])
    s = make(3, 0)
    s.load_state_dict(state)
    t = pickle.loads(pickle.dumps(s))
    assert np.array_equal(t.indices(), s.indices())
    s.set_epoch(4)
    assert len(s) == len(make(3, 0)) and "elastic" not in s.state_dict()
