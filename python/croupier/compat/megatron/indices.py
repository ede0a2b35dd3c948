"""Megatron-Core's dataset indices, built by croupier: the same arrays, from the same arguments.

megatron-core builds a ``GPTDataset``'s indices on one thread: the document and shuffle
indices with numpy's legacy ``RandomState.shuffle``, the sample index and a
``BlendedDataset``'s blend in C++ (``megatron.core.datasets.helpers``). The functions here
take the same arguments and give element-for-element the same arrays (dtypes included),
leaving a ``RandomState`` in the state megatron-core's would be in:

- :func:`build_blending_indices`, :func:`build_exhaustive_blending_indices` and
  :func:`build_sample_idx`: the helpers, in place where megatron-core's are;
- :func:`build_document_index` and :func:`build_shuffle_index`: ``gpt_dataset``'s
  ``_build_document_index`` and ``_build_shuffle_index``, shuffled with
  :func:`croupier.compat.numpy.legacy_shuffle`;
- :func:`patch`: makes an installed megatron-core call all of these, in one line (or for
  a ``with`` block).
"""

from __future__ import annotations

import importlib
import operator
import sys
import threading
from types import TracebackType
from typing import Any

import numpy as np

from croupier import _core
from croupier.compat.numpy import check_random_state, legacy_shuffle

__all__ = [
    "build_blending_indices",
    "build_document_index",
    "build_exhaustive_blending_indices",
    "build_sample_idx",
    "build_shuffle_index",
    "patch",
]

_INT32_MAX = np.iinfo(np.int32).max


def _count(value: object, name: str, least: int) -> int:
    """``value`` as an int of at least ``least``, or the error naming ``name``."""
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be an integer, got {value!r}")
    try:
        count = operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(f"{name} must be an integer, got {type(value).__name__}") from None
    if count < least:
        raise ValueError(f"{name} must be at least {least}, got {count}")
    return count


def build_document_index(
    documents: np.ndarray,
    num_epochs: int,
    numpy_random_state: np.random.RandomState,
    separate_final_epoch: bool,
) -> np.ndarray:
    """megatron-core's ``_build_document_index``: ``documents`` repeated ``num_epochs`` times
    as ``int32`` and shuffled with ``numpy_random_state`` (with ``separate_final_epoch`` and
    more than one epoch, the first ``num_epochs - 1`` repeats shuffled together, then the last
    one on its own), the same array and the same state afterwards.

    Raises:
        TypeError: ``documents`` is not a 1-D integer array, or ``num_epochs`` not an integer.
        ValueError: ``num_epochs`` below 1, or a document id outside ``[0, 2**31)`` (the
            index is ``int32``: megatron-core would wrap it silently).

    Example:
        >>> import numpy as np
        >>> from croupier.compat.megatron import build_document_index
        >>> docs = np.arange(5, dtype=np.int32)
        >>> index = build_document_index(docs, 2, np.random.RandomState(1), False)
        >>> index.dtype, sorted(index.tolist()) == sorted(list(range(5)) * 2)
        (dtype('int32'), True)
    """
    epochs = _count(num_epochs, "num_epochs", 1)
    check_random_state(numpy_random_state, "numpy_random_state")
    docs = _int32_values(documents, "documents", "ids")
    index = _core.index_tile(docs, epochs)  # np.tile, written by all threads
    if separate_final_epoch and epochs > 1:
        cut = (epochs - 1) * len(docs)
        legacy_shuffle(index[:cut], numpy_random_state)
        legacy_shuffle(index[cut:], numpy_random_state)
    else:
        legacy_shuffle(index, numpy_random_state)
    return index


def build_shuffle_index(
    num_samples: int, total_size: int, numpy_random_state: np.random.RandomState
) -> np.ndarray:
    """megatron-core's ``_build_shuffle_index``: ``[0, num_samples)`` shuffled, then (when
    ``total_size`` is larger) ``[num_samples, total_size)`` shuffled on its own after it;
    ``uint32`` unless ``total_size >= 2**32 - 2``, then ``int64``. The same array and the same
    state afterwards, in one buffer (megatron-core concatenates two).

    Raises:
        TypeError: a size that is not an integer.
        ValueError: a negative size, or ``total_size`` below ``num_samples``.

    Example:
        >>> import numpy as np
        >>> from croupier.compat.megatron import build_shuffle_index
        >>> index = build_shuffle_index(4, 6, np.random.RandomState(0))
        >>> index.dtype, sorted(index[:4].tolist()), sorted(index[4:].tolist())
        (dtype('uint32'), [0, 1, 2, 3], [4, 5])
    """
    first = _count(num_samples, "num_samples", 0)
    total = _count(total_size, "total_size", 0)
    check_random_state(numpy_random_state, "numpy_random_state")
    if total < first:
        raise ValueError(f"total_size must be at least num_samples ({first}), got {total}")
    # megatron-core's np.arange, written by all threads.
    index = _core.index_range(total, total >= np.iinfo(np.uint32).max - 1)
    legacy_shuffle(index[:first], numpy_random_state)
    if total > first:
        legacy_shuffle(index[first:], numpy_random_state)
    return index


