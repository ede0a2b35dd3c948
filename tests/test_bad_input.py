"""Every refused input gets a ValueError/TypeError naming the argument and its range, before
any work, and a refused state leaves the sampler unchanged."""

import numpy as np
import pytest

from croupier import DistributedSampler


def make(**kw):
    args = {"dataset": 100, "num_replicas": 4, "rank": 1}
    args.update(kw)
    return DistributedSampler(**args)


@pytest.mark.parametrize(
    ("kwargs", "exc", "message"),
    [
        ({"rank": 4}, ValueError, "Invalid rank 4, rank should be in the interval [0, 3] (num"),
        ({"rank": -1}, ValueError, "Invalid rank -1, rank should be in the interval [0, 3] ("),
        (
            {"num_replicas": 0, "rank": 0},
            ValueError,
            "num_replicas must be in [1, 9223372036854775807], got 0",
        ),
        ({"num_replicas": -2, "rank": 0}, ValueError, "num_replicas must be in [1,"),
        ({"num_replicas": 2.0}, TypeError, "num_replicas must be an int, got float"),
        ({"rank": "0"}, TypeError, "rank must be an int, got str"),
        ({"seed": -1}, ValueError, "seed must be in [0, 18446744073709551615], got -1"),
        ({"seed": 2**64}, ValueError, "seed must be in [0, 18446744073709551615]"),
        ({"seed": 1.5}, TypeError, "seed must be an int, got float"),
        ({"seed": True}, TypeError, "seed must be an int, got bool"),
        ({"seed": None}, TypeError, "seed must be an int, got NoneType"),
        (
            {"dataset": object()},
            TypeError,
            "dataset must be a sized object (with __len__) or an int",
        ),
        (
            {"dataset": -5},
            ValueError,
            "dataset given as an int is the number of samples: it must be in [0, 2**63 - 1], "
            "got -5",
        ),
        ({"dataset": 2**63}, ValueError, "number of samples: it must be in [0, 2**63 - 1], got"),
        ({"dataset": True}, TypeError, "dataset must be a sized object"),
        ({"shuffle": "false"}, TypeError, "shuffle must be a bool, got str"),
        ({"drop_last": 1}, TypeError, "drop_last must be a bool, got int"),
        (
            {"order": "random"},
            ValueError,
            "order must be one of ['global', 'per_rank', 'torch'], got 'random'",
        ),
        (
            {"dist_info": "mpi", "num_replicas": None},
            ValueError,
            "dist_info must be None, 'torch', 'jax'",
        ),
        (
            {"dist_info": 3, "num_replicas": None},
            TypeError,
            "dist_info must be None, 'torch', 'jax'",
        ),
    ],
)
def test_constructor_refuses(kwargs, exc, message):
    with pytest.raises(exc) as info:
        make(**kwargs)
    assert message in str(info.value)


@pytest.mark.parametrize("path", ["/data/train.bin", b"/data/train.bin"])
def test_a_path_as_the_dataset_is_refused(path, tmp_path):
    for dataset in (path, tmp_path):
        with pytest.raises(TypeError, match=r"dataset must be a sized dataset .*a path\?"):
            make(dataset=dataset)


def test_dataset_with_a_bad_len_is_refused():
    class Weird:
        def __len__(self):
            return -1

    with pytest.raises(ValueError, match="__len__"):
        make(dataset=Weird())


@pytest.mark.parametrize(
    ("epoch", "exc", "message"),
    [
        (-1, ValueError, "epoch must be in [0, 18446744073709551615], got -1"),
        (2**64, ValueError, "epoch must be in [0, 18446744073709551615]"),
        (1.0, TypeError, "epoch must be an int, got float"),
    ],
)
def test_set_epoch_refuses(epoch, exc, message):
    s = make()
    with pytest.raises(exc) as info:
        s.set_epoch(epoch)
    assert message in str(info.value)
    assert s.epoch == 0


@pytest.mark.parametrize(
    ("skip", "exc", "message"),
    [
        (-1, ValueError, "skip must be in [0, 25], got -1"),
        (26, ValueError, "skip must be in [0, 25], got 26"),
        ("3", TypeError, "skip must be an int, got str"),
    ],
)
def test_set_skip_refuses(skip, exc, message):
    s = make()
    with pytest.raises(exc) as info:
        s.set_skip(skip)
    assert message in str(info.value)
    assert s.state_dict()["position"] == 0


