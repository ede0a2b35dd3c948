"""MixtureSampler in the per-rank order (``order="per_rank"``, kempnerforge's shapes): exact
counts on every rank, passes, interleave, schedules, resume, state and bad input. The global order,
the default of ``croupier.MixtureSampler``, is tested in ``test_mixture_global.py``."""

from __future__ import annotations

import functools
import itertools
import json
import math
import os
import pickle
import subprocess
import sys
import textwrap
from collections import Counter
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import croupier
from croupier import StateError
from test_robustness import _in_child

# The per-rank order, kempnerforge's shapes (the default of croupier.compat.kempnerforge's class,
# which needs torch): every sampler of this file.
MixtureSampler = functools.partial(croupier.MixtureSampler, order="per_rank")


def _cum(sizes):
    return [0, *np.cumsum(sizes).tolist()]


def _which(cum, idx):
    """Dataset of each global index."""
    return np.searchsorted(np.asarray(cum[1:]), np.asarray(idx, dtype=np.int64), side="right")


def _largest_remainder(weights, length):
    """Hamilton's method on exact rationals: the independent reference for temperature 1."""
    total = sum(Fraction(w) for w in weights)
    quotas = [Fraction(w) / total * length for w in weights]
    counts = [math.floor(q) for q in quotas]
    left = length - sum(counts)
    order = sorted(range(len(weights)), key=lambda i: (-(quotas[i] - counts[i]), i))
    for i in order[:left]:
        counts[i] += 1
    return counts


def _shares(sizes, w, drop_last):
    return [s // w if drop_last else -(-s // w) for s in sizes]


# -- counts --------------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 400), min_size=1, max_size=6),
    raw=st.lists(st.integers(0, 9), min_size=6, max_size=6),
    w=st.integers(1, 5),
    drop_last=st.booleans(),
    num_samples=st.one_of(st.none(), st.integers(0, 700)),
    seed=st.integers(0, 2**64 - 1),
)
def test_exact_counts_on_every_rank(sizes, raw, w, drop_last, num_samples, seed):
    shares = _shares(sizes, w, drop_last)
    weights = [float(x) if shares[i] > 0 else 0.0 for i, x in enumerate(raw[: len(sizes)])]
    if not any(weights):
        return
    cum = _cum(sizes)
    length = sum(shares) if num_samples is None else num_samples
    want = _largest_remainder([int(x) for x in weights], length)
    for r in range(w):
        s = MixtureSampler(
            cum, weights, w, r, seed=seed, drop_last=drop_last, num_samples=num_samples
        )
        assert len(s) == length
        idx = s.indices()
        assert len(idx) == length
        got = np.bincount(_which(cum, idx), minlength=len(sizes)).tolist()
        assert got == want
        assert s.counts() == want


@pytest.mark.parametrize("temperature", [0.3, 0.5, 2.0, 7.5])
def test_counts_within_one_of_the_tempered_quota(temperature):
    sizes = [1000, 3000, 50, 7000, 1]
    weights = [0.1, 2.0, 5.0, 0.7, 0.0]
    s = MixtureSampler(_cum(sizes), weights, 1, 0, temperature=temperature, num_samples=9_999)
    p = np.asarray(weights) ** (1 / temperature)
    quota = p / p.sum() * len(s)
    counts = np.bincount(_which(_cum(sizes), s.indices()), minlength=5)
    assert counts.sum() == len(s)
    assert np.all(np.abs(counts - quota) < 1)
    assert counts[4] == 0


def _tempered_counts(weights, temperature, length):
    """The documented counts from their definition, independently of the sampler: ``p_i =
    w_i ** (1/T) / sum_j w_j ** (1/T)`` in numpy float64, ``floor(p_i * length)`` plus one for
    the largest remainders, ties to the lower index. Checks that the answer does not hang on
    the last bits of ``p`` (which another evaluation order may change): every quota is more
    than 1e-9 from an integer, and remainders on the two sides of the cut differ by more than
    1e-9 unless their weights are equal (bit-identical quotas in any evaluation)."""
    w = np.asarray(weights, dtype=np.float64)
    scaled = np.where(w > 0, w ** (1.0 / temperature), 0.0)
    quota = scaled / scaled.sum() * length
    counts = np.floor(quota).astype(np.int64)
    rem = quota - counts
    positive = [i for i in range(len(w)) if w[i] > 0]
    order = sorted(positive, key=lambda i: (-rem[i], i))
    left = length - int(counts.sum())
    given, kept = order[:left], order[left:]
    counts[given] += 1
    assert all(1e-9 < rem[i] < 1 - 1e-9 for i in positive)
    assert all(rem[a] - rem[b] > 1e-9 for a in given for b in kept if w[a] != w[b])
    return counts.tolist()


@pytest.mark.parametrize(
    ("weights", "temperature", "length"),
    [
        ([0.1, 2.0, 5.0, 0.7, 0.0], 0.5, 9_999),
        ([0.1, 2.0, 5.0, 0.7, 0.0], 0.25, 9_999),
        ([0.1, 2.0, 5.0, 0.7, 0.0], 2.0, 9_999),
        ([0.1, 2.0, 5.0, 0.7, 0.0], 7.5, 9_999),
        ([1, 2, 3, 4, 5, 6, 7], 0.3, 1234),
        ([1, 2, 3, 4, 5, 6, 7], 1 / 3, 1234),
        ([9, 1], 100.0, 777),
        ([3, 3, 1], 2.0, 50),  # the equal weights tie at the cut
        ([5, 2, 5, 0, 1], 3.0, 62),  # the same, not adjacent
    ],
)
def test_tempered_counts_are_exact_integers(weights, temperature, length):
    want = _tempered_counts(weights, temperature, length)
    assert sum(want) == length
    if (1 / temperature).is_integer():  # p_i is rational: Hamilton's method on exact fractions
        k = int(1 / temperature)
        assert want == _largest_remainder([Fraction(w) ** k for w in weights], length)
    for a, b in itertools.combinations(range(len(weights)), 2):
        if weights[a] == weights[b] > 0:  # a tie goes to the lower index, as documented
            assert want[a] - want[b] in (0, 1)
    cum, w = _cum([3000] * len(weights)), 3
    for r in range(w):
        s = MixtureSampler(cum, weights, w, r, seed=r, temperature=temperature, num_samples=length)
        assert s.counts() == want
        got = np.bincount(_which(cum, s.indices()), minlength=len(weights)).tolist()
        assert got == want


