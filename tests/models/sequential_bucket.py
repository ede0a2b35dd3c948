"""Reference model of ``croupier.SequentialBucketSampler`` (NeMo Automodel's
``SequentialBucketSampler``, seed file 003; docs/samplers.md, docs/checkpointing.md, API.md).

The semantics encoded:

- An epoch on ``W`` ranks, rank ``r`` (NeMo's algorithm): one ``torch.Generator`` seeded
  ``seed + epoch`` draws the bucket order (``randperm`` over ``sorted_bucket_keys``, if
  ``shuffle_buckets``), then bucket after bucket its samples' order (``randperm``, if
  ``shuffle_within_bucket``). Each bucket's order is padded by cycling from its start to a
  multiple of ``W``; rank ``r`` takes its positions ``r, r + W, ...`` and cuts them into
  batches of the bucket's size (``base_batch_size``, or with ``dynamic_batch_size`` the
  calculator's ``get_dynamic_batch_size(resolution, base, base_resolution)``, without one
  ``max(1, int(base * base_area / area))``); ``drop_last`` drops a bucket's short last batch.
  ``order="torch"`` is exactly this (the model derives it with torch itself, an independent
  oracle). ``order="fast"`` draws the shuffles from croupier's own streams: the model reads an
  epoch's batches once from a fresh, uninterrupted sampler (the permitted oracle) and checks
  their structure (every rank's batches of a bucket, over all ranks, are the bucket's samples
  padded by cycling, cut and dropped as above).
- ``len`` is the number of batches every rank yields per epoch (the same every epoch and on
  every rank); after a load it is ``batches_yielded + what the next iteration yields`` = len.
- The state is exactly ``{"epoch": e, "batches_yielded": p}`` (plain ints): ``p`` batches of
  epoch ``e`` consumed (handed out by the live iterator, recorded by a loaded state, or skipped).
  Loading it into a fresh sampler: the next iteration yields the epoch's batches ``p, ...``.
  After a finished iteration ``p == len`` (resuming from it yields nothing). A new iteration
  without a pending start repeats the epoch from its first batch. ``set_epoch(e)`` keeps a
  loaded position, ``set_epoch(other)`` starts that epoch from 0. Iteration starts lazily: an
  iterator that has not been advanced has changed nothing.
- Pickling a sampler is a checkpoint: the copy starts where the original's live iterator stood.
- Not elastic (NeMo's states carry no world size).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Buckets:
    """A NeMo-shaped multi-resolution dataset description."""

    sizes: tuple[int, ...]
    resolutions: tuple[tuple[int, int], ...]
    with_calculator: bool

    def keys(self) -> list[str]:
        return [f"b{i}" for i in range(len(self.sizes))]

    def indices(self, i: int) -> list[int]:
        start = sum(self.sizes[:i])
        return list(range(start, start + self.sizes[i]))


class Calculator:
    """NeMo's calculator, as far as the sampler uses it (batch size grows as area shrinks, with
    a distinct rounding from the default, so the two paths differ)."""

    def get_dynamic_batch_size(self, resolution, base_batch_size, base_resolution):
        area = resolution[0] * resolution[1]
        return max(1, -(-base_batch_size * base_resolution[0] * base_resolution[1] // area))


class Dataset:
    """What the sampler reads of NeMo's datasets."""

    def __init__(self, spec: Buckets) -> None:
        self.sorted_bucket_keys = spec.keys()
        self.bucket_groups = {
            key: {"indices": spec.indices(i), "resolution": spec.resolutions[i], "aspect_name": key}
            for i, key in enumerate(spec.keys())
        }
        self.calculator = Calculator() if spec.with_calculator else None


