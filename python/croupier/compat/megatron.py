"""Megatron-Core's dataset indices, built by croupier: the same arrays, from the same arguments.

megatron-core's ``GPTDataset`` shuffles its document index and its shuffle index with numpy's
legacy ``RandomState.shuffle`` (one thread, and a cache miss at nearly every swap at 1e8
samples and more). The builders here take the arguments of
``megatron.core.datasets.gpt_dataset._build_document_index`` and ``_build_shuffle_index``,
return element-for-element the same arrays (dtypes included), and leave the ``RandomState``
in the state megatron-core's would be in, so the calls that follow draw the same numbers too.
The shuffles are :func:`croupier.compat.numpy.legacy_shuffle`.
"""

from __future__ import annotations

import operator

import numpy as np

from croupier.compat.numpy import check_random_state, legacy_shuffle

__all__ = ["build_document_index", "build_shuffle_index"]

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
    docs = np.asarray(documents)
    if docs.ndim != 1 or not (np.issubdtype(docs.dtype, np.integer) or docs.size == 0):
        raise TypeError(
            f"documents must be a 1-D array of integers, got {docs.ndim}-D {docs.dtype}"
        )
    if docs.size and (int(docs.min()) < 0 or int(docs.max()) > _INT32_MAX):
        raise ValueError(
            f"documents must be ids in [0, {_INT32_MAX}] (the document index is int32), got "
            f"[{int(docs.min())}, {int(docs.max())}]"
        )
    index = np.tile(docs.astype(np.int32), epochs)
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
    dtype = np.int64 if total >= np.iinfo(np.uint32).max - 1 else np.uint32
    index = np.arange(total, dtype=dtype)
    legacy_shuffle(index[:first], numpy_random_state)
    if total > first:
        legacy_shuffle(index[first:], numpy_random_state)
    return index
