"""Micro-benchmarks of the loading layer: StatefulDataLoader's cost per step beside a plain
DataLoader (with a state snapshot every step), a mid-epoch resume beside torchdata's
StatefulDataLoader with its StatefulDistributedSampler (2 workers each), and
MemoryMappedDataset's random reads beside indexing a numpy.memmap by hand. See
``test_bench_distributed.py`` for how groups and ratios work."""

from __future__ import annotations

import threading
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchdata")
from torch.utils.data import DataLoader, Dataset  # noqa: E402
from torchdata.stateful_dataloader import StatefulDataLoader as TorchdataLoader  # noqa: E402
from torchdata.stateful_dataloader.sampler import StatefulDistributedSampler  # noqa: E402

from croupier import DistributedSampler, MemoryMappedDataset, StatefulDataLoader  # noqa: E402

# torchdata's loader calls torch.set_vital, which newer torch releases deprecate.
pytestmark = pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning")

SEQ = 129  # tokens per sample (a 128-token context)
BATCH = 16
SAMPLES = 20_000  # the token file of the epoch benchmarks
W = 8
RANK = 3


@pytest.fixture(scope="module")
def tokens(tmp_path_factory):
    """A directory with one uint16 token file of SAMPLES samples."""
    path = tmp_path_factory.mktemp("tokens")
    rng = np.random.default_rng(0)
    np.save(path / "shard.npy", rng.integers(0, 50_000, size=SAMPLES * SEQ, dtype=np.uint16))
    return path


class _Ids(Dataset):
    """Sample ``i`` is ``i``: the resume benchmark measures the loader, not the data."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return i


# -- a whole epoch through the loader ---------------------------------------------------------


@pytest.mark.benchmark(group="loader epoch, a state every step")
def test_croupier_loader_epoch(benchmark, tokens):
    ds = MemoryMappedDataset(tokens, SEQ)

    def run():
        loader = StatefulDataLoader(ds, BATCH, sampler=DistributedSampler(ds, 1, 0, seed=1))
        steps = 0
        for _ in loader:
            loader.state_dict()
            steps += 1
        return steps

    assert benchmark(run) == SAMPLES // BATCH


@pytest.mark.benchmark(group="loader epoch, a state every step")
def test_torch_dataloader_epoch_without_state(benchmark, tokens):
    ds = MemoryMappedDataset(tokens, SEQ)

    def run():
        loader = DataLoader(ds, BATCH, sampler=DistributedSampler(ds, 1, 0, seed=1))
        return sum(1 for _ in loader)

    assert benchmark(run) == SAMPLES // BATCH


@pytest.mark.benchmark(group="loader epoch, a state every step")
def test_torchdata_loader_epoch(benchmark, tokens):
    ds = MemoryMappedDataset(tokens, SEQ)

    def run():
        sampler = StatefulDistributedSampler(ds, 1, 0, seed=1)
        loader = TorchdataLoader(ds, BATCH, sampler=sampler, snapshot_every_n_steps=1)
        steps = 0
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torchdata calls a deprecated torch function
            for _ in loader:
                loader.state_dict()
                steps += 1
        return steps

    assert benchmark(run) == SAMPLES // BATCH


# -- resume at mid-epoch, 2 workers -----------------------------------------------------------


def _quiet():
    """Waits for the computations a previous round left running (a sampler computes the rest
    of its epoch on a thread after a resume): each round measures one resume of a quiet
    process, as a restarted training job is."""
    for thread in threading.enumerate():
        if thread.name == "croupier-tail":
            thread.join()


def _resume_first_batch(make, state):
    loader = make()
    loader.load_state_dict(state)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        it = iter(loader)
        batch = next(it)
    del it  # shuts the workers down
    return batch


@pytest.mark.benchmark(group="loader resume at mid-epoch, 2 workers, W=8")
def test_croupier_loader_resume(benchmark, size):
    n = size["n"]
    ds = _Ids(n)

    def make():
        return StatefulDataLoader(ds, BATCH, sampler=DistributedSampler(n, W, RANK), num_workers=2)

    half = n // W // BATCH // 2
    state = {
        "epoch": 0,
        "batches_yielded": half,
        "sampler": {**make().source.state_dict(), "position": half * BATCH},
    }
    batch = benchmark.pedantic(
        _resume_first_batch, (make, state), setup=_quiet, rounds=5, iterations=1
    )
    expected = DistributedSampler(n, W, RANK).indices()[half * BATCH : (half + 1) * BATCH]
    assert batch.tolist() == expected.tolist()


@pytest.mark.benchmark(group="loader resume at mid-epoch, 2 workers, W=8")
def test_torchdata_loader_resume(benchmark, size):
    n = size["n"]
    ds = _Ids(n)

    def make():
        sampler = StatefulDistributedSampler(ds, W, RANK)
        return TorchdataLoader(ds, BATCH, sampler=sampler, num_workers=2)

    half = n // W // BATCH // 2
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loader = make()
        it = iter(loader)
        for _ in range(half):
            next(it)
        state = loader.state_dict()
        del it
    batch = benchmark.pedantic(_resume_first_batch, (make, state), rounds=3, iterations=1)
    assert len(batch) == BATCH


# -- random reads of token samples ------------------------------------------------------------


@pytest.mark.benchmark(group="token samples, random reads")
def test_croupier_memmap_dataset_reads(benchmark, tokens):
    ds = MemoryMappedDataset(tokens, SEQ)
    order = np.random.default_rng(1).permutation(SAMPLES)[:5000].tolist()

    def run():
        total = 0
        for i in order:
            total += len(ds[i]["input_ids"])
        return total

    assert benchmark(run) == 5000 * (SEQ - 1)


@pytest.mark.benchmark(group="token samples, random reads")
def test_numpy_memmap_by_hand(benchmark, tokens):
    data = np.load(tokens / "shard.npy", mmap_mode="r")
    order = np.random.default_rng(1).permutation(SAMPLES)[:5000].tolist()

    def run():
        total = 0
        for i in order:
            t = torch.from_numpy(data[i * SEQ : (i + 1) * SEQ].astype(np.int64))
            sample = {"input_ids": t[:-1], "labels": t[1:]}
            total += len(sample["input_ids"])
        return total

    assert benchmark(run) == 5000 * (SEQ - 1)
