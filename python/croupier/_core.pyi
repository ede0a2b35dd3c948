"""Type stubs of the compiled module ``croupier._core`` (private; use the ``croupier`` package).

The module only converts: arguments are checked with clear messages by the Python layer
(``croupier._validate``) before they reach it; the core's own checks raise ``ValueError``.
"""

from typing import Any, final

import numpy as np
import numpy.typing as npt

__all__ = [
    "BLEND_MAX_DATASETS",
    "BLEND_WEIGHT_SUM_TOLERANCE",
    "MAX_LEN",
    "MIX_FIRST_STOP",
    "TORCH_LARGE_N",
    "U32_MAX_LEN",
    "Buckets",
    "ChunkPlan",
    "Deal",
    "Mixture",
    "MixtureShape",
    "Order",
    "RankShare",
    "SequentialBuckets",
    "__version__",
    "epoch_end",
    "exhaustive_greatest_error_blend",
    "greatest_error_blend",
    "index_range",
    "index_tile",
    "layout",
    "legacy_shuffle",
    "micro_batches",
    "permutation",
    "permutation_into",
    "sample_index",
    "torch_randperm",
]

__version__: str
MAX_LEN: int
"""The largest dataset length, rank count or position accepted: 2**63 - 1."""
U32_MAX_LEN: int
"""The largest length whose indices are ``uint32``: 2**32."""
BLEND_MAX_DATASETS: int
"""The most datasets a Megatron-Core blend names: 32,767 (its dataset index is ``int16``)."""
BLEND_WEIGHT_SUM_TOLERANCE: float
"""How far a Megatron-Core blend's weights may sum from 1: 1e-6."""
TORCH_LARGE_N: int
"""From this length (2**32 // 20) on, torch >= 2.6 and torch < 2.6 permute differently."""
MIX_FIRST_STOP: int
"""Positions in the first piece a mixture reads (4)."""

_Indices = npt.NDArray[np.uint32] | npt.NDArray[np.int64]

@final
class Order:
    """An epoch order: croupier's own (per-rank: ``PER_RANK``, or world-size-invariant:
    ``GLOBAL``), or torch's CPU ``randperm`` as releases before 2.6 or from 2.6 on compute it.
    ``FAST`` is ``PER_RANK`` under its earlier name."""

    PER_RANK: Order
    FAST: Order
    TORCH_FORWARD: Order
    TORCH_INSIDE_OUT: Order
    GLOBAL: Order
    def __eq__(self, value: object, /) -> bool: ...
    def __hash__(self) -> int: ...
    def __int__(self) -> int: ...

@final
class RankShare:
    """One rank's share of a ``DistributedSampler`` epoch: how the rank is dealt an epoch
    (immutable; the epoch is given per call)."""

    def __new__(
        cls,
        *,
        n: int,
        num_replicas: int,
        rank: int,
        shuffle: bool,
        seed: int,
        drop_last: bool,
        order: Order,
    ) -> RankShare:
        """Every keyword is required; an unknown one is a ``TypeError``."""
    def __getnewargs_ex__(self) -> tuple[tuple[()], dict[str, object]]:
        """Pickles as ``RankShare(**config)``."""
    @property
    def num_samples(self) -> int:
        """This rank's number of indices per epoch (torch's ``num_samples``)."""
    @property
    def total_size(self) -> int:
        """``num_samples * num_replicas`` (torch's ``total_size``)."""
    def indices(self, epoch: int, start: int = 0, stop: int | None = None) -> _Indices:
        """Positions ``[start, stop)`` (default: to the end) of the sequence this rank receives
        in ``epoch``, padded or cut as torch does: ``uint32`` when ``n <= 2**32``, else
        ``int64``. In the fast shuffled order only the blocks holding the positions are
        computed."""
    @property
    def window(self) -> int | None:
        """Positions worth computing at a time while iterating (``None``: the rest of the
        share at once): unshuffled or in the global order the share is streamed."""
    def elastic_first_stop(self, start: int, length: int) -> int:
        """Where the first piece of an elastic rest from ``start`` (of ``length`` positions)
        should stop: a few positions in the per-rank shuffled order, else ``length``."""
    def check_epoch(self, epoch: int) -> None:
        """``ValueError`` for an epoch the order cannot draw (torch's ``seed + epoch`` over
        ``2**64 - 1`` when shuffled)."""
    @property
    def randperm_variant_matters(self) -> bool:
        """Whether torch releases disagree on this share (torch's order, shuffled, from
        ``TORCH_LARGE_N`` samples on)."""
    def first_stop(self, start: int) -> int:
        """Where an :meth:`indices` call starting at ``start`` should stop to hand out its
        first index soonest: in the fast shuffled order, the end of the block holding
        ``start``, or ``start + 64`` inside a long block (read by random access); else
        ``num_samples``."""
    def elastic_indices(
        self, origin: int, offset: int, epoch: int, start: int = 0, stop: int | None = None
    ) -> _Indices:
        """Positions ``[start, stop)`` (default: to the end) of this rank's sequence for the
        rest of ``epoch``, first dealt over ``origin`` ranks, continued from global position
        ``offset`` with torch's padding or dropping on the remainder."""

