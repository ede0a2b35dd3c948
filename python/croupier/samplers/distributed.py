"""``croupier.DistributedSampler``: a drop-in for ``torch.utils.data.DistributedSampler``.

The indices come from the Rust core; this class keeps only the small state a checkpoint needs
(epoch and this rank's position in the epoch) and checks arguments.
"""

from __future__ import annotations

import operator
from collections.abc import Iterator
from typing import Any

import numpy.typing as npt

from croupier import _core
from croupier._dist import DistInfo, resolve_ranks
from croupier._sampler_base import Sampler
from croupier._torch_order import torch_randperm_order
from croupier._validate import MAX_LEN, U64_MAX, check_bool, check_int, dataset_length
from croupier.samplers._state import StateError, check_state

__all__ = ["DistributedSampler"]

_STATE_VERSION = 1
# Indices are turned into Python ints a chunk at a time: never a Python list of the whole epoch.
_CHUNK = 1 << 14
_ORDERS = ("fast", "torch")


class _Cursor:
    """Progress of one iteration through this rank's epoch.

    The position is derived on demand from the chunk being handed out: the chunk's start plus
    how many of its items the list iterator has already given, so iteration does no per-item
    bookkeeping and a checkpoint between two items still resumes with the next one.
    """

    __slots__ = ("_base", "_chunk", "_size")

    def __init__(self, position: int) -> None:
        self._base = position
        self._size = 0
        self._chunk: Iterator[int] = iter(())

    @property
    def position(self) -> int:
        return self._base + self._size - operator.length_hint(self._chunk)

    def next_chunk(self, indices: npt.NDArray[Any], offset: int) -> Iterator[int] | None:
        """Moves to the chunk after the current one, taken from ``indices`` (which holds the
        positions from ``offset`` on), and returns its iterator, or ``None`` when ``indices``
        is used up."""
        self._base += self._size
        start = self._base - offset
        values = indices[start : start + _CHUNK].tolist()
        self._size = len(values)
        self._chunk = iter(values)
        return self._chunk if values else None


