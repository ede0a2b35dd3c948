"""Micro-benchmarks of one rank's epoch against torch (run: pytest benches --benchmark-enable).

Not part of the default test run (testpaths = tests). Compare medians within one run; the
ratio is the claim, not the absolute time.
"""

import numpy as np
import pytest
from torch.utils.data import DistributedSampler as TorchDistributedSampler

from croupier import DistributedSampler

N = 1_000_000
W = 8


@pytest.mark.benchmark(group="rank epoch as array, N=1e6 W=8")
def test_croupier_indices(benchmark):
    def run():
        s = DistributedSampler(N, num_replicas=W, rank=3, seed=0)
        return s.indices()

    assert len(benchmark(run)) == N // W


@pytest.mark.benchmark(group="rank epoch as array, N=1e6 W=8")
def test_torch_list_of_indices(benchmark):
    def run():
        return list(TorchDistributedSampler(range(N), num_replicas=W, rank=3, seed=0))

    assert len(benchmark(run)) == N // W


@pytest.mark.benchmark(group="rank epoch iterated, N=1e6 W=8")
def test_croupier_iterate(benchmark):
    def run():
        return sum(1 for _ in DistributedSampler(N, num_replicas=W, rank=3, seed=0))

    assert benchmark(run) == N // W


@pytest.mark.benchmark(group="rank epoch iterated, N=1e6 W=8")
def test_torch_iterate(benchmark):
    def run():
        return sum(1 for _ in TorchDistributedSampler(range(N), num_replicas=W, rank=3, seed=0))

    assert benchmark(run) == N // W


@pytest.mark.benchmark(group="first index, N=1e6 W=8")
def test_croupier_first_index(benchmark):
    benchmark(lambda: next(iter(DistributedSampler(N, num_replicas=W, rank=3, seed=0))))


@pytest.mark.benchmark(group="first index, N=1e6 W=8")
def test_torch_first_index(benchmark):
    def run():
        return next(iter(TorchDistributedSampler(range(N), num_replicas=W, rank=3, seed=0)))

    benchmark(run)


@pytest.mark.benchmark(group="resume at mid-epoch, N=1e6 W=8")
def test_croupier_resume(benchmark):
    saved = DistributedSampler(N, num_replicas=W, rank=3, seed=0)
    saved.set_skip(N // W // 2)
    state = saved.state_dict()

    def run():
        s = DistributedSampler(N, num_replicas=W, rank=3, seed=0)
        s.load_state_dict(state)
        return next(iter(s))

    benchmark(run)


@pytest.mark.benchmark(group="resume at mid-epoch, N=1e6 W=8")
def test_torchdata_resume(benchmark):
    sampler = pytest.importorskip("torchdata.stateful_dataloader.sampler")

    def run():
        s = sampler.StatefulDistributedSampler(range(N), num_replicas=W, rank=3, seed=0)
        s.load_state_dict({"yielded": N // W // 2})
        return next(iter(s))

    benchmark(run)


@pytest.mark.benchmark(group="full permutation, N=1e7")
def test_croupier_permutation(benchmark):
    import croupier

    assert len(benchmark(croupier.permutation, 10_000_000)) == 10_000_000


@pytest.mark.benchmark(group="full permutation, N=1e7")
def test_croupier_permutation_into_reused_buffer(benchmark):
    import croupier

    buf = np.empty(10_000_000, dtype=np.uint32)
    assert benchmark(croupier.permutation, 10_000_000, out=buf) is buf


@pytest.mark.benchmark(group="full permutation, N=1e7")
def test_torch_randperm(benchmark):
    import torch

    assert len(benchmark(torch.randperm, 10_000_000)) == 10_000_000


@pytest.mark.benchmark(group="full permutation, N=1e7")
def test_numpy_permutation(benchmark):
    assert len(benchmark(lambda: np.random.default_rng(0).permutation(10_000_000))) == 10_000_000


@pytest.mark.benchmark(group="torch's exact order, rank epoch as array, N=1e6 W=8")
def test_croupier_torch_order(benchmark):
    def run():
        return DistributedSampler(N, num_replicas=W, rank=3, seed=0, order="torch").indices()

    got = benchmark(run)
    want = list(TorchDistributedSampler(range(N), num_replicas=W, rank=3, seed=0))
    assert got.tolist() == want


@pytest.mark.benchmark(group="torch's exact order, rank epoch as array, N=1e6 W=8")
def test_torch_sampler_same_order(benchmark):
    def run():
        return list(TorchDistributedSampler(range(N), num_replicas=W, rank=3, seed=0))

    assert len(benchmark(run)) == N // W
