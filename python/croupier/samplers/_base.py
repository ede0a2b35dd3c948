"""The sampler base: everything a croupier sampler needs besides its indices.

A sampler on this base supplies its configuration and one function, "the items of epoch ``e``
from position ``p``" (computed by the Rust core, handed over as numpy arrays). The base owns the
rest, the same for every sampler:

- the epoch (``set_epoch``, the ``epoch`` property) and a pending start (``set_skip``, a loaded
  state), with torch's rule that iterating again without ``set_epoch`` repeats the epoch;
- the live position: how many items the latest iterator has handed out, exact at every instant
  (a signal handler or another thread may take a checkpoint between any two bytecodes);
- ``state_dict``/``load_state_dict`` framing (version, configuration check, position, epoch,
  world size), states of documented foreign shapes (:class:`StateFormat`), and pickling as a
  checkpoint (DataLoader workers, ``copy.copy``);
- elastic resume: a state saved mid-epoch on another number of ranks continues the epoch (the
  rest of its global order dealt to this world size), for the samplers that supply the hooks;
- read-only configuration: the attributes named in ``_config_names`` cannot be assigned after
  construction, so a checkpoint always describes what is iterated;
- a cache of the current epoch's remaining items, and ``__repr__``.

:class:`IndexSampler` yields ``int`` indices and adds :meth:`IndexSampler.indices`;
:class:`BatchSampler` yields ``list[int]`` batches and counts its position in batches.
"""

from __future__ import annotations

import itertools
import operator
import sys
import threading
import weakref
from collections.abc import Callable, Iterator, Mapping
from typing import Any, ClassVar, Generic, NamedTuple, Protocol, TypeVar

import numpy as np
import numpy.typing as npt

from croupier._frameworks import (
    ahead_of_training,
    check_not_batched_again,
    check_not_sharded_again,
    prefetching_loader,
)
from croupier._torch import Sampler
from croupier._validate import (
    MAX_LEN,
    ORDER_ALIASES,
    ORDERS,
    U64_MAX,
    check_int,
    warn_at_caller,
)
from croupier.samplers._state import STATE_VERSION, StateError, StateFormat, check_state, upgrade

__all__ = ["BatchSampler", "Batches", "IndexSampler", "Loaded", "StatefulSampler"]

T = TypeVar("T")
Seg = TypeVar("Seg", bound="_Segment")


class Rest(NamedTuple):
    """The rest of an epoch continued on this world size after an elastic resume: ``epoch``
    was first dealt over ``origin`` ranks, its global order's first ``offset`` positions are
    consumed, and the rest is dealt over this sampler's ranks, ``length`` items each. The
    rank's positions in the epoch count on from ``resumed_at`` (the position the loaded state
    recorded), so positions ``[resumed_at, resumed_at + length]`` and
    ``len = resumed_at + length``: a trainer that restored its own count of ``resumed_at``
    and stops at ``len`` trains exactly the rest."""

    epoch: int
    origin: int
    offset: int
    length: int
    resumed_at: int


#: An elastic rest, or ``None``.
_Elastic = Rest | None
# The first window of a streamed iteration is short, so its first item comes at once.
_FIRST_WINDOW = 1 << 10
# From this many items, the rest of an epoch is computed on a thread while its first pieces
# are handed out (see StatefulSampler._while_the_tail_computes).
_BACKGROUND_FROM = 1 << 20


class _Segment(Protocol):
    """Consecutive items of an epoch: a numpy array of indices, or :class:`Batches`."""

    def __len__(self) -> int: ...
    def __getitem__(self, key: slice, /) -> Any: ...
    def tolist(self) -> Any: ...


class Batches:
    """Consecutive batches of an epoch, held as two numpy arrays: batch ``i`` is
    ``flat[offsets[i]:offsets[i + 1]]``. Slicing gives views; no index is copied."""

    __slots__ = ("flat", "offsets")

    def __init__(self, flat: npt.NDArray[Any], offsets: npt.NDArray[Any]) -> None:
        self.flat = flat
        self.offsets = offsets

    def __len__(self) -> int:
        return max(len(self.offsets) - 1, 0)

    def __getitem__(self, key: slice, /) -> Batches:
        start, stop, step = key.indices(len(self))
        if step != 1:
            raise ValueError("Batches slices must be contiguous")
        return Batches(self.flat, self.offsets[start : max(stop, start) + 1])

    def tolist(self) -> list[list[int]]:
        """The batches as Python lists of ints."""
        if len(self) == 0:
            return []
        # One conversion of the values, then list slices (a numpy view a batch, as np.split
        # makes, costs more than the batch's ints).
        offsets = self.offsets.tolist()
        lo = offsets[0]
        values = self.flat[lo : offsets[-1]].tolist()
        return [values[a - lo : b - lo] for a, b in itertools.pairwise(offsets)]


class Loaded(NamedTuple):
    """Where a checked state puts a sampler (what :meth:`StatefulSampler._prepare_load` is
    given): the epoch, the position in it (in its elastic rest, if any), the elastic rest
    ``(epoch, origin world size, global offset, items per rank)``, and the foreign state
    format the state was converted from (``None``: the sampler's own shape)."""

    epoch: int
    position: int
    elastic: _Elastic
    foreign: StateFormat | None


