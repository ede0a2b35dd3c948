"""Micro-benchmarks of an elastic resume: an epoch checkpointed at its middle on 8 ranks,
resumed on 6, one new rank's whole rest; beside what a job does without croupier (the
consumed-samples arithmetic over ``torch.randperm``: the epoch's whole permutation, the
consumed prefix cut off, the rest strided over the new ranks). See
``test_bench_distributed.py`` for how groups and ratios work."""

from __future__ import annotations

import pytest

from croupier import DistributedSampler

torch = pytest.importorskip("torch")

OLD, NEW, RANK = 8, 6, 3


def _state(n):
    old = DistributedSampler(n, num_replicas=OLD, rank=0, seed=0)
    old.set_epoch(1)
    old.set_skip(len(old) // 2)
    return old.state_dict()


@pytest.mark.benchmark(group="elastic resume 8 -> 6 at mid-epoch, the rest")
def test_croupier_elastic_rest(benchmark, size):
    state = _state(size["n"])

    def run():
        s = DistributedSampler(size["n"], num_replicas=NEW, rank=RANK, seed=0)
        s.load_state_dict(state)
        return s.indices()

    rest = benchmark(run)
    # Half of every old share consumed; the rest dealt over 6 ranks (torch's padding).
    remaining = size["n"] - len(DistributedSampler(size["n"], OLD, 0)) // 2 * OLD
    assert len(rest) == -(-remaining // NEW)


@pytest.mark.benchmark(group="elastic resume 8 -> 6 at mid-epoch, the rest")
def test_torch_randperm_consumed_samples_rest(benchmark, size):
    n = size["n"]
    consumed = -(-n // OLD) // 2 * OLD

    def run():
        g = torch.Generator().manual_seed(1)
        return torch.randperm(n, generator=g)[consumed:][RANK::NEW].clone()

    benchmark(run)
