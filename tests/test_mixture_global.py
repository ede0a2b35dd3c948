"""MixtureSampler in the global order (the default): one sequence per epoch whatever the number
of ranks, exact counts over it, whole passes, the balanced interleave, resume, elastic resume,
schedules in global positions, old states and bad input. The per-rank order is tested in
``test_mixture_sampler.py``."""

from __future__ import annotations

import textwrap
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from croupier import MixtureSampler, StateError
from test_mixture_sampler import _cum, _largest_remainder, _outputs_per_thread_count, _which

WORLDS = (1, 2, 3, 4, 7, 8, 16, 1000)


def _interleaved(make, w):
    """The ranks' sequences position by position: ``g[k W + r] = share_r[k]``."""
    shares = [make(w, r).indices() for r in range(w)]
    per = len(shares[0])
    assert all(len(s) == per for s in shares)
    out = np.empty(per * w, dtype=np.int64)
    for r, share in enumerate(shares):
        out[r::w] = share
    return out


def _check_world_invariance(make, total, drop_last):
    one = _interleaved(make, 1)
    assert len(one) == total
    for w in WORLDS[1:]:
        g = _interleaved(make, w)
        kept = total // w * w if drop_last else total
        assert len(g) == (kept if drop_last else -(-total // w) * w)
        np.testing.assert_array_equal(g[:kept], one[:kept], err_msg=f"W={w}")
        # torch's padding repeats the head of the sequence (as often as it takes).
        np.testing.assert_array_equal(g[kept:], np.resize(one, len(g) - kept), err_msg=f"W={w}")


# -- the property --------------------------------------------------------------------------------


@settings(max_examples=30, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 300), min_size=1, max_size=5).filter(lambda s: sum(s) > 0),
    raw=st.lists(st.integers(0, 5), min_size=5, max_size=5),
    seed=st.integers(0, 2**64 - 1),
    epoch=st.integers(0, 5),
    drop_last=st.booleans(),
    shuffle=st.booleans(),
    interleave=st.sampled_from(["uniform", "balanced"]),
    cut=st.floats(0.05, 0.95),
)
def test_the_global_sequence_is_the_same_for_every_world_size(
    sizes, raw, seed, epoch, drop_last, shuffle, interleave, cut
):
    weights = [float(w) if n else 0.0 for w, n in zip(raw, sizes, strict=False)]
    if not any(weights):
        weights[next(i for i, n in enumerate(sizes) if n)] = 1.0
    total = sum(sizes)
    # A second phase from a global position, with other weights (reversed, where drawable).
    second = [w if n else 0.0 for w, n in zip(reversed(weights), sizes, strict=False)]
    schedule = [(0, weights)]
    if any(second) and 0 < int(total * cut) < total:
        schedule.append((int(total * cut), second))

    def make(w, r):
        s = MixtureSampler(
            _cum(sizes), weights, w, r, shuffle=shuffle, seed=seed, drop_last=drop_last,
            interleave=interleave,
        )  # fmt: skip
        s.set_schedule(schedule)
        s.set_epoch(epoch)
        return s

    _check_world_invariance(make, total, drop_last)


def test_the_property_holds_over_many_leaves_and_both_interleaves():
    # 2.5e6 positions: three leaves of the uniform interleave and 39 of the balanced one.
    sizes = [1_500_000, 700_001, 300_000, 17]
    for interleave in ("uniform", "balanced"):

        def make(w, r, interleave=interleave):
            return MixtureSampler(_cum(sizes), [1, 2, 3, 4], w, r, seed=3, interleave=interleave)

        one = _interleaved(make, 1)
        for w in (3, 16):
            g = _interleaved(make, w)
            np.testing.assert_array_equal(g, one[: len(g)])


# -- counts and passes -----------------------------------------------------------------------------


KINDS = [("uniform", True), ("balanced", True), ("uniform", False), ("balanced", False)]


@pytest.mark.parametrize(("interleave", "shuffle"), KINDS)
def test_counts_are_exact_over_the_global_sequence(interleave, shuffle):
    sizes, weights = [5000, 20, 3000, 1], [3, 1, 1, 0.5]
    cum = _cum(sizes)
    total = sum(sizes)
    s = MixtureSampler(cum, weights, 1, 0, shuffle=shuffle, seed=4, interleave=interleave)
    seq = s.indices()
    assert len(seq) == total
    assert s.counts() == _largest_remainder(weights, total)
    assert np.bincount(_which(cum, seq), minlength=4).tolist() == _largest_remainder(weights, total)
    # A second phase from global position 3000 holds its own exact counts.
    s.set_schedule([(0, weights), (3000, [1, 0, 2, 0])])
    seq = s.indices()
    assert np.bincount(_which(cum, seq[3000:]), minlength=4).tolist() == _largest_remainder(
        [1, 0, 2, 0], total - 3000
    )


