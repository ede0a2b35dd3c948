"""croupier.compat.megatron's index-free blend and shuffle index: exact properties over sweeps
(largest-remainder counts, every taken sample once, permutations of megatron-core's two shuffle
ranges), any read equal to any other read of the same positions (points, slices with any step,
iteration, across chunk boundaries, in a forked child, after pickling), determinism, positions
near 1e10 read at once, bad input refused; and patch(index_free=True) swapping megatron-core's
methods in and out (the whole build is tests/test_compat_megatron_helpers.py's)."""

from __future__ import annotations

import multiprocessing
import pickle
import warnings
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import croupier.compat.megatron as cm
from croupier.compat.megatron import IndexFreeBlend, IndexFreeShuffle
from croupier.compat.megatron.index_free import CHUNK

seeds = st.integers(0, 2**64 - 1)
weights = st.lists(st.floats(1e-3, 1e3), min_size=1, max_size=8)


def _taken(blend: IndexFreeBlend) -> dict[int, list[int]]:
    datasets = blend.dataset_index[:]
    samples = blend.dataset_sample_index[:]
    return {d: sorted(samples[datasets == d].tolist()) for d in range(len(blend.counts))}


@given(weights, st.integers(1, 3000), seeds)
def test_the_blend_takes_largest_remainder_counts_each_sample_once(raw, size, seed):
    blend = IndexFreeBlend(raw, size, seed=seed)
    total = sum(Fraction(w) for w in raw)
    assert blend.counts.sum() == size == len(blend) == blend.dataset_index.shape[0]
    for d, w in enumerate(raw):
        assert abs(blend.counts[d] - Fraction(w) / total * size) < 1
    assert _taken(blend) == {d: list(range(c)) for d, c in enumerate(blend.counts.tolist())}
    assert blend.dataset_index[:].dtype == np.int16
    assert blend.dataset_sample_index[:].dtype == np.int64


@given(st.lists(st.integers(1, 400), min_size=1, max_size=6), seeds)
def test_the_exhaustive_blend_takes_every_sample_once(sizes, seed):
    blend = IndexFreeBlend(sizes, None, seed=seed)
    assert blend.counts.tolist() == sizes and len(blend) == sum(sizes)
    assert _taken(blend) == {d: list(range(n)) for d, n in enumerate(sizes)}


@given(st.integers(0, 3000), st.integers(0, 3000), seeds)
def test_the_shuffle_permutes_megatrons_two_ranges(first, extra, seed):
    index = IndexFreeShuffle(first, first + extra, seed=seed)
    values = index[:]
    assert len(index) == len(values) == first + extra and values.dtype == np.uint32
    assert sorted(values[:first].tolist()) == list(range(first))
    assert sorted(values[first:].tolist()) == list(range(first, first + extra))


def _views(seed: int):
    blend = IndexFreeBlend([0.6, 0.3, 0.1], 3 * CHUNK + 11, seed=seed)
    shuffle = IndexFreeShuffle(2 * CHUNK + 5, 3 * CHUNK + 11, seed=seed)
    return blend.dataset_index, blend.dataset_sample_index, shuffle


@settings(max_examples=60)
@given(
    seeds,
    st.integers(-4 * CHUNK, 4 * CHUNK),
    st.integers(-4 * CHUNK, 4 * CHUNK) | st.none(),
    st.sampled_from([None, 1, 2, 7, -1, -3, CHUNK + 1]),
    st.lists(st.integers(-3 * CHUNK - 11, 3 * CHUNK + 10), max_size=20),
)
def test_every_read_of_a_position_gives_the_same_value(seed, start, stop, step, points):
    fresh = _views(seed)  # other instances, read in another order
    for k, view in enumerate(_views(seed)):
        whole = np.fromiter(iter(view), dtype=view.dtype)  # chunk by chunk
        assert len(whole) == len(view)
        assert np.array_equal(view[start:stop:step], whole[start:stop:step])
        assert [view[p] for p in points] == [whole[p] for p in points]
        assert [fresh[k][p] for p in reversed(points)] == [whole[p] for p in reversed(points)]


def test_reading_forward_backward_and_at_strides_gives_the_same_values():
    for k, view in enumerate(_views(5)):
        whole = view[:]
        n = len(whole)
        patterns = [
            range(n),  # forward, one by one
            range(n - 1, -1, -1),  # backward
            [p + k for p in range(0, n - 4, 700) for k in range(4)],  # micro-batches, a stride
            [p + k for p in range(0, n - 4, 9000) for k in range(4)],  # a long stride
            [p for q in range(0, n - 600, 2000) for p in (q + 500, q, q + 250)],  # to and fro
        ]
        for pattern in patterns:
            fresh = _views(5)[k]
            assert [fresh[p] for p in pattern] == [whole[p] for p in pattern]


