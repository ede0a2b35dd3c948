"""The loading compat layers: kempnerforge's data API (names, signatures, defaults from seed
files 000/001), torchdata's StatefulDistributedSampler, and croupier samplers under torchdata's
own StatefulDataLoader."""

from __future__ import annotations

import inspect
import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
torchdata_sampler = pytest.importorskip("torchdata.stateful_dataloader.sampler")
from torchdata.stateful_dataloader import StatefulDataLoader as TorchdataLoader  # noqa: E402

from croupier import (  # noqa: E402
    BucketBatchSampler,
    DistributedSampler,
    MixtureSampler,
    StateError,
)
from croupier.compat import kempnerforge as kf  # noqa: E402
from croupier.compat.torchdata import StatefulDistributedSampler  # noqa: E402

# torchdata's loader calls torch.set_vital, which newer torch releases deprecate.
pytestmark = pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning")


class Ids(torch.utils.data.Dataset):
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return i


# kempnerforge.data's signatures, as seed file 001 documents them (parameter, default).
_NO = inspect.Parameter.empty
KEMPNERFORGE_SIGNATURES = {
    "DistributedSampler": [
        ("dataset", _NO),
        ("num_replicas", None),
        ("rank", None),
        ("shuffle", True),
        ("seed", 0),
        ("drop_last", True),
    ],
    "MixtureSampler": [
        ("cumulative_sizes", _NO),
        ("weights", _NO),
        ("num_replicas", None),
        ("rank", None),
        ("shuffle", True),
        ("seed", 0),
        ("drop_last", True),
        ("temperature", 1.0),
    ],
    "StatefulDataLoader": [
        ("dataset", _NO),
        ("batch_size", _NO),
        ("sampler", None),
        ("config", None),
    ],
    "MemoryMappedDataset": [
        ("data_dir", _NO),
        ("seq_len", _NO),
        ("file_pattern", "*.npy"),
        ("pack_sequences", False),
        ("eos_token_id", None),
    ],
    "HuggingFaceDataset": [
        ("dataset_name", _NO),
        ("split", _NO),
        ("text_field", _NO),
        ("seq_len", _NO),
        ("tokenizer_path", _NO),
        ("dataset_config", None),
        ("pack_sequences", False),
    ],
}


@pytest.mark.parametrize("name", sorted(KEMPNERFORGE_SIGNATURES))
def test_kempnerforge_names_signatures_and_defaults(name):
    cls = getattr(kf, name)
    params = [
        (p.name, p.default)
        for p in inspect.signature(cls.__init__).parameters.values()
        if p.name != "self" and p.kind is p.POSITIONAL_OR_KEYWORD
    ]
    assert params == KEMPNERFORGE_SIGNATURES[name]
    for method in ("state_dict", "load_state_dict"):
        assert callable(getattr(cls, method))


def test_kempnerforge_sampler_yields_its_order_and_state_keys():
    for n, w in [(100, 3), (7, 4), (1000, 8)]:
        for r in range(w):
            ours = kf.DistributedSampler(n, w, r, seed=9)
            ref = torch.utils.data.DistributedSampler(Ids(n), w, r, seed=9, drop_last=True)
            for epoch in (0, 3):
                ours.set_epoch(epoch)
                ref.set_epoch(epoch)
                assert list(ours) == list(ref)
    state = kf.DistributedSampler(100, 3, 1, seed=9).state_dict()
    assert {"epoch", "seed", "num_replicas", "rank"} <= set(state)
    loaded = kf.DistributedSampler(100, 3, 1, seed=9)
    loaded.load_state_dict({"epoch": 4, "seed": 9, "num_replicas": 3, "rank": 1})
    assert loaded.epoch == 4
    with pytest.raises(StateError, match="seed"):
        loaded.load_state_dict({"epoch": 4, "seed": 8, "num_replicas": 3, "rank": 1})


@pytest.mark.filterwarnings("ignore:This DataLoader will create 4 worker:UserWarning")
def test_kempnerforge_loader_defaults():
    loader = kf.StatefulDataLoader(Ids(100), 8)
    assert (loader.num_workers, loader.pin_memory, loader.prefetch_factor) == (4, True, 2)
    assert loader.persistent_workers and loader.drop_last
    assert isinstance(loader.source, kf.DistributedSampler) and loader.source.drop_last
    assert kf.DataConfig() == kf.DataConfig(num_workers=4, pin_memory=True, prefetch_factor=2)
    plain = kf.StatefulDataLoader(Ids(100), 8, config=kf.DataConfig(num_workers=0))
    assert not plain.persistent_workers and plain.prefetch_factor is None


