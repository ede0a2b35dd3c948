"""BucketBatchSampler in the per-rank order (``order="per_rank"``, the order before the global one):
coverage, budgets, buckets, equal batch counts, resume, state, bad input. The global order's
own tests are in ``test_bucket_global.py``."""

from __future__ import annotations

import functools
import json
import pickle
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import croupier
from croupier import StateError

# Every sampler here is in the per-rank order: fixed batch sizes per bucket, quantile buckets.
BucketBatchSampler = functools.partial(croupier.BucketBatchSampler, order="per_rank")


def _lognormal(n, seed=0, cap=4000):
    rng = np.random.default_rng(seed)
    return np.minimum(rng.lognormal(5, 1, n).astype(np.int64) + 1, cap)


def _bucket_of(boundaries, length):
    return int(np.searchsorted(np.asarray(boundaries), length, side="right"))


# -- coverage, budgets, equal counts --------------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 700),
    w=st.sampled_from([1, 2, 3, 5, 7, 13]),
    batch_size=st.one_of(st.none(), st.integers(1, 40)),
    max_tokens=st.one_of(st.none(), st.integers(50, 3000)),
    buckets=st.integers(1, 9),
    drop_last=st.booleans(),
    seed=st.integers(0, 2**64 - 1),
)
def test_every_index_once_equal_counts_and_budgets(
    n, w, batch_size, max_tokens, buckets, drop_last, seed
):
    if batch_size is None and max_tokens is None:
        batch_size = 7
    lengths = (np.arange(n) * 7919 % 211 + 1).astype(np.int64)
    samplers = [
        BucketBatchSampler(
            lengths,
            batch_size,
            max_tokens=max_tokens,
            buckets=buckets,
            num_replicas=w,
            rank=r,
            seed=seed,
            drop_last=drop_last,
        )
        for r in range(w)
    ]
    per_rank = [list(s) for s in samplers]
    assert len({len(b) for b in per_rank}) == 1, "every rank the same number of batches"
    assert all(len(b) == len(s) for b, s in zip(per_rank, samplers, strict=True))
    bounds = samplers[0].boundaries
    seen = Counter()
    for batches in per_rank:
        for batch in batches:
            assert batch, "no empty batch"
            lens = lengths[batch]
            if batch_size is not None:
                assert len(batch) <= batch_size
            if drop_last and max_tokens is None:
                assert len(batch) == batch_size, "drop_last: only full batches (torch's rule)"
            if max_tokens is not None and lens.max() <= max_tokens:
                assert len(batch) * lens.max() <= max_tokens
            if max_tokens is not None and lens.max() > max_tokens:
                assert len(batch) == 1, "an oversized sample is served alone"
            else:
                assert len({_bucket_of(bounds, x) for x in lens}) == 1, "one bucket per batch"
            seen.update(batch)
    total_batches = sum(b[2] for b in samplers[0].bucket_sizes())
    if drop_last and max_tokens is None:
        # Left out: each bucket's short tail, and the last total % W (full) batches.
        tails = sum(m % size for m, size, _, _ in samplers[0].bucket_sizes())
        assert n - len(seen) == tails + total_batches % w * batch_size
    elif total_batches % w == 0 or not drop_last:
        assert set(seen) == set(range(n)), "every index served"
    if total_batches % w == 0:
        assert all(c == 1 for c in seen.values()), "exactly once when nothing is padded"
    if drop_last:
        assert all(c == 1 for c in seen.values())
    else:  # padding repeats whole batches: at most W - 1 of them
        repeated = sum(c - 1 for c in seen.values())
        assert repeated <= (w - 1) * max(len(b) for r in per_rank for b in r)


def test_fewer_batches_than_ranks():
    s = [BucketBatchSampler([5, 6, 7], 2, num_replicas=5, rank=r, buckets=1) for r in range(5)]
    assert [len(x) for x in s] == [1] * 5  # 2 batches, padded to one per rank
    d = [
        BucketBatchSampler([5, 6, 7], 2, num_replicas=5, rank=r, buckets=1, drop_last=True)
        for r in range(5)
    ]
    assert [len(list(x)) for x in d] == [0] * 5