def good_state():
    s = make()
    s.set_epoch(2)
    s.set_skip(3)
    return s.state_dict()


def _with(**changes):
    state = good_state()
    for k, v in changes.items():
        if v is KeyError:
            del state[k]
        else:
            state[k] = v
    return state


@pytest.mark.parametrize(
    ("state", "exc", "message"),
    [
        ([1, 2], TypeError, "state must be a mapping"),
        (_with(position=KeyError), ValueError, "missing keys ['position']"),
        (_with(epoch=KeyError, seed=KeyError), ValueError, "missing keys ['epoch', 'seed']"),
        (_with(epoch="2"), TypeError, "state['epoch'] must be an int, got str"),
        (_with(position=True), TypeError, "state['position'] must be an int, got bool"),
        (_with(position=2.0), TypeError, "state['position'] must be an int, got float"),
        (_with(position=-1), ValueError, "state['position'] must be >= 0, got -1"),
        (_with(epoch=-4), ValueError, "state['epoch'] must be >= 0, got -4"),
        (_with(position=26), ValueError, "state['position'] must be in [0, 25]"),
        (_with(shuffle="yes"), TypeError, "state['shuffle'] must be a bool, got str"),
        (
            _with(seed=5),
            ValueError,
            "different configuration: seed: state has 5, this sampler has 0",
        ),
        (
            _with(seed=3, dataset_len=99),
            ValueError,
            "dataset_len: state has 99, this sampler has 100; "
            "seed: state has 3, this sampler has 0",
        ),
        (_with(rank="1"), TypeError, "state['rank'] must be an int, got str"),
        (_with(rank=4), ValueError, "state['rank'] must be in [0, 3], got 4"),
        (_with(num_replicas=0), ValueError, "state['num_replicas'] must be in [1,"),
        (
            _with(elastic={"origin_num_replicas": 8}),
            ValueError,
            "state['elastic'] must be a mapping with keys 'origin_num_replicas', 'offset' "
            "and 'resumed_at'",
        ),
        (
            _with(elastic={"origin_num_replicas": 8, "offset": 101, "resumed_at": 0}),
            ValueError,
            "state['elastic']['offset'] must be in [0, 100], got 101",
        ),
        (_with(num_replicas=8, position=14), ValueError, "state['position'] must be in [0, 13]"),
        (_with(drop_last=True), ValueError, "drop_last: state has True, this sampler has False"),
        (_with(order="torch"), ValueError, "order: state has 'torch', this sampler has 'global'"),
        (
            _with(version=5),
            ValueError,
            "state['version'] is 5; this croupier reads state versions 1 to 4: it was saved by "
            "a newer croupier, upgrade croupier to load it",
        ),
        (_with(version=0), ValueError, "state['version'] is 0; this croupier reads state"),
        (_with(version="2"), TypeError, "state['version'] must be an int"),
    ],
)
def test_load_state_dict_refuses(state, exc, message):
    s = make()
    s.set_epoch(5)
    s.set_skip(1)
    before = s.state_dict()
    with pytest.raises(exc) as info:
        s.load_state_dict(state)
    assert message in str(info.value)
    assert s.state_dict() == before, "a refused state leaves the sampler unchanged"


def test_refusals_happen_before_any_work(monkeypatch):
    import croupier.samplers.distributed as mod

    calls = []
    real_deal = mod._core.RankShare

    class Deal:
        """Records every call into the core."""

        def __init__(self, **config):
            calls.append("Deal")
            self._real = real_deal(**config)
            self.num_samples, self.total_size = self._real.num_samples, self._real.total_size

        def indices(self, *args):
            calls.append("indices")
            raise AssertionError("no indices are computed while checking arguments")

        first_stop = indices

        def __getattr__(self, name):  # the order's properties and checks: the real ones
            return getattr(self._real, name)

    monkeypatch.setattr(mod._core, "RankShare", Deal)
    for bad in ({"rank": 9}, {"seed": -1}, {"dataset": object()}, {"shuffle": "no"}):
        with pytest.raises((ValueError, TypeError)):
            make(**bad)
    assert calls == [], "bad constructor arguments are refused before the core is called"
    s = make()
    other_seed, bad_position = _with(seed=1), _with(position="1")
    calls.clear()
    with pytest.raises(ValueError):
        s.set_skip(-1)
    with pytest.raises(ValueError):
        s.load_state_dict(other_seed)
    with pytest.raises(TypeError):
        s.load_state_dict(bad_position)
    assert calls == []