def _array(values: object, name: str, what: str, dtype: type | None = None) -> np.ndarray:
    """``values`` as a numpy array (of ``dtype``), or the ``TypeError`` naming ``name`` where
    numpy cannot convert them (ragged, or not ``what``)."""
    try:
        return np.asarray(values, dtype=dtype)
    except (TypeError, ValueError) as e:
        raise TypeError(f"{name} must be a 1-D array of {what} ({e})") from None


def _out_array(array: object, name: str, dtype: type, length: int) -> np.ndarray:
    """``array`` if it is a writeable, C-contiguous 1-D ``dtype`` array of at least ``length``
    elements (megatron-core writes into it), else the error naming ``name``."""
    if not isinstance(array, np.ndarray) or array.dtype != dtype or array.ndim != 1:
        got = (
            f"{array.ndim}-D {array.dtype}"
            if isinstance(array, np.ndarray)
            else type(array).__name__
        )
        raise TypeError(f"{name} must be a 1-D numpy {np.dtype(dtype)} array, got {got}")
    if not array.flags.c_contiguous or not array.flags.writeable:
        raise ValueError(f"{name} must be C-contiguous and writeable (it is written in place)")
    if len(array) < length:
        raise ValueError(f"{name} must hold at least {length} elements, got {len(array)}")
    return array


def _datasets(num_datasets: object) -> int:
    count = _count(num_datasets, "num_datasets", 1)
    if count > _core.BLEND_MAX_DATASETS:
        raise ValueError(
            f"num_datasets must be in [1, {_core.BLEND_MAX_DATASETS}] (the dataset index is "
            f"int16), got {count}"
        )
    return count


def build_blending_indices(
    dataset_index: np.ndarray,
    dataset_sample_index: np.ndarray,
    weights: Any,
    num_datasets: int,
    size: int,
    verbose: bool,
) -> None:
    """megatron-core's ``helpers.build_blending_indices``, in place: position ``i < size``
    goes to the dataset ``d`` (``dataset_index[i]``) whose error ``weights[d] * max(i, 1) -
    count[d]`` is the largest, the first on a tie, computed in ``float64`` exactly as
    megatron-core's C++ does; ``dataset_sample_index[i]`` is that dataset's count before it.
    With ``verbose``, prints megatron-core's lines: its heading, then the achieved ratios.

    Args:
        dataset_index: ``int16`` array of at least ``size`` elements, written in place.
        dataset_sample_index: ``int64`` array of at least ``size`` elements, written in place.
        weights: at least ``num_datasets`` weights, at least 0, the first ``num_datasets``
            summing to 1 (within 1e-6; megatron-core normalises them).
        num_datasets: datasets blended, in ``[1, 32767]``.
        size: positions to fill.
        verbose: print the achieved ratios.

    Raises:
        TypeError: an array of the wrong type, or a count that is not an integer.
        ValueError: any argument outside the ranges above (nothing is written).

    Example:
        >>> import numpy as np
        >>> from croupier.compat.megatron import build_blending_indices
        >>> index, sample = np.zeros(6, np.int16), np.zeros(6, np.int64)
        >>> build_blending_indices(index, sample, [0.5, 0.25, 0.25], 3, 6, False)
        >>> index.tolist(), sample.tolist()
        ([0, 1, 2, 0, 0, 1], [0, 0, 0, 1, 2, 1])
    """
    datasets = _datasets(num_datasets)
    length = _count(size, "size", 0)
    index = _out_array(dataset_index, "dataset_index", np.int16, length)
    samples = _out_array(dataset_sample_index, "dataset_sample_index", np.int64, length)
    w = np.ascontiguousarray(_array(weights, "weights", "numbers", np.float64))
    if w.ndim != 1 or len(w) < datasets:
        raise ValueError(
            f"weights must be 1-D with at least num_datasets = {datasets} values, got shape "
            f"{w.shape}"
        )
    w = w[:datasets]
    if not np.all(np.isfinite(w)) or np.any(w < 0):
        raise ValueError(f"weights must be finite and at least 0, got {w.tolist()}")
    total = float(w.sum())
    if abs(total - 1.0) > _core.BLEND_WEIGHT_SUM_TOLERANCE:
        raise ValueError(
            f"weights must sum to 1 (within {_core.BLEND_WEIGHT_SUM_TOLERANCE}; megatron-core "
            f"normalises them), got a sum of {total!r}"
        )
    if verbose:
        print("> building indices for blended datasets ...", flush=True)
    if length == 0:
        return
    positions = index[:length].view(np.uint16)
    _core.greatest_error_blend(w, positions, samples[:length])
    if verbose:
        counts = np.bincount(positions, minlength=datasets)
        print(" > sample ratios:")
        for d in range(datasets):
            print(f"   dataset {d}, input: {w[d]:g}, achieved: {counts[d] / length:g}")