@final
class Buckets:
    """Samples grouped into length buckets with their batch sizes (immutable), from which any
    rank's batches of any epoch are read in the order chosen at construction; the global
    order's epoch plans are kept for the reads that follow."""

    def __new__(
        cls,
        lengths: npt.NDArray[np.uint32] | npt.NDArray[np.uint64],
        *,
        boundaries: list[int] | None,
        num_buckets: int,
        batch_size: int | None,
        max_tokens: int | None,
        multiple: int,
        quadratic: int | None,
        oversized_alone: bool,
        full_batches: bool,
        order: str,
        sync: int | None,
        seed: int,
        shuffle: bool,
        shuffle_batches: bool,
    ) -> Buckets:
        """Groups ``lengths`` into buckets (``boundaries``, or ``num_buckets`` found the
        order's way: padding-optimal for ``order="global"``, quantiles for ``"per_rank"``)
        with their batch sizes: at most ``batch_size`` samples, at most ``max_tokens`` padded
        tokens, rounded down to a ``multiple``; a sample over ``max_tokens`` alone
        (``oversized_alone``); only full batches of ``batch_size`` (``full_batches``). The
        global order carries each bucket's tail to the next where it fits a batch there, and
        orders units of ``sync`` batches (a power of two; ``None``: 64); the per-rank order
        takes no ``sync``. ``seed``, ``shuffle``
        (within buckets) and ``shuffle_batches`` (the batch order) draw every epoch. Every
        keyword is required; an unknown one is a ``TypeError``."""
    @property
    def boundaries(self) -> list[int]:
        """The bucket boundaries in use."""
    @property
    def sync(self) -> int | None:
        """The global order's unit length, ``None`` in the per-rank order."""
    @property
    def digest(self) -> str:
        """A fingerprint of the lengths (16 hex digits), for checkpoints."""
    @property
    def batches(self) -> int:
        """Batches of every epoch over all ranks, before padding or cutting."""
    @property
    def kept_epochs(self) -> list[int]:
        """The epochs whose global batch plans are kept, oldest first."""
    def buckets(self) -> list[tuple[int, int, int, int]]:
        """Per bucket: ``(members, batch size, batches per epoch, longest sample)``."""
    def range(
        self,
        epoch: int,
        start: int,
        stop: int,
        *,
        num_replicas: int,
        rank: int,
        drop_last: bool,
        elastic: tuple[int, int] | None,
    ) -> tuple[_Indices, npt.NDArray[np.uint64]]:
        """Rank ``rank``'s batches ``[start, stop)`` of ``epoch``: ``(indices, offsets)``. With
        ``elastic=(origin, offset)``: new rank ``rank``'s batches of the rest of an epoch first
        dealt over ``origin`` ranks, continued on ``num_replicas`` ranks from global batch
        position ``offset``. Every keyword is required."""
    def elastic_batches(self, origin: int, offset: int, num_replicas: int, drop_last: bool) -> int:
        """Batches per rank for the rest of an epoch first dealt over ``origin`` ranks,
        continued on ``num_replicas`` ranks from global batch position ``offset``."""