def test_tempered_ties_reach_the_cut():
    # The two tie cases above do split their equal weights (so the rule is exercised).
    counts = _tempered_counts([3, 3, 1], 2.0, 50)
    assert counts[0] == counts[1] + 1
    counts = _tempered_counts([5, 2, 5, 0, 1], 3.0, 62)
    assert counts[0] == counts[2] + 1


def test_higher_temperature_flattens():
    cum = _cum([10_000, 10_000, 10_000])
    heavy = [
        MixtureSampler(cum, [1, 3, 9], 1, 0, temperature=t).counts()[2] for t in (0.5, 1, 2, 4, 100)
    ]
    assert heavy == sorted(heavy, reverse=True) and heavy[0] > heavy[-1]
    assert abs(heavy[-1] - 10_000) < 200  # nearly uniform


def test_default_length_is_kempnerforges():
    sizes = [10, 7, 3, 100]
    for drop_last in (True, False):
        s = MixtureSampler(_cum(sizes), [0, 1, 0, 1], 4, 1, drop_last=drop_last)
        assert len(s) == sum(_shares(sizes, 4, drop_last))


# -- passes and ranks ---------------------------------------------------------------------------


@pytest.mark.parametrize("drop_last", [True, False])
@pytest.mark.parametrize("shuffle", [True, False])
def test_passes_disjoint_across_ranks_and_never_repeat(drop_last, shuffle):
    sizes = [997, 60, 4000, 13]
    weights = [1.0, 6.0, 1.0, 0.5]  # dataset 1 heavily oversampled, 2 undersampled
    cum, w = _cum(sizes), 3
    shares = _shares(sizes, w, drop_last)
    first_pass = [[] for _ in sizes]
    for r in range(w):
        s = MixtureSampler(cum, weights, w, r, shuffle=shuffle, drop_last=drop_last, seed=5)
        idx = s.indices().astype(np.int64)
        ds = _which(cum, idx)
        for d in range(len(sizes)):
            mine = idx[ds == d]
            assert np.all((mine >= cum[d]) & (mine < cum[d + 1]))
            passes = [mine[i : i + shares[d]] for i in range(0, len(mine), shares[d])]
            for k, p in enumerate(passes):
                assert len(set(p.tolist())) == len(p), f"rank {r} dataset {d} pass {k} repeats"
            if len(passes) > 1:  # a new pass starts only when the previous is used up
                assert all(len(p) == shares[d] for p in passes[:-1])
            first_pass[d].extend(passes[0].tolist())
    for d in range(len(sizes)):
        if drop_last:
            assert len(set(first_pass[d])) == len(first_pass[d]), f"ranks overlap in {d}"
        else:  # torch's head padding: at most W - 1 repeats, of the pass's head
            assert len(first_pass[d]) - len(set(first_pass[d])) < w


def test_undersampled_dataset_never_repeats_in_the_epoch():
    cum = _cum([50_000, 50_000])
    s = MixtureSampler(cum, [1, 9], 2, 0, seed=1)
    idx = s.indices().astype(np.int64)
    light = idx[idx < 50_000]
    assert len(np.unique(light)) == len(light) == s.counts()[0]


def test_unshuffled_order_is_kempnerforges():
    # kempnerforge without shuffle: each dataset's strided share, wrapped, datasets in order.
    sizes, weights, w, r = [10, 25, 7], [1, 1, 2], 2, 1
    s = MixtureSampler(_cum(sizes), weights, w, r, shuffle=False)
    counts = s.counts()
    want = []
    for d, n in enumerate(sizes):
        share = list(range(n))[: n - n % w][r::w]
        want += [_cum(sizes)[d] + share[i % len(share)] for i in range(counts[d])]
    assert list(s) == want


# -- interleave and determinism ------------------------------------------------------------------


def test_interleave_is_uniform_over_arrangements():
    # Two datasets, 3 + 3 positions: 20 arrangements, equally likely under a uniform
    # multiset permutation; chi-square over 4000 seeds.
    cum = _cum([3, 3])
    freq: dict[tuple[int, ...], int] = {}
    for seed in range(4000):
        idx = MixtureSampler(cum, [1, 1], 1, 0, seed=seed).indices()
        key = tuple(_which(cum, idx).tolist())
        freq[key] = freq.get(key, 0) + 1
    assert len(freq) == 20
    expected = 4000 / 20
    chi2 = sum((f - expected) ** 2 / expected for f in freq.values())
    assert chi2 < 50.0  # df 19: p < 1e-4 above this


