"""Micro-benchmarks of MixtureSampler (its default, the global order) beside kempnerforge's
algorithm (as its documentation describes it, reimplemented in ``croupier.bench._baselines``),
and of the global order beside the per-rank one; 100 datasets, 8 ranks. See
``test_bench_distributed.py`` for how groups and ratios work."""

from __future__ import annotations

import pytest

from croupier import MixtureSampler
from croupier.bench._baselines import KempnerforgeStyleMixture, mixture_args

pytest.importorskip("torch")

W = 8
RANK = 3


@pytest.mark.benchmark(group="mixture rank epoch, 100 datasets, W=8")
def test_croupier_mixture_epoch(benchmark, size):
    cum, weights = mixture_args(size["n"])

    def run():
        s = MixtureSampler(cum, weights, W, RANK, seed=0)
        s.set_epoch(1)
        return s.indices()

    assert len(benchmark(run)) == len(MixtureSampler(cum, weights, W, RANK))


@pytest.mark.benchmark(group="mixture rank epoch, 100 datasets, W=8")
def test_kempnerforge_style_mixture_epoch(benchmark, size):
    cum, weights = mixture_args(size["n"])

    def run():
        s = KempnerforgeStyleMixture(cum, weights, W, RANK, seed=0)
        s.set_epoch(1)
        return list(s)

    benchmark(run)


@pytest.mark.benchmark(group="mixture resume at mid-epoch, 100 datasets, W=8")
def test_croupier_mixture_resume(benchmark, size):
    cum, weights = mixture_args(size["n"])
    fresh = MixtureSampler(cum, weights, W, RANK, seed=0)
    state = {**fresh.state_dict(), "position": len(fresh) // 2}

    def run():
        s = MixtureSampler(cum, weights, W, RANK, seed=0)
        s.load_state_dict(state)
        return next(iter(s))

    benchmark(run)


@pytest.mark.benchmark(group="mixture resume at mid-epoch, 100 datasets, W=8")
def test_kempnerforge_style_mixture_resume(benchmark, size):
    cum, weights = mixture_args(size["n"])
    half = len(KempnerforgeStyleMixture(cum, weights, W, RANK, seed=0)) // 2

    def run():
        s = KempnerforgeStyleMixture(cum, weights, W, RANK, seed=0)
        s.set_skip(half)
        return next(iter(s))

    benchmark(run)


@pytest.mark.benchmark(group="mixture global order vs per-rank order: rank epoch, W=8")
def test_croupier_mixture_global_epoch(benchmark, size):
    cum, weights = mixture_args(size["n"])
    benchmark(lambda: MixtureSampler(cum, weights, W, RANK, seed=0, order="global").indices())


@pytest.mark.benchmark(group="mixture global order vs per-rank order: rank epoch, W=8")
def test_per_rank_order_mixture_epoch(benchmark, size):
    cum, weights = mixture_args(size["n"])
    benchmark(lambda: MixtureSampler(cum, weights, W, RANK, seed=0, order="per_rank").indices())
