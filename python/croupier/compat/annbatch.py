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
  given to the wrapped sampler as its ``mask``.

Load requests carry the slices under annbatch's keys of both its releases, ``"requests"``
(0.2 on) and ``"chunks"`` (before), with ``"splits"``. Beyond annbatch: ``state_dict`` and
``load_state_dict`` (annbatch has no checkpointing). Not here: annbatch's sampling with
replacement, ``num_samples``, and its sharding of requests across DataLoader workers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np

from croupier._validate import check_bool
from croupier.samplers.chunk import ChunkSampler, LoadRequest

__all__ = ["DistributedSampler", "RandomSampler"]


def _annbatch_request(request: LoadRequest) -> LoadRequest:
    slices = request["slices"]
    return {"requests": slices, "chunks": slices, "splits": request["splits"]}


class RandomSampler(ChunkSampler):
    """annbatch's ``RandomSampler``: see the module documentation."""

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

    def _sample(self, n_obs: int) -> Iterator[LoadRequest]:
        # annbatch draws a new order from its generator at every call: the next epoch here.
        if self._finished:
            self.set_epoch(self.epoch + 1)
        self._finished = False
        for request in super()._sample(n_obs):
            yield _annbatch_request(request)
        self._finished = True


class DistributedSampler:
    """annbatch's ``DistributedSampler(sampler, *, dist_info, enforce_equal_batches=True)``:
    contiguous shards of the observations, one per rank; see the module documentation."""

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
        if callable(dist_info):
            rank, world = dist_info()
        elif dist_info in ("torch", "jax"):
            from croupier._dist import resolve_ranks

            world, rank = resolve_ranks(None, None, dist_info)
        else:
            raise ValueError(
                f"Unknown dist_info {dist_info!r}. Supported backends: ['jax', 'torch']"
            )
        if not (isinstance(world, int) and isinstance(rank, int) and 0 <= rank < world):
            raise ValueError(f"dist_info gave rank {rank!r} of world size {world!r}")
        self._rank, self._world_size = rank, world
        self._enforce_equal_batches = check_bool("enforce_equal_batches", enforce_equal_batches)
        self._sampler = sampler

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
        """The wrapped sampler's observation range (this rank's shard once ``n_obs`` is known)."""
        return self._sampler.mask

    def _shard(self, n_obs: int) -> None:
        per_rank = n_obs // self._world_size
        if self._enforce_equal_batches:
            per_rank -= per_rank % self._sampler.batch_size
        start = self._rank * per_rank
        self._sampler.mask = slice(start, start + per_rank)

    def n_iters(self, n_obs: int) -> int:
        """Batches this rank yields over ``n_obs`` observations."""
        self._shard(n_obs)
        return self._sampler.n_iters(n_obs)

    n_batches = n_iters

    def validate(self, n_obs: int) -> None:
        """Raises ``ValueError`` if the wrapped sampler cannot sample this rank's shard."""
        self._shard(n_obs)
        self._sampler.validate(n_obs)

    def sample(self, n_obs: int) -> Iterator[LoadRequest]:
        """This rank's load requests over its shard of ``n_obs`` observations."""
        self.validate(n_obs)
        return self._sampler._sample(n_obs)

    def state_dict(self) -> dict[str, Any]:
        """The wrapped sampler's state."""
        return self._sampler.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restores the wrapped sampler's state."""
        self._sampler.load_state_dict(state)
