"""SequentialBucketSampler: NeMo Automodel's semantics, its exact batches with order="torch",
resume, state and bad input."""

from __future__ import annotations

import hashlib
import json
import math
import pickle
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from croupier import SequentialBucketSampler, StateError
from croupier.compat.nemo import SequentialBucketSampler as NemoCompat


class Calculator:
    """NeMo's multi-resolution calculator, as far as the sampler uses it."""

    def get_dynamic_batch_size(self, resolution, base_batch_size, base_resolution):
        area = resolution[0] * resolution[1]
        return max(1, int(base_batch_size * base_resolution[0] * base_resolution[1] / area))


class Dataset:
    """A NeMo-shaped multi-resolution dataset: ``sizes`` samples per bucket, in key order."""

    def __init__(self, sizes, resolutions=None):
        self.sorted_bucket_keys = [f"b{i}" for i in range(len(sizes))]
        self.bucket_groups = {}
        start = 0
        for i, n in enumerate(sizes):
            res = resolutions[i] if resolutions else (256 * (i + 1), 256)
            self.bucket_groups[f"b{i}"] = {
                "indices": list(range(start, start + n)),
                "resolution": res,
                "aspect_name": f"a{i}",
            }
            start += n
        self.calculator = Calculator()


def nemo_reference(ds, base, base_res, drop_last, shuffle_b, shuffle_w, dynamic, seed, w, r, epoch):
    """NeMo's documented algorithm, step by step: one generator seeded ``seed + epoch`` draws
    the bucket order, then each bucket's shuffle; pad by cycling to a multiple of W, stride,
    cut into batches (a short last one dropped with drop_last)."""
    import torch

    g = torch.Generator()
    g.manual_seed(seed + epoch)
    keys = list(ds.sorted_bucket_keys)
    if shuffle_b:
        keys = [keys[i] for i in torch.randperm(len(keys), generator=g).tolist()]
    out = []
    for key in keys:
        group = ds.bucket_groups[key]
        idx = list(group["indices"])
        bs = (
            ds.calculator.get_dynamic_batch_size(group["resolution"], base, base_res)
            if dynamic
            else base
        )
        if shuffle_w:
            idx = [idx[i] for i in torch.randperm(len(idx), generator=g).tolist()]
        total = math.ceil(len(idx) / w) * w
        idx = idx + [idx[i % len(idx)] for i in range(total - len(idx))]
        mine = idx[r::w]
        for i in range(0, len(mine), bs):
            batch = mine[i : i + bs]
            if (drop_last and len(batch) < bs) or not batch:
                continue
            out.append(batch)
    return out


@settings(max_examples=40, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 60), min_size=1, max_size=6),
    base=st.integers(1, 9),
    w=st.sampled_from([1, 2, 3, 5, 8]),
    drop_last=st.booleans(),
    shuffle_b=st.booleans(),
    shuffle_w=st.booleans(),
    dynamic=st.booleans(),
    seed=st.integers(0, 2**31),
    epoch=st.integers(0, 5),
)
def test_torch_order_is_nemos_exactly(
    sizes, base, w, drop_last, shuffle_b, shuffle_w, dynamic, seed, epoch
):
    pytest.importorskip("torch")
    ds = Dataset(sizes)
    for r in range(w):
        s = NemoCompat(
            ds,
            base_batch_size=base,
            base_resolution=(512, 256),
            drop_last=drop_last,
            shuffle_buckets=shuffle_b,
            shuffle_within_bucket=shuffle_w,
            dynamic_batch_size=dynamic,
            seed=seed,
            num_replicas=w,
            rank=r,
        )
        s.set_epoch(epoch)
        want = nemo_reference(
            ds, base, (512, 256), drop_last, shuffle_b, shuffle_w, dynamic, seed, w, r, epoch
        )
        assert list(s) == want
        assert len(s) == len(want)


@pytest.mark.parametrize("order", ["fast", "torch"])
def test_equal_counts_buckets_in_sequence_and_coverage(order):
    if order == "torch":
        pytest.importorskip("torch")
    ds = Dataset([37, 10, 0, 3, 64])
    w = 4
    per_rank = [
        list(SequentialBucketSampler(ds, 4, drop_last=False, num_replicas=w, rank=r, order=order))
        for r in range(w)
    ]
    assert len({len(b) for b in per_rank}) == 1
    seen = Counter(i for batches in per_rank for b in batches for i in b)
    assert set(seen) == set(range(114))
    bucket_of = {i: k for k, g in ds.bucket_groups.items() for i in g["indices"]}
    for batches in per_rank:
        which = []
        for b in batches:
            keys = {bucket_of[i] for i in b}
            assert len(keys) == 1, "a batch holds one bucket"
            which.append(keys.pop())
        runs = [k for i, k in enumerate(which) if i == 0 or which[i - 1] != k]
        assert len(runs) == len(set(which)), "a bucket's batches come one after another"


