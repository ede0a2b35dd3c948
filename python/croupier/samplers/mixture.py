"""``croupier.MixtureSampler``: exact weighted mixtures of many datasets, with weight schedules.

The order is computed by the Rust core (``croupier_core::mix``); this module checks arguments,
keeps the schedule (the weights in force, from which position) and its checkpoint state.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import numbers
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from croupier import _core
from croupier._dist import DistInfo, resolve_ranks
from croupier._validate import MAX_LEN, U64_MAX, check_bool, check_int
from croupier.samplers._base import IndexSampler, _Pending
from croupier.samplers._state import KEMPNERFORGE, StateError

__all__ = ["MixtureSampler"]

# A phase of the epoch as the core takes it: (start, nominal length, weights, temperature).
_Phase = tuple[int, int, tuple[float, ...], float]
# A schedule entry: (start, weights, temperature).
_Entry = tuple[int, tuple[float, ...], float]


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


class MixtureSampler(IndexSampler):
    """Draws a weighted mixture of datasets, per rank, with exact per-dataset counts.

    Yields global indices into the concatenation of the datasets (``cumulative_sizes[i] + j``
    is sample ``j`` of dataset ``i``), as kempnerforge's ``MixtureSampler`` does, with the
    same signature.

    **Counts.** Probabilities are ``p_i ∝ w_i ** (1 / temperature)`` (``1.0``: as given,
    larger: flatter). A rank's epoch of ``len(self)`` positions holds dataset ``i`` exactly
    ``c_i`` times, the largest-remainder rounding of ``p_i * len(self)``
    (``|c_i - p_i len| < 1``), the same on every rank. ``len(self)`` is, as in kempnerforge,
    the sum over datasets of one rank's share (``size // num_replicas`` with ``drop_last``,
    ``ceil(size / num_replicas)`` without), or ``num_samples``.

    **Passes.** Each dataset is read pass after pass. A pass is a fresh uniform permutation of
    the dataset dealt to the ranks like ``DistributedSampler`` (disjoint within the pass;
    ``drop_last`` cuts, otherwise the head pads), and a rank reads its share in order: an
    oversampled dataset starts its next pass only when the rank's share of the current one is
    used up, and an undersampled one uses a prefix of its share, never repeating in the epoch.

    **Interleave.** The order of dataset choices is a uniformly random sequence with exactly
    those counts, independent per rank; each choice takes the next sample of that dataset's
    stream. With ``shuffle=False`` each pass is the dataset's strided ``0..n-1`` and the
    datasets follow each other in order (kempnerforge's unshuffled order).

    **Schedules.** :meth:`update_weights` and :meth:`set_schedule` change the weights from the
    next iteration on; a schedule changes them at exact positions inside every epoch. Datasets'
    streams continue across phase boundaries, so nothing in a pass is lost or repeated. A
    change that takes effect mid-epoch (after :meth:`set_skip` or :meth:`load_state_dict`)
    keeps what was already yielded and applies from the resume position.

    Args:
        cumulative_sizes: ``[0, len(ds0), len(ds0) + len(ds1), ...]`` (a list or 1-D integer
            numpy array, non-decreasing, starting at 0).
        weights: one non-negative weight per dataset, not all zero (normalised internally). A
            dataset with weight 0 is never drawn; an empty dataset must have weight 0.
        num_replicas: number of ranks ``W >= 1``; ``None`` asks ``dist_info``.
        rank: this rank, in ``[0, W)``; ``None`` asks ``dist_info``.
        shuffle: shuffle passes and interleave (seeded by ``seed`` and the epoch).
        seed: non-negative integer below ``2**64``, the same on all ranks.
        drop_last: cut each pass to a multiple of ``W`` instead of padding. A dataset smaller
            than ``W`` gives a rank nothing per pass with ``drop_last=True``: it must have
            weight 0 then.
        temperature: weight temperature, a finite number ``> 0``.
        num_samples: positions per rank and epoch, instead of the default.
        dist_info: where ``num_replicas``/``rank`` come from when ``None`` (see
            :class:`~croupier.DistributedSampler`).

    Checkpointing: :meth:`state_dict` holds the configuration (dataset sizes as a count, a
    total and a digest), the epoch, the position, the schedule in force (weights and
    temperature included) and the phases of the current epoch; :meth:`load_state_dict`
    restores all of it and continues with exactly the next index, in milliseconds at any
    position. kempnerforge's ``{"epoch", "seed", "num_replicas", "rank"}`` loads too, as the
    start of its epoch.
    """

    _config_names = (
        "cumulative_sizes",
        "num_replicas",
        "rank",
        "shuffle",
        "seed",
        "drop_last",
        "num_samples",
    )
    _state_formats = (KEMPNERFORGE,)

    def __init__(
        self,
        cumulative_sizes: Sequence[int] | npt.NDArray[Any],
        weights: Sequence[float] | npt.NDArray[Any],
        num_replicas: int | None = None,
        rank: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = True,
        temperature: float = 1.0,
        *,
        num_samples: int | None = None,
        dist_info: DistInfo = None,
    ) -> None:
        sizes = _sizes(cumulative_sizes)
        weights_t = _weights(weights, len(sizes))
        temperature_f = _temperature(temperature)
        self.shuffle = check_bool("shuffle", shuffle)
        self.drop_last = check_bool("drop_last", drop_last)
        self.seed = check_int("seed", seed, 0, U64_MAX)
        length = None if num_samples is None else check_int("num_samples", num_samples, 0, MAX_LEN)
        num_replicas, rank = resolve_ranks(num_replicas, rank, dist_info)
        self._sizes = sizes
        self._fixed_length = length
        self.cumulative_sizes = tuple(np.cumsum([0, *sizes], dtype=object).tolist())
        if length is None:
            length = sum(_core.pass_shares(sizes, num_replicas, self.drop_last))
        self.num_samples = length
        digest = hashlib.sha256(np.asarray(sizes, dtype="<u8").tobytes()).hexdigest()[:16]
        self._sizes_config = {
            "datasets": len(sizes),
            "total_size": sum(sizes),
            "sizes_digest": digest,
        }
        self._mixtures: dict[tuple[_Phase, ...], Any] = {}
        self._schedule: tuple[_Entry, ...] = ((0, weights_t, temperature_f),)
        # Changes wait for the next iteration; the phases of the epoch being iterated.
        self._pending = False
        self._phases = self._fresh(self._schedule)
        self._active = self._mixture(self._phases, num_replicas, rank)
        super().__init__(num_replicas, rank, length)

    # -- schedule ------------------------------------------------------------------------------

    def _mixture(
        self, phases: tuple[_Phase, ...], num_replicas: int | None = None, rank: int | None = None
    ) -> Any:
        mix = self._mixtures.get(phases)
        if mix is None:
            w = self.num_replicas if num_replicas is None else num_replicas
            r = self.rank if rank is None else rank
            mix = _core.Mixture(
                self._sizes, w, r, self.drop_last, self.shuffle, self.seed, self.num_samples,
                [(s, n, list(ws), t) for s, n, ws, t in phases],
            )  # fmt: skip
            if len(self._mixtures) > 8:
                self._mixtures.clear()
            self._mixtures[phases] = mix
        return mix

    def _fresh(self, schedule: tuple[_Entry, ...]) -> tuple[_Phase, ...]:
        """The phases of an epoch that starts under ``schedule``."""
        ends = [s for s, _, _ in schedule[1:]] + [self.num_samples]
        return tuple((s, end - s, w, t) for (s, w, t), end in zip(schedule, ends, strict=True))

    def _spliced(self, at: int) -> tuple[_Phase, ...]:
        """The current epoch's phases before ``at``, then the pending schedule from ``at``."""
        if at == 0:
            return self._fresh(self._schedule)
        kept = tuple(p for p in self._phases if p[0] < at)
        entries = self._schedule
        current = max(i for i, e in enumerate(entries) if e[0] <= at)
        new = [(at, entries[current][1], entries[current][2])] + [e for e in entries if e[0] > at]
        ends = [s for s, _, _ in new[1:]] + [self.num_samples]
        return kept + tuple((s, end - s, w, t) for (s, w, t), end in zip(new, ends, strict=True))

    def _phases_for(self, start: int) -> tuple[_Phase, ...]:
        """The phases the next iteration, starting at ``start``, uses."""
        if start == 0:
            return self._fresh(self._schedule)
        if self._pending and start < self.num_samples:
            return self._spliced(start)
        return self._phases

    def _checked_schedule(self, entries: object) -> tuple[_Entry, ...]:
        if isinstance(entries, (str, bytes)) or not isinstance(entries, Sequence):
            raise TypeError(
                "schedule must be a list of (start, weights) or (start, weights, temperature) "
                f"tuples, got {type(entries).__name__}"
            )
        if not entries:
            raise ValueError("schedule must have at least one phase, the first starting at 0")
        out: list[_Entry] = []
        for i, entry in enumerate(entries):
            if (
                not isinstance(entry, Sequence)
                or isinstance(entry, (str, bytes))
                or len(entry) not in (2, 3)
            ):
                raise TypeError(
                    f"schedule[{i}] must be (start, weights) or (start, weights, temperature), "
                    f"got {entry!r:.80}"
                )
            limit = max(self.num_samples - 1, 0)
            start = check_int(f"schedule[{i}] start", entry[0], 0, limit)
            if i == 0 and start != 0:
                raise ValueError(f"schedule[0] must start at 0, got {start}")
            if i > 0 and start <= out[-1][0]:
                raise ValueError(
                    f"schedule starts must increase: schedule[{i}] starts at {start}, "
                    f"schedule[{i - 1}] at {out[-1][0]}"
                )
            weights = _weights(entry[1], len(self._sizes), f"schedule[{i}] weights")
            temperature = _temperature(entry[2]) if len(entry) == 3 else 1.0
            out.append((start, weights, temperature))
        schedule = tuple(out)
        self._mixture(self._fresh(schedule))  # the core's checks (datasets a rank cannot draw)
        return schedule

    def set_schedule(self, schedule: Sequence[Sequence[Any]]) -> None:
        """Sets the weights by position: ``[(start, weights), (start, weights, temperature),
        ...]``, the first phase starting at 0, starts increasing and below ``len(self)``.

        Phase ``k`` runs from its start to the next one's (or the end of the epoch) and holds
        each dataset in exact counts for its length (largest remainder), interleaved
        uniformly; each dataset's stream runs on across phases, so no sample of a pass is
        lost or repeated at a boundary. Positions count this rank's indices within an epoch,
        and the schedule applies to every epoch from the next iteration on. If that iteration
        resumes mid-epoch (after :meth:`set_skip` or :meth:`load_state_dict`), the positions
        before the resume keep the phases they were yielded with, and the schedule applies
        from the resume position on (the phase in force there starts at it).

        Refused input (``TypeError``/``ValueError`` naming the entry) leaves the schedule in
        force unchanged. The schedule is part of :meth:`state_dict`.
        """
        self._schedule = self._checked_schedule(schedule)
        self._pending = True

    def update_weights(
        self, weights: Sequence[float] | npt.NDArray[Any], temperature: float = 1.0
    ) -> None:
        """Replaces the weights (and temperature) from the next iteration on, as kempnerforge's
        ``update_weights`` does: the same as ``set_schedule([(0, weights, temperature)])``,
        including its mid-epoch rule. Bad weights raise ``ValueError``/``TypeError`` and leave
        the previous weights in force."""
        self.set_schedule([(0, weights, temperature)])

    @property
    def schedule(self) -> list[tuple[int, list[float], float]]:
        """The schedule the next fresh epoch uses: ``[(start, weights, temperature), ...]``."""
        return [(s, list(w), t) for s, w, t in self._schedule]

    def counts(self, phase: int = 0) -> list[int]:
        """How many indices of each dataset phase ``phase`` of the schedule holds on every
        rank, over its full length (for the single phase of plain weights: the epoch's
        exact per-dataset counts)."""
        phases = self._fresh(self._schedule)
        phase = check_int("phase", phase, 0, len(phases) - 1)
        return list(self._mixture(phases).phase_counts(phase))

    # -- iteration -----------------------------------------------------------------------------

    def _activate(self, start: int) -> None:
        phases = self._phases_for(start)
        if start == 0 or (self._pending and start < self.num_samples):
            self._pending = False
        if phases != self._phases:
            self._phases = phases
            self._cache = None
        self._active = self._mixture(phases)

    def __iter__(self) -> Iterator[int]:
        _, at = self._now
        self._activate(self._next_start(at))
        return super().__iter__()

    def indices(self) -> npt.NDArray[Any]:
        """What the next iteration yields, as a read-only numpy array (``uint32`` while the
        datasets total at most ``2**32`` samples, else ``int64``), without a copy."""
        epoch, at = self._now
        start = self._next_start(at)
        phases = self._phases_for(start)
        if phases == self._phases:
            return super().indices()
        arr = self._mixture(phases).indices(epoch, start, None)
        arr.flags.writeable = False
        return arr  # type: ignore[no-any-return]

    def _config(self) -> dict[str, Any]:
        config = {
            **self._sizes_config,
            "shuffle": self.shuffle,
            "drop_last": self.drop_last,
            "seed": self.seed,
        }
        # The default length follows num_replicas (a resume on another world size is allowed
        # at epoch boundaries); a fixed one must match.
        if self._fixed_length is None:
            return {**config, "length": "sum of pass shares"}
        return {**config, "length": "num_samples", "num_samples": self._fixed_length}

    def _epoch_length(self, num_replicas: int) -> int:
        if self._fixed_length is not None:
            return self._fixed_length
        return sum(_core.pass_shares(self._sizes, num_replicas, self.drop_last))

    def _compute(self, epoch: int, start: int, stop: int | None) -> npt.NDArray[Any]:
        arr = self._active.indices(epoch, start, stop)
        arr.flags.writeable = False
        return arr  # type: ignore[no-any-return]

    def _first_stop(self, start: int) -> int:
        return int(self._active.first_stop(start))

    # -- checkpoints -----------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The checkpoint state: the base keys (configuration, ``num_replicas``, ``rank``,
        ``epoch``, ``position``), plus ``schedule`` (the schedule for fresh epochs, as
        ``[[start, weights, temperature], ...]``), ``schedule_pending`` (whether it still waits
        for the next iteration) and ``phases`` (the current epoch's phases, ``[[start,
        nominal_length, weights, temperature], ...]``). JSON-serialisable; its size grows with
        the number of datasets and phases only."""
        return super().state_dict()

    def _state_at(self, epoch: int, position: int) -> dict[str, Any]:
        state = super()._state_at(epoch, position)
        state["schedule"] = [[s, list(w), t] for s, w, t in self._schedule]
        state["schedule_pending"] = self._pending
        state["phases"] = [[s, n, list(w), t] for s, n, w, t in self._phases]
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restores a :meth:`state_dict`, schedule and phases included, so the next iteration
        continues with exactly the next index. Refuses (``ValueError``, naming each
        difference) a state of other dataset sizes, seed, shuffle, drop_last or
        ``num_samples``; loads a kempnerforge state as the start of its epoch, keeping the
        weights in force. Nothing changes if the state is refused."""
        saved = (self._now, self._cache)
        super().load_state_dict(state)
        try:
            if isinstance(state, Mapping) and "version" in state:
                schedule, pending, phases = self._checked_extras(state)
            else:
                schedule, pending, phases = self._schedule, self._pending, self._phases
        except BaseException:
            self._now, self._cache = saved
            raise
        self._schedule, self._pending = schedule, pending
        _, at = self._now
        if isinstance(at, _Pending) and at.position == 0:
            phases = self._fresh(schedule)
        self._phases = phases
        self._active = self._mixture(phases)
        self._cache = None

    def _checked_extras(
        self, state: Mapping[str, Any]
    ) -> tuple[tuple[_Entry, ...], bool, tuple[_Phase, ...]]:
        for key in ("schedule", "schedule_pending", "phases"):
            if key not in state:
                raise StateError(
                    f"state is missing key {key!r}; is it a MixtureSampler state_dict()?"
                )
        schedule = self._checked_schedule(state["schedule"])
        pending = check_bool("state['schedule_pending']", state["schedule_pending"])
        raw = state["phases"]
        if not isinstance(raw, Sequence) or not raw:
            raise StateError(
                "state['phases'] must be a non-empty list of [start, length, weights, temperature]"
            )
        phases: list[_Phase] = []
        for i, p in enumerate(raw):
            if not isinstance(p, Sequence) or len(p) != 4:
                raise StateError(
                    f"state['phases'][{i}] must be [start, length, weights, temperature]"
                )
            phases.append(
                (
                    check_int(f"state['phases'][{i}] start", p[0], 0, MAX_LEN),
                    check_int(f"state['phases'][{i}] length", p[1], 0, MAX_LEN),
                    _weights(p[2], len(self._sizes), f"state['phases'][{i}] weights"),
                    _temperature(p[3]),
                )
            )
        try:
            self._mixture(tuple(phases))
        except ValueError as e:
            raise StateError(
                f"state['phases'] is not a valid schedule for this sampler: {e}"
            ) from None
        return schedule, pending, tuple(phases)