def test_interleave_is_uniform_across_leaves():
    # Beyond one leaf (2**16 positions) the counts per leaf come from hypergeometric splits:
    # a rare dataset's positions fall in each leaf in proportion to its size.
    sizes = [2_000, 400_000]
    cum = _cum(sizes)
    length = 3 * 65_536 + 5_000
    bins = np.zeros(4)
    for seed in range(60):
        idx = MixtureSampler(cum, [1, 99], 1, 0, seed=seed, num_samples=length).indices()
        where = np.flatnonzero(idx < 2_000)
        bins += np.bincount(where // 65_536, minlength=4)
    leaf_len = np.array([65_536, 65_536, 65_536, 5_000])
    expected = bins.sum() * leaf_len / length
    chi2 = float(((bins - expected) ** 2 / expected).sum())
    assert chi2 < 21.0  # df 3: p < 1e-4 above this


def test_determinism_per_seed_and_epoch():
    cum = _cum([5_000, 3_000, 2_000])
    a = MixtureSampler(cum, [1, 2, 3], 2, 1, seed=3)
    b = MixtureSampler(cum, [1, 2, 3], 2, 1, seed=3)
    assert np.array_equal(a.indices(), b.indices())
    b.set_epoch(1)
    assert not np.array_equal(a.indices(), b.indices())
    c = MixtureSampler(cum, [1, 2, 3], 2, 1, seed=4)
    assert not np.array_equal(a.indices(), c.indices())
    other_rank = MixtureSampler(cum, [1, 2, 3], 2, 0, seed=3).indices()
    assert not np.array_equal(_which(cum, a.indices()), _which(cum, other_rank))


def test_same_indices_for_any_thread_count():
    code = textwrap.dedent(
        """
        import hashlib, croupier
        s = croupier.MixtureSampler([0, 300_000, 700_000, 700_100], [1, 2, 1], 3, 2, seed=9,
                                    num_samples=900_000, order="per_rank")
        print(hashlib.sha256(s.indices().tobytes()).hexdigest())
        """
    )
    assert len(_outputs_per_thread_count(code)) == 1


def _outputs_per_thread_count(code: str) -> set[str]:
    """What ``code`` prints in a child with 1, 2 and 3 threads (one element when the output
    does not depend on the thread count)."""
    outputs = set()
    for threads in ("1", "2", "3"):
        env = {**os.environ, "RAYON_NUM_THREADS": threads}
        out = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        )
        outputs.add(out.stdout.strip())
    return outputs


def test_value_stability_pins():
    # Deliberate pins: a change of these is a change of order (a breaking change).
    s = MixtureSampler([0, 1000, 3000, 3500], [1.0, 2.0, 0.5], 2, 1, seed=7)
    assert s.indices()[:8].tolist() == PIN_SHUFFLED
    big = MixtureSampler([0, 10**6, 3 * 10**6], [1, 1], 4, 3, seed=2, num_samples=200_000)
    assert big.indices()[150_000:150_006].tolist() == PIN_SECOND_LEAVES


PIN_SHUFFLED = [1350, 1637, 686, 995, 940, 2163, 2204, 3279]
PIN_SECOND_LEAVES = [109558, 876967, 565898, 1525314, 784365, 1636888]


# -- resume ---------------------------------------------------------------------------------------


def test_resume_at_every_position_of_a_small_epoch():
    cum = _cum([40, 17, 90])
    s = MixtureSampler(cum, [1, 2, 1], 2, 1, seed=11)
    whole = list(s)
    assert len(whole) == len(s)
    for p in range(len(s) + 1):
        t = MixtureSampler(cum, [1, 2, 1], 2, 1, seed=11)
        t.set_skip(p)
        assert list(t) == whole[p:]
        u = MixtureSampler(cum, [1, 2, 1], 2, 1, seed=11)
        u.load_state_dict({**s.state_dict(), "position": p})
        assert u.indices().tolist() == whole[p:]


def test_resume_at_random_positions_of_a_large_epoch():
    cum = _cum([2_000_000, 500_000, 3, 1_000_000])
    s = MixtureSampler(cum, [3, 1, 0, 2], 4, 2, seed=5, drop_last=False)
    whole = s.indices()
    rng = np.random.default_rng(0)
    for p in [0, 1, 65_535, 65_536, len(s) - 1, *rng.integers(0, len(s), 12).tolist()]:
        t = MixtureSampler(cum, [3, 1, 0, 2], 4, 2, seed=5, drop_last=False)
        t.set_skip(p)
        it = iter(t)
        got = [next(it) for _ in range(min(100, len(s) - p))]
        assert got == whole[p : p + 100].tolist()


def test_state_mid_iteration_and_json_roundtrip():
    cum = _cum([3000, 2000])
    s = MixtureSampler(cum, [1, 1], 2, 0, seed=1)
    it = iter(s)
    head = [next(it) for _ in range(777)]
    state = json.loads(json.dumps(s.state_dict()))
    assert state["position"] == 777
    t = MixtureSampler(cum, [1, 1], 2, 0, seed=1)
    t.load_state_dict(state)
    assert t.state_dict() == state
    assert head + list(t) == MixtureSampler(cum, [1, 1], 2, 0, seed=1).indices().tolist()


