"""Micro-benchmarks of BucketBatchSampler beside the usual Python bucketing (argsort, buckets,
greedy token batches; ``croupier.bench._baselines``) and ``numpy.argsort`` alone, 8 ranks. See
``test_bench_distributed.py`` for how groups and ratios work."""

from __future__ import annotations

import pytest

from croupier import BucketBatchSampler
from croupier.bench._baselines import BUCKETS, MAX_TOKENS, bench_lengths, python_bucket_batches

W = 8
RANK = 3


@pytest.fixture(scope="module")
def lengths(size):
    return bench_lengths(size["n"], 0)


def _sampler(lengths):
    s = BucketBatchSampler(
        lengths, max_tokens=MAX_TOKENS, buckets=BUCKETS, num_replicas=W, rank=RANK, seed=0
    )
    s.set_epoch(1)
    return s


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
    s = _sampler(lengths)
    state = {**s.state_dict(), "position": len(s) // 2}

    def run():
        s.load_state_dict(state)
        return next(iter(s))

    benchmark(run)


@pytest.mark.benchmark(group="bucket batches, resume at mid-epoch, W=8")
def test_python_bucket_resume(benchmark, lengths):
    def run():
        batches = python_bucket_batches(lengths, MAX_TOKENS, BUCKETS, W, RANK, 0, 1)
        return batches[len(batches) // 2]

    benchmark(run)
