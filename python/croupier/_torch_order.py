"""Which torch releases' ``randperm`` ``order="torch"`` reproduces.

torch's CPU ``randperm`` changed in 2.6 (pytorch PR 143682): from ``2**32 // 20`` samples on it
uses an inside-out shuffle with 64-bit draws, where torch 2.5 and earlier keep the forward swap
with 32-bit draws. Below that length every release gives the same order. The default follows
the torch in use: ``torch.__version__`` when torch is already imported, else the installed
package's metadata (torch is not imported for this).

Builds from between the 2.6 branch cut and the change are told apart where the version string
allows: ``2.6.0a0`` source builds and nightlies dated before 2024-12-24 are the old variant.
2.7.0a0 source builds and release candidates of that time cannot be told apart; pass
``torch_version=`` for those.
"""

from __future__ import annotations

import functools
import importlib.metadata
import re
import sys

from croupier import _core

__all__ = ["NEWEST", "TORCH_ORDERS", "torch_randperm_order"]

NEWEST = "torch>=2.6"
LEGACY = "torch<2.6"
TORCH_ORDERS = {NEWEST: _core.Order.TORCH_INSIDE_OUT, LEGACY: _core.Order.TORCH_FORWARD}
"""The core's order for each variant name (the names are what checkpoints record)."""
# The day the inside-out randperm landed on torch's main branch (pytorch PR 143682).
_CHANGE_DATE = "20241224"


def torch_randperm_order(torch_version: object = None) -> str:
    """``"torch>=2.6"`` or ``"torch<2.6"``: the name of the ``randperm`` variant of
    ``torch_version`` (``"2.5.1"``, ``"2.6.0+cu124"``, ...). ``None`` means the torch in use
    (``torch.__version__`` if imported, else the installed package), or the newest variant when
    torch is not installed."""
    if torch_version is None:
        imported = sys.modules.get("torch")
        torch_version = getattr(imported, "__version__", None) or _installed_torch()
        if torch_version is None:
            return NEWEST
    if not isinstance(torch_version, str):
        raise TypeError(
            f"torch_version must be a str such as '2.5.1', got {type(torch_version).__name__}"
        )
    match = re.match(r"\s*(\d+)\.(\d+)", torch_version)
    if match is None:
        raise ValueError(
            f"torch_version must be a torch release such as '2.5.1' or '2.6.0+cu124', "
            f"got {torch_version!r}"
        )
    release = (int(match[1]), int(match[2]))
    if release < (2, 6):
        return LEGACY
    nightly = re.search(r"\.dev(\d{8})", torch_version)
    if nightly is not None and nightly[1] < _CHANGE_DATE:
        return LEGACY
    if release == (2, 6) and re.search(r"\d(a|\.dev)\d", torch_version):
        return LEGACY  # a 2.6.0a0 source build or nightly: before the change reached 2.6
    return NEWEST


@functools.lru_cache(maxsize=1)
def _installed_torch() -> str | None:
    # Reading package metadata scans site-packages (milliseconds); samplers are built often.
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return None