def test_single_bucket_data():
    s = BucketBatchSampler([9] * 100, 10, num_replicas=2, rank=0)
    assert s.boundaries == [] and len(s) == 5
    assert all(len(b) == 10 for b in s)


def test_quantile_boundaries_and_given_boundaries():
    lengths = np.arange(1, 1001)
    s = BucketBatchSampler(lengths, 8, buckets=4)
    assert s.boundaries == [251, 501, 751]
    t = BucketBatchSampler(lengths, 8, buckets=[100, 900])
    assert t.boundaries == [100, 900]
    sizes = t.bucket_sizes()
    assert [b[0] for b in sizes] == [99, 800, 101, 0]  # the last entry: oversized samples
    assert [b[3] for b in sizes[:3]] == [99, 899, 1000]


def test_token_budget_sizes_and_multiples():
    lengths = np.full(1000, 100)
    s = BucketBatchSampler(lengths, max_tokens=1000, buckets=1)
    assert {len(b) for b in s} == {10}
    m = BucketBatchSampler(lengths, max_tokens=1000, buckets=1, batch_size_multiple=4)
    assert {len(b) for b in m} <= {8} | {1000 % 8}
    both = BucketBatchSampler(lengths, 6, max_tokens=1000, buckets=1)
    assert max(len(b) for b in both) == 6


def test_oversized_alone_or_refused():
    lengths = [10, 20, 5000, 30, 7000]
    s = BucketBatchSampler(lengths, max_tokens=100, buckets=1, shuffle=False)
    batches = list(s)
    assert [2] in batches and [4] in batches
    with pytest.raises(ValueError, match="index 2"):
        BucketBatchSampler(lengths, max_tokens=100, oversized="error")


def test_batches_shuffled_across_buckets_or_sequential():
    lengths = np.repeat([10, 100, 1000], 400)
    mixed = BucketBatchSampler(lengths, 20, buckets=[50, 500], seed=1)
    order = [int(lengths[b[0]]) for b in mixed]
    assert order != sorted(order)
    seq = BucketBatchSampler(lengths, 20, buckets=[50, 500], seed=1, bucket_order="sequential")
    order = [int(lengths[b[0]]) for b in seq]
    assert order == sorted(order)
    plain = BucketBatchSampler(lengths, 20, buckets=[50, 500], shuffle=False)
    assert next(iter(plain)) == list(range(20))


# -- determinism and epochs ------------------------------------------------------------------------


def test_determinism_and_different_epochs():
    lengths = _lognormal(20_000)
    a = BucketBatchSampler(lengths, max_tokens=4096, num_replicas=2, rank=1, seed=3)
    b = BucketBatchSampler(lengths, max_tokens=4096, num_replicas=2, rank=1, seed=3)
    assert list(a) == list(b)
    b.set_epoch(1)
    assert list(a) != list(b)
    assert list(
        BucketBatchSampler(lengths, max_tokens=4096, num_replicas=2, rank=1, seed=4)
    ) != list(a)


def test_value_stability_pin():
    s = BucketBatchSampler(np.arange(1, 301) % 37 + 1, 4, buckets=3, num_replicas=2, rank=1, seed=5)
    assert list(s)[:3] == PIN


PIN = [[264, 230, 74, 260], [214, 29, 143, 68], [180, 287, 103, 219]]


# -- resume, state, pickling -----------------------------------------------------------------------


def test_resume_at_every_batch():
    lengths = _lognormal(3_000, seed=2)
    s = BucketBatchSampler(lengths, max_tokens=2048, num_replicas=3, rank=2, seed=8)
    whole = list(s)
    assert len(whole) == len(s)
    for p in range(len(s) + 1):
        t = BucketBatchSampler(lengths, max_tokens=2048, num_replicas=3, rank=2, seed=8)
        t.load_state_dict({**s.state_dict(), "position": p})
        assert list(t) == whole[p:]
    u = BucketBatchSampler(lengths, max_tokens=2048, num_replicas=3, rank=2, seed=8)
    u.set_skip(7)
    assert u.batches().tolist() == whole[7:]


