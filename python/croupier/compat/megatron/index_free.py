"""Index-free orders for new Megatron runs: a ``BlendedDataset``'s blend and a ``GPTDataset``'s
shuffle index read by random access from croupier's world-size-invariant keyed orders, so no
array as long as the run is built, cached or loaded.

megatron-core materialises both: the blend is two arrays of ``size`` entries (10 bytes per
sample: 100 GB at 1e10 samples) and the shuffle index one of 4 or 8 bytes per sample, built on
rank 0, saved as ``.npy`` files and memory-mapped by every rank. Here

- :class:`IndexFreeBlend` is the blend of :class:`croupier.MixtureSampler`'s global order:
  dataset ``d`` takes exactly its largest-remainder count ``c_d`` (``|c_d - w_d size| < 1``)
  of its first samples ``0 .. c_d - 1``, each once, as megatron-core's blend takes a prefix
  (its greedy's counts can differ from these by one); the datasets are interleaved uniformly
  at random, keyed by a seed, and each dataset's samples come in order but for a shuffle
  inside each leaf of the interleave (2**20 positions), so that a ``GPTDataset``'s own shuffle
  index is read near where it was read last;
- :class:`IndexFreeShuffle` is ``_build_shuffle_index``'s structure (``[0, num_samples)``
  permuted, then ``[num_samples, total_size)`` on its own) with croupier's world-size-invariant
  permutation, each range under its own key;

both read any position at once (a fresh read costs about a millisecond with 100 datasets at
1e10 samples, more with more datasets: :class:`IndexView`) and hold one piece of positions
around the last read. Their orders are croupier's, not megatron-core's:
they are for new runs (a run started with megatron-core's indices resumes only with those).
``croupier.compat.megatron.patch(index_free=True)`` makes megatron-core's ``BlendedDataset``
and ``GPTDataset`` use them.

The blend's interleave is uniform: counts over a prefix of ``t`` positions deviate from
``w_d t`` by about ``sqrt(w_d t)``, where megatron-core's greedy stays within 1.3 samples.
croupier's ``interleave="balanced"`` keeps every prefix within one sample, but each of its
positions depends on the one before, so it cannot be read at position 1e10 without a pass
over all before it: it is not offered here.
"""

from __future__ import annotations

import json
import operator
import os
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from croupier import _core
from croupier._validate import check_int

__all__ = ["CHUNK", "IndexFreeBlend", "IndexFreeShuffle", "IndexView"]

CHUNK = 1 << 14
"""Most positions of a blend computed by one read (16,384; a shuffle index's: 8 times as
many)."""

FIRST = 1 << 8
"""Positions computed by a first read, or by a read far from the last one (256)."""

_SEED_LIMIT = 1 << 64
_SIZE_LIMIT = 1 << 63
# The blend's positions, at most: its second rounding, from the shares count / size as
# float64, gives back the counts only while size is exact in a float64.
_BLEND_LIMIT = 1 << 53


