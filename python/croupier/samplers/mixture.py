"""``croupier.MixtureSampler``: exact weighted mixtures of many datasets, with weight schedules.

The order is computed by the Rust core (``croupier_core::mix``); this module checks arguments,
keeps the schedule (the weights in force, from which position) and its checkpoint state.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from croupier import _core
from croupier._dist import DistInfo, resolve_ranks
from croupier._torch import DistributedSamplerBase
from croupier._validate import (
    CORE_ORDERS,
    MAX_LEN,
    U64_MAX,
    as_int,
    check_bool,
    check_int,
    resume_hint,
    warn_at_caller,
)
from croupier.samplers._base import IndexSampler, Loaded, Rest
from croupier.samplers._schedule import (
    _check_layout,
    _checked_order,
    _Entry,
    _length_words,
    _Phase,
    _rescaled,
    _sizes,
    _temperature,
    _weights,
)
from croupier.samplers._state import (
    KEMPNERFORGE,
    StateError,
    StateFormat,
    check_state,
    different,
)

__all__ = ["MixtureSampler"]

#: The balanced sequence's leaf boundaries by phase: ``[(position, counts), ...]``.
_Seeds = dict[_Phase, list[tuple[int, list[int]]]]

# How a state names the default epoch length of each order.
_DEFAULT_LENGTH = {"per_rank": "sum of pass shares", "global": "sum of sizes"}


class MixtureSampler(IndexSampler, DistributedSamplerBase[int]):
    """Draws a weighted mixture of datasets with exact per-dataset counts, dealt to ranks.

    Yields global indices into the concatenation of the datasets (``cumulative_sizes[i] + j``
    is sample ``j`` of dataset ``i``), as kempnerforge's ``MixtureSampler`` does, with the
    same signature (plus the keywords ``order`` and ``interleave``).

    **Orders.** ``order="global"`` (the default) makes each epoch one global sequence, the
    same whatever the number of ranks, dealt like torch's ``DistributedSampler`` deals its
    permutation: rank ``r`` of ``W`` takes global positions ``r, r + W, ...`` (``drop_last``
    cuts the tail, otherwise the head pads). So with a fixed global batch, step ``k`` trains
    on the same samples on 8 ranks or 64, and an elastic resume continues the same sequence.
    ``order="per_rank"`` is croupier's earlier order (called ``"fast"`` before, still accepted
    with a ``DeprecationWarning``; kempnerforge's shapes, what
    :mod:`croupier.compat.kempnerforge` uses): each rank has its own sequence of exact counts,
    which changes with ``W``.

    **Counts.** Probabilities are ``p_i ∝ w_i ** (1 / temperature)`` (``1.0``: as given,
    larger: flatter). An epoch of ``L`` positions holds dataset ``i`` exactly ``c_i`` times,
    the largest-remainder rounding of ``p_i * L`` (``|c_i - p_i L| < 1``). In the global order
    ``L`` is the global sequence: ``sum(sizes)`` (every dataset once), or ``num_samples * W``,
    and ``len(self)`` is torch's share of it (``L // W`` with ``drop_last``, else
    ``ceil(L / W)``); a rank's own counts are close to ``p_i len(self)`` but not exact. In the
    per-rank order ``L = len(self)`` on every rank: as in kempnerforge, the sum over datasets of
    one rank's share (``size // W`` with ``drop_last``, ``ceil(size / W)`` without), or
    ``num_samples``.

    **Passes.** Each dataset is read pass after pass, each pass a fresh uniform permutation of
    it, so an undersampled dataset never repeats in the epoch and an oversampled one repeats
    only in its next pass. In the global order a pass is the whole dataset in the global
    sequence, its occurrences in time order (each rank reads the positions its turns meet).
    In the per-rank order a pass is dealt to the ranks like ``DistributedSampler`` and each rank
    reads its share in order.

    **Interleave.** ``interleave="uniform"`` (the default): the order of dataset choices is a
    uniformly random sequence with exactly those counts; with ``shuffle=False`` the datasets
    follow each other in order (kempnerforge's unshuffled order). ``interleave="balanced"``
    (global order only): Megatron's kind of blend, deterministic, in which every prefix of the
    epoch holds each dataset within one sample of its share (Megatron's greedy can miss by
    more; this one cannot). Its dataset pattern is the same every epoch (only the passes are
    reshuffled). It is computed sequentially, position after position, on every rank (about
    35 ns a global position, so an epoch of 1e9 takes about 35 s; figures in
    ``docs/performance.md``): for mixtures that must be even at every step, not as the
    default. A state records the sequence's counts at the last leaf boundary the saving rank
    had reached, so a load resumes after replaying at most a leaf of it (``2**16``
    positions, or ``16 * datasets`` rounded up to a power of two when more); a
    :meth:`set_skip` without a state, or a state without them, replays the phase up to the
    position.

    **Schedules.** :meth:`update_weights` and :meth:`set_schedule` change the weights from the
    next iteration on; a schedule changes them at exact positions inside every epoch (global
    positions in the global order, this rank's in the per-rank one). Datasets' streams continue
    across phase boundaries, so nothing in a pass is lost or repeated. A change that takes
    effect mid-epoch (after :meth:`set_skip` or :meth:`load_state_dict` of a state of this
    world size) keeps what was already yielded and applies from the resume position (global
    order: from the first global position no rank has consumed, the same on every rank); after
    an elastic load (another world size) it applies from the next epoch.

    Args:
        cumulative_sizes: ``[0, len(ds0), len(ds0) + len(ds1), ...]`` (a list or 1-D integer
            numpy array, non-decreasing, starting at 0).
        weights: one non-negative weight per dataset, not all zero (normalised internally). A
            dataset with weight 0 is never drawn; an empty dataset must have weight 0.
        num_replicas: number of ranks ``W >= 1``; ``None`` asks ``dist_info``.
        rank: this rank, in ``[0, W)``; ``None`` asks ``dist_info``.
        shuffle: shuffle passes and interleave (seeded by ``seed`` and the epoch).
        seed: non-negative integer below ``2**64``, the same on all ranks.
        drop_last: cut the global sequence (global order) or each pass (per-rank order) to a
            multiple of ``W`` instead of padding. In the per-rank order a dataset smaller than
            ``W`` gives a rank nothing per pass with ``drop_last=True``: it must have weight 0
            then.
        temperature: weight temperature, a finite number ``> 0``.
        num_samples: positions per rank and epoch, instead of the default (in the global
            order the global sequence is then ``num_samples * W`` long, so it depends on
            ``W``: keep the default for the same sequence on every world size).
        dist_info: where ``num_replicas``/``rank`` come from when ``None`` (see
            :class:`~croupier.DistributedSampler`).
        order: ``"global"`` or ``"per_rank"`` (see above).
        interleave: ``"uniform"`` or ``"balanced"`` (see above; ``"balanced"`` needs
            ``order="global"``).

    Checkpointing: :meth:`state_dict` holds the configuration (dataset sizes as a count, a
    total and a digest), the epoch, the position, the schedule in force (weights and
    temperature included) and the phases of the current epoch; :meth:`load_state_dict`
    restores all of it and continues with exactly the next index, in milliseconds at any
    position (with ``interleave="balanced"``, the state's ``balanced`` counts save the replay
    of the sequence up to the position: see above). kempnerforge's
    ``{"epoch", "seed", "num_replicas", "rank"}`` loads too, as the start of its epoch.

    With torch installed it is an instance of ``torch.utils.data.DistributedSampler`` (whose
    constructor it never runs), so frameworks that test for one do not shard it a second time;
    like torch's, it has ``num_samples`` (positions per rank and epoch) and ``total_size``
    (``num_samples * num_replicas``).
    """

    _config_names = (
        "cumulative_sizes",
        "num_replicas",
        "rank",
        "shuffle",
        "seed",
        "drop_last",
        "num_samples",
        "total_size",
        "order",
        "interleave",
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
        order: str = "global",
        interleave: str = "uniform",
    ) -> None:
        order, interleave = _checked_order(order, interleave)
        sizes = _sizes(cumulative_sizes)
        weights_t = _weights(weights, len(sizes))
        temperature_f = _temperature(temperature)
        shuffle = check_bool("shuffle", shuffle)
        drop_last = check_bool("drop_last", drop_last)
        seed = check_int("seed", seed, 0, U64_MAX)
        length = None if num_samples is None else check_int("num_samples", num_samples, 0, MAX_LEN)
        num_replicas, rank = resolve_ranks(num_replicas, rank, dist_info)  # the last check
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.seed = seed
        self.order = order
        self.interleave = interleave
        self._sizes = sizes
        self._fixed_length = length
        self._shape = self._epoch_shape()
        self.cumulative_sizes = tuple(np.cumsum([0, *sizes], dtype=object).tolist())
        # What the schedule's starts count: this rank's positions (per-rank) or the epoch's
        # global positions (global).
        self._positions = self._positions_of(num_replicas)
        length = self._epoch_length(num_replicas)
        self.num_samples = length
        self.total_size = length * num_replicas
        digest = hashlib.sha256(np.asarray(sizes, dtype="<u8").tobytes()).hexdigest()[:16]
        self._sizes_config = {
            "datasets": len(sizes),
            "total_size": sum(sizes),
            "sizes_digest": digest,
        }
        self._mixtures: dict[tuple[_Phase, ...], _core.Mixture] = {}
        self._schedule: tuple[_Entry, ...] = ((0, weights_t, temperature_f),)
        # The schedule as it was set and the epoch length it counted then: a schedule moved to
        # another number of ranks is moved from this, so moving back restores its starts.
        self._schedule_set: tuple[tuple[_Entry, ...], int] = (self._schedule, self._positions)
        # What this sampler was constructed with, recorded in its states: a state loaded into
        # a sampler constructed otherwise warns (its schedule is the one kept).
        self._constructed: tuple[tuple[float, ...], float] = (weights_t, temperature_f)
        # Changes wait for the next iteration; the phases of the epoch being iterated.
        self._pending = False
        # The start (a loaded position, or an iterator from it not yet started) at which the
        # next iteration continues an iteration checkpointed while it was running: it keeps
        # that iteration's phases, and a pending schedule waits for the iteration after it.
        self._continuing: object | None = None
        self._phases = self._fresh(self._schedule)
        self._active: _core.Mixture | None = self._mixture(self._phases, num_replicas, rank)
        # After an elastic resume: the phases of the epoch in the world it started in (its
        # rest keeps them), and that world's mixture, built on demand.
        self._origin_phases: tuple[_Phase, ...] | None = None
        self._origin_mix: tuple[tuple[int, tuple[_Phase, ...]], _core.Mixture] | None = None
        # The balanced sequence's leaf boundaries the last loaded state recorded, by phase:
        # every core mixture with that phase starts from them (a resume replays a leaf).
        self._balanced_seeds: _Seeds = {}
        super().__init__(num_replicas, rank, length)

    # -- schedule ------------------------------------------------------------------------------

    def _mixture(
        self, phases: tuple[_Phase, ...], num_replicas: int | None = None, rank: int | None = None
    ) -> _core.Mixture:
        mix = self._mixtures.get(phases)
        if mix is None:
            w = self.num_replicas if num_replicas is None else num_replicas
            r = self.rank if rank is None else rank
            mix = self._core_mixture(w, r, self._positions, phases)
            if len(self._mixtures) > 8:
                self._mixtures.clear()
            self._mixtures[phases] = mix
        return mix

    def _core_mixture(
        self,
        num_replicas: int,
        rank: int,
        length: int,
        phases: tuple[_Phase, ...],
        seeds: _Seeds | None = None,
    ) -> _core.Mixture:
        """The core mixture of these datasets for ``rank`` of ``num_replicas`` over
        ``phases``, an epoch of ``length`` positions (of the rank, or global: see
        :meth:`_positions_of`); every core mixture is built here, starting each balanced phase
        from the boundaries ``seeds`` holds for it (default: those the last loaded state
        recorded)."""
        mix = _core.Mixture(
            self._sizes,
            [(s, n, list(ws), t) for s, n, ws, t in phases],
            num_replicas=num_replicas,
            rank=rank,
            drop_last=self.drop_last,
            shuffle=self.shuffle,
            seed=self.seed,
            length=length,
            order=CORE_ORDERS[self.order],
            interleave=self.interleave,
            permute_samples=True,
        )
        if seeds is None:
            seeds = self.__dict__.get("_balanced_seeds") or {}
        for i, phase in enumerate(phases):
            # A phase ends at the next one's start, or after its nominal length.
            cut = phases[i + 1][0] - phase[0] if i + 1 < len(phases) else phase[1]
            for position, counts in seeds.get(phase, ()):
                if position <= min(cut, phase[1]):
                    mix.seed_balanced(i, position, counts)
        return mix

    def _positions_of(self, num_replicas: int) -> int:
        """The positions of an epoch on ``num_replicas`` ranks that phases and schedules
        count: in the global order the global sequence's (``sum(sizes)``, or ``num_samples``
        per rank), in the per-rank order each rank's (one pass of every dataset's share, or
        ``num_samples``)."""
        return int(self._shape.positions(num_replicas))

    def _schedule_position(self, at: int) -> int:
        """The schedule's position where every rank resumes at rank position ``at``: ``at``
        itself in the per-rank order; ``at * num_replicas`` in the global one, the first global
        position no rank has consumed (each consumed ``at``)."""
        return int(self._shape.schedule_position(at, self.num_replicas))

    def _fresh(self, schedule: tuple[_Entry, ...]) -> tuple[_Phase, ...]:
        """The phases of an epoch that starts under ``schedule``."""
        ends = [s for s, _, _ in schedule[1:]] + [self._positions]
        return tuple((s, end - s, w, t) for (s, w, t), end in zip(schedule, ends, strict=True))

    def _spliced(self, at: int) -> tuple[_Phase, ...]:
        """The current epoch's phases before rank position ``at``, then the pending schedule
        from there (see :meth:`_schedule_position`)."""
        at = self._schedule_position(at)
        if at == 0:
            return self._fresh(self._schedule)
        kept = tuple(p for p in self._phases if p[0] < at)
        entries = self._schedule
        current = max(i for i, e in enumerate(entries) if e[0] <= at)
        new = [(at, entries[current][1], entries[current][2])] + [e for e in entries if e[0] > at]
        ends = [s for s, _, _ in new[1:]] + [self._positions]
        return kept + tuple((s, end - s, w, t) for (s, w, t), end in zip(new, ends, strict=True))

    def _phases_for(self, start: int) -> tuple[_Phase, ...]:
        """The phases the next iteration, starting at ``start``, uses."""
        if start == 0:
            return self._fresh(self._schedule)
        if self._pending and start < self.num_samples:
            return self._spliced(start)
        return self._phases

    def _checked_schedule(self, entries: object) -> tuple[_Entry, ...]:
        schedule = self._parsed_schedule(entries, self._positions)
        self._mixture(self._fresh(schedule))  # the core's checks (datasets a rank cannot draw)
        return schedule

    def _parsed_schedule(self, entries: object, length: int) -> tuple[_Entry, ...]:
        """``entries`` checked as a schedule for an epoch of ``length`` positions (without the
        core's checks, which need this sampler's length)."""
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
            limit = max(length - 1, 0)
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
        return tuple(out)

    def set_schedule(self, schedule: Sequence[Sequence[Any]]) -> None:
        """Sets the weights by position: ``[(start, weights), (start, weights, temperature),
        ...]``, the first phase starting at 0, starts increasing and below the epoch's length
        in the positions it counts (the global sequence's in the global order, ``len(self)``
        in the per-rank order).

        Phase ``k`` runs from its start to the next one's (or the end of the epoch) and holds
        each dataset in exact counts for its length (largest remainder), interleaved as the
        sampler's ``interleave`` says; each dataset's stream runs on across phases, so no
        sample of a pass is lost or repeated at a boundary. Positions count the epoch's global
        sequence in the global order (all ranks together: every rank changes weights at the
        same global position) and this rank's indices in the per-rank order; the schedule applies
        to every epoch from the next iteration on. If that iteration resumes mid-epoch (after
        :meth:`set_skip` or :meth:`load_state_dict`), the positions before the resume keep the
        phases they were yielded with, and the schedule applies from the resume position on
        (the phase in force there starts at it; in the global order at the resume position
        times ``num_replicas``, the first global position no rank has consumed). An iteration
        already running keeps its phases to its end; a checkpoint taken meanwhile
        (:meth:`state_dict`, pickling) records both, so a resume from it continues that
        iteration unchanged and the next iteration (the next epoch) uses the new schedule,
        exactly as the uninterrupted run does.

        Starts are positions, so they depend on the epoch length. In the global order with
        the default length (``sum(sizes)``) they never move. Otherwise, when the length
        follows ``num_replicas`` (the per-rank order's default, or the global order with
        ``num_samples``: ``num_samples * W`` positions), a state loaded on another number of
        ranks (at an epoch boundary) moves every start in proportion to the length the schedule
        was set for: ``start * new_len // set_len`` (rounded down; a phase left empty by the
        rounding is dropped), so a state moved to other ranks and back has the starts that were
        set (the state records the schedule as set, ``schedule_set`` and
        ``schedule_set_length``). In the per-rank
        order with ``num_samples`` the length, and so every start, stays as it is.

        Refused input (``TypeError``/``ValueError`` naming the entry) leaves the schedule in
        force unchanged. The schedule is part of :meth:`state_dict`.
        """
        self._set_schedule(self._checked_schedule(schedule))

    def _set_schedule(self, schedule: tuple[_Entry, ...]) -> None:
        self._schedule = schedule
        self._schedule_set = (schedule, self._positions)
        self._pending = True
        if self._elastic is not None:
            # During an elastic rest this world has iterated nothing: its phases in force
            # are the schedule's fresh ones, whatever the schedule is when the rest ends (a
            # state saved in the rest records the schedule, and loads to the same).
            self._phases = self._fresh(schedule)
        # A change made after a load (before iterating) applies from the resume position.
        self._continuing = None

    def update_weights(
        self, weights: Sequence[float] | npt.NDArray[Any], temperature: float = 1.0
    ) -> None:
        """Replaces the weights (and temperature) from the next iteration on, as kempnerforge's
        ``update_weights`` does: the same as ``set_schedule([(0, weights, temperature)])``,
        including its mid-epoch rule. Bad weights raise ``ValueError``/``TypeError`` naming
        ``weights`` or ``temperature`` and leave the previous weights in force
        (:class:`croupier.compat.kempnerforge.MixtureSampler` raises them with kempnerforge's
        exception types too)."""
        entry = (0, _weights(weights, len(self._sizes)), _temperature(temperature))
        self._set_schedule(self._checked_schedule([entry]))

    @property
    def schedule(self) -> list[tuple[int, list[float], float]]:
        """The schedule the next fresh epoch uses: ``[(start, weights, temperature), ...]``."""
        return [(s, list(w), t) for s, w, t in self._schedule]

    def counts(self, phase: int = 0) -> list[int]:
        """How many indices of each dataset phase ``phase`` of the schedule holds over its
        full length: in the global sequence (global order) or on every rank (per-rank order).
        For the single phase of plain weights: the epoch's exact per-dataset counts."""
        phases = self._fresh(self._schedule)
        phase = check_int("phase", phase, 0, len(phases) - 1)
        return list(self._mixture(phases).phase_counts(phase))

    # -- iteration -----------------------------------------------------------------------------

    def _continues(self) -> bool:
        """Whether the next iteration continues an iteration checkpointed while it was
        running (see ``_continuing``)."""
        token = self._start_token()
        return token is not None and token is self._continuing

    def _running(self) -> bool:
        """Whether a checkpoint now is taken inside a running iteration (one that has
        started handing out indices, or the continuation of one)."""
        return self._iteration_running() or self._continues()

    def _activate(self, start: int, continuing: bool = False) -> None:
        if self.elastic_rest(self.epoch) is not None:
            # An elastic rest reads the first world's mixture under the phases it was
            # iterated with; this world's phases, and a change pending, wait for its next
            # epoch (this world's mixture may not even exist: see load_state_dict).
            self._active = None
            return
        # A checkpointed iteration goes on under its phases (the schedule still waits).
        phases = self._phases if continuing else self._phases_for(start)
        active = self._drawable(phases)
        if not continuing and (start == 0 or (self._pending and start < self.num_samples)):
            self._pending = False
        if phases != self._phases:
            self._phases = phases
            self._cache = None
        self._active = active

    def _drawable(self, phases: tuple[_Phase, ...]) -> _core.Mixture:
        """The mixture of ``phases`` on this sampler's ranks, or a ``ValueError`` saying why
        this world cannot draw it (a schedule loaded from another world size)."""
        try:
            return self._mixture(phases)
        except ValueError as e:
            raise ValueError(
                f"the schedule in force cannot be drawn with num_replicas={self.num_replicas}: "
                f"{e}; call set_schedule() or update_weights() with weights this world can draw"
            ) from None

    def _current(self) -> _core.Mixture:
        """The mixture of the current epoch's phases (built when first needed)."""
        if self._active is None:
            self._active = self._drawable(self._phases)
        return self._active

    def _before_iteration(self, epoch: int, start: int, token: object | None) -> None:
        # An iterator that hands out nothing keeps its start's token (DataLoader calls iter()
        # twice): the next one from it still continues the checkpointed iteration.
        continuing = token is not None and token is self._continuing
        self._activate(start, continuing)
        if not continuing:
            self._continuing = None

    def _preview(self, epoch: int, start: int) -> npt.NDArray[Any] | None:
        # indices() before an iteration that changes the phases: the new phases' indices.
        phases = self._phases if self._continues() else self._phases_for(start)
        if phases == self._phases or self.elastic_rest(epoch) is not None:
            return None
        arr = self._mixture(phases).indices(epoch, start, None)
        arr.flags.writeable = False
        return arr

    def _config(self) -> dict[str, Any]:
        config = {
            **self._sizes_config,
            "shuffle": self.shuffle,
            "drop_last": self.drop_last,
            "seed": self.seed,
            "order": self.order,
            "interleave": self.interleave,
        }
        # The default length follows num_replicas in the per-rank order (a resume on another
        # world size is allowed at epoch boundaries); a fixed one must match.
        if self._fixed_length is None:
            return {**config, "length": _DEFAULT_LENGTH[self.order]}
        return {**config, "length": "num_samples", "num_samples": self._fixed_length}

    def _epoch_length(self, num_replicas: int) -> int:
        return int(self._shape.rank_length(num_replicas))

    def _compute(self, epoch: int, start: int, stop: int | None) -> npt.NDArray[Any]:
        arr = self._current().indices(epoch, start, stop)
        arr.flags.writeable = False
        return arr

    def _first_stop(self, start: int) -> int:
        return int(self._current().first_stop(start))

    def _window(self) -> int | None:
        # The global order reads any range by random access: stream it in windows instead
        # of holding the whole share (the per-rank order computes it whole).
        window: int | None = self._shape.window
        return window

    # Elastic resume: the epoch's global order is position t of every old rank's sequence,
    # rank after rank, then position t + 1 (what W ranks consumed, p each, is its first p W
    # positions); the rest is dealt to this world's ranks with torch's arithmetic, each old
    # rank's sequence read from the core under the phases the epoch was iterated with.
    _elastic_supported = True

    def _global_end(self, origin: int) -> int:
        return int(self._shape.global_end(origin))

    def _elastic_length(self, origin: int, offset: int, num_replicas: int) -> int:
        rest = self._global_end(origin) - offset
        return int(_core.layout(rest, num_replicas, self.drop_last)[0]) if rest else 0

    def _origin_mixture(self, origin: int) -> _core.Mixture:
        phases = self._origin_phases
        if phases is None:  # an elastic state always brings its phases
            raise RuntimeError("an elastic resume without its phases")
        key = (origin, phases)
        if self._origin_mix is None or self._origin_mix[0] != key:
            mix = self._core_mixture(origin, 0, self._positions_of(origin), phases)
            self._origin_mix = (key, mix)
        return self._origin_mix[1]

    def _compute_elastic(
        self, origin: int, offset: int, epoch: int, start: int, stop: int | None
    ) -> npt.NDArray[Any]:
        arr = self._origin_mixture(origin).elastic_indices(
            epoch,
            start,
            stop,
            offset=offset,
            num_replicas=self.num_replicas,
            rank=self.rank,
            drop_last=self.drop_last,
        )
        arr.flags.writeable = False
        return arr

    def _elastic_first_stop(self, start: int, length: int) -> int:
        # A few positions read a few old ranks' sequences there: the first index comes
        # before the rest is computed.
        return min(start + _core.MIX_FIRST_STOP, length)

    # -- checkpoints -----------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The checkpoint state: the base keys (configuration, ``num_replicas``, ``rank``,
        ``epoch``, ``position``), plus ``schedule`` (the schedule for fresh epochs, as
        ``[[start, weights, temperature], ...]``), ``schedule_pending`` (whether it still waits
        for the next iteration), ``schedule_deferred`` (whether it waits for the iteration
        after the one being resumed: it was set while that iteration ran, which keeps its
        phases), ``phases`` (the current epoch's phases, ``[[start, nominal_length,
        weights, temperature], ...]``) and ``constructed_with`` (the ``[weights,
        temperature]`` this sampler was constructed with), and with ``interleave="balanced"``
        ``balanced``: ``[[phase, position, counts], ...]``, the balanced sequence's counts per
        dataset at the last leaf boundary this sampler had reached (or was loaded with) in each
        phase at or below the first global position no rank has consumed (absent when there is
        none), from which a load continues the sequence. JSON-serialisable; its size grows
        with the number of datasets and phases only."""
        return super().state_dict()

    def _state_at(self, epoch: int, position: int) -> dict[str, Any]:
        state = super()._state_at(epoch, position)
        state["schedule"] = [[s, list(w), t] for s, w, t in self._schedule]
        as_set, set_len = self._set_of_schedule()
        state["schedule_set"] = [[s, list(w), t] for s, w, t in as_set]
        state["schedule_set_length"] = set_len
        constructed = self.__dict__.get("_constructed")  # (absent from older pickles)
        if constructed is not None:
            state["constructed_with"] = [list(constructed[0]), constructed[1]]
        state["schedule_pending"] = self._pending
        state["schedule_deferred"] = self._pending and self._running()
        # During an elastic rest, the phases of the epoch as its first world iterated it.
        phases = self._origin_phases if "elastic" in state else self._phases
        assert phases is not None
        state["phases"] = [[s, n, list(w), t] for s, n, w, t in phases]
        balanced = self._balanced_boundaries(epoch, position)
        if balanced:
            state["balanced"] = balanced
        return state

    def __getstate__(self) -> dict[str, Any]:
        # Pickling is a checkpoint (the base freezes a running iterator into a loaded start):
        # a copy taken while an iteration runs continues it, as a state_dict() does.
        state = super().__getstate__()
        running = self._pending and self._running()
        state["_continuing"] = self._token_in(state) if running else None
        # The core mixtures are rebuilt on unpickling (they pickle as their arguments), from
        # the balanced sequence's boundaries a state of this instant would record.
        if self.interleave == "balanced":
            epoch, at = self._now
            el = self._elastic_of(epoch)
            phases = self._phases if el is None else self._origin_phases
            seeds: _Seeds = {}
            for i, position, counts in self._balanced_boundaries(epoch, self._consumed(at)):
                assert phases is not None
                seeds.setdefault(phases[i], []).append((position, counts))
            state.update(_balanced_seeds=seeds, _mixtures={}, _active=None, _origin_mix=None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        if "_shape" not in self.__dict__:
            # Pickled by a croupier whose Python computed the positions: the core's object
            # made from the configuration the pickle carries.
            self._shape = self._epoch_shape()

    def _set_of_schedule(self) -> tuple[tuple[_Entry, ...], int]:
        """The schedule as set and the epoch length it counted (a sampler pickled before this
        was recorded: the schedule in force, on this length)."""
        return self.__dict__.get("_schedule_set") or (self._schedule, self._positions)

    def _epoch_shape(self) -> _core.MixtureShape:
        """The order's arithmetic of positions (the core's), for these datasets, length,
        order and ``drop_last``."""
        return _core.MixtureShape(
            list(self._sizes),
            num_samples=self._fixed_length,
            order=CORE_ORDERS[self.order],
            drop_last=self.drop_last,
        )

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restores a :meth:`state_dict`, schedule and phases included, so the next iteration
        continues with exactly the next index. Refuses (``ValueError``, naming each
        difference) a state of other dataset sizes, seed, shuffle, drop_last or
        ``num_samples``; loads a kempnerforge state as the start of its epoch, keeping the
        weights in force. Nothing changes if the state is refused. A state saved by a sampler
        constructed with other weights (or temperature) loads with its own schedule, which
        the resumed run needs to continue exactly, and warns (``UserWarning``) naming both
        and the ``update_weights`` call that trains with this sampler's weights from there.

        A state saved with another ``num_replicas`` loads at an epoch boundary (position 0,
        or the end of the epoch) and, mid-epoch, resumes elastically: the rest of the epoch
        (the old ranks' sequences from what they consumed, under the phases the epoch was
        iterated with) is dealt to this sampler's ranks, so every dataset's count and pass for
        the epoch are those of the uninterrupted run; until the next epoch ``len(self)`` is
        the loaded position plus this rank's share of the rest, positions counting on from
        the loaded one (``num_samples`` stays the configured epoch length). In
        the global order the rest is the same global sequence from the consumed position;
        in the per-rank order it is the old ranks' own sequences. When the epoch length follows
        ``num_replicas`` (the per-rank order's default, or ``num_samples`` in the global order)
        the schedule's starts move in proportion to the length for the epochs after (see
        :meth:`set_schedule`); the global order's default length never moves them. A schedule
        change pending at an elastic load (:meth:`update_weights` after it) applies from the
        next epoch: the rest keeps the phases the epoch was iterated with. The rest
        needs only the first world's phases, so it loads even when this world cannot draw the
        state's schedule (it weights a dataset with fewer samples than ``num_replicas`` and
        ``drop_last=True``); the next epoch then raises ``ValueError`` naming the schedule,
        changing nothing, until :meth:`set_schedule` or :meth:`update_weights` gives weights
        this world can draw."""
        super().load_state_dict(state)  # the base's path, with the hooks below

    def _prepare_load(self, native: Mapping[str, Any], loaded: Loaded) -> Callable[[], None]:
        """Checks the schedule and phases of a state (a foreign state keeps this sampler's)
        and returns what applies them once the base has positioned the sampler."""
        origin_phases = None
        origin_mix = None
        other_construction = None
        schedule_set = self._set_of_schedule()
        saved_phases: tuple[_Phase, ...] | None = None
        if loaded.foreign is None:
            schedule, pending, deferred, phases, schedule_set = self._checked_extras(native, loaded)
            saved_phases = phases
            other_construction = self._other_construction(native)
            if loaded.elastic is not None:
                # The rest of the epoch keeps the phases it was iterated with (in its first
                # world); this world's own phases start with the next epoch.
                origin_phases, phases = phases, self._fresh(schedule)
                origin_mix = self._origin_mixture_check(origin_phases, loaded.elastic)
        else:
            schedule, pending, deferred, phases = (
                self._schedule, self._pending, False, self._phases
            )  # fmt: skip
        if loaded.position == 0 and not deferred and native["num_replicas"] != self.num_replicas:
            # The start of the epoch on another world: its phases are this world's fresh ones.
            # (On the same world the state's phases stay as saved, so a state loaded and saved
            # again is the same; an iteration from 0 starts the schedule's fresh phases anyway.)
            phases = self._fresh(schedule)
        # The rest of an elastic epoch needs only the first world's phases: a schedule this
        # world cannot draw (a dataset with fewer samples than num_replicas, drop_last) is
        # refused when an epoch of this world starts, not here.
        active = None if origin_phases is not None else self._mixture(phases)
        # The balanced sequence's boundaries the state recorded, checked against the mixture
        # that reads the state's phases; they apply when this world reads those phases from
        # the state's position (not at the start of an epoch on another world).
        reader = origin_mix if origin_phases is not None else active
        if phases != saved_phases and origin_phases is None:
            reader = None
        entries = self._checked_balanced(native, saved_phases, reader)
        seeds: _Seeds = {}
        if reader is not None and saved_phases is not None:
            for i, position, counts in entries:
                seeds.setdefault(saved_phases[i], []).append((position, counts))
        # The mixtures start from the state's boundaries, and from nothing a former load
        # brought (seeded counts stay in a mixture, and only a state's own are the sequence's):
        # built afresh whenever either has any.
        fresh = bool(seeds or self._balanced_seeds)
        if fresh and origin_phases is not None and loaded.elastic is not None:
            origin_mix = self._origin_mixture_check(origin_phases, loaded.elastic, seeds)
        elif fresh:
            active = self._core_mixture(
                self.num_replicas, self.rank, self._positions, phases, seeds
            )

        def commit() -> None:
            if fresh:
                self._balanced_seeds = seeds
                self._mixtures = {} if active is None else {phases: active}
                self._origin_mix = None
            if origin_mix is not None and origin_phases is not None and loaded.elastic:
                self._origin_mix = ((loaded.elastic.origin, origin_phases), origin_mix)
            self._origin_phases = origin_phases
            self._schedule, self._pending = schedule, pending
            self._schedule_set = schedule_set
            self._phases = phases
            self._active = active
            self._cache = None
            self._continuing = self._start_token() if deferred else None
            if other_construction is not None:
                warn_at_caller(other_construction)

        return commit

    def _other_construction(self, native: Mapping[str, Any]) -> str | None:
        """The warning for a state saved by a sampler constructed with other weights or
        temperature than this one (``None`` when they agree, or the state does not say)."""
        raw = native.get("constructed_with")
        if raw is None:
            return None  # saved before states recorded it
        if not isinstance(raw, Sequence) or isinstance(raw, (str, bytes)) or len(raw) != 2:
            raise StateError("state['constructed_with'] must be [weights, temperature]")
        try:
            theirs = (
                _weights(raw[0], len(self._sizes), "state['constructed_with'] weights"),
                _temperature(raw[1]),
            )
        except (TypeError, ValueError) as e:
            raise StateError(f"state['constructed_with'] is not valid: {e}") from None
        mine = self.__dict__.get("_constructed")
        if mine is None or _same_mixture(theirs, mine):
            return None
        # A state whose schedule already is this sampler's construction (the saving run
        # moved to these weights with update_weights) resumes what was asked for.
        entries = native.get("schedule")
        if (
            isinstance(entries, Sequence)
            and len(entries) == 1
            and isinstance(entries[0], Sequence)
            and len(entries[0]) == 3
            and entries[0][0] == 0
        ):
            try:
                now = (_weights(entries[0][1], len(self._sizes)), _temperature(entries[0][2]))
            except (TypeError, ValueError):
                now = None  # (the schedule's own check names it)
            if now is not None and _same_mixture(now, mine):
                return None
        words = [
            f"weights {list(w)}" + ("" if t == 1.0 else f", temperature {t}")
            for w, t in (theirs, mine)
        ]
        return (
            f"{type(self).__name__}.load_state_dict: the state was saved by a sampler constructed "
            f"with {words[0]}, this one is constructed with {words[1]}. The state's schedule is "
            "kept, so the run continues exactly as it was saved; to train with this sampler's "
            f"weights from here, call update_weights({list(mine[0])}"
            + ("" if mine[1] == 1.0 else f", temperature={mine[1]}")
            + ") after loading"
        )

    def _origin_mixture_check(
        self, phases: tuple[_Phase, ...], el: Rest, seeds: _Seeds | None = None
    ) -> _core.Mixture:
        """The core mixture of the first world of an elastic rest ``el`` over ``phases`` (from
        ``seeds``, see :meth:`_core_mixture`), or a ``StateError`` with the core's reason for
        refusing them."""
        try:
            return self._core_mixture(el.origin, 0, self._positions_of(el.origin), phases, seeds)
        except ValueError as e:
            raise StateError(f"state['phases'] is not a valid schedule: {e}") from None

    def _balanced_boundaries(self, epoch: int, position: int) -> list[list[Any]]:
        """The balanced interleave's leaf boundaries a state at ``position`` of ``epoch``
        records (see :meth:`_checked_balanced`): the last one per phase that the mixture
        iterating the state's phases has found (or was loaded with) at or below the first
        global position no rank has consumed. Replays nothing and waits for no replay, so a
        state is taken at once at any instant; empty when there is none."""
        if self.interleave != "balanced":
            return []
        el = self._elastic_of(epoch)
        if el is None:
            mix = self._active or self._mixtures.get(self._phases)
            consumed = self._schedule_position(position)
        else:
            key = (el.origin, self._origin_phases)
            mix = self._origin_mix[1] if self._origin_mix and self._origin_mix[0] == key else None
            consumed = el.offset + (position - el.resumed_at) * self.num_replicas
        if mix is not None:
            return [[p, q, counts] for p, q, counts in mix.balanced_boundaries(consumed)]
        # No mixture built yet (a pickled copy, before it iterates): those it was loaded with.
        phases = (self._phases if el is None else self._origin_phases) or ()
        out: list[list[Any]] = []
        for i, phase in enumerate(phases):
            end = phases[i + 1][0] if i + 1 < len(phases) else phase[0] + phase[1]
            reach = min(consumed, end, phase[0] + phase[1]) - phase[0]
            known = [b for b in self._balanced_seeds.get(phase, ()) if 0 < b[0] <= reach]
            if known:
                position, counts = max(known)
                out.append([i, position, list(counts)])
        return out

    def _checked_balanced(
        self,
        native: Mapping[str, Any],
        phases: tuple[_Phase, ...] | None,
        mix: _core.Mixture | None,
    ) -> list[tuple[int, int, list[int]]]:
        """``state['balanced']`` checked: ``[[phase, position, counts], ...]``, the counts of
        the balanced sequence at leaf boundaries of the state's ``phases``, which the load
        records so that the resume replays at most a leaf of the sequence rather than the
        whole phase up to its position. Its shape is always checked; its counts against
        ``mix`` (the mixture that reads the state's phases), unless ``None`` (a state whose
        phases this world does not read from its position). Absent: nothing, and the resume
        replays."""
        raw = native.get("balanced")
        if raw is None:
            return []
        if not isinstance(raw, Sequence) or isinstance(raw, (str, bytes)):
            raise StateError(
                "state['balanced'] must be a list of [phase, position, counts], "
                f"got {type(raw).__name__}"
            )
        seeds = []
        for k, entry in enumerate(raw):
            name = f"state['balanced'][{k}]"
            if (
                not isinstance(entry, Sequence)
                or isinstance(entry, (str, bytes))
                or len(entry) != 3
            ):
                raise StateError(f"{name} must be [phase, position, counts]")
            last = len(phases) - 1 if phases else 0
            phase = check_int(f"{name}[0]", entry[0], 0, last)
            position = check_int(f"{name}[1]", entry[1], 0, MAX_LEN)
            counts = entry[2]
            if not isinstance(counts, Sequence) or isinstance(counts, (str, bytes)):
                raise StateError(f"{name}[2] must be a list of counts per dataset")
            counts = [check_int(f"{name}[2]", c, 0, MAX_LEN) for c in counts]
            if mix is not None:
                try:
                    mix.seed_balanced(phase, position, counts, check_only=True)
                except ValueError as e:
                    raise StateError(
                        f"{name} is not a boundary of the balanced sequence: {e}"
                    ) from None
            seeds.append((phase, position, counts))
        return seeds

    def _check_config(self, state: Mapping[str, Any]) -> None:
        """Refuses a state of this sampler's own shape whose configuration differs, naming
        every difference in words the base's check does not have: ``num_samples`` (a fixed
        length against the default one). Another ``num_replicas`` is no difference: at an
        epoch boundary the state starts or ends its epoch, mid-epoch it resumes elastically."""
        config = self._state_config()
        probe = dict(state)
        extra: list[str] = []
        mode = state.get("length")
        theirs_default = mode in _DEFAULT_LENGTH.values()
        if mode != config["length"] and (
            theirs_default or (mode == "num_samples" and "num_samples" in state)
        ):
            if theirs_default != (self._fixed_length is None):
                theirs = state["num_samples"] if mode == "num_samples" else None
                extra.append(
                    f"num_samples: state has {_length_words(theirs, self.order)}, this "
                    f"sampler has {_length_words(self._fixed_length, self.order)}"
                )
            # Each order names its default length: the order's difference says it.
            probe.pop("num_samples", None)
            probe.update({k: config[k] for k in ("length", "num_samples") if k in config})
        differ: tuple[str, ...] = ()
        try:
            check_state(probe, ints=(), config=config)
        except StateError as e:
            if not e.differences:
                return  # missing keys: the base's check says so
            differ = e.differences
        except TypeError:
            return  # the base's check says so
        # A state of the other order says how to resume it.
        fix = resume_hint(state.get("order"))
        if fix is not None and state.get("order") != self.order:
            differ = tuple(f"{d} ({fix})" if d.startswith("order:") else d for d in differ)
        if differ or extra:
            raise different([*differ, *extra])

    def _as_native(self, state: object) -> tuple[Mapping[str, Any], StateFormat | None]:
        # A state saved before the mixture had orders (0.1, earlier 0.2.0 builds) has none: the
        # per-rank order with the uniform interleave, the only ones there were.
        native, fmt = super()._as_native(state)
        if fmt is None and "order" not in native:
            native = {**native, "order": "per_rank", "interleave": "uniform"}
        return native, fmt

    def _checked_extras(
        self, state: Mapping[str, Any], loaded: Loaded
    ) -> tuple[tuple[_Entry, ...], bool, bool, tuple[_Phase, ...], tuple[tuple[_Entry, ...], int]]:
        for key in ("schedule", "schedule_pending", "phases"):
            if key not in state:
                raise StateError(
                    f"state is missing key {key!r}; is it a MixtureSampler state_dict()?"
                )
        saved_w = as_int("state['num_replicas']", state["num_replicas"])  # checked by the base
        length = self._positions
        saved_len = length if saved_w == self.num_replicas else self._positions_of(saved_w)
        # The phases are the epoch's in the world it started in: the state's own, or the
        # first world of an elastic rest (the base checked the entry).
        el = state.get("elastic")
        first_w = saved_w if el is None else as_int("origin", el["origin_num_replicas"])
        first_len = self._positions_of(first_w)
        elastic = loaded.elastic is not None
        schedule = self._parsed_schedule(state["schedule"], saved_len)
        as_set = self._schedule_set_in(state, schedule, saved_len)
        pending = check_bool("state['schedule_pending']", state["schedule_pending"])
        # Absent from states saved before it existed (they resumed the pending schedule).
        deferred = (
            check_bool("state['schedule_deferred']", state.get("schedule_deferred", False))
            and pending
        )
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
        if elastic:
            # An elastic rest: the phases stay those of the first world (checked there).
            _check_layout(phases, first_len, first_w)
            schedule = _rescaled(*as_set, length)
            return schedule, pending, deferred, tuple(phases), as_set
        if first_len != length:
            # Saved on another number of ranks at an epoch boundary: the phases are checked
            # against the length they were made for, then moved with the schedule.
            _check_layout(phases, first_len, first_w)
            schedule = _rescaled(*as_set, length)
            entries = tuple((s, w, t) for s, _, w, t in phases)
            phases = list(self._fresh(_rescaled(entries, first_len, length)))
        for what, checked in (("schedule", self._fresh(schedule)), ("phases", tuple(phases))):
            try:
                self._mixture(checked)
            except ValueError as e:
                raise StateError(
                    f"state[{what!r}] is not a valid schedule for this sampler: {e}"
                ) from None
        return schedule, pending, deferred, tuple(phases), as_set

    def _schedule_set_in(
        self, state: Mapping[str, Any], schedule: tuple[_Entry, ...], saved_len: int
    ) -> tuple[tuple[_Entry, ...], int]:
        """The schedule as set, and the length it counted, that ``state`` records (a state
        saved before they were recorded: its schedule, on the length it was saved with)."""
        if "schedule_set" not in state and "schedule_set_length" not in state:
            return schedule, saved_len
        for key in ("schedule_set", "schedule_set_length"):
            if key not in state:
                raise StateError(f"state has no {key!r} beside the other schedule_set key")
        set_len = check_int(
            "state['schedule_set_length']", state["schedule_set_length"], 0, MAX_LEN
        )
        return self._parsed_schedule(state["schedule_set"], set_len), set_len


def _same_mixture(a: tuple[tuple[float, ...], float], b: tuple[tuple[float, ...], float]) -> bool:
    """Whether two ``(weights, temperature)`` draw the same mixture: weights are relative
    (``[1, 1]`` is ``[0.5, 0.5]``)."""
    (wa, ta), (wb, tb) = a, b
    sa, sb = sum(wa), sum(wb)
    if ta != tb or len(wa) != len(wb) or not sa or not sb:
        return a == b
    return all(abs(x / sa - y / sb) <= 1e-12 for x, y in zip(wa, wb, strict=True))
