"""StatefulDataLoader: a checkpoint names what training consumed (not what workers prefetched),
and a resume continues at exactly the next batch, with any sampler and worker setup."""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch.utils.data import Dataset, IterableDataset  # noqa: E402

from croupier import (  # noqa: E402
    BucketBatchSampler,
    DistributedSampler,
    MixtureSampler,
    SequentialBucketSampler,
    StateError,
    StatefulDataLoader,
)

EPOCHS = 2


class Ids(Dataset):
    """Sample ``i`` is ``i``: the batches a loader yields are the indices its sampler dealt."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return i


class Buckets(Ids):
    """A NeMo-shaped multi-resolution dataset for SequentialBucketSampler."""

    def __init__(self, sizes: list[int]) -> None:
        super().__init__(sum(sizes))
        self.sorted_bucket_keys = [f"b{i}" for i in range(len(sizes))]
        self.bucket_groups = {}
        start = 0
        for i, n in enumerate(sizes):
            self.bucket_groups[f"b{i}"] = {
                "indices": list(range(start, start + n)),
                "resolution": (256 * (i + 1), 256),
                "aspect_name": f"a{i}",
            }
            start += n

        class Calculator:
            def get_dynamic_batch_size(self, resolution, base_batch_size, base_resolution):
                area = resolution[0] * resolution[1]
                return max(1, int(base_batch_size * base_resolution[0] * base_resolution[1] / area))

        self.calculator = Calculator()


def _make(kind: str, **loader_kwargs):
    """A fresh loader of ``kind`` (each call builds the same configuration)."""
    if kind == "distributed":
        ds = Ids(61)
        return StatefulDataLoader(
            ds, 8, sampler=DistributedSampler(ds, 2, 1, seed=5), **loader_kwargs
        )
    if kind == "distributed-drop":
        ds = Ids(61)
        sampler = DistributedSampler(ds, 1, 0, seed=5)
        return StatefulDataLoader(ds, 8, sampler=sampler, drop_last=True, **loader_kwargs)
    if kind == "mixture":
        ds = Ids(90)
        sampler = MixtureSampler([0, 30, 50, 90], [0.5, 0.3, 0.2], 2, 0, seed=1)
        return StatefulDataLoader(ds, 7, sampler=sampler, **loader_kwargs)
    if kind == "buckets":
        lengths = np.random.default_rng(0).integers(1, 200, size=150)
        ds = Ids(150)
        sampler = BucketBatchSampler(lengths, max_tokens=600, buckets=4, num_replicas=2, rank=0)
        return StatefulDataLoader(ds, None, sampler=sampler, **loader_kwargs)
    if kind == "sequential-buckets":
        ds = Buckets([9, 14, 5])
        sampler = SequentialBucketSampler(
            ds, base_batch_size=4, base_resolution=(256, 256), num_replicas=1, rank=0
        )
        return StatefulDataLoader(ds, batch_sampler=sampler, **loader_kwargs)
    raise AssertionError(kind)


def _batches(loader, epochs: int = EPOCHS, stop_after: int | None = None):
    """Runs ``loader`` as a training loop does until its epoch reaches ``epochs`` (or
    ``stop_after`` batches, then returns the state taken right after the last one)."""
    out = []
    while loader.epoch < epochs:
        for batch in loader:
            out.append(batch.tolist())
            if stop_after is not None and len(out) == stop_after:
                return out, loader.state_dict()
    return out, loader.state_dict()


KINDS = ["distributed", "distributed-drop", "mixture", "buckets", "sequential-buckets"]


@pytest.mark.parametrize("kind", KINDS)
def test_resume_at_every_batch_of_two_epochs_without_workers(kind):
    straight, _ = _batches(_make(kind))
    assert len(straight) == EPOCHS * len(_make(kind))
    for k in range(len(straight) + 1):
        head, state = _batches(_make(kind), stop_after=k)
        state = json.loads(json.dumps(state))
        resumed = _make(kind)
        resumed.load_state_dict(state)
        tail, _ = _batches(resumed)
        assert head + tail == straight, f"resumed after batch {k}"


@pytest.mark.parametrize("persistent", [False, True])
@pytest.mark.parametrize("kind", ["distributed", "mixture", "buckets", "sequential-buckets"])
def test_resume_at_every_batch_with_two_workers(kind, persistent):
    # Workers prefetch prefetch_factor * num_workers = 4 batches ahead of training; the state
    # must name what training consumed, so a resume at batch 0 starts at batch 0.
    opts = {"num_workers": 2, "persistent_workers": persistent}
    straight, _ = _batches(_make(kind))
    for k in range(len(straight) + 1):
        loader = _make(kind, **opts)
        head, state = _batches(loader, stop_after=k)
        resumed = _make(kind, **opts)
        resumed.load_state_dict(json.loads(json.dumps(state)))
        tail, _ = _batches(resumed)
        assert head + tail == straight, f"resumed after batch {k}"


def test_checkpoint_before_the_first_batch_is_consumed_skips_nothing():
    # The known trap: with 2 workers the sampler has dealt 4 batches before training sees one.
    loader = _make("distributed", num_workers=2)
    it = iter(loader)
    first = next(it)
    # The workers now hold 3 more batches (and the sampler has dealt 4): none is consumed.
    state = loader.state_dict()
    assert state["batches_yielded"] == 1 and state["sampler"]["position"] == 8
    with pytest.warns(UserWarning, match="Checkpoint the loader instead"):
        assert loader.source.state_dict()["position"] > 8  # the sampler itself ran ahead
    fresh = _make("distributed", num_workers=2)
    fresh_state = fresh.state_dict()
    iter(fresh)  # workers start and prefetch
    assert fresh.state_dict() == fresh_state  # still nothing consumed
    resumed = _make("distributed")
    resumed.load_state_dict(fresh_state)
    assert next(iter(resumed)).tolist() == first.tolist()


def test_resume_twice_in_a_row_and_two_plus_two_epochs_equal_four():
    straight, _ = _batches(_make("mixture"), epochs=4)
    per_epoch = len(_make("mixture"))
    head, state = _batches(_make("mixture"), stop_after=per_epoch + 3)
    second = _make("mixture")
    second.load_state_dict(state)
    middle, state = _batches(second, stop_after=5)
    third = _make("mixture")
    third.load_state_dict(state)
    tail, _ = _batches(third, epochs=4)
    assert head + middle + tail == straight
    # 2 epochs, a checkpoint at the boundary, 2 more epochs in a new loader.
    first_two, state = _batches(_make("mixture"), epochs=2)
    assert state["epoch"] == 2 and state["batches_yielded"] == 0
    rest = _make("mixture")
    rest.load_state_dict(state)
    last_two, _ = _batches(rest, epochs=4)
    assert first_two + last_two == straight


def test_state_is_json_and_round_trips():
    loader = _make("buckets")
    _batches(loader, stop_after=3)
    state = loader.state_dict()
    assert set(state) == {"epoch", "batches_yielded", "sampler"}
    assert json.loads(json.dumps(state)) == state
    other = _make("buckets")
    other.load_state_dict(state)
    assert other.state_dict() == state


def test_epochs_differ_and_set_epoch_reaches_the_sampler():
    loader = _make("distributed")
    first, _ = _batches(loader, epochs=1)
    second, _ = _batches(loader, epochs=2)
    assert first != second and loader.epoch == 2
    loader.set_epoch(7)
    assert loader.source.epoch == 7 and loader.state_dict()["epoch"] == 7
    seven = [b.tolist() for b in loader]
    expected = loader.source  # a fresh sampler at epoch 7 gives the same indices
    direct = DistributedSampler(Ids(61), 2, 1, seed=5)
    direct.set_epoch(7)
    flat = [i for b in seven for i in b]
    assert flat == direct.indices().tolist() and expected.epoch == 7


def test_a_new_iteration_without_a_state_starts_the_epoch_again():
    loader = _make("distributed")
    head, _ = _batches(loader, stop_after=3)
    again = [b.tolist() for b in loader]
    assert again[:3] == head and loader.epoch == 1


def test_set_epoch_of_the_loaded_epoch_keeps_the_position():
    head, state = _batches(_make("distributed"), stop_after=6)  # epoch 1, batch 2 of 4
    assert state["epoch"] == 1 and state["batches_yielded"] == 2
    loader = _make("distributed")
    loader.load_state_dict(state)
    loader.set_epoch(1)  # the usual call at the top of a resumed loop
    tail = [b.tolist() for b in loader]
    straight, _ = _batches(_make("distributed"))
    assert head + tail == straight


def test_kempnerforge_shaped_state_resumes_after_batches_times_batch_size():
    state = {
        "epoch": 1,
        "batches_yielded": 3,
        "sampler": {"epoch": 1, "seed": 5, "num_replicas": 2, "rank": 1},
    }
    loader = _make("distributed")
    loader.load_state_dict(state)
    got = [b.tolist() for b in loader]
    direct = DistributedSampler(Ids(61), 2, 1, seed=5)
    direct.set_epoch(1)
    assert [i for b in got for i in b] == direct.indices()[24:].tolist()
    assert loader.state_dict()["epoch"] == 2


def test_default_sampler_is_a_distributed_sampler_of_the_process_group():
    ds = Ids(20)
    loader = StatefulDataLoader(ds, 4)
    assert isinstance(loader.source, DistributedSampler)
    assert (loader.source.num_replicas, loader.source.rank) == (1, 0)
    flat = sorted(i for b in loader for i in b.tolist())
    assert flat == list(range(20))
    ordered = StatefulDataLoader(ds, 4, shuffle=False)
    assert [i for b in ordered for i in b.tolist()] == list(range(20))


def test_config_object_and_mapping_set_dataloader_options():
    class DataConfig:  # kempnerforge's fields
        num_workers = 2
        pin_memory = False
        prefetch_factor = 3

    ds = Ids(40)
    loader = StatefulDataLoader(ds, 4, config=DataConfig())
    assert (loader.num_workers, loader.prefetch_factor) == (2, 3)
    loader = StatefulDataLoader(ds, 4, config={"num_workers": 0, "prefetch_factor": 3})
    assert loader.num_workers == 0 and loader.prefetch_factor is None
    loader = StatefulDataLoader(ds, 4, config=DataConfig(), num_workers=0)
    assert loader.num_workers == 0  # keyword arguments win


@pytest.mark.filterwarnings("ignore:.*pin_memory.*:UserWarning")
def test_pin_memory_and_prefetch_factor_resume_exactly():
    opts = {"num_workers": 2, "pin_memory": True, "prefetch_factor": 5}
    straight, _ = _batches(_make("distributed"))
    head, state = _batches(_make("distributed", **opts), stop_after=6)
    resumed = _make("distributed", **opts)
    resumed.load_state_dict(state)
    tail, _ = _batches(resumed)
    assert head + tail == straight


def test_bad_arguments_are_refused():
    ds = Ids(10)
    sampler = DistributedSampler(ds, 1, 0)

    class Stream(IterableDataset):
        def __iter__(self):
            return iter(range(3))

    with pytest.raises(TypeError, match="map-style"):
        StatefulDataLoader(Stream(), 2)
    with pytest.raises(ValueError, match="in_order"):
        StatefulDataLoader(ds, 2, sampler=sampler, in_order=False)
    with pytest.raises(ValueError, match="batch_size"):
        StatefulDataLoader(ds, 4, sampler=BucketBatchSampler(np.arange(1, 11), 2))
    with pytest.raises(ValueError, match="not both"):
        StatefulDataLoader(
            ds, None, sampler=sampler, batch_sampler=BucketBatchSampler(np.arange(1, 11), 2)
        )
    with pytest.raises(ValueError, match="shuffle"):
        StatefulDataLoader(ds, 2, sampler=sampler, shuffle=True)
    with pytest.raises(ValueError, match="batch_size"):
        StatefulDataLoader(ds, 0, sampler=sampler)
    with pytest.raises(TypeError, match="batch_size"):
        StatefulDataLoader(ds, 2.0, sampler=sampler)
    with pytest.raises(TypeError, match="config"):
        StatefulDataLoader(ds, 2, sampler=sampler, config="workers=2")
    with pytest.raises(TypeError, match="set_skip"):
        StatefulDataLoader(ds, 2, sampler=torch.utils.data.RandomSampler(ds))


def test_bad_states_are_refused_and_change_nothing():
    loader = _make("distributed")
    _batches(loader, stop_after=3)
    before = loader.state_dict()
    good = dict(before)
    bad = [
        ([], TypeError),
        ({"batches_yielded": 1}, ValueError),
        ({**good, "epoch": -1}, ValueError),
        ({**good, "epoch": 1.0}, TypeError),
        ({**good, "batches_yielded": len(loader) + 1}, ValueError),
        ({**good, "sampler": "x"}, TypeError),
        ({**good, "sampler": {**good["sampler"], "seed": 6}}, StateError),
        ({**good, "sampler": {**good["sampler"], "position": 10**6}}, StateError),
    ]
    for state, error in bad:
        with pytest.raises(error):
            loader.load_state_dict(state)
        assert loader.state_dict() == before


def test_a_plain_dataloader_with_workers_keeps_a_loaded_batch_sampler_position():
    # DataLoader's worker iterator calls iter(batch_sampler) twice and drops the first; the
    # dropped iterator must not consume the loaded position.
    lengths = np.arange(1, 101)
    full = list(BucketBatchSampler(lengths, 4, num_replicas=1, rank=0, seed=2))
    s = BucketBatchSampler(lengths, 4, num_replicas=1, rank=0, seed=2)
    s.load_state_dict({**s.state_dict(), "position": 5})
    loader = torch.utils.data.DataLoader(Ids(100), batch_sampler=s, num_workers=2)
    assert [b.tolist() for b in loader] == full[5:]


def test_an_iteration_dropped_before_its_first_batch_keeps_the_loaded_position():
    # With workers, creating the iterator starts the sampler (prefetching): dropping it before
    # a batch came out must not lose the loaded position. Found by the stateful loader model.
    from croupier import DistributedSampler, StatefulDataLoader

    def make():
        return StatefulDataLoader(
            list(range(48)),
            3,
            DistributedSampler(48, 1, 0, seed=1),
            num_workers=2,
            multiprocessing_context="fork",
        )

    first = make()
    it = iter(first)
    for _ in range(5):
        next(it)
    state = first.state_dict()
    want = next(it).tolist()
    del it
    resumed = make()
    resumed.load_state_dict(state)
    dropped = iter(resumed)
    del dropped
    assert next(iter(resumed)).tolist() == want
    assert resumed.state_dict()["batches_yielded"] == 6


def test_going_back_to_an_epoch_the_loader_finished_after_an_elastic_load_starts_it_whole():
    from croupier import DistributedSampler, StatefulDataLoader

    old = StatefulDataLoader(list(range(45)), 3, DistributedSampler(45, 1, 0, seed=2))
    it = iter(old)
    for _ in range(4):
        next(it)
    state = old.state_dict()
    new = StatefulDataLoader(list(range(45)), 3, DistributedSampler(45, 4, 1, seed=2))
    new.load_state_dict(state)
    assert len(new) == 4 + 3  # the 4 batches of the old world, then this rank's rest
    assert len(list(new)) == 3
    new.set_epoch(0)  # the loader had moved on to epoch 1: epoch 0 again, whole
    whole = DistributedSampler(45, 4, 1, seed=2)
    assert [b.tolist() for b in new] == [
        whole.indices()[i : i + 3].tolist() for i in range(0, len(whole), 3)
    ]


class _ListSampler:
    """A sampler written outside croupier (no croupier base class) that implements the
    resumable protocol over a fixed list, reversed on odd epochs: the loader's checkpoints of
    it must be as exact as of croupier's own."""

    def __init__(self, items):
        self.items, self.epoch, self.num_replicas, self.rank = list(items), 0, 1, 0
        self._pending, self._pos, self._started = 0, 0, False

    def _order(self, epoch):
        return self.items[::-1] if epoch % 2 else self.items

    def __iter__(self):
        start, self._pending = self._pending, 0
        self._pos = start
        for x in self._order(self.epoch)[start:]:
            self._pos += 1
            yield x

    def __len__(self):
        return len(self.items)

    def set_epoch(self, epoch):
        self.epoch = epoch

    def set_skip(self, skip):
        self._pending = skip

    def state_dict(self):
        return {"epoch": self.epoch, "position": self._pos}

    def load_state_dict(self, state):
        self.epoch, self._pending, self._pos = state["epoch"], state["position"], state["position"]

    @property
    def epoch_length(self):
        return len(self.items)

    def next_start(self):
        return self._pending

    def epoch_start(self, epoch):
        return 0

    def state_at(self, epoch, position):
        return {"epoch": epoch, "position": position}

    def elastic_rest(self, epoch):
        return None


