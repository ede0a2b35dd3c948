"""Where kempnerforge's ``MixtureSampler`` raises ``ZeroDivisionError`` or ``IndexError`` on bad
arguments, croupier refuses them with its own ``ValueError`` that is also of kempnerforge's
type, so ``except`` clauses written for kempnerforge still catch it."""

from __future__ import annotations

import math
import numbers

import numpy as np


class _ZeroDivisionValueError(ValueError, ZeroDivisionError):
    """Refused input on which kempnerforge's ``MixtureSampler`` raises ``ZeroDivisionError``
    (weights summing to 0, ``temperature=0``, ``num_replicas=0``): a ``ValueError`` with
    croupier's message that ``except ZeroDivisionError`` clauses written for it still catch."""


class _IndexValueError(ValueError, IndexError):
    """Refused input on which kempnerforge's ``MixtureSampler`` raises ``IndexError`` (empty
    or too few weights): a ``ValueError`` that ``except IndexError`` clauses still catch."""


def _kempnerforge_kind(
    cumulative_sizes: object,
    weights: object,
    temperature: object,
    num_replicas: object = None,
    *,
    update: bool = False,
) -> type[ValueError] | None:
    """The exception type to raise where kempnerforge's ``MixtureSampler`` raises
    ``ZeroDivisionError`` or ``IndexError`` on these arguments (``None`` where it raises
    something else or nothing), found by following its documented arithmetic in its order:
    at temperature 1 it divides every weight by their sum, otherwise every log-weight by the
    temperature and then takes their maximum; then it divides every dataset's size by
    ``num_replicas``; then it reads one probability per dataset (rounding a NaN one first).
    ``update=True``: ``update_weights``, which first refuses a wrong count with ``ValueError``.
    """
    try:
        datasets = len(cumulative_sizes) - 1  # type: ignore[arg-type]
        arr = np.asarray(weights, dtype=np.float64)
    except (TypeError, ValueError):
        return None
    if arr.ndim != 1 or isinstance(temperature, (bool, np.bool_)):
        return None
    if not isinstance(temperature, numbers.Real):
        return None
    ws = arr.tolist()
    if update and len(ws) != datasets:
        return None
    if float(temperature) != 1.0:
        if not ws:
            return None  # max() of no log-weights: ValueError
        if float(temperature) == 0.0:
            return _ZeroDivisionValueError
    elif ws and sum(ws) == 0:
        return _ZeroDivisionValueError
    if not update and not isinstance(num_replicas, (bool, np.bool_)) and num_replicas == 0:
        return _ZeroDivisionValueError
    if len(ws) < datasets and all(map(math.isfinite, ws)) and not math.isnan(temperature):
        return _IndexValueError  # (NaN probabilities fail their rounding first)
    return None