def build_exhaustive_blending_indices(
    dataset_index: np.ndarray,
    dataset_sample_index: np.ndarray,
    sizes: Any,
    num_datasets: int,
) -> None:
    """megatron-core's ``helpers.build_exhaustive_blending_indices``, in place: exactly
    ``sizes[d]`` positions of each dataset ``d``, ``sum(sizes)`` in all, by the same greedy
    with weights ``sizes[d] / sum(sizes)`` among the datasets not yet spent.

    Args:
        dataset_index: ``int16`` array of at least ``sum(sizes)`` elements, written in place.
        dataset_sample_index: ``int64`` array of at least ``sum(sizes)`` elements.
        sizes: at least ``num_datasets`` integers, each at least 1 (megatron-core writes past
            its arrays on a 0).
        num_datasets: datasets blended, in ``[1, 32767]``.

    Raises:
        TypeError: an array of the wrong type, or a count that is not an integer.
        ValueError: any argument outside the ranges above (nothing is written).

    Example:
        >>> import numpy as np
        >>> from croupier.compat.megatron import build_exhaustive_blending_indices
        >>> index, sample = np.zeros(5, np.int16), np.zeros(5, np.int64)
        >>> build_exhaustive_blending_indices(index, sample, [3, 2], 2)
        >>> index.tolist(), sample.tolist()
        ([0, 1, 0, 1, 0], [0, 0, 1, 1, 2])
    """
    datasets = _datasets(num_datasets)
    raw = _array(sizes, "sizes", "integers")
    if raw.ndim != 1 or not (np.issubdtype(raw.dtype, np.integer) or raw.size == 0):
        raise TypeError(f"sizes must be a 1-D array of integers, got {raw.ndim}-D {raw.dtype}")
    if len(raw) < datasets:
        raise ValueError(
            f"sizes must hold at least num_datasets = {datasets} values, got {len(raw)}"
        )
    counts = [int(v) for v in raw[:datasets]]
    if min(counts) < 1:
        raise ValueError(
            f"sizes must be at least 1 (megatron-core writes past its arrays on a 0), got "
            f"{min(counts)}"
        )
    total = sum(counts)
    if total >= 2**53:
        raise ValueError(f"sizes must sum to less than 2**53, got {total}")
    index = _out_array(dataset_index, "dataset_index", np.int16, total)
    samples = _out_array(dataset_sample_index, "dataset_sample_index", np.int64, total)
    positions = index[:total].view(np.uint16)
    _core.exhaustive_greatest_error_blend(
        np.asarray(counts, dtype=np.uint64), positions, samples[:total]
    )


def _int32_values(
    values: object, name: str, kind: str, *, core_checks_range: bool = False
) -> np.ndarray:
    """``values`` as a C-contiguous, aligned ``int32`` array (a copy only where needed), or
    the error naming ``name``: a 1-D integer array of ``kind`` in ``[0, 2**31)``. An ``int32``
    array whose values the core checks itself (``core_checks_range``) is not read here."""
    array = _array(values, name, "integers")
    if array.ndim != 1 or not (np.issubdtype(array.dtype, np.integer) or array.size == 0):
        raise TypeError(f"{name} must be a 1-D array of integers, got {array.ndim}-D {array.dtype}")
    if core_checks_range and array.dtype == np.int32:
        return np.require(array, requirements=["C", "A"])
    if array.size and (int(array.min()) < 0 or int(array.max()) > _INT32_MAX):
        raise ValueError(
            f"{name} must be {kind} in [0, {_INT32_MAX}] (megatron-core keeps them as int32), "
            f"got [{int(array.min())}, {int(array.max())}]"
        )
    return np.require(array, dtype=np.int32, requirements=["C", "A"])


