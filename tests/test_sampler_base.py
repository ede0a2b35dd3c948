"""The sampler base (croupier.samplers._base), through DistributedSampler and a small batch
sampler built on it: indices() equals the next iteration at every point of a sampler's life,
checkpoints are exact at any instant (signals), configuration is read-only, foreign state
shapes load without weakening the checks, states with numpy integers load, and the batch base
counts its position in batches."""

from __future__ import annotations

import json
import pickle
import random
import signal
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import croupier
from croupier import DistributedSampler, StateError
from croupier.samplers._base import Batches, BatchSampler, IndexSampler

# -- indices() is what the next iteration yields ----------------------------------------------

# One step of a sampler's life: (operation, argument drawn from [0, 1) and scaled to the epoch).
operations = st.lists(
    st.tuples(
        st.sampled_from(["take", "finish", "skip", "epoch", "load_own", "load_fresh", "pickle"]),
        st.floats(min_value=0, max_value=1),
    ),
    max_size=8,
)


@settings(max_examples=80)
@given(
    n=st.integers(0, 3000),
    w=st.integers(1, 4),
    shuffle=st.booleans(),
    order=st.sampled_from(["per_rank", "torch"]),
    ops=operations,
)
def test_indices_equal_the_next_iteration_at_every_point(n, w, shuffle, order, ops):
    kw = dict(num_replicas=w, rank=w - 1, shuffle=shuffle, seed=7, order=order)
    s = DistributedSampler(n, **kw)
    it = iter(s)
    for op, x in ops:
        k = int(x * len(s))
        if op == "take":
            it = iter(s)
            for _ in range(k):
                next(it)
        elif op == "finish":
            list(s)
        elif op == "skip":
            s.set_skip(k)
        elif op == "epoch":
            s.set_epoch(k % 3)
        elif op == "load_own":
            s.load_state_dict(json.loads(json.dumps(s.state_dict())))
        elif op == "load_fresh":
            state = s.state_dict()
            s = DistributedSampler(n, **kw)
            s.load_state_dict(state)
        else:
            s = pickle.loads(pickle.dumps(s))
        expected = s.indices().tolist()
        assert list(s) == expected
        # The iteration just made does not change what a fresh one yields: the whole epoch.
        assert s.indices().tolist() == list(s)


def test_a_finished_epoch_is_done_in_its_state_but_iterates_again():
    s = DistributedSampler(100, num_replicas=3, rank=1, seed=2)
    full = list(s)
    state = s.state_dict()
    assert state["position"] == len(s) == len(full)
    assert s.indices().tolist() == full, "torch's rule: the next iteration repeats the epoch"
    resumed = DistributedSampler(100, num_replicas=3, rank=1, seed=2)
    resumed.load_state_dict(state)
    assert resumed.indices().tolist() == [] and list(resumed) == []
    assert resumed.state_dict()["position"] == len(s), "still done after the empty iteration"
    assert list(resumed) == full, "and then, like any finished epoch, it repeats"


def test_mid_iteration_indices_are_the_next_iteration_not_the_rest():
    s = DistributedSampler(50, num_replicas=1, rank=0, seed=1)
    full = list(s)
    it = iter(s)
    head = [next(it) for _ in range(20)]
    assert s.state_dict()["position"] == 20
    assert s.indices().tolist() == full
    assert head + list(it) == full


# -- checkpoints at any instant -----------------------------------------------------------------