def test_a_state_of_a_sampler_constructed_otherwise_keeps_its_schedule_and_warns():
    cum = _cum([300, 200])
    saved = MixtureSampler(cum, [1, 1], 1, 0, seed=1)
    it = iter(saved)
    head = [next(it) for _ in range(77)]
    state = json.loads(json.dumps(saved.state_dict()))
    assert state["constructed_with"] == [[1.0, 1.0], 1.0]
    whole = MixtureSampler(cum, [1, 1], 1, 0, seed=1).indices().tolist()

    t = MixtureSampler(cum, [0.7, 0.3], 1, 0, seed=1)
    with pytest.warns(
        UserWarning,
        match=r"constructed with weights \[1\.0, 1\.0\], this one is constructed with weights "
        r"\[0\.7, 0\.3\]\. The state's schedule is kept.*call update_weights\(\[0\.7, 0\.3\]\)",
    ) as w:
        t.load_state_dict(state)
    assert len(w) == 1 and w[0].filename == __file__  # the caller's line
    assert t.schedule == [(0, [1.0, 1.0], 1.0)]
    assert head + list(t) == whole  # the saved run, exactly
    # Its own states record its own construction: the next resume of this run is quiet.
    assert t.state_dict()["constructed_with"] == [[0.7, 0.3], 1.0]

    # Another temperature is another construction too.
    hot = MixtureSampler(cum, [1, 1], 1, 0, seed=1, temperature=2.0)
    with pytest.warns(
        UserWarning,
        match=r"this one is constructed with weights \[1\.0, 1\.0\], "
        r"temperature 2\.0.*update_weights\(\[1\.0, 1\.0\], temperature=2\.0\)",
    ):
        hot.load_state_dict(state)

    # Quiet (filterwarnings = error): the same construction, even after update_weights in the
    # saving run, whose schedule the state carries; and a state saved before the key existed.
    updated = MixtureSampler(cum, [1, 1], 1, 0, seed=1)
    updated.update_weights([0.9, 0.1])
    same = MixtureSampler(cum, [1, 1], 1, 0, seed=1)
    same.load_state_dict(updated.state_dict())
    assert same.schedule == [(0, [0.9, 0.1], 1.0)]
    older = {k: v for k, v in state.items() if k != "constructed_with"}
    MixtureSampler(cum, [0.7, 0.3], 1, 0, seed=1).load_state_dict(older)
    # The same mixture written otherwise (weights are relative), and a state whose schedule
    # already is this construction (the saving run moved to it with update_weights).
    MixtureSampler(cum, [0.5, 0.5], 1, 0, seed=1).load_state_dict(state)
    moved = MixtureSampler(cum, [1, 1], 1, 0, seed=1)
    moved.update_weights([0.7, 0.3])
    MixtureSampler(cum, [7, 3], 1, 0, seed=1).load_state_dict(moved.state_dict())

    # A malformed entry is refused, changing nothing; a refused state warns nothing.
    for bad in ([[1.0, 1.0]], [[1.0], 1.0], [[1.0, 1.0], 0.0], "x"):
        fresh = MixtureSampler(cum, [0.7, 0.3], 1, 0, seed=1)
        before = fresh.state_dict()
        with pytest.raises(StateError, match=r"state\['constructed_with'\]"):
            fresh.load_state_dict({**state, "constructed_with": bad})
        assert fresh.state_dict() == before
    with pytest.raises(StateError, match="seed"):
        MixtureSampler(cum, [0.7, 0.3], 1, 0, seed=2).load_state_dict(state)


def test_pickling_is_a_checkpoint():
    cum = _cum([3000, 2000])
    s = MixtureSampler(cum, [1, 2], 2, 1, seed=1)
    it = iter(s)
    [next(it) for _ in range(100)]
    c = pickle.loads(pickle.dumps(s))
    assert c.state_dict() == s.state_dict()
    assert list(c) == list(it)


@pytest.mark.parametrize("order", ["global", "per_rank"])
def test_a_sampler_pickled_before_its_positions_moved_into_the_core_unpickles(order):
    # Pickles of 0.2.0 builds before the core's MixtureShape carry no _shape: it is made again
    # from their configuration, and the copy yields what the original does.
    cum = _cum([3000, 2000, 7])
    s = MixtureSampler(cum, [1, 2, 1], 3, 2, seed=4, order=order, drop_last=True)
    s.set_epoch(2)
    s.set_skip(11)
    reduced = s.__reduce_ex__(2)
    old = dict(reduced[2])
    del old["_shape"]
    c = reduced[0](*reduced[1])
    c.__setstate__(old)
    assert len(c) == len(s) and c.state_dict() == s.state_dict()
    assert list(c) == list(s)


def test_state_of_another_configuration_is_refused_naming_each_difference():
    cum = _cum([3000, 2000])
    state = MixtureSampler(cum, [1, 2], 2, 1, seed=1).state_dict()
    with pytest.raises(StateError, match="seed") as e:
        MixtureSampler(_cum([3000, 2001]), [1, 2], 2, 1, seed=2).load_state_dict(state)
    assert "total_size" in str(e.value) and "sizes_digest" in str(e.value)
    # Mid-epoch on another number of ranks: an elastic resume (tests/test_elastic.py).
    mid = {**state, "position": 5}
    wider = MixtureSampler(cum, [1, 2], 4, 1, seed=1)
    wider.load_state_dict(mid)
    assert wider.state_dict()["elastic"] == {
        "origin_num_replicas": 2,
        "offset": 10,
        "resumed_at": 5,
    }
    target = MixtureSampler(cum, [1, 2], 2, 1, seed=1)
    before = target.state_dict()
    with pytest.raises((StateError, ValueError)):
        target.load_state_dict({**state, "phases": [[0, 10, [1.0], 1.0]]})
    assert target.state_dict() == before


def test_kempnerforge_state_loads_as_the_start_of_its_epoch():
    cum = _cum([3000, 2000])
    s = MixtureSampler(cum, [1, 2], 2, 1, seed=1)
    s.load_state_dict({"epoch": 3, "seed": 1, "num_replicas": 2, "rank": 1})
    assert s.epoch == 3 and s.state_dict()["position"] == 0
    with pytest.raises(StateError, match="seed"):
        s.load_state_dict({"epoch": 3, "seed": 2, "num_replicas": 2, "rank": 1})