def build_sample_idx(
    sizes: np.ndarray,
    document_indices: np.ndarray,
    sequence_length: int,
    num_epochs: int,
    tokens_per_epoch: int,
    drop_last_partial_sequence: bool = True,
    add_extra_token_to_sequence: bool = True,
) -> np.ndarray:
    """megatron-core's ``helpers.build_sample_idx``: the ``(num_samples + 1, 2)`` sample index
    over the documents ``document_indices`` (ids into ``sizes``, the documents' lengths) read
    as one stream of tokens; row ``k`` is the place in ``document_indices`` and the offset
    where sample ``k`` starts. ``int32`` when ``max(len(document_indices), sizes.max())`` fits
    in it, else ``int64``, as megatron-core picks; built in parallel pieces.

    Raises:
        TypeError: ``sizes`` or ``document_indices`` not 1-D integer arrays, or a count that is
            not an integer.
        ValueError: no documents, a document id outside ``sizes``, a length or id outside
            ``int32``, ``sequence_length``, ``num_epochs`` or ``tokens_per_epoch`` below 1.

    Example:
        >>> import numpy as np
        >>> from croupier.compat.megatron import build_sample_idx
        >>> sizes = np.array([3, 5, 2], np.int32)
        >>> build_sample_idx(sizes, np.array([1, 0, 2], np.int32), 4, 1, 10).tolist()
        [[0, 0], [0, 4], [2, 0]]
    """
    # An int32 array is read once, by the core, which refuses a negative length or an id
    # outside sizes (naming sizes or document_indices).
    lengths = _int32_values(sizes, "sizes", "lengths", core_checks_range=True)
    docs = _int32_values(document_indices, "document_indices", "ids", core_checks_range=True)
    if docs.size == 0 or lengths.size == 0:
        raise ValueError("document_indices and sizes must not be empty (there are no documents)")
    seq = _count(sequence_length, "sequence_length", 1)
    epochs = _count(num_epochs, "num_epochs", 1)
    tokens = _count(tokens_per_epoch, "tokens_per_epoch", 1)
    if seq > _INT32_MAX or epochs > _INT32_MAX:
        raise ValueError("sequence_length and num_epochs must fit in int32")
    largest = max(docs.shape[0], int(lengths.max()))
    wide = largest > _INT32_MAX
    extra = 1 if add_extra_token_to_sequence else 0
    index = _core.sample_index(
        lengths, docs, seq, epochs, tokens, bool(drop_last_partial_sequence), extra, wide
    )
    # megatron-core asserts that its int32 index stays in [0, largest]. Every row stays there
    # (a place in document_indices, an offset below its document's length) except the rows
    # past the documents' end, the last ones: the last document's length less the extra
    # token, -1 for an empty one.
    if not wide and index.size and int(index[-1, 1]) < 0:
        raise ValueError(
            f"the sample index leaves [0, {largest}]: the documents hold fewer tokens than "
            f"num_epochs * tokens_per_epoch says, ending in an empty document"
        )
    return index


_TARGETS = {
    "megatron.core.datasets.helpers": (
        "build_blending_indices",
        "build_exhaustive_blending_indices",
        "build_sample_idx",
    ),
    "megatron.core.datasets.gpt_dataset": ("_build_document_index", "_build_shuffle_index"),
}
_OURS = {
    "build_blending_indices": build_blending_indices,
    "build_exhaustive_blending_indices": build_exhaustive_blending_indices,
    "build_sample_idx": build_sample_idx,
    "_build_document_index": build_document_index,
    "_build_shuffle_index": build_shuffle_index,
}
_lock = threading.Lock()
_saved: list[tuple[Any, str, Any]] = []
_depth = 0
_index_free = False
# Bumped by _undo_all, so a handle of a patch undone that way does nothing.
_generation = 0


