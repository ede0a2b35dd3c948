"""``croupier.BucketBatchSampler``: batches of samples of similar length, under a size or a
padded-token budget, in equal numbers on every rank.

The grouping and the batches are computed by the Rust core (``croupier_core::bucket``); this
module checks arguments and keeps the configuration for checkpoints.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from croupier import _core
from croupier._dist import DistInfo, resolve_ranks
from croupier._frameworks import refuse_a_sampler
from croupier._validate import (
    MAX_LEN,
    ORDERS,
    U64_MAX,
    check_bool,
    check_choice,
    check_int,
    check_order,
    resume_hint,
)
from croupier.samplers._base import Batches, BatchSampler
from croupier.samplers._state import StateFormat, different

__all__ = ["BucketBatchSampler"]

_BUCKET_ORDERS = ("shuffled", "sequential")
_OVERSIZED = ("alone", "error")
DEFAULT_BUCKETS = 64
"""Buckets when ``buckets`` is not given."""


def _lengths(lengths: object) -> npt.NDArray[Any]:
    """``lengths`` as a 1-D ``uint32``/``uint64`` array (the caller's array when it already is)."""
    if isinstance(lengths, (str, bytes)) or not isinstance(lengths, (Sequence, np.ndarray)):
        raise TypeError(
            f"lengths must be a 1-D integer numpy array or sequence, got {type(lengths).__name__}"
        )
    try:
        arr: npt.NDArray[Any] | None = np.asarray(lengths)
    except (ValueError, TypeError, OverflowError):
        arr = None  # ragged or mixed: checked element by element below
    # numpy holds a list with ints past int64 as float64 (rounded) or object: those, and
    # lists numpy cannot hold, are read element by element as Python ints.
    if (
        arr is None
        or arr.dtype.kind == "O"
        or (arr.dtype.kind == "f" and not isinstance(lengths, np.ndarray))
    ):
        arr = _int_lengths(lengths)  # type: ignore[arg-type]
    if arr.ndim != 1:
        raise ValueError(f"lengths must be 1-D, got shape {arr.shape}")
    if arr.size == 0:
        raise ValueError("lengths must not be empty")
    if arr.dtype.kind not in "iu":
        raise TypeError(f"lengths must hold integers, got dtype {arr.dtype}")
    if arr.dtype.kind == "i":
        low = int(arr.min())
        if low < 0:
            raise ValueError(
                f"lengths must be >= 0 (in [0, 2**64 - 1]), got {low} at index {int(arr.argmin())}"
            )
    if arr.dtype not in (np.uint32, np.uint64):
        arr = arr.astype(np.uint64)
    return np.ascontiguousarray(arr)


def _int_lengths(lengths: Sequence[object]) -> npt.NDArray[Any]:
    """``lengths`` (a sequence, or an object array) as ``uint64``, element by element: each an
    integer (``bool`` and floats refused, as :func:`croupier._validate.as_int` refuses them)
    in ``[0, 2**64 - 1]``."""
    values = []
    for i, x in enumerate(lengths):
        if isinstance(x, (bool, np.bool_)):
            raise TypeError(f"lengths must hold integers, got bool at index {i}")
        try:
            v = operator.index(x)  # type: ignore[arg-type]
        except TypeError:
            raise TypeError(
                f"lengths must hold integers, got {type(x).__name__} at index {i}"
            ) from None
        if not 0 <= v <= U64_MAX:
            bound = ">= 0" if v < 0 else "< 2**64"
            raise ValueError(f"lengths must be {bound} (in [0, 2**64 - 1]), got {v} at index {i}")
        values.append(v)
    return np.array(values, dtype=np.uint64)


def _frozen(flat: npt.NDArray[Any], offsets: npt.NDArray[Any]) -> Batches:
    """The core's batches as read-only views (they may be cached and handed out again)."""
    flat.flags.writeable = False
    offsets.flags.writeable = False
    return Batches(flat, offsets)


def _optional_positive(name: str, value: object) -> int | None:
    return None if value is None else check_int(name, value, 1, U64_MAX)


class BucketBatchSampler(BatchSampler):
    """Yields batches (``list[int]``) of samples of similar length, the same number on every rank.

    **Buckets.** Samples are grouped by length: ``buckets`` is a sequence of boundaries
    (strictly increasing; bucket ``j`` holds lengths in ``[b_j, b_{j+1})``, the first from 0,
    the last open) or a number of buckets (default 64). In the global order (the default) a
    number of buckets gets the boundaries that minimise padding (the padded cost
    ``sum_j n_j * cost(L_j)`` over the lengths, ``L_j`` bucket ``j``'s longest, solved
    exactly over up to 4,096 distinct lengths, more merged into levels first; from 2,048
    buckets, quantiles); in the per-rank order, the ``j/64`` quantiles of ``lengths``. Repeated
    values merge buckets. Every batch comes from one bucket.

    **Batches.** Bucket ``j``'s batches hold ``batch_size`` samples, or with ``max_tokens``
    ``max_tokens // cost(L_j)`` (``L_j`` the bucket's longest sample; at most ``batch_size``),
    rounded down to a multiple of ``batch_size_multiple`` when one fits: so
    ``len(batch) * cost(longest in batch) <= max_tokens`` always holds (lhotse's rule lets a
    batch exceed it by one sample). A sample of length ``L`` costs ``L`` padded tokens, or
    ``L + L**2 / quadratic`` with ``quadratic`` (attention's quadratic cost: batches of long
    samples get fewer of them). A sample costing more than ``max_tokens`` is served alone
    (``oversized="alone"``, the default: a batch of one, over the budget) or refused at
    construction (``oversized="error"``). In the global order every bucket keeps a whole
    number of batches and carries the rest of its samples (its longest, fewer than a batch) to
    the next bucket where they fit one of its batches (else keeps them, a short batch), so
    batches are full but a few, and the ranks of a step do nearly equal work (a step may still
    pair a full batch with a short one where ranks have few batches each). In the per-rank
    order each bucket's last batch may be short. With ``batch_size`` alone and
    ``drop_last=True`` the short batches are left out, so every batch holds exactly
    ``batch_size`` samples (rounded down by ``batch_size_multiple``), as with torch's
    ``BatchSampler(drop_last=True)``: static shapes for compiled models. Batch counts are
    fixed at construction, so ``len(self)`` never changes.

    **Order** (``order="global"``, the default). Each epoch shuffles every bucket's samples
    (seeded by ``seed``, the epoch and the bucket), cuts them into batches, and orders all
    batches in one global sequence, the same for every number of ranks: in units of ``sync``
    (default 64, a power of two) consecutive batches, the units in a shuffled order. A unit
    is a run of one bucket's batches, or a block of consecutive batches of the remainder
    stream (every bucket's batches past its whole runs, bucket after bucket, shortest first),
    shuffled inside with its aligned sub-blocks kept together; the ``R % sync`` batches the
    stream has left over (a keyed slot of it) end the epoch. Global step ``k`` trains on
    positions ``[kW, (k+1)W)`` of the sequence, one batch per rank, so with ``W`` dividing
    ``sync`` the ranks of a step draw from one bucket, or from neighbouring ones in the
    remainder stream, and finish together.
    ``sync=1`` shuffles batches one by one.
    ``bucket_order="sequential"``: the buckets from shortest to longest instead of shuffled
    units. With ``shuffle=False`` nothing is shuffled: buckets in order, each bucket's samples
    in index order (the ones carried to it from the bucket before first). ``order="per_rank"``
    is croupier's earlier order (called ``"fast"`` before, still accepted with a
    ``DeprecationWarning``): fixed batch sizes per bucket, the batch order drawn for the number
    of ranks (so it changes with it), quantile buckets.

    **Ranks.** Rank ``r`` takes batches ``r, r + W, r + 2W, ...`` of the epoch's batch order,
    like ``DistributedSampler`` takes samples: with ``drop_last=False`` the first batches are
    repeated until every rank has ``ceil(B / W)`` (``B`` batches in the epoch), with
    ``drop_last=True`` the last ``B % W`` batches are dropped. So every rank yields
    ``len(self)`` batches and DDP collectives never wait on a rank that ran out. A state saved
    mid-epoch on ``W`` ranks continues on ``W'`` ranks with the rest of the same sequence.

    Batches are computed in Rust and handed over as two numpy arrays (indices and offsets,
    :meth:`batches`). The first batch of an iteration, or of a resume at any batch, is read on
    its own (in the global order it cuts only its bucket), the rest of the epoch at once (every
    bucket cut in parallel), on a thread for large epochs. Positions, ``len`` and state count
    batches; :meth:`state_dict`/:meth:`load_state_dict` resume at exactly the next batch.

    Args:
        lengths: per-sample sizes (tokens, frames, pixels), a 1-D integer array or sequence,
            read once into Rust.
        batch_size: most samples per batch (``>= 1``).
        max_tokens: most padded tokens per batch, ``len(batch) * cost(longest in batch)``.
            At least one of ``batch_size`` and ``max_tokens`` is needed.
        buckets: boundaries, or the number of buckets (default 64).
        batch_size_multiple: batch sizes rounded down to a multiple of this (default 1).
        quadratic: with ``max_tokens``, a sample of length ``L`` costs ``L + L**2 / quadratic``
            tokens (lhotse's ``quadratic_duration``). ``None`` (default): ``L`` tokens.
        oversized: ``"alone"`` or ``"error"`` for samples costing more than ``max_tokens``.
        bucket_order: ``"shuffled"`` (batches of all buckets mixed) or ``"sequential"``.
        order: ``"global"`` (one batch sequence for every number of ranks, batches full but
            a few) or ``"per_rank"`` (the earlier order, see above).
        sync: in the global order, the consecutive batches of a unit (a power of two in
            ``[1, 2**20]``; default 64): steps of ``W`` ranks stay within one unit when ``W``
            divides it.
        num_replicas, rank, dist_info: the ranks, as for :class:`~croupier.DistributedSampler`.
        shuffle: shuffle samples within buckets and the batch order.
        seed: non-negative integer below ``2**64``, the same on all ranks.
        drop_last: equalise batch counts across ranks by dropping the last ``B % W`` batches
            instead of repeating the first ones; with ``batch_size`` and no ``max_tokens``,
            also yield only full batches (the short ones are left out). With ``max_tokens``
            batch sizes differ anyway, and the short batches stay whatever ``drop_last``
            says.
    """

    _config_names = (
        "num_replicas",
        "rank",
        "batch_size",
        "max_tokens",
        "batch_size_multiple",
        "quadratic",
        "oversized",
        "bucket_order",
        "order",
        "sync",
        "shuffle",
        "seed",
        "drop_last",
    )

    def __init__(
        self,
        lengths: Sequence[int] | npt.NDArray[Any],
        batch_size: int | None = None,
        *,
        max_tokens: int | None = None,
        buckets: int | Sequence[int] = DEFAULT_BUCKETS,
        batch_size_multiple: int = 1,
        quadratic: int | None = None,
        oversized: str = "alone",
        bucket_order: str = "shuffled",
        order: str = "global",
        sync: int | None = None,
        num_replicas: int | None = None,
        rank: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        dist_info: DistInfo = None,
    ) -> None:
        refuse_a_sampler("BucketBatchSampler", "lengths", lengths)
        arr = _lengths(lengths)
        self.batch_size = _optional_positive("batch_size", batch_size)
        self.max_tokens = _optional_positive("max_tokens", max_tokens)
        if self.batch_size is None and self.max_tokens is None:
            raise ValueError("give batch_size, max_tokens or both (neither was given)")
        self.batch_size_multiple = check_int("batch_size_multiple", batch_size_multiple, 1, MAX_LEN)
        self.quadratic = _optional_positive("quadratic", quadratic)
        if self.quadratic is not None and self.max_tokens is None:
            raise ValueError("quadratic applies to max_tokens batches: give max_tokens too")
        oversized = check_choice("oversized", oversized, _OVERSIZED)
        bucket_order = check_choice("bucket_order", bucket_order, _BUCKET_ORDERS)
        self.order = check_order("BucketBatchSampler", order)
        # The order's default when None; the core checks the rest before any work (a power of
        # two for the global order, none at all for the per-rank order, which has no runs).
        self.sync = None if sync is None else check_int("sync", sync, 1, 1 << 20)
        self.oversized = oversized
        self.bucket_order = bucket_order
        boundaries, count = self._buckets(buckets)
        self.shuffle = check_bool("shuffle", shuffle)
        self.drop_last = check_bool("drop_last", drop_last)
        self.seed = check_int("seed", seed, 0, U64_MAX)
        num_replicas, rank = resolve_ranks(num_replicas, rank, dist_info)
        self._lengths = arr
        self._buckets_arg = (boundaries, count)
        # torch's BatchSampler(drop_last=True) promise: every batch holds batch_size.
        self._full_batches = self.drop_last and self.max_tokens is None
        self._plan = self._build()
        self.sync = self._plan.sync
        self._digest = self._plan.digest
        super().__init__(num_replicas, rank)

    @staticmethod
    def _buckets(buckets: object) -> tuple[list[int] | None, int]:
        if isinstance(buckets, (int, np.integer)) and not isinstance(buckets, bool):
            return None, check_int("buckets", buckets, 1, 1 << 20)
        if isinstance(buckets, (Sequence, np.ndarray)) and not isinstance(buckets, (str, bytes)):
            bounds = [check_int(f"buckets[{i}]", b, 1, U64_MAX) for i, b in enumerate(buckets)]
            for i in range(1, len(bounds)):
                if bounds[i] <= bounds[i - 1]:
                    raise ValueError(
                        f"buckets must be strictly increasing boundaries, got buckets[{i}] = "
                        f"{bounds[i]} <= buckets[{i - 1}] = {bounds[i - 1]}"
                    )
            return bounds, len(bounds) + 1
        raise TypeError(
            "buckets must be a number of buckets or a sequence of boundaries, got "
            f"{type(buckets).__name__}"
        )

    def _build(self) -> _core.Buckets:
        boundaries, count = self._buckets_arg
        return _core.Buckets(
            self._lengths,
            boundaries=boundaries,
            num_buckets=count,
            batch_size=self.batch_size,
            max_tokens=self.max_tokens,
            multiple=self.batch_size_multiple,
            quadratic=self.quadratic,
            oversized_alone=self.oversized == "alone",
            full_batches=self._full_batches,
            order=self.order,
            sync=self.sync,
            seed=self.seed,
            shuffle=self.shuffle,
            shuffle_batches=self.bucket_order == "shuffled",
        )

    @property
    def boundaries(self) -> list[int]:
        """The bucket boundaries in use (given, or the ones found)."""
        return list(self._plan.boundaries)

    def bucket_sizes(self) -> list[tuple[int, int, int, int]]:
        """Per bucket: ``(samples, batch size, batches, longest length)``, the same every epoch;
        the last entry holds the samples costing more than ``max_tokens`` (served alone). In the
        global order a bucket's samples count those carried to it and not those it carried on,
        and the longest length is of its own samples (its batch size's basis)."""
        return list(self._plan.buckets())

    # -- the sampler base ----------------------------------------------------------------------

    def _config(self) -> dict[str, Any]:
        return {
            "samples": len(self._lengths),
            "lengths_digest": self._digest,
            "boundaries": self.boundaries,
            "batch_size": self.batch_size,
            "max_tokens": self.max_tokens,
            "batch_size_multiple": self.batch_size_multiple,
            "quadratic": self.quadratic,
            "oversized": self.oversized,
            "bucket_order": self.bucket_order,
            "order": self.order,
            "sync": self.sync,
            "shuffle": self.shuffle,
            "drop_last": self.drop_last,
            "seed": self.seed,
        }

    def _epoch_length(self, num_replicas: int) -> int:
        return int(_core.layout(self._batches(), num_replicas, self.drop_last)[0])

    def _batches(self) -> int:
        """Batches of an epoch over all ranks, before padding or cutting."""
        return int(self._plan.batches)

    def _compute(self, epoch: int, start: int, stop: int | None) -> Batches:
        return self._range(None, epoch, start, self._length if stop is None else stop)

    def _range(self, elastic: tuple[int, int] | None, epoch: int, start: int, stop: int) -> Batches:
        """Batches ``[start, stop)`` of ``epoch`` (of its elastic rest when ``elastic`` is
        ``(origin, offset)``); the core picks the order's algorithm and keeps epoch plans."""
        flat, offsets = self._plan.range(
            epoch,
            start,
            stop,
            num_replicas=self.num_replicas,
            rank=self.rank,
            drop_last=self.drop_last,
            elastic=elastic,
        )
        return _frozen(flat, offsets)

    def _first_stop(self, start: int) -> int:
        return start + 1

    # Elastic resume: the epoch's batch sequence (the global order's, or the per-rank order's as
    # the world it started in dealt it), from the batches its ranks consumed on, dealt to
    # this world's ranks with torch's arithmetic.
    _elastic_supported = True

    def _global_end(self, origin: int) -> int:
        return int(_core.epoch_end(self._batches(), origin, self.drop_last))

    def _elastic_length(self, origin: int, offset: int, num_replicas: int) -> int:
        return int(self._plan.elastic_batches(origin, offset, num_replicas, self.drop_last))

    def _compute_elastic(
        self, origin: int, offset: int, epoch: int, start: int, stop: int | None
    ) -> Batches:
        if stop is None:
            stop = self._elastic_length(origin, offset, self.num_replicas)
        return self._range((origin, offset), epoch, start, stop)

    def _elastic_first_stop(self, start: int, length: int) -> int:
        return min(start + 1, length)

    # After the first batch, the rest of a large epoch is computed on a thread while the
    # next batches are read on their own (each cuts only its bucket).
    _background_from = 1 << 10

    # -- states of the other order ------------------------------------------------------------

    def _as_native(self, state: object) -> tuple[Mapping[str, Any], StateFormat | None]:
        # A state saved before the global order existed has no order: the per-rank one, the only
        # one there was.
        native, fmt = super()._as_native(state)
        if fmt is None and "order" not in native:
            native = {**native, "order": "per_rank", "sync": None}
        return native, fmt

    def _check_config(self, native: Mapping[str, Any]) -> None:
        """Refuses a state of the other order with how to resume it."""
        theirs = native.get("order")
        if theirs in ORDERS["BucketBatchSampler"] and theirs != self.order:
            raise different(
                [
                    f"order: state has {theirs!r} ({resume_hint(theirs)}), this sampler has "
                    f"{self.order!r}"
                ]
            )

    def __getstate__(self) -> dict[str, Any]:
        # The plan is rebuilt from the lengths in the new process rather than shipped.
        state = super().__getstate__()
        state.pop("_plan", None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        object.__setattr__(self, "_plan", self._build())
