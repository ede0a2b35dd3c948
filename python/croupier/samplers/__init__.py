"""croupier's ``torch.utils.data`` samplers, all on one base (``_base.StatefulSampler``) that
owns epoch, position, checkpoint state and pickling."""

from croupier.samplers._state import StateError
from croupier.samplers.bucket import BucketBatchSampler
from croupier.samplers.chunk import ChunkSampler
from croupier.samplers.distributed import DistributedSampler
from croupier.samplers.mixture import MixtureSampler
from croupier.samplers.rank_aware import RankAwareSampler
from croupier.samplers.sequential_bucket import SequentialBucketSampler

__all__ = [
    "BucketBatchSampler",
    "ChunkSampler",
    "DistributedSampler",
    "MixtureSampler",
    "RankAwareSampler",
    "SequentialBucketSampler",
    "StateError",
]
