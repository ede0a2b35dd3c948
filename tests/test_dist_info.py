"""Where num_replicas and rank come from: explicit arguments, torch.distributed, the
environment, jax, or a callable."""

import importlib.util

import pytest

from croupier import DistributedSampler


def ranks(**kw):
    s = DistributedSampler(100, **kw)
    return s.num_replicas, s.rank


def test_default_is_rank_0_of_1():
    assert ranks() == (1, 0)


def test_environment(monkeypatch):
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "8")
    assert ranks() == (8, 3)
    assert ranks(rank=5) == (8, 5), "explicit values win over the environment"
    assert ranks(num_replicas=4) == (4, 3)


@pytest.mark.parametrize("cls", ["DistributedSampler", "MixtureSampler", "BucketBatchSampler"])
def test_num_replicas_without_rank_or_a_source_of_it_is_refused(cls):
    """As torch refuses it: several processes built this way would all be rank 0 and train on
    the same share. One replica is safe (rank 0 is the only one)."""
    import croupier

    make = {
        "DistributedSampler": lambda **kw: croupier.DistributedSampler(100, **kw),
        "MixtureSampler": lambda **kw: croupier.MixtureSampler([0, 50, 100], [1.0, 1.0], **kw),
        "BucketBatchSampler": lambda **kw: croupier.BucketBatchSampler(
            list(range(1, 101)), 8, **kw
        ),
    }[cls]
    with pytest.raises(ValueError, match=r"rank is needed with num_replicas=4: .*pass rank="):
        make(num_replicas=4)
    assert make(num_replicas=1).rank == 0
    assert make(num_replicas=4, rank=2).rank == 2
    assert make(num_replicas=4, dist_info=lambda: (3, 8)).rank == 3


def test_kempnerforges_samplers_keep_its_rank_0():
    """kempnerforge's samplers take rank 0 when no process group gives one: the drop-ins
    keep that (croupier's own classes refuse, see above)."""
    kempnerforge = pytest.importorskip("croupier.compat.kempnerforge")
    assert kempnerforge.DistributedSampler(100, 2).rank == 0
    assert kempnerforge.MixtureSampler([0, 10, 20], [1, 1], num_replicas=2).rank == 0


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"RANK": "1"}, "WORLD_SIZE is unset"),
        ({"WORLD_SIZE": "2"}, "RANK is unset"),
        ({"RANK": "x", "WORLD_SIZE": "2"}, "RANK and WORLD_SIZE must be integers"),
        ({"RANK": "4", "WORLD_SIZE": "2"}, "Invalid rank 4, rank should be in the interval [0, 1]"),
    ],
)
def test_bad_environment(monkeypatch, env, message):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(ValueError) as info:
        ranks()
    assert message in str(info.value)


def test_callable():
    assert ranks(dist_info=lambda: (2, 4)) == (4, 2)
    with pytest.raises(TypeError, match=r"must return a \(rank, world_size\) tuple"):
        ranks(dist_info=lambda: 3)
    with pytest.raises(
        ValueError, match=r"Invalid rank 7, rank should be in the interval \[0, 3\]"
    ):
        ranks(dist_info=lambda: (7, 4))


def test_callable_results_are_integers_not_bools():
    import numpy as np

    from croupier import ChunkSampler

    assert ranks(dist_info=lambda: (np.int64(1), np.int64(4))) == (4, 1)
    s = ChunkSampler(4, 1, 4, dist_info=lambda: (np.int32(1), np.uint8(2)))
    assert (s.num_replicas, s.rank) == (2, 1) and type(s.rank) is int
    for bad in [lambda: (True, 2), lambda: (0, True), lambda: (1.0, 2), lambda: ("1", 2)]:
        with pytest.raises(TypeError, match=r"dist_info\(\) (rank|world_size) must be an int"):
            ranks(dist_info=bad)


def test_torch_required_but_not_initialised():
    pytest.importorskip("torch")
    with pytest.raises(ValueError, match=r"torch\.distributed is not initialised"):
        ranks(dist_info="torch")


@pytest.mark.skipif(importlib.util.find_spec("torch") is not None, reason="torch is installed")
def test_torch_required_but_missing():
    with pytest.raises(ValueError, match="needs torch installed"):
        ranks(dist_info="torch")


@pytest.mark.skipif(importlib.util.find_spec("jax") is not None, reason="jax is installed")
def test_jax_required_but_missing():
    with pytest.raises(ValueError, match="needs jax installed"):
        ranks(dist_info="jax")


def test_initialised_torch_distributed_wins(monkeypatch):
    dist = pytest.importorskip("torch.distributed")
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "8")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        assert ranks() == (1, 0)
        assert ranks(dist_info="torch") == (1, 0)
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize(
    ("var", "value"), [("SLURM_NTASKS", "4"), ("LOCAL_RANK", "2"), ("LOCAL_RANK", "1")]
)
def test_launcher_without_ranks_warns(monkeypatch, var, value):
    monkeypatch.setenv(var, value)
    with pytest.warns(RuntimeWarning, match=f"{var}={value} suggests a multi-process launch"):
        assert ranks() == (1, 0)


@pytest.mark.parametrize(("var", "value"), [("SLURM_NTASKS", "1"), ("LOCAL_RANK", "0")])
def test_single_task_launcher_does_not_warn(monkeypatch, var, value):
    monkeypatch.setenv(var, value)
    assert ranks() == (1, 0)  # filterwarnings = error would fail on a warning


def test_explicit_data_parallel_pair():
    assert ranks(dist_info=(1, 2)) == (2, 1)
    with pytest.raises(ValueError, match="rank should be in the interval"):
        ranks(dist_info=(2, 2))
    with pytest.raises(TypeError, match="dp_rank"):
        ranks(dist_info=(0.5, 2))
    with pytest.raises(ValueError, match="tuple of 3"):
        ranks(dist_info=(0, 1, 2))


_MESH_WORKER = """
import json, sys
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from croupier import DistributedSampler, MixtureSampler
rank, port = int(sys.argv[1]), sys.argv[2]
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=4)
mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
out = {
    "dp": mesh.get_local_rank("dp"),
    "ds": DistributedSampler(1000, dist_info=mesh, seed=3).indices().tolist(),
    "named": DistributedSampler(1000, dist_info=(mesh, "dp"), seed=3).indices().tolist(),
    "mix": MixtureSampler([0, 500, 900], [1, 2], dist_info=mesh).indices().tolist(),
}
print(json.dumps(out))
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_a_2x2_device_mesh_deals_by_its_data_parallel_dimension():
    pytest.importorskip("torch")
    import json
    import socket
    import subprocess
    import sys

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _MESH_WORKER, str(r), str(port)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in range(4)
    ]
    done = [(p, *p.communicate(timeout=300)) for p in procs]
    outs = []
    for p, stdout, stderr in done:
        assert p.returncode == 0, stderr[-2000:]
        outs.append(json.loads(stdout.strip().splitlines()[-1]))
    by_dp = {}
    for o in outs:
        assert o["ds"] == o["named"]
        by_dp.setdefault(o["dp"], []).append(o)
    assert sorted(by_dp) == [0, 1]
    for group in by_dp.values():  # the tensor-parallel pair of a dp rank: identical indices
        assert len(group) == 2
        assert group[0]["ds"] == group[1]["ds"] and group[0]["mix"] == group[1]["mix"]
    a, b = by_dp[0][0]["ds"], by_dp[1][0]["ds"]
    assert not set(a) & set(b) and len(a) + len(b) == 1000  # dp groups disjoint, all covered
