"""Invariants of every sampler on the base, as hypothesis properties: a short run in the default
suite and a deeper one marked slow (``pytest -m slow``).

- every index of the epoch is dealt exactly once across the ranks (padding aside);
- a resume from any position continues exactly;
- a state saved at an epoch boundary loads on any other number of ranks (for
  ``MixtureSampler`` too, its schedule's starts moved with the epoch length);
- a state survives JSON and a load unchanged.
"""

from __future__ import annotations

import itertools
import json
from collections import Counter

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from croupier import DistributedSampler, MixtureSampler

configs = st.fixed_dictionaries(
    {
        "n": st.integers(0, 5000),
        "w": st.integers(1, 12),
        "drop_last": st.booleans(),
        "shuffle": st.booleans(),
        "seed": st.integers(0, 2**64 - 1),
        "order": st.sampled_from(["per_rank", "torch"]),
    }
)
epochs = st.integers(0, 1000)


def sampler(cfg: dict, rank: int, w: int | None = None) -> DistributedSampler:
    # torch's order refuses seed + epoch past 2**64 - 1 (as torch.manual_seed does): tested
    # in test_torch_order.py, kept out of these sweeps.
    assume(not (cfg["order"] == "torch" and cfg["shuffle"] and cfg["seed"] > 2**64 - 1 - 1000))
    return DistributedSampler(
        cfg["n"],
        num_replicas=cfg["w"] if w is None else w,
        rank=rank,
        shuffle=cfg["shuffle"],
        seed=cfg["seed"],
        drop_last=cfg["drop_last"],
        order=cfg["order"],
    )