class _Chunks:
    """The piece of a computed sequence last read: ``read(start, stop)`` gives positions
    ``[start, stop)`` as a tuple of arrays; one piece is kept (replaced whole, so a reader in
    another thread sees the old piece or the new one).

    A read costs about ``fixed + n * per`` seconds for ``n`` positions (a read at position
    1e10 of a blend of 100 datasets: ``fixed`` about 0.7 ms, ``per`` 0.1 microseconds), and
    both are learnt from the reads made. A read that misses the piece computes a piece twice
    as long as the last one (up to ``largest``) when the positions between would have cost
    less than another read's fixed part (reading on forward or backward, or at a short
    stride), else :data:`FIRST` positions from it."""

    def __init__(self, length: int, read: Any, largest: int) -> None:
        self._length = length
        self._read = read
        self._largest = largest
        self._fixed, self._per = 2e-4, 1e-7
        self._kept: tuple[int, int, tuple[np.ndarray, ...]] | None = None

    def at(self, position: int) -> tuple[tuple[np.ndarray, ...], int]:
        """The arrays of a piece holding ``position`` and its offset in them."""
        kept = self._kept
        if kept is not None and kept[0] <= position < kept[0] + kept[1]:
            return kept[2], position - kept[0]
        size, start = FIRST, position
        if kept is not None:
            backward = position < kept[0]
            gap = kept[0] - 1 - position if backward else position - kept[0] - kept[1]
            if gap * self._per < self._fixed:
                size = min(self._largest, 2 * kept[1])
                if backward:
                    start = max(0, position + 1 - size)
        stop = min(start + size, self._length)
        began = time.perf_counter()
        arrays = self._read(start, stop)
        self._learn(stop - start, time.perf_counter() - began)
        self._kept = (start, stop - start, arrays)
        return arrays, position - start

    def _learn(self, n: int, took: float) -> None:
        """Updates the cost model from a read of ``n`` positions that took ``took`` s."""
        if n <= 2 * FIRST:
            self._fixed = 0.75 * self._fixed + 0.25 * max(took - n * self._per, 1e-6)
        else:
            self._per = 0.75 * self._per + 0.25 * max((took - self._fixed) / n, 1e-10)

    def __getstate__(self) -> dict[str, Any]:
        # A copy starts without the piece (it may be large) and with the model learnt.
        return {**self.__dict__, "_kept": None}


class IndexView:
    """A read-only 1-D index whose values are computed when read: ``view[i]``, ``view[a:b]``
    (any step), ``len(view)``, ``shape``, ``dtype``, ``ndim`` and iteration, as a numpy array
    of ``len(view)`` values would answer them. Turning it into a whole array is refused (it
    may hold 1e10 values): slice what you need.

    A read far from the last one costs a fixed part, which grows with the number of datasets
    (a blend at 1e10 samples: about 0.1 ms with 10 datasets, 0.7 ms with 100 and 6 ms with
    1,000; a shuffle index at 1e9: 0.13 ms; on a 2-core EPYC VM). Reads near the last one
    share it: one position after another costs about 2 microseconds from Python, a slice 0.14
    microseconds a position, micro-batches of 4 at a stride of 2,048 with 100 datasets 80
    microseconds a read. A slice with a step over :data:`FIRST` reads each position on its
    own."""

    def __init__(self, chunks: _Chunks, part: int, length: int, dtype: type) -> None:
        self._chunks = chunks
        self._part = part
        self._length = length
        self.dtype = np.dtype(dtype)
        """The values' numpy dtype."""

    @property
    def shape(self) -> tuple[int]:
        """``(len(self),)``."""
        return (self._length,)

    @property
    def ndim(self) -> int:
        """1."""
        return 1

    def __len__(self) -> int:
        return self._length

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, slice):
            start, stop, step = key.indices(self._length)
            if abs(step) > FIRST:
                return np.array([self._at(p) for p in range(start, stop, step)], self.dtype)
            if step < 0:
                lo = stop + 1 + (start - stop - 1) % -step
                return self._range(lo, start + 1)[::step]
            return self._range(start, max(start, stop))[::step]
        if isinstance(key, (bool, np.bool_)):
            raise TypeError("an IndexView is indexed by an integer or a slice, got a bool")
        try:
            position = operator.index(key)
        except TypeError:
            raise TypeError(
                f"an IndexView is indexed by an integer or a slice, got {type(key).__name__}"
            ) from None
        if position < 0:
            position += self._length
        if not 0 <= position < self._length:
            raise IndexError(f"index {key} is out of range for {self._length} positions")
        return self._at(position)

    def _at(self, position: int) -> Any:
        arrays, offset = self._chunks.at(position)
        return arrays[self._part][offset]

    def _range(self, start: int, stop: int) -> np.ndarray:
        pieces = []
        at = start
        while at < stop:
            arrays, offset = self._chunks.at(at)
            piece = arrays[self._part][offset : offset + stop - at]
            pieces.append(piece)
            at += len(piece)
        if not pieces:
            return np.empty(0, self.dtype)
        return pieces[0].copy() if len(pieces) == 1 else np.concatenate(pieces)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        raise TypeError(
            f"an IndexView of {self._length} positions is not turned into an array whole; "
            "slice the positions you need (view[a:b])"
        )

    def __iter__(self) -> Any:
        for start in range(0, self._length, CHUNK):
            yield from self._range(start, min(start + CHUNK, self._length))

    def __repr__(self) -> str:
        return f"IndexView(length={self._length}, dtype={self.dtype})"


