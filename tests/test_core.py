"""The compiled module: zero-copy hand-over, the GIL released, dtypes, and clean errors."""

import contextlib
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import croupier
from croupier import _core


def _deal(n: int, num_replicas: int, rank: int, **kw: object) -> _core.RankShare:
    """A ``_core.RankShare`` with the sampler's defaults (shuffled, seed 0, padded, per-rank order)
    unless given."""
    config = {"shuffle": True, "seed": 0, "drop_last": False, "order": _core.Order.PER_RANK, **kw}
    return _core.RankShare(n=n, num_replicas=num_replicas, rank=rank, **config)


def test_permutation_is_a_permutation_and_uint32():
    p = _core.permutation(1000, 3, 1)
    assert p.dtype == np.uint32
    assert np.array_equal(np.sort(p), np.arange(1000))


def test_arrays_own_the_rust_buffer_without_a_copy():
    # numpy does not own the data: its base is the Rust-side container holding the Vec.
    for arr in (
        _core.permutation(100, 0, 0),
        _deal(100, 3, 1).indices(0),
        _deal(2**32 + 5, 2**20, 7, shuffle=False, order=_core.Order.TORCH_INSIDE_OUT).indices(0),
    ):
        assert not arr.flags.owndata
        assert type(arr.base).__name__ == "PySliceContainer"
        assert arr.flags.c_contiguous


