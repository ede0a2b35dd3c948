"""A ``MixtureSampler``'s arguments and schedule: datasets' sizes, weights and temperatures
checked, schedule entries rescaled to another epoch length, phases checked against the core's
rules."""

from __future__ import annotations

import itertools
import math
import numbers
from collections.abc import Sequence

import numpy as np

from croupier._validate import MAX_LEN, check_choice, check_int, check_order
from croupier.samplers._state import StateError

# A phase of the epoch as the core takes it: (start, nominal length, weights, temperature).
_Phase = tuple[int, int, tuple[float, ...], float]
# A schedule entry: (start, weights, temperature).
_Entry = tuple[int, tuple[float, ...], float]


_INTERLEAVES = ("uniform", "balanced")
# The interleaves each order draws: the per-rank order interleaves each rank's own sequence,
# uniformly only.
_ORDER_INTERLEAVES = {"global": _INTERLEAVES, "per_rank": ("uniform",)}
# How a refused state words each order's default epoch length.
_DEFAULT_LENGTH_WORDS = {
    "global": "None (the default length: every dataset once, sum(sizes) in all)",
    "per_rank": "None (the default length: the sum of the datasets' shares per rank)",
}


def _checked_order(order: object, interleave: object) -> tuple[str, str]:
    """``order`` and ``interleave`` checked: names from their lists, the balanced interleave
    in the global order only."""
    order = check_order("MixtureSampler", order)
    interleave = check_choice("interleave", interleave, _INTERLEAVES)
    if interleave not in _ORDER_INTERLEAVES[order]:
        raise ValueError(
            f"interleave={interleave!r} needs order='global' (each rank's own sequence in the "
            "per-rank order is interleaved uniformly)"
        )
    return order, interleave


def _rescaled(entries: tuple[_Entry, ...], old: int, new: int) -> tuple[_Entry, ...]:
    """Schedule entries for an epoch of ``old`` positions, moved to one of ``new`` positions
    (the default epoch length follows ``num_replicas``): a phase starting at ``s`` starts at
    ``s * new // old``, and a phase left empty (its start now equal to the next one's) is
    dropped."""
    if old == new:
        return entries
    out: list[_Entry] = []
    for start, weights, temperature in entries:
        moved = start * new // old if old else 0
        if out and out[-1][0] == moved:
            out[-1] = (moved, weights, temperature)
        else:
            out.append((moved, weights, temperature))
    return tuple(out)


def _sizes(cumulative_sizes: object) -> list[int]:
    """Dataset sizes from ``[0, n0, n0 + n1, ...]``, checked."""
    if isinstance(cumulative_sizes, (str, bytes)) or not isinstance(
        cumulative_sizes, (Sequence, np.ndarray)
    ):
        raise TypeError(
            "cumulative_sizes must be a list or 1-D numpy array of ints [0, n0, n0+n1, ...], "
            f"got {type(cumulative_sizes).__name__}"
        )
    arr = np.asarray(
        cumulative_sizes, dtype=object if isinstance(cumulative_sizes, Sequence) else None
    )
    if arr.ndim != 1:
        raise ValueError(f"cumulative_sizes must be 1-D, got shape {arr.shape}")
    if arr.dtype != object and arr.dtype.kind not in "iu":
        raise TypeError(f"cumulative_sizes must hold ints, got dtype {arr.dtype}")
    values = [
        check_int(f"cumulative_sizes[{i}]", v, 0, MAX_LEN) for i, v in enumerate(arr.tolist())
    ]
    if len(values) < 2:
        raise ValueError(
            f"cumulative_sizes must have at least 2 entries [0, n0, ...], got {len(values)}"
        )
    if values[0] != 0:
        raise ValueError(f"cumulative_sizes must start at 0, got {values[0]}")
    sizes = [b - a for a, b in itertools.pairwise(values)]
    for i, size in enumerate(sizes):
        if size < 0:
            raise ValueError(
                f"cumulative_sizes must be non-decreasing, got cumulative_sizes[{i + 1}] = "
                f"{values[i + 1]} < cumulative_sizes[{i}] = {values[i]}"
            )
    return sizes


def _weights(weights: object, count: int, name: str = "weights") -> tuple[float, ...]:
    """``weights`` as floats, one per dataset (values are checked by the core)."""
    if isinstance(weights, np.ndarray):
        if weights.ndim != 1 or weights.dtype.kind not in "fiu":
            raise TypeError(
                f"{name} must be a 1-D array of numbers, got {weights.dtype} {weights.shape}"
            )
        values = tuple(float(w) for w in weights.tolist())
    elif isinstance(weights, Sequence) and not isinstance(weights, (str, bytes)):
        for i, w in enumerate(weights):
            if isinstance(w, (bool, np.bool_)) or not isinstance(w, numbers.Real):
                raise TypeError(f"{name}[{i}] must be a number, got {type(w).__name__}")
        values = tuple(float(w) for w in weights)
    else:
        raise TypeError(
            f"{name} must be a list or 1-D array of numbers, got {type(weights).__name__}"
        )
    if not values:
        raise ValueError(f"{name} must not be empty: one weight per dataset ({count} datasets)")
    if len(values) != count:
        raise ValueError(
            f"Expected {count} weights, got {len(values)} ({name} needs one per dataset)"
        )
    for i, w in enumerate(values):
        if not (math.isfinite(w) and w >= 0):
            raise ValueError(f"{name}[{i}] must be finite and >= 0, got {w}")
    if not any(values):
        raise ValueError(f"{name} must not all be zero (at least one dataset needs a weight > 0)")
    return values


def _temperature(temperature: object) -> float:
    if isinstance(temperature, (bool, np.bool_)) or not isinstance(temperature, numbers.Real):
        raise TypeError(f"temperature must be a number, got {type(temperature).__name__}")
    t = float(temperature)
    if not (math.isfinite(t) and t > 0):
        raise ValueError(f"temperature must be a finite number > 0, got {t}")
    return t


def _length_words(num_samples: object, order: str) -> str:
    return _DEFAULT_LENGTH_WORDS[order] if num_samples is None else repr(num_samples)


def _check_layout(phases: Sequence[_Phase], length: int, num_replicas: int) -> None:
    """The core's rules for phases of an epoch of ``length`` positions: the first starts at
    0, starts increase and stay below ``length``, and a phase's nominal length reaches the
    next one's start (or the end)."""
    for i, (start, nominal, _, _) in enumerate(phases):
        end = phases[i + 1][0] if i + 1 < len(phases) else length
        ok_start = start == 0 if i == 0 else phases[i - 1][0] < start < length
        if not ok_start or nominal < end - start:
            raise StateError(
                f"state['phases'] is not a valid schedule for an epoch of {length} positions "
                f"(num_replicas={num_replicas}): phase {i} starts at {start} with nominal "
                f"length {nominal}"
            )
