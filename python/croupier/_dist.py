"""Where a sampler learns its rank and the number of ranks (the ``dist_info`` argument).

Besides the process group, the environment, jax and a callable, ``dist_info`` takes the
data-parallel coordinates directly, ``(dp_rank, dp_size)``, or a torch ``DeviceMesh``: then
the sampler's ranks are the mesh's data-parallel dimension, so every rank of one tensor- or
pipeline-parallel group gets the same indices while the data-parallel groups stay disjoint.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from typing import Any

from croupier._validate import MAX_LEN, as_int, check_int

__all__ = ["DistInfo", "resolve_ranks"]

DistInfo = str | Callable[[], tuple[int, int]] | tuple[Any, ...] | Any | None
"""``None``, ``"torch"``, ``"jax"``, a callable returning ``(rank, world_size)``, a
``(dp_rank, dp_size)`` pair, a torch ``DeviceMesh`` or ``(mesh, dim_name)``."""

# Mesh dimension names taken as data-parallel when none is named.
_DP_NAMES = ("dp", "data_parallel", "dp_replicate", "data")


def _is_mesh(obj: object) -> bool:
    return hasattr(obj, "get_local_rank") and hasattr(obj, "mesh_dim_names")


def _from_mesh(mesh: Any, dim: str | None) -> tuple[int, int]:
    """The rank and size of ``mesh``'s data-parallel dimension ``dim`` (default: the one named
    like ``"dp"``, or the only one of a 1-D mesh)."""
    names = tuple(mesh.mesh_dim_names or ())
    if dim is None:
        if mesh.ndim == 1:
            dim = names[0] if names else None
        else:
            found = [n for n in _DP_NAMES if n in names]
            if not found:
                raise ValueError(
                    f"dist_info: which dimension of the DeviceMesh {names} is data-parallel? "
                    "Pass (mesh, 'dim_name')"
                )
            dim = found[0]
    elif dim not in names:
        raise ValueError(f"dist_info: the DeviceMesh has no dimension {dim!r}; it has {names}")
    index = 0 if dim is None else names.index(dim)
    return int(mesh.get_local_rank(index)), int(mesh.size(index))


def _from_torch(required: bool) -> tuple[int, int] | None:
    try:
        import torch.distributed as dist
    except ImportError:
        if required:
            raise ValueError("dist_info='torch' needs torch installed") from None
        return None
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    if required:
        raise ValueError(
            "dist_info='torch' but torch.distributed is not initialised "
            "(call torch.distributed.init_process_group first)"
        )
    return None


def _from_jax() -> tuple[int, int]:
    try:
        import jax
    except ImportError:
        raise ValueError("dist_info='jax' needs jax installed") from None
    return int(jax.process_index()), int(jax.process_count())


def _from_env() -> tuple[int, int] | None:
    rank, world = os.environ.get("RANK"), os.environ.get("WORLD_SIZE")
    if rank is None and world is None:
        return None
    if rank is None or world is None:
        missing = "RANK" if rank is None else "WORLD_SIZE"
        raise ValueError(
            f"the environment sets only one of RANK and WORLD_SIZE; {missing} is unset"
        )
    try:
        return int(rank), int(world)
    except ValueError:
        raise ValueError(
            f"RANK and WORLD_SIZE must be integers, got RANK={rank!r} WORLD_SIZE={world!r}"
        ) from None


# Variables that multi-process launchers set; seeing one with no process group and no
# RANK/WORLD_SIZE usually means every process is about to read the whole dataset.
_LAUNCHER_VARS = ("LOCAL_RANK", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE")


def _single_process() -> tuple[int, int]:
    for var in _LAUNCHER_VARS:
        value = os.environ.get(var)
        # LOCAL_RANK is a rank (1 is the second process); the others are sizes (1 is alone).
        alone = ("0",) if var == "LOCAL_RANK" else ("0", "1")
        if value is not None and value not in alone:
            warnings.warn(
                f"croupier: {var}={value} suggests a multi-process launch, but torch.distributed "
                "is not initialised and RANK/WORLD_SIZE are unset: using rank 0 of 1. Pass "
                "num_replicas and rank, or dist_info, to deal the data across processes.",
                RuntimeWarning,
                stacklevel=5,
            )
            break
    return 0, 1


def _query(dist_info: DistInfo) -> tuple[int, int]:
    if dist_info is None:
        return _from_torch(required=False) or _from_env() or _single_process()
    if _is_mesh(dist_info):
        return _from_mesh(dist_info, None)
    if isinstance(dist_info, tuple):
        if len(dist_info) == 2 and _is_mesh(dist_info[0]):
            return _from_mesh(dist_info[0], dist_info[1])
        dp_rank, dp_size = dist_info
        return as_int("dist_info dp_rank", dp_rank), as_int("dist_info dp_size", dp_size)
    if isinstance(dist_info, str):
        if dist_info == "torch":
            found = _from_torch(required=True)
            assert found is not None
            return found
        return _from_jax()
    result = dist_info()
    if not (isinstance(result, tuple) and len(result) == 2):
        raise TypeError(
            f"dist_info() must return a (rank, world_size) tuple, got {type(result).__name__}"
        )
    # Python or numpy integers; bool (True is not a rank) and floats are refused.
    return as_int("dist_info() rank", result[0]), as_int("dist_info() world_size", result[1])


def implied_rank(num_replicas: int | None, rank: int | None, dist_info: DistInfo) -> int | None:
    """kempnerforge's rule for a rank not given: the process group's, else ``RANK``, else 0
    (``croupier.compat.kempnerforge``, whose samplers take it so; croupier's own refuse
    ``num_replicas > 1`` without a rank to read)."""
    if rank is not None or num_replicas is None or dist_info is not None:
        return rank
    found = _from_torch(required=False) or _from_env()
    return 0 if found is None else found[0]


def resolve_ranks(
    num_replicas: int | None, rank: int | None, dist_info: DistInfo
) -> tuple[int, int]:
    """``(num_replicas, rank)``: explicit values win; whatever is ``None`` comes from ``dist_info``.

    ``dist_info=None`` asks ``torch.distributed`` when it is initialised, then the ``RANK`` and
    ``WORLD_SIZE`` environment variables, and falls back to rank 0 of 1; ``num_replicas > 1``
    given without ``rank`` and with nowhere to read it from is refused (``ValueError``), as
    torch refuses it.
    """
    accepted = "None, 'torch', 'jax', a callable, (dp_rank, dp_size) or a DeviceMesh"
    if isinstance(dist_info, str) and dist_info not in ("torch", "jax"):
        raise ValueError(f"dist_info must be {accepted}, got {dist_info!r}")
    if isinstance(dist_info, tuple) and not (
        len(dist_info) == 2 and (_is_mesh(dist_info[0]) or not isinstance(dist_info[1], str))
    ):
        raise ValueError(f"dist_info must be {accepted}, got a tuple of {len(dist_info)}")
    if not (
        dist_info is None
        or isinstance(dist_info, (str, tuple))
        or callable(dist_info)
        or _is_mesh(dist_info)
    ):
        raise TypeError(f"dist_info must be {accepted}, got {type(dist_info).__name__}")
    if rank is None and num_replicas is not None and dist_info is None:
        found = _from_torch(required=False) or _from_env()
        if found is None and check_int("num_replicas", num_replicas, 1, MAX_LEN) > 1:
            # torch raises here too: every process built this way would be rank 0 and train
            # on the same share.
            raise ValueError(
                f"rank is needed with num_replicas={num_replicas}: torch.distributed is not "
                "initialised and RANK/WORLD_SIZE are unset, so there is nowhere to read this "
                "process's rank from (every process would be rank 0 and train on the same "
                "share); pass rank=, or dist_info="
            )
    if num_replicas is None or rank is None:
        found_rank, found_world = _query(dist_info)
        if num_replicas is None:
            num_replicas = found_world
        if rank is None:
            rank = found_rank
    num_replicas = check_int("num_replicas", num_replicas, 1, MAX_LEN)
    rank = as_int("rank", rank)
    if not 0 <= rank < num_replicas:
        # torch's words first: code written for torch's sampler matches on them.
        raise ValueError(
            f"Invalid rank {rank}, rank should be in the interval [0, {num_replicas - 1}] "
            f"(num_replicas={num_replicas})"
        )
    return num_replicas, rank