def test_dynamic_batch_size_by_area():
    ds = Dataset([100, 100], resolutions=[(256, 256), (1024, 1024)])
    ds.calculator = None  # the documented formula: max(1, int(32 * 512 * 512 / area))
    s = SequentialBucketSampler(
        ds, 32, (512, 512), drop_last=False, dynamic_batch_size=True, shuffle_buckets=False
    )
    assert s.get_batch_info(0)["batch_size"] == 128
    assert s.get_batch_info(1)["batch_size"] == 8
    assert [len(b) for b in s] == [100] + [8] * 12 + [4]


def test_get_batch_info_in_sorted_order_and_empty_past_the_end():
    ds = Dataset([10, 20])
    s = SequentialBucketSampler(ds, 5, num_replicas=1, rank=0)
    assert s.get_batch_info(0)["bucket_key"] == "b0"
    assert s.get_batch_info(2)["bucket_key"] == "b1"
    assert s.get_batch_info(len(s)) == {}
    assert s.bucket_keys == ["b0", "b1"] and s.bucket_groups is ds.bucket_groups


def test_given_as_sampler_it_is_refused_naming_batch_sampler():
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader

    s = SequentialBucketSampler(Dataset([10, 20]), 5, num_replicas=1, rank=0)
    data = torch.arange(30)
    with pytest.raises(TypeError, match=r"SequentialBucketSampler is a batch sampler.*batch_sa"):
        next(iter(DataLoader(data, sampler=s)))
    assert [b.tolist() for b in DataLoader(data, batch_sampler=s)] == list(s)


@pytest.mark.parametrize("order", ["fast", "torch"])
def test_resume_at_every_batch_with_nemos_state(order):
    if order == "torch":
        pytest.importorskip("torch")
    ds = Dataset([37, 10, 3, 64])
    s = SequentialBucketSampler(ds, 4, num_replicas=2, rank=1, order=order)
    s.set_epoch(3)
    whole = list(s)
    for p in range(len(whole) + 1):
        t = SequentialBucketSampler(ds, 4, num_replicas=2, rank=1, order=order)
        t.load_state_dict({"epoch": 3, "batches_yielded": p, "extra": "ignored"})
        assert list(t) == whole[p:]
    t = SequentialBucketSampler(ds, 4, num_replicas=2, rank=1, order=order)
    t.load_state_dict({"epoch": 3, "batches_yielded": 5})
    it = iter(t)
    [next(it) for _ in range(3)]
    assert t.state_dict() == {"epoch": 3, "batches_yielded": 8}  # the epoch's position


def test_iteration_starts_lazily_at_the_first_next():
    ds = Dataset([30])
    s = SequentialBucketSampler(ds, 5)
    whole = list(s)
    it = iter(s)
    s.load_state_dict({"epoch": 0, "batches_yielded": 2})  # after iter(), before next()
    assert next(it) == whole[2]


def test_pickling_and_bad_states():
    ds = Dataset([30, 7])
    s = SequentialBucketSampler(ds, 3, num_replicas=2, rank=0)
    it = iter(s)
    [next(it) for _ in range(2)]
    c = pickle.loads(pickle.dumps(s))
    assert c.state_dict() == s.state_dict() == {"epoch": 0, "batches_yielded": 2}
    assert list(c) == list(it)
    with pytest.raises(StateError, match="batches_yielded"):
        s.load_state_dict({"epoch": 1})
    with pytest.raises(ValueError, match="batches_yielded"):
        s.load_state_dict({"epoch": 1, "batches_yielded": len(s) + 1})
    with pytest.raises(TypeError):
        s.load_state_dict({"epoch": "1", "batches_yielded": 0})
    assert s.state_dict()["epoch"] == 0


