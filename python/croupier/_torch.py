"""torch's ``Sampler`` when torch imports, else a stand-in: croupier imports with only numpy.

croupier must import with only numpy installed; with torch present its samplers are real
``torch.utils.data.Sampler`` subclasses, so ``isinstance`` checks in training code pass.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Generic, TypeVar

__all__ = ["HAVE_TORCH", "Sampler"]

T_co = TypeVar("T_co", covariant=True)

if TYPE_CHECKING:
    from torch.utils.data import Sampler

    HAVE_TORCH = True
else:
    try:
        from torch.utils.data import Sampler

        HAVE_TORCH = True
    except ImportError:  # torch is an optional extra
        HAVE_TORCH = False

        class Sampler(Generic[T_co]):
            """Stand-in for ``torch.utils.data.Sampler`` when torch is not installed."""

            def __init__(self, data_source: object = None) -> None:
                pass
