"""Shared pytest setup: hypothesis profiles (no deadlines: CI machines are noisy), the slow
tests' order, the launcher variables kept out."""

import os

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "default", deadline=None, max_examples=60, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile(
    "thorough", deadline=None, max_examples=600, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))

# The slow tests' modules, longest tests first (each a minute or more on 2 cores: the trainer
# runs, Lightning's the longest; torch's randperm at 2**24; the killed and resumed trainings).
# Started first, they do not end the run alone on one worker while the other waits.
LONGEST_FIRST = ("test_trainers.py", "test_torch_order.py", "test_kill_resume.py")


def pytest_collection_modifyitems(items):
    """The slow tests go longest first (a stable sort: the rest keep their order)."""

    def rank(item):
        if item.get_closest_marker("slow") is None:
            return len(LONGEST_FIRST) + 1
        name = item.path.name
        first = LONGEST_FIRST.index(name) if name in LONGEST_FIRST else len(LONGEST_FIRST)
        return first - ("lightning" in item.name) / 2

    items.sort(key=rank)


@pytest.fixture(autouse=True)
def _no_launcher_environment(monkeypatch):
    """Tests decide ranks themselves: a launcher's variables in the outer environment must not
    leak in."""
    for var in (
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "SLURM_NTASKS",
        "OMPI_COMM_WORLD_SIZE",
        "PMI_SIZE",
    ):
        monkeypatch.delenv(var, raising=False)


@pytest.fixture(autouse=True)
def _megatron_unpatched():
    """A test that leaves croupier.compat.megatron.patch() installed (the docs' one-line
    examples do) would turn later comparisons with megatron-core's own builders into
    comparisons of croupier with itself: every patch is undone after each test."""
    yield
    import sys

    indices = sys.modules.get("croupier.compat.megatron.indices")
    if indices is not None:
        indices._undo_all()