@final
class SequentialBuckets:
    """NeMo Automodel's bucket-by-bucket batches on one rank (immutable)."""

    def __new__(
        cls,
        buckets: list[list[int]],
        sizes: list[int],
        *,
        num_replicas: int,
        rank: int,
        drop_last: bool,
        shuffle_buckets: bool,
        shuffle_within: bool,
        order: Order,
    ) -> SequentialBuckets:
        """The buckets' sample lists and batch sizes, dealt to rank ``rank`` of
        ``num_replicas``. Every keyword is required; an unknown one is a ``TypeError``."""
    def __len__(self) -> int: ...
    def bucket_batches(self, j: int) -> int:
        """Batches of bucket ``j`` on every rank."""
    def check_epoch(self, seed: int, epoch: int) -> None:
        """``ValueError`` for an epoch the order cannot draw with ``seed`` (torch's
        ``seed + epoch`` over ``2**64 - 1``)."""
    def range(
        self, seed: int, epoch: int, start: int, stop: int
    ) -> tuple[_Indices, npt.NDArray[np.uint64]]:
        """This rank's batches ``[start, stop)`` of ``epoch``: ``(indices, offsets)``."""

@final
class ChunkPlan:
    """A rank's chunked reading plan over ``[start, stop)`` (immutable; the epoch is given per
    call): the chunk order and the load requests of any epoch."""

    def __new__(
        cls,
        *,
        start: int,
        stop: int,
        chunk_size: int,
        preload: int,
        batch_size: int,
        shuffle: bool,
        drop_last: bool,
        seed: int,
        num_replicas: int,
        rank: int,
    ) -> ChunkPlan:
        """Every keyword is required; an unknown one is a ``TypeError``."""
    @property
    def batches(self) -> int:
        """Batches every rank yields per epoch."""
    @property
    def requests(self) -> int:
        """Load requests this rank yields per epoch."""
    @property
    def batches_per_request(self) -> int:
        """Batches of one full request."""
    def request(
        self, epoch: int, j: int
    ) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.uint64], _Indices, npt.NDArray[np.uint64]]:
        """Request ``j`` of ``epoch``, computed on its own in O(``preload``) chunk ids:
        ``(starts, stops, positions, offsets)``."""

Deal = RankShare
"""``RankShare``'s name before 0.2.0 (samplers pickled then refer to it)."""

@final
class MixtureShape:
    """The positions of a mixture's epochs in its order (immutable): the arithmetic of
    ``MixtureSampler``'s length, schedules and elastic resumes."""

    def __new__(
        cls, sizes: list[int], *, num_samples: int | None, order: Order, drop_last: bool
    ) -> MixtureShape:
        """Datasets of ``sizes``, ``num_samples`` positions per rank (``None``: the order's
        default), in ``order`` (``Order.GLOBAL`` or ``Order.PER_RANK``)."""
    def __getnewargs_ex__(self) -> tuple[tuple[list[int]], dict[str, object]]:
        """Pickles as ``MixtureShape(sizes, **keywords)``."""
    def positions(self, num_replicas: int) -> int:
        """The positions of an epoch on ``num_replicas`` ranks that phases and schedules
        count (the global sequence's in the global order, each rank's in the per-rank one)."""
    def rank_length(self, num_replicas: int) -> int:
        """Positions per rank of an epoch on ``num_replicas`` ranks."""
    def schedule_position(self, at: int, num_replicas: int) -> int:
        """The schedule position at which each of ``num_replicas`` ranks resumes at ``at``."""
    def global_end(self, origin: int) -> int:
        """Global positions of an epoch first dealt over ``origin`` ranks."""
    @property
    def window(self) -> int | None:
        """Positions worth computing at a time while iterating (``None``: a rank's epoch
        whole)."""