def test_the_two_shuffle_ranges_are_keyed_apart():
    index = IndexFreeShuffle(1000, 2000, seed=5)[:].astype(np.int64)
    assert sorted(index[1000:] - 1000) == list(range(1000))
    assert not np.array_equal(index[1000:] - 1000, index[:1000])


def test_the_same_seed_gives_the_same_order_and_another_seed_another():
    a, b, c = (IndexFreeBlend([0.5, 0.5], 5000, seed=s) for s in (1, 1, 2))
    assert np.array_equal(a.dataset_index[:], b.dataset_index[:])
    assert np.array_equal(a.dataset_sample_index[:], b.dataset_sample_index[:])
    assert not np.array_equal(a.dataset_index[:], c.dataset_index[:])
    assert not np.array_equal(
        IndexFreeShuffle(5000, 5000, seed=1)[:], IndexFreeShuffle(5000, 5000, seed=2)[:]
    )


def test_pickled_and_forked_copies_read_the_same():
    blend = IndexFreeBlend([3, 1], 4 * CHUNK, seed=7)
    shuffle = IndexFreeShuffle(CHUNK, 3 * CHUNK, seed=7)
    points = [0, CHUNK - 1, CHUNK, 3 * CHUNK + 5, 4 * CHUNK - 1]
    expected = [(blend[p], int(shuffle[min(p, 3 * CHUNK - 1)])) for p in points]
    blend2, shuffle2 = pickle.loads(pickle.dumps((blend, shuffle)))
    assert [(blend2[p], int(shuffle2[min(p, 3 * CHUNK - 1)])) for p in points] == expected
    context = multiprocessing.get_context("fork")
    with context.Pool(1) as pool:
        got = pool.map(_read_in_child, [(blend, shuffle, points)])
    assert got == [expected]


def _read_in_child(args):
    blend, shuffle, points = args
    return [(blend[p], int(shuffle[min(p, 3 * CHUNK - 1)])) for p in points]


def test_positions_near_1e10_are_read_at_once():
    raw = np.random.default_rng(0).dirichlet(np.ones(100)).tolist()
    size = 10**10
    blend = IndexFreeBlend(raw, size, seed=3)
    assert blend.counts.sum() == size
    for p in (0, 5_000_000_000, size - 1):
        d, s = blend[p]
        assert 0 <= d < 100 and 0 <= s < blend.counts[d]
    shuffle = IndexFreeShuffle(size - 1000, size, seed=3)
    assert shuffle.dtype == np.int64
    assert 0 <= shuffle[0] < size - 1000 <= shuffle[size - 1] < size
    assert len(set(shuffle[size - 1000 :].tolist())) == 1000


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda: IndexFreeBlend([], 10, seed=0), ValueError, "weights must name 1 to"),
        (
            lambda: IndexFreeBlend([0.5, 0.0], 10, seed=0),
            ValueError,
            r"weights\[1\] must be positive",
        ),
        (lambda: IndexFreeBlend([0.5, float("nan")], 10, seed=0), ValueError, "finite"),
        (
            lambda: IndexFreeBlend([0.5, True], 10, seed=0),
            TypeError,
            r"weights\[1\] must be a number",
        ),
        (lambda: IndexFreeBlend("ab", 10, seed=0), TypeError, "weights must be a 1-D sequence"),
        (lambda: IndexFreeBlend(np.array(0.5), 10, seed=0), TypeError, "1-D sequence"),
        (lambda: IndexFreeBlend([1, 2**1100], 10, seed=0), ValueError, "positive and finite"),
        (lambda: IndexFreeBlend([1e308, 1e308], 10, seed=0), ValueError, "finite sum"),
        (
            lambda: IndexFreeBlend([1.0], 2**53 + 1, seed=0),
            ValueError,
            r"size must be in \[1, 9007199254740992\], got 9007199254740993",
        ),
        (
            lambda: IndexFreeBlend([2**52, 2**52 + 1], None, seed=0),
            ValueError,
            r"sum to at most 2\*\*53, got 9007199254740993",
        ),
        (lambda: IndexFreeBlend([1.0], 10, seed=0)[0:2], TypeError, "slice blend.dataset_index"),
        (lambda: IndexFreeShuffle(2**63, 2**63, seed=0), ValueError, "num_samples must be"),
        (lambda: IndexFreeBlend([1.0] * 32768, 10, seed=0), ValueError, "int16"),
        (lambda: IndexFreeBlend([0.5, 0.5], 0, seed=0), ValueError, r"size must be in \[1, "),
        (lambda: IndexFreeBlend([0.5, 0.5], 1.5, seed=0), TypeError, "size must be an int,"),
        (
            lambda: IndexFreeBlend([2, 1.5], None, seed=0),
            TypeError,
            r"weights\[1\] must be an int,",
        ),
        (
            lambda: IndexFreeBlend([2, 0], None, seed=0),
            ValueError,
            r"weights\[1\] must be an int >= 1",
        ),
        (lambda: IndexFreeBlend([1.0], 10, seed=-1), ValueError, r"seed must be in \[0, "),
        (
            lambda: IndexFreeBlend([1.0], 10, seed=2**64),
            ValueError,
            r"18446744073709551615\], got 18446744073709551616",
        ),
        (lambda: IndexFreeShuffle(5, 4, seed=0), ValueError, "total_size must be at least"),
        (lambda: IndexFreeShuffle(-1, 4, seed=0), ValueError, r"num_samples must be in \[0, "),
        (lambda: IndexFreeShuffle(1, 4, seed="0"), TypeError, "seed must be an int,"),
        (lambda: IndexFreeShuffle(4, 4, seed=0)[4], IndexError, "out of range"),
        (lambda: IndexFreeShuffle(4, 4, seed=0)[-5], IndexError, "out of range"),
        (lambda: IndexFreeShuffle(4, 4, seed=0)[1.0], TypeError, "integer or a slice"),
        (lambda: IndexFreeShuffle(4, 4, seed=0)[[1, 2]], TypeError, "integer or a slice"),
        (lambda: np.asarray(IndexFreeShuffle(4, 4, seed=0)), TypeError, "slice the positions"),
    ],
)
def test_bad_input_is_refused(call, error, match):
    with pytest.raises(error, match=match):
        call()