@pytest.mark.parametrize("workers", [0, 2])
def test_a_sampler_of_the_resumable_protocol_resumes_exactly(workers):
    """The protocol (croupier.samplers.Resumable) is the loader's whole contract: a sampler
    that is not croupier's but implements it resumes at exactly the next batch, even with
    workers prefetching ahead of training."""
    from croupier.samplers import Resumable

    assert isinstance(_ListSampler(range(3)), Resumable)
    ds = Ids(60)

    def make():
        return StatefulDataLoader(ds, 4, sampler=_ListSampler(range(60)), num_workers=workers)

    whole = []
    loader = make()
    for epoch in range(2):
        loader.set_epoch(epoch)
        whole += [b.tolist() for b in loader]
    for stop in (1, 7, 15, 17, 29):
        loader = make()
        got, it = [], None
        for epoch in range(2):
            loader.set_epoch(epoch)
            it = iter(loader)
            for b in it:
                got.append(b.tolist())
                if len(got) == stop:
                    break
            if len(got) == stop:
                break
        state = loader.state_dict()
        # The sampler's state at the batches trained, not where prefetching workers stand.
        in_epoch = stop - 15 * state["epoch"]
        assert state["sampler"] == {"epoch": state["epoch"], "position": 4 * in_epoch}
        del it
        again = make()
        again.load_state_dict(state)
        epoch = state["epoch"]
        while len(got) < len(whole):
            again.set_epoch(epoch)
            got += [b.tolist() for b in again]
            epoch += 1
        assert got == whole, stop


