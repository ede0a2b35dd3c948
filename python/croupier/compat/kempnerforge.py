"""kempnerforge's data API (``kempnerforge.data``, seed files 000 and 001) on croupier:
``from croupier.compat.kempnerforge import ...`` in place of ``from kempnerforge.data import
...``, with kempnerforge's names, signatures and defaults.

- :class:`DistributedSampler`: kempnerforge's defaults (``drop_last=True``) and, by default,
  its order (torch's ``DistributedSampler`` order, which kempnerforge's sampler yields; pass
  ``order="fast"`` for croupier's O(N/W) order); its states load here and carry the keys
  kempnerforge reads (``epoch, seed, num_replicas, rank``), plus croupier's position.
- :class:`MixtureSampler`: croupier's, with ``order="fast"`` by default: kempnerforge's epoch
  length (the sum of the datasets' shares per rank) and exact per-dataset counts on every rank.
- :class:`MemoryMappedDataset`, :class:`HuggingFaceDataset`: croupier's classes, which already
  have kempnerforge's signatures.
- :class:`StatefulDataLoader`: kempnerforge's loader defaults (``DataConfig()``: 4 workers,
  pinned memory, prefetch factor 2; persistent workers; ``drop_last=True``; a kempnerforge
  ``DistributedSampler`` when none is given), resuming exactly where kempnerforge's own loader
  can start several batches late (the batches its workers had prefetched).
- :class:`DataConfig`: the fields of kempnerforge's ``DataConfig`` the loader reads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from croupier._dist import DistInfo
from croupier.datasets import HuggingFaceDataset, MemoryMappedDataset
from croupier.loader import StatefulDataLoader as _Loader
from croupier.samplers.distributed import DistributedSampler as _Sampler
from croupier.samplers.mixture import MixtureSampler as _Mixture

__all__ = [
    "DataConfig",
    "DistributedSampler",
    "HuggingFaceDataset",
    "MemoryMappedDataset",
    "MixtureSampler",
    "StatefulDataLoader",
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
    ``order="fast"`` unless told otherwise, which keeps kempnerforge's epoch length (the sum of
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
        order: str = "fast",
        interleave: str = "uniform",
    ) -> None:
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