def test_numpy_scalars_are_accepted():
    s = make(shuffle=np.True_, drop_last=np.False_, seed=np.uint64(5), rank=np.int32(1))
    assert (s.shuffle, s.drop_last, s.seed, s.rank) == (True, False, 5, 1)
    assert type(s.seed) is int
    with pytest.raises(TypeError, match="seed must be an int, got bool"):
        make(seed=np.True_)
    with pytest.raises(TypeError, match="seed must be an int, got ndarray"):
        make(seed=np.arange(3))


# -- the extremes of every accepted range: served, or refused at construction -------------------

_HUGE_WORLDS = [2**54, 2**54 + 1, 2**55 + 3, 2**62, 2**63 - 1]


def _nemo_dataset(sizes):
    from test_sequential_bucket_sampler import Dataset

    return Dataset(sizes)


@pytest.mark.parametrize("w", _HUGE_WORLDS)
@pytest.mark.parametrize("drop_last", [False, True])
def test_every_accepted_world_size_is_served(w, drop_last):
    """A world size the constructor accepts (up to 2**63 - 1) is dealt with torch's
    arithmetic: with fewer samples than ranks, each rank gets one padded item (or none with
    drop_last), never an internal error (the per-rank order's leaf size once overflowed above
    2**54 ranks)."""
    from croupier import BucketBatchSampler, MixtureSampler, SequentialBucketSampler

    n = 10
    for r in sorted({0, 1, n, w - 1}):
        for order in ("per_rank", "torch"):
            for shuffle in (True, False):
                s = DistributedSampler(
                    n, num_replicas=w, rank=r, drop_last=drop_last, order=order, shuffle=shuffle
                )
                got = s.indices().tolist()
                assert len(got) == len(s) == (0 if drop_last else 1)
                assert all(0 <= x < n for x in got)
                if not shuffle and got:
                    assert got == [r % n]  # padding repeats the head of 0..n-1
            b = SequentialBucketSampler(
                _nemo_dataset([3, 7]), base_batch_size=2, num_replicas=w, rank=r,
                drop_last=drop_last, order="fast" if order == "per_rank" else order,
            )  # fmt: skip
            assert len(list(b)) == len(b)
        # The per-rank order pads each dataset's pass (one of each per rank), the global order
        # the global sequence (one index per rank).
        for order, want in (("per_rank", 2), ("global", 1)):
            m = MixtureSampler(
                [0, 4, 10], [1.0, 2.0], num_replicas=w, rank=r, drop_last=False, order=order
            )
            got = m.indices().tolist()
            assert len(got) == len(m) == want and all(0 <= x < 10 for x in got)
        k = BucketBatchSampler(
            np.arange(1, n + 1), batch_size=2, num_replicas=w, rank=r, drop_last=drop_last
        )
        # One batch, the one at global position r of the (padded) sequence, or none.
        one = list(BucketBatchSampler(np.arange(1, n + 1), batch_size=2, num_replicas=1, rank=0))
        assert list(k) == ([] if drop_last else [one[r % len(one)]])


@pytest.mark.parametrize("w", [2**54 + 1, 2**63 - 1])
def test_an_epoch_moves_to_and_from_a_huge_world(w):
    """Elastic resume into a world of more ranks than samples, and back."""
    n = 10
    first = [DistributedSampler(n, num_replicas=3, rank=r, seed=2) for r in range(3)]
    taken = [next(iter(s)) for s in first]
    state = first[0].state_dict()
    for r in (0, 6, w - 1):
        s = DistributedSampler(n, num_replicas=w, rank=r, seed=2)
        s.load_state_dict(state)
        got = s.indices().tolist()
        assert len(got) == 1 and got[0] not in taken if r < n - 3 else len(got) == 1
    rest = [DistributedSampler(n, num_replicas=w, rank=r, seed=2) for r in range(n - 3)]
    for s in rest:
        s.load_state_dict(state)
    assert sorted(taken + [x for s in rest for x in s]) == list(range(n))
    back = DistributedSampler(n, num_replicas=3, rank=1, seed=2)
    done = rest[0]
    list(done)
    back.load_state_dict(done.state_dict())
    assert list(back) == []  # the epoch was finished in the huge world


