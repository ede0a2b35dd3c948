"""annbatch's chunk samplers (``annbatch.samplers``, seed file 002) on croupier:
``from croupier.compat.annbatch import RandomSampler, DistributedSampler``.

- :class:`RandomSampler` ``(chunk_size, preload_nchunks, batch_size, *, drop_last=False,
  mask=None, rng=None)``: shuffled chunks and in-memory batches over the ``mask`` range, a new
  shuffle at every :meth:`~RandomSampler.sample` call, as annbatch's generator gives; the order
  comes from croupier's seeded streams, with the seed drawn from ``rng`` (a
  ``numpy.random.Generator``) once, at construction.
- :class:`DistributedSampler` ``(sampler, *, dist_info, enforce_equal_batches=True)``:
  annbatch's contiguous shards, ``n_obs // world_size`` observations per rank (rounded down to a
  multiple of ``batch_size`` by default, so every rank yields the same number of batches),
  given as its ``mask`` to the wrapper's own copy of the sampler (as annbatch does: the
  sampler passed in is never changed, so several wrappers of one sampler are independent).

Load requests carry the slices under annbatch's keys of both its releases, ``"requests"``
(0.2 on) and ``"chunks"`` (before), with ``"splits"``. Beyond annbatch: ``state_dict`` (also
mid-request, with ``batches_consumed``), ``load_state_dict`` and pickling (annbatch has no
checkpointing). Not here: annbatch's sampling with replacement, ``num_samples``, and its
sharding of requests across DataLoader workers.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np

from croupier._dist import resolve_ranks
from croupier._validate import MAX_LEN, check_bool, check_int
from croupier.samplers.chunk import ChunkSampler, LoadRequest

__all__ = ["DistributedSampler", "RandomSampler"]


def _annbatch_request(request: LoadRequest) -> LoadRequest:
    slices = request["slices"]
    return {"requests": slices, "chunks": slices, "splits": request["splits"]}


class RandomSampler(ChunkSampler):
    """annbatch's ``RandomSampler``: see the module documentation.

    Each :meth:`sample` call after a finished pass samples the next epoch. :meth:`set_epoch`
    and :meth:`load_state_dict` choose what the next call samples (a loaded state saved at the
    end of a pass continues with the next epoch).
    """

    def __init__(
        self,
        chunk_size: int,
        preload_nchunks: int,
        batch_size: int,
        *,
        drop_last: bool = False,
        mask: slice | None = None,
        rng: np.random.Generator | None = None,
    ) -> None:
        if rng is not None and not isinstance(rng, np.random.Generator):
            raise TypeError(f"rng must be a numpy.random.Generator, got {type(rng).__name__}")
        self.rng = rng if rng is not None else np.random.default_rng()
        seed = int(self.rng.integers(0, 2**63))
        super().__init__(
            chunk_size,
            preload_nchunks,
            batch_size,
            shuffle=True,
            drop_last=drop_last,
            seed=seed,
            num_replicas=1,
            rank=0,
            mask=mask,
        )
        self._finished = False

    def set_epoch(self, epoch: int) -> None:
        """Selects the epoch of the next :meth:`sample` (instead of the one after the pass
        just finished)."""
        super().set_epoch(epoch)
        self._finished = False

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restores a :meth:`state_dict` (see :meth:`ChunkSampler.load_state_dict`); the next
        :meth:`sample` continues from it, or starts the next epoch if it marks a finished
        pass."""
        super().load_state_dict(state)
        self._finished = False

    def _sample(self, n_obs: int) -> Iterator[LoadRequest]:
        # annbatch draws a new order from its generator at every call: the next epoch here,
        # after a pass finished here or one a loaded state (or a pickled copy) marks as done.
        epoch, at, pending, _ = self._at
        if self._finished or (pending and 0 < int(self._plan(n_obs).batches) <= at):
            self.set_epoch(epoch + 1)
        self._finished = False
        for request in super()._sample(n_obs):
            yield _annbatch_request(request)
        self._finished = True


