"""croupier's ``torch.utils.data`` samplers, all on one base that owns epoch, position,
checkpoint state and pickling.

To write a sampler of your own, subclass :class:`IndexSampler` (it yields ints) or
:class:`BatchSampler` (it yields lists of ints, computed as :class:`Batches`), check its
arguments with :func:`check_int`, :func:`check_bool` and :func:`dataset_length`, and find its
ranks with :func:`resolve_ranks`; a sampler with state keys of its own checks them in
``_prepare_load`` (given a :class:`Loaded`), and it loads foreign state shapes as
:class:`StateFormat` objects. ``docs/extending.md`` shows a whole one.
"""

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