class Patch:
    """An installed :func:`patch`: megatron-core builds its indices with croupier until
    :meth:`undo` (or the end of a ``with`` block)."""

    def __init__(self) -> None:
        self._active = True
        self._generation = _generation

    def undo(self) -> None:
        """Gives megatron-core its own builders back (once every nested patch is undone)."""
        global _depth
        with _lock:
            if not self._active or self._generation != _generation:
                return
            self._active = False
            _depth -= 1
            if _depth == 0:
                for module, name, original in reversed(_saved):
                    setattr(module, name, original)
                _saved.clear()

    def __enter__(self) -> Patch:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.undo()


def patch(*, index_free: bool = False) -> Patch:
    """Makes an installed megatron-core build its dataset indices with croupier: the same
    arrays, so every run keeps its data order and its cached index files. Replaces
    ``megatron.core.datasets.helpers``' ``build_blending_indices``,
    ``build_exhaustive_blending_indices`` and ``build_sample_idx``, and ``gpt_dataset``'s
    ``_build_document_index`` and ``_build_shuffle_index``, which ``GPTDataset``,
    ``BlendedDataset`` and every other caller reach through their modules.

    With ``index_free=True`` (for new runs), a ``BlendedDataset``'s blend is an
    :class:`~croupier.compat.megatron.IndexFreeBlend` and a ``GPTDataset``'s shuffle index an
    :class:`~croupier.compat.megatron.IndexFreeShuffle`, read by random access and never
    built, written or loaded: croupier's orders, not megatron-core's, each dataset giving a
    prefix of its samples as megatron-core's blend does. The document and sample indices are
    megatron-core's arrays, cached beside megatron-core's files under names of their own.
    ``defer_npy_index_mmap`` is refused in that mode.

    Call it once before the datasets are built, or use it as a context manager; nested
    patches are undone with the outermost and must agree on ``index_free``.

    Raises:
        ImportError: megatron-core is not installed (``pip install croupier[megatron]``).
        TypeError: ``index_free`` is not a bool.
        ValueError: a patch with the other ``index_free`` is installed.

    Example:
        >>> import croupier.compat.megatron as croupier_megatron
        >>> with croupier_megatron.patch():  # doctest: +SKIP
        ...     builder = BlendedMegatronDatasetBuilder(GPTDataset, sizes, is_built, config)
        ...     datasets = builder.build()
    """
    global _depth, _index_free
    if not isinstance(index_free, bool):
        raise TypeError(f"index_free must be a bool, got {type(index_free).__name__}")
    modules = {name: importlib.import_module(name) for name in (*_TARGETS, *_INDEX_FREE)}
    with _lock:
        if _depth and index_free != _index_free:
            raise ValueError(
                f"a patch with index_free={_index_free} is installed: undo it before "
                f"patching with index_free={index_free}"
            )
        if _depth == 0:
            targets = [
                (modules[module_name], name, _OURS[name])
                for module_name, names in _TARGETS.items()
                for name in names
            ]
            if index_free:
                targets += [
                    (getattr(modules[module_name], owner), name, ours)
                    for module_name, (owner, name, ours) in _INDEX_FREE.items()
                ]
            for owner, name, ours in targets:
                _saved.append((owner, name, owner.__dict__[name]))
                setattr(owner, name, ours)
            _index_free = index_free
        _depth += 1
        handle = Patch()
    return handle


def _gpt_indices(self: Any) -> tuple[Any, Any, Any]:
    """``GPTDataset._build_document_sample_shuffle_indices`` under ``patch(index_free=True)``."""
    from croupier.compat.megatron.index_free import gpt_indices

    return gpt_indices(self)


def _blend_indices(self: Any) -> tuple[Any, Any]:
    """``BlendedDataset._build_indices`` under ``patch(index_free=True)``."""
    from croupier.compat.megatron.index_free import blend_indices

    return blend_indices(self)


_INDEX_FREE = {
    "megatron.core.datasets.gpt_dataset": (
        "GPTDataset",
        "_build_document_sample_shuffle_indices",
        _gpt_indices,
    ),
    "megatron.core.datasets.blended_dataset": ("BlendedDataset", "_build_indices", _blend_indices),
}


def _undo_all() -> None:
    """Undoes every patch installed (for tests, which must not leave one behind)."""
    global _depth, _generation
    with _lock:
        _generation += 1
        for owner, name, original in reversed(_saved):
            setattr(owner, name, original)
        _saved.clear()
        _depth = 0


def _patched() -> bool:
    """Whether megatron-core's builders are croupier's now (for tests and diagnostics)."""
    module = sys.modules.get("megatron.core.datasets.helpers")
    return module is not None and module.build_blending_indices is build_blending_indices
