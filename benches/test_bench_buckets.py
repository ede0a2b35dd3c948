"""Micro-benchmarks of BucketBatchSampler beside the usual Python bucketing (argsort, buckets,
greedy token batches; ``croupier.bench._baselines``) and ``numpy.argsort`` alone, of its global
order (the default) beside its earlier per-rank order, and, when lhotse is installed, beside
lhotse's ``DynamicBucketingSampler``; 8 ranks. See ``test_bench_distributed.py`` for how groups
and ratios work.

The per-rank order has groups of its own ("... global order vs per-rank order: ..."), as the other
samplers' orders do in ``test_bench_global_order.py``: in the groups against the Python
bucketing, an alternative faster than the Python one would become the group's ratio and fail
``scripts/bench-compare``. lhotse's sampler costs about 50 us a cut (an epoch of the small size,
1e6, takes a minute): its groups run at ``N / 100`` with croupier at the same size, and both
sides skip without lhotse, so that no group is left with croupier alone (which bench-compare
refuses) and the committed baseline's groups are the same with lhotse or without.
"""

from __future__ import annotations

import copy

import pytest

from croupier import BucketBatchSampler
from croupier.bench._baselines import BUCKETS, MAX_TOKENS, bench_lengths, python_bucket_batches

W = 8
RANK = 3
LHOTSE_SHARE = 100  # lhotse's groups run at N / 100


@pytest.fixture(scope="module")
def lengths(size):
    return bench_lengths(size["n"], 0)


def _sampler(lengths, order="global"):
    s = BucketBatchSampler(
        lengths, max_tokens=MAX_TOKENS, buckets=BUCKETS, num_replicas=W, rank=RANK, seed=0,
        order=order,
    )  # fmt: skip
    s.set_epoch(1)
    return s


def _resume(lengths, order="global"):
    """Loading a mid-epoch state into a constructed sampler and taking the next batch."""
    s = _sampler(lengths, order)
    state = {**s.state_dict(), "position": len(s) // 2}

    def run():
        s.load_state_dict(state)
        return next(iter(s))

    return run


def _resumes(lengths, order):
    """Seven resumes, at positions 1/8 to 7/8 of the epoch (each a state loaded into a
    constructed sampler, then the next batch): a resume reads the bucket its batch comes from,
    so one position would time one bucket's size, which differs between the orders."""
    s = _sampler(lengths, order)
    states = [{**s.state_dict(), "position": len(s) * k // 8} for k in range(1, 8)]

    def run():
        out = []
        for state in states:
            s.load_state_dict(state)
            out.append(next(iter(s)))
        return out

    return run


@pytest.mark.benchmark(group="bucket batches, rank epoch, W=8")
def test_croupier_bucket_epoch(benchmark, lengths):
    assert len(benchmark(lambda: _sampler(lengths).batches())) > 0


@pytest.mark.benchmark(group="bucket batches, rank epoch, W=8")
def test_python_bucket_epoch(benchmark, lengths):
    benchmark(lambda: python_bucket_batches(lengths, MAX_TOKENS, BUCKETS, W, RANK, 0, 1))


@pytest.mark.benchmark(group="bucket batches, rank epoch, W=8")
def test_numpy_argsort_alone(benchmark, lengths):
    import numpy as np

    benchmark(lambda: np.argsort(lengths, kind="stable"))


@pytest.mark.benchmark(group="bucket batches, resume at mid-epoch, W=8")
def test_croupier_bucket_resume(benchmark, lengths):
    benchmark(_resume(lengths))


@pytest.mark.benchmark(group="bucket batches, resume at mid-epoch, W=8")
def test_python_bucket_resume(benchmark, lengths):
    def run():
        batches = python_bucket_batches(lengths, MAX_TOKENS, BUCKETS, W, RANK, 0, 1)
        return batches[len(batches) // 2]

    benchmark(run)


# -- the global order beside the per-rank order ----------------------------------------------


@pytest.mark.benchmark(group="bucket batches global order vs per-rank order: rank epoch, W=8")
def test_croupier_bucket_global_epoch(benchmark, lengths):
    assert len(benchmark(lambda: _sampler(lengths, "global").batches())) > 0


@pytest.mark.benchmark(group="bucket batches global order vs per-rank order: rank epoch, W=8")
def test_per_rank_order_bucket_epoch(benchmark, lengths):
    assert len(benchmark(lambda: _sampler(lengths, "per_rank").batches())) > 0


@pytest.mark.benchmark(
    group="bucket batches global order vs per-rank order: resume at mid-epoch, W=8"
)
def test_croupier_bucket_global_resume(benchmark, lengths):
    assert len(benchmark(_resumes(lengths, "global"))) == 7


@pytest.mark.benchmark(
    group="bucket batches global order vs per-rank order: resume at mid-epoch, W=8"
)
def test_per_rank_order_bucket_resume(benchmark, lengths):
    assert len(benchmark(_resumes(lengths, "per_rank"))) == 7


# -- lhotse's DynamicBucketingSampler, when lhotse is installed (N / 100) -----------------------


@pytest.fixture(scope="module")
def lhotse_lengths(size):
    """The lengths of lhotse's groups; skips both sides of them without lhotse."""
    pytest.importorskip("lhotse")
    return bench_lengths(size["n"] // LHOTSE_SHARE, 0)


def _lhotse(lengths):
    from croupier.bench import _lhotse

    cuts = _lhotse.lazy_cuts(lengths)
    return _lhotse, lambda: _lhotse.sampler(cuts, MAX_TOKENS, BUCKETS, W, RANK, seed=0, epoch=1)


@pytest.mark.benchmark(group="bucket batches vs lhotse, rank epoch of N/100, W=8")
def test_croupier_bucket_epoch_lhotse_size(benchmark, lhotse_lengths):
    assert len(benchmark(lambda: _sampler(lhotse_lengths).batches())) > 0


@pytest.mark.benchmark(group="bucket batches vs lhotse, rank epoch of N/100, W=8")
def test_lhotse_dynamic_bucketing_epoch(benchmark, lhotse_lengths):
    lhotse, make = _lhotse(lhotse_lengths)
    assert len(benchmark(lambda: [lhotse.batch_indices(b) for b in make()])) > 0


@pytest.mark.benchmark(group="bucket batches vs lhotse, resume at mid-epoch of N/100, W=8")
def test_croupier_bucket_resume_lhotse_size(benchmark, lhotse_lengths):
    benchmark(_resume(lhotse_lengths))


@pytest.mark.benchmark(group="bucket batches vs lhotse, resume at mid-epoch of N/100, W=8")
def test_lhotse_dynamic_bucketing_resume(benchmark, lhotse_lengths):
    """A constructed sampler loads a mid-epoch checkpoint (lhotse replays the epoch up to it)
    and yields the next batch."""
    lhotse, make = _lhotse(lhotse_lengths)
    ended = make()
    whole = [lhotse.batch_indices(b) for b in ended]
    state = lhotse.mid_epoch_state(ended, whole, len(whole) // 2)
    s = make()

    def run():
        s.load_state_dict(copy.deepcopy(state))  # loading consumes the state
        return lhotse.batch_indices(next(iter(s)))

    assert benchmark(run) == whole[len(whole) // 2]
