"""Names of a package that load their module on first use (PEP 562): what keeps ``import
croupier`` to numpy and the core, and the torch Samplers' import (seconds) until one is asked
for."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_names"]

_ABSENT = object()


def lazy_names(
    package: str, namespace: dict[str, Any], where: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for the package ``package`` whose globals are
    ``namespace``: each name of ``where`` is imported from its module on first use and kept."""

    def getattr_(name: str) -> Any:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        # A module already imported is read from sys.modules: import_module's own lookup
        # costs 10 us the first time in a process, inside a training job's first step.
        # (A module still being imported, here or by another thread, goes through
        # import_module, which waits for another thread's import to finish.)
        loaded = sys.modules.get(module)
        spec = getattr(loaded, "__spec__", None)
        if loaded is not None and not getattr(spec, "_initializing", False):
            value = getattr(loaded, name, _ABSENT)
        else:
            value = _ABSENT
        if value is _ABSENT:
            value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    def dir_() -> list[str]:
        return sorted({*namespace, *where})

    return getattr_, dir_