def test_state_roundtrip_and_refusals():
    lengths = _lognormal(5_000)
    s = BucketBatchSampler(lengths, 16, num_replicas=2, rank=0, seed=1)
    it = iter(s)
    head = [next(it) for _ in range(10)]
    state = json.loads(json.dumps(s.state_dict()))
    assert state["position"] == 10
    t = BucketBatchSampler(lengths, 16, num_replicas=2, rank=0, seed=1)
    t.load_state_dict(state)
    assert head + list(t) == list(BucketBatchSampler(lengths, 16, num_replicas=2, rank=0, seed=1))
    with pytest.raises(StateError, match="lengths_digest"):
        other = lengths.copy()
        other[0] += 1
        BucketBatchSampler(other, 16, num_replicas=2, rank=0, seed=1).load_state_dict(state)
    with pytest.raises(StateError, match="batch_size"):
        BucketBatchSampler(lengths, 17, num_replicas=2, rank=0, seed=1).load_state_dict(state)


def test_pickling_is_a_checkpoint():
    lengths = _lognormal(5_000)
    s = BucketBatchSampler(lengths, max_tokens=3000, num_replicas=2, rank=1, seed=1)
    it = iter(s)
    [next(it) for _ in range(5)]
    c = pickle.loads(pickle.dumps(s))
    assert c.state_dict() == s.state_dict()
    assert list(c) == list(it)


@pytest.mark.parametrize("workers", [0, 2])
def test_as_a_dataloader_batch_sampler(workers):
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader

    lengths = _lognormal(2_000)
    s = BucketBatchSampler(lengths, max_tokens=4096, num_replicas=2, rank=0, seed=1)
    want = list(s)
    data = torch.arange(len(lengths))
    loader = DataLoader(
        data,
        batch_sampler=s,
        num_workers=workers,
        multiprocessing_context="fork" if workers else None,
    )
    got = [b.tolist() for b in loader]
    assert got == want


def test_given_as_sampler_it_is_refused_naming_batch_sampler():
    # A plain DataLoader batches what a sampler= yields: it would hand the dataset lists of
    # lists. croupier says so, where torch's own error names neither.
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader

    s = BucketBatchSampler(_lognormal(500), max_tokens=4096, num_replicas=1, rank=0, seed=1)
    data = torch.arange(500)
    for kwargs in ({}, {"batch_size": 4}, {"batch_size": 4, "drop_last": True}):
        with pytest.raises(TypeError, match=r"given to a DataLoader as sampler=.*batch_sampler="):
            next(iter(DataLoader(data, sampler=s, **kwargs)))
    assert s.state_dict()["position"] == 0  # nothing consumed
    assert [b.tolist() for b in DataLoader(data, batch_sampler=s)] == list(s)
    # Outside a DataLoader, a BatchSampler built around it on purpose (pairs of batches) is
    # left alone.
    pairs = list(torch.utils.data.BatchSampler(s, 2, drop_last=False))
    assert [b for pair in pairs for b in pair] == list(s)