@pytest.mark.parametrize(
    ("kwargs", "exc", "match"),
    [
        ({"base_batch_size": 0}, ValueError, "base_batch_size"),
        ({"base_batch_size": 2.5}, TypeError, "base_batch_size"),
        ({"base_resolution": (512,)}, TypeError, "base_resolution"),
        ({"base_resolution": (0, 512)}, ValueError, "base_resolution"),
        ({"seed": -1}, ValueError, "seed"),
        ({"drop_last": "no"}, TypeError, "drop_last"),
        ({"order": "random"}, ValueError, "order"),
        ({"num_replicas": 2, "rank": 3}, ValueError, "rank"),
        ({"torch_version": "2.5.1"}, ValueError, "torch_version applies to order='torch'"),
    ],
)
def test_bad_input(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        SequentialBucketSampler(Dataset([5]), **kwargs)


def test_not_a_multiresolution_dataset():
    with pytest.raises(TypeError, match="sorted_bucket_keys"):
        SequentialBucketSampler([1, 2, 3])


# Recorded from nemo_automodel 0.7.0's own SequentialBucketSampler (the wheel from PyPI, run on
# torch 2.15 with the Dataset above): per config, each rank's len() and the first 16 hex digits
# of sha256(json.dumps(list(sampler))).
NEMO_0_7_0 = [
    (
        [37, 10, 0, 3, 64],
        4,
        4,
        False,
        True,
        True,
        False,
        42,
        0,
        [
            (9, "3237514f9fdfbd2c"),
            (9, "0df51bbefbc1b5df"),
            (9, "9b05382868fec6c1"),
            (9, "6b3353fea040d7c1"),
        ],
    ),
    (
        [37, 10, 0, 3, 64],
        4,
        4,
        True,
        True,
        True,
        False,
        42,
        3,
        [
            (6, "65f3e8e121bfb8c9"),
            (6, "aac496a534bf566b"),
            (6, "c4b244238ffbe0d1"),
            (6, "d7bab0d8a266d199"),
        ],
    ),
    (
        [500, 1, 2, 250, 77, 1000],
        8,
        3,
        False,
        True,
        True,
        True,
        7,
        1,
        [(210, "775063992d66ad63"), (210, "b0ef69762ae2b364"), (210, "899e158c732eef86")],
    ),
    (
        [5, 9],
        3,
        8,
        False,
        False,
        True,
        False,
        0,
        0,
        [
            (2, "ab345050d0a7a6f5"),
            (2, "0f7216b8ae3bb25b"),
            (2, "dbd1da4af9810638"),
            (2, "c3c991004fc97e40"),
            (2, "cba933d768cff7f4"),
            (2, "af358fc9c7bd58cc"),
            (2, "274e5dea409b4eaf"),
            (2, "ef42fec22d96466e"),
        ],
    ),
    (
        [300, 200],
        16,
        2,
        True,
        True,
        False,
        False,
        123,
        9,
        [(15, "c8e80bcc4765247a"), (15, "10e693519ed5a006")],
    ),
]


@pytest.mark.parametrize("config", NEMO_0_7_0)
def test_compat_matches_fingerprints_recorded_from_nemo(config):
    sizes, base, w, drop_last, sb, sw, dyn, seed, epoch, ranks = config
    ds = Dataset(sizes)
    for r, (length, digest) in enumerate(ranks):
        s = NemoCompat(
            ds,
            base_batch_size=base,
            base_resolution=(512, 256),
            drop_last=drop_last,
            shuffle_buckets=sb,
            shuffle_within_bucket=sw,
            dynamic_batch_size=dyn,
            seed=seed,
            num_replicas=w,
            rank=r,
        )
        s.set_epoch(epoch)
        batches = list(s)
        assert len(s) == length
        assert hashlib.sha256(json.dumps(batches).encode()).hexdigest()[:16] == digest


@pytest.mark.parametrize("workers", [0, 2])
def test_as_a_dataloader_batch_sampler(workers):
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader

    ds = Dataset([40, 25, 7])
    s = NemoCompat(ds, base_batch_size=4, num_replicas=2, rank=1, drop_last=False)
    want = list(s)
    loader = DataLoader(
        torch.arange(72),
        batch_sampler=s,
        num_workers=workers,
        multiprocessing_context="fork" if workers else None,
    )
    assert [b.tolist() for b in loader] == want


@settings(max_examples=40, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 40), min_size=1, max_size=4),
    w=st.integers(1, 3),
    loaded=st.integers(0, 5),
    then=st.integers(0, 5),
    data=st.data(),
)
def test_a_loaded_skip_and_set_epoch_each_classes_rule(sizes, w, loaded, then, data):
    """NeMo keeps a loaded ``batches_yielded`` until the next iteration, whatever its epoch
    (the compat class does too); croupier's class ties it to the loaded epoch. Both: the skip
    is used once, and the iteration after it is whole."""
    pytest.importorskip("torch")
    ds = Dataset(sizes)
    compat = NemoCompat(ds, base_batch_size=3, num_replicas=w, rank=w - 1, drop_last=False)
    own = SequentialBucketSampler(
        ds, base_batch_size=3, num_replicas=w, rank=w - 1, drop_last=False, order="torch"
    )
    skip = data.draw(st.integers(0, len(own)), label="skip")
    for s in (compat, own):
        s.load_state_dict({"epoch": loaded, "batches_yielded": skip})
        s.set_epoch(then)
        assert s.state_dict()["epoch"] == then

    def nemo(epoch):
        return nemo_reference(ds, 3, (512, 512), False, True, True, False, 42, w, w - 1, epoch)

    assert list(compat) == nemo(then)[skip:]
    assert compat.state_dict() == {"epoch": then, "batches_yielded": len(compat)}
    assert list(own) == nemo(then)[skip if then == loaded else 0 :]
    for s in (compat, own):
        assert list(s) == nemo(then)  # the skip was used once
