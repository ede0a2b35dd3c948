"""Reference model of ``croupier.StatefulDataLoader`` over a ``croupier.DistributedSampler``
(kempnerforge's ``StatefulDataLoader``, seed file 001; docs/checkpointing.md; API.md), with
elastic resumes.

The semantics encoded (every rank of a world moves in lockstep; one model serves the world):

- The epoch's global order ``G`` (length ``N``) does not depend on the world size: for
  ``order="torch"`` it is torch's own ``DistributedSampler`` order on one rank (an independent
  oracle); for ``order="global"`` it is read once from a fresh ``num_replicas=1`` croupier sampler
  iterated uninterrupted (the permitted oracle).
- A world of ``W`` ranks deals a *segment* of the epoch: the rest ``R = G[offset:]`` (all of
  ``G`` for a fresh epoch), rank ``r`` taking ``R``'s positions ``r, r + W, ...`` with torch's
  padding (``drop_last=False``: ``R`` padded to ``ceil(|R|/W) * W`` by repeating its head as
  often as needed) or dropping (``floor(|R|/W) * W`` kept). With dropping, the epoch ends
  where its first world cut it: an elastic rest deals what remains of ``G[:floor(N/W0) W0]``
  (the first world's cut stays dropped; croupier's documented rule). The loader cuts a rank's
  items into batches of ``batch_size`` (its own ``drop_last`` drops a short last batch).
- The loader's state is ``{"epoch", "batches_yielded", "sampler"}``: the batches of the epoch
  handed to the caller (counted from the epoch's start, across world changes) and the sampler's
  state at that point, whose ``position`` is the sampler items of the epoch consumed. A load
  resumes at exactly the next batch; a state saved after an epoch's last batch names the next
  epoch from its start (the epoch advances by itself).
- Elastic load (saved on ``W``, loaded on ``W' != W``) at sampler position ``p`` of a segment
  that began at position ``p0`` with offset ``o``: the old ranks consumed
  ``o + min((p - p0) * W, |R|)`` items of ``G``; the new segment is the rest from there, dealt
  to ``W'``. After the load the sampler reports ``position == p`` (counting up from it) and
  ``batches_yielded`` goes on from the old world's count.
- THE LEN RULE: ``len(sampler) == p0 + |this rank's share of the segment|`` and
  ``len(loader) == b0 + batches of the whole segment`` (``b0`` the batches yielded when the
  segment began), i.e. after any load, len is what the state records plus what the next
  iteration yields. A fresh epoch has ``p0 = b0 = 0``.
- ``iter(loader)`` without a pending start (a load) repeats the world's epoch from its start
  (torch's rule; after an elastic load, the start of the rest: what the old world consumed is
  gone). ``set_epoch(e)`` keeps a loaded position of epoch ``e``; another epoch starts from 0 as
  an ordinary epoch of the current world.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


def torch_global_order(n: int, shuffle: bool, seed: int, epoch: int) -> list[int]:
    """torch's ``DistributedSampler`` order on one rank (world-size invariant)."""
    from torch.utils.data import DistributedSampler

    s = DistributedSampler(range(n), num_replicas=1, rank=0, shuffle=shuffle, seed=seed)
    s.set_epoch(epoch)
    return list(s)


