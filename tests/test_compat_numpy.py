"""croupier.compat.numpy.legacy_shuffle against numpy's own ``RandomState.shuffle``: the same
order and the same generator state afterwards, for every length, dtype, row shape and state
position, and the bad input numpy's shuffle cannot take here refused before any work."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from croupier.compat.numpy import legacy_shuffle

DTYPES = [np.int8, np.uint16, np.int32, np.uint32, np.int64, np.float64, np.complex128, np.bool_]


def _states_equal(a: np.random.RandomState, b: np.random.RandomState) -> bool:
    sa, sb = a.get_state(), b.get_state()
    return (
        sa[0] == sb[0]
        and bool((sa[1] == sb[1]).all())
        and sa[2:] == sb[2:]
        and a.randint(2**31) == b.randint(2**31)  # and they go on alike
    )


def _pair(seed: int, drawn: int, gauss: bool) -> tuple[np.random.RandomState, ...]:
    """Two RandomStates in one state: seeded, ``drawn`` words used (any position in the
    twister's block), a cached Gaussian or not."""
    pair = (np.random.RandomState(seed), np.random.RandomState(seed))
    for r in pair:
        r.randint(0, 2**32, size=drawn, dtype=np.uint64)  # two words each
        if gauss:
            r.standard_normal()  # leaves one cached
    return pair


@given(
    n=st.integers(0, 3000),
    seed=st.integers(0, 2**32 - 1),
    drawn=st.integers(0, 700),
    dtype=st.sampled_from(DTYPES),
    gauss=st.booleans(),
)
def test_a_1d_array_is_shuffled_as_numpy_shuffles_it(n, seed, drawn, dtype, gauss):
    ours, numpys = _pair(seed, drawn, gauss)
    x = (np.arange(n) * 7 % 251).astype(dtype)
    want = x.copy()
    numpys.shuffle(want)
    legacy_shuffle(x, ours)
    assert x.dtype == want.dtype and np.array_equal(x, want)
    assert _states_equal(ours, numpys)


@given(
    rows=st.integers(0, 300),
    shape=st.sampled_from([(3,), (1,), (2, 5), (0,), (4, 0)]),
    seed=st.integers(0, 2**32 - 1),
    dtype=st.sampled_from([np.uint8, np.int16, np.float32, np.float64]),
)
def test_rows_of_an_nd_array_are_shuffled_as_numpy_shuffles_them(rows, shape, seed, dtype):
    # Rows of 1 to 40 bytes, and rows of none (numpy draws nothing for them).
    ours, numpys = _pair(seed, 0, False)
    x = np.arange(rows * int(np.prod(shape)), dtype=dtype).reshape(rows, *shape)
    want = x.copy()
    numpys.shuffle(want)
    legacy_shuffle(x, ours)
    assert np.array_equal(x, want)
    assert _states_equal(ours, numpys)


def test_a_structured_dtype_and_a_view_shuffle_in_place():
    # Elements of 3 bytes (no integer of that size), and a contiguous slice of a larger array
    # shuffled in place, its neighbours untouched.
    ours, numpys = _pair(5, 10, False)
    x = np.zeros(1000, dtype=[("a", "u1"), ("b", "<u2")])
    x["a"], x["b"] = np.arange(1000) % 256, np.arange(1000)
    want = x.copy()
    numpys.shuffle(want)
    legacy_shuffle(x, ours)
    assert np.array_equal(x, want)
    big = np.arange(100, dtype=np.int64)
    want_big = big.copy()
    numpys.shuffle(want_big[10:90])
    legacy_shuffle(big[10:90], ours)
    assert np.array_equal(big, want_big)
    assert _states_equal(ours, numpys)


def test_a_large_array_and_several_shuffles_with_one_state():
    # Megatron shuffles several arrays with one state: each call continues numpy's stream.
    # 4.5e6 elements take the path that draws on a second thread (from 2**21).
    ours, numpys = _pair(1234, 0, False)
    for n in (4_500_000, 3, 77_777):
        x = np.arange(n, dtype=np.uint32)
        want = x.copy()
        numpys.shuffle(want)
        legacy_shuffle(x, ours)
        assert np.array_equal(x, want), n
    assert _states_equal(ours, numpys)


def test_the_global_random_state_works_too():
    # numpy.random.shuffle draws from numpy's global RandomState.
    np.random.seed(9)
    want = np.arange(500)
    np.random.shuffle(want)
    np.random.seed(9)
    x = np.arange(500)
    legacy_shuffle(x, np.random.mtrand._rand)
    assert np.array_equal(x, want)


@pytest.mark.parametrize(
    ("x", "state", "error", "match"),
    [
        (list(range(5)), np.random.RandomState(0), TypeError, "x must be a numpy array"),
        (np.array(3), np.random.RandomState(0), TypeError, "at least one dimension"),
        (np.array([1, "a"], dtype=object), np.random.RandomState(0), TypeError, "objects"),
        (np.arange(10)[::2], np.random.RandomState(0), ValueError, "C-contiguous"),
        (np.arange(5), np.random.default_rng(0), TypeError, "numpy.random.RandomState"),
        (np.arange(5), np.random.RandomState(np.random.PCG64(0)), TypeError, "PCG64"),
        (np.arange(5), 3, TypeError, "got int"),
        (np.ma.masked_array(np.arange(8)), np.random.RandomState(0), TypeError, "MaskedArray"),
    ],
)
def test_bad_input_is_refused_before_any_work(x, state, error, match):
    import pickle

    def snapshot():
        if isinstance(state, np.random.RandomState):
            return pickle.dumps(state.get_state(legacy=False))
        return None

    before, saved = (x.copy() if isinstance(x, np.ndarray) else list(x)), snapshot()
    with pytest.raises(error, match=match):
        legacy_shuffle(x, state)
    assert np.array_equal(np.asarray(x), np.asarray(before))
    assert snapshot() == saved


def test_a_matrix_is_refused_and_its_asarray_view_shuffles_its_rows():
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PendingDeprecationWarning)
        m = np.matrix(np.arange(8).reshape(4, 2))
    state = np.random.RandomState(0)
    with pytest.raises(TypeError, match="subclass matrix"):
        legacy_shuffle(m, state)
    assert state.get_state()[2] == 624  # nothing drawn
    want = np.arange(8).reshape(4, 2)
    np.random.RandomState(0).shuffle(want)
    legacy_shuffle(np.asarray(m), state)
    assert np.array_equal(np.asarray(m), want)