@final
class Mixture:
    """A weighted mixture of datasets on one rank (immutable; the epoch is given per call):
    phases ``(start, nominal_length, weights, temperature)`` of exact per-dataset counts, a
    uniform interleave, and per-dataset pass streams."""

    def __new__(
        cls,
        sizes: list[int],
        phases: list[tuple[int, int, list[float], float]],
        *,
        num_replicas: int,
        rank: int,
        drop_last: bool,
        shuffle: bool,
        seed: int,
        length: int | None,
        order: Order,
        interleave: str,
        permute_samples: bool,
    ) -> Mixture:
        """The datasets' ``sizes`` mixed over ``phases`` for rank ``rank`` of
        ``num_replicas``. ``order``: ``Order.GLOBAL`` (one global sequence of ``length``
        positions, ``None``: every dataset once, dealt with torch's striding; phases in global
        positions) or ``Order.PER_RANK`` (each rank its own sequence of ``length`` positions,
        ``None``: one pass of every dataset's share). ``interleave``: ``"uniform"`` or
        ``"balanced"`` (global order only). ``permute_samples``: with ``shuffle``, whether each
        dataset's passes are permuted too (``False``: each read in order but for the slot order
        inside a leaf of the interleave, which stays shuffled). Every keyword is required; an
        unknown one is a ``TypeError``."""
    def __getnewargs_ex__(
        self,
    ) -> tuple[tuple[list[int], list[tuple[int, int, list[float], float]]], dict[str, object]]:
        """Pickles as ``Mixture(sizes, phases, **config)``."""
    def __len__(self) -> int: ...
    @property
    def length(self) -> int:
        """Positions per rank and epoch."""
    @property
    def global_length(self) -> int | None:
        """Positions of the epoch's global sequence in the global order; ``None`` in the
        fast one."""
    @property
    def total(self) -> int:
        """Samples in all datasets together."""
    def phase_counts(self, phase: int) -> list[int]:
        """Phase ``phase``'s nominal counts per dataset."""
    def indices(self, epoch: int, start: int = 0, stop: int | None = None) -> _Indices:
        """Positions ``[start, stop)`` (default: to the end) of this rank's sequence in
        ``epoch``, as global indices: ``uint32`` while the datasets total at most ``2**32``
        samples, else ``int64``."""
    def elastic_indices(
        self,
        epoch: int,
        start: int = 0,
        stop: int | None = None,
        *,
        offset: int,
        num_replicas: int,
        rank: int,
        drop_last: bool,
    ) -> _Indices:
        """New rank ``rank``'s positions ``[start, stop)`` of such a rest. Every keyword is
        required."""
    def range_bytes(self, start: int = 0, stop: int | None = None) -> int:
        """Bytes an :meth:`indices` call of ``[start, stop)`` (default: to the end) holds at
        its peak: the estimate the memory check uses."""
    def first_stop(self, start: int) -> int:
        """Where an :meth:`indices` call starting at ``start`` should stop to hand out its
        first index soonest."""
    def balanced_boundaries(self, position: int) -> list[tuple[int, int, list[int]]]:
        """Every balanced phase's last leaf boundary known at or below global position
        ``position``, as ``(phase, position in the phase, counts per dataset)``: what a
        checkpoint records so that a resume replays at most a leaf of the balanced sequence.
        Replays nothing and waits for no replay; empty without the balanced interleave."""
    def seed_balanced(
        self, phase: int, position: int, counts: list[int], *, check_only: bool = False
    ) -> None:
        """Records a boundary from :meth:`balanced_boundaries` (of a checkpoint of this
        mixture), so that reading from there replays the balanced sequence from it; with
        ``check_only``, only checks it. ``ValueError`` for a phase without the balanced
        interleave, a position off its leaves, or counts that are not one per dataset, summing
        to the position, each within one sample of its share."""

