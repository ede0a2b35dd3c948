"""Argument checks: clear errors that name the argument and its range, before any work.

This is the one place where user-facing arguments are checked (the binding crate only converts
values, and the Rust core checks its own invariants as a backstop). Bounds that the core
defines, such as :data:`MAX_LEN`, are read from the compiled module, not written again.
"""

from __future__ import annotations

import numbers
import operator
import os
import sys
import warnings
from collections.abc import Mapping

import numpy as np

from croupier import _core

__all__ = [
    "CORE_ORDERS",
    "MAX_LEN",
    "ORDERS",
    "ORDER_ALIASES",
    "ORDER_RESUME_HINTS",
    "U64_MAX",
    "as_int",
    "check_bool",
    "check_choice",
    "check_int",
    "check_order",
    "core_order_of",
    "dataset_length",
    "resume_hint",
]

U64_MAX = 2**64 - 1
"""The largest seed and epoch: they are 64-bit words of the core's random streams."""
MAX_LEN = _core.MAX_LEN
"""The largest dataset length, rank count or position (2**63 - 1), defined once in the core."""


def as_int(name: str, value: object) -> int:
    """``value`` as a Python int; ``TypeError`` naming ``name`` unless it is an integer
    (Python, numpy or anything with ``__index__``; ``bool`` and floats are refused)."""
    if not isinstance(value, (bool, np.bool_)):
        try:
            return operator.index(value)  # type: ignore[arg-type]
        except TypeError:
            pass
    raise TypeError(f"{name} must be an int, got {type(value).__name__}")


def check_int(name: str, value: object, lo: int = 0, hi: int | None = None) -> int:
    """``value`` as a Python int in ``[lo, hi]``; ``TypeError`` if it is not an integer
    (``bool`` and floats are refused), ``ValueError`` if it is out of range."""
    v = as_int(name, value)
    if hi is None and v < lo:
        raise ValueError(f"{name} must be an int >= {lo}, got {v}")
    if hi is not None and not lo <= v <= hi:
        raise ValueError(f"{name} must be in [{lo}, {hi}], got {v}")
    return v


def check_bool(name: str, value: object) -> bool:
    """``value`` as a bool; ``TypeError`` for anything but ``bool`` or ``numpy.bool_``
    (a string such as ``"false"`` would otherwise be silently true)."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise TypeError(f"{name} must be a bool, got {type(value).__name__}")


def dataset_length(dataset: object) -> int:
    """The number of samples of ``dataset``: an int N itself, or ``len(dataset)``."""
    if type(dataset) is int and 0 <= dataset <= MAX_LEN:
        return dataset  # the common case, without the ABC checks (costly in a fresh process)
    if isinstance(dataset, bool):
        raise TypeError("dataset must be a sized object (with __len__) or an int, got bool")
    if isinstance(dataset, (str, bytes, os.PathLike)):
        raise TypeError(
            "dataset must be a sized dataset object or an int number of samples, got "
            f"{type(dataset).__name__} {dataset!r:.80} (a path? load the dataset first)"
        )
    if isinstance(dataset, numbers.Integral):  # int and numpy integers, not arrays
        n = as_int("dataset", dataset)
        if not 0 <= n <= MAX_LEN:
            raise ValueError(
                "dataset given as an int is the number of samples: it must be in "
                f"[0, 2**63 - 1], got {n}"
            )
        return n
    if not hasattr(type(dataset), "__len__"):
        raise TypeError(
            "dataset must be a sized object (with __len__) or an int number of samples, "
            f"got {type(dataset).__name__} without __len__"
        )
    return check_int("len(dataset)", len(dataset), 0, MAX_LEN)  # type: ignore[arg-type]


ORDERS: Mapping[str, tuple[str, ...]] = {
    "DistributedSampler": ("global", "per_rank", "torch"),
    "MixtureSampler": ("global", "per_rank"),
    "BucketBatchSampler": ("global", "per_rank"),
    "SequentialBucketSampler": ("fast", "torch"),
}
"""The orders each sampler draws, by class: the one table of order names.