class DistributedSampler(Sampler[int]):
    """Deals a dataset's indices to data-parallel ranks like torch's ``DistributedSampler``.

    Each epoch has one global order of the ``N`` samples (a seeded shuffle, or ``0..N-1`` with
    ``shuffle=False``). With ``drop_last=False`` it is padded by repeating its head until every
    rank gets the same count; with ``drop_last=True`` it is cut to a multiple of
    ``num_replicas``. Rank ``r`` takes global positions ``r, r + W, r + 2W, ...``, exactly as
    torch does, so ranks are disjoint apart from the padding and all have ``len(self)`` indices.

    Args:
        dataset: anything with ``__len__``, or an ``int`` number of samples (no dataset object
            is needed at billion scale).
        num_replicas: number of ranks ``W >= 1``; ``None`` asks ``dist_info``.
        rank: this rank, in ``[0, W)``; ``None`` asks ``dist_info``.
        shuffle: shuffle the order every epoch (seeded by ``seed`` and the epoch).
        seed: non-negative integer below ``2**64``; all ranks must use the same one.
        drop_last: cut the uneven tail instead of padding.
        order: ``"fast"``, croupier's own seeded order: uniform, disjoint across ranks, equal
            lengths, identical on every platform. ``"torch"``: exactly the sequence
            ``torch.utils.data.DistributedSampler`` yields for the same arguments and epoch
            (torch's CPU ``randperm`` seeded with ``seed + epoch``, reproduced in Rust), so a
            run can switch samplers mid-training without changing its data order.
        torch_version: with ``order="torch"``, the torch release whose ``randperm`` to
            reproduce, e.g. ``"2.5.1"`` (default: the torch in use, ``torch.__version__`` if
            imported, else the installed package; the newest algorithm if torch is absent).
            Releases up to 2.5 and from 2.6 on differ for datasets of ``2**32 // 20`` samples
            or more.
        dist_info: where ``num_replicas``/``rank`` come from when ``None``: ``None`` (an
            initialised ``torch.distributed``, else the ``RANK``/``WORLD_SIZE`` environment
            variables, else rank 0 of 1), ``"torch"``, ``"jax"``, or a callable returning
            ``(rank, world_size)``.

    Checkpointing: :meth:`state_dict` is a small JSON-serialisable dict holding the
    configuration, the epoch and ``position``, the number of this rank's indices of the epoch
    already consumed (handed out by the live iterator, or skipped). Loading it into a sampler
    with the same arguments continues with exactly the next index. Ranks advance in lockstep,
    so any rank's state can be loaded on any rank (``rank`` in a state is informational).

    Iterating again without :meth:`set_epoch` repeats the epoch from its start, as torch does;
    a pending :meth:`set_skip` or :meth:`load_state_dict` position applies to the next
    iteration only.
    """

    def __init__(
        self,
        dataset: Any,
        num_replicas: int | None = None,
        rank: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        *,
        order: str = "fast",
        dist_info: DistInfo = None,
        torch_version: str | None = None,
    ) -> None:
        n = dataset_length(dataset)
        if order not in _ORDERS:
            raise ValueError(f"order must be one of {list(_ORDERS)}, got {order!r}")
        if order == "torch":
            self._core_order = torch_randperm_order(torch_version)
        elif torch_version is not None:
            raise ValueError("torch_version applies to order='torch' only")
        else:
            self._core_order = order
        self.shuffle = check_bool("shuffle", shuffle)
        self.drop_last = check_bool("drop_last", drop_last)
        self.seed = check_int("seed", seed, 0, U64_MAX)
        self.num_replicas, self.rank = resolve_ranks(num_replicas, rank, dist_info)
        self.dataset = dataset
        self.order = order
        self.num_samples, self.total_size = _core.layout(n, self.num_replicas, self.drop_last)
        self._n = n
        self._epoch = 0
        self._pending: int | None = None  # where the next iteration starts
        # The epoch a pending position belongs to (a loaded state), or None for a set_skip,
        # which waits for the next iteration whatever its epoch.
        self._pending_epoch: int | None = None
        self._cursor: _Cursor | None = None  # the live (latest) iteration
        # This rank's indices of self._epoch from position self._cache_start to the end.
        self._cache: npt.NDArray[Any] | None = None
        self._cache_start = 0
        self._cache_epoch = 0

    # -- epoch and position ---------------------------------------------------------------------

    @property
    def epoch(self) -> int:
        """The current epoch; assigning to it is :meth:`set_epoch`."""
        return self._epoch

    @epoch.setter
    def epoch(self, epoch: int) -> None:
        self.set_epoch(epoch)

    def set_epoch(self, epoch: int) -> None:
        """Selects the epoch whose order the next iteration yields.

        A position restored by :meth:`load_state_dict` belongs to its epoch: setting that epoch
        again keeps it (so the usual ``sampler.set_epoch(epoch)`` at the top of a resumed
        training loop does not lose it) and moving to another epoch starts that one from its
        beginning. A :meth:`set_skip` waits for the next iteration, whatever its epoch, as in
        kempnerforge's sampler.
        """
        epoch = check_int("epoch", epoch, 0, U64_MAX)
        if self.order == "torch" and self.seed + epoch > U64_MAX:
            raise ValueError(
                f"seed + epoch must be at most 2**64 - 1 for order='torch' (torch.manual_seed "
                f"refuses more), got seed={self.seed} epoch={epoch}"
            )
        if epoch != self._epoch:
            self._epoch = epoch
            if self._pending_epoch is not None:
                self._pending = self._pending_epoch = None
            self._cursor = None
            self._cache = None
            self._cache_start = 0

    def set_skip(self, skip: int) -> None:
        """Makes the next iteration skip the first ``skip`` of this rank's indices, in O(1).

        ``skip`` counts from the start of the epoch and must be in ``[0, len(self)]``;
        ``skip == len(self)`` leaves nothing to yield (the epoch is finished). A larger value is
        refused with ``ValueError``: it would silently run into the next epoch's data.
        """
        self._pending = check_int("skip", skip, 0, self.num_samples)
        self._pending_epoch = None

    def _position(self) -> int:
        if self._pending is not None:
            return self._pending
        if self._cursor is not None:
            return self._cursor.position
        return 0

    # -- indices --------------------------------------------------------------------------------

    def _range(self, epoch: int, start: int, stop: int | None = None) -> npt.NDArray[Any]:
        arr = _core.rank_indices(
            self._n,
            self.num_replicas,
            self.rank,
            self.shuffle,
            self.seed,
            epoch,
            self.drop_last,
            self._core_order,
            start,
            stop,
        )
        arr.flags.writeable = False  # shared by every view handed out
        return arr

    def _cached(self, epoch: int, start: int) -> npt.NDArray[Any] | None:
        """A view of the cache from ``start`` to the end of ``epoch``, if it holds them."""
        if self._cache is None or self._cache_epoch != epoch or self._cache_start > start:
            return None
        return self._cache[start - self._cache_start :]

    def _tail(self, epoch: int, start: int) -> npt.NDArray[Any]:
        """``epoch``'s indices from ``start`` to its end: a view of the cache when it holds
        them, else computed (and cached if ``epoch`` is still the current one)."""
        view = self._cached(epoch, start)
        if view is not None:
            return view
        arr = self._range(epoch, start)
        if epoch == self._epoch:
            self._cache, self._cache_start, self._cache_epoch = arr, start, epoch
        return arr

    def _segments(self, epoch: int, start: int) -> Iterator[tuple[npt.NDArray[Any], int]]:
        """``epoch``'s indices from ``start`` on as ``(array, first position)`` pieces: in the
        fast order the first piece is the block holding ``start`` or, inside a long block, the
        next 64 positions read by random access, so the first index is ready in milliseconds
        instead of after the whole share. The epoch is fixed when iteration
        starts, as torch's samplers fix their list: a later ``set_epoch`` does not leak into
        an iterator already running."""
        view = self._cached(epoch, start)
        if view is not None:
            yield view, start
            return
        stop = _core.first_stop(
            self._n,
            self.num_replicas,
            self.rank,
            self.shuffle,
            self.drop_last,
            self._core_order,
            start,
        )
        if stop < self.num_samples:
            yield self._range(epoch, start, stop), start
            start = stop
        yield self._tail(epoch, start), start

    def indices(self) -> npt.NDArray[Any]:
        """This rank's indices of the current epoch not yet consumed, as a read-only numpy
        array (``uint32`` when the dataset has at most ``2**32`` samples, else ``int64``).

        "Consumed" is what :meth:`state_dict` reports as ``position``: after a whole iteration
        this is empty, while iterating again would repeat the epoch. A view of the buffer the
        Rust core filled: no copy is made.
        """
        return self._tail(self._epoch, self._position())

    def __iter__(self) -> Iterator[int]:
        start = self._pending if self._pending is not None else 0
        self._pending = self._pending_epoch = None
        cursor = _Cursor(start)
        self._cursor = cursor
        return _emit(self._segments(self._epoch, start), cursor)

    def __len__(self) -> int:
        """This rank's number of indices per epoch (torch's ``num_samples``)."""
        return self.num_samples

    # -- checkpoints ----------------------------------------------------------------------------

    def _config(self) -> dict[str, Any]:
        config = {
            "version": _STATE_VERSION,
            "order": self.order,
            "dataset_len": self._n,
            "shuffle": self.shuffle,
            "drop_last": self.drop_last,
            "seed": self.seed,
        }
        if self.order == "torch" and self.shuffle and self._n >= _core.TORCH_LARGE_N:
            # Only here do torch releases disagree; a resume must use the same variant.
            config["torch_randperm"] = self._core_order
        return config

    def state_dict(self) -> dict[str, Any]:
        """The checkpoint state: configuration, ``num_replicas``, ``rank``, ``epoch`` and
        ``position`` (this rank's indices of the epoch already consumed: handed out by the live
        iterator, or skipped).

        A new dict every call, O(1) in size; it does not change as iteration goes on.
        """
        return {
            **self._config(),
            "num_replicas": self.num_replicas,
            "rank": self.rank,
            "epoch": self._epoch,
            "position": self._position(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restores a :meth:`state_dict`: the next iteration continues with exactly the next index.

        The state is validated first: missing keys, wrong types, negative numbers, a position
        past the end of the epoch, or a different configuration (dataset length, seed, shuffle,
        drop_last or order; the message lists each difference) raise ``ValueError``
        (``TypeError`` for wrong types) and leave the sampler unchanged. Ranks move in lockstep,
        so a state saved on any rank loads on any rank. A state saved with a different
        ``num_replicas`` loads at an epoch boundary (position 0, or the end of the epoch);
        mid-epoch it is refused, since the remaining samples cannot yet be re-dealt.
        """
        state = check_state(
            state, ints=("num_replicas", "rank", "epoch", "position"), config=self._config()
        )
        epoch = check_int("state['epoch']", state["epoch"], 0, U64_MAX)
        saved_w = check_int("state['num_replicas']", state["num_replicas"], 1, MAX_LEN)
        check_int("state['rank']", state["rank"], 0, saved_w - 1)
        position = state["position"]
        saved_len = self.num_samples
        if saved_w != self.num_replicas:
            saved_len = _core.layout(self._n, saved_w, self.drop_last)[0]
        if position > saved_len:
            raise StateError(
                f"state['position'] must be in [0, {saved_len}] (indices per rank and epoch with "
                f"num_replicas={saved_w}), got {position}"
            )
        if saved_w != self.num_replicas:
            if 0 < position < saved_len:
                raise StateError(
                    f"state was saved mid-epoch (position {position} of {saved_len}) with "
                    f"num_replicas={saved_w}, this sampler has num_replicas={self.num_replicas}: "
                    "resuming mid-epoch on a different number of replicas is not supported; "
                    "resume from a checkpoint taken at an epoch boundary"
                )
            position = 0 if position == 0 else self.num_samples
        self.set_epoch(epoch)
        self._pending, self._pending_epoch = position, epoch
        self._cursor = None

    # -- pickling (DataLoader workers, multiprocessing) -----------------------------------------

    def __getstate__(self) -> dict[str, Any]:
        # Pickling (and copy.copy) is a checkpoint: the live iterator's position is frozen into a
        # pending start, and the cached epoch is recomputed on demand, never shipped.
        state = self.__dict__.copy()
        state["_cache"], state["_cache_start"] = None, 0
        state["_cursor"] = None
        if self._pending is None and self._cursor is not None:
            state["_pending"], state["_pending_epoch"] = self._cursor.position, self._epoch
        return state

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(dataset_len={self._n}, num_replicas={self.num_replicas}, "
            f"rank={self.rank}, shuffle={self.shuffle}, seed={self.seed}, "
            f"drop_last={self.drop_last}, order={self.order!r}, epoch={self._epoch})"
        )


def _emit(segments: Iterator[tuple[npt.NDArray[Any], int]], cursor: _Cursor) -> Iterator[int]:
    """Yields the indices of ``segments`` as Python ints, a chunk at a time."""
    for indices, offset in segments:
        while (chunk := cursor.next_chunk(indices, offset)) is not None:
            yield from chunk