class _Pending:
    """Where the next iteration starts: a loaded position (which belongs to its ``epoch``) or a
    ``set_skip`` (``epoch`` None: it waits for the next iteration, whatever its epoch)."""

    __slots__ = ("epoch", "position")

    def __init__(self, position: int, epoch: int | None) -> None:
        self.position = position
        self.epoch = epoch


class _Cursor:
    """Progress of one iteration: the items it has handed out.

    Items are turned into Python objects a chunk at a time. The position is derived from the
    chunk being handed out (its start plus how many items its list iterator has given), so
    iteration does no per-item bookkeeping. The chunk's start, size and iterator are replaced
    together in one attribute store, so the position read at any instant, from a signal
    handler or another thread, is exactly what was handed out.
    """

    __slots__ = ("_view", "loader", "origin", "started")

    def __init__(
        self, position: int, origin: object | None = None, loader: object | None = None
    ) -> None:
        self._view: tuple[int, int, Iterator[Any]] = (position, 0, iter(()))
        #: Whether the iteration has run (its first ``next``); until then its start stays
        #: pending for the next ``iter``.
        self.started = False
        #: The pending start this iteration took (see ``StatefulSampler._start_token``).
        self.origin = origin
        #: The iterator of the DataLoader with workers iterating this one (they read ahead of
        #: training), weakly: the sampler never keeps a loader alive.
        self.loader = None if loader is None else weakref.ref(loader)

    @property
    def position(self) -> int:
        base, size, items = self._view
        return base + size - operator.length_hint(items)

    def advance(self, items: list[Any]) -> Iterator[Any]:
        """Moves to ``items``, the chunk after the current one, and returns its iterator."""
        base, size, _ = self._view
        it = iter(items)
        self._view = (base + size, len(items), it)
        return it