@pytest.mark.skipif(not hasattr(signal, "setitimer"), reason="needs POSIX interval timers")
def test_checkpoints_from_a_timer_signal_handler_are_exact():
    # A job checkpoints from its SIGTERM/SIGUSR1 handler at any bytecode; here a timer fires at
    # random instants while the loop runs through chunk boundaries. Each state must claim
    # exactly what the iterator has handed out: the consumed prefix (at most the one index in
    # flight between the iterator and the list) plus the resumed rest is the whole epoch.
    n = 400_000
    full = DistributedSampler(n, num_replicas=2, rank=0, seed=3).indices()
    rng = random.Random(0)
    taken: list[tuple[dict[str, object], int]] = []
    s = DistributedSampler(n, num_replicas=2, rank=0, seed=3)
    consumed: list[int] = []
    live = False  # only while an iteration runs is len(consumed) its progress
    stopping = False  # set before the timer is cancelled: a handler still pending then must
    # not arm it again, or the signal would later meet the default action and kill pytest

    def handler(signum: int, frame: object) -> None:
        if live:
            taken.append((s.state_dict(), len(consumed)))
        if not stopping:
            signal.setitimer(signal.ITIMER_REAL, rng.uniform(1e-5, 4e-4))

    old = signal.signal(signal.SIGALRM, handler)
    try:
        signal.setitimer(signal.ITIMER_REAL, rng.uniform(1e-5, 4e-4))
        while len(taken) < 300:
            consumed.clear()
            it = iter(s)
            live = True
            for i in it:
                consumed.append(i)
            live = False
    finally:
        stopping = True
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    assert len(taken) >= 300
    positions = set()
    for state, held in taken:
        position = state["position"]
        assert held <= position <= held + 1, (position, held)
        positions.add(position)
        fresh = DistributedSampler(n, num_replicas=2, rank=0, seed=3)
        fresh.load_state_dict(state)
        assert np.array_equal(fresh.indices(), full[position:])
    assert len(positions) > 100, "the signals landed at many different positions"


# -- configuration ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    ["dataset", "num_replicas", "rank", "shuffle", "seed", "drop_last", "order", "num_samples"],
)
def test_configuration_is_read_only(name):
    s = DistributedSampler(10, num_replicas=2, rank=0)
    before = s.state_dict()
    with pytest.raises(AttributeError, match=f"{name} is fixed at construction"):
        setattr(s, name, getattr(s, name))
    assert s.state_dict() == before
    s.epoch = 3  # the epoch is not configuration: assigning it is set_epoch
    assert s.state_dict()["epoch"] == 3


def test_repr_names_the_configuration_and_progress():
    s = DistributedSampler(10, num_replicas=2, rank=1, seed=4)
    s.set_skip(2)
    text = repr(s)
    assert text.startswith("DistributedSampler(")
    for part in ("dataset_len=10", "num_replicas=2", "rank=1", "seed=4", "position=2"):
        assert part in text


# -- state shapes -------------------------------------------------------------------------------


def test_kempnerforge_state_loads_as_the_start_of_its_epoch():
    s = DistributedSampler(100, num_replicas=4, rank=2, seed=9, drop_last=True)
    s.load_state_dict({"epoch": 5, "seed": 9, "num_replicas": 8, "rank": 7})
    ref = DistributedSampler(100, num_replicas=4, rank=2, seed=9, drop_last=True)
    ref.set_epoch(5)
    assert s.epoch == 5 and s.state_dict()["position"] == 0
    assert list(s) == list(ref)


@pytest.mark.parametrize(
    ("state", "exc", "message"),
    [
        (
            {"epoch": 1, "seed": 8, "num_replicas": 4, "rank": 0},
            StateError,
            "seed: state has 8, this sampler has 9",
        ),
        (
            {"epoch": 1, "seed": 9, "num_replicas": 4, "rank": 0, "extra": 1},
            StateError,
            "or a state of kempnerforge's DistributedSampler (epoch, num_replicas, rank, seed)",
        ),
        ({"epoch": 1, "seed": 9, "num_replicas": 4}, StateError, "expected a state_dict()"),
        ({"epoch": -1, "seed": 9, "num_replicas": 4, "rank": 0}, StateError, "must be >= 0"),
        ({"epoch": 1, "seed": 9, "num_replicas": 4, "rank": 4}, ValueError, "rank"),
        ({"epoch": 1.0, "seed": 9, "num_replicas": 4, "rank": 0}, TypeError, "epoch"),
    ],
)
def test_foreign_states_are_checked_like_native_ones(state, exc, message):
    s = DistributedSampler(100, num_replicas=4, rank=2, seed=9)
    s.set_skip(3)
    before = s.state_dict()
    with pytest.raises(exc) as info:
        s.load_state_dict(state)
    assert message in str(info.value)
    assert s.state_dict() == before, "a refused state leaves the sampler as it was"


