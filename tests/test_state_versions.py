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
    # One file per shipped shape: 0.1.0, and the 0.2.0 development build before version 2.
    assert {p.stem for p in FILES} >= {"v1-0.1.0", "v1-0.2.0-dev-462f7d5"}


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
    is_fast = name == "DistributedSampler" and state["order"] == "fast"
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
        state = {**state, "version": STATE_VERSION}
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
        if name.startswith("compat.torchdata"):
            upgraded = {k: v for k, v in loaded.items() if k in state} | {"version": 2}
        assert {k: loaded[k] for k in upgraded} == upgraded
        return
    # A version-1 elastic rest counted its positions from the rest's start: resumed_at 0.
    el = state["elastic"]
    assert loaded["elastic"] == {**el, "resumed_at": 0}
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
    assert (
        rest == mine[position : position + len(rest)]
        or rest[: len(mine) - position] == mine[position:]
    )
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
    s = croupier.DistributedSampler(100, 3, 1, order="fast")
    old = {**s.state_dict(), "version": 1, "epoch": 2}
    s.load_state_dict({**old, "position": 0})
    assert _items(s) == _items(_fresh_epoch(2))
    s.load_state_dict({**old, "position": 34})
    assert _items(s) == [] and len(s) == 34


def test_a_0_2_dev_fast_state_declared_version_2_loads():
    s = croupier.DistributedSampler(100, 3, 1, order="fast")
    s.set_skip(5)
    state = {**s.state_dict(), "version": 1}
    with pytest.raises(StateError, match="set state\\['version'\\] to 2"):
        croupier.DistributedSampler(100, 3, 1, order="fast").load_state_dict(state)
    t = croupier.DistributedSampler(100, 3, 1, order="fast")
    t.load_state_dict({**state, "version": 2})
    assert _items(t) == _items(_fresh_epoch(0))[5:]


def _fresh_epoch(epoch):
    s = croupier.DistributedSampler(100, 3, 1, order="fast")
    s.set_epoch(epoch)
    return s
