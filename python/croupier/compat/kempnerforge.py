"""kempnerforge's data API (``kempnerforge.data``, seed files 000 and 001) on croupier:
``from croupier.compat.kempnerforge import ...`` in place of ``from kempnerforge.data import
...``, with kempnerforge's names, signatures and defaults.

- :class:`DistributedSampler`: kempnerforge's defaults (``drop_last=True``) and, by default,
  its order (torch's ``DistributedSampler`` order, which kempnerforge's sampler yields; pass
  ``order="per_rank"`` or ``"global"`` for croupier's O(N/W) orders); its states load here and
  carry the keys kempnerforge reads (``epoch, seed, num_replicas, rank``), plus croupier's position.
- :class:`MixtureSampler`: croupier's, with ``order="per_rank"`` by default: kempnerforge's
  epoch length (the sum of the datasets' shares per rank) and exact per-dataset counts on every
  rank; where kempnerforge raises ``ZeroDivisionError`` or ``IndexError`` on bad arguments, its
  ``ValueError`` is also of that type.
- :class:`MemoryMappedDataset`, :class:`HuggingFaceDataset`: croupier's classes, which already
  have kempnerforge's signatures.
- :class:`StatefulDataLoader`: kempnerforge's loader defaults (``DataConfig()``: 4 workers,
  pinned memory, prefetch factor 2; persistent workers; ``drop_last=True``; a kempnerforge
  ``DistributedSampler`` when none is given), resuming exactly where kempnerforge's own loader
  can start several batches late (the batches its workers had prefetched).
- :class:`DataConfig`: the fields of kempnerforge's ``DataConfig`` the loader reads.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from croupier._dist import DistInfo, implied_rank
from croupier.datasets import HuggingFaceDataset, MemoryMappedDataset
from croupier.loader import StatefulDataLoader as _Loader
from croupier.samplers.distributed import DistributedSampler as _Sampler
from croupier.samplers.mixture import MixtureSampler as _Mixture

__all__ = [
    "DataConfig",
    "DistributedSampler",
    "HuggingFaceDataset",
    "IndexValueError",
    "MemoryMappedDataset",
    "MixtureSampler",
    "StatefulDataLoader",
    "ZeroDivisionValueError",
]


@dataclass
class DataConfig:
    """The loader fields of kempnerforge's ``DataConfig``, with its defaults (any object with
    these attributes, kempnerforge's own ``DataConfig`` included, works as ``config``)."""

    num_workers: int = 4
    pin_memory: bool = True
    prefetch_factor: int = 2


class DistributedSampler(_Sampler):
    """kempnerforge's ``DistributedSampler`` (signature and defaults: ``drop_last=True``),
    computed by croupier; ``order="torch"`` (the indices kempnerforge's sampler yields) unless
    told otherwise. See :class:`croupier.DistributedSampler`."""

    def __init__(
        self,
        dataset: Any,
        num_replicas: int | None = None,
        rank: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = True,
        *,
        order: str = "torch",
        dist_info: DistInfo = None,
        torch_version: str | None = None,
    ) -> None:
        rank = implied_rank(num_replicas, rank, dist_info)  # kempnerforge's: else rank 0
        super().__init__(
            dataset,
            num_replicas,
            rank,
            shuffle,
            seed,
            drop_last,
            order=order,
            dist_info=dist_info,
            torch_version=torch_version,
        )


class MixtureSampler(_Mixture):
    """kempnerforge's ``MixtureSampler`` (its signature and defaults), computed by croupier;
    ``order="per_rank"`` unless told otherwise, which keeps kempnerforge's epoch length (the sum of
    the datasets' shares per rank) and its exact per-dataset counts on every rank. See
    :class:`croupier.MixtureSampler`."""

    def __init__(
        self,
        cumulative_sizes: Any,
        weights: Any,
        num_replicas: int | None = None,
        rank: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = True,
        temperature: float = 1.0,
        *,
        num_samples: int | None = None,
        dist_info: DistInfo = None,
        order: str = "per_rank",
        interleave: str = "uniform",
    ) -> None:
        rank = implied_rank(num_replicas, rank, dist_info)  # kempnerforge's: else rank 0
        try:
            super().__init__(
                cumulative_sizes,
                weights,
                num_replicas,
                rank,
                shuffle,
                seed,
                drop_last,
                temperature,
                num_samples=num_samples,
                dist_info=dist_info,
                order=order,
                interleave=interleave,
            )
        except ValueError as e:
            # Where kempnerforge's sampler raises ZeroDivisionError or IndexError, so does
            # this ValueError: code written against it keeps its except clauses.
            kind = _kempnerforge_kind(cumulative_sizes, weights, temperature, num_replicas)
            if kind is None or isinstance(e, kind) or str(e).startswith(("order", "interleave")):
                raise  # (croupier's own keywords, which kempnerforge has not, stay as they are)
            raise kind(*e.args) from None

    def update_weights(
        self, weights: Sequence[float] | npt.NDArray[Any], temperature: float = 1.0
    ) -> None:
        """kempnerforge's ``update_weights``: :meth:`croupier.MixtureSampler.update_weights`,
        its refusals of the arguments kempnerforge fails on raised with kempnerforge's
        exception types too."""
        try:
            super().update_weights(weights, temperature)
        except ValueError as e:
            kind = _kempnerforge_kind(self.cumulative_sizes, weights, temperature, update=True)
            if kind is None or isinstance(e, kind):
                raise
            raise kind(*e.args) from None