def test_states_with_numpy_and_torch_integers_load():
    s = DistributedSampler(1000, num_replicas=2, rank=1, seed=5)
    s.set_epoch(2)
    s.set_skip(17)
    state = s.state_dict()
    as_numpy = {k: np.int64(v) if type(v) is int else v for k, v in state.items()}
    fresh = DistributedSampler(1000, num_replicas=2, rank=1, seed=5)
    fresh.load_state_dict(as_numpy)
    assert fresh.state_dict() == state
    assert all(type(v) is not np.int64 for v in fresh.state_dict().values())
    torch = sys.modules.get("torch")
    if torch is not None:
        as_tensors = {k: torch.tensor(v) if type(v) is int else v for k, v in state.items()}
        other = DistributedSampler(1000, num_replicas=2, rank=1, seed=5)
        other.load_state_dict(as_tensors)
        assert other.state_dict() == state


@pytest.mark.parametrize("bad", [True, 3.0, "3", np.float64(3)])
def test_state_integers_refuse_bools_floats_and_strings(bad):
    s = DistributedSampler(1000, num_replicas=2, rank=1)
    state = {**s.state_dict(), "position": bad}
    with pytest.raises(TypeError, match=r"state\['position'\] must be an int"):
        s.load_state_dict(state)


def test_state_error_is_exported_and_a_value_error():
    assert croupier.StateError is StateError and issubclass(StateError, ValueError)


# -- the batch base -----------------------------------------------------------------------------