def epoch_end(n: int, num_replicas: int, drop_last: bool) -> int:
    """The end of an epoch of ``n`` positions dealt over ``num_replicas`` ranks: ``n``, or with
    ``drop_last`` the positions it keeps (where an elastic rest of it ends)."""

def layout(n: int, num_replicas: int, drop_last: bool) -> tuple[int, int]:
    """``(num_samples, total_size)`` of torch's ``DistributedSampler`` for these arguments."""

def permutation(n: int, seed: int, epoch: int) -> _Indices:
    """The epoch's permutation of ``[0, n)`` (parallel, exact): ``uint32`` when
    ``n <= 2**32``, else ``int64``."""

def permutation_into(out: _Indices, seed: int, epoch: int) -> None:
    """Fills ``out`` (writable, contiguous, 1-D, ``uint32`` or ``int64``) with the permutation of
    ``[0, len(out))`` that :func:`permutation` returns, in place."""

def torch_randperm(n: int, seed: int, order: Order) -> _Indices:
    """``torch.randperm(n, generator=torch.Generator().manual_seed(seed))`` on the CPU, as the
    releases named by ``order`` (``TORCH_FORWARD`` or ``TORCH_INSIDE_OUT``) compute it."""

def legacy_shuffle(
    data: npt.NDArray[np.uint8], row: int, key: npt.NDArray[np.uint32], pos: int
) -> int:
    """numpy's legacy ``RandomState.shuffle`` over the rows of ``data`` (a C-contiguous array's
    bytes, ``row`` bytes a row), in place, from the twister state ``(key, pos)``; ``key`` is
    updated in place and the new position returned."""

def greatest_error_blend(
    weights: npt.NDArray[np.float64], out: npt.NDArray[np.uint16], samples: npt.NDArray[np.int64]
) -> None:
    """megatron-core's ``build_blending_indices`` into ``out`` (the ``int16`` dataset index
    viewed as ``uint16``) and ``samples`` (the dataset sample index, as long), every position
    of them."""

def exhaustive_greatest_error_blend(
    sizes: npt.NDArray[np.uint64], out: npt.NDArray[np.uint16], samples: npt.NDArray[np.int64]
) -> None:
    """megatron-core's ``build_exhaustive_blending_indices`` into ``out`` and ``samples``
    (each as long as the sizes' sum)."""

def index_range(total: int, wide: bool) -> npt.NDArray[Any]:
    """``[0, total)`` in a fresh array, ``uint32`` (``total`` at most 2**32) or, ``wide``,
    ``int64``, written by all threads (megatron-core's shuffle index starts from it)."""

def index_tile(values: npt.NDArray[np.int32], times: int) -> npt.NDArray[np.int32]:
    """``values`` (C-contiguous ``int32``) repeated ``times`` times in a fresh ``int32``
    array, written by all threads (megatron-core's document index starts from it)."""

def micro_batches(first: int, group: int, mbs: int, start: int, stop: int) -> npt.NDArray[np.int64]:
    """Megatron-LM's sequential sampler's micro-batches of groups ``[start, stop)``,
    flattened: group ``k``'s ``mbs`` samples from ``first + k * group``."""

def sample_index(
    sizes: npt.NDArray[np.int32],
    document_index: npt.NDArray[np.int32],
    seq_length: int,
    num_epochs: int,
    tokens_per_epoch: int,
    drop_last_partial_sequence: bool,
    add_extra_token: int,
    wide: bool,
) -> npt.NDArray[np.int32] | npt.NDArray[np.int64]:
    """megatron-core's ``build_sample_idx``: a new ``(num_samples + 1, 2)`` array, ``int64``
    when ``wide``, else ``int32``."""