def test_peak_memory_shows_no_copy():
    # A copy on hand-over would need a second buffer of the same size at the peak.
    n = 50_000_000  # 200 MB of uint32
    code = textwrap.dedent(
        f"""
        import resource
        import numpy as np
        from croupier import _core
        np.zeros(1)
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        arr = _core.permutation({n}, 0, 0)
        after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        print((after - before) * 1024, arr.nbytes)
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    grown, nbytes = map(int, out.stdout.split())
    assert nbytes == 4 * n
    assert grown < 1.25 * nbytes, f"peak grew by {grown} bytes for a {nbytes}-byte result"


def test_dtype_switches_above_2_pow_32():
    at = _deal(2**32, 2**20, 0, shuffle=False).indices(0)
    above = _deal(2**32 + 1, 2**20, 0, shuffle=False).indices(0)
    assert at.dtype == np.uint32 and int(at[-1]) == 2**32 - 2**20
    assert above.dtype == np.int64


def test_layout_is_torch_arithmetic():
    assert _core.layout(10, 4, False) == (3, 12)
    assert _core.layout(10, 4, True) == (2, 8)
    assert _core.layout(3, 8, True) == (0, 0)
    assert _core.layout(3, 8, False) == (1, 8)
    assert _core.layout(0, 5, False) == (0, 0)


@given(st.integers(0, 2**63 - 1), st.integers(1, 2**63 - 1), st.booleans())
def test_an_epochs_end_is_its_samples_or_what_drop_last_keeps(n, w, drop_last):
    # torch's arithmetic: padding is not part of the epoch, and drop_last cuts n mod w.
    want = n - n % w if drop_last else n
    assert _core.epoch_end(n, w, drop_last) == want


def test_gil_is_released_during_the_work():
    started = threading.Event()
    done = threading.Event()

    def work():
        started.set()
        _core.permutation(30_000_000, 0, 0)
        done.set()

    t = threading.Thread(target=work)
    t.start()
    started.wait()
    ticks = 0
    while not done.is_set():
        ticks += 1
    t.join()
    # Holding the GIL, the worker would freeze this loop for the whole shuffle.
    assert ticks > 10_000


MAX = str(2**63 - 1)
PER_RANK, TORCH = _core.Order.PER_RANK, _core.Order.TORCH_INSIDE_OUT


@pytest.mark.parametrize(
    ("call", "exc", "words"),
    [
        # The public functions check arguments with messages that name them.
        (lambda: croupier.permutation(-1), ValueError, f"n must be in [0, {MAX}], got -1"),
        (lambda: croupier.permutation(2**63), ValueError, f"n must be in [0, {MAX}]"),
        (lambda: croupier.permutation("5"), TypeError, "n must be an int, got str"),
        (lambda: croupier.permutation(5.0), TypeError, "n must be an int, got float"),
        (lambda: croupier.permutation(5, True), TypeError, "seed must be an int, got bool"),
        (lambda: croupier.permutation(5, 0, -3), ValueError, "epoch must be in [0, "),
        # The core checks its own invariants again, behind them.
        (lambda: _core.layout(5, 0, False), ValueError, "num_replicas must be in [1, 2**63 - 1]"),
        (
            lambda: _core.RankShare(
                n=5, num_replicas=4, rank=4, shuffle=True, seed=0, drop_last=False, order=PER_RANK
            ),
            ValueError,
            "rank must be in [0, num_replicas) = [0, 4), got 4",
        ),
        (
            lambda: _core.RankShare(
                n=5, num_replicas=1, rank=0, shuffle=True, seed=0, drop_last=False, order=PER_RANK
            ).indices(0, 3, 2),
            ValueError,
            "start",
        ),
        (lambda: _core.torch_randperm(5, 0, PER_RANK), ValueError, "got Order.PER_RANK"),
        (lambda: _core.torch_randperm(5, 0, _core.Order.GLOBAL), ValueError, "got Order.GLOBAL"),
        # A value of the wrong type or sign never reaches the core.
        (lambda: _core.permutation(-1, 0, 0), OverflowError, ""),
        (
            lambda: _core.RankShare(
                n=5, num_replicas=1, rank=0, shuffle=True, seed=0, drop_last=False, order="per_rank"
            ),
            TypeError,
            "Order",
        ),
    ],
)
def test_bad_arguments_raise_named_errors(call, exc, words):
    with pytest.raises(exc) as info:
        call()
    assert words in str(info.value)


def test_numpy_integers_are_accepted():
    assert np.array_equal(
        _core.permutation(np.int64(50), np.uint64(2), np.int32(1)), _core.permutation(50, 2, 1)
    )
    assert np.array_equal(
        croupier.permutation(np.int64(50), np.uint64(2), np.int32(1)), _core.permutation(50, 2, 1)
    )


def test_unallocatable_buffer_is_a_memory_error():
    with pytest.raises(MemoryError, match=r"cannot allocate|GiB"):
        _core.permutation(2**63 - 1, 0, 0)


def test_orders_and_deals_pickle_and_compare():
    import pickle

    for order in (PER_RANK, _core.Order.TORCH_FORWARD, TORCH):
        assert pickle.loads(pickle.dumps(order)) == order
    assert PER_RANK != TORCH and len({PER_RANK, TORCH, _core.Order.PER_RANK}) == 2
    # The per-rank order's earlier name is the same member, and a pickle naming it loads.
    assert _core.Order.FAST == PER_RANK and repr(_core.Order.FAST) == "Order.PER_RANK"

    class PickledBefore:  # how an Order.FAST pickled before the rename reads
        def __reduce__(self):
            return getattr, (_core.Order, "FAST")

    assert pickle.loads(pickle.dumps(PickledBefore())) == PER_RANK
    deal = _core.RankShare(
        n=1000, num_replicas=3, rank=2, shuffle=True, seed=9, drop_last=True, order=TORCH
    )
    clone = pickle.loads(pickle.dumps(deal))
    assert repr(clone) == repr(deal)
    assert "order=Order.TORCH_INSIDE_OUT" in repr(deal)
    assert (clone.num_samples, clone.total_size) == (333, 999)
    assert (deal.num_samples, deal.total_size) == (333, 999)
    assert np.array_equal(clone.indices(4), deal.indices(4))
    # Samplers pickled before the class's rename name it croupier._core.Deal.
    assert pickle.loads(b"ccroupier._core\nDeal\n.") is _core.RankShare
    shape = _core.MixtureShape([5, 7], num_samples=None, order=_core.Order.GLOBAL, drop_last=False)
    again = pickle.loads(pickle.dumps(shape))
    assert [again.positions(3), again.rank_length(3), again.window] == [12, 4, 1 << 20]


big = st.integers(min_value=-(2**70), max_value=2**70)


@given(
    n=big,
    w=big,
    r=big,
    seed=big,
    epoch=big,
    shuffle=st.booleans(),
    drop=st.booleans(),
    order=st.sampled_from(["per_rank", "torch"]),
)
def test_no_argument_ever_panics(n, w, r, seed, epoch, shuffle, drop, order):
    # Small enough shares to compute, or errors: never a PanicException (a BaseException),
    # through the public sampler or straight into the core.
    if 0 <= n <= 10_000 or (w > 0 and n // max(w, 1) <= 10_000 and not shuffle):
        with contextlib.suppress(ValueError, TypeError, MemoryError):
            s = croupier.DistributedSampler(
                n, w, r, shuffle=shuffle, seed=seed, drop_last=drop, order=order
            )
            s.set_epoch(epoch)
            s.indices()
        core_order = PER_RANK if order == "per_rank" else TORCH
        with contextlib.suppress(ValueError, OverflowError, MemoryError):
            _core.RankShare(
                n=n,
                num_replicas=w,
                rank=r,
                shuffle=shuffle,
                seed=seed,
                drop_last=drop,
                order=core_order,
            ).indices(epoch)
    with contextlib.suppress(ValueError, OverflowError):
        _core.layout(n, w, drop)


def test_public_permutation_matches_core_and_fills_buffers():
    for n in (0, 1, 10, 40_000, 1_000_003):
        want = croupier.permutation(n, seed=3, epoch=2)
        assert want.dtype == np.uint32
        assert np.array_equal(np.sort(want), np.arange(n))
        buf = np.empty(n, dtype=np.uint32)
        assert croupier.permutation(n, 3, 2, out=buf) is buf
        assert np.array_equal(buf, want)
        wide = np.zeros(n, dtype=np.int64)
        croupier.permutation(n, 3, 2, out=wide)
        assert np.array_equal(wide, want.astype(np.int64))
    assert not np.array_equal(croupier.permutation(1000, 0, 0), croupier.permutation(1000, 0, 1))


@pytest.mark.parametrize(
    ("kwargs", "exc", "match"),
    [
        ({"out": [0, 1]}, TypeError, "out must be a numpy array"),
        ({"out": np.zeros(2, dtype=np.float64)}, TypeError, "dtype uint32 or int64"),
        ({"out": np.zeros(3, dtype=np.uint32)}, ValueError, "length n = 2"),
        ({"out": np.zeros((2, 1), dtype=np.uint32)}, ValueError, "1-D"),
        ({"out": np.zeros(4, dtype=np.uint32)[::2]}, ValueError, "C-contiguous"),
        ({"seed": -1}, ValueError, "seed"),
    ],
)
def test_public_permutation_refuses_bad_buffers(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        croupier.permutation(2, **kwargs)


def test_read_only_buffer_is_refused():
    buf = np.zeros(2, dtype=np.uint32)
    buf.flags.writeable = False
    with pytest.raises(ValueError, match="writable"):
        croupier.permutation(2, out=buf)


def test_typed_configs_take_every_keyword_and_refuse_unknown_or_missing_ones():
    """Settings reach the core by name: a keyword the config does not know, or one it needs
    and did not get, is a TypeError naming it, and nothing is built."""
    lengths = np.array([5, 9, 3, 7], dtype=np.uint32)
    config = {
        "boundaries": None, "num_buckets": 2, "batch_size": 2, "max_tokens": None,
        "multiple": 1, "quadratic": None, "oversized_alone": True, "full_batches": False,
        "order": "per_rank", "sync": None, "seed": 0, "shuffle": False, "shuffle_batches": False,
    }  # fmt: skip
    plan = _core.Buckets(lengths, **config)
    deal = {"num_replicas": 1, "rank": 0, "drop_last": False, "elastic": None}
    flat, offsets = plan.range(0, 0, plan.batches, **deal)
    assert sorted(flat.tolist()) == [0, 1, 2, 3] and offsets[-1] == 4
    with pytest.raises(TypeError, match="unexpected keyword argument 'batchsize'"):
        _core.Buckets(lengths, **config, batchsize=3)
    with pytest.raises(TypeError, match="missing required keyword arguments: full_batches"):
        _core.Buckets(lengths, **{k: v for k, v in config.items() if k != "full_batches"})
    with pytest.raises(TypeError, match="missing required keyword arguments: boundaries, num"):
        _core.Buckets(lengths)
    with pytest.raises(TypeError, match=r"Buckets.range\(\) missing .*: elastic"):
        plan.range(0, 0, 1, **{k: v for k, v in deal.items() if k != "elastic"})
    with pytest.raises(TypeError, match=r"Buckets.range\(\) got an unexpected keyword"):
        plan.range(0, 0, 1, **deal, seeds=3)
    # The order's name and its run length are checked before any work.
    with pytest.raises(ValueError, match="order must be one of 'global', 'per_rank'"):
        _core.Buckets(lengths, **{**config, "order": "fast"})
    with pytest.raises(ValueError, match="sync applies to the global order"):
        _core.Buckets(lengths, **{**config, "sync": 4})
    with pytest.raises(ValueError, match="sync must be a power of two"):
        _core.Buckets(lengths, **{**config, "order": "global", "sync": 3})


def test_a_mixture_pickles_with_its_keywords():
    import pickle

    for order, interleave in (
        (_core.Order.PER_RANK, "uniform"),
        (_core.Order.GLOBAL, "uniform"),
        (_core.Order.GLOBAL, "balanced"),
    ):
        mix = _core.Mixture(
            [30, 70], [(0, 40, [1.0, 2.0], 1.0)], num_replicas=2, rank=1, drop_last=False,
            shuffle=True, seed=5, length=40, order=order, interleave=interleave,
            permute_samples=True,
        )  # fmt: skip
        again = pickle.loads(pickle.dumps(mix))
        assert again.indices(3).tolist() == mix.indices(3).tolist()
        assert repr(again) == repr(mix)
        assert again.global_length == (None if order == _core.Order.PER_RANK else 40)
    with pytest.raises(TypeError, match=r"Mixture\(\) missing required keyword arguments: seed"):
        _core.Mixture(
            [30, 70], [(0, 40, [1.0, 2.0], 1.0)], num_replicas=2, rank=1, drop_last=False,
            shuffle=True, length=40, order=_core.Order.PER_RANK, interleave="uniform",
            permute_samples=True,
        )  # fmt: skip
    with pytest.raises(ValueError, match="interleave must be 'uniform' or 'balanced'"):
        _core.Mixture(
            [30, 70], [(0, 40, [1.0, 2.0], 1.0)], num_replicas=2, rank=1, drop_last=False,
            shuffle=True, seed=5, length=40, order=_core.Order.GLOBAL, interleave="random",
            permute_samples=True,
        )  # fmt: skip
    with pytest.raises(ValueError, match="order"):
        _core.Mixture(
            [30, 70], [(0, 40, [1.0, 2.0], 1.0)], num_replicas=2, rank=1, drop_last=False,
            shuffle=True, seed=5, length=40, order=_core.Order.TORCH_FORWARD,
            interleave="uniform", permute_samples=True,
        )  # fmt: skip


@pytest.mark.parametrize("n", [0, 1, 2**18 - 1, 2**18, 2**18 + 1, 3 * 2**18 + 5])
@pytest.mark.parametrize("wide", [False, True])
def test_index_range_is_numpys_arange_across_pieces(n, wide):
    got = _core.index_range(n, wide)
    assert got.dtype == (np.int64 if wide else np.uint32)
    assert np.array_equal(got, np.arange(n))
    assert got.flags.writeable and got.flags.c_contiguous  # shuffled in place next


def test_index_range_refuses_uint32_values_it_cannot_hold():
    with pytest.raises(ValueError, match=r"total must be at most 2\*\*32"):
        _core.index_range(2**32 + 1, False)
    with pytest.raises(OverflowError):
        _core.index_range(-1, True)
