"""Checking checkpoint states before a sampler trusts them.

A state dict comes from disk, possibly from another run, version or configuration; every
sampler validates it completely (keys, types, ranges, configuration) before changing anything.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["StateError", "check_state"]


class StateError(ValueError):
    """A state dict that cannot be loaded into this sampler."""


def check_state(
    state: object,
    *,
    ints: Iterable[str],
    config: Mapping[str, Any],
) -> dict[str, Any]:
    """Validates ``state`` and returns it as a plain dict.

    ``ints`` are the keys holding non-negative integers; ``config`` maps the keys that must
    equal this sampler's own values to those values. Raises ``TypeError`` for a non-mapping or a
    value of the wrong type, and :class:`StateError` (a ``ValueError``) for missing keys, negative
    integers or a different configuration, listing every difference.
    """
    if not isinstance(state, Mapping):
        raise TypeError(f"state must be a mapping (a state_dict()), got {type(state).__name__}")
    ints = tuple(ints)
    missing = [k for k in (*ints, *config) if k not in state]
    if missing:
        raise StateError(f"state is missing keys {missing}; is it a state_dict() of this sampler?")
    for key in ints:
        value = state[key]
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"state[{key!r}] must be an int, got {type(value).__name__}")
        if value < 0:
            raise StateError(f"state[{key!r}] must be >= 0, got {value}")
    for key, mine in config.items():
        value = state[key]
        if type(value) is not type(mine):
            raise TypeError(
                f"state[{key!r}] must be a {type(mine).__name__}, got {type(value).__name__}"
            )
    differ = [
        f"{key}: state has {state[key]!r}, this sampler has {mine!r}"
        for key, mine in config.items()
        if state[key] != mine
    ]
    if differ:
        raise StateError("state comes from a different configuration: " + "; ".join(differ))
    return dict(state)