@pytest.mark.parametrize(("w_from", "w_to"), [(4, 2), (2, 4), (4, 3), (1, 8)])
@pytest.mark.parametrize("finished", [False, True])
def test_epoch_boundary_states_load_on_another_number_of_ranks(w_from, w_to, finished):
    cum = [0, 1000, 3000]
    src = MixtureSampler(cum, [1, 2], w_from, w_from - 1, seed=1)
    src.set_epoch(2)
    if finished:
        list(src)
    state = json.loads(json.dumps(src.state_dict()))
    for rank in {0, w_to - 1}:
        moved = MixtureSampler(cum, [5, 1], w_to, rank, seed=1)  # the state's schedule is kept
        with pytest.warns(UserWarning, match="constructed with weights"):
            moved.load_state_dict(state)
        assert moved.epoch == 2
        again = MixtureSampler(cum, [5, 1], w_to, rank, seed=1)
        again.load_state_dict(moved.state_dict())
        assert again.state_dict() == moved.state_dict()
        ref = MixtureSampler(cum, [1, 2], w_to, rank, seed=1)
        ref.set_epoch(2)
        assert list(moved) == ([] if finished else list(ref))  # a finished epoch stays done
        moved.set_epoch(3)
        ref.set_epoch(3)
        assert list(moved) == list(ref)