def deal(rest: list[int], world: int, rank: int, drop_last: bool) -> list[int]:
    """torch's dealing of ``rest`` to ``world`` ranks: rank ``rank``'s items."""
    if drop_last:
        total = (len(rest) // world) * world
        padded = rest[:total]
    else:
        total = -(-len(rest) // world) * world
        padded = [rest[i % len(rest)] for i in range(total)] if rest else []
    return padded[rank:total:world]


def cut(items: list[int], batch_size: int, drop_last: bool) -> list[list[int]]:
    batches = [items[i : i + batch_size] for i in range(0, len(items), batch_size)]
    if drop_last and batches and len(batches[-1]) < batch_size:
        batches.pop()
    return batches


@dataclass(frozen=True)
class Segment:
    """What a world deals of an epoch: ``G[offset:]`` on ``world`` ranks, starting at sampler
    position ``p0`` and loader batch ``b0``."""

    offset: int
    world: int
    p0: int = 0
    b0: int = 0
    #: Where the epoch's global order ends as its first world dealt it (``None``: ``N``).
    #: With ``drop_last`` the first world keeps ``floor(N / W) * W``; an elastic rest deals
    #: what remains of that, so the first world's cut stays dropped.
    end: int | None = None


@dataclass
class LoaderModel:
    n: int
    batch_size: int
    sampler_drop_last: bool
    loader_drop_last: bool
    world: int
    epoch: int = 0
    seg: Segment | None = None
    position: int = 0  # sampler position (items of this rank's epoch consumed)
    batches: int = 0  # loader batches of the epoch handed out
    pending: bool = False  # a loaded start waiting for the next iteration
    live: bool = False  # an iteration started (advanced at least once) and not finished
    created: bool = False  # an iteration created (lazy: nothing happens before its first next)
    # The segment of an epoch whose last batch is out while the sampler still stands in that
    # epoch (the loader passes the next epoch to it at the next iteration): lengths describe it.
    ended: Segment | None = None

    def __post_init__(self) -> None:
        if self.seg is None:
            self.seg = self.fresh_segment()

    def fresh_segment(self) -> Segment:
        end = self.n // self.world * self.world if self.sampler_drop_last else self.n
        return Segment(0, self.world, end=end)

    def end(self, seg: Segment) -> int:
        return self.n if seg.end is None else seg.end

    # -- what a segment holds ------------------------------------------------------------
    def share(self, order: list[int], rank: int) -> list[int]:
        seg = self.seg
        return deal(order[seg.offset : self.end(seg)], self.world, rank, self.sampler_drop_last)

    def share_len(self, seg: Segment | None = None) -> int:
        seg = seg or self.seg
        rest = self.end(seg) - seg.offset
        w = seg.world
        return rest // w if self.sampler_drop_last else -(-rest // w)

    def sampler_len(self) -> int:
        seg = self.ended or self.seg
        return seg.p0 + self.share_len(seg)

    def loader_len(self) -> int:
        seg = self.ended or self.seg
        m, b = self.share_len(seg), self.batch_size
        return seg.b0 + (m // b if self.loader_drop_last else -(-m // b))

    def remaining(self, order: list[int], rank: int) -> list[list[int]]:
        """The batches the rest of the live iteration (or the next one) yields."""
        start = self.position if (self.pending or self.live or self.created) else self.seg.p0
        items = self.share(order, rank)[start - self.seg.p0 :]
        return cut(items, self.batch_size, self.loader_drop_last)

    # -- operations ----------------------------------------------------------------------
    def new_iterator(self) -> None:
        self.ended = None
        self._new_iterator()

    def _new_iterator(self) -> None:
        """``iter(loader)``: without a pending start, the world's epoch starts again at once
        (nothing handed out yet); a pending start waits for the first batch."""
        if not self.pending:
            self.position, self.batches = self.seg.p0, self.seg.b0
        self.live, self.created = False, True

    def take(self, k: int, order: list[int], rank_count: int) -> tuple[list[list[list[int]]], bool]:
        """The batches of every rank that ``k`` next() calls yield, and whether the epoch ended."""
        if k == 0:
            return [[] for _ in range(rank_count)], False
        if self.created and not self.live:
            self.pending, self.live, self.created = False, True, False
        if not self.live:  # the iteration already ended
            return [[] for _ in range(rank_count)], False
        per_rank = [self.remaining(order, r) for r in range(rank_count)]
        left = len(per_rank[0])
        n = min(k, left)
        got = [b[:n] for b in per_rank]
        self.position = min(self.position + n * self.batch_size, self.sampler_len())
        ended_seg = self.seg
        self.batches += n
        ended = n == left  # its last batch is out (or an empty iteration ran to its end)
        if ended:
            self.next_epoch(self.epoch + 1)
            self.live, self.ended = False, ended_seg
        return got, ended

    def next_epoch(self, epoch: int) -> None:
        self.epoch, self.seg = epoch, self.fresh_segment()
        self.position = self.batches = 0
        self.pending = False

    def set_epoch(self, epoch: int) -> None:
        self.ended = None
        if epoch != self.epoch:
            self.next_epoch(epoch)
        self.live = self.created = False

    def load(self, world: int) -> None:
        """This model's own state loaded into a world of ``world`` ranks."""
        self.ended = None
        if world != self.world and self.position == 0 and self.seg.offset == 0:
            # Nothing consumed: the new world starts the epoch as its own (its own cut).
            self.world = world
            self.seg = self.fresh_segment()
        elif world != self.world:
            seg = self.seg
            done = self.position - seg.p0
            if done >= self.share_len(seg):
                # A finished epoch (or rest) is done on any world: what the saved world's
                # drop_last dropped comes back next epoch, not in this world's rest
                # (tests/models/world.py, issue 42's rules).
                offset = self.end(seg)
            else:
                offset = seg.offset + min(done * self.world, self.end(seg) - seg.offset)
            self.seg = Segment(offset, world, self.position, self.batches, seg.end)
            self.world = world
        self.pending, self.live, self.created = True, False, False

    def copy(self) -> LoaderModel:
        return replace(self)