class FixedBatches(BatchSampler):
    """A test double on the batch base: this rank's share of a DistributedSampler cut into
    batches of ``size`` (the last one short)."""

    _config_names = ("size",)

    def __init__(self, n: int, size: int, num_replicas: int, rank: int) -> None:
        self.size = size
        self._inner = DistributedSampler(n, num_replicas=num_replicas, rank=rank, seed=1)
        super().__init__(num_replicas, rank, self._batches_for(num_replicas))

    def _batches_for(self, num_replicas: int) -> int:
        share = DistributedSampler(self._inner._n, num_replicas=num_replicas, rank=0).num_samples
        return -(-share // self.size)

    def _config(self) -> dict[str, object]:
        return {"n": self._inner._n, "size": self.size}

    def _epoch_length(self, num_replicas: int) -> int:
        return self._batches_for(num_replicas)

    def _compute(self, epoch: int, start: int, stop: int | None) -> Batches:
        self._inner.set_epoch(epoch)
        flat = self._inner.indices()
        stop = self._length if stop is None else stop
        offsets = np.minimum(np.arange(start, stop + 1) * self.size, len(flat))
        return Batches(flat, offsets)


@settings(max_examples=40)
@given(n=st.integers(0, 500), size=st.integers(1, 40), w=st.integers(1, 3), data=st.data())
def test_batch_base_resumes_at_every_batch(n, size, w, data):
    s = FixedBatches(n, size, w, w - 1)
    s.set_epoch(1)
    whole = list(s)
    flat = s._inner.indices().tolist()
    assert whole == [flat[i : i + size] for i in range(0, len(flat), size)]
    assert len(whole) == len(s)
    k = data.draw(st.integers(0, len(s)))
    it = iter(s)
    head = [next(it) for _ in range(k)]
    state = s.state_dict()
    assert state["position"] == k
    fresh = FixedBatches(n, size, w, w - 1)
    fresh.load_state_dict(state)
    assert fresh.batches().tolist() == whole[k:]
    assert head + list(fresh) == whole
    with pytest.raises(ValueError, match=r"skip must be in \[0, "):
        fresh.set_skip(len(s) + 1)


def test_batch_state_position_past_the_epoch_names_batches():
    s = FixedBatches(100, 10, 1, 0)
    state = {**s.state_dict(), "position": 11}
    with pytest.raises(StateError, match=r"must be in \[0, 10\] \(batches per rank and epoch"):
        s.load_state_dict(state)


# -- streaming without a shuffle ----------------------------------------------------------------


def test_unshuffled_iteration_streams_in_windows():
    # A share of 2**40 indices would need 8 TiB as one buffer: iteration must stream it.
    n = 2**40 + 3
    s = DistributedSampler(n, num_replicas=2, rank=1, shuffle=False)
    it = iter(s)
    head = [next(it) for _ in range(70_000)]  # across the first windows
    assert head == list(range(1, 2 * 70_000, 2))
    assert s.state_dict()["position"] == 70_000
    assert s._cache is None, "nothing of the epoch is held beyond the window"
    resumed = DistributedSampler(n, num_replicas=2, rank=1, shuffle=False)
    resumed.set_skip(len(s) - 2)
    # the last two: global positions n - 2 and n, the latter padding that repeats position 0
    assert list(iter(resumed)) == [n - 2, 0]  # list(sampler) would presize to len(sampler)


@settings(max_examples=30)
@given(n=st.integers(0, 300_000), w=st.integers(1, 3), data=st.data())
def test_unshuffled_resume_anywhere_across_windows(n, w, data):
    s = DistributedSampler(n, num_replicas=w, rank=0, shuffle=False, drop_last=True)
    full = s.indices().tolist()
    assert full == list(range(0, len(s) * w, w))
    k = data.draw(st.integers(0, len(s)))
    it = iter(DistributedSampler(n, num_replicas=w, rank=0, shuffle=False, drop_last=True))
    fresh = DistributedSampler(n, num_replicas=w, rank=0, shuffle=False, drop_last=True)
    fresh.set_skip(k)
    assert list(fresh) == full[k:]
    assert [next(it) for _ in range(k)] == full[:k]


def test_the_extension_point_is_public():
    """What docs/extending.md tells a sampler author to import is exported by
    croupier.samplers (its example sampler runs in tests/test_readme.py)."""
    import croupier.samplers as public

    for name in (
        "IndexSampler", "BatchSampler", "Batches", "StateError",
        "check_int", "check_bool", "dataset_length", "resolve_ranks", "Loaded", "StateFormat",
    ):  # fmt: skip
        assert name in public.__all__ and getattr(public, name) is not None
    assert public.IndexSampler is IndexSampler and public.Batches is Batches


class Tagged(FixedBatches):
    """A sampler with a state key of its own (``tag``), loaded through the base's hooks."""

    def __init__(self, *args: int) -> None:
        self.tag = "fresh"
        super().__init__(*args)

    def _state_at(self, epoch: int, position: int) -> dict[str, object]:
        return {**super()._state_at(epoch, position), "tag": self.tag}

    def _prepare_load(self, native, loaded):
        tag = native.get("tag")
        if not isinstance(tag, str) or not tag:
            raise StateError("state['tag'] must be a non-empty string")

        def commit() -> None:
            # The base has positioned the sampler before it applies the sampler's own keys.
            assert (self.epoch, self.next_start()) == (loaded.epoch, loaded.position)
            self.tag = f"{tag}@{loaded.epoch}:{loaded.position}"

        return commit


def test_a_samplers_own_state_keys_load_through_the_base_hooks_or_change_nothing():
    s = Tagged(100, 10, 2, 1)
    s.set_epoch(3)
    it = iter(s)
    [next(it) for _ in range(2)]
    state = s.state_dict()
    assert state["tag"] == "fresh"
    t = Tagged(100, 10, 2, 1)
    t.load_state_dict({**state, "tag": "kept"})
    assert (t.epoch, t.tag, t.state_dict()["position"]) == (3, "kept@3:2", 2)
    before = (t.state_dict(), t.tag)
    for bad in ({**state, "tag": ""}, {**state, "position": 99}, {**state, "size": 11}):
        with pytest.raises(StateError):
            t.load_state_dict(bad)
        assert (t.state_dict(), t.tag) == before  # refused: nothing changed
