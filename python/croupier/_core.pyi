"""Type stubs of the compiled module ``croupier._core`` (private; use the ``croupier`` package)."""

import numpy as np
import numpy.typing as npt

__all__ = [
    "MAX_LEN",
    "TORCH_LARGE_N",
    "__version__",
    "first_stop",
    "layout",
    "permutation",
    "permutation_into",
    "rank_indices",
    "torch_randperm",
]

__version__: str
MAX_LEN: int
"""The largest dataset length accepted: 2**63 - 1."""
TORCH_LARGE_N: int
"""From this length (2**32 // 20) on, torch >= 2.6 and torch < 2.6 permute differently."""

def permutation(n: int, seed: int, epoch: int) -> npt.NDArray[np.uint32] | npt.NDArray[np.int64]:
    """The epoch's permutation of ``[0, n)`` (parallel, exact): ``uint32`` when
    ``n <= 2**32``, else ``int64``."""

def permutation_into(
    out: npt.NDArray[np.uint32] | npt.NDArray[np.int64], seed: int, epoch: int
) -> None:
    """Fills ``out`` (writable, contiguous, 1-D, ``uint32`` or ``int64``) with the permutation of
    ``[0, len(out))`` that :func:`permutation` returns, in place."""

def layout(n: int, num_replicas: int, drop_last: bool) -> tuple[int, int]:
    """``(num_samples, total_size)`` of torch's ``DistributedSampler`` for these arguments."""

def rank_indices(
    n: int,
    num_replicas: int,
    rank: int,
    shuffle: bool,
    seed: int,
    epoch: int,
    drop_last: bool,
    order: str,
    start: int | None = None,
    stop: int | None = None,
) -> npt.NDArray[np.uint32] | npt.NDArray[np.int64]:
    """Positions ``[start, stop)`` (default: all ``num_samples``) of the sequence ``rank``
    receives in ``epoch``, padded or cut as torch does.

    ``order`` is ``"fast"`` (croupier's order), ``"torch>=2.6"`` or ``"torch<2.6"`` (the order
    of torch's ``randperm`` in those releases). In the fast shuffled order only the blocks
    holding the positions are computed."""

def first_stop(
    n: int,
    num_replicas: int,
    rank: int,
    shuffle: bool,
    drop_last: bool,
    order: str,
    start: int,
) -> int:
    """Where a :func:`rank_indices` call starting at ``start`` should stop to hand out its first
    index soonest: in the fast shuffled order, the end of the block holding ``start``, or
    ``start + 64`` inside a long block (read by random access); else ``num_samples``."""

def torch_randperm(n: int, seed: int, order: str) -> npt.NDArray[np.uint32] | npt.NDArray[np.int64]:
    """``torch.randperm(n, generator=torch.Generator().manual_seed(seed))`` on the CPU, as the
    releases named by ``order`` (``"torch>=2.6"`` or ``"torch<2.6"``) compute it."""