class DistributedSampler:
    """annbatch's ``DistributedSampler(sampler, *, dist_info, enforce_equal_batches=True)``:
    contiguous shards of the observations, one per rank; see the module documentation.

    ``sampler`` must have ``num_replicas == 1`` (the wrapper does the sharding; a sampler that
    already deals to ranks is refused with ``ValueError``). The wrapper samples with its own
    copy of ``sampler`` (made at construction, as annbatch
    does), started at the beginning of ``sampler``'s current epoch, over the whole range (the
    copy's ``mask`` becomes this rank's shard once ``n_obs`` is known; ``sampler``'s own mask is
    ignored). ``sampler`` itself is left unchanged, so changes made to it afterwards do not
    reach the wrapper: use the wrapper's :meth:`set_epoch`, :meth:`state_dict` and
    :meth:`load_state_dict`. A state records this rank's shard, so it loads into a wrapper of
    the same rank and world size.
    """

    def __init__(
        self,
        sampler: ChunkSampler,
        *,
        dist_info: str | Callable[[], tuple[int, int]],
        enforce_equal_batches: bool = True,
    ) -> None:
        if not isinstance(sampler, ChunkSampler):
            raise TypeError(
                f"sampler must be a croupier ChunkSampler (such as RandomSampler), got "
                f"{type(sampler).__name__}"
            )
        if sampler.num_replicas > 1:
            # The sampler already deals its chunks to ranks: sharding again would leave each
            # rank with a part of its shard, and most observations with no rank.
            raise ValueError(
                f"sampler has num_replicas={sampler.num_replicas}: DistributedSampler shards "
                "the data itself, so pass a sampler of num_replicas=1 (such as RandomSampler)"
            )
        if not (callable(dist_info) or dist_info in ("torch", "jax")):
            raise ValueError(
                f"Unknown dist_info {dist_info!r}. Supported backends: ['jax', 'torch']"
            )
        # The one place dist_info results are checked (integers, numpy's included, not bool;
        # 0 <= rank < world_size), as for every croupier sampler.
        world, rank = resolve_ranks(None, None, dist_info)
        self._rank, self._world_size = rank, world
        self._enforce_equal_batches = check_bool("enforce_equal_batches", enforce_equal_batches)
        # A copy: the shard is set as its mask, which must not reach the caller's sampler (or
        # another wrapper of it). Positions count batches of the range sampled, so the copy
        # starts its epoch afresh on the whole range.
        self._sampler = copy.deepcopy(sampler)
        self._sampler.mask = None
        self._sampler._restart()

    @property
    def batch_size(self) -> int:
        """The wrapped sampler's batch size."""
        return self._sampler.batch_size

    @property
    def shuffle(self) -> bool:
        """Whether the wrapped sampler shuffles."""
        return self._sampler.shuffle

    @property
    def rng(self) -> Any:
        """The wrapped sampler's generator (if it has one)."""
        return getattr(self._sampler, "rng", None)

    @property
    def mask(self) -> slice:
        """The observation range sampled: this rank's shard once :meth:`sample`,
        :meth:`validate` or :meth:`load_state_dict` knows ``n_obs`` (before, the whole
        range)."""
        return self._sampler.mask

    @property
    def epoch(self) -> int:
        """The epoch the next :meth:`sample` yields."""
        return self._sampler.epoch

    def set_epoch(self, epoch: int) -> None:
        """Selects the epoch of the next :meth:`sample` (see the wrapped sampler's
        ``set_epoch``)."""
        self._sampler.set_epoch(epoch)

    def _shard(self, n_obs: int) -> tuple[int, int]:
        """This rank's observations ``[start, stop)`` of ``n_obs``."""
        n_obs = check_int("n_obs", n_obs, 0, MAX_LEN)
        per_rank = n_obs // self._world_size
        if self._enforce_equal_batches:
            per_rank -= per_rank % self._sampler.batch_size
        start = self._rank * per_rank
        return start, start + per_rank

    def n_iters(self, n_obs: int) -> int:
        """Batches this rank yields over ``n_obs`` observations."""
        return int(self._sampler._plan_of(self._shard(n_obs)).batches)

    n_batches = n_iters

    def validate(self, n_obs: int) -> None:
        """Raises ``ValueError`` if the wrapped sampler cannot sample this rank's shard of
        ``n_obs`` observations (which becomes :attr:`mask` otherwise)."""
        shard = self._shard(n_obs)
        mask = self._sampler.mask
        self._sampler.mask = slice(*shard)
        try:
            self._sampler.validate(n_obs)
        except BaseException:
            self._sampler.mask = mask  # refused: nothing changes
            raise

    def sample(self, n_obs: int) -> Iterator[LoadRequest]:
        """This rank's load requests over its shard of ``n_obs`` observations."""
        self.validate(n_obs)
        return self._sampler._sample(n_obs)

    def state_dict(self, batches_consumed: int | None = None) -> dict[str, Any]:
        """The state of this rank's sampling, as :meth:`ChunkSampler.state_dict` (with
        ``batches_consumed`` of the latest request)."""
        return self._sampler.state_dict(batches_consumed)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restores a :meth:`state_dict` of a wrapper of the same rank and world size (a state
        of another shard is refused with ``ValueError``). A state saved before any
        :meth:`sample` (``n_obs == -1``) loads at any time: it is the start of its epoch."""
        if not isinstance(state, Mapping):
            raise TypeError(f"state must be a mapping (a state_dict()), got {type(state).__name__}")
        n_obs = check_int("state['n_obs']", state.get("n_obs", -1), -1)
        mask = self._sampler.mask
        if n_obs >= 0:
            # The state's mask is the shard of its n_obs: compare it with this rank's.
            self._sampler.mask = slice(*self._shard(n_obs))
        elif state.get("mask_start") == 0 and state.get("mask_stop") == -1:
            # Saved before any sample() (the start of training): the whole range, as a fresh
            # wrapper's; the next sample() sets this rank's shard again.
            self._sampler.mask = None
        try:
            self._sampler.load_state_dict(state)
        except BaseException:
            self._sampler.mask = mask  # a refused state changes nothing
            raise