def _values(weights: object) -> list[Any]:
    if (
        isinstance(weights, (str, bytes))
        or not isinstance(weights, (Sequence, np.ndarray))
        or np.ndim(weights) != 1
    ):
        raise TypeError(f"weights must be a 1-D sequence of numbers, got {type(weights).__name__}")
    values = list(weights)
    if not 1 <= len(values) <= _core.BLEND_MAX_DATASETS:
        raise ValueError(
            f"weights must name 1 to {_core.BLEND_MAX_DATASETS} datasets (the dataset index is "
            f"int16), got {len(values)}"
        )
    return values


def _sizes(weights: object) -> list[int]:
    """An exhaustive blend's weights: each dataset's samples, positive integers summing to at
    most ``2**53``."""
    sizes = [check_int(f"weights[{i}]", w, 1) for i, w in enumerate(_values(weights))]
    if sum(sizes) > _BLEND_LIMIT:
        raise ValueError(
            f"weights (samples per dataset) must sum to at most 2**53, got {sum(sizes)}"
        )
    return sizes


def _shares(weights: object) -> list[float]:
    """A sized blend's weights: positive finite numbers with a finite sum."""
    out = []
    for i, w in enumerate(_values(weights)):
        if isinstance(w, (bool, np.bool_)) or not isinstance(w, (int, float, np.number)):
            raise TypeError(f"weights[{i}] must be a number, got {type(w).__name__}")
        try:
            value = float(w)
        except OverflowError:
            value = float("inf")
        if not (np.isfinite(value) and value > 0):
            raise ValueError(f"weights[{i}] must be positive and finite, got {w}")
        out.append(value)
    if not np.isfinite(sum(out)):
        raise ValueError("weights must have a finite sum (they are normalized by it)")
    return out


