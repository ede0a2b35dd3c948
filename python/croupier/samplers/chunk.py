"""``ChunkSampler``: load requests of contiguous chunks for on-disk arrays (annbatch's protocol).

Arrays on disk (zarr, HDF5, AnnData, ``.npy``) are read fastest in contiguous slices. Each
epoch, the sampler shuffles the *chunks* of ``chunk_size`` observations, hands them out
``preload_nchunks`` at a time as one load request, and shuffles the loaded observations in
memory into batches. The plan (chunk order, each request's in-memory order, the dealing to
ranks) is computed by the Rust core (``croupier_core::chunk``); this class holds the
configuration, the epoch and the position.

A request is ``{"slices": [slice, ...], "splits": [array, ...]}``: the ranges to read, in
order, and the batches as integer positions into the concatenation of what they load.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from croupier import _core
from croupier._dist import DistInfo, resolve_ranks
from croupier._validate import MAX_LEN, U64_MAX, as_int, check_bool, check_int
from croupier.samplers._state import StateError, check_state

__all__ = ["ChunkSampler", "LoadRequest", "read_request"]

LoadRequest = dict[str, Any]
"""``{"slices": list[slice], "splits": list[numpy.ndarray]}``."""

_STATE_VERSION = 1


class ChunkSampler:
    """Chunked load requests for on-disk arrays, dealt to data-parallel ranks.

    Args:
        chunk_size: observations per chunk (a contiguous read).
        preload_nchunks: chunks per load request; ``chunk_size * preload_nchunks`` must be a
            multiple of ``batch_size`` (annbatch's rule), so only a rank's last request can end
            in a partial batch.
        batch_size: observations per batch.
        shuffle: shuffle the chunk order and each request's observations (seeded by ``seed``
            and the epoch); otherwise chunks and observations come in order.
        drop_last: every rank yields the smallest rank's whole batches (the rest is dropped);
            otherwise the largest rank's batches, the last possibly partial, a smaller rank
            padding its last request with repeats of that request's own observations.
        seed: non-negative integer below ``2**64``; ``None`` draws one at construction (it is
            part of the state, so a resume continues the same order).
        num_replicas, rank, dist_info: the ranks (see :class:`croupier.DistributedSampler`).
        mask: a ``slice`` of the observations to sample (annbatch's ``mask``); ``None`` is all.

    Ranks get disjoint chunk sets: the epoch's chunk order (the full chunks permuted by a
    permutation keyed by the seed and the epoch, the short last chunk, if any, at the end) is
    dealt like torch's ``DistributedSampler`` deals indices
    (rank ``r`` takes order positions ``r, r + W, ...``; ``drop_last`` cuts the order to a
    multiple of ``W``, otherwise its head is repeated), so every observation is read exactly
    once per epoch across ranks when nothing is padded or dropped.

    ``sample(n_obs)`` yields the current epoch's requests; as with torch's samplers, sampling
    again without :meth:`set_epoch` repeats the epoch. ``state_dict()`` records the epoch and
    the batches handed out (whole requests while iterating);
    ``state_dict(batches_consumed=k)`` records instead that only the first ``k`` batches of
    the latest request handed out were consumed. Any batch position loads: a resume starts at
    the request holding it, yielded with only its remaining batches, in O(1) in the epoch's
    size: each request is computed on its own from a keyed permutation of the chunk ids
    evaluated per position, so its first request costs ``preload_nchunks`` chunk ids and its
    own in-memory shuffle.

    Pickling and ``copy.deepcopy`` work at any time and act as a checkpoint, like croupier's
    other samplers: the copy has the same ``state_dict()``, and its next :meth:`sample`
    continues from the position reached (a pass in progress is not restarted). The plan built
    by the core is not copied; it is rebuilt on first use.
    """

    def __init__(
        self,
        chunk_size: int,
        preload_nchunks: int,
        batch_size: int,
        *,
        shuffle: bool = True,
        drop_last: bool = False,
        seed: int | None = None,
        num_replicas: int | None = None,
        rank: int | None = None,
        dist_info: DistInfo = None,
        mask: slice | None = None,
    ) -> None:
        self._chunk_size = check_int("chunk_size", chunk_size, 1, MAX_LEN)
        self._preload = check_int("preload_nchunks", preload_nchunks, 1, MAX_LEN)
        self._batch_size = check_int("batch_size", batch_size, 1, MAX_LEN)
        memory = self._chunk_size * self._preload
        if memory > U64_MAX:
            # The core computes request sizes in 64 bits: refuse now, not at the first sample().
            raise ValueError(
                f"chunk_size * preload_nchunks must be < 2**64, got {self._chunk_size} * "
                f"{self._preload} = {memory}"
            )
        if memory % self._batch_size:
            raise ValueError(
                f"chunk_size * preload_nchunks ({memory}) must be a multiple of batch_size "
                f"({self._batch_size})"
            )
        self._shuffle = check_bool("shuffle", shuffle)
        self._drop_last = check_bool("drop_last", drop_last)
        if seed is None:
            seed = int.from_bytes(os.urandom(8), "little")
        self._seed = check_int("seed", seed, 0, U64_MAX)
        self._num_replicas, self._rank = resolve_ranks(num_replicas, rank, dist_info)
        self._mask = _check_mask(mask)
        # (epoch, batches handed out or pending start, whether it is a pending start, where
        # the latest request handed out starts), replaced in one store so that a state read at
        # any instant is exact.
        self._at: tuple[int, int, bool, int] = (0, 0, False, 0)
        self._n_obs: int | None = None
        self._plans: dict[tuple[int, int], _core.ChunkPlan] = {}

    # -- configuration (read-only; mask is annbatch's settable one) ----------------------------

    @property
    def chunk_size(self) -> int:
        """Observations per chunk."""
        return self._chunk_size

    @property
    def preload_nchunks(self) -> int:
        """Chunks per load request."""
        return self._preload

    @property
    def batch_size(self) -> int:
        """Observations per batch."""
        return self._batch_size

    @property
    def shuffle(self) -> bool:
        """Whether chunks and in-memory observations are shuffled."""
        return self._shuffle

    @property
    def drop_last(self) -> bool:
        """Whether a rank drops what does not fill the common number of whole batches."""
        return self._drop_last

    @property
    def seed(self) -> int:
        """The seed of every shuffle."""
        return self._seed

    @property
    def num_replicas(self) -> int:
        """The number of ranks."""
        return self._num_replicas

    @property
    def rank(self) -> int:
        """This rank."""
        return self._rank

    @property
    def mask(self) -> slice:
        """The observations sampled, as a ``slice`` (``stop=None``: to the end)."""
        return slice(*self._mask)

    @mask.setter
    def mask(self, mask: slice | None) -> None:
        self._mask = _check_mask(mask)

    @property
    def epoch(self) -> int:
        """The epoch the next :meth:`sample` yields."""
        return self._at[0]

    def set_epoch(self, epoch: int) -> None:
        """Selects the epoch of the next :meth:`sample`. The epoch of a loaded state keeps
        its position; another epoch starts from its first request."""
        epoch = check_int("epoch", epoch, 0, U64_MAX)
        if epoch != self._at[0]:
            self._at = (epoch, 0, False, 0)

    # -- annbatch's protocol -------------------------------------------------------------------

    def _range(self, n_obs: int) -> tuple[int, int]:
        start, stop = self._mask
        stop = n_obs if stop is None else stop
        if stop > n_obs or start > stop:
            raise ValueError(
                f"mask {self.mask} does not fit n_obs={n_obs}: it must satisfy "
                f"start <= stop <= n_obs"
            )
        return start, stop

    def _plan(self, n_obs: int) -> _core.ChunkPlan:
        n_obs = check_int("n_obs", n_obs, 0, MAX_LEN)
        return self._plan_of(self._range(n_obs))

    def _plan_of(self, key: tuple[int, int]) -> _core.ChunkPlan:
        """The core's plan over observations ``[start, stop)`` (the latest one is kept)."""
        plan = self._plans.get(key)
        if plan is None:
            plan = _core.ChunkPlan(
                start=key[0],
                stop=key[1],
                chunk_size=self._chunk_size,
                preload=self._preload,
                batch_size=self._batch_size,
                shuffle=self._shuffle,
                drop_last=self._drop_last,
                seed=self._seed,
                num_replicas=self._num_replicas,
                rank=self._rank,
            )
            self._plans = {key: plan}
        return plan

    def validate(self, n_obs: int) -> None:
        """Raises ``ValueError`` (``TypeError`` for a non-integer) if this sampler cannot sample
        ``n_obs`` observations: a negative count, a mask outside it, or a loaded state of
        another ``n_obs``."""
        self._plan(n_obs)
        if self._n_obs is not None and self._at[2] and self._n_obs != n_obs:
            raise ValueError(
                f"the loaded state was saved with n_obs={self._n_obs}, sampling n_obs={n_obs}: "
                "the data changed since the checkpoint"
            )

    def n_iters(self, n_obs: int) -> int:
        """Batches this rank yields per epoch over ``n_obs`` observations (the same on every
        rank)."""
        return int(self._plan(n_obs).batches)

    n_batches = n_iters

    def sample(self, n_obs: int) -> Iterator[LoadRequest]:
        """Validates, then yields the current epoch's load requests over ``n_obs``
        observations, from the loaded or pending position on."""
        self.validate(n_obs)
        return self._sample(n_obs)

    def _sample(self, n_obs: int) -> Iterator[LoadRequest]:
        plan = self._plan(n_obs)
        epoch, at, pending, _ = self._at
        start = at if pending else 0
        self._n_obs = n_obs
        per_request = int(plan.batches_per_request)
        total = int(plan.batches)
        self._at = (epoch, start, False, start)
        if start >= total:
            return
        # Each request is computed on its own (the chunk order is evaluated per position), so
        # a resume at request j does O(preload) work before its first request, whatever the
        # epoch's size.
        first = start // per_request
        skip = start - first * per_request
        for j in range(first, int(plan.requests)):
            starts, stops, positions, offsets = plan.request(epoch, j)
            slices = [slice(a, b) for a, b in zip(starts.tolist(), stops.tolist(), strict=True)]
            cuts = offsets[1:-1].astype(np.intp)
            splits = np.split(positions, cuts)[skip:]
            first = j * per_request + skip  # the position of this request's first batch
            skip = 0
            done = min((j + 1) * per_request, total)
            self._at = (epoch, done, False, first)  # handed out, in one store
            yield {"slices": slices, "splits": splits}

    # -- checkpoints ---------------------------------------------------------------------------

    def _config(self) -> dict[str, Any]:
        start, stop = self._mask
        return {
            "version": _STATE_VERSION,
            "chunk_size": self._chunk_size,
            "preload_nchunks": self._preload,
            "batch_size": self._batch_size,
            "shuffle": self._shuffle,
            "drop_last": self._drop_last,
            "seed": self._seed,
            "mask_start": start,
            "mask_stop": -1 if stop is None else stop,
        }

    def state_dict(self, batches_consumed: int | None = None) -> dict[str, Any]:
        """The configuration, ``num_replicas``, ``rank``, ``epoch``, ``position`` (batches of
        the epoch consumed) and ``n_obs`` (of the latest :meth:`sample`, ``-1`` before one).
        JSON-serialisable, exact at any instant.

        Args:
            batches_consumed: how many batches (``splits``) of the latest load request handed
                out have been consumed, in ``[0, len(request["splits"])]``. ``None`` (the
                default): all of them, so ``position`` counts whole requests while iterating.
                With ``k``, the state is the one to resume after the request's ``k``-th batch:
                loading it yields that request again with only its batches from ``k`` on (its
                ``slices`` unchanged), then the rest of the epoch. Before a request is handed
                out (or after :meth:`load_state_dict` or :meth:`set_epoch`) only ``0`` is
                accepted, which gives the same state as ``None``.

        Raises:
            TypeError: ``batches_consumed`` is not an integer.
            ValueError: ``batches_consumed`` is outside that range.
        """
        epoch, at, _, first = self._at
        if batches_consumed is not None:
            k = as_int("batches_consumed", batches_consumed)
            if not 0 <= k <= at - first:
                raise ValueError(
                    f"batches_consumed must be in [0, {at - first}] (the batches of the latest "
                    f"load request handed out), got {k}"
                )
            at = first + k
        return {
            **self._config(),
            "num_replicas": self._num_replicas,
            "rank": self._rank,
            "epoch": epoch,
            "position": at,
            "n_obs": -1 if self._n_obs is None else self._n_obs,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restores a :meth:`state_dict`: the next :meth:`sample` starts at its ``position``
        (any batch: the request holding it is yielded without the batches before it). A state
        of another configuration or world size is refused (``ValueError`` naming each
        difference), as is one whose ``position`` is past the epoch's batches for its ``n_obs``
        (or not ``0`` when ``n_obs`` is ``-1``: nothing was sampled before it was saved) or
        whose ``rank`` is not in ``[0, num_replicas - 1]``, and nothing changes."""
        if not isinstance(state, Mapping):
            raise TypeError(f"state must be a mapping (a state_dict()), got {type(state).__name__}")
        config = {**self._config(), "num_replicas": self._num_replicas}
        native = check_state(state, ints=("epoch", "position", "rank"), config=config)
        epoch = check_int("state['epoch']", native["epoch"], 0, U64_MAX)
        check_int("state['rank']", native["rank"], 0, self._num_replicas - 1)
        position = native["position"]
        n_obs = check_int("state['n_obs']", state.get("n_obs", -1), -1, MAX_LEN)
        if n_obs >= 0:
            total = int(self._plan(n_obs).batches)
            if position > total:
                raise StateError(
                    f"state['position'] must be in [0, {total}] (batches per epoch), got {position}"
                )
        elif position != 0:
            # A state records n_obs from its first sample() on: before one, nothing was handed out.
            raise StateError(
                f"state['position'] must be in [0, 0] when state['n_obs'] is -1 (saved before any "
                f"sample()), got {position}"
            )
        self._n_obs = None if n_obs < 0 else n_obs
        self._at = (epoch, position, True, position)

    def _restart(self) -> None:
        """Forgets the position and ``n_obs``: the next :meth:`sample` starts the current epoch
        (for a wrapper that changes the range sampled, which positions are counted in)."""
        self._n_obs = None
        self._at = (self._at[0], 0, False, 0)

    def __getstate__(self) -> dict[str, Any]:
        # Pickling (and copy.deepcopy) is a checkpoint, as for croupier's other samplers: the
        # core's plan is not picklable and is rebuilt on demand, and a pass in progress becomes
        # a pending start at the position it reached, so the copy continues it.
        state = self.__dict__.copy()
        state["_plans"] = {}
        epoch, at, pending, first = self._at
        if not pending and at > 0:
            state["_at"] = (epoch, at, True, first)
        return state

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(chunk_size={self._chunk_size}, preload_nchunks="
            f"{self._preload}, batch_size={self._batch_size}, shuffle={self._shuffle}, "
            f"drop_last={self._drop_last}, seed={self._seed}, num_replicas={self._num_replicas}, "
            f"rank={self._rank}, epoch={self._at[0]}, position={self._at[1]})"
        )


def _check_mask(mask: object) -> tuple[int, int | None]:
    if mask is None:
        return 0, None
    if not isinstance(mask, slice):
        raise TypeError(f"mask must be a slice or None, got {type(mask).__name__}")
    if mask.step not in (None, 1):
        raise ValueError(f"mask must be contiguous (step None or 1), got step {mask.step}")
    start = 0 if mask.start is None else check_int("mask.start", mask.start, 0, MAX_LEN)
    stop = None if mask.stop is None else check_int("mask.stop", mask.stop, 0, MAX_LEN)
    if stop is not None and start > stop:
        raise ValueError(f"mask.start must be <= mask.stop, got {mask}")
    return start, stop


def read_request(array: Any, request: LoadRequest) -> list[npt.NDArray[Any]]:
    """Reads a load request from an array (a ``numpy.memmap``, a zarr or HDF5 array, anything
    sliced along its first axis): each slice once, contiguously, then the batches gathered
    from the loaded rows in memory."""
    loaded = np.concatenate([np.asarray(array[s]) for s in request["slices"]])
    return [loaded[split] for split in request["splits"]]
