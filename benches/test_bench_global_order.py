"""Micro-benchmarks of the world-size-invariant order (``order="global"``, the default) beside
croupier's earlier ``order="per_rank"``: a fresh rank's whole share, its first index, a mid-epoch
resume and an elastic resume ``8 -> 6``. Against torch, the same operations are the groups of
``test_bench_distributed.py`` and ``test_bench_elastic.py`` (whose croupier side is the default,
the global order). See ``test_bench_distributed.py`` for how groups and ratios work."""

from __future__ import annotations

import pytest

from croupier import DistributedSampler

W, RANK = 8, 3
OLD, NEW = 8, 6


def _sampler(n: int, order: str, w: int = W, rank: int = RANK) -> DistributedSampler:
    return DistributedSampler(n, num_replicas=w, rank=rank, seed=0, order=order)


@pytest.mark.benchmark(group="global order vs per-rank order: rank epoch as array, W=8")
def test_croupier_global_share(benchmark, size):
    assert len(benchmark(lambda: _sampler(size["n"], "global").indices())) == size["n"] // W


@pytest.mark.benchmark(group="global order vs per-rank order: rank epoch as array, W=8")
def test_per_rank_order_share(benchmark, size):
    assert len(benchmark(lambda: _sampler(size["n"], "per_rank").indices())) == size["n"] // W


@pytest.mark.benchmark(group="global order vs per-rank order: first index, W=8")
def test_croupier_global_first_index(benchmark, size):
    benchmark(lambda: next(iter(_sampler(size["n"], "global"))))


@pytest.mark.benchmark(group="global order vs per-rank order: first index, W=8")
def test_per_rank_order_first_index(benchmark, size):
    benchmark(lambda: next(iter(_sampler(size["n"], "per_rank"))))


def _resume(n: int, order: str) -> int:
    s = _sampler(n, order)
    s.set_skip(n // W // 2)
    return next(iter(s))


@pytest.mark.benchmark(group="global order vs per-rank order: resume at mid-epoch, W=8")
def test_croupier_global_resume(benchmark, size):
    benchmark(_resume, size["n"], "global")


@pytest.mark.benchmark(group="global order vs per-rank order: resume at mid-epoch, W=8")
def test_per_rank_order_resume(benchmark, size):
    benchmark(_resume, size["n"], "per_rank")


def _elastic(n: int, order: str):
    old = _sampler(n, order, OLD, 0)
    old.set_skip(len(old) // 2)
    state = old.state_dict()

    def run():
        s = _sampler(n, order, NEW, RANK)
        s.load_state_dict(state)
        return s.indices()

    return run


@pytest.mark.benchmark(group="global order vs per-rank order: elastic 8 -> 6, the rest")
def test_croupier_global_elastic_rest(benchmark, size):
    rest = benchmark(_elastic(size["n"], "global"))
    remaining = size["n"] - len(_sampler(size["n"], "global", OLD, 0)) // 2 * OLD
    assert len(rest) == -(-remaining // NEW)


@pytest.mark.benchmark(group="global order vs per-rank order: elastic 8 -> 6, the rest")
def test_per_rank_order_elastic_rest(benchmark, size):
    benchmark(_elastic(size["n"], "per_rank"))
