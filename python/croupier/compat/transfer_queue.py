"""TransferQueue's names: ``from croupier.compat.transfer_queue import RankAwareSampler`` in
place of ``transfer_queue.sampler.RankAwareSampler``.

When TransferQueue is installed the class also subclasses its ``BaseSampler`` (its controller
accepts nothing else); it returns exactly what TransferQueue's ``RankAwareSampler`` returns,
call for call, and reads and writes its checkpoints.
"""

from __future__ import annotations

from typing import Any

from croupier.samplers.rank_aware import RankAwareSampler as _Sampler

__all__ = ["RankAwareSampler"]

try:  # TransferQueue is optional
    from transfer_queue.sampler import BaseSampler as _Base  # type: ignore[import-not-found]
except ImportError:  # pragma: no cover - depends on what is installed
    _Base = object


class RankAwareSampler(_Sampler, _Base):  # type: ignore[misc]
    """TransferQueue's ``RankAwareSampler`` (no arguments), computed by croupier: thread-safe,
    with ``group_size``, ``shuffle`` and ``seed`` available as keywords (see
    :class:`croupier.RankAwareSampler`)."""

    def __init__(self, **kwargs: Any) -> None:
        _Sampler.__init__(self, **kwargs)
