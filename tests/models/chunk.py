"""Reference model of ``croupier.ChunkSampler`` (annbatch's chunked load requests, seed file
002; docs/samplers.md; the class docstring).

The semantics encoded:

- The epoch's chunk order: the full chunks of ``chunk_size`` observations of the sampled range,
  permuted by a permutation keyed by the seed and the epoch (not by the world size), then the
  short last chunk, if any. It cannot be re-derived independently, so the model reads it once
  from a fresh ``num_replicas=1`` sampler iterated uninterrupted (the permitted oracle) and
  checks its shape; the in-memory shuffle of each request is read the same way per rank.
- Chunks are dealt as torch deals indices: rank ``r`` takes order positions ``r, r + W, ...``;
  ``drop_last`` cuts the order to a multiple of ``W``, otherwise its head is repeated. A rank's
  chunks go ``preload_nchunks`` at a time into load requests ``{"slices", "splits"}``: the
  slices in that order, the splits batches of ``batch_size`` positions into the concatenated
  loaded rows; every rank yields ``n_iters(n_obs)`` batches.
- Position (``state_dict()["position"]``) counts the batches of the epoch handed out: whole
  requests while iterating; ``state_dict(batches_consumed=k)`` names the latest request's
  first ``k`` batches instead (``k`` in ``[0, batches of it handed out]``). Loading a state
  resumes at its batch: the request holding it, with only its batches from there (its slices
  unchanged), then the rest. A finished pass has ``position == n_iters``; sampling again
  without ``set_epoch`` repeats the epoch from the start unless a start is pending (a load, a
  pickled copy). ``set_epoch(same)`` keeps the position, another epoch starts from 0.
  ``sample`` starts lazily (a generator).
- Not elastic: a state from another world size is refused; bad states change nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

Request = tuple[tuple[tuple[int, int], ...], tuple[tuple[int, ...], ...]]


def as_request(request: dict) -> Request:
    slices = tuple((s.start, s.stop) for s in request["slices"])
    splits = tuple(tuple(int(i) for i in x) for x in request["splits"])
    return slices, splits


def check_chunk_order(order: list[tuple[int, int]], start: int, stop: int, chunk: int) -> None:
    """The shape of an epoch's chunk order over ``[start, stop)``."""
    full = [(a, a + chunk) for a in range(start, stop - chunk + 1, chunk)]
    tail = [] if (stop - start) % chunk == 0 else [(stop - (stop - start) % chunk, stop)]
    assert sorted(order[: len(full)]) == full
    assert order[len(full) :] == tail


def deal(order: list, world: int, rank: int, drop_last: bool) -> list:
    if drop_last:
        total = (len(order) // world) * world
        padded = order[:total]
    else:
        total = -(-len(order) // world) * world
        padded = [order[i % len(order)] for i in range(total)] if order else []
    return padded[rank:total:world]


def rank_slices(order, world, rank, drop_last, preload) -> list[tuple[tuple[int, int], ...]]:
    """The slices of each load request of ``rank`` (before any equalising of batch counts)."""
    mine = deal(order, world, rank, drop_last)
    return [tuple(mine[i : i + preload]) for i in range(0, len(mine), preload)]


def check_requests(requests: list[Request], slices, batch_size: int, total: int) -> None:
    """A rank's uninterrupted epoch: its requests read its chunks in order, and its splits are
    batches of positions into what each request loads."""
    got = [r[0] for r in requests]
    assert got[:-1] == list(slices)[: len(got) - 1]
    if got:  # the last request may be cut short when batch counts are equalised
        assert got[-1] == slices[len(got) - 1][: len(got[-1])]
    count = 0
    for j, (req_slices, splits) in enumerate(requests):
        loaded = sum(b - a for a, b in req_slices)
        for split in splits:
            assert all(0 <= i < loaded for i in split)
            if j < len(requests) - 1:  # a smaller rank pads its last request with repeats
                assert len(set(split)) == len(split)
        assert all(len(x) == batch_size for x in splits[:-1])
        count += len(splits)
    assert count == total


@dataclass
class ChunkModel:
    """Where the ranks stand (in lockstep)."""

    epoch: int = 0
    position: int = 0
    pending: bool = False
    live: int | None = None  # the next request index of the live pass (None: no live pass)
    first: int = 0  # the position of the latest request's first batch handed out
    created: bool = False  # a pass created, not yet advanced (lazy)

    def start(self) -> int:
        return self.position if self.pending else 0

    def new_pass(self) -> None:
        self.created, self.live = True, None

    def take(self, k: int, epoch_requests: list[list[Request]]) -> list[list[Request]]:
        """The requests each rank yields for ``k`` next() calls."""
        cum = [0]
        for _, splits in epoch_requests[0]:
            cum.append(cum[-1] + len(splits))
        if k == 0:
            return [[] for _ in epoch_requests]
        if self.created:
            start = self.start()
            self.created, self.pending = False, False
            self.position = self.first = start
            # the request holding `start`, from its batch there
            j = next((i for i in range(len(cum) - 1) if cum[i] <= start < cum[i + 1]), None)
            self.live = len(cum) - 1 if j is None else j
            self.skip = 0 if j is None else start - cum[j]
        if self.live is None:
            return [[] for _ in epoch_requests]
        out = [[] for _ in epoch_requests]
        for _ in range(k):
            j = self.live
            if j >= len(cum) - 1:
                break
            for r, reqs in enumerate(epoch_requests):
                slices, splits = reqs[j]
                out[r].append((slices, splits[self.skip :]))
            self.first = cum[j] + self.skip
            self.position = cum[j + 1]
            self.skip = 0
            self.live = j + 1
        return out

    def set_epoch(self, epoch: int) -> None:
        if epoch != self.epoch:
            self.epoch, self.position, self.pending, self.first = epoch, 0, False, 0
        self.live, self.created = None, False

    def loaded(self, epoch: int, position: int) -> None:
        self.epoch, self.position, self.pending, self.first = epoch, position, True, position
        self.live, self.created = None, False
