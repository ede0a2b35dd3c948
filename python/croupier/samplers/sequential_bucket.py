"""``croupier.SequentialBucketSampler``: NeMo Automodel's multi-resolution bucket sampler.

Buckets are processed one after another (all of bucket A's batches, then bucket B's), each
shuffled, padded to a multiple of the ranks and dealt, then cut into batches of the bucket's
size. The batches are computed by the Rust core (``croupier_core::bucket::sequential``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from croupier import _core
from croupier._dist import DistInfo, resolve_ranks
from croupier._frameworks import refuse_a_sampler
from croupier._validate import (
    MAX_LEN,
    U64_MAX,
    check_bool,
    check_int,
    check_order,
    core_order_of,
)
from croupier.samplers._base import Batches, BatchSampler
from croupier.samplers._state import NEMO

__all__ = ["SequentialBucketSampler"]

# croupier's own order: each bucket's shuffle from its seekable streams ("torch": NeMo's).
_OWN_ORDERS = {"fast": _core.Order.PER_RANK}


def _resolution(name: str, value: object) -> tuple[int, int]:
    if not isinstance(value, Sequence) or isinstance(value, (str, bytes)) or len(value) != 2:
        raise TypeError(f"{name} must be a (width, height) pair of ints, got {value!r:.80}")
    w, h = (check_int(f"{name}[{i}]", v, 1) for i, v in enumerate(value))
    return w, h


class SequentialBucketSampler(BatchSampler):
    """NeMo Automodel's ``SequentialBucketSampler``: batches bucket by bucket, equal batch
    counts on every rank, mid-epoch state.

    ``dataset`` exposes NeMo's multi-resolution attributes: ``sorted_bucket_keys`` (the
    buckets in order), ``bucket_groups`` (``key -> {"indices": [...], "resolution": (w, h),
    "aspect_name": ...}``) and ``calculator`` (with ``get_dynamic_batch_size(resolution,
    base_batch_size, base_resolution)``, used when ``dynamic_batch_size``; without one the
    batch size is ``max(1, int(base_batch_size * base_area / area))``).

    Each epoch: the bucket order is shuffled (``shuffle_buckets``), then bucket by bucket its
    samples are shuffled (``shuffle_within_bucket``), padded by cycling from the start to a
    multiple of ``num_replicas``, dealt (rank ``r`` takes positions ``r, r + W, ...``) and cut
    into batches of the bucket's size; ``drop_last`` drops a bucket's short last batch. Every
    rank yields ``len(self)`` batches.

    ``order="torch"`` draws the shuffles as NeMo does, from one ``torch.Generator`` seeded with
    ``seed + epoch`` (the bucket order's ``randperm``, then each bucket's from the same
    stream), reproduced in Rust: the batches are exactly NeMo's, so a run can switch samplers
    mid-training. ``order="fast"`` (the default here; :mod:`croupier.compat.nemo` defaults to
    ``"torch"``) draws each bucket's shuffle from croupier's own streams, so a resume computes
    one bucket only.

    State, as NeMo's: ``{"epoch", "batches_yielded"}``, plain ints. ``load_state_dict`` takes
    the epoch from the state and ignores other keys; the next iteration continues after
    ``batches_yielded`` batches. Unlike NeMo, ``batches_yielded`` is the position in the epoch
    (the loaded count plus the batches since), so a checkpoint of a resumed run resumes right.
    Iteration starts lazily at the first ``next()``, as NeMo's generator does.
    """

    _config_names = (
        "dataset",
        "base_batch_size",
        "base_resolution",
        "drop_last",
        "shuffle_buckets",
        "shuffle_within_bucket",
        "dynamic_batch_size",
        "seed",
        "num_replicas",
        "rank",
        "order",
    )
    # Its states are NeMo's, loaded through the base's one path as that state format.
    _state_formats = (NEMO,)
    _native_states = False

    def __init__(
        self,
        dataset: Any,
        base_batch_size: int = 32,
        base_resolution: tuple[int, int] = (512, 512),
        drop_last: bool = True,
        shuffle_buckets: bool = True,
        shuffle_within_bucket: bool = True,
        dynamic_batch_size: bool = False,
        seed: int = 42,
        num_replicas: int | None = None,
        rank: int | None = None,
        *,
        order: str = "fast",
        torch_version: str | None = None,
        dist_info: DistInfo = None,
    ) -> None:
        refuse_a_sampler("SequentialBucketSampler", "dataset", dataset)
        for attr in ("sorted_bucket_keys", "bucket_groups"):
            if not hasattr(dataset, attr):
                raise TypeError(
                    f"dataset must expose {attr} (a NeMo multi-resolution dataset), "
                    f"{type(dataset).__name__} has none"
                )
        self.base_batch_size = check_int("base_batch_size", base_batch_size, 1, MAX_LEN)
        self.base_resolution = _resolution("base_resolution", base_resolution)
        self.drop_last = check_bool("drop_last", drop_last)
        self.shuffle_buckets = check_bool("shuffle_buckets", shuffle_buckets)
        self.shuffle_within_bucket = check_bool("shuffle_within_bucket", shuffle_within_bucket)
        self.dynamic_batch_size = check_bool("dynamic_batch_size", dynamic_batch_size)
        self.seed = check_int("seed", seed, 0, U64_MAX)
        order = check_order("SequentialBucketSampler", order)
        self.order = order
        core_order, _ = core_order_of(order, torch_version, _OWN_ORDERS)
        num_replicas, rank = resolve_ranks(num_replicas, rank, dist_info)
        self.dataset = dataset
        self.bucket_keys = list(dataset.sorted_bucket_keys)
        self.bucket_groups = dataset.bucket_groups
        self.calculator = getattr(dataset, "calculator", None)
        lists, sizes = [], []
        for key in self.bucket_keys:
            group = self.bucket_groups[key]
            indices = np.asarray(group["indices"])
            if indices.ndim != 1 or (indices.size and indices.dtype.kind not in "iu"):
                raise TypeError(f"bucket_groups[{key!r}]['indices'] must be a list of ints")
            if indices.size and int(indices.min()) < 0:
                raise ValueError(f"bucket_groups[{key!r}]['indices'] must be >= 0")
            lists.append(indices.astype(np.uint64).tolist())
            sizes.append(self._get_batch_size(key, group["resolution"]))
        self._core_args: tuple[list[list[int]], list[int], dict[str, Any]] = (
            lists,
            sizes,
            {
                "num_replicas": num_replicas,
                "rank": rank,
                "drop_last": self.drop_last,
                "shuffle_buckets": self.shuffle_buckets,
                "shuffle_within": self.shuffle_within_bucket,
                "order": core_order,
            },
        )
        self._core = self._build_core()
        self._sizes = sizes
        super().__init__(num_replicas, rank, len(self._core))

    def _build_core(self) -> _core.SequentialBuckets:
        """The core object of these buckets (built here only: at construction and unpickling)."""
        buckets, sizes, config = self._core_args
        return _core.SequentialBuckets(buckets, sizes, **config)

    def _get_batch_size(self, key: Any, resolution: Any) -> int:
        """The batch size of bucket ``key`` of ``resolution``: fixed, or scaled by area (at
        most ``MAX_LEN``, the largest number of samples the core deals)."""
        if not self.dynamic_batch_size:
            return self.base_batch_size
        calc = getattr(self.calculator, "get_dynamic_batch_size", None)
        if calc is not None:
            size = calc(tuple(resolution), self.base_batch_size, self.base_resolution)
            return check_int(
                f"calculator.get_dynamic_batch_size(...) for bucket {key!r}", size, 1, MAX_LEN
            )
        w, h = _resolution("resolution", resolution)
        base_area = self.base_resolution[0] * self.base_resolution[1]
        size = max(1, int(self.base_batch_size * base_area / (w * h)))
        if size > MAX_LEN:
            raise ValueError(
                f"the dynamic batch size of bucket {key!r} (resolution {w}x{h}), base_batch_size "
                f"* base area / area = {size}, must be in [1, {MAX_LEN}]: lower base_batch_size"
            )
        return size

    # -- NeMo's methods ------------------------------------------------------------------------

    def __iter__(self) -> Iterator[list[int]]:
        return self._lazy()

    def _lazy(self) -> Iterator[list[int]]:
        # A generator: like NeMo's __iter__, nothing is read until the first next().
        yield from super().__iter__()

    def get_batch_info(self, batch_idx: int) -> dict[str, Any]:
        """The bucket of batch ``batch_idx`` counted in the sorted bucket order (as NeMo
        answers, whatever the epoch's shuffled order): its key, resolution, batch size and
        aspect name; ``{}`` past the end."""
        batch_idx = check_int("batch_idx", batch_idx, 0)
        running = 0
        for j, key in enumerate(self.bucket_keys):
            count = self._core.bucket_batches(j)
            if batch_idx < running + count:
                group = self.bucket_groups[key]
                return {
                    "bucket_key": key,
                    "resolution": group["resolution"],
                    "batch_size": self._sizes[j],
                    "aspect_name": group.get("aspect_name"),
                }
            running += count
        return {}

    def state_dict(self) -> dict[str, Any]:
        """NeMo's state: ``{"epoch": epoch, "batches_yielded": batches of this epoch consumed}``."""
        return super().state_dict()

    def _state_at(self, epoch: int, position: int) -> dict[str, Any]:
        return {"epoch": epoch, "batches_yielded": position}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restores NeMo's state (extra keys are ignored, as NeMo does): the epoch, and the next
        iteration continues after ``batches_yielded`` batches. A wrong type is ``TypeError``; a
        missing key, a negative count or one past the epoch is ``ValueError``, and nothing
        changes.

        The loaded position belongs to the loaded epoch, as for every croupier sampler: the
        usual ``set_epoch(epoch)`` of a resumed loop keeps it, and ``set_epoch`` to another
        epoch starts that epoch from its first batch. (NeMo keeps the skip for the next
        iteration whatever the epoch then; ``croupier.compat.nemo.SequentialBucketSampler``
        does as NeMo does.)"""
        super().load_state_dict(state)  # the base's path, NeMo's shape as its state format

    # -- the sampler base ----------------------------------------------------------------------

    def _config(self) -> dict[str, Any]:
        return {
            "buckets": len(self.bucket_keys),
            "base_batch_size": self.base_batch_size,
            "drop_last": self.drop_last,
            "seed": self.seed,
            "order": self.order,
        }

    def _epoch_length(self, num_replicas: int) -> int:
        if num_replicas != self.num_replicas:
            raise ValueError("SequentialBucketSampler states carry no world size to convert")
        return self._length

    def _check_epoch(self, epoch: int) -> None:
        self._core.check_epoch(self.seed, epoch)

    def _compute(self, epoch: int, start: int, stop: int | None) -> Batches:
        stop = self._length if stop is None else stop
        flat, offsets = self._core.range(self.seed, epoch, start, stop)
        flat.flags.writeable = False
        offsets.flags.writeable = False
        return Batches(flat, offsets)

    def _first_stop(self, start: int) -> int:
        return min(start + 1, self._length)

    def __getstate__(self) -> dict[str, Any]:
        # The core object is rebuilt from its arguments in the new process.
        state = super().__getstate__()
        state.pop("_core", None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        object.__setattr__(self, "_core", self._build_core())