class StatefulSampler(Sampler[T], Generic[T, Seg]):
    """Epoch, position, checkpoint state and pickling for a sampler whose items come from the
    Rust core. Subclasses set their configuration, call ``super().__init__`` last, and supply
    :meth:`_config`, :meth:`_epoch_length` and :meth:`_compute` (optionally
    :meth:`_first_stop` and :meth:`_check_epoch`)."""

    #: What an item is, in messages ("indices" or "batches").
    _unit: ClassVar[str] = "indices"
    #: How many items are turned into Python objects at a time.
    _chunk: ClassVar[int] = 1 << 14
    #: Public attributes fixed at construction (assigning one raises ``AttributeError``).
    _config_names: ClassVar[tuple[str, ...]] = ()
    #: Foreign state shapes :meth:`load_state_dict` also accepts.
    _state_formats: ClassVar[tuple[StateFormat, ...]] = ()
    #: Keys this sampler's own states carry for other tools, derived from the rest (torchdata's
    #: ``yielded``): loading drops them before checking the state.
    _derived_state_keys: ClassVar[tuple[str, ...]] = ()
    #: Whether the sampler's states are in the base's own shape; when not, they are in its
    #: first state format's (NeMo's for ``SequentialBucketSampler``) and only those load.
    _native_states: ClassVar[bool] = True
    #: Whether a loaded position waits for the next iteration whatever its epoch then (NeMo's
    #: rule) instead of belonging to the loaded epoch.
    _skip_outlives_epoch: ClassVar[bool] = False
    #: From this many items left after an iteration's first piece, the rest of the epoch is
    #: computed on a thread while short pieces are handed out.
    _background_from: ClassVar[int] = _BACKGROUND_FROM

    num_replicas: int
    rank: int

    def __init__(self, num_replicas: int, rank: int, length: int | None = None) -> None:
        """Call last in a subclass's ``__init__``, once its configuration is set:
        ``num_replicas`` and ``rank`` as resolved (``croupier.samplers.resolve_ranks``), and
        ``length`` the items per rank and epoch (default: :meth:`_epoch_length` of
        ``num_replicas``)."""
        self.num_replicas = num_replicas
        self.rank = rank
        self._length = self._epoch_length(num_replicas) if length is None else length
        # (epoch, where the next or live iteration stands), replaced as one value so that a
        # checkpoint never pairs one epoch with another's position.
        self._now: tuple[int, _Pending | _Cursor | None] = (0, None)
        # (epoch, first position, its elastic rest, items from there to the end) or None.
        self._cache: tuple[int, int, _Elastic, Seg] | None = None
        # After an elastic resume: (epoch, origin world size, global offset, items per rank for
        # the rest of that epoch); it applies to that epoch only.
        self._elastic: _Elastic = None
        self._sealed = True

    # -- what a sampler supplies ----------------------------------------------------------------

    def _config(self) -> dict[str, Any]:
        """The configuration a state must match to load (JSON-able values)."""
        raise NotImplementedError

    def _epoch_length(self, num_replicas: int) -> int:
        """Items per rank and epoch with ``num_replicas`` ranks (``len(self)`` for this one)."""
        raise NotImplementedError

    def _compute(self, epoch: int, start: int, stop: int | None) -> Seg:
        """This rank's items ``[start, stop)`` of ``epoch`` (``stop=None``: to the end)."""
        raise NotImplementedError

    def _first_stop(self, start: int) -> int:
        """Where the first piece of an iteration starting at ``start`` should end so that its
        first item comes soon (default: the end of the epoch, one piece)."""
        return self._length

    def _window(self) -> int | None:
        """For an order whose every range is cheap to compute (no shuffle), how many items to
        compute at a time while iterating, so that iteration holds only one window and the
        first item costs nothing; ``None`` (the default) computes the rest of the epoch once
        and caches it."""
        return None

    def _check_epoch(self, epoch: int) -> None:
        """Raises ``ValueError`` if this sampler cannot iterate ``epoch`` (beyond the range
        check every sampler makes)."""

    # -- elastic resume (optional) ----------------------------------------------------------------
    #
    # A sampler whose epoch is one global order dealt to the ranks with torch's arithmetic
    # supports resuming mid-epoch on another number of ranks: what the old ranks consumed is a
    # prefix of the global order, and the rest is dealt to the new ranks. It sets
    # ``_elastic_supported`` and supplies the four hooks below.

    #: Whether a state saved mid-epoch with another ``num_replicas`` continues the epoch.
    _elastic_supported: ClassVar[bool] = False

    def _global_end(self, origin: int) -> int:
        """Global positions in an epoch first dealt over ``origin`` ranks (its samples, without
        padding)."""
        raise NotImplementedError

    def _elastic_length(self, origin: int, offset: int, num_replicas: int) -> int:
        """Items per rank for the rest of such an epoch from global position ``offset``, dealt
        over ``num_replicas`` ranks."""
        raise NotImplementedError

    def _compute_elastic(
        self, origin: int, offset: int, epoch: int, start: int, stop: int | None
    ) -> Seg:
        """This rank's items ``[start, stop)`` of the rest of ``epoch`` (first dealt over
        ``origin`` ranks) from global position ``offset``."""
        raise NotImplementedError

    def _elastic_first_stop(self, start: int, length: int) -> int:
        """Where the first piece of an elastic iteration from ``start`` should end."""
        return length

    # -- configuration --------------------------------------------------------------------------

    def __setattr__(self, name: str, value: Any) -> None:
        if name in type(self)._config_names and self.__dict__.get("_sealed", False):
            raise AttributeError(
                f"{type(self).__name__}.{name} is fixed at construction, so that the state "
                f"describes what is iterated; build a new sampler with {name}=... instead"
            )
        object.__setattr__(self, name, value)

    def __len__(self) -> int:
        """This rank's number of items in the current epoch: torch's count per rank and epoch.

        After any :meth:`load_state_dict`, ``len`` is the position the state records plus
        what the next iteration yields, so a trainer that restores its own count of items
        (batches) trained and stops at ``len`` trains exactly the rest: on the same number of
        ranks that is the whole epoch (torch's convention); after an elastic resume (a state
        saved on another number of ranks) it is the saved position plus this rank's share of
        the epoch's rest, until the next epoch.
        """
        return self._len_of(self._now[0])

    def _elastic_of(self, epoch: int) -> _Elastic:
        """``(epoch, origin, offset, length)`` of an elastic resume of ``epoch``, if any."""
        el = self._elastic
        if el is None or el[0] != epoch:
            return None
        return el

    def _len_of(self, epoch: int) -> int:
        """Items per rank in ``epoch`` (its rest after an elastic resume)."""
        return self._end_of(self._elastic_of(epoch))

    def _end_of(self, el: _Elastic) -> int:
        """Where an epoch ends: its length, or the end of the elastic rest ``el``."""
        return self._length if el is None else el.resumed_at + el.length

    def _first_position(self, epoch: int) -> int:
        """Where an iteration of ``epoch`` starts when nothing is pending: 0, or after an
        elastic resume the position the rest begins at."""
        el = self._elastic_of(epoch)
        return 0 if el is None else el.resumed_at

    def _items(self, epoch: int, start: int, stop: int | None, el: _Elastic) -> Seg:
        """This rank's items ``[start, stop)`` of ``epoch``, of its elastic rest ``el`` if not
        ``None`` (an iteration keeps the rest it started with), read-only (every view handed
        out shares them)."""
        if el is None:
            seg = self._compute(epoch, start, stop)
        else:
            # The hooks count from the start of the rest.
            base = el.resumed_at
            rest_stop = None if stop is None else stop - base
            seg = self._compute_elastic(el.origin, el.offset, epoch, start - base, rest_stop)
        for arr in (seg.flat, seg.offsets) if isinstance(seg, Batches) else (seg,):
            if isinstance(arr, np.ndarray) and arr.flags.writeable:
                arr.flags.writeable = False
        return seg

    def _first_stop_of(self, start: int, el: _Elastic) -> int:
        if el is None:
            return self._first_stop(start)
        base = el.resumed_at
        return base + self._elastic_first_stop(start - base, el.length)

    # -- epoch and position ---------------------------------------------------------------------

    @property
    def epoch(self) -> int:
        """The current epoch; assigning to it is :meth:`set_epoch`."""
        return self._now[0]

    @epoch.setter
    def epoch(self, epoch: int) -> None:
        self.set_epoch(epoch)

    def set_epoch(self, epoch: int) -> None:
        """Selects the epoch whose order the next iteration yields.

        A position restored by :meth:`load_state_dict` belongs to its epoch: setting that epoch
        again keeps it (so the usual ``sampler.set_epoch(epoch)`` at the top of a resumed
        training loop does not lose it) and moving to another epoch starts that one from its
        beginning. A :meth:`set_skip` waits for the next iteration, whatever its epoch, as in
        kempnerforge's sampler. An iterator already running keeps the epoch it started with.
        """
        epoch = check_int("epoch", epoch, 0, U64_MAX)
        self._check_epoch(epoch)
        current, at = self._now
        if epoch == current:
            return
        if isinstance(at, _Pending) and at.epoch is None:
            self._now = (epoch, at)
        else:
            self._now = (epoch, None)
        self._cache = None
        self._elastic = None  # an elastic resume belongs to its epoch

    def set_skip(self, skip: int) -> None:
        """Makes the next iteration skip the first ``skip`` items of this rank's epoch, in O(1).

        ``skip`` is a position, counted as ``len`` and ``state_dict()["position"]`` count:
        from the start of the epoch, and must be in ``[0, len(self)]``; ``skip == len(self)``
        leaves nothing to yield. A larger value is refused with ``ValueError``: it would
        silently run into the next epoch's data. After an elastic resume the positions
        before the loaded one were consumed on the old number of ranks and cannot be
        yielded here: ``skip`` must be at least that position.
        """
        epoch = self._now[0]
        skip = check_int("skip", skip, 0, len(self))
        el = self._elastic_of(epoch)
        if el is not None and skip < el.resumed_at:
            raise ValueError(
                f"skip must be in [{el.resumed_at}, {len(self)}] after an elastic resume "
                f"(positions before {el.resumed_at} were consumed on num_replicas={el.origin}), "
                f"got {skip}"
            )
        self._now = (epoch, _Pending(skip, None))

    @staticmethod
    def _consumed(at: _Pending | _Cursor | None) -> int:
        return 0 if at is None else at.position

    @staticmethod
    def _is_pending(at: _Pending | _Cursor | None) -> bool:
        """Whether ``at`` is a start the next iteration takes: a loaded position or skip, or an
        iterator that has handed out nothing (DataLoader's worker iterator calls iter() on a
        batch sampler twice and drops the first)."""
        return isinstance(at, _Pending) or (isinstance(at, _Cursor) and not at.started)

    def _next_start(self, at: _Pending | _Cursor | None) -> int:
        # torch's rule: a new iteration starts the epoch again unless a start is pending.
        # After an elastic resume the epoch (this world's rest of it) starts where the rest
        # begins.
        if at is not None and self._is_pending(at):
            return at.position
        return self._first_position(self._now[0])

    # -- items ----------------------------------------------------------------------------------

    def _cached(self, epoch: int, start: int, el: _Elastic) -> Seg | None:
        """The cached items of ``epoch`` (its elastic rest ``el``) from ``start`` on, if the
        cache holds them."""
        cache = self._cache
        if cache is None or cache[0] != epoch or cache[2] != el or cache[1] > start:
            return None
        return cache[3][start - cache[1] :]  # type: ignore[no-any-return]

    def _keep(self, epoch: int, start: int, el: _Elastic, items: Seg) -> None:
        """Caches ``items`` while they are the current epoch's (an iteration that outlived a
        ``set_epoch`` or a load does not overwrite the new state's cache)."""
        if epoch == self._now[0] and el == self._elastic_of(epoch):
            self._cache = (epoch, start, el, items)

    def _tail(self, epoch: int, start: int, el: _Elastic) -> Seg:
        """``epoch``'s items from ``start`` to its end: a view of the cache when it holds them,
        else computed (and cached while ``epoch`` is the current one)."""
        view = self._cached(epoch, start, el)
        if view is not None:
            return view
        items = self._items(epoch, start, None, el)
        self._keep(epoch, start, el, items)
        return items

    def _segments(self, epoch: int, start: int) -> Iterator[Seg]:
        """``epoch``'s items from ``start`` on, in consecutive pieces: a short first piece
        (see :meth:`_first_stop`), then the rest; or windows (see :meth:`_window`). The epoch
        is fixed when iteration starts, as torch's samplers fix their list: a later
        ``set_epoch`` does not leak into an iterator already running, nor does a loaded state:
        the elastic rest (or its absence) is read once, here."""
        el = self._elastic_of(epoch)
        view = self._cached(epoch, start, el)
        if view is not None:
            yield view
            return
        length = self._end_of(el)
        window = self._window()
        if window is not None:
            lo = start
            size = min(window, _FIRST_WINDOW)
            while lo < length:
                hi = min(lo + size, length)
                yield self._items(epoch, lo, hi, el)
                lo, size = hi, window
            return
        stop = self._first_stop_of(start, el)
        if stop < length:
            yield self._items(epoch, start, stop, el)
            if length - stop >= self._background_from and self._cached(epoch, stop, el) is None:
                yield from self._while_the_tail_computes(epoch, stop, el)
                return
            start = stop
        yield self._tail(epoch, start, el)

    def _while_the_tail_computes(self, epoch: int, start: int, el: _Elastic) -> Iterator[Seg]:
        """The items from ``start`` on: the rest of the epoch is computed on a thread (the core
        releases the GIL) while short first pieces (:meth:`_first_stop`, read by random
        access) keep the consumer going; then the rest, from where the pieces reached. A
        DataLoader draws several batches of indices at once, so without this its first batch
        after a resume would wait for the whole rest of the epoch."""
        done = threading.Event()
        box: list[Any] = []

        def work() -> None:
            try:
                box.append(self._items(epoch, start, None, el))
            except BaseException as e:  # re-raised where the items are consumed
                box.append(e)
            done.set()

        threading.Thread(target=work, name="croupier-tail", daemon=True).start()
        lo = start
        length = self._end_of(el)
        while not done.is_set():
            hi = self._first_stop_of(lo, el)
            if hi >= length:
                break
            yield self._items(epoch, lo, hi, el)
            lo = hi
        done.wait()
        items = box[0]
        if isinstance(items, BaseException):
            raise items
        self._keep(epoch, start, el, items)
        yield items[lo - start :]

    def _remaining(self) -> Seg:
        """What the next iteration yields."""
        epoch, at = self._now
        start = self._next_start(at)
        preview = self._preview(epoch, start)
        return self._tail(epoch, start, self._elastic_of(epoch)) if preview is None else preview

    def __iter__(self) -> Iterator[T]:
        check_not_sharded_again(self)
        if self._unit == "batches":
            check_not_batched_again(self)
        loader = prefetching_loader()
        epoch, at = self._now
        start = self._next_start(at)
        token = self._start_token()
        self._before_iteration(epoch, start, token)
        cursor = _Cursor(start, token, loader)
        self._now = (epoch, cursor)
        return _emit(self._segments(epoch, start), cursor, self._chunk)

    # -- hooks for samplers whose next iteration depends on more than the position ----------------

    def _before_iteration(self, epoch: int, start: int, token: object | None) -> None:
        """Hook: an iteration of ``epoch`` from ``start`` is about to begin (``token``: see
        :meth:`_start_token`). A sampler that changes what it draws between iterations (the
        mixture's pending schedule) applies the change here."""

    def _preview(self, epoch: int, start: int) -> Seg | None:
        """Hook: what an iteration from ``start`` would yield if it differs from what the
        sampler draws now (a change :meth:`_before_iteration` would apply), else ``None``."""
        return None

    def _start_token(self) -> object | None:
        """An object naming the pending start of the next iteration (a loaded position or
        :meth:`set_skip`; an iterator that has handed out nothing keeps its start's token), or
        ``None`` when the next iteration starts afresh. The same object until the start
        changes: a sampler remembers it to recognise the resume of a checkpoint."""
        at = self._now[1]
        if isinstance(at, _Pending):
            return at
        if isinstance(at, _Cursor) and not at.started:
            return at.origin
        return None

    def _iteration_running(self) -> bool:
        """Whether an iteration has started handing out items (and not been replaced)."""
        at = self._now[1]
        return isinstance(at, _Cursor) and at.started

    @staticmethod
    def _token_in(pickled: dict[str, Any]) -> object | None:
        """:meth:`_start_token` of the copy that ``pickled`` (this base's
        ``__getstate__``) makes: a running iteration is frozen into a pending start."""
        at = pickled["_now"][1]
        return at if isinstance(at, _Pending) else None

    # -- checkpoints ----------------------------------------------------------------------------

    def _state_config(self) -> dict[str, Any]:
        """``version`` and the configuration: a new dict (with new lists) each call."""
        cached = self.__dict__.get("_config_cache")
        if cached is None:
            # The configuration is fixed at construction: built once, as states are taken at
            # every training step.
            config = {"version": STATE_VERSION, **self._config()}
            cached = (config, tuple(k for k, v in config.items() if isinstance(v, list)))
            self.__dict__["_config_cache"] = cached
        config, lists = cached
        state = config.copy()
        for key in lists:  # a caller may change the state it was given
            state[key] = list(state[key])
        return state

    def state_dict(self) -> dict[str, Any]:
        """The checkpoint state: the configuration, ``num_replicas``, ``rank``, ``epoch`` and
        ``position``, the number of this rank's items of the epoch already consumed (handed
        out by the live iterator, or skipped). After a finished iteration ``position`` is
        ``len(self)``: a run resumed from it does not repeat the epoch.

        A new dict every call, O(1) in size and JSON-serialisable; it does not change as
        iteration goes on, and it is exact at any instant (from a signal handler or a thread).

        Behind a ``DataLoader`` with worker processes, the position counts what the workers
        prefetched, ahead of training: the first call made while some prefetched batch is
        not yet taken warns (checkpoint a :class:`croupier.StatefulDataLoader` instead, whose
        state counts what training took).
        """
        epoch, at = self._now
        loader = at.loader() if isinstance(at, _Cursor) and at.loader is not None else None
        if loader is not None and ahead_of_training(loader) > 0:
            self._warn_prefetched(getattr(loader, "_num_workers", "its"))
        return self._state_at(epoch, self._consumed(at))

    def _warn_prefetched(self, workers: object) -> None:
        """Warns, once per sampler, that a state taken behind prefetching workers runs ahead,
        unless a loader takes it (torchdata's StatefulDataLoader keeps one per batch sent and
        saves the one training reached)."""
        if self.__dict__.get("_warned_prefetched") or _called_by_a_loader():
            return
        self.__dict__["_warned_prefetched"] = True
        name = type(self).__name__
        warn_at_caller(
            f"{name}.state_dict() was called while a DataLoader with {workers} worker "
            f"processes iterates it: the workers read the sampler ahead of training, so this "
            f"state counts {self._unit} training has not consumed yet, and a run resumed from "
            "it would skip them. Checkpoint the loader instead: croupier.StatefulDataLoader("
            f"dataset, ..., {'batch_sampler' if self._unit == 'batches' else 'sampler'}=...)"
            ".state_dict() counts what training took (docs/checkpointing.md)"
        )

    def _state_at(self, epoch: int, position: int) -> dict[str, Any]:
        """The state of this sampler at ``position`` of ``epoch`` (what :meth:`state_dict` says
        once ``position`` items of ``epoch`` are consumed). A loader whose workers prefetch
        ahead of training saves this at the position training has consumed. A sampler whose
        states have another shape (``_native_states = False``) or carry more overrides it."""
        return self._native_state_at(epoch, position)

    def _native_state_at(self, epoch: int, position: int) -> dict[str, Any]:
        """The base's own state shape: version, configuration, world, epoch and position (and
        the elastic entry of an elastic rest). Foreign states are converted to it."""
        state = self._state_config()
        state.update(num_replicas=self.num_replicas, rank=self.rank, epoch=epoch, position=position)
        el = self._elastic_of(epoch)
        if el is not None:
            state["elastic"] = {
                "origin_num_replicas": el.origin,
                "offset": el.offset,
                "resumed_at": el.resumed_at,
            }
        return state

    # -- the resumable protocol (croupier.samplers.Resumable) ---------------------------------

    @property
    def epoch_length(self) -> int:
        """Items of a whole epoch on this rank of this world (``len`` outside an elastic
        rest)."""
        return self._length

    def next_start(self) -> int:
        """The position the next iteration starts at: a pending :meth:`set_skip` or loaded
        position (or the start of an iterator that has handed out nothing yet), else the
        epoch's first position (:meth:`epoch_start`)."""
        return self._next_start(self._now[1])

    def epoch_start(self, epoch: int) -> int:
        """Where an iteration of ``epoch`` starts when nothing is pending: 0, or after an
        elastic load the position its rest begins at."""
        return self._first_position(epoch)

    def state_at(self, epoch: int, position: int) -> dict[str, Any]:
        """:meth:`state_dict` as it reads once ``position`` items of ``epoch`` are consumed
        (a loader whose workers prefetch saves the position training has reached)."""
        return self._state_at(epoch, position)

    def elastic_rest(self, epoch: int) -> Rest | None:
        """The rest of ``epoch`` this world holds after an elastic load, or ``None``."""
        return self._elastic_of(epoch)

    # -- for subclasses -------------------------------------------------------------------------

    def _position_now(self) -> int:
        """Items of the current epoch consumed: the position :meth:`state_dict` records."""
        return self._consumed(self._now[1])

    def _pending_start(self) -> int | None:
        """The start the next iteration is told to take (a :meth:`set_skip`, a loaded position,
        or an iterator that has handed out nothing), ``None`` when nothing is pending."""
        at = self._now[1]
        return at.position if at is not None and self._is_pending(at) else None

    @classmethod
    def _sampler_kind(cls) -> str:
        """The name of the croupier sampler this class is or derives from (a subclass's states
        are its base sampler's)."""
        for klass in cls.__mro__:
            if klass.__module__.startswith("croupier.samplers."):
                return klass.__name__
        return cls.__name__

    def _as_native(self, state: object) -> tuple[Mapping[str, Any], StateFormat | None]:
        """``state`` in the base's own shape, and the :class:`StateFormat` it was converted
        from (``None``: it was in that shape, a ``version`` key says so)."""
        if not isinstance(state, Mapping):
            raise TypeError(f"state must be a mapping (a state_dict()), got {type(state).__name__}")
        if self._native_states and "version" in state:
            if any(k in state for k in self._derived_state_keys):
                state = {k: v for k, v in state.items() if k not in self._derived_state_keys}
            return upgrade(state, self._sampler_kind()), None
        keys = set(state)
        for fmt in self._state_formats:
            if fmt.matches(keys):
                epoch, at = self._now
                return fmt.to_native(state, self._native_state_at(epoch, self._consumed(at))), fmt
        shapes = [f"{fmt.name} ({', '.join(sorted(fmt.keys))})" for fmt in self._state_formats]
        accepted = ["a state_dict() of this sampler"] if self._native_states else []
        accepted += [f"a state of {shape}" for shape in shapes]
        keys_seen = sorted(map(str, keys))
        raise StateError(f"state has keys {keys_seen}; expected {' or '.join(accepted)}")

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restores a :meth:`state_dict`: the next iteration continues with exactly the next item.

        The state is validated first: missing keys, wrong types, negative numbers, a position
        past the end of the epoch, or a different configuration (the message lists each
        difference) raise ``ValueError`` (:class:`~croupier.StateError`; ``TypeError`` for
        wrong types) and leave the sampler unchanged. Ranks move in lockstep, so a state saved
        on any rank loads on any rank.

        A state saved with a different ``num_replicas`` loads at an epoch boundary (position 0
        starts this world's own epoch; the end of an epoch means it is done, whatever was
        dropped). Mid-epoch, a sampler that supports elastic resume (``DistributedSampler``,
        ``MixtureSampler``, ``BucketBatchSampler``) continues the epoch: what the old ranks
        consumed, ``position`` items each, is a prefix of the epoch's global order, and the
        rest of that order is dealt to this sampler's ranks with torch's padding or dropping,
        so nothing consumed comes again and nothing unconsumed is lost (``drop_last`` drops
        fewer than ``num_replicas`` of the rest's last items); until the next epoch
        ``len(self)`` is this rank's share of that rest. Other samplers refuse such a state.
        """
        # The one loading path of every sampler on this base: convert a foreign shape, check
        # everything (the base's keys, then the sampler's own), and only then change anything.
        native, fmt = self._as_native(state)
        self._check_config(native)
        checked = check_state(
            native,
            ints=("num_replicas", "rank", "epoch", "position"),
            config=self._state_config(),
        )
        loaded = self._loaded(checked, fmt)
        commit = self._prepare_load(native, loaded)
        self._position_at(
            loaded.epoch,
            loaded.position,
            elastic=loaded.elastic,
            skip_outlives_epoch=self._skip_outlives_epoch,
        )
        if commit is not None:
            commit()

    def _check_config(self, native: Mapping[str, Any]) -> None:
        """Hook: refuses a state whose configuration differs, in words of the sampler's own,
        before the base's check (which names each differing key)."""

    def _prepare_load(self, native: Mapping[str, Any], loaded: Loaded) -> Callable[[], None] | None:
        """Hook: checks the keys of ``native`` that are the sampler's own (``loaded`` is what
        the base's checks found), raising before anything changes, and returns what applies
        them once the base has positioned the sampler (``None``: nothing)."""
        return None

    def _loaded(self, native: Mapping[str, Any], fmt: StateFormat | None) -> Loaded:
        """Where a checked state puts this sampler: its epoch, position and elastic rest."""
        epoch = check_int("state['epoch']", native["epoch"], 0, U64_MAX)
        self._check_epoch(epoch)
        saved_w = check_int("state['num_replicas']", native["num_replicas"], 1, MAX_LEN)
        check_int("state['rank']", native["rank"], 0, saved_w - 1)
        position = native["position"]
        saved = self._saved_elastic(native, epoch, saved_w)
        if saved is not None:
            first, saved_len = saved.resumed_at, saved.resumed_at + saved.length
        elif saved_w == self.num_replicas:
            first, saved_len = 0, self._length
        else:
            first, saved_len = 0, self._epoch_length(saved_w)
        if not first <= position <= saved_len:
            key = "position" if fmt is None else fmt.position_key
            raise StateError(
                f"state[{key!r}] must be in [{first}, {saved_len}] ({self._unit} per rank "
                f"{'for the epoch resumed at ' + str(first) if saved else 'and epoch'} with "
                f"num_replicas={saved_w}), got {position}"
            )
        if saved_w == self.num_replicas:
            return Loaded(epoch, position, saved, fmt)
        if position == 0 and saved is None:
            return Loaded(epoch, 0, None, fmt)  # the start of the epoch
        if not self._elastic_supported:
            if position < saved_len:
                raise StateError(
                    f"state was saved mid-epoch (position {position} of {saved_len}) with "
                    f"num_replicas={saved_w}, this sampler has num_replicas={self.num_replicas}: "
                    f"{type(self).__name__} does not resume mid-epoch on a different number of "
                    "replicas; resume from a checkpoint taken at an epoch boundary"
                )
            return Loaded(epoch, self._length, None, fmt)
        # Consumed: the old ranks' positions of the global order (padding counts once). A
        # finished epoch is done whatever its world dropped (drop_last cuts the rest's tail:
        # those items come back next epoch, not in another world's rest). This world's rest
        # counts on from the saved position, so len is that position plus this rank's share.
        origin, offset = (saved_w, 0) if saved is None else (saved.origin, saved.offset)
        end = self._global_end(origin)
        consumed = offset + min((position - first) * saved_w, end - offset)
        if consumed >= end or position >= saved_len:
            return Loaded(epoch, position, Rest(epoch, origin, end, 0, position), fmt)
        length = self._elastic_length(origin, consumed, self.num_replicas)
        return Loaded(epoch, position, Rest(epoch, origin, consumed, length, position), fmt)

    def _position_at(
        self,
        epoch: int,
        position: int,
        *,
        elastic: _Elastic = None,
        skip_outlives_epoch: bool = False,
    ) -> None:
        """Puts the next iteration at ``position`` of ``epoch`` (of its elastic rest when
        ``elastic`` is given): the one place a loaded state positions a sampler, after every
        check passed. The position belongs to ``epoch`` (a ``set_epoch`` to another starts
        that one from its beginning) unless ``skip_outlives_epoch`` (NeMo's rule: a skip for
        the next iteration, whatever its epoch)."""
        if epoch != self._now[0] or elastic != self._elastic:
            self._cache = None
        self._elastic = elastic
        self._now = (epoch, _Pending(position, None if skip_outlives_epoch else epoch))

    def _saved_elastic(self, native: Mapping[str, Any], epoch: int, saved_w: int) -> _Elastic:
        """The elastic rest a state records, as it was on the state's own ``saved_w`` ranks
        (``None`` for a state of an epoch that never changed world size), checked."""
        if "elastic" not in native:
            return None
        el = native["elastic"]
        if not self._elastic_supported:
            raise StateError(f"state has an 'elastic' entry; {type(self).__name__} has none")
        keys = {"origin_num_replicas", "offset", "resumed_at"}
        if not isinstance(el, Mapping) or set(el) != keys:
            raise StateError(
                "state['elastic'] must be a mapping with keys 'origin_num_replicas', 'offset' "
                "and 'resumed_at'"
            )
        origin = check_int(
            "state['elastic']['origin_num_replicas']", el["origin_num_replicas"], 1, MAX_LEN
        )
        end = self._global_end(origin)
        offset = check_int("state['elastic']['offset']", el["offset"], 0, end)
        resumed_at = check_int("state['elastic']['resumed_at']", el["resumed_at"], 0, MAX_LEN)
        length = self._elastic_length(origin, offset, saved_w) if offset < end else 0
        return Rest(epoch, origin, offset, length, resumed_at)

    # -- pickling (DataLoader workers, multiprocessing) and repr --------------------------------

    def __getstate__(self) -> dict[str, Any]:
        # Pickling (and copy.copy) is a checkpoint: the live iterator's position is frozen into a
        # pending start, and the cached items are recomputed on demand, never shipped.
        state = self.__dict__.copy()
        state["_cache"] = None
        epoch, at = self._now
        if isinstance(at, _Cursor):
            state["_now"] = (epoch, _Pending(at.position, epoch))
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        # A sampler pickled by a croupier before an order's rename names it the old way.
        order = state.get("order")
        known = ORDERS.get(self._sampler_kind(), ())
        if isinstance(order, str) and order in ORDER_ALIASES and known and order not in known:
            state = {**state, "order": ORDER_ALIASES[order]}
        self.__dict__.update(state)

    def __repr__(self) -> str:
        epoch, at = self._now
        fields = {**self._config(), "num_replicas": self.num_replicas, "rank": self.rank}
        body = ", ".join(f"{k}={v!r}" for k, v in fields.items())
        return f"{type(self).__name__}({body}, epoch={epoch}, position={self._consumed(at)})"


def _called_by_a_loader() -> bool:
    """Whether the first caller outside croupier is torch's or torchdata's own code."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_globals.get("__name__", "").startswith("croupier."):
        frame = frame.f_back  # type: ignore[assignment]
    name = "" if frame is None else str(frame.f_globals.get("__name__", ""))
    return name.startswith(("torch.", "torchdata."))


def _emit(segments: Iterator[_Segment], cursor: _Cursor, chunk: int) -> Iterator[Any]:
    """Yields the items of ``segments`` as Python objects, a chunk at a time.

    A generator, not ``itertools.chain`` over the chunks (which costs an item 17 ns less): the
    chunks are computed with the GIL released, and a second thread's ``next`` on a chain
    whose source is running clears that source under the first (its epoch silently cut
    short); a generator refuses the second thread with ``ValueError`` instead."""
    cursor.started = True
    for seg in segments:
        for lo in range(0, len(seg), chunk):
            yield from cursor.advance(seg[lo : lo + chunk].tolist())


class IndexSampler(StatefulSampler[int, "npt.NDArray[Any]"]):
    """A sampler that yields this rank's indices as Python ints; position counts indices."""

    def indices(self) -> npt.NDArray[Any]:
        """What the next iteration yields, as a read-only numpy array (``uint32`` when the
        dataset has at most ``2**32`` samples, else ``int64``): the rest of the epoch after a
        :meth:`set_skip` or :meth:`load_state_dict`, else the whole epoch (a new iteration
        starts the epoch again, as torch's samplers do). A view of the buffer the Rust core
        filled: no copy is made."""
        return self._remaining()


class BatchSampler(StatefulSampler[list[int], Batches]):
    """A sampler that yields batches (``list[int]``); position and ``len`` count batches."""

    _unit = "batches"
    _chunk = 1 << 10

    def batches(self) -> Batches:
        """What the next iteration yields, as :class:`Batches` (two numpy arrays: the indices
        and the offsets where each batch starts), without a copy."""
        return self._remaining()

    @property
    def sampler(self) -> BatchSampler:
        """This batch sampler itself: it draws its own indices, there is no inner sampler.
        Frameworks that pass the epoch on through ``loader.batch_sampler.sampler.set_epoch``
        (Lightning, Accelerate) reach this sampler's :meth:`set_epoch` through it."""
        return self