def test_schedule_starts_move_with_the_epoch_length_across_world_sizes():
    # Per-rank epoch lengths (sums of shares): 250 + 500 = 750 on 4 ranks, 1500 on 2,
    # 333 + 666 = 999 on 3. A start s moves to s * new // old.
    cum = [0, 1000, 3000]
    schedule = [(0, [1.0, 2.0], 1.0), (600, [0.0, 1.0], 1.0), (700, [1.0, 0.0], 2.0)]
    src = MixtureSampler(cum, [1, 2], 4, 0, seed=1)
    src.set_schedule(schedule)
    for finished in (False, True):
        if finished:
            list(src)
        state = src.state_dict()
        for w, length in [(2, 1500), (3, 999)]:
            moved = MixtureSampler(cum, [1, 2], w, w - 1, seed=1)
            assert len(moved) == length
            moved.load_state_dict(state)
            want = [(start * length // 750, weights, t) for start, weights, t in schedule]
            assert moved.schedule == want
            ref = MixtureSampler(cum, [1, 2], w, w - 1, seed=1)
            ref.set_schedule(want)
            assert list(moved) == ([] if finished else list(ref))
            moved.set_epoch(1)
            ref.set_epoch(1)
            assert list(moved) == list(ref)
    # and back: 1200 and 1400 of 1500 are 600 and 700 of 750 again
    wide = MixtureSampler(cum, [1, 2], 2, 1, seed=1)
    wide.set_schedule([(0, [1, 2]), (1200, [0, 1]), (1400, [1, 0], 2.0)])
    narrow = MixtureSampler(cum, [1, 2], 4, 3, seed=1)
    narrow.load_state_dict(wide.state_dict())
    assert narrow.schedule == schedule


def test_schedule_phases_left_empty_by_the_move_are_dropped():
    cum = _cum([16, 16])  # 32 positions per rank on 1 rank, 4 on 8 ranks
    src = MixtureSampler(cum, [1, 1], 1, 0, seed=2)
    src.set_schedule([(0, [1, 1]), (3, [1, 2]), (5, [1, 3]), (20, [1, 4]), (31, [1, 5])])
    moved = MixtureSampler(cum, [1, 1], 8, 5, seed=2)
    moved.load_state_dict(src.state_dict())
    # starts 0, 3 * 4 // 32 = 0, 5 * 4 // 32 = 0, 20 * 4 // 32 = 2, 31 * 4 // 32 = 3: of the
    # phases now starting at 0 the last one is in force there
    assert moved.schedule == [(0, [1.0, 3.0], 1.0), (2, [1.0, 4.0], 1.0), (3, [1.0, 5.0], 1.0)]
    assert len(list(moved)) == 4


def test_schedule_with_a_fixed_length_keeps_its_starts_across_world_sizes():
    cum = [0, 1000, 3000]
    src = MixtureSampler(cum, [1, 2], 4, 0, seed=1, num_samples=600)
    src.set_schedule([(0, [1, 2]), (450, [0, 1])])
    moved = MixtureSampler(cum, [1, 2], 2, 1, seed=1, num_samples=600)
    moved.load_state_dict(src.state_dict())
    assert moved.schedule == src.schedule
    assert np.all(_which(cum, moved.indices()[450:]) == 1)


def test_another_num_replicas_is_no_difference_mid_epoch_or_not():
    # A state of another world size resumes elastically: only real differences are named.
    cum = _cum([3000, 2000])
    mid = {**MixtureSampler(cum, [1, 2], 2, 1, seed=1).state_dict(), "position": 5}
    target = MixtureSampler(cum, [1, 2], 4, 1, seed=2)
    before = target.state_dict()
    for state in (mid, {**mid, "position": 0}):
        with pytest.raises(StateError, match="seed: state has 1, this sampler has 2") as e:
            target.load_state_dict(state)
        assert "num_replicas" not in str(e.value)
    assert target.state_dict() == before


def test_num_samples_difference_is_named():
    cum = _cum([1000, 2000])
    fixed = MixtureSampler(cum, [1, 2], 4, 1, seed=1, num_samples=100).state_dict()
    default = MixtureSampler(cum, [1, 2], 4, 1, seed=1).state_dict()
    for state, kwargs in [(fixed, {}), (default, {"num_samples": 100})]:
        target = MixtureSampler(cum, [1, 2], 4, 1, seed=1, **kwargs)
        before = target.state_dict()
        with pytest.raises(StateError, match="num_samples: state has") as e:
            target.load_state_dict(state)
        assert "missing" not in str(e.value)
        assert target.state_dict() == before
    with pytest.raises(StateError, match="num_samples: state has 100") as e:
        MixtureSampler(cum, [1, 2], 4, 1, seed=2).load_state_dict({**fixed, "position": 7})
    assert "seed" in str(e.value) and "num_replicas" not in str(e.value)
    with pytest.raises(StateError, match="num_samples: state has 100") as e:
        MixtureSampler(cum, [1, 2], 2, 1).load_state_dict({**fixed, "position": 7})
    assert "num_replicas" not in str(e.value)


# -- schedules ------------------------------------------------------------------------------------


def test_update_weights_takes_effect_at_the_next_iteration():
    cum = _cum([6000, 6000])
    s = MixtureSampler(cum, [1, 1], 1, 0, seed=2)
    it = iter(s)
    first = [next(it) for _ in range(10)]
    s.update_weights([1, 3])
    rest = list(it)  # the running iteration keeps its weights
    counts = np.bincount(_which(cum, first + rest), minlength=2).tolist()
    assert counts == [6000, 6000]
    assert np.bincount(_which(cum, list(s)), minlength=2).tolist() == [3000, 9000]
    assert s.state_dict()["schedule"] == [[0, [1.0, 3.0], 1.0]]


@pytest.mark.parametrize("through", ["state_dict", "pickle"])
def test_update_weights_during_an_iteration_resumes_like_the_uninterrupted_run(through):
    cum = _cum([200, 400])  # 600 positions on one rank
    weights = [1, 2]

    def make():
        return MixtureSampler(cum, weights, 1, 0, seed=3)

    run = make()
    it = iter(run)
    head = [next(it) for _ in range(150)]
    run.update_weights([1, 0])
    if through == "state_dict":
        state = json.loads(json.dumps(run.state_dict()))
        resumed = make()
        resumed.load_state_dict(state)
        assert resumed.state_dict() == state
    else:
        resumed = pickle.loads(pickle.dumps(run))
    rest = list(it)
    run.set_epoch(1)
    following = list(run)
    # the uninterrupted run: this epoch under the old weights, the next under the new ones
    assert np.bincount(_which(cum, head + rest)).tolist() == _largest_remainder(weights, 600)
    assert np.all(_which(cum, following) == 0) and len(following) == 600
    iter(resumed)  # DataLoader calls iter() twice and drops the first iterator
    assert head + list(resumed) == head + rest
    resumed.set_epoch(1)
    assert resumed.indices().tolist() == following
    assert list(resumed) == following


def test_update_weights_during_an_iteration_then_skip_resumes_like_the_uninterrupted_run():
    # In the running process a set_skip after the change applies it from the skip position;
    # a resume from a checkpoint taken before the skip does the same.
    cum = _cum([200, 400])
    run = MixtureSampler(cum, [1, 2], 1, 0, seed=3)
    it = iter(run)
    for _ in range(150):
        next(it)
    run.update_weights([1, 0])
    state = run.state_dict()
    run.set_skip(300)
    spliced = list(run)
    assert np.all(_which(cum, spliced) == 0) and len(spliced) == 300
    resumed = MixtureSampler(cum, [1, 2], 1, 0, seed=3)
    resumed.load_state_dict(state)
    resumed.set_skip(300)
    assert list(resumed) == spliced


def test_refused_update_leaves_the_weights_in_force():
    cum = _cum([600, 600])
    s = MixtureSampler(cum, [1, 3], 1, 0, seed=2)
    before = s.indices().tolist()
    for bad in ([1], [], [-1, 1], [0, 0], [float("nan"), 1], [float("inf"), 1]):
        with pytest.raises(ValueError, match="weights"):
            s.update_weights(bad)
    with pytest.raises(ValueError, match="temperature"):
        s.update_weights([1, 1], temperature=0)
    with pytest.raises(TypeError):
        s.update_weights(["a", 1])
    assert s.indices().tolist() == before
    assert s.schedule == [(0, [1.0, 3.0], 1.0)]


def test_schedule_phases_have_exact_counts_and_streams_continue():
    sizes = [9000, 9000, 9000]
    cum = _cum(sizes)
    s = MixtureSampler(cum, [1, 1, 1], 1, 0, seed=3)
    s.set_schedule([(0, [1, 0, 1]), (4000, [0, 1, 1]), (15_000, [5, 1, 0], 2.0)])
    idx = np.asarray(list(s), dtype=np.int64)
    ds = _which(cum, idx)
    assert np.bincount(ds[:4000], minlength=3).tolist() == _largest_remainder([1, 0, 1], 4000)
    assert np.bincount(ds[4000:15000], minlength=3).tolist() == _largest_remainder([0, 1, 1], 11000)
    p = np.array([5, 1, 0]) ** 0.5
    tail = np.bincount(ds[15000:], minlength=3)
    assert np.all(np.abs(tail - p / p.sum() * 12000) < 1)
    for d in range(3):  # each dataset's stream runs on: no repeat before a pass ends
        mine = idx[ds == d]
        for i in range(0, len(mine), 9000):
            assert len(np.unique(mine[i : i + 9000])) == len(mine[i : i + 9000])


def test_mid_epoch_change_keeps_the_past_and_loses_nothing():
    cum = _cum([20_000, 20_000])
    s = MixtureSampler(cum, [1, 1], 1, 0, seed=4, num_samples=30_000)
    it = iter(s)
    head = [next(it) for _ in range(10_000)]
    state = s.state_dict()
    r = MixtureSampler(cum, [1, 1], 1, 0, seed=4, num_samples=30_000)
    r.load_state_dict(state)
    r.update_weights([0, 1])  # from position 10_000 on, dataset 1 only
    rest = list(r)
    assert len(rest) == 20_000
    assert np.all(_which(cum, rest) == 1)
    light = [i for i in head + rest if i >= 20_000]
    first_pass = light[:20_000]
    assert len(set(first_pass)) == len(first_pass)  # one pass of dataset 1, nothing repeated
    # and the spliced schedule is in the state: a resume from inside it continues exactly
    r2 = MixtureSampler(cum, [1, 1], 1, 0, seed=4, num_samples=30_000)
    r2.load_state_dict(state)
    r2.update_weights([0, 1])
    it2 = iter(r2)
    [next(it2) for _ in range(5_000)]
    r3 = MixtureSampler(cum, [1, 1], 1, 0, seed=4, num_samples=30_000)
    r3.load_state_dict(json.loads(json.dumps(r2.state_dict())))
    assert list(r3) == rest[5_000:]
    # the next epoch starts under the new weights
    r3.set_epoch(1)
    assert np.all(_which(cum, r3.indices()) == 1)


def test_bad_schedules_are_refused():
    s = MixtureSampler(_cum([100, 100]), [1, 1], 1, 0)
    for bad, err in [
        ([], ValueError),
        ([(5, [1, 1])], ValueError),
        ([(0, [1, 1]), (0, [1, 1])], ValueError),
        ([(0, [1, 1]), (200, [1, 1])], ValueError),
        ([(0, [1, 1, 1])], ValueError),
        ([(0, [1, 1], -1.0)], ValueError),
        ("0", TypeError),
        ([(0,)], TypeError),
        ([(0.5, [1, 1])], TypeError),
    ]:
        with pytest.raises(err):
            s.set_schedule(bad)
    assert s.schedule == [(0, [1.0, 1.0], 1.0)]


# -- bad input ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "exc", "match"),
    [
        ({"weights": []}, ValueError, "weights"),
        ({"weights": [1.0]}, ValueError, "weights"),
        ({"weights": [1.0, -1.0]}, ValueError, r"weights\[1\]"),
        ({"weights": [1.0, float("nan")]}, ValueError, r"weights\[1\]"),
        ({"weights": [float("inf"), 1.0]}, ValueError, r"weights\[0\]"),
        ({"weights": [0, 0]}, ValueError, "zero"),
        ({"weights": "ab"}, TypeError, "weights"),
        ({"weights": [1, None]}, TypeError, r"weights\[1\]"),
        ({"temperature": 0.0}, ValueError, "temperature"),
        ({"temperature": -1.0}, ValueError, "temperature"),
        ({"temperature": float("inf")}, ValueError, "temperature"),
        ({"temperature": "1"}, TypeError, "temperature"),
        ({"cumulative_sizes": [1, 10, 20]}, ValueError, "start at 0"),
        ({"cumulative_sizes": [0, 10, 5]}, ValueError, "non-decreasing"),
        ({"cumulative_sizes": [0]}, ValueError, "at least 2"),
        ({"cumulative_sizes": [0, 1.5, 3]}, TypeError, "cumulative_sizes"),
        ({"cumulative_sizes": np.array([0.0, 1.0, 2.0])}, TypeError, "cumulative_sizes"),
        ({"cumulative_sizes": [0, 10, 10]}, ValueError, "dataset 1"),
        ({"num_samples": -1}, ValueError, "num_samples"),
        ({"num_samples": 1.0}, TypeError, "num_samples"),
        ({"num_replicas": 4, "rank": 4}, ValueError, "rank"),
        ({"seed": -1}, ValueError, "seed"),
        ({"shuffle": "yes"}, TypeError, "shuffle"),
    ],
)
def test_bad_input_is_refused_naming_the_argument(kwargs, exc, match):
    args = {"cumulative_sizes": [0, 10, 20], "weights": [1.0, 1.0], **kwargs}
    with pytest.raises(exc, match=match):
        MixtureSampler(**args)


def _mixture_class(which):
    """croupier's MixtureSampler, or the kempnerforge compat one (which needs torch)."""
    if which == "croupier":
        return MixtureSampler
    pytest.importorskip("torch")
    from croupier.compat import kempnerforge

    return kempnerforge.MixtureSampler


@pytest.mark.parametrize("which", ["croupier", "compat.kempnerforge"])
@pytest.mark.parametrize(
    ("kwargs", "kind", "match"),
    [
        ({"weights": [0.0, 0.0]}, ZeroDivisionError, "weights"),
        ({"weights": [1.0, -1.0]}, ZeroDivisionError, r"weights\[1\]"),  # they sum to 0
        ({"temperature": 0.0}, ZeroDivisionError, "temperature"),
        ({"num_replicas": 0}, ZeroDivisionError, "num_replicas"),
        ({"weights": []}, IndexError, "weights"),
        ({"weights": [1.0]}, IndexError, "weights"),
    ],
)
def test_kempnerforges_exception_types(which, kwargs, kind, match):
    cls = _mixture_class(which)
    # kempnerforge's sampler raises these types here; code catching them keeps working with
    # the drop-in (compat), and the exception is still croupier's ValueError naming the
    # argument. croupier's own class raises the plain ValueError.
    args = {"cumulative_sizes": [0, 10, 20], "weights": [1.0, 1.0], "num_replicas": 1}
    expected = kind if which != "croupier" else ValueError
    with pytest.raises(expected, match=match) as e:
        cls(**{**args, "rank": 0, **kwargs})
    assert isinstance(e.value, ValueError)
    if which == "croupier":
        assert not isinstance(e.value, (ZeroDivisionError, IndexError))
    else:  # a public type of the compat module, as a traceback names it
        from croupier.compat import kempnerforge

        name = type(e.value).__name__
        assert name in kempnerforge.__all__ and getattr(kempnerforge, name) is type(e.value)


@pytest.mark.parametrize("which", ["croupier", "compat.kempnerforge"])
@pytest.mark.parametrize(
    ("weights", "temperature", "kind", "match"),
    [
        ([0, 0], 1.0, ZeroDivisionError, "^weights"),
        ([1, -1], 1.0, ZeroDivisionError, r"^weights\[1\]"),
        ([1, 1], 0.0, ZeroDivisionError, "^temperature"),
        ([1], 1.0, ValueError, "weights"),  # kempnerforge: ValueError for a wrong count
        ([], 1.0, ValueError, "weights"),
        ([float("nan"), 1], 1.0, ValueError, r"^weights\[0\]"),
        ([1, 1], -1.0, ValueError, "^temperature"),
    ],
)
def test_update_weights_errors_name_weights_and_temperature(
    which, weights, temperature, kind, match
):
    cls = _mixture_class(which)
    s = cls([0, 10, 20], [1, 3], 1, 0)
    before = s.indices().tolist()
    if which == "croupier":
        kind = ValueError  # kempnerforge's types come with the drop-in only
    with pytest.raises(kind, match=match) as e:
        s.update_weights(weights, temperature)
    assert isinstance(e.value, ValueError) and "schedule" not in str(e.value)
    if kind is ValueError:
        assert not isinstance(e.value, (ZeroDivisionError, IndexError))
    assert s.schedule == [(0, [1.0, 3.0], 1.0)] and s.indices().tolist() == before


def test_dataset_smaller_than_the_world_needs_weight_zero_with_drop_last():
    cum = _cum([100, 3])
    with pytest.raises(ValueError, match="dataset 1"):
        MixtureSampler(cum, [1, 1], 4, 0, drop_last=True)
    assert len(MixtureSampler(cum, [1, 0], 4, 0, drop_last=True)) == 25
    s = MixtureSampler(cum, [1, 1], 4, 3, drop_last=False)  # padded: one per pass per rank
    assert np.bincount(_which(cum, s.indices()), minlength=2).tolist() == s.counts()


def test_configuration_is_read_only():
    s = MixtureSampler(_cum([10, 10]), [1, 1], 1, 0)
    with pytest.raises(AttributeError):
        s.seed = 3


# -- scale and element types ---------------------------------------------------------------------


def test_many_datasets():
    sizes = np.random.default_rng(0).integers(1, 50, 100_000)
    cum = np.concatenate([[0], np.cumsum(sizes)])
    weights = np.ones(len(sizes))
    s = MixtureSampler(cum, weights, 2, 1, drop_last=False, num_samples=300_000)
    idx = s.indices()
    counts = np.bincount(_which(cum.tolist(), idx), minlength=len(sizes))
    assert counts.sum() == 300_000 and counts.max() - counts.min() <= 1


def test_uint32_while_the_total_fits_then_int64():
    small = MixtureSampler([0, 2**31, 2**32], [1, 1], 8, 0, num_samples=1000)
    assert small.indices().dtype == np.uint32
    big = MixtureSampler([0, 2**32, 2**32 + 100], [1, 1], 8, 7, num_samples=1000)
    idx = big.indices()
    assert idx.dtype == np.int64
    ds = _which([0, 2**32, 2**32 + 100], idx)
    assert np.bincount(ds).tolist() == [500, 500]
    assert idx[ds == 1].min() >= 2**32


def test_forked_child_gives_the_same_indices():
    if not hasattr(os, "fork"):
        pytest.skip("needs os.fork")
    cum = _cum([300_000, 200_000])
    s = MixtureSampler(cum, [1, 2], 2, 1, seed=1)
    want = s.indices().astype(np.int64)
    got = _in_child(lambda: MixtureSampler(cum, [1, 2], 2, 1, seed=1).indices())
    assert np.array_equal(got, want)


@settings(max_examples=60, deadline=None)
@given(
    weights=st.lists(
        st.one_of(st.just(0.0), st.floats(1e306, 1.7976931348623157e308)), min_size=2, max_size=5
    ).filter(lambda ws: any(ws)),
    temperature=st.sampled_from([1.0, 0.5, 2.0]),
)
def test_huge_finite_weights_are_ratios_like_any_others(weights, temperature):
    """Finite weights whose sum overflows (two of 1e308) are valid: each dataset's count is
    within one of its exact share (computed in rationals), the counts fill the epoch."""
    sizes = [50] * len(weights)
    s = MixtureSampler(
        np.cumsum([0, *sizes]).tolist(), weights, num_replicas=1, rank=0,
        temperature=temperature,
    )  # fmt: skip
    counts = s.counts()
    assert sum(counts) == len(s)
    if temperature == 1.0:
        exact = [Fraction(w) for w in weights]
        total = sum(exact)
        for c, w in zip(counts, exact, strict=True):
            assert abs(c - w / total * len(s)) < 1
    assert all(c == 0 for c, w in zip(counts, weights, strict=True) if w == 0)
    got = Counter(np.searchsorted(s.cumulative_sizes, s.indices(), side="right") - 1)
    assert [got.get(i, 0) for i in range(len(weights))] == counts
