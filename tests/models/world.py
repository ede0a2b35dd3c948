"""The checkpoint semantics every elastic croupier sampler shares, for one world of ranks.

Encodes (API.md, DESIGN.md, docs/checkpointing.md, issue 42's rules):

- An epoch on a world of ``W`` ranks is one global order ``G`` (the items its first world
  covers, before padding). Rank ``r`` takes positions ``r, r + W, ...`` of the order dealt
  with torch's arithmetic: ``drop_last=False`` pads to ``ceil(n / W) * W`` by repeating the
  head (as often as needed), ``drop_last=True`` keeps ``floor(n / W) * W``.
- ``state_dict()["position"]`` counts this rank's items of the epoch consumed: handed out by
  the live iterator, skipped with ``set_skip``, or recorded by a loaded state. Iterating again
  without ``set_epoch`` repeats the epoch from its start unless a start is pending (a
  ``set_skip`` or a load). A loaded position belongs to its epoch (``set_epoch`` of the same
  epoch keeps it, of another starts that one from 0); a ``set_skip`` waits for the next
  iteration whatever its epoch.
- Elastic load (saved on ``W``, loaded on ``W' != W``): a state at the start of an epoch
  (nothing consumed) loads as the start of that epoch on ``W'``; otherwise the old ranks
  consumed the order's first ``position * W`` items (at most the epoch's items: padding
  counted once); the rest is dealt to the ``W'`` ranks with torch's padding/dropping. Further
  hops continue the same order from a larger offset. A state saved at the end of an epoch (or
  of its rest) means the epoch is done on any world size (what a world's ``drop_last``
  dropped comes back next epoch).
- The len rule: after any load ``len == loaded position + what the next iteration yields``;
  the position reported right after an elastic load is the loaded one and counts up from it;
  ``set_skip(s)`` takes ``s`` in ``[loaded position, len]`` then. After ``set_epoch`` to another
  epoch the world is an ordinary one again.

``LEGACY_LEN=True`` (environment ``CROUPIER_MODEL_LEGACY_LEN=1``) switches the len rule to the
one shipped before issue 42 (after an elastic load positions, ``len`` and ``set_skip`` count
from 0 in the rest), only to explore the other invariants on code that predates the rule.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from typing import Any

LEGACY_LEN = os.environ.get("CROUPIER_MODEL_LEGACY_LEN") == "1"


def deal(items: list[Any], world: int, drop_last: bool) -> list[list[Any]]:
    """torch's DistributedSampler arithmetic on an already ordered list: one list per rank."""
    n = len(items)
    if drop_last:
        kept = items[: (n // world) * world]
    else:
        total = -(-n // world) * world
        kept = list(items)
        while n and len(kept) < total:  # the head, as often as needed
            kept += items[: total - len(kept)]
    return [kept[r::world] for r in range(world)]


def interleave(seqs: list[list[Any]]) -> list[Any]:
    """Position t of every rank's sequence, rank after rank, then position t + 1."""
    return [x for column in zip(*seqs, strict=True) for x in column]


@dataclass(frozen=True)
class Segment:
    """The part of an epoch a world iterates: the epoch's order ``order`` (its first world's
    items), from global ``offset`` on, dealt to this world; ``base`` is the rank position the
    world's first item has (0, or the position recorded by the state an elastic load read)."""

    epoch: int
    order: tuple[Any, ...]
    origin: int
    offset: int = 0
    base: int = 0
    extra: Any = None  # sampler-specific (a mixture's phases history)

    @property
    def elastic(self) -> bool:
        return self.offset > 0 or self.base > 0


@dataclass
class WorldState:
    """Everything a world's state means (all ranks move in lockstep, so one per world)."""

    world: int
    seg: Segment
    position: int = 0  # rank position reached by the last iteration
    pending: tuple[str, int] | None = None  # ("skip" | "load" | "iter", rank position)
    running: bool = False  # the last iteration has handed out items (mixture's continuing)
    cursor: bool = False  # an iteration has started (its first next) and nothing reset it
    extra: dict[str, Any] = field(default_factory=dict)


class WorldModel:
    """One world of ``world`` ranks. ``order_of(epoch, origin, extra)`` gives the epoch's
    global order (its first world's items, unpadded); subclasses choose it."""

    def __init__(self, world: int, drop_last: bool) -> None:
        self.drop_last = drop_last
        self.state = WorldState(world, self.fresh_segment(0, world))
        self.live = False  # a live iterator (in the machine) stands at state.position

    # -- to provide -------------------------------------------------------------------------

    def order_of(self, epoch: int, origin: int, extra: Any) -> tuple[Any, ...]:
        raise NotImplementedError

    def fresh_extra(self, epoch: int, world: int) -> Any:
        return None

    # -- derived ----------------------------------------------------------------------------

    def fresh_segment(self, epoch: int, world: int) -> Segment:
        return self.segment(epoch, world, self.fresh_extra(epoch, world))

    def segment(self, epoch: int, world: int, extra: Any) -> Segment:
        order = self.order_of(epoch, world, extra)
        if self.drop_last:  # what the first world covers: drop_last cuts its tail
            order = order[: (len(order) // world) * world]
        return Segment(epoch, order, world, extra=extra)

    @property
    def world(self) -> int:
        return self.state.world

    def shares(self, seg: Segment | None = None) -> list[list[Any]]:
        seg = seg or self.state.seg
        return deal(list(seg.order[seg.offset :]), self.world, self.drop_last)

    def base(self, seg: Segment | None = None) -> int:
        seg = seg or self.state.seg
        return 0 if LEGACY_LEN else seg.base

    def length(self) -> int:
        return self.base() + len(self.shares()[0])

    def state_position(self) -> int:
        s = self.state
        return s.pending[1] if s.pending is not None else s.position

    def next_start(self) -> int:
        s = self.state
        return s.pending[1] if s.pending is not None else self.base()

    def remaining_from(self, position: int, seg: Segment | None = None) -> list[list[Any]]:
        """What each rank yields from rank position ``position`` of the segment."""
        base = self.base(seg)
        return [share[position - base :] for share in self.shares(seg)]

    def next_iteration(self) -> list[list[Any]]:
        return self.remaining_from(self.next_start())

    # -- operations -------------------------------------------------------------------------

    def start_iteration(self) -> None:
        """``iter()`` on every rank: until its first ``next`` the iterator's start stays
        pending (DataLoader calls ``iter()`` twice and drops the first)."""
        start = self.next_start()
        self.on_iteration(start)
        self.state.pending = ("iter", start)
        self.live = True

    def on_iteration(self, start: int) -> None:
        """Hook: what a new iteration from ``start`` changes (a mixture's phases)."""

    def on_first_next(self) -> None:
        """Hook: the iteration has started (its first ``next``)."""

    def take(self, k: int) -> list[list[Any]]:
        assert self.live
        s = self.state
        if s.pending is not None and s.pending[0] == "iter":  # the first next()
            s.position = s.pending[1]
            s.pending = None
            s.running = False
            s.cursor = True
            self.on_first_next()
        got = [share[s.position - self.base() :][:k] for share in self.shares()]
        s.position += len(got[0])
        if got[0]:
            s.running = True
        return got

    def drop_live(self) -> None:
        self.live = False

    def set_epoch(self, epoch: int) -> None:
        s = self.state
        if epoch == s.seg.epoch:
            return
        s.seg = self.fresh_segment(epoch, self.world)
        if s.pending is not None and s.pending[0] != "skip":
            s.pending = None  # a loaded start (or an iterator's) belongs to its epoch
        s.position = 0
        s.running = False
        s.cursor = False

    def skip_range(self) -> tuple[int, int]:
        return self.base(), self.length()

    def set_skip(self, skip: int) -> None:
        lo, hi = self.skip_range()
        assert lo <= skip <= hi
        self.state.pending = ("skip", skip)
        self.state.running = False
        self.state.cursor = False

    def snapshot(self) -> WorldState:
        """What ``state_dict()`` means, frozen."""
        s = self.state
        return replace(s, extra=dict(s.extra))

    def pickle_copy(self) -> None:
        """``pickle.loads(pickle.dumps(sampler))``: a copy of the sampler in which a live (or
        created) iterator's position becomes a loaded start; a pending skip stays a skip."""
        s = self.state
        self.live = False
        if (s.pending is not None and s.pending[0] == "iter") or (s.pending is None and s.cursor):
            s.pending = ("load", self.state_position())
            s.cursor = False
            self.on_pickle()

    def on_pickle(self) -> None:
        """Hook."""

    def load(self, saved: WorldState, world: int) -> None:
        """``load_state_dict(saved)`` into fresh samplers of a world of ``world`` ranks."""
        self.live = False
        position = saved.pending[1] if saved.pending is not None else saved.position
        if world == saved.world:
            self.state = replace(saved, pending=("load", position), position=position, cursor=False)
            self.state.extra = dict(saved.extra)
            self.on_same_world_load(saved)
            return
        seg = saved.seg
        consumed_here = (position - self.base(seg)) * saved.world
        if seg.offset == 0 and consumed_here == 0:  # the start of the epoch, on this world
            self.load_whole_epoch(saved, world, 0)
            return
        offset = seg.offset + min(consumed_here, len(seg.order) - seg.offset)
        saved_share = len(deal(list(seg.order[seg.offset :]), saved.world, self.drop_last)[0])
        if position - self.base(seg) >= saved_share:
            # A finished epoch is done on any world: what drop_last dropped comes back next
            # epoch, not in another world's rest.
            offset = len(seg.order)
        base = 0 if LEGACY_LEN else position
        new = replace(seg, offset=offset, base=base)
        if LEGACY_LEN and offset >= len(seg.order):
            # The shipped rule before issue 42: a finished epoch loads as this world's whole
            # epoch, done (an empty one keeps the old world's offset).
            done = (
                len(
                    deal(list(self.segment(seg.epoch, world, None).order), world, self.drop_last)[0]
                )
                if self.order_free()
                else None
            )
            if done is None:
                done = self.whole_epoch_length(seg.epoch, world)
            if done or not seg.order:
                self.load_whole_epoch(saved, world, done)
                return
        self.state = WorldState(world, new, position=base, pending=("load", base))
        self.state.extra = dict(saved.extra)
        self.on_elastic_load(saved)

    def order_free(self) -> bool:
        """Whether ``order_of`` ignores its ``extra``."""
        return True

    def whole_epoch_length(self, epoch: int, world: int) -> int:
        raise NotImplementedError

    def load_whole_epoch(self, saved: WorldState, world: int, position: int) -> None:
        """A load that puts this world at ``position`` of its own whole epoch (the epoch's
        start, or a finished epoch under the rule before issue 42)."""
        placeholder = replace(saved.seg, origin=world, offset=0, base=0)
        self.state = WorldState(world, placeholder, position=position, pending=("load", position))
        self.state.extra = dict(saved.extra)
        self.on_elastic_load(saved)
        self.state.seg = self.segment(saved.seg.epoch, world, self.transfer_extra(saved, world))

    def transfer_extra(self, saved: WorldState, world: int) -> Any:
        """Hook: the ``extra`` a whole epoch of this world has after loading ``saved``."""
        return saved.seg.extra

    def on_same_world_load(self, saved: WorldState) -> None:
        """Hook."""

    def on_elastic_load(self, saved: WorldState) -> None:
        """Hook."""