# -- a sampler's own state behind prefetching workers --------------------------------------------


def test_a_samplers_state_behind_prefetching_workers_warns_once_with_the_fix():
    import warnings

    from torch.utils.data import DataLoader

    fork = {"num_workers": 2, "multiprocessing_context": "fork"}
    s = DistributedSampler(1000, num_replicas=1, rank=0, seed=1)
    it = iter(DataLoader(Ids(1000), batch_size=10, sampler=s, **fork))
    next(it)
    with pytest.warns(
        UserWarning,
        match=r"DistributedSampler\.state_dict\(\) was called while a "
        r"DataLoader with 2 worker processes iterates it.*StatefulDataLoader",
    ) as w:
        ahead = s.state_dict()["position"]
    assert len(w) == 1 and w[0].filename == __file__  # the caller's line
    assert ahead > 10  # what it warns of: one batch trained, more read
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        s.state_dict()  # once per sampler
    del it

    b = BucketBatchSampler([i % 30 + 1 for i in range(600)], 4, num_replicas=1, rank=0)
    it = iter(DataLoader(Ids(600), batch_sampler=b, **fork))
    next(it)
    with pytest.warns(UserWarning, match=r"counts batches training has not.*batch_sampler="):
        b.state_dict()
    del it

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        # No workers: the sampler is read as training goes, its state is exact.
        quiet = DistributedSampler(1000, num_replicas=1, rank=0, seed=1)
        it = iter(DataLoader(Ids(1000), batch_size=10, sampler=quiet))
        next(it)
        assert quiet.state_dict()["position"] == 10
        # The loader's own state counts what training took, whatever the workers read.
        inner = DistributedSampler(1000, num_replicas=1, rank=0, seed=1)
        loader = StatefulDataLoader(Ids(1000), batch_size=10, sampler=inner, **fork)
        it = iter(loader)
        next(it)
        assert loader.state_dict()["sampler"]["position"] == 10
        del it
        # A loop that took the whole epoch: the sampler's state is exact, nothing to say.
        done = DistributedSampler(1000, num_replicas=1, rank=0, seed=1)
        for _ in DataLoader(Ids(1000), batch_size=10, sampler=done, **fork):
            pass
        assert done.state_dict()["position"] == len(done)