class IndexFreeBlend:
    """A blend of datasets read by random access, in place of megatron-core's
    ``build_blending_indices`` (``size`` given) or ``build_exhaustive_blending_indices``
    (``size=None``: ``weights`` are each dataset's number of samples, all taken).

    Dataset ``d`` takes exactly ``counts[d]`` samples, its first ones ``0 .. counts[d] - 1``
    (megatron-core's blend takes a prefix too, its greedy's counts sometimes one more or one
    less), each once; with ``size`` given, ``counts`` is the largest-remainder rounding of
    ``weights / sum(weights) * size`` (``|counts[d] - w_d size| < 1``). The positions
    interleave the datasets uniformly at random, keyed by ``seed``; a dataset's samples come
    in order but for a shuffle inside each leaf of the interleave (2**20 positions). The same
    arguments give the same blend on every machine and for any number of ranks.

    ``blend[i]`` is ``(dataset, sample)`` at position ``i``; :attr:`dataset_index` and
    :attr:`dataset_sample_index` read positions and slices (:class:`IndexView`).

    Args:
        weights: one positive number per dataset (normalized here), or with ``size=None``
            each dataset's number of samples (positive integers).
        size: positions of the blend, in ``[1, 2**53]``, or ``None`` (the sizes then sum to at
            most ``2**53``).
        seed: any integer in ``[0, 2**64)``.

    Raises:
        TypeError, ValueError: an argument out of its range, named.

    Example:
        >>> from croupier.compat.megatron import IndexFreeBlend
        >>> blend = IndexFreeBlend([0.5, 0.3, 0.2], 10_000_000_000, seed=1234)
        >>> blend.counts.tolist()
        [5000000000, 3000000000, 2000000000]
        >>> d, s = blend[7_777_777_777]
        >>> int(blend.dataset_index[7_777_777_777]) == d, 0 <= s < int(blend.counts[d])
        (True, True)
    """

    def __init__(self, weights: Sequence[float] | Sequence[int], size: int | None, *, seed: int):
        values: list[int] | list[float]
        if size is None:
            values = counts = _sizes(weights)
            length = sum(counts)
        else:
            values = _shares(weights)
            length = check_int("size", size, 1, _BLEND_LIMIT)
        self.seed = check_int("seed", seed, 0, _SEED_LIMIT - 1)
        """The key of the order."""
        if size is not None:
            total = sum(values)
            normalized = [w / total for w in values]
            counts = self._mixture(normalized, [1] * len(values), length).phase_counts(0)
        self.counts = np.asarray(counts, dtype=np.int64)
        """Samples taken from each dataset (they sum to ``len(self)``)."""
        self._length = length
        # The mixture's datasets are the samples taken, so each is a permutation of [0, c_d).
        shares = [c / length for c in counts]
        self._mix = self._mixture(shares, [max(c, 1) for c in counts], length)
        if self._mix.phase_counts(0) != list(counts):  # pragma: no cover - a core defect
            raise RuntimeError("the blend's counts changed between two equal roundings")
        self._offsets = np.concatenate(([0], np.cumsum([max(c, 1) for c in counts])))
        self._args = (values, size)
        chunks = _Chunks(length, self._read, CHUNK)
        self.dataset_index = IndexView(chunks, 0, length, np.int16)
        """The dataset of each position (megatron-core's ``dataset_index``, ``int16``)."""
        self.dataset_sample_index = IndexView(chunks, 1, length, np.int64)
        """The sample of that dataset (megatron-core's ``dataset_sample_index``,
        ``int64``)."""

    def _mixture(self, weights: list[float], sizes: list[int], length: int) -> _core.Mixture:
        return _core.Mixture(
            sizes,
            [(0, length, weights, 1.0)],
            num_replicas=1,
            rank=0,
            drop_last=False,
            shuffle=True,
            seed=self.seed,
            length=length,
            order=_core.Order.GLOBAL,
            interleave="uniform",
            permute_samples=False,
        )

    def _read(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        glob = np.asarray(self._mix.indices(0, start, stop), dtype=np.int64)
        dataset = np.searchsorted(self._offsets, glob, side="right") - 1
        return dataset.astype(np.int16), glob - self._offsets[dataset]

    def __len__(self) -> int:
        return self._length

    def __getitem__(self, position: int) -> tuple[int, int]:
        """``(dataset, sample)`` at ``position`` (an integer; for slices, slice
        :attr:`dataset_index` and :attr:`dataset_sample_index`)."""
        if isinstance(position, slice):
            raise TypeError(
                "an IndexFreeBlend is indexed by an integer; slice blend.dataset_index and "
                "blend.dataset_sample_index instead"
            )
        return int(self.dataset_index[position]), int(self.dataset_sample_index[position])

    def __reduce__(self) -> tuple[Any, ...]:
        values, size = self._args
        return (_blend, (values, size, self.seed))

    def __repr__(self) -> str:
        return f"IndexFreeBlend(datasets={len(self.counts)}, size={self._length}, seed={self.seed})"


def _blend(values: list[Any], size: int | None, seed: int) -> IndexFreeBlend:
    return IndexFreeBlend(values, size, seed=seed)


class IndexFreeShuffle(IndexView):
    """A shuffle index read by random access, in place of megatron-core's
    ``_build_shuffle_index(num_samples, total_size, numpy_random_state)``: positions
    ``[0, num_samples)`` hold a permutation of ``[0, num_samples)`` and positions
    ``[num_samples, total_size)`` one of ``[num_samples, total_size)`` (megatron-core's
    separate last epoch), each croupier's world-size-invariant permutation, keyed by ``seed``
    and by the range; ``uint32`` values unless ``total_size >= 2**32 - 2``, then ``int64``, as
    megatron-core's. Sizes below ``2**63``.

    Raises:
        TypeError, ValueError: an argument out of its range, named.

    Example:
        >>> from croupier.compat.megatron import IndexFreeShuffle
        >>> index = IndexFreeShuffle(6, 8, seed=1234)
        >>> sorted(index[:6].tolist()), sorted(index[6:].tolist()), index.dtype
        ([0, 1, 2, 3, 4, 5], [6, 7], dtype('uint32'))
    """

    def __init__(self, num_samples: int, total_size: int, *, seed: int) -> None:
        first = check_int("num_samples", num_samples, 0, _SIZE_LIMIT - 1)
        total = check_int("total_size", total_size, 0, _SIZE_LIMIT - 1)
        if total < first:
            raise ValueError(f"total_size must be at least num_samples ({first}), got {total}")
        self.seed = check_int("seed", seed, 0, _SEED_LIMIT - 1)
        """The key of the order."""
        self._first = first
        self._parts = [self._share(n, key) for key, n in enumerate((first, total - first))]
        dtype = np.int64 if total >= np.iinfo(np.uint32).max - 1 else np.uint32
        super().__init__(_Chunks(total, self._read, 8 * CHUNK), 0, total, dtype)

    def _share(self, n: int, key: int) -> _core.RankShare | None:
        """The permutation of range ``key`` (0 or 1), of ``n`` positions: range 1 is keyed
        by the epoch after range 0's, so equal ranges are not permuted alike."""
        if n == 0:
            return None
        return _core.RankShare(
            n=n,
            num_replicas=1,
            rank=0,
            shuffle=True,
            seed=self.seed,
            drop_last=False,
            order=_core.Order.GLOBAL,
        )

    def _read(self, start: int, stop: int) -> tuple[np.ndarray]:
        out = np.empty(stop - start, dtype=self.dtype)
        cut = min(max(self._first, start), stop)
        head, tail = self._parts
        if head is not None and start < cut:
            out[: cut - start] = head.indices(0, start, cut)
        if tail is not None and cut < stop:
            out[cut - start :] = tail.indices(1, cut - self._first, stop - self._first)
            out[cut - start :] += self._first
        return (out,)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_shuffle, (self._first, len(self), self.seed))

    def __repr__(self) -> str:
        return (
            f"IndexFreeShuffle(num_samples={self._first}, total_size={len(self)}, seed={self.seed})"
        )