@pytest.mark.parametrize(
    "weights",
    [[1 / 3] * 3, [0.6, 0.3, 0.1], [0.5, 0.25, 0.125, 0.125], [1.0, 2.0, 3.0, 4.0, 5.0]],
)
@pytest.mark.parametrize("size", [2**53, 2**53 - 1, 10**15 + 7])
def test_blends_up_to_2_53_positions_take_largest_remainder_counts(weights, size):
    # Up to 2**53 positions the blend's second rounding (float64 shares) gives back the
    # counts; above it, it did not, and sizes past 2**53 are refused.
    blend = IndexFreeBlend(weights, size, seed=1)
    from fractions import Fraction

    total = sum(weights)
    shares = [Fraction(w / total) * size for w in weights]  # the normalized weights' shares
    assert int(blend.counts.sum()) == size
    assert all(abs(int(c) - s) < 1.001 for c, s in zip(blend.counts, shares, strict=True))


def test_an_exhaustive_blend_of_2_53_samples_takes_them_all():
    blend = IndexFreeBlend([2**52, 2**52], None, seed=3)
    assert blend.counts.tolist() == [2**52, 2**52]


with warnings.catch_warnings():
    # megatron-core warns at import that Transformer Engine and Apex are absent.
    warnings.simplefilter("ignore")
    gpt_dataset = pytest.importorskip("megatron.core.datasets.gpt_dataset")
    blended_dataset = pytest.importorskip("megatron.core.datasets.blended_dataset")


def test_an_index_free_patch_swaps_the_methods_and_gives_them_back():
    gpt = gpt_dataset.GPTDataset._build_document_sample_shuffle_indices
    blend = blended_dataset.BlendedDataset._build_indices
    with cm.patch(index_free=True):
        assert cm._patched()
        assert gpt_dataset.GPTDataset._build_document_sample_shuffle_indices is not gpt
        assert blended_dataset.BlendedDataset._build_indices is not blend
        with cm.patch(index_free=True):
            pass
        assert blended_dataset.BlendedDataset._build_indices is not blend
        with pytest.raises(ValueError, match="index_free=True is installed"):
            cm.patch()
    assert gpt_dataset.GPTDataset._build_document_sample_shuffle_indices is gpt
    assert blended_dataset.BlendedDataset._build_indices is blend
    with cm.patch():
        # The identical patch leaves the datasets' methods alone.
        assert blended_dataset.BlendedDataset._build_indices is blend
        with pytest.raises(ValueError, match="index_free=False is installed"):
            cm.patch(index_free=True)
    assert not cm._patched()
    with pytest.raises(TypeError, match="index_free must be a bool"):
        cm.patch(index_free=1)
    assert not cm._patched()
