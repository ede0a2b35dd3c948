"""``StatefulDataLoader``: a torch ``DataLoader`` whose checkpoint records what training consumed.

Behind a ``DataLoader`` the sampler runs ahead of training: with workers, the main process
draws ``prefetch_factor * num_workers`` batches of indices before the first batch reaches the
training loop, so a sampler's own ``state_dict()`` taken then claims batches that training never
saw, and a run resumed from it skips them. This loader counts the batches it has handed to the
caller and saves the sampler's state *at that position* (croupier samplers compute the state of
any position of the current epoch in O(1)), so a resume starts at exactly the next batch
training has not seen, whatever the workers had prefetched. Resuming costs O(1) in the epoch's
length: the sampler starts its iteration there; no batch is replayed.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator, Mapping
from typing import Any, NamedTuple, TypeGuard

from torch.utils.data import BatchSampler as TorchBatchSampler
from torch.utils.data import DataLoader, IterableDataset

from croupier._torch import DistributedSamplerBase
from croupier._validate import U64_MAX, check_int
from croupier.samplers._base import BatchSampler, IndexSampler
from croupier.samplers._state import StateError
from croupier.samplers.distributed import DistributedSampler
from croupier.samplers.protocol import Resumable

__all__ = ["StatefulDataLoader"]

# What ``config`` may set (kempnerforge's ``DataConfig`` fields the loader reads, plus two
# DataLoader options); explicit keyword arguments win over it.
_CONFIG_FIELDS = ("num_workers", "pin_memory", "prefetch_factor", "persistent_workers", "drop_last")
# Keys of a sampler state that carries its own position (croupier's, NeMo's, torchdata's).
_POSITION_KEYS = ("position", "batches_yielded", "yielded")


def _from_config(config: object) -> dict[str, Any]:
    """The DataLoader options ``config`` sets: a mapping, or an object with attributes (such
    as kempnerforge's ``DataConfig``); fields it does not have are left to the defaults."""
    if config is None:
        return {}
    if isinstance(config, Mapping):
        get = config.get
    elif isinstance(config, (str, bytes, int, float)):
        raise TypeError(
            f"config must be a mapping or an object with attributes such as num_workers "
            f"(kempnerforge's DataConfig), got {type(config).__name__}"
        )
    else:

        def get(name: str, default: object = None) -> object:
            return getattr(config, name, default)

    out: dict[str, Any] = {}
    for name in _CONFIG_FIELDS:
        value = get(name, None)
        if value is not None:
            out[name] = value
    return out


_RESUMABLE: weakref.WeakKeyDictionary[type, bool] = weakref.WeakKeyDictionary()


def _resumable(source: object) -> TypeGuard[Resumable[Any]]:
    """Whether ``source`` implements :class:`~croupier.samplers.Resumable`, decided once per
    class: a runtime protocol check looks up every member of the protocol (tens of
    microseconds), and the loader asks at every ``state_dict()``."""
    kind = type(source)
    known = _RESUMABLE.get(kind)
    if known is None:
        known = _RESUMABLE[kind] = isinstance(source, Resumable)
    return known


class _Progress(NamedTuple):
    """Where training stands, replaced as one value so a checkpoint taken at any instant (a
    signal handler, another thread) pairs an epoch with its own count."""

    epoch: int  #: the loader's epoch
    batches: int  #: batches of it consumed, from the epoch's start (a resumed run's included)
    start: int  #: the sampler position the live iteration started at
    since: int  #: batches consumed since then


class StatefulDataLoader(DataLoader):  # type: ignore[type-arg]
    """A ``torch.utils.data.DataLoader`` that can be checkpointed and resumed at the exact next
    batch, with or without workers.

    ``state_dict()`` returns ``{"epoch", "batches_yielded", "sampler"}``: the epoch, the
    batches of it handed to the caller, and the sampler's state at that point (not at the point
    the workers' prefetching has reached). ``load_state_dict`` restores it; the next iteration
    continues with the next batch, in O(1) (nothing is replayed). kempnerforge's semantics:
    the epoch advances by itself when an iteration runs to its end, and each iteration calls
    ``sampler.set_epoch(epoch)``; ``set_epoch`` sets it explicitly.

    Args:
        dataset: a map-style dataset (``__getitem__``, ``__len__``).
        batch_size: samples per batch for a sampler that yields indices; ``None`` (or the
            default 1) with a batch sampler.
        sampler: a croupier sampler. An index sampler (``DistributedSampler``,
            ``MixtureSampler``) is batched by ``batch_size``; a batch sampler
            (``BucketBatchSampler``, ``SequentialBucketSampler``) is used as the DataLoader's
            ``batch_sampler``. Any other sampler must follow kempnerforge's protocol
            (``state_dict``, ``load_state_dict``, ``set_skip``). ``None`` builds a
            ``croupier.DistributedSampler(dataset)`` over the process group (``shuffle`` may
            be passed for it).
        config: DataLoader options as a mapping or an object with attributes (kempnerforge's
            ``DataConfig``): ``num_workers``, ``pin_memory``, ``prefetch_factor``,
            ``persistent_workers``, ``drop_last``. Keyword arguments override it.
        **dataloader_kwargs: any other ``DataLoader`` argument (``num_workers``,
            ``collate_fn``, ``pin_memory``, ``prefetch_factor``, ``persistent_workers``,
            ``drop_last``, ``batch_sampler``, ...). ``in_order=False`` is refused: batches
            must reach the caller in order for the count to name a position.

    With ``drop_last=False`` (the default, as in torch) the last, smaller batch of an epoch is
    yielded; ``drop_last=True`` drops it.
    """

    def __init__(
        self,
        dataset: Any,
        batch_size: int | None = 1,
        sampler: Any = None,
        config: Any = None,
        **dataloader_kwargs: Any,
    ) -> None:
        if isinstance(dataset, IterableDataset):
            raise TypeError(
                "StatefulDataLoader needs a map-style dataset (with __getitem__ and __len__): "
                "an IterableDataset has no sampler whose position could be saved"
            )
        configured = _from_config(config)
        kwargs = {**configured, **dataloader_kwargs}
        if kwargs.get("num_workers", 0) == 0 and "prefetch_factor" not in dataloader_kwargs:
            kwargs.pop("prefetch_factor", None)  # a config's; DataLoader refuses it without workers
        if kwargs.get("in_order", True) is not True:
            raise ValueError(
                "in_order=False is not supported: batches must reach the caller in order for "
                "the checkpoint to name the next batch"
            )
        batch_sampler = kwargs.pop("batch_sampler", None)
        shuffle = kwargs.pop("shuffle", None)
        if batch_sampler is not None and sampler is not None:
            raise ValueError("pass sampler or batch_sampler, not both")
        if sampler is not None and _is_batch_sampler(sampler):
            batch_sampler, sampler = sampler, None
        if shuffle is not None and (sampler is not None or batch_sampler is not None):
            raise ValueError(
                "shuffle is for the DistributedSampler built when no sampler is given; "
                "pass shuffle to your sampler instead"
            )
        if batch_sampler is not None:
            if batch_size not in (None, 1):
                raise ValueError(
                    f"batch_size must be None with a batch sampler (it makes the batches), "
                    f"got {batch_size!r}"
                )
            if kwargs.get("drop_last"):
                raise ValueError(
                    "drop_last must be False with a batch sampler (it decides its batches)"
                )
            kwargs.pop("drop_last", None)
            _check_sampler("batch_sampler", batch_sampler)
            source = batch_sampler
            batch_size = 1  # DataLoader's value for "the batch sampler decides"
        else:
            batch_size = check_int("batch_size", batch_size, 1)
            if sampler is None:
                sampler = DistributedSampler(
                    dataset, **({} if shuffle is None else {"shuffle": shuffle})
                )
            _check_sampler("sampler", sampler)
            source = sampler
        super().__init__(
            dataset,
            batch_size=batch_size,
            sampler=sampler,
            batch_sampler=batch_sampler,
            **kwargs,
        )
        if batch_sampler is not None and isinstance(batch_sampler, BatchSampler):
            # DataLoader gives a loader with a batch sampler a SequentialSampler as `sampler`,
            # which nothing iterates; frameworks read it to decide whether the loader is
            # rank-aware (Lightning re-creates it otherwise). Show them the truth: a view of
            # the batch sampler's indices, a DistributedSampler that is already dealt.
            object.__setattr__(self, "sampler", _BatchesAsIndices(batch_sampler))
        if batch_sampler is None:
            # torch's BatchSampler around the sampler, which passes the epoch on: a loader
            # rebuilt around `loader.batch_sampler` (Accelerate's skip_first_batches, which the
            # HF Trainer uses to resume) can still select the sampler's epoch through it.
            batches = _EpochBatches(sampler, batch_size, self.drop_last)
            object.__setattr__(self, "batch_sampler", batches)
        self._start_counting(source, batch_size, self.drop_last)

    def _start_counting(self, source: Any, per_batch: int, drop_last: bool) -> None:
        """Sets up the count of batches handed out: ``source`` is the sampler whose state is
        saved, ``per_batch`` its items per batch (1 for a batch sampler) and ``drop_last``
        whether a short last batch is dropped."""
        #: The sampler whose state is saved: the index sampler or the batch sampler.
        self.source = source
        # Sampler items per batch: indices, or 1 for a batch sampler (its items are batches).
        self._per_batch = per_batch
        self._drop_last_batch = drop_last
        # The loader starts in the sampler's epoch (one set before the loader was built).
        epoch = getattr(source, "epoch", 0)
        self._epoch_given = epoch if isinstance(epoch, int) else 0
        self._progress = _Progress(self._epoch_given, 0, 0, 0)
        # (its iteration, the epoch of the live iteration) while that iteration's last batch is
        # out (the progress already names the next epoch then), else None.
        self._last_epoch: tuple[object, int] | None = None
        self._loaded_skip: int | None = None

    # -- epochs -----------------------------------------------------------------------------

    @property
    def epoch(self) -> int:
        """The epoch the live iteration yields (while its last batch is out, too), else the
        epoch the next iteration yields."""
        last = self._last_epoch
        return self._progress.epoch if last is None else last[1]

    def set_epoch(self, epoch: int) -> None:
        """Selects the epoch and passes it to the sampler. Setting the epoch a loaded state
        belongs to keeps its position (the usual ``set_epoch`` at the top of a resumed training
        loop loses nothing); another epoch starts from its first batch."""
        epoch = check_int("epoch", epoch, 0, U64_MAX)
        self._last_epoch = None
        if epoch != self._progress.epoch:
            self._progress = _Progress(epoch, 0, 0, 0)
            self._loaded_skip = None
            if getattr(self.source, "epoch", None) == epoch:
                # The loader moved past this epoch (its last batch went out) before the sampler
                # heard of the next one: the sampler still holds its position, or the rest of
                # an elastic resume. Going back to it starts it whole, as any other epoch.
                self.source.set_epoch(epoch + 1 if epoch < U64_MAX else epoch - 1)
        self._give_epoch(epoch)

    def _give_epoch(self, epoch: int) -> None:
        self.source.set_epoch(epoch)
        # What the loader last told the sampler: an epoch set on the sampler since, directly
        # (Lightning's set_epoch reaches loader.sampler, not the loader), is adopted.
        self._epoch_given = epoch

    def _adopt_sampler_epoch(self) -> None:
        """Follows an epoch set on the sampler itself since the loader last set one (Lightning
        and Accelerate call ``loader.sampler.set_epoch``): that epoch from its first batch,
        unless it is the one the loader is in."""
        epoch = getattr(self.source, "epoch", None)
        if isinstance(epoch, int) and epoch != self._epoch_given and epoch != self.epoch:
            self._progress = _Progress(epoch, 0, 0, 0)
            self._loaded_skip = None

    # -- iteration ----------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        self._last_epoch = None
        self._adopt_sampler_epoch()
        progress = self._progress
        self._give_epoch(progress.epoch)
        if _resumable(self.source):
            if progress.since == 0 and progress.start > self.source.next_start():
                # An iteration made since the load handed out nothing (dropped before its first
                # batch, whose prefetching still started the sampler): training stands where
                # the load put it.
                self.source.set_skip(progress.start)
            start = self.source.next_start()
            # A new iteration without a loaded state starts the epoch again (torch's rule); after
            # an elastic resume, at this world's rest of it, which follows the batches the old
            # world yielded (the sampler's positions count them).
            first = self.source.epoch_start(progress.epoch)
            batches = progress.batches if start > first else -(-first // self._per_batch)
        else:
            if self._loaded_skip is not None:
                self.source.set_skip(self._loaded_skip)
            start = self._loaded_skip or 0
            batches = progress.batches if start > 0 else 0
        self._loaded_skip = None
        self._progress = _Progress(progress.epoch, batches, start, 0)
        return self._consume(super().__iter__(), self._batches_from(start))

    def _batches_from(self, start: int) -> int:
        """Batches an iteration starting at sampler position ``start`` yields."""
        rest = max(len(self.source) - start, 0)
        if self._per_batch == 1:
            return rest
        return rest // self._per_batch if self._drop_last_batch else -(-rest // self._per_batch)

    def _consume(self, inner: Iterator[Any], count: int) -> Iterator[Any]:
        done = False
        me = object()
        try:
            for batch in inner:
                epoch, batches, start, since = self._progress
                if since + 1 >= count and not done:
                    done = True
                    self._last_epoch = (me, epoch)  # what `epoch` says while it is out
                    # The last batch: the epoch is done once it is handed out. Trainers stop
                    # after len(loader) batches and never ask for the end of the iterator
                    # (Lightning, the HF Trainer): the next iteration, and a checkpoint taken
                    # now, must still start the next epoch.
                    self._progress = _Progress(epoch + 1, 0, 0, 0)
                else:
                    self._progress = _Progress(epoch, batches + 1, start, since + 1)
                yield batch
            if not done:  # an empty epoch, or one shorter than announced: done at its end
                p = self._progress
                self._progress = _Progress(p.epoch + 1, 0, 0, 0)
        finally:  # run to its end, or dropped by the caller (maybe after a newer one started)
            last = self._last_epoch
            if last is not None and last[0] is me:
                self._last_epoch = None

    # -- checkpoints --------------------------------------------------------------------------

    def _consumed_items(self, p: _Progress) -> int:
        """The sampler position (indices, or batches for a batch sampler) training has
        consumed: the iteration's start plus the batches handed out since."""
        # len() of the sampler, not of the epoch it started with: after an elastic resume it is
        # the loaded position plus this rank's share of the rest of that epoch.
        return min(p.start + p.since * self._per_batch, len(self.source))

    def state_dict(self) -> dict[str, Any]:
        """``{"epoch", "batches_yielded", "sampler"}``: the epoch, the batches of it handed to
        the caller, and the sampler's state at that point. JSON-serialisable, O(1) in size,
        exact at any instant; prefetched batches are not counted. After an epoch ran to its
        end, it names the start of the next epoch."""
        p = self._progress
        source = self.source
        if _resumable(source):
            sampler_state = source.state_at(p.epoch, self._consumed_items(p))
        else:
            sampler_state = source.state_dict()
        return {"epoch": p.epoch, "batches_yielded": p.batches, "sampler": sampler_state}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restores a :meth:`state_dict` (or kempnerforge's): the next iteration yields the
        next batch training had not consumed. The sampler state is loaded into the sampler;
        a state without a position (kempnerforge's sampler keys ``epoch, seed, num_replicas,
        rank``) resumes after ``batches_yielded * batch_size`` samples, as kempnerforge does.
        Invalid states raise ``ValueError``/``TypeError`` and change nothing."""
        if not isinstance(state, Mapping):
            raise TypeError(f"state must be a mapping (a state_dict()), got {type(state).__name__}")
        missing = [k for k in ("epoch", "batches_yielded") if k not in state]
        if missing:
            raise StateError(
                f"state is missing keys {missing}; expected a StatefulDataLoader state_dict() "
                "with epoch, batches_yielded and sampler"
            )
        epoch = check_int("state['epoch']", state["epoch"], 0, U64_MAX)
        batches = check_int("state['batches_yielded']", state["batches_yielded"], 0)
        sampler_state = state.get("sampler")
        if sampler_state is not None and not isinstance(sampler_state, Mapping):
            raise TypeError(
                f"state['sampler'] must be a mapping, got {type(sampler_state).__name__}"
            )
        if sampler_state is not None:
            sampler_state = _rest_counts_on(sampler_state, batches, self._per_batch)
        positional = sampler_state is not None and any(k in sampler_state for k in _POSITION_KEYS)
        # batches_yielded must fit this loader's epoch, unless the sampler state says it was
        # counted in another world (another num_replicas, or the rest of an epoch continued
        # on another one: an elastic resume), where epochs had another number of batches.
        other_world = sampler_state is not None and (
            "elastic" in sampler_state
            or sampler_state.get("num_replicas", self._source_replicas) != self._source_replicas
        )
        per_epoch = self._batches_per_epoch()
        if not other_world and batches > per_epoch:
            raise StateError(
                f"state['batches_yielded'] must be in [0, {per_epoch}] (batches per epoch of "
                f"this loader), got {batches}"
            )
        skip = None if positional else min(batches * self._per_batch, len(self.source))
        if skip is not None and not (_resumable(self.source) or hasattr(self.source, "set_skip")):
            raise StateError("state['sampler'] has no position and the sampler has no set_skip")
        if sampler_state is not None:
            self.source.load_state_dict(sampler_state)  # validates; unchanged if refused
        self._epoch_given = epoch
        if _resumable(self.source):
            if skip is not None:
                self.source.set_epoch(epoch)
                self.source.set_skip(skip)
            self._loaded_skip = None
            start = self.source.next_start()
        else:
            self._loaded_skip = skip
            start = skip or 0
        self._progress = _Progress(epoch, batches, start, 0)
        self._last_epoch = None

    def _batches_per_epoch(self) -> int:
        """Batches of a whole epoch of this loader: ``len(self)``, unless the sampler holds
        the rest of an epoch after an elastic resume (then ``len(self)`` is that rest's)."""
        source = self.source
        if not _resumable(source) or source.elastic_rest(source.epoch) is None:
            return len(self)
        n, per = source.epoch_length, self._per_batch
        return n // per if self._drop_last_batch else -(-n // per)

    @property
    def _source_replicas(self) -> int | None:
        """``num_replicas`` of the sampler, if it has one."""
        return getattr(self.source, "num_replicas", None)

    def __repr__(self) -> str:
        p = self._progress
        return (
            f"StatefulDataLoader(sampler={self.source!r}, batch_size={self.batch_size}, "
            f"num_workers={self.num_workers}, epoch={p.epoch}, batches_yielded={p.batches})"
        )


class _BatchesAsIndices(DistributedSamplerBase[int]):
    """A croupier batch sampler's indices, batch after batch, as a rank-aware index sampler:
    a ``StatefulDataLoader``'s ``sampler`` when it iterates a batch sampler. ``set_epoch``,
    ``num_replicas`` and ``rank`` are the batch sampler's; iterating yields what the batch
    sampler's next iteration yields, flattened. (torch's ``DistributedSampler.__init__`` is not
    run: only its type is inherited.)"""

    def __init__(self, batches: BatchSampler) -> None:
        self.batches = batches

    @property
    def num_replicas(self) -> int:  # type: ignore[override]
        """The batch sampler's number of ranks."""
        return self.batches.num_replicas

    @property
    def rank(self) -> int:  # type: ignore[override]
        """The batch sampler's rank."""
        return self.batches.rank

    @property
    def epoch(self) -> int:  # type: ignore[override]
        """The batch sampler's epoch."""
        return self.batches.epoch

    def set_epoch(self, epoch: int) -> None:
        """Sets the batch sampler's epoch."""
        self.batches.set_epoch(epoch)

    def __iter__(self) -> Iterator[int]:
        # What the batch sampler's next iteration yields, read without iterating it (which
        # would use up a pending resume position).
        rest = self.batches.batches()
        if len(rest):
            yield from rest.flat[int(rest.offsets[0]) : int(rest.offsets[-1])].tolist()

    def __len__(self) -> int:
        """Indices of the batch sampler's next iteration."""
        rest = self.batches.batches()
        return int(rest.offsets[-1] - rest.offsets[0]) if len(rest) else 0

    def __repr__(self) -> str:
        return f"<indices of {self.batches!r}>"


class _EpochBatches(TorchBatchSampler):
    """torch's ``BatchSampler`` over an index sampler, with the sampler's ``epoch`` and
    ``set_epoch``: a ``StatefulDataLoader``'s ``batch_sampler`` when it batches an index
    sampler."""

    @property
    def epoch(self) -> int:
        """The sampler's epoch."""
        sampler: Any = self.sampler
        return int(sampler.epoch)

    def set_epoch(self, epoch: int) -> None:
        """Sets the sampler's epoch."""
        sampler: Any = self.sampler
        sampler.set_epoch(epoch)


def _rest_counts_on(sampler_state: Mapping[str, Any], batches: int, per_batch: int) -> Any:
    """A version-1 sampler state of an elastic rest, as a loader saved it, in version 2's
    terms: version 1 counted the rest's positions from its start, version 2 from the
    position the rest was resumed at, the items of the batches yielded before it (a bare
    sampler state cannot know them; the loader's ``batches_yielded`` does). Any other state
    is returned as it is (the sampler upgrades and checks it)."""
    el = sampler_state.get("elastic")
    if sampler_state.get("version") != 1 or not isinstance(el, Mapping) or "resumed_at" in el:
        return sampler_state
    position = sampler_state.get("position")
    if not isinstance(position, int) or isinstance(position, bool) or position < 0:
        return sampler_state
    resumed_at = max(batches - -(-position // per_batch), 0) * per_batch
    return {
        **sampler_state,
        "version": 2,
        "position": resumed_at + position,
        "elastic": {**el, "resumed_at": resumed_at},
    }


def _count_batches_of(loader: DataLoader, source: Any, per_batch: int, drop_last: bool) -> None:  # type: ignore[type-arg]
    """Makes ``loader``, a torch ``DataLoader`` built elsewhere (Accelerate's) whose batches
    are ``source``'s, batched ``per_batch`` at a time (1 for a batch sampler), a
    :class:`StatefulDataLoader`: it keeps its own batch sampler and options and counts the
    batches it hands out, so its ``state_dict`` names the next batch training has not seen."""
    if not isinstance(loader, StatefulDataLoader):
        loader.__class__ = StatefulDataLoader
        StatefulDataLoader._start_counting(loader, source, per_batch, drop_last)  # type: ignore[arg-type]


def _is_batch_sampler(sampler: object) -> bool:
    return isinstance(sampler, (BatchSampler, TorchBatchSampler))


def _check_sampler(name: str, sampler: object) -> None:
    if isinstance(sampler, (IndexSampler, BatchSampler)) or _resumable(sampler):
        return
    needed = ("state_dict", "load_state_dict", "set_skip", "set_epoch")
    lacking = [m for m in needed if not callable(getattr(sampler, m, None))]
    if lacking:
        raise TypeError(
            f"{name} must be a croupier sampler, or follow kempnerforge's protocol "
            f"(state_dict, load_state_dict, set_skip, set_epoch); {type(sampler).__name__} "
            f"lacks {', '.join(lacking)}. For torch's DistributedSampler use "
            "croupier.DistributedSampler(..., order='torch'): the same indices, resumable"
        )