# -- kempnerforge's exception types ------------------------------------------------------------
# Where kempnerforge's MixtureSampler raises ZeroDivisionError or IndexError on bad arguments,
# this module's refuses them with croupier's ValueError that is also of kempnerforge's type,
# so except clauses written for kempnerforge still catch it.


class ZeroDivisionValueError(ValueError, ZeroDivisionError):
    """Refused input on which kempnerforge's ``MixtureSampler`` raises ``ZeroDivisionError``
    (weights summing to 0, ``temperature=0``, ``num_replicas=0``): a ``ValueError`` with
    croupier's message that ``except ZeroDivisionError`` clauses written for it still catch."""


class IndexValueError(ValueError, IndexError):
    """Refused input on which kempnerforge's ``MixtureSampler`` raises ``IndexError`` (empty
    or too few weights): a ``ValueError`` that ``except IndexError`` clauses still catch."""


def _kempnerforge_kind(
    cumulative_sizes: object,
    weights: object,
    temperature: object,
    num_replicas: object = None,
    *,
    update: bool = False,
) -> type[ValueError] | None:
    """The exception type to raise where kempnerforge's ``MixtureSampler`` raises
    ``ZeroDivisionError`` or ``IndexError`` on these arguments (``None`` where it raises
    something else or nothing), found by following its documented arithmetic in its order:
    at temperature 1 it divides every weight by their sum, otherwise every log-weight by the
    temperature and then takes their maximum; then it divides every dataset's size by
    ``num_replicas``; then it reads one probability per dataset (rounding a NaN one first).
    ``update=True``: ``update_weights``, which first refuses a wrong count with ``ValueError``.
    """
    try:
        datasets = len(cumulative_sizes) - 1  # type: ignore[arg-type]
        arr = np.asarray(weights, dtype=np.float64)
    except (TypeError, ValueError):
        return None
    if arr.ndim != 1 or isinstance(temperature, (bool, np.bool_)):
        return None
    if not isinstance(temperature, numbers.Real):
        return None
    ws = arr.tolist()
    if update and len(ws) != datasets:
        return None
    if float(temperature) != 1.0:
        if not ws:
            return None  # max() of no log-weights: ValueError
        if float(temperature) == 0.0:
            return ZeroDivisionValueError
    elif ws and sum(ws) == 0:
        return ZeroDivisionValueError
    if not update and not isinstance(num_replicas, (bool, np.bool_)) and num_replicas == 0:
        return ZeroDivisionValueError
    if len(ws) < datasets and all(map(math.isfinite, ws)) and not math.isnan(temperature):
        return IndexValueError  # (NaN probabilities fail their rounding first)
    return None


class StatefulDataLoader(_Loader):
    """kempnerforge's ``StatefulDataLoader(dataset, batch_size, sampler=None, config=None)``:
    ``config`` defaults to :class:`DataConfig` (4 workers, pinned memory, prefetch factor 2),
    workers persist across epochs, the last partial batch is dropped, and without a sampler it
    deals with a kempnerforge :class:`DistributedSampler` over the process group. Keyword
    arguments set any other ``DataLoader`` option. See :class:`croupier.StatefulDataLoader`."""

    def __init__(
        self,
        dataset: Any,
        batch_size: int,
        sampler: Any = None,
        config: Any = None,
        **dataloader_kwargs: Any,
    ) -> None:
        config = DataConfig() if config is None else config
        workers = dataloader_kwargs.get("num_workers", getattr(config, "num_workers", 0))
        if isinstance(config, dict):
            workers = dataloader_kwargs.get("num_workers", config.get("num_workers", 0))
        defaults: dict[str, Any] = {"persistent_workers": bool(workers), "drop_last": True}
        if sampler is None and dataloader_kwargs.get("batch_sampler") is None:
            sampler = DistributedSampler(dataset)
        super().__init__(dataset, batch_size, sampler, config, **{**defaults, **dataloader_kwargs})