# -- bad input -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "kwargs", "exc", "match"),
    [
        (([1, 2],), {}, ValueError, "batch_size, max_tokens"),
        (([1, 2], 0), {}, ValueError, "batch_size"),
        (([1, 2], -3), {}, ValueError, "batch_size"),
        (([1, 2],), {"max_tokens": 0}, ValueError, "max_tokens"),
        (([1, 2], 1.5), {}, TypeError, "batch_size"),
        (([[1, 2]], 2), {}, ValueError, "1-D"),
        (([1.0, 2.0], 2), {}, TypeError, "integers"),
        (([1, -2], 2), {}, ValueError, ">= 0"),
        (([], 2), {}, ValueError, "empty"),
        (("abc", 2), {}, TypeError, "lengths"),
        (([1, 2], 2), {"buckets": [5, 5]}, ValueError, "increasing"),
        (([1, 2], 2), {"buckets": [9, 5]}, ValueError, "increasing"),
        (([1, 2], 2), {"buckets": 0}, ValueError, "buckets"),
        (([1, 2], 2), {"buckets": "x"}, TypeError, "buckets"),
        (([1, 2], 2), {"batch_size_multiple": 0}, ValueError, "batch_size_multiple"),
        (([1, 2], 2), {"oversized": "drop"}, ValueError, "oversized"),
        (([1, 2], 2), {"bucket_order": "random"}, ValueError, "bucket_order"),
        (([1, 2], 2), {"num_replicas": 0, "rank": 0}, ValueError, "num_replicas"),
        (([1, 2], 2), {"num_replicas": 2, "rank": 2}, ValueError, "rank"),
        (([1, 2], 2), {"seed": -1}, ValueError, "seed"),
    ],
)
def test_bad_input_is_refused(args, kwargs, exc, match):
    with pytest.raises(exc, match=match):
        BucketBatchSampler(*args, **kwargs)


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 400),
    w=st.integers(1, 5),
    batch_size=st.integers(1, 24),
    multiple=st.sampled_from([1, 2, 8]),
    shuffle=st.booleans(),
    epoch=st.integers(0, 3),
)
def test_drop_last_with_a_batch_size_yields_only_full_batches(
    n, w, batch_size, multiple, shuffle, epoch
):
    """torch's BatchSampler(drop_last=True) promise, per bucket and across ranks: every batch
    holds exactly the batch size (rounded down to the multiple when one fits), at every resume
    position, and every rank yields the same number."""
    lengths = np.arange(n) * 104_729 % 997 + 1
    size = batch_size - batch_size % multiple if batch_size >= multiple else batch_size
    ranks = [
        BucketBatchSampler(
            lengths,
            batch_size,
            buckets=5,
            batch_size_multiple=multiple,
            num_replicas=w,
            rank=r,
            shuffle=shuffle,
            drop_last=True,
        )
        for r in range(w)
    ]
    for s in ranks:
        s.set_epoch(epoch)
    got = [list(s) for s in ranks]
    assert len({len(g) for g in got}) == 1
    assert all(len(b) == size for g in got for b in g)
    whole = got[-1]
    for p in range(len(whole) + 1):
        t = BucketBatchSampler(
            lengths, batch_size, buckets=5, batch_size_multiple=multiple, num_replicas=w,
            rank=w - 1, shuffle=shuffle, drop_last=True,
        )  # fmt: skip
        t.set_epoch(epoch)
        t.set_skip(p)
        assert list(t) == whole[p:]


@settings(max_examples=30, deadline=None)
@given(
    n=st.integers(1, 300), q=st.integers(1, 500), budget=st.integers(50, 5000), w=st.integers(1, 3)
)
def test_quadratic_cost_keeps_every_batch_within_the_budget(n, q, budget, w):
    lengths = [1 + (i * 7919) % 211 for i in range(n)]
    cost = lambda batch: len(batch) * max(lengths[i] + lengths[i] ** 2 / q for i in batch)  # noqa: E731
    seen = []
    for r in range(w):
        s = BucketBatchSampler(lengths, max_tokens=budget, quadratic=q, num_replicas=w, rank=r)
        for b in s:
            assert len(b) == 1 or cost(b) <= budget  # a sample over budget is served alone
            seen += b
    assert set(seen) == set(range(n))
    # Larger batches than the linear cost allows never happen; short samples barely notice.
    linear = BucketBatchSampler(lengths, max_tokens=budget, num_replicas=w, rank=0)
    assert len(
        BucketBatchSampler(lengths, max_tokens=budget, quadratic=q, num_replicas=w, rank=0)
    ) >= len(linear)


def test_quadratic_is_checked_and_part_of_the_state():
    with pytest.raises(ValueError, match="quadratic"):
        BucketBatchSampler([5, 6], max_tokens=100, quadratic=0)
    with pytest.raises(ValueError, match="quadratic"):
        BucketBatchSampler([5, 6], batch_size=2, quadratic=4)
    with pytest.raises(TypeError, match="quadratic"):
        BucketBatchSampler([5, 6], max_tokens=100, quadratic=2.5)
    state = BucketBatchSampler([5, 6, 7], max_tokens=100, quadratic=8).state_dict()
    with pytest.raises(ValueError, match="quadratic"):
        BucketBatchSampler([5, 6, 7], max_tokens=100, quadratic=9).load_state_dict(state)
    # 8 + 64/8 = 16 tokens a sample: 6 per batch of 100; linear: 12.
    assert len(next(iter(BucketBatchSampler([8] * 12, max_tokens=100, quadratic=8)))) == 6