@pytest.mark.parametrize("interleave", ["uniform", "balanced"])
def test_the_first_phase_cut_short_holds_its_prefix(interleave):
    # The first phase's counts are rounded over the whole epoch; a later phase cuts it, and
    # its prefix holds what the interleave put there: the two parts still add up exactly.
    sizes, weights = [5000, 8000], [1, 1]
    cum = _cum(sizes)
    s = MixtureSampler(cum, weights, 1, 0, seed=4, interleave=interleave)
    s.set_schedule([(0, weights), (3000, [1, 1])])
    seq = s.indices()
    first = np.bincount(_which(cum, seq[:3000]), minlength=2)
    assert first.sum() == 3000 and all(abs(c - 1500) < 200 for c in first)
    if interleave == "balanced":
        assert first.tolist() == [1500, 1500]  # every prefix within one of its share
    # No sample of dataset 1 drawn twice (it has 8,000 for about 6,500 draws): its stream
    # goes on across the cut, nothing read twice.
    ones = seq[_which(cum, seq) == 1]
    assert len(np.unique(ones)) == len(ones) == first[1] + 5000


@pytest.mark.parametrize("interleave", ["uniform", "balanced"])
def test_every_sample_is_drawn_as_its_passes_say(interleave):
    sizes, weights = [100, 7, 3000, 1], [5, 5, 1, 1]  # datasets 0, 1, 3 over many passes
    cum = _cum(sizes)
    s = MixtureSampler(cum, weights, 4, 2, seed=9, interleave=interleave, drop_last=False)
    seq = _interleaved(
        lambda w, r: MixtureSampler(cum, weights, w, r, seed=9, interleave=interleave), 1
    )
    assert len(s) == -(-len(seq) // 4)
    which = _which(cum, seq)
    for d, n in enumerate(sizes):
        mine = seq[which == d]
        c = len(mine)
        times = np.bincount(mine - cum[d], minlength=n)
        # Whole passes, then part of one: every sample c // n or c // n + 1 times.
        assert set(times.tolist()) <= {c // n, c // n + 1}
        assert int((times > c // n).sum()) == c % n
        # Occurrences in time order: each whole pass, in turn, a permutation (so no sample
        # comes twice within a pass, even for a dataset drawn many times over in one leaf).
        for k in range(c // n):
            assert sorted(mine[k * n : (k + 1) * n].tolist()) == list(range(cum[d], cum[d] + n))


@settings(max_examples=30, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 2000), min_size=2, max_size=6),
    raw=st.lists(st.integers(0, 50), min_size=6, max_size=6),
    w=st.sampled_from([1, 3, 8]),
)
def test_balanced_prefixes_stay_within_one_sample_of_their_share(sizes, raw, w):
    weights = [float(x) for x in raw[: len(sizes)]]
    if not any(weights):
        weights[0] = 1.0
    cum = _cum(sizes)
    seq = _interleaved(
        lambda w, r: MixtureSampler(cum, weights, w, r, seed=1, interleave="balanced"), w
    )
    total = sum(sizes)
    counts = _largest_remainder(weights, total)
    seen = np.zeros(len(sizes), dtype=np.int64)
    which = _which(cum, seq[: total // w * w])
    for t, d in enumerate(which.tolist(), start=1):
        seen[d] += 1
        for e, c in enumerate(counts):
            assert abs(seen[e] - Fraction(c * t, total)) < 1, (e, t)


def test_a_dataset_smaller_than_the_world_is_drawn():
    # The per-rank order deals it nothing per pass with drop_last; the global order draws it.
    cum = _cum([1000, 3])
    s = MixtureSampler(cum, [1, 1], 8, 0, seed=1)
    seq = _interleaved(lambda w, r: MixtureSampler(cum, [1, 1], w, r, seed=1), 8)
    assert (np.bincount(_which(cum, seq), minlength=2) > 0).all()
    assert len(s) == 1003 // 8
    with pytest.raises(ValueError, match="dataset 1"):
        MixtureSampler(cum, [1, 1], 8, 0, seed=1, order="per_rank")


def test_lengths_follow_torch_over_the_global_sequence():
    cum = _cum([10, 7])
    for drop_last in (True, False):
        s = MixtureSampler(cum, [1, 1], 4, 1, drop_last=drop_last)
        assert len(s) == s.num_samples == (17 // 4 if drop_last else -(-17 // 4))
        assert s.total_size == 4 * len(s)
    fixed = MixtureSampler(cum, [1, 1], 4, 1, num_samples=30)
    assert len(fixed) == 30  # num_samples per rank: a global sequence of 120
    one = MixtureSampler(cum, [1, 1], 1, 0, num_samples=120).indices()
    np.testing.assert_array_equal(_interleaved(
        lambda w, r: MixtureSampler(cum, [1, 1], w, r, num_samples=30), 4), one)  # fmt: skip


# -- iteration, resume, elastic ----------------------------------------------------------------


@pytest.mark.parametrize("interleave", ["uniform", "balanced"])
def test_iteration_streams_what_indices_says_and_resumes_at_every_position(interleave):
    cum = _cum([300, 41, 2])
    s = MixtureSampler(cum, [1, 2, 1], 2, 1, seed=11, interleave=interleave)
    full = s.indices().tolist()
    assert list(s) == full
    for pos in range(len(full) + 1):
        t = MixtureSampler(cum, [1, 2, 1], 2, 1, seed=11, interleave=interleave)
        t.load_state_dict({**s.state_dict(), "position": pos})
        assert list(t) == full[pos:]


def test_resume_at_random_positions_of_a_large_epoch():
    cum = _cum([3_000_000, 1_000_000, 0, 2_100_000])
    s = MixtureSampler(cum, [3, 1, 0, 2], 4, 2, seed=5, drop_last=False)
    full = s.indices()
    rng = np.random.default_rng(0)
    for pos in rng.integers(0, len(full), 6).tolist():
        t = MixtureSampler(cum, [3, 1, 0, 2], 4, 2, seed=5, drop_last=False)
        t.load_state_dict({**s.state_dict(), "position": pos})
        np.testing.assert_array_equal(t.indices(), full[pos:])
        assert next(iter(t)) == full[pos]


@pytest.mark.parametrize(("w_from", "w_to"), [(4, 3), (4, 1), (2, 8), (3, 3)])
@pytest.mark.parametrize("interleave", ["uniform", "balanced"])
def test_an_elastic_resume_continues_the_global_sequence(w_from, w_to, interleave):
    cum = _cum([4000, 999, 1234])
    weights = [1, 2, 3]

    def make(w, r):
        return MixtureSampler(cum, weights, w, r, seed=2, interleave=interleave, drop_last=False)

    whole = _interleaved(make, 1)
    consumed = 333  # positions per old rank
    state = {**make(w_from, 0).state_dict(), "position": consumed}
    rest = []
    for r in range(w_to):
        s = make(w_to, r)
        s.load_state_dict(state)
        rest.append(s.indices())
    offset = consumed * w_from
    per = len(rest[0])
    got = np.empty(per * w_to, dtype=np.int64)
    for r, share in enumerate(rest):
        got[r::w_to] = share
    left = len(whole) - offset
    assert per == -(-left // w_to)
    np.testing.assert_array_equal(got[:left], whole[offset:])
    # Padding repeats the head of the rest (of the epoch, when the world did not change).
    head = whole if w_from == w_to else whole[offset:]
    np.testing.assert_array_equal(got[left:], np.resize(head, len(got) - left))


# -- schedules -----------------------------------------------------------------------------------


def test_schedule_starts_are_global_positions():
    cum = _cum([6000, 6000])
    schedule = [(0, [1, 0]), (3000, [0, 1])]

    def make(w, r):
        s = MixtureSampler(cum, [1, 1], w, r, seed=3)
        s.set_schedule(schedule)
        return s

    for w in (1, 3):
        seq = _interleaved(make, w)
        # Dataset 0 alone before global position 3000, dataset 1 alone from it, on every world.
        assert (_which(cum, seq[:3000]) == 0).all() and (_which(cum, seq[3000:]) == 1).all()
    with pytest.raises(ValueError, match="schedule"):
        make(4, 0).set_schedule([(0, [1, 1]), (12_000, [1, 0])])  # past the global sequence


def test_a_mid_epoch_change_applies_from_the_same_global_position_on_every_rank():
    cum = _cum([5000, 5000, 5000])

    def resumed(w, r, at):
        s = MixtureSampler(cum, [1, 1, 0], w, r, seed=8)
        s.load_state_dict({**s.state_dict(), "position": at})
        s.update_weights([0, 0, 1])  # applies from the resume position
        return s

    # Two ranks resumed at their position 1000 (global 2000), and one rank at 2000: the same
    # global sequence from 2000 on, all of it dataset 2's.
    two = [resumed(2, r, 1000).indices() for r in range(2)]
    g = np.empty(2 * len(two[0]), dtype=np.int64)
    g[0::2], g[1::2] = two
    one = resumed(1, 0, 2000).indices()
    np.testing.assert_array_equal(g, one)
    assert (_which(cum, one) == 2).all()


# -- states, determinism, bad input -------------------------------------------------------------


def test_a_state_of_the_fast_order_says_how_to_resume_it():
    cum = _cum([300, 200])
    old = MixtureSampler(cum, [1, 2], 2, 1, seed=1, order="per_rank").state_dict()
    # States saved before the mixture had orders record none: they are of the per-rank order.
    older = {k: v for k, v in old.items() if k not in ("order", "interleave")}
    for state in (old, older):
        fast = MixtureSampler(cum, [1, 2], 2, 1, seed=1, order="per_rank")
        fast.load_state_dict({**state, "position": 3})
        assert (
            next(iter(fast))
            == MixtureSampler(cum, [1, 2], 2, 1, seed=1, order="per_rank").indices()[3]
        )
        target = MixtureSampler(cum, [1, 2], 2, 1, seed=1)
        before = target.state_dict()
        with pytest.raises(StateError, match="order='per_rank'") as info:
            target.load_state_dict(state)
        assert any(d.startswith("order:") for d in info.value.differences)
        assert target.state_dict() == before
    with pytest.raises(StateError, match="interleave"):
        MixtureSampler(cum, [1, 2], 2, 1, seed=1, interleave="balanced").load_state_dict(
            MixtureSampler(cum, [1, 2], 2, 1, seed=1).state_dict()
        )


def test_same_indices_for_any_thread_count():
    code = textwrap.dedent(
        """
        import hashlib, croupier
        for il in ("uniform", "balanced"):
            s = croupier.MixtureSampler([0, 3_000_000, 7_000_000, 7_000_100], [1, 2, 1], 3, 2,
                                        seed=9, interleave=il)
            print(hashlib.sha256(s.indices().tobytes()).hexdigest())
        """
    )
    assert len(_outputs_per_thread_count(code)) == 1


def test_value_stability_pins():
    # Deliberate pins: a change of these is a change of order (a breaking change).
    cum = [0, 1000, 3000, 3500]
    s = MixtureSampler(cum, [1.0, 2.0, 0.5], 2, 1, seed=7)
    assert s.indices()[:8].tolist() == PIN_UNIFORM
    b = MixtureSampler(cum, [1.0, 2.0, 0.5], 2, 1, seed=7, interleave="balanced")
    assert b.indices()[:8].tolist() == PIN_BALANCED
    big = MixtureSampler([0, 10**6, 3 * 10**6], [1, 1], 4, 3, seed=2)
    assert big.indices()[400_000:400_006].tolist() == PIN_SECOND_LEAF


PIN_UNIFORM = [18, 2783, 1624, 2649, 1987, 1900, 2278, 3470]
PIN_BALANCED = [404, 2058, 1402, 1534, 1588, 546, 3127, 736]
PIN_SECOND_LEAF = [334033, 948978, 678445, 449857, 741361, 738036]


def test_bad_order_and_interleave_are_refused():
    cum = _cum([10, 10])
    with pytest.raises(TypeError, match="order must be a str"):
        MixtureSampler(cum, [1, 1], 1, 0, order=1)
    with pytest.raises(ValueError, match=r"order must be one of \['global', 'per_rank'\]"):
        MixtureSampler(cum, [1, 1], 1, 0, order="torch")
    with pytest.raises(ValueError, match="interleave must be one of"):
        MixtureSampler(cum, [1, 1], 1, 0, interleave="random")
    with pytest.raises(ValueError, match="interleave='balanced' needs order='global'"):
        MixtureSampler(cum, [1, 1], 1, 0, order="per_rank", interleave="balanced")
