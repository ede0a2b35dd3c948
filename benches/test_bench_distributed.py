"""Micro-benchmarks: croupier beside what people use instead, one group per operation.

Run: ``pytest benches --benchmark-only [--bench-size small|large] --benchmark-json=out.json``,
then ``scripts/bench-compare out.json`` to compare each group's ratio with the baseline. Not
part of the default test run (testpaths = tests). Every group holds exactly one
``test_croupier_*`` and at least one alternative (``test_torch_*``, ``test_torchdata_*``,
``test_numpy_*``); the ratio, not the absolute time, is the claim.
"""

from __future__ import annotations

import numpy as np
import pytest

import croupier
from croupier import DistributedSampler

torch = pytest.importorskip("torch")
from torch.utils.data import DistributedSampler as TorchDistributedSampler  # noqa: E402

W = 8
RANK = 3


def _torch_share(n: int, w: int, rank: int, **kw: object) -> list[int]:
    return list(TorchDistributedSampler(range(n), num_replicas=w, rank=rank, seed=0, **kw))


# -- one rank's epoch, 8 ranks ------------------------------------------------------------------


@pytest.mark.benchmark(group="rank epoch as array, W=8")
def test_croupier_indices(benchmark, size):
    n = size["n"]
    got = benchmark(lambda: DistributedSampler(n, num_replicas=W, rank=RANK, seed=0).indices())
    assert len(got) == n // W


@pytest.mark.benchmark(group="rank epoch as array, W=8")
def test_torch_list_of_indices(benchmark, size):
    assert len(benchmark(_torch_share, size["n"], W, RANK)) == size["n"] // W


@pytest.mark.benchmark(group="rank epoch iterated, W=8")
def test_croupier_iterate(benchmark, size):
    n = size["n"]

    def run():
        return sum(1 for _ in DistributedSampler(n, num_replicas=W, rank=RANK, seed=0))

    assert benchmark(run) == n // W


@pytest.mark.benchmark(group="rank epoch iterated, W=8")
def test_torch_iterate(benchmark, size):
    n = size["n"]

    def run():
        return sum(1 for _ in TorchDistributedSampler(range(n), num_replicas=W, rank=RANK, seed=0))

    assert benchmark(run) == n // W


@pytest.mark.benchmark(group="first index, W=8")
def test_croupier_first_index(benchmark, size):
    n = size["n"]
    benchmark(lambda: next(iter(DistributedSampler(n, num_replicas=W, rank=RANK, seed=0))))


@pytest.mark.benchmark(group="first index, W=8")
def test_torch_first_index(benchmark, size):
    n = size["n"]
    benchmark(
        lambda: next(iter(TorchDistributedSampler(range(n), num_replicas=W, rank=RANK, seed=0)))
    )


@pytest.mark.benchmark(group="resume at mid-epoch, W=8")
def test_croupier_resume(benchmark, size):
    n = size["n"]
    saved = DistributedSampler(n, num_replicas=W, rank=RANK, seed=0)
    saved.set_skip(n // W // 2)
    state = saved.state_dict()

    def run():
        s = DistributedSampler(n, num_replicas=W, rank=RANK, seed=0)
        s.load_state_dict(state)
        return next(iter(s))

    benchmark(run)


@pytest.mark.benchmark(group="resume at mid-epoch, W=8")
def test_torchdata_resume(benchmark, size):
    sampler = pytest.importorskip("torchdata.stateful_dataloader.sampler")
    n = size["n"]

    def run():
        s = sampler.StatefulDistributedSampler(range(n), num_replicas=W, rank=RANK, seed=0)
        s.load_state_dict({"yielded": n // W // 2})
        return next(iter(s))

    benchmark(run)


# -- torch's exact order (what benches/torch_order_scale.py measured; at 1e8 and beyond the
# -- same comparison is `croupier bench --systems croupier-torch-order torch-sampler`) ---------


@pytest.mark.benchmark(group="torch's exact order, rank epoch, W=8")
def test_croupier_torch_order(benchmark, size):
    n = size["n"]

    def run():
        return DistributedSampler(n, num_replicas=W, rank=RANK, seed=0, order="torch").indices()

    got = benchmark(run)
    assert got.tolist() == _torch_share(n, W, RANK)


@pytest.mark.benchmark(group="torch's exact order, rank epoch, W=8")
def test_torch_sampler_same_order(benchmark, size):
    assert len(benchmark(_torch_share, size["n"], W, RANK)) == size["n"] // W


# -- the large world sizes ----------------------------------------------------------------------


@pytest.mark.parametrize("w", [64, 1024, 4096])
def test_croupier_indices_many_ranks(benchmark, size, w):
    benchmark.group = f"rank epoch as array, W={w}"
    n = size["wide_n"]
    got = benchmark(lambda: DistributedSampler(n, num_replicas=w, rank=w // 2, seed=0).indices())
    assert len(got) == -(-n // w)


@pytest.mark.parametrize("w", [64, 1024, 4096])
def test_torch_list_of_indices_many_ranks(benchmark, size, w):
    benchmark.group = f"rank epoch as array, W={w}"
    assert len(benchmark(_torch_share, size["wide_n"], w, w // 2)) == -(-size["wide_n"] // w)


# -- full permutations --------------------------------------------------------------------------


@pytest.mark.benchmark(group="full permutation")
def test_croupier_permutation(benchmark, size):
    n = size["perm"]
    assert len(benchmark(croupier.permutation, n)) == n


@pytest.mark.benchmark(group="full permutation")
def test_numpy_permutation(benchmark, size):
    n = size["perm"]
    assert len(benchmark(lambda: np.random.default_rng(0).permutation(n))) == n


@pytest.mark.benchmark(group="full permutation")
def test_torch_randperm(benchmark, size):
    n = size["perm"]
    assert len(benchmark(torch.randperm, n)) == n


@pytest.mark.benchmark(group="full permutation into a reused buffer")
def test_croupier_permutation_into_reused_buffer(benchmark, size):
    buf = np.empty(size["perm"], dtype=np.uint32)
    assert benchmark(croupier.permutation, len(buf), out=buf) is buf


@pytest.mark.benchmark(group="full permutation into a reused buffer")
def test_numpy_shuffle_in_place(benchmark, size):
    buf = np.arange(size["perm"], dtype=np.uint32)
    rng = np.random.default_rng(0)
    benchmark(rng.shuffle, buf)
