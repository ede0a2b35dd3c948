"""MixtureSampler(interleave="balanced"): a resume from a state replays at most a leaf.

The balanced sequence is sequential, so a fresh process that resumes at a position used to
replay the phase from its start (seconds at 1e8 positions). A state now records the counts at
the last leaf boundary the saving rank had reached (``state["balanced"]``), and a load starts
the sequence there. What is checked:

- the recorded counts are the sequence's: counted here from the uninterrupted epoch's indices;
- a load with them yields exactly what a load without them (the replay from the phase's
  start, the reference) yields, on the same world and elastically on others, and with a
  weight change after the load;
- the loaded sampler never replays a leaf before the boundary;
- counts that cannot be the sequence's are refused, naming the entry, and change nothing.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from croupier import MixtureSampler, StateError
from test_mixture_sampler import _cum

SIZES = [150_000, 90_000, 60_000, 7]
WEIGHTS = [3.0, 2.0, 1.0, 0.5]
LEAF = 1 << 16  # the balanced interleave's leaf for 4 datasets
EPOCH = 2


def _sampler(w: int, r: int) -> MixtureSampler:
    s = MixtureSampler(_cum(SIZES), WEIGHTS, w, r, seed=9, interleave="balanced")
    s.set_epoch(EPOCH)
    return s


def _counts_before(position: int) -> list[int]:
    """Each dataset's count in the first ``position`` global positions, from the indices of
    the uninterrupted epoch on one rank."""
    whole = np.asarray(_sampler(1, 0).indices())
    which = np.searchsorted(np.asarray(_cum(SIZES)[1:]), whole[:position], side="right")
    return np.bincount(which, minlength=len(SIZES)).tolist()


def _saved(w: int, r: int, position: int) -> dict:
    s = _sampler(w, r)
    for _ in itertools.islice(iter(s), position):
        pass
    return s.state_dict()


def _rest(state: dict, w: int, r: int, change: list[float] | None = None) -> tuple[list, object]:
    s = _sampler(w, r)
    s.load_state_dict(state)
    if change is not None:
        s.update_weights(change)
    return list(s), s


@pytest.mark.parametrize("position", [30_000, 70_000, 95_000])
def test_the_state_records_the_sequences_counts_and_a_load_replays_no_leaf_before_them(position):
    state = _saved(3, 1, position)
    consumed = 3 * position
    recorded = state["balanced"]
    assert len(recorded) == 1
    phase, at, counts = recorded[0]
    assert phase == 0 and at % LEAF == 0 and consumed - LEAF < at <= consumed
    assert counts == _counts_before(at)
    replayed = {k: v for k, v in state.items() if k != "balanced"}
    for w in (3, 2, 5):
        for r in range(w):
            got, s = _rest(state, w, r)
            want, _ = _rest(replayed, w, r)
            assert got == want, (w, r)
            mix = s._origin_mix[1] if s._origin_mix else s._current()
            # Nothing found between the phase's start and the recorded boundary: no replay.
            assert mix.balanced_boundaries(at - 1) == [], (w, r)
    # On the same world the rest is the uninterrupted epoch's.
    whole = _sampler(1, 0).indices().tolist()
    assert _rest(state, 3, 1)[0] == whole[1::3][position : len(_sampler(3, 1))]


def test_a_weight_change_after_the_load_reads_from_the_recorded_boundary_too():
    state = _saved(2, 0, 80_000)
    replayed = {k: v for k, v in state.items() if k != "balanced"}
    change = [1.0, 1.0, 1.0, 1.0]
    for r in range(2):
        got, s = _rest(state, 2, r, change)
        want, _ = _rest(replayed, 2, r, change)
        assert got == want
        # The epoch's phases after the change: the loaded one, cut at the resume, then the
        # new weights; the first still starts from the recorded boundary.
        assert len(s._phases) == 2
        assert s._current().balanced_boundaries(state["balanced"][0][1] - 1) == []


def test_a_state_saved_before_any_boundary_records_none_and_loads():
    state = _saved(2, 1, 1_000)
    assert "balanced" not in state
    got, _ = _rest(state, 2, 1)
    assert got == _sampler(2, 1).indices().tolist()[1_000:]


def _moved(counts: list[int]) -> list[int]:
    """The counts with two samples moved between datasets: off the one-sample band."""
    out = list(counts)
    out[0] -= 2
    out[2] += 2
    return out


@pytest.mark.parametrize(
    "edit, words",
    [
        (lambda b: "x", "must be a list of [phase, position, counts]"),
        (lambda b: [b[0][:2]], "state['balanced'][0] must be [phase, position, counts]"),
        (lambda b: [[1, b[0][1], b[0][2]]], "state['balanced'][0][0] must be in [0, 0]"),
        (lambda b: [[0, b[0][1] + 1, b[0][2]]], "state['balanced'][0] is not a boundary"),
        (lambda b: [[0, b[0][1], b[0][2][:3]]], "state['balanced'][0] is not a boundary"),
        (lambda b: [[0, b[0][1], _moved(b[0][2])]], "within one sample"),
        (lambda b: [[0, b[0][1], [-1, *b[0][2][1:]]]], "state['balanced'][0][2]"),
    ],
)
def test_counts_that_cannot_be_the_sequences_are_refused_and_change_nothing(edit, words):
    state = _saved(2, 0, 80_000)
    bad = {**state, "balanced": edit(state["balanced"])}
    s = _sampler(2, 0)
    before = s.state_dict()
    with pytest.raises((StateError, ValueError, TypeError), match=None) as e:
        s.load_state_dict(bad)
    assert words in str(e.value)
    assert s.state_dict() == before
    assert s._balanced_seeds == {}


def _reference_rest(state: dict, w: int, r: int) -> list:
    """The rest a load of ``state`` without its boundaries yields (the replay), in a sampler
    that has loaded nothing else."""
    return _rest({k: v for k, v in state.items() if k != "balanced"}, w, r)[0]


def test_counts_a_load_brought_do_not_outlive_it():
    # Counts inside the one-sample band but not the sequence's (an edited state) give another
    # sequence from there; the next load, of the true state or of one without counts, must not
    # keep them.
    # Saved just after a boundary, so that the rest starts inside the edited stretch.
    state = _saved(2, 0, 65_537)
    phase, at, counts = state["balanced"][0]
    # One sample moved from a dataset at the top of its band to one at the bottom of its own.
    nominal = _sampler(2, 0)._current().phase_counts(0)
    m = sum(nominal)
    up = [c * at % m != 0 and counts[d] == c * at // m + 1 for d, c in enumerate(nominal)]
    down = [c * at % m != 0 and counts[d] == c * at // m for d, c in enumerate(nominal)]
    edited = list(counts)
    edited[up.index(True)] -= 1
    edited[down.index(True)] += 1
    s = _sampler(2, 0)
    s.load_state_dict({**state, "balanced": [[phase, at, edited]]})
    want = _reference_rest(state, 2, 0)
    assert list(s) != want  # the edited counts did take effect
    s.load_state_dict(state)
    assert list(s) == want
    s.load_state_dict({**state, "balanced": [[phase, at, edited]]})
    s.load_state_dict({k: v for k, v in state.items() if k != "balanced"})
    assert list(s) == want


def test_the_state_keeps_its_boundaries_after_many_weight_changes():
    s = _sampler(2, 1)
    for _ in itertools.islice(iter(s), 80_000):
        pass
    before = s.state_dict()["balanced"]
    for k in range(12):
        s.update_weights([1.0 + k, 1.0, 1.0, 1.0])
    assert s.state_dict()["balanced"] == before


def test_a_pickled_copy_keeps_the_boundaries_and_does_not_replay():
    import pickle

    s = _sampler(3, 2)
    it = iter(s)
    for _ in itertools.islice(it, 90_000):
        pass
    state = s.state_dict()
    copy = pickle.loads(pickle.dumps(s))
    assert copy.state_dict() == state
    at = state["balanced"][0][1]
    assert list(copy) == _reference_rest(state, 3, 2)
    assert copy._current().balanced_boundaries(at - 1) == []


@pytest.mark.parametrize("bad", ["garbage", 12, [[99, 0, [0]]], [[0, -5, "x"]]])
def test_a_state_at_the_start_of_an_epoch_is_checked_too(bad):
    state = _sampler(2, 0).state_dict()
    s = _sampler(3, 1)
    with pytest.raises((StateError, ValueError, TypeError)) as e:
        s.load_state_dict({**state, "balanced": bad})
    assert "state['balanced']" in str(e.value)