def dealt_once(cfg: dict, epoch: int) -> None:
    n, w = cfg["n"], cfg["w"]
    shares = []
    for r in range(w):
        s = sampler(cfg, r)
        s.set_epoch(epoch)
        shares.append(list(s))
    assert len({len(x) for x in shares}) <= 1, "every rank has the same count"
    counts = Counter(i for share in shares for i in share)
    total = sum(len(x) for x in shares)
    assert all(0 <= i < n for i in counts)
    if cfg["drop_last"]:
        assert total == (n // w) * w and max(counts.values(), default=1) == 1
    else:
        # each index once, plus the padding: the head of the order repeated
        assert set(counts) == set(range(n)) and total == -(-n // w) * w


def resume_anywhere(cfg: dict, epoch: int, where: float) -> None:
    rank = cfg["w"] - 1
    s = sampler(cfg, rank)
    s.set_epoch(epoch)
    whole = list(s)
    k = int(where * len(whole))
    it = iter(s)
    head = [next(it) for _ in range(k)]
    state = json.loads(json.dumps(s.state_dict()))
    fresh = sampler(cfg, 0)  # any rank's state loads on any rank
    other = sampler(cfg, rank)
    other.load_state_dict(state)
    other.set_epoch(epoch)
    assert head + list(other) == whole
    fresh.load_state_dict(state)
    assert fresh.state_dict()["position"] == k


def boundary_on_other_world_sizes(cfg: dict, epoch: int, w2: int, finished: bool) -> None:
    s = sampler(cfg, 0)
    s.set_epoch(epoch)
    if finished:
        list(s)
    state = s.state_dict()
    for rank in {0, w2 - 1}:
        moved = sampler(cfg, rank, w=w2)
        moved.load_state_dict(state)
        moved.set_epoch(epoch)
        ref = sampler(cfg, rank, w=w2)
        ref.set_epoch(epoch)
        # a finished epoch stays finished; one that had nothing to deal was never started
        done = finished and len(s) > 0
        assert list(moved) == ([] if done else list(ref))


def round_trip(cfg: dict, epoch: int, where: float) -> None:
    s = sampler(cfg, 0)
    s.set_epoch(epoch)
    s.set_skip(int(where * len(s)))
    state = s.state_dict()
    again = sampler(cfg, 0)
    again.load_state_dict(json.loads(json.dumps(state)))
    assert again.state_dict() == state
    again.load_state_dict(again.state_dict())
    assert again.state_dict() == state


mixture_configs = st.fixed_dictionaries(
    {
        # at least 12 samples each: every dataset has a share on up to 12 ranks
        "sizes": st.lists(st.integers(12, 400), min_size=1, max_size=5),
        "raw": st.lists(st.integers(0, 9), min_size=5, max_size=5),
        "w": st.integers(1, 12),
        "drop_last": st.booleans(),
        "shuffle": st.booleans(),
        "seed": st.integers(0, 2**64 - 1),
        "num_samples": st.one_of(st.none(), st.integers(0, 600)),
        "split": st.floats(0, 1),  # where the schedule's second phase starts
        "order": st.sampled_from(["global", "per_rank"]),
    }
)


def mixture(cfg: dict, rank: int, w: int) -> MixtureSampler:
    weights = [*cfg["raw"][: len(cfg["sizes"]) - 1], 1]
    return MixtureSampler(
        [0, *itertools.accumulate(cfg["sizes"])],
        weights,
        w,
        rank,
        shuffle=cfg["shuffle"],
        seed=cfg["seed"],
        drop_last=cfg["drop_last"],
        num_samples=cfg["num_samples"],
        order=cfg["order"],
    )


def schedule_positions(cfg: dict, w: int) -> int:
    """The positions a schedule counts: the global sequence's (global order) or a rank's."""
    if cfg["order"] == "global":
        return sum(cfg["sizes"]) if cfg["num_samples"] is None else cfg["num_samples"] * w
    return len(mixture(cfg, 0, w))


def mixture_schedule(cfg: dict, second: int) -> list:
    """Weights as configured, then reversed from position ``second`` (0: reversed only)."""
    weights = [*cfg["raw"][: len(cfg["sizes"]) - 1], 1]
    return [(0, weights[::-1])] if second == 0 else [(0, weights), (second, weights[::-1])]


def mixture_boundary_on_other_world_sizes(cfg: dict, epoch: int, w2: int, finished: bool) -> None:
    s = mixture(cfg, 0, cfg["w"])
    length = schedule_positions(cfg, cfg["w"])
    second = 1 + int(cfg["split"] * (length - 2)) if length >= 2 else 0
    s.set_schedule(mixture_schedule(cfg, second))
    s.set_epoch(epoch)
    if finished:
        list(s)
    state = s.state_dict()
    for rank in {0, w2 - 1}:
        moved = mixture(cfg, rank, w2)
        moved.load_state_dict(state)
        moved.set_epoch(epoch)
        ref = mixture(cfg, rank, w2)
        # the documented move: a start s of an epoch of length L starts at s * L' // L
        moved_len = schedule_positions(cfg, w2)
        ref.set_schedule(mixture_schedule(cfg, second * moved_len // length if length else 0))
        ref.set_epoch(epoch)
        assert moved.schedule == ref.schedule
        done = finished and len(s) > 0
        assert list(moved) == ([] if done else list(ref))
        moved.set_epoch(epoch + 1)
        ref.set_epoch(epoch + 1)
        assert list(moved) == list(ref)


fractions = st.floats(0, 1)
world_sizes = st.integers(1, 12)


@settings(max_examples=40)
@given(cfg=configs, epoch=epochs)
def test_every_index_dealt_once(cfg, epoch):
    dealt_once(cfg, epoch)


@settings(max_examples=40)
@given(cfg=configs, epoch=epochs, where=fractions)
def test_resume_anywhere(cfg, epoch, where):
    resume_anywhere(cfg, epoch, where)


@settings(max_examples=40)
@given(cfg=configs, epoch=epochs, w2=world_sizes, finished=st.booleans())
def test_epoch_boundaries_load_on_other_world_sizes(cfg, epoch, w2, finished):
    boundary_on_other_world_sizes(cfg, epoch, w2, finished)


@settings(max_examples=40)
@given(cfg=configs, epoch=epochs, where=fractions)
def test_state_round_trip(cfg, epoch, where):
    round_trip(cfg, epoch, where)


@settings(max_examples=40, deadline=None)
@given(cfg=mixture_configs, epoch=epochs, w2=world_sizes, finished=st.booleans())
def test_mixture_epoch_boundaries_load_on_other_world_sizes(cfg, epoch, w2, finished):
    mixture_boundary_on_other_world_sizes(cfg, epoch, w2, finished)


deep_configs = configs.map(lambda c: {**c, "n": c["n"] * 20})


@pytest.mark.slow
@settings(max_examples=400)
@given(cfg=deep_configs, epoch=epochs)
def test_every_index_dealt_once_deep(cfg, epoch):
    dealt_once(cfg, epoch)


@pytest.mark.slow
@settings(max_examples=400)
@given(cfg=deep_configs, epoch=epochs, where=fractions)
def test_resume_anywhere_deep(cfg, epoch, where):
    resume_anywhere(cfg, epoch, where)


@pytest.mark.slow
@settings(max_examples=400)
@given(cfg=deep_configs, epoch=epochs, w2=world_sizes, finished=st.booleans())
def test_epoch_boundaries_load_on_other_world_sizes_deep(cfg, epoch, w2, finished):
    boundary_on_other_world_sizes(cfg, epoch, w2, finished)


@pytest.mark.slow
@settings(max_examples=400, deadline=None)
@given(cfg=mixture_configs, epoch=epochs, w2=world_sizes, finished=st.booleans())
def test_mixture_epoch_boundaries_load_on_other_world_sizes_deep(cfg, epoch, w2, finished):
    mixture_boundary_on_other_world_sizes(cfg, epoch, w2, finished)