def _shuffle(first: int, total: int, seed: int) -> IndexFreeShuffle:
    return IndexFreeShuffle(first, total, seed=seed)


# -- megatron-core's datasets, index-free (installed by ``patch(index_free=True)``) ----------

_SEPARATE_BELOW = 0.80
"""megatron-core shuffles the last epoch on its own when it contributes fewer samples than
this share of an epoch."""


def gpt_indices(dataset: Any) -> tuple[Any, Any, IndexFreeShuffle]:
    """A ``GPTDataset``'s ``(document_index, sample_index, shuffle_index)``, in place of its
    ``_build_document_sample_shuffle_indices``: the document and sample indices megatron-core
    builds (by croupier's identical builders), the shuffle index an :class:`IndexFreeShuffle`
    keyed by ``config.random_seed`` over megatron-core's two ranges.

    Cached as megatron-core caches (rank 0 builds on a miss, the others load; ``mock`` datasets
    without a cache), under file names of their own (``...-index_free-document_index.npy``,
    ``-sample_index.npy``, ``-shuffle_ranges.json``, ``-description.txt``): megatron-core
    counts a cache without a shuffle index as a miss and rewrites it in place, which would pull
    the files from under a run that has them mapped."""
    import torch.distributed as dist

    config = dataset.config
    if config.defer_npy_index_mmap:
        raise ValueError(
            "patch(index_free=True) reads no shuffle index file, so it cannot defer loading "
            "one: set defer_npy_index_mmap=False"
        )
    paths = _gpt_cache_paths(dataset)
    hit = paths is not None and (
        config.fast_cache_load or all(os.path.isfile(p) for p in paths.values())
    )
    if paths is None or (not hit and (not dist.is_initialized() or dist.get_rank() == 0)):
        document_index, sample_index, ranges = _gpt_build(dataset)
        if paths is not None:
            os.makedirs(os.path.dirname(paths["description"]), exist_ok=True)
            with open(paths["description"], "w") as out:
                out.write(dataset.unique_description)
            np.save(paths["document"], document_index, allow_pickle=True)
            np.save(paths["sample"], sample_index, allow_pickle=True)
            with open(paths["ranges"], "w") as out:
                json.dump(ranges, out)
    else:
        assert paths is not None
        document_index = np.load(paths["document"], allow_pickle=True, mmap_mode="r")
        sample_index = np.load(paths["sample"], allow_pickle=True, mmap_mode="r")
        with open(paths["ranges"]) as source:
            ranges = json.load(source)
    shuffle = IndexFreeShuffle(ranges["num_samples"], ranges["total_size"], seed=config.random_seed)
    return document_index, sample_index, shuffle


