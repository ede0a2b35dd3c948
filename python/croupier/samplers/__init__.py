"""croupier's ``torch.utils.data`` samplers, all on one base that owns epoch, position,
checkpoint state and pickling.

To write a sampler of your own, subclass :class:`IndexSampler` (it yields ints) or
:class:`BatchSampler` (it yields lists of ints, computed as :class:`Batches`), check its
arguments with :func:`check_int`, :func:`check_bool` and :func:`dataset_length`, and find its
ranks with :func:`resolve_ranks`; a sampler with state keys of its own checks them in
``_prepare_load`` (given a :class:`Loaded`), and it loads foreign state shapes as
:class:`StateFormat` objects. ``docs/extending.md`` shows a whole one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from croupier._lazy import lazy_names

if TYPE_CHECKING:
    from croupier._dist import resolve_ranks
    from croupier._validate import check_bool, check_int, dataset_length
    from croupier.samplers._base import Batches, BatchSampler, IndexSampler, Loaded
    from croupier.samplers._state import StateError, StateFormat
    from croupier.samplers.bucket import BucketBatchSampler
    from croupier.samplers.chunk import ChunkSampler
    from croupier.samplers.distributed import DistributedSampler
    from croupier.samplers.mixture import MixtureSampler
    from croupier.samplers.protocol import Rest, Resumable
    from croupier.samplers.rank_aware import RankAwareSampler
    from croupier.samplers.sequential_bucket import SequentialBucketSampler

__all__ = [
    "BatchSampler",
    "Batches",
    "BucketBatchSampler",
    "ChunkSampler",
    "DistributedSampler",
    "IndexSampler",
    "Loaded",
    "MixtureSampler",
    "RankAwareSampler",
    "Rest",
    "Resumable",
    "SequentialBucketSampler",
    "StateError",
    "StateFormat",
    "check_bool",
    "check_int",
    "dataset_length",
    "resolve_ranks",
]

# Each name loads its module on first use: the torch Samplers (which import torch, seconds)
# only when one of them is asked for; ChunkSampler, RankAwareSampler and the state helpers
# never import it.
_WHERE = {
    "BatchSampler": "croupier.samplers._base",
    "Batches": "croupier.samplers._base",
    "BucketBatchSampler": "croupier.samplers.bucket",
    "ChunkSampler": "croupier.samplers.chunk",
    "DistributedSampler": "croupier.samplers.distributed",
    "IndexSampler": "croupier.samplers._base",
    "Loaded": "croupier.samplers._base",
    "MixtureSampler": "croupier.samplers.mixture",
    "RankAwareSampler": "croupier.samplers.rank_aware",
    "Rest": "croupier.samplers._base",
    "Resumable": "croupier.samplers.protocol",
    "SequentialBucketSampler": "croupier.samplers.sequential_bucket",
    "StateError": "croupier.samplers._state",
    "StateFormat": "croupier.samplers._state",
    "check_bool": "croupier._validate",
    "check_int": "croupier._validate",
    "dataset_length": "croupier._validate",
    "resolve_ranks": "croupier._dist",
}


__getattr__, __dir__ = lazy_names("croupier.samplers", globals(), _WHERE)
