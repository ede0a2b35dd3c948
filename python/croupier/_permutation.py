"""``croupier.permutation``: a full seeded permutation of ``[0, n)`` on every core."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from croupier import _core
from croupier._validate import MAX_LEN, U64_MAX, check_int

__all__ = ["permutation"]


def permutation(
    n: int, seed: int = 0, epoch: int = 0, *, out: npt.NDArray[Any] | None = None
) -> npt.NDArray[Any]:
    """A uniform random permutation of ``[0, n)``, the same for the same ``(n, seed, epoch)`` on
    every platform and for every number of threads.

    An exact parallel shuffle (Rao-Sandelius: values dealt to cache-sized buckets by random
    labels, each bucket shuffled by Fisher-Yates) over a ``uint32`` buffer when ``n <= 2**32``
    (``int64`` above), with transparent huge pages for large buffers. The GIL is released.

    Args:
        n: length, in ``[0, 2**63 - 1]``.
        seed: in ``[0, 2**64 - 1]``.
        epoch: in ``[0, 2**64 - 1]``; each epoch is an independent permutation.
        out: optional array to fill in place instead of allocating one (reuse a buffer across
            epochs): writable, C-contiguous, 1-D, of length ``n`` and dtype ``uint32``
            (``n <= 2**32``) or ``int64``. The values are the same either way.

    Returns:
        The permutation: a new array owned by Rust memory (no copy), or ``out``.
    """
    n = check_int("n", n, 0, MAX_LEN)
    seed = check_int("seed", seed, 0, U64_MAX)
    epoch = check_int("epoch", epoch, 0, U64_MAX)
    if out is None:
        return _core.permutation(n, seed, epoch)
    if not isinstance(out, np.ndarray):
        raise TypeError(f"out must be a numpy array, got {type(out).__name__}")
    if out.dtype not in (np.uint32, np.int64):
        raise TypeError(f"out must have dtype uint32 or int64, got {out.dtype}")
    if out.ndim != 1 or len(out) != n:
        raise ValueError(f"out must be 1-D of length n = {n}, got shape {out.shape}")
    if out.dtype == np.uint32 and n > _core.U32_MAX_LEN:
        raise ValueError(f"out must be int64 for n > 2**32, got uint32 with n = {n}")
    if not (out.flags.c_contiguous and out.flags.writeable):
        raise ValueError("out must be C-contiguous and writable")
    _core.permutation_into(out, seed, epoch)
    return out