def _gpt_build(dataset: Any) -> tuple[np.ndarray, np.ndarray, dict[str, int]]:
    """A ``GPTDataset``'s document and sample indices as megatron-core builds them, and the
    two ranges its shuffle index permutes (the last epoch on its own when it contributes less
    than :data:`_SEPARATE_BELOW` of an epoch)."""
    from croupier.compat.megatron.indices import build_document_index, build_sample_idx

    config = dataset.config
    tokens_per_epoch = dataset._get_num_tokens_per_epoch()
    epochs = dataset._get_num_epochs(tokens_per_epoch)
    length, extra = config.sequence_length, config.add_extra_token_to_sequence
    separate, before_last = False, 0
    if epochs > 1:
        before_last = ((epochs - 1) * tokens_per_epoch - extra) // length
        per_epoch = (tokens_per_epoch - extra) // length
        separate = dataset.num_samples - before_last < int(_SEPARATE_BELOW * per_epoch)
    state = np.random.RandomState(config.random_seed)
    document_index = build_document_index(dataset.indices, epochs, state, separate)
    lengths = dataset.dataset.sequence_lengths
    if len(document_index) * 2 > len(lengths):
        lengths = np.array(lengths)  # read whole once rather than at random
    valid = dataset.index_split.name == "valid"
    drop = not valid or config.drop_last_partial_validation_sequence
    sample_index = build_sample_idx(
        lengths, document_index, length, epochs, tokens_per_epoch, drop, extra
    )
    total = int(sample_index.shape[0]) - 1
    ranges = {"num_samples": int(before_last) if separate else total, "total_size": total}
    return document_index, sample_index, ranges


def _gpt_cache_paths(dataset: Any) -> dict[str, str] | None:
    """Where the index-free mode caches a ``GPTDataset``'s indices (megatron-core's cache
    directory, names of its own), or ``None`` when nothing is cached."""
    cache = dataset.config.path_to_cache
    if cache is None and not dataset.config.mock:
        cache = os.path.join(
            dataset.dataset.path_prefix, "cache", f"{type(dataset).__name__}_indices"
        )
    if not cache:
        return None
    split = dataset.index_split.name
    base = os.path.join(
        cache, f"{dataset.unique_description_hash}-{type(dataset).__name__}-{split}-index_free"
    )
    return {
        "description": f"{base}-description.txt",
        "document": f"{base}-document_index.npy",
        "sample": f"{base}-sample_index.npy",
        "ranges": f"{base}-shuffle_ranges.json",
    }


def blend_indices(blended: Any) -> tuple[IndexView, IndexView]:
    """A ``BlendedDataset``'s ``(dataset_index, dataset_sample_index)``, in place of its
    ``_build_indices``: the views of an :class:`IndexFreeBlend` of its weights and size keyed
    by ``config.random_seed``; nothing is written.

    Raises:
        IndexError: the blend takes more samples from a dataset than it holds, as
            megatron-core raises for its own counts (a count here can be one more than
            megatron-core's greedy gives: a dataset exactly as long as megatron-core's count,
            which the builder's surplus makes rare, is refused here).
    """
    blend = IndexFreeBlend(blended.weights, blended.size, seed=blended.config.random_seed)
    for d, (count, dataset) in enumerate(zip(blend.counts, blended.datasets, strict=True)):
        if count > len(dataset):
            raise IndexError(
                f"the {blended.split.name} blend takes {count} samples from dataset {d}, which "
                f"holds {len(dataset)}: raise the config's mid_level_dataset_surplus (now "
                f"{blended.config.mid_level_dataset_surplus})"
            )
    return blend.dataset_index, blend.dataset_sample_index
