"""croupier's ``torch.utils.data`` samplers."""

from croupier.samplers.distributed import DistributedSampler

__all__ = ["DistributedSampler"]