@dataclass(frozen=True)
class Config:
    spec: Buckets
    base_batch_size: int
    base_resolution: tuple[int, int]
    drop_last: bool
    shuffle_buckets: bool
    shuffle_within_bucket: bool
    dynamic_batch_size: bool
    seed: int
    order: str

    def batch_size(self, i: int) -> int:
        if not self.dynamic_batch_size:
            return self.base_batch_size
        res = self.spec.resolutions[i]
        if self.spec.with_calculator:
            return Calculator().get_dynamic_batch_size(
                res, self.base_batch_size, self.base_resolution
            )
        base_area = self.base_resolution[0] * self.base_resolution[1]
        return max(1, int(self.base_batch_size * base_area / (res[0] * res[1])))

    def bucket_batches(self, i: int, world: int) -> int:
        """Batches of bucket ``i`` per rank."""
        n, bs = self.spec.sizes[i], self.batch_size(i)
        share = -(-n // world)
        return share // bs if self.drop_last else -(-share // bs)

    def length(self, world: int) -> int:
        return sum(self.bucket_batches(i, world) for i in range(len(self.spec.sizes)))


def torch_epoch(config: Config, world: int, rank: int, epoch: int) -> list[list[int]]:
    """NeMo's batches of ``rank`` for ``epoch``, derived step by step with torch."""
    import torch

    g = torch.Generator()
    g.manual_seed(config.seed + epoch)
    order = list(range(len(config.spec.sizes)))
    if config.shuffle_buckets:
        order = [order[i] for i in torch.randperm(len(order), generator=g).tolist()]
    out = []
    for b in order:
        idx = config.spec.indices(b)
        if config.shuffle_within_bucket:
            idx = [idx[i] for i in torch.randperm(len(idx), generator=g).tolist()]
        out += _deal_and_cut(config, b, idx, world, rank)
    return out


def _deal_and_cut(config: Config, b: int, idx: list[int], world: int, rank: int) -> list[list[int]]:
    if not idx:
        return []
    total = -(-len(idx) // world) * world
    padded = [idx[i % len(idx)] for i in range(total)]
    mine = padded[rank::world]
    bs = config.batch_size(b)
    batches = [mine[i : i + bs] for i in range(0, len(mine), bs)]
    if config.drop_last:
        batches = [x for x in batches if len(x) == bs]
    return batches


def check_fast_epoch(config: Config, world: int, per_rank: list[list[list[int]]]) -> None:
    """The structure of a fast-order epoch: buckets one after another in the same order on every
    rank, each bucket's samples (shuffled) padded by cycling, dealt by striding and cut."""
    owner = {}
    for b in range(len(config.spec.sizes)):
        for x in config.spec.indices(b):
            owner[x] = b
    length = config.length(world)
    for batches in per_rank:
        assert len(batches) == length
    # the bucket of every batch, and the same bucket sequence on every rank
    seqs = [[owner[x[0]] for x in batches] for batches in per_rank]
    for batches, seq in zip(per_rank, seqs, strict=True):
        for x, b in zip(batches, seq, strict=True):
            assert {owner[i] for i in x} == {b}
    assert all(seq == seqs[0] for seq in seqs)
    runs = [b for k, b in enumerate(seqs[0]) if k == 0 or seqs[0][k - 1] != b]
    assert len(runs) == len(set(runs)), "a bucket's batches come one after another"
    for b in set(runs):
        n, bs = config.spec.sizes[b], config.batch_size(b)
        share = -(-n // world)
        # the stride: position j of rank r is the bucket order's position j * W + r
        mine = [
            [i for x, o in zip(batches, seqs[0], strict=True) if o == b for i in x]
            for batches in per_rank
        ]
        order = [mine[r][j] for j in range(len(mine[0])) for r in range(world)]
        kept = (share // bs) * bs if config.drop_last else share
        assert all(len(m) == kept for m in mine)
        head = order[: min(n, len(order))]
        assert len(set(head)) == len(head) and set(head) <= set(config.spec.indices(b))
        if not config.drop_last:
            assert sorted(head) == config.spec.indices(b)
            assert order[n:] == [order[i % n] for i in range(len(order) - n)]  # cycled head
        if not config.shuffle_within_bucket:
            assert head == config.spec.indices(b)[: len(head)]


@dataclass
class RankModel:
    """Where one rank stands (all ranks move in lockstep, so one model serves them all)."""

    epoch: int = 0
    position: int = 0
    pending: bool = False  # a start from a load (or a pickled copy) waiting for the next iteration
    live: int | None = None  # where the live iterator stands (None: no live iterator)
    started: bool = False  # whether the live iterator has been advanced (lazy start)
    skip: int | None = None  # a set_skip waiting for the next iteration, whatever its epoch

    @property
    def reported(self) -> int:
        """The position ``state_dict()`` reports."""
        return self.position if self.skip is None else self.skip

    def new_iterator(self) -> None:
        self.live = None
        self.started = False
        self.live = -1  # created, not started

    def advance(self, k: int, length: int) -> tuple[int, int]:
        """Batches ``[a, b)`` of the epoch that ``k`` next() calls on the live iterator yield."""
        if not self.started:
            if k == 0:
                return 0, 0
            self.started = True
            self.live = self.next_start()
            self.position = self.live
            self.pending, self.skip = False, None
        a = self.live
        b = min(a + k, length)
        self.live = b
        self.position = b
        return a, b

    def set_epoch(self, epoch: int) -> None:
        if epoch != self.epoch:
            self.epoch, self.position, self.pending = epoch, 0, False
        self.live, self.started = None, False

    def loaded(self, epoch: int, position: int) -> None:
        self.epoch, self.position, self.pending, self.skip = epoch, position, True, None
        self.live, self.started = None, False

    def set_skip(self, skip: int) -> None:
        self.skip = skip

    def next_start(self) -> int:
        """Where the next fresh iteration starts."""
        if self.skip is not None:
            return self.skip
        return self.position if self.pending else 0