@pytest.mark.parametrize("value", [2**63, 2**64, 2**100])
def test_sequential_bucket_batch_sizes_beyond_the_core_are_refused(value):
    from croupier import SequentialBucketSampler

    with pytest.raises(ValueError, match=r"base_batch_size must be in \[1, 9223372036854775807\]"):
        SequentialBucketSampler(_nemo_dataset([3, 4]), base_batch_size=value)
    # A dynamic size scaled beyond the range by a small resolution is refused, naming the bucket.
    # (With the dataset's calculator, and with the built-in rule when it has none.)
    for calculator in (True, False):
        ds = _nemo_dataset([3, 4])
        if not calculator:
            del ds.calculator
        with pytest.raises(ValueError, match=r"bucket 'b0'.* \[1, 9223372036854775807\]"):
            SequentialBucketSampler(
                ds, base_batch_size=2**63 - 1, dynamic_batch_size=True,
                base_resolution=(4096, 4096),
            )  # fmt: skip
    s = SequentialBucketSampler(_nemo_dataset([3, 4]), base_batch_size=2**63 - 1, drop_last=False)
    assert [len(b) for b in s] == [3, 4] or [len(b) for b in s] == [4, 3]


@pytest.mark.parametrize(
    "lengths",
    [
        [2**63, 1],  # numpy holds this list as float64 (rounded)
        [2**64 - 1, 3, 2**63 + 1],  # and this one too
        np.array([2**64 - 1, 3, 2**63 + 1], dtype=object),
    ],
)
def test_lengths_as_python_ints_up_to_2_64_are_accepted_like_a_uint64_array(lengths):
    """A list of Python ints up to 2**64 - 1 is the uint64 array of the same values."""
    from croupier import BucketBatchSampler

    as_array = np.array([int(x) for x in lengths], dtype=np.uint64)
    got = BucketBatchSampler(lengths, batch_size=2, buckets=2)
    want = BucketBatchSampler(as_array, batch_size=2, buckets=2)
    assert got.boundaries == want.boundaries
    assert got.state_dict() == want.state_dict()  # the lengths' digest included
    assert [list(b) for b in got] == [list(b) for b in want]


@pytest.mark.parametrize(
    ("lengths", "exc", "message"),
    [
        (
            [-1, 2**63],
            ValueError,
            r"lengths must be >= 0 \(in \[0, 2\*\*64 - 1\]\), got -1 at index 0",
        ),
        ([3, -5], ValueError, r"lengths must be >= 0 \(in \[0, 2\*\*64 - 1\]\), got -5 at index 1"),
        (np.array([3, -5]), ValueError, r"lengths must be >= 0 \(in \[0, 2\*\*64 - 1\]\), got -5"),
        (
            [1, 2**64],
            ValueError,
            r"lengths must be < 2\*\*64 \(in \[0, 2\*\*64 - 1\]\), got 18446744073709551616",
        ),
        ([2**63, 1.5], TypeError, "lengths must hold integers, got float at index 1"),
        ([1.5, 2], TypeError, "lengths must hold integers, got float at index 0"),
        ([True, False], TypeError, "lengths must hold integers, got dtype bool"),
        ([2**63, None], TypeError, "lengths must hold integers, got NoneType at index 1"),
        (["1", "2"], TypeError, "lengths must hold integers"),
        ([2**63, "1"], TypeError, "lengths must hold integers"),
        ([[1], [2, 3]], TypeError, "lengths must hold integers, got list at index 0"),
        ([[1, 2], [3, 4]], ValueError, "lengths must be 1-D"),
        (np.array([1.0, 2.0]), TypeError, "lengths must hold integers, got dtype float64"),
    ],
)
def test_bad_lengths_are_refused_with_the_argument_and_its_range(lengths, exc, message):
    from croupier import BucketBatchSampler

    with pytest.raises(exc, match=message):
        BucketBatchSampler(lengths, batch_size=2)
