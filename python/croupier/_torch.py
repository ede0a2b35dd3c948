"""torch's ``Sampler`` and ``DistributedSampler`` when torch imports, else stand-ins: croupier
imports with only numpy.

croupier must import with only numpy installed; with torch present its samplers are real
``torch.utils.data.Sampler`` subclasses, and its rank-aware index samplers real
``torch.utils.data.DistributedSampler`` subclasses, so the ``isinstance`` checks of training
code and frameworks pass (Lightning decides by one whether to shard a sampler again). They
never run torch's ``DistributedSampler.__init__`` (which asks ``torch.distributed`` for the
world, calls ``len(dataset)`` and assigns the configuration croupier keeps read-only): only
the type is inherited; every method torch defines is croupier's own.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Generic, TypeVar

__all__ = ["HAVE_TORCH", "DistributedSamplerBase", "Sampler"]

T_co = TypeVar("T_co", covariant=True)

if TYPE_CHECKING:
    from torch.utils.data import DistributedSampler as DistributedSamplerBase
    from torch.utils.data import Sampler

    HAVE_TORCH = True
else:
    try:
        # (torch.utils.data imports DistributedSampler itself: no import cost.)
        from torch.utils.data import DistributedSampler as DistributedSamplerBase
        from torch.utils.data import Sampler

        HAVE_TORCH = True
    except ImportError:  # torch is an optional extra
        HAVE_TORCH = False

        class Sampler(Generic[T_co]):
            """Stand-in for ``torch.utils.data.Sampler`` when torch is not installed."""

            def __init__(self, data_source: object = None) -> None:
                pass

        class DistributedSamplerBase(Sampler[T_co]):
            """Stand-in for ``torch.utils.data.DistributedSampler`` when torch is not
            installed."""
