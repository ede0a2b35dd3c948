"""Which torch releases' ``randperm`` ``order="torch"`` reproduces.

torch's CPU ``randperm`` changed in 2.6 (pytorch PR 143682): from ``2**32 // 20`` samples on it
uses an inside-out shuffle with 64-bit draws, where torch 2.5 and earlier keep the forward swap
with 32-bit draws. Below that length every release gives the same order. The default follows
the installed torch, read from its package metadata (torch is not imported).
"""

from __future__ import annotations

import functools
import importlib.metadata
import re

__all__ = ["NEWEST", "torch_randperm_order"]

NEWEST = "torch>=2.6"
LEGACY = "torch<2.6"


def torch_randperm_order(torch_version: object = None) -> str:
    """``"torch>=2.6"`` or ``"torch<2.6"``: the core's name for the ``randperm`` variant of
    ``torch_version`` (``"2.5.1"``, ``"2.6.0+cu124"``, ...). ``None`` means the installed
    torch, or the newest variant when torch is not installed."""
    if torch_version is None:
        torch_version = _installed_torch()
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
    return LEGACY if (int(match[1]), int(match[2])) < (2, 6) else NEWEST


@functools.lru_cache(maxsize=1)
def _installed_torch() -> str | None:
    # Reading package metadata scans site-packages (milliseconds); samplers are built often.
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return None
