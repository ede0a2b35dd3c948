"""Checkpoint format versions: states of every shape croupier shipped load into today's
samplers through the one upgrade table (``croupier.samplers._state.UPGRADES``), or are refused
with what to do.

The frozen states in ``tests/fixtures/states`` were written by the builds named there. The
expected result of each is derived here from today's semantics, not recorded: a state at
position ``p`` of epoch ``e`` continues with a fresh sampler's epoch ``e`` from ``p``; an
elastic rest continues the epoch's global order after what the old ranks consumed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import croupier
from croupier import StateError
from croupier.samplers._state import STATE_VERSION, UPGRADES

pytest.importorskip("torch")

FIXTURES = Path(__file__).parent / "fixtures" / "states"
FILES = sorted(FIXTURES.glob("v*.json"))


def _entries():
    for path in FILES:
        data = json.loads(path.read_text())
        for i, entry in enumerate(data["entries"]):
            yield pytest.param(data["croupier"], entry, id=f"{path.stem}-{i}-{entry['class']}")


def _build(entry, **override):
    args = {**entry["args"], **override}
    name = entry["class"]
    if args.get("order") == "fast":
        args["order"] = "per_rank"  # its name since version 3 ("fast" warns: see below)
    if name == "compat.torchdata.StatefulDistributedSampler":
        from croupier.compat.torchdata import StatefulDistributedSampler

        return StatefulDistributedSampler(**args)
    if name == "ChunkSampler":
        args.pop("n_obs")
    return getattr(croupier, name)(**args)


def _items(sampler):
    return [x if isinstance(x, int) else list(x) for x in sampler]


def _global_order(entry, epoch):
    """The epoch's global order: every rank of the state's world, interleaved (rank r's
    position t is global position t W + r)."""
    w = entry["args"]["num_replicas"]
    ranks = []
    for r in range(w):
        s = _build(entry, rank=r)
        s.set_epoch(epoch)
        ranks.append(_items(s))
    return [ranks[g % w][g // w] for g in range(w * len(ranks[0]))]


def test_the_table_reaches_the_current_version():
    assert [u.version for u in UPGRADES] == list(range(1, STATE_VERSION))
    assert all(u.change for u in UPGRADES)


def test_every_shipped_shape_has_fixtures():
    # One file per shipped shape: 0.1.0, the 0.2.0 development builds before versions 2, 3 and 4.
    assert {p.stem for p in FILES} >= {
        "v1-0.1.0",
        "v1-0.2.0-dev-462f7d5",
        "v2-0.2.0-dev-6486a3f",
        "v3-0.2.0-dev-297200a",
    }


@pytest.mark.parametrize("built_by,entry", list(_entries()))
def test_old_state_loads_to_the_documented_result(built_by, entry):
    state = entry["state"]
    name = entry["class"]
    if name == "StatefulDataLoader":
        _check_loader(entry)
        return
    if name == "ChunkSampler":
        s = _build(entry)
        s.load_state_dict(state)
        assert s.state_dict() == state  # its own format, version 1, unchanged
        return
    if state["num_replicas"] * 1_000_000 < state.get("dataset_len", 0):
        # The 3e8-sample torch-order state: the shape check only (its epoch takes minutes).
        s = _build(entry)
        s.load_state_dict(state)
        assert s.state_dict() == {**state, "version": STATE_VERSION}
        return
    s = _build(entry)
    epoch, position = state["epoch"], state["position"]
    is_fast = name == "DistributedSampler" and state["order"] == "fast" and state["version"] == 1
    if is_fast and "elastic" not in state and 0 < position < len(s):
        # croupier 0.1's fast order is not 0.2's: continuing would give other samples. A
        # version-1 state cannot say which build wrote it, so every one is refused, and the
        # message says how to declare one of a 0.2 development build.
        before = s.state_dict()
        with pytest.raises(StateError, match=r"croupier 0\.1 saved such states") as e:
            s.load_state_dict(state)
        assert "set state['position'] to 0" in str(e.value)
        assert s.state_dict() == before
        if built_by.startswith("0.1"):
            return
        state = {**state, "version": 2}  # as the message says
    carried = name == "BucketBatchSampler" and state.get("order") == "global"
    if carried and state["version"] < 4 and (position > 0 or "elastic" in state):
        # The global bucket order's batches changed in version 4 (carried tails): a place
        # inside an epoch is refused; its epoch's start loads, as the message says.
        before = s.state_dict()
        with pytest.raises(StateError, match="global order's batches changed") as e:
            s.load_state_dict(state)
        assert "set state['position'] to 0 and remove state['elastic']" in str(e.value)
        assert s.state_dict() == before
        state = {k: v for k, v in state.items() if k != "elastic"} | {"position": 0}
        position = 0
    s.load_state_dict(state)
    loaded = s.state_dict()
    assert loaded["version"] == STATE_VERSION
    rest = _items(s)
    if "elastic" not in state:
        fresh = _build(entry)
        if len(state.get("schedule", ())) > 1:
            fresh.set_schedule([tuple(e) for e in state["schedule"]])
        fresh.set_epoch(epoch)
        assert rest == _items(fresh)[position:]
        assert len(s) == position + len(rest)
        upgraded = {**state, "version": STATE_VERSION}
        if state.get("order") == "fast":
            upgraded["order"] = "per_rank"  # version 3's name of the same order
        if name.startswith("compat.torchdata"):
            upgraded = {k: v for k, v in loaded.items() if k in state} | {"version": STATE_VERSION}
        assert {k: loaded[k] for k in upgraded} == upgraded
        return
    # A version-1 elastic rest counted its positions from the rest's start: resumed_at 0.
    el = {"resumed_at": 0, **state["elastic"]}
    assert loaded["elastic"] == el
    assert loaded["position"] == position
    origin = _build(entry, num_replicas=el["origin_num_replicas"], rank=0)
    origin_order = _global_order(
        {**entry, "args": {**entry["args"], "num_replicas": el["origin_num_replicas"]}}, epoch
    )
    del origin
    w = state["num_replicas"]
    remainder = origin_order[el["offset"] :]
    mine = remainder[state["rank"] :: w]
    # Padding (drop_last=False) repeats the rest's head; dropping cuts its tail.
    at = position - el["resumed_at"]  # the rank's place in the rest
    assert rest == mine[at : at + len(rest)] or rest[: len(mine) - at] == mine[at:]
    assert len(s) == position + len(rest)


def _check_loader(entry):
    state = entry["state"]
    sampler = state["sampler"]
    w = sampler["num_replicas"]
    ds = list(range(100))
    loader = croupier.StatefulDataLoader(
        ds, entry["args"]["batch_size"], croupier.DistributedSampler(100, w, sampler["rank"])
    )
    loader.load_state_dict(state)
    got = loader.state_dict()
    assert got["batches_yielded"] == state["batches_yielded"]
    assert got["sampler"]["version"] == STATE_VERSION
    rest = [b.tolist() for b in loader]
    # len: the batches the state records, then those the next iteration yields.
    assert len(loader) == state["batches_yielded"] + len(rest)
    if "elastic" not in sampler:
        fresh = croupier.StatefulDataLoader(
            ds, entry["args"]["batch_size"], croupier.DistributedSampler(100, w, sampler["rank"])
        )
        assert rest == [b.tolist() for b in fresh][state["batches_yielded"] :]


def test_a_newer_version_is_refused_unchanged():
    s = croupier.DistributedSampler(100, 2, 0)
    state = {**s.state_dict(), "version": STATE_VERSION + 1, "position": 3}
    before = s.state_dict()
    with pytest.raises(StateError, match="saved by a newer croupier"):
        s.load_state_dict(state)
    assert s.state_dict() == before


def test_a_0_1_fast_state_at_an_epoch_boundary_loads():
    # Position 0 or the epoch's end names no sample of the old order: both still load.
    s = croupier.DistributedSampler(100, 3, 1, order="per_rank")
    old = {**s.state_dict(), "version": 1, "epoch": 2, "order": "fast"}
    s.load_state_dict({**old, "position": 0})
    assert _items(s) == _items(_fresh_epoch(2))
    s.load_state_dict({**old, "position": 34})
    assert _items(s) == [] and len(s) == 34


def test_a_0_2_dev_fast_state_declared_version_2_loads():
    # Declared version 2, its order 'fast' becomes 'per_rank' (version 3's name).
    s = croupier.DistributedSampler(100, 3, 1, order="per_rank")
    s.set_skip(5)
    state = {**s.state_dict(), "version": 1, "order": "fast"}
    with pytest.raises(StateError, match="set state\\['version'\\] to 2"):
        croupier.DistributedSampler(100, 3, 1, order="per_rank").load_state_dict(state)
    t = croupier.DistributedSampler(100, 3, 1, order="per_rank")
    t.load_state_dict({**state, "version": 2})
    assert _items(t) == _items(_fresh_epoch(0))[5:]


def _fresh_epoch(epoch):
    s = croupier.DistributedSampler(100, 3, 1, order="per_rank")
    s.set_epoch(epoch)
    return s


@pytest.mark.parametrize("name", ["DistributedSampler", "MixtureSampler", "BucketBatchSampler"])
def test_the_old_order_name_warns_and_is_the_same_order(name):
    """``order="fast"`` still constructs the per-rank order, with a DeprecationWarning that
    names the new name; the two samplers yield the same and save the same state, and a state
    naming ``"fast"`` (version 2) loads into either."""
    args = {
        "DistributedSampler": ([100], {}),
        "MixtureSampler": ([[0, 30, 100], [0.5, 0.5]], {}),
        "BucketBatchSampler": ([[(i * 37) % 150 + 1 for i in range(300)]], {"max_tokens": 600}),
    }[name]
    cls = getattr(croupier, name)

    def make(order):
        return cls(*args[0], num_replicas=2, rank=1, order=order, **args[1])

    with pytest.warns(DeprecationWarning, match="order='per_rank'") as caught:
        old = make("fast")
    assert caught[0].filename == __file__  # points at the caller's line
    new = make("per_rank")
    assert old.order == new.order == "per_rank"
    assert _items(old) == _items(new)
    new.set_skip(3)
    state = new.state_dict()
    assert state["order"] == "per_rank" and state["version"] == STATE_VERSION
    fresh = make("per_rank")
    fresh.load_state_dict({**state, "version": 2, "order": "fast"})
    assert fresh.state_dict() == state and _items(fresh) == _items(new)


def test_the_sequential_bucket_samplers_fast_order_keeps_its_name():
    """``SequentialBucketSampler``'s ``"fast"`` (croupier's seekable streams against NeMo's
    ``"torch"``) is not the per-rank order: no warning, no ``"per_rank"``."""
    from croupier._validate import ORDERS

    assert ORDERS["SequentialBucketSampler"] == ("fast", "torch")
    from test_sequential_bucket_sampler import Dataset

    with pytest.raises(ValueError, match=r"order must be one of \['fast', 'torch'\]"):
        croupier.SequentialBucketSampler(
            Dataset([4, 5]), 2, num_replicas=1, rank=0, order="per_rank"
        )


@pytest.mark.parametrize("name", ["DistributedSampler", "MixtureSampler", "BucketBatchSampler"])
def test_a_sampler_pickled_before_the_rename_unpickles_with_the_new_name(name):
    """A DataLoader worker or a pickled checkpoint of the build before the rename holds
    ``order="fast"`` in the sampler's attributes: it unpickles as the per-rank order."""
    cls = getattr(croupier, name)
    args = {
        "DistributedSampler": ([100], {}),
        "MixtureSampler": ([[0, 30, 100], [0.5, 0.5]], {}),
        "BucketBatchSampler": ([[(i * 37) % 150 + 1 for i in range(300)]], {"max_tokens": 600}),
    }[name]
    s = cls(*args[0], num_replicas=2, rank=1, order="per_rank", **args[1])
    s.set_skip(2)
    old = s.__getstate__()
    old["order"] = "fast"  # what the build before the rename pickled
    copy = cls.__new__(cls)
    copy.__setstate__(old)
    assert copy.order == "per_rank" and copy.state_dict() == s.state_dict()
    assert _items(copy) == _items(s)


def test_the_bench_systems_of_the_renamed_order_keep_their_old_names():
    from croupier.bench._systems import RENAMED, by_name

    for old, new in RENAMED.items():
        assert by_name(old) is by_name(new) and "fast" not in new