``"global"``: one sequence per epoch, the same for every number of ranks, dealt as torch
deals. ``"per_rank"``: each rank's sequence drawn for its world size (a different sequence
for each number of ranks). ``"torch"``: torch's own order, index for index.
``SequentialBucketSampler``'s ``"fast"`` draws each bucket from croupier's seekable streams
(``"torch"``: NeMo's exact batches)."""

CORE_ORDERS: Mapping[str, _core.Order] = {
    "global": _core.Order.GLOBAL,
    "per_rank": _core.Order.PER_RANK,
}
"""The core's order for each croupier-drawn order name (``"torch"`` picks its variant by
torch release: :mod:`croupier._torch_order`)."""


def core_order_of(
    order: str, torch_version: object, own: Mapping[str, _core.Order] = CORE_ORDERS
) -> tuple[_core.Order, str | None]:
    """The core's order for a checked order name: croupier's own orders from ``own``, else
    torch's, with the name of its ``randperm`` variant (picked by ``torch_version``, see
    :mod:`croupier._torch_order`; ``None`` for croupier's own orders, which take no
    ``torch_version``)."""
    core = own.get(order)
    if core is not None:
        if torch_version is not None:
            raise ValueError("torch_version applies to order='torch' only")
        return core, None
    # Imported for torch's order only: importing it took 0.45 ms of a fresh process's first
    # sampler in croupier's own orders.
    from croupier._torch_order import TORCH_ORDERS, torch_randperm_order

    randperm = torch_randperm_order(torch_version)
    return TORCH_ORDERS[randperm], randperm


ORDER_RESUME_HINTS: Mapping[str, str] = {
    "global": "the global order",
    "per_rank": "the per-rank order, called 'fast' before, croupier's order before the global one",
    "torch": "torch's own order",
}
"""What a state's order is, for the refusal of a state of another order than the sampler's."""


def resume_hint(order: object) -> str | None:
    """How to resume a state saved in ``order``: what that order is and the constructor
    argument that resumes it (``None`` for a name that is no order)."""
    what = ORDER_RESUME_HINTS.get(order) if isinstance(order, str) else None
    if what is None:
        return None
    return f"{what}; construct the sampler with order={order!r} to resume it"


ORDER_ALIASES: Mapping[str, str] = {"fast": "per_rank"}
"""Earlier names of an order, accepted with a ``DeprecationWarning`` where the new name is one
of the sampler's orders: ``"fast"`` named the per-rank order when it was the fastest."""


def check_choice(name: str, value: object, allowed: tuple[str, ...]) -> str:
    """``value``, a str among ``allowed``; ``TypeError``/``ValueError`` naming ``name`` and
    the allowed values otherwise."""
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, one of {list(allowed)}, got {type(value).__name__}")
    if value not in allowed:
        raise ValueError(f"{name} must be one of {list(allowed)}, got {value!r}")
    return value


def warn_at_caller(message: str, category: type[Warning] = UserWarning) -> None:
    """``warnings.warn`` pointing at the user's line: the first frame outside croupier
    (past subclasses, checks and overrides)."""
    # stacklevel 2 is this function's caller: count on from there past croupier's frames.
    level, frame = 2, sys._getframe(1)
    while frame is not None and frame.f_globals.get("__name__", "").startswith("croupier."):
        level, frame = level + 1, frame.f_back  # type: ignore[assignment]
    warnings.warn(message, category, stacklevel=level)


def check_order(sampler: str, order: object) -> str:
    """``order`` checked against ``sampler``'s row of :data:`ORDERS`, an earlier name
    (:data:`ORDER_ALIASES`) replaced by today's with a ``DeprecationWarning``."""
    allowed = ORDERS[sampler]
    if isinstance(order, str) and order not in allowed and ORDER_ALIASES.get(order) in allowed:
        new = ORDER_ALIASES[order]
        warn_at_caller(
            f"order={order!r} is deprecated: the same order is now called order={new!r} "
            f"(states saved with either name load); {order!r} will stop being accepted in "
            "croupier 1.0",
            DeprecationWarning,
        )
        return new
    return check_choice("order", order, allowed)
