"""Checking checkpoint states before a sampler trusts them, and the foreign shapes it accepts.

A state dict comes from disk, possibly from another run, version, configuration or library;
every sampler validates it completely (keys, types, ranges, configuration) before changing
anything. A state of another library's shape is first converted to the sampler's own shape by
a :class:`StateFormat`, then checked exactly like a native one: conversion never skips a check.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from croupier._validate import as_int

__all__ = [
    "KEMPNERFORGE",
    "NEMO",
    "STATE_VERSION",
    "UPGRADES",
    "StateError",
    "StateFormat",
    "Upgrade",
    "check_state",
    "upgrade",
]


class StateError(ValueError):
    """A state dict that cannot be loaded into this sampler: missing keys, a negative or
    out-of-range number, or a different configuration (the message says which). A
    ``ValueError``, so existing ``except ValueError`` handlers catch it.

    ``differences`` lists the configuration's differences (``"key: state has ..., this
    sampler has ..."``) when that is why the state was refused, else it is empty."""

    def __init__(self, message: str, differences: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.differences = differences


DIFFERENT = "state comes from a different configuration: "
"""How a refusal for a different configuration begins; the differences follow, "; "-joined."""


def different(differences: list[str] | tuple[str, ...]) -> StateError:
    """The refusal of a state whose configuration differs in ``differences``."""
    return StateError(DIFFERENT + "; ".join(differences), tuple(differences))


@dataclass(frozen=True)
class StateFormat:
    """A documented foreign state shape that a sampler also loads.

    A state without a ``version`` key whose keys include all of ``keys`` and nothing outside
    ``keys | optional`` (anything else, with ``ignore_others``) is of this shape;
    ``to_native(state, mine)`` returns it in the sampler's own shape, given ``mine``, the
    sampler's current state in its own shape (whose configuration the converted state must
    still match). ``position_key`` names the key that holds the position, for messages.
    """

    name: str
    keys: frozenset[str]
    to_native: Callable[[Mapping[str, Any], dict[str, Any]], dict[str, Any]]
    optional: frozenset[str] = frozenset()
    ignore_others: bool = False
    position_key: str = "position"

    def matches(self, keys: set[Any]) -> bool:
        """Whether a state with these keys has this shape."""
        return self.keys <= keys and (self.ignore_others or keys <= self.keys | self.optional)


def _from_kempnerforge(state: Mapping[str, Any], mine: dict[str, Any]) -> dict[str, Any]:
    # kempnerforge's sampler state records no position: its loader skips with set_skip. The
    # seed is carried over so that a state of another seed is refused by the configuration check.
    return {
        **mine,
        **{key: state[key] for key in ("epoch", "seed", "num_replicas", "rank")},
        "position": 0,
    }


KEMPNERFORGE = StateFormat(
    name="kempnerforge's DistributedSampler",
    keys=frozenset({"epoch", "seed", "num_replicas", "rank"}),
    to_native=_from_kempnerforge,
)
"""``{"epoch", "seed", "num_replicas", "rank"}``, the state of kempnerforge's
``DistributedSampler``: loads as the start of that epoch; its seed must equal this sampler's."""


def _from_nemo(state: Mapping[str, Any], mine: dict[str, Any]) -> dict[str, Any]:
    # NeMo's state is this world's epoch and batches consumed; the configuration is the
    # sampler's own (NeMo records none).
    return {**mine, "epoch": state["epoch"], "position": state["batches_yielded"]}


NEMO = StateFormat(
    name="NeMo Automodel's SequentialBucketSampler",
    keys=frozenset({"epoch", "batches_yielded"}),
    to_native=_from_nemo,
    ignore_others=True,
    position_key="batches_yielded",
)
"""``{"epoch", "batches_yielded"}`` (other keys ignored, as NeMo does), the state of NeMo
Automodel's ``SequentialBucketSampler``: ``batches_yielded`` batches of ``epoch`` consumed."""


def _as_config_value(key: str, value: object, mine: object) -> object:
    """``value`` normalised to the type of this sampler's own ``mine``, or ``TypeError``."""
    if isinstance(mine, bool):
        if isinstance(value, (bool, np.bool_)):
            return bool(value)
    elif isinstance(mine, int):
        return as_int(f"state[{key!r}]", value)
    elif type(value) is type(mine):
        return value
    raise TypeError(f"state[{key!r}] must be a {type(mine).__name__}, got {type(value).__name__}")


def check_state(
    state: Mapping[str, Any],
    *,
    ints: Iterable[str],
    config: Mapping[str, Any],
) -> dict[str, Any]:
    """Validates ``state`` and returns it as a plain dict of plain Python values.

    ``ints`` are the keys holding non-negative integers; ``config`` maps the keys that must
    equal this sampler's own values to those values. Integers may be Python, numpy or 0-d
    torch integers (a state that went through ``torch.save`` or numpy); ``bool`` and floats
    are refused. Raises ``TypeError`` for a value of the wrong type, and :class:`StateError`
    for missing keys, negative integers or a different configuration, listing every difference.
    """
    ints = tuple(ints)
    missing = [k for k in (*ints, *config) if k not in state]
    if missing:
        raise StateError(f"state is missing keys {missing}; is it a state_dict() of this sampler?")
    out = dict(state)
    for key in ints:
        out[key] = as_int(f"state[{key!r}]", state[key])
        if out[key] < 0:
            raise StateError(f"state[{key!r}] must be >= 0, got {out[key]}")
    for key, mine in config.items():
        out[key] = _as_config_value(key, state[key], mine)
    differ = [
        f"{key}: state has {out[key]!r}, this sampler has {mine!r}"
        for key, mine in config.items()
        if out[key] != mine
    ]
    if differ:
        raise different(differ)
    return out


STATE_VERSION = 4
"""The format version of the states croupier's samplers write (their ``version`` key). It moves
with every change of a state's shape or meaning; :data:`UPGRADES` reads every earlier one."""


@dataclass(frozen=True)
class Upgrade:
    """How a state of format version ``version`` becomes one of ``version + 1``: ``apply``
    takes the state (a new dict it may change) and the loading sampler's class name, and
    returns the upgraded state, or raises :class:`StateError` saying what to do when the old
    state cannot mean the same thing any more. ``change`` says what moved, for messages and
    ``docs/checkpointing.md``."""

    version: int
    change: str
    apply: Callable[[dict[str, Any], str], dict[str, Any]]


def _v1_to_v2(state: dict[str, Any], sampler: str) -> dict[str, Any]:
    el = state.get("elastic")
    if isinstance(el, Mapping) and "resumed_at" not in el:
        # Version 1 counted a rest's positions from the rest's start: they still do from 0.
        state["elastic"] = {**el, "resumed_at": 0}
    if state.get("order") == "fast" and "dataset_len" in state and el is None:
        # croupier 0.1's only shuffled order besides torch's; 0.2 draws "fast" shares
        # differently, so a position inside an epoch of it names other indices now.
        try:
            position, n, w = (
                as_int(k, state[k]) for k in ("position", "dataset_len", "num_replicas")
            )
        except (KeyError, TypeError):
            return state  # refused by the checks that follow, with their own message
        if w > 0:
            per_rank = n // w if state.get("drop_last") else -(-n // w)
            if 0 < position < per_rank:
                raise StateError(
                    f"state has version 1 and order 'fast' at position {position} of "
                    f"{per_rank}: croupier 0.1 saved such states, and its 'fast' order was "
                    "redrawn in 0.2, so this position would continue a different sequence "
                    "(repeating and losing samples). Resume it from its epoch's start or end "
                    "(set state['position'] to 0, or to the epoch's end to start the next "
                    "one), or finish the epoch with croupier 0.1. A state saved by a croupier "
                    "0.2 development build with order='fast' is safe: set state['version'] "
                    "to 2 to load it"
                )
    return state


def _v2_to_v3(state: dict[str, Any], sampler: str) -> dict[str, Any]:
    if state.get("order") == "fast" and sampler in (
        "DistributedSampler",
        "MixtureSampler",
        "BucketBatchSampler",
    ):
        state["order"] = "per_rank"  # the same order, under the name that says what it is
    return state


def _v3_to_v4(state: dict[str, Any], sampler: str) -> dict[str, Any]:
    if sampler != "BucketBatchSampler" or state.get("order") != "global":
        return state
    el = state.get("elastic")
    try:
        position = as_int("state['position']", state.get("position", 0))
    except TypeError:
        return state  # refused by the checks that follow, with their own message
    if position > 0 or el is not None:
        # The global order's buckets carry their tails since version 4: its batches (and
        # how many an epoch has) changed, so a place inside an epoch names other samples.
        raise StateError(
            "state was saved before state version 4 by BucketBatchSampler's global order, at "
            f"position {position}{' of an elastic rest' if el is not None else ''}: the global "
            "order's batches changed in version 4 (bucket tails carried to the next bucket, "
            "so batches are full), so this position would continue a different sequence "
            "(repeating and losing samples). Resume it from its epoch's start (set "
            "state['position'] to 0 and remove state['elastic']) or, if the epoch had finished "
            "(the saving sampler had yielded len(sampler) batches), from the next one (also "
            "add 1 to state['epoch']); or finish the epoch with the croupier that saved it"
        )
    return state


UPGRADES: tuple[Upgrade, ...] = (
    Upgrade(
        1,
        "an elastic rest's positions count on from the loaded position (elastic gains "
        "'resumed_at'; len after an elastic load is that position plus the rest); croupier "
        "0.1's 'fast' order is not 0.2's",
        _v1_to_v2,
    ),
    Upgrade(
        2,
        "order 'fast' is called 'per_rank' (the same order)",
        _v2_to_v3,
    ),
    Upgrade(
        3,
        "BucketBatchSampler's global order carries every bucket's tail to the next (other "
        "batches): a state of it inside an epoch is refused",
        _v3_to_v4,
    ),
)
"""The upgrades, one per version from 1 to ``STATE_VERSION - 1``, in order."""


def upgrade(state: Mapping[str, Any], sampler: str) -> dict[str, Any]:
    """``state`` (a sampler's own shape, with a ``version`` key) brought to
    :data:`STATE_VERSION` through :data:`UPGRADES`, as a new dict; :class:`StateError` for a
    version this croupier cannot read (a newer one, or an old state that cannot keep its
    meaning: the message says what to do), ``TypeError`` for a version that is no integer."""
    version = as_int("state['version']", state["version"])
    if not 1 <= version <= STATE_VERSION:
        newer = version > STATE_VERSION
        raise StateError(
            f"state['version'] is {version}; this croupier reads state versions 1 to "
            f"{STATE_VERSION}"
            + (": it was saved by a newer croupier, upgrade croupier to load it" if newer else "")
        )
    out = dict(state)
    for step in UPGRADES[version - 1 :]:
        out = step.apply(out, sampler)
        out["version"] = step.version + 1
    return out