def test_a_read_only_array_is_refused():
    x = np.arange(10)
    x.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        legacy_shuffle(x, np.random.RandomState(0))


@pytest.mark.parametrize(
    ("shape", "dtype"),
    [((5,), np.dtype([])), ((2,), "V0"), ((700,), "V0"), ((7, 3), np.dtype([])), ((5, 0), "i4")],
)
@pytest.mark.parametrize("seed", [0, 1, 2**32 - 1])
def test_elements_of_no_bytes_draw_as_numpy_draws(shape, dtype, seed):
    # numpy swaps nothing there but draws as for any rows (none where the rows are empty).
    ours, numpys = _pair(seed, 3, False)
    numpys.shuffle(np.empty(shape, dtype))
    legacy_shuffle(np.empty(shape, dtype), ours)
    assert _states_equal(ours, numpys)


def test_a_memmap_is_shuffled_in_place(tmp_path):
    want = np.arange(1000, dtype=np.int32)
    np.random.RandomState(4).shuffle(want)
    x = np.memmap(tmp_path / "x.bin", dtype=np.int32, mode="w+", shape=(1000,))
    x[:] = np.arange(1000)
    legacy_shuffle(x, np.random.RandomState(4))
    x.flush()
    assert np.array_equal(np.fromfile(tmp_path / "x.bin", dtype=np.int32), want)


def test_threads_sharing_one_state_take_turns_as_with_numpy():
    # The shuffle holds the state's lock (its core runs without the GIL): two threads
    # shuffling with one RandomState get numpy's two shuffles one after the other, in either
    # order, and leave the state both shuffles leave. Without the lock both read one state
    # and get the same permutation.
    import threading

    n = 4_000_000
    shared = np.random.RandomState(21)
    arrays = [np.arange(n, dtype=np.int32), np.arange(n, dtype=np.int32)]
    start = threading.Barrier(2)

    def shuffle(x):
        start.wait()
        legacy_shuffle(x, shared)

    threads = [threading.Thread(target=shuffle, args=(x,)) for x in arrays]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    reference = np.random.RandomState(21)
    first, second = np.arange(n, dtype=np.int32), np.arange(n, dtype=np.int32)
    reference.shuffle(first)
    reference.shuffle(second)
    in_order = np.array_equal(arrays[0], first) and np.array_equal(arrays[1], second)
    swapped = np.array_equal(arrays[0], second) and np.array_equal(arrays[1], first)
    assert in_order or swapped
    assert _states_equal(shared, reference)
