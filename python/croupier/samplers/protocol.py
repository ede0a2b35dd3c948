"""The resumable-sampler protocol: what :class:`croupier.StatefulDataLoader` and the trainer
integrations ask of a sampler to count, checkpoint and resume it exactly.

Every croupier sampler implements it (through the base, :class:`StatefulSampler`); a sampler of
your own that does too gets the loader's exact checkpoints (``docs/extending.md``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, Protocol, TypeVar, runtime_checkable

from croupier.samplers._base import Rest

__all__ = ["Rest", "Resumable"]

T_co = TypeVar("T_co", covariant=True)


@runtime_checkable
class Resumable(Protocol[T_co]):
    """A sampler whose epoch, position and state the loader can drive and read.

    Positions count this rank's items of an epoch (indices, or batches for a batch sampler)
    from 0, as ``len`` and ``state_dict()["position"]`` do; after an elastic load (a state of
    another number of ranks) they count on from the loaded position, and the epoch's rest in
    this world is :meth:`elastic_rest`."""

    epoch: int
    num_replicas: int
    rank: int

    def __iter__(self) -> Iterator[T_co]: ...

    def __len__(self) -> int:
        """The position the state records plus what the next iteration yields."""
        ...

    def set_epoch(self, epoch: int) -> None: ...

    def set_skip(self, skip: int) -> None:
        """The next iteration starts at position ``skip`` of the current epoch."""
        ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None: ...

    @property
    def epoch_length(self) -> int:
        """Items of a whole epoch on this rank of this world (what ``len`` is outside an
        elastic rest)."""
        ...

    def next_start(self) -> int:
        """The position the next iteration starts at: a pending :meth:`set_skip` or loaded
        position (or the start of an iterator that has handed out nothing yet), else the
        epoch's first position (:meth:`epoch_start`)."""
        ...

    def epoch_start(self, epoch: int) -> int:
        """Where an iteration of ``epoch`` starts when nothing is pending: 0, or after an
        elastic load the position its rest begins at."""
        ...

    def state_at(self, epoch: int, position: int) -> dict[str, Any]:
        """:meth:`state_dict` as it reads once ``position`` items of ``epoch`` are consumed (a
        loader whose workers prefetch saves the position training has reached)."""
        ...

    def elastic_rest(self, epoch: int) -> Rest | None:
        """The rest of ``epoch`` this world holds after an elastic load, or ``None``."""
        ...
