"""croupier: fast, reproducible, resumable index samplers for PyTorch training.

The Rust core (``croupier._core``) shuffles, deals and batches sample indices over contiguous
buffers and hands them to Python as numpy arrays without a copy; the classes here wrap them as
``torch.utils.data`` samplers with checkpoint state. Importing croupier needs only numpy; the
samplers subclass ``torch.utils.data.Sampler`` when torch is installed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from croupier._core import __version__
from croupier._lazy import lazy_names
from croupier._permutation import permutation

if TYPE_CHECKING:
    from croupier.datasets import HuggingFaceDataset, MemoryMappedDataset
    from croupier.loader import StatefulDataLoader
    from croupier.samplers import (
        BucketBatchSampler,
        ChunkSampler,
        DistributedSampler,
        MixtureSampler,
        RankAwareSampler,
        SequentialBucketSampler,
        StateError,
    )

__all__ = [
    "BucketBatchSampler",
    "ChunkSampler",
    "DistributedSampler",
    "HuggingFaceDataset",
    "MemoryMappedDataset",
    "MixtureSampler",
    "RankAwareSampler",
    "SequentialBucketSampler",
    "StateError",
    "StatefulDataLoader",
    "__version__",
    "permutation",
]

# The samplers subclass torch's Sampler, so importing them imports torch (seconds) when it is
# installed: they load on first use, and `croupier --help` or `croupier.permutation` never pay it.
_LAZY = {
    "BucketBatchSampler": "croupier.samplers",
    # Neither a torch Sampler: they never import torch.
    "ChunkSampler": "croupier.samplers.chunk",
    "DistributedSampler": "croupier.samplers",
    "HuggingFaceDataset": "croupier.datasets",
    "MemoryMappedDataset": "croupier.datasets",
    "MixtureSampler": "croupier.samplers",
    "RankAwareSampler": "croupier.samplers.rank_aware",
    "SequentialBucketSampler": "croupier.samplers",
    "StateError": "croupier.samplers._state",
    "StatefulDataLoader": "croupier.loader",
}


__getattr__, __dir__ = lazy_names("croupier", globals(), _LAZY)