def test_kempnerforge_loader_checkpoint_before_the_first_batch(tmp_path):
    # The trap of kempnerforge's own loader: 2 workers prefetch 4 batches before the first is
    # consumed; a checkpoint then must resume at batch 0, and after k batches at batch k.
    config = kf.DataConfig(num_workers=2, pin_memory=False)

    def make():
        return kf.StatefulDataLoader(Ids(200), 8, kf.DistributedSampler(200, 2, 0), config)

    straight = [b.tolist() for b in make()]
    for k in (0, 1, 5, len(straight) - 1):
        loader = make()
        it = iter(loader)
        head = [next(it).tolist() for _ in range(k)]
        state = json.loads(json.dumps(loader.state_dict()))
        del it
        resumed = make()
        resumed.load_state_dict(state)
        assert head + [b.tolist() for b in resumed] == straight, k


def test_torchdata_sampler_names_and_indices():
    for n, w, drop in [(100, 3, False), (101, 4, True), (5, 8, False)]:
        for r in range(w):
            ours = StatefulDistributedSampler(n, w, r, seed=4, drop_last=drop)
            ref = torchdata_sampler.StatefulDistributedSampler(Ids(n), w, r, seed=4, drop_last=drop)
            ours.set_epoch(2)
            ref.set_epoch(2)
            assert list(ours) == list(ref)
    s = StatefulDistributedSampler(100, 2, 0)
    assert s.yielded == 0 and s.next_yielded is None
    it = iter(s)
    for _ in range(7):
        next(it)
    assert s.yielded == 7 and s.state_dict()["yielded"] == 7
    s.next_yielded = 10
    assert s.next_yielded == 10 and s.indices().tolist() == list(s)[0:] and s.yielded == 50


def test_a_state_torchdata_saved_loads_mid_epoch():
    n, w, r = 1000, 4, 3
    ref = torchdata_sampler.StatefulDistributedSampler(Ids(n), w, r, seed=1)
    ref.set_epoch(5)
    it = iter(ref)
    head = [next(it) for _ in range(77)]
    saved = ref.state_dict()
    assert saved == {"yielded": 77}
    rest = list(it)
    for state in (saved, {**saved, "epoch": 5}):
        ours = StatefulDistributedSampler(n, w, r, seed=1)
        ours.set_epoch(5)
        ours.load_state_dict(state)
        assert ours.next_yielded == 77 and list(ours) == rest
    ours = StatefulDistributedSampler(n, w, r, seed=1)
    ours.set_epoch(5)
    assert list(ours)[:77] == head
    for bad, error in [
        ({"yielded": -1}, ValueError),
        ({}, ValueError),
        ({"yielded": 10**6}, ValueError),
    ]:
        with pytest.raises(error):
            ours.load_state_dict(bad)


def _under_torchdata(kind, workers):
    ds = Ids(120)
    if kind == "distributed":
        return TorchdataLoader(
            ds, 6, sampler=DistributedSampler(ds, 2, 1, seed=2), num_workers=workers
        )
    if kind == "mixture":
        sampler = MixtureSampler([0, 40, 120], [0.7, 0.3], 2, 0, seed=2)
        return TorchdataLoader(ds, 5, sampler=sampler, num_workers=workers)
    lengths = np.random.default_rng(1).integers(1, 100, size=120)
    sampler = BucketBatchSampler(lengths, max_tokens=400, buckets=3, num_replicas=2, rank=1)
    return TorchdataLoader(ds, batch_sampler=sampler, num_workers=workers)


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("kind", ["distributed", "mixture", "buckets"])
def test_croupier_samplers_resume_under_torchdatas_loader(kind, workers):
    straight = [b.tolist() for b in _under_torchdata(kind, 0)]
    for k in range(0, len(straight) + 1, 3 if workers else 1):
        loader = _under_torchdata(kind, workers)
        it = iter(loader)
        head = [next(it).tolist() for _ in range(k)]
        state = loader.state_dict()
        del it
        resumed = _under_torchdata(kind, workers)
        resumed.load_state_dict(state)
        assert head + [b.tolist() for b in resumed] == straight, f"resumed after batch {k}"
