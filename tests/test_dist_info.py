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


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"RANK": "1"}, "WORLD_SIZE is unset"),
        ({"WORLD_SIZE": "2"}, "RANK is unset"),
        ({"RANK": "x", "WORLD_SIZE": "2"}, "RANK and WORLD_SIZE must be integers"),
        ({"RANK": "4", "WORLD_SIZE": "2"}, "rank must be in [0, 1], got 4"),
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
    with pytest.raises(ValueError, match=r"rank must be in \[0, 3\], got 7"):
        ranks(dist_info=lambda: (7, 4))


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
