"""One measurement, run in its own process by ``croupier bench``: ``python -m
croupier.bench._child '<json spec>'`` prints one JSON line.

Each run imports what it needs first (not timed), then times the work with
``time.perf_counter`` and reads the peak resident set (``VmHWM``) before anything else
allocates. Peak RSS is for the whole process; ``rss_base_mib`` is the resident set after the
imports, so the sampler's own share is the difference.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from collections.abc import Iterator
from typing import Any

__all__ = ["main"]


def _status_mib(field: str) -> float:
    """A ``/proc/self/status`` memory field in MiB (Linux), or ``ru_maxrss`` as a fallback."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    import resource

    kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return kib / 1024 / (1024 if sys.platform == "darwin" else 1)


def _digest(values: Any) -> str:
    """SHA-256 (16 hex digits) of the values as ``int64``, hashed a piece at a time: a copy
    of a whole 1e9 blend as ``int64`` bytes (two of 8 GB) ran the machine out of memory."""
    import numpy as np

    arr = np.asarray(values).reshape(-1)
    digest = hashlib.sha256()
    step = 1 << 22
    for start in range(0, len(arr), step):
        digest.update(np.ascontiguousarray(arr[start : start + step], dtype=np.int64).tobytes())
    return digest.hexdigest()[:16]


def _sampler(system: str, n: int, ranks: int, rank: int, seed: int) -> Any:
    if system == "croupier":
        from croupier import DistributedSampler

        return DistributedSampler(n, num_replicas=ranks, rank=rank, seed=seed)
    if system == "croupier-per-rank-order":
        from croupier import DistributedSampler

        return DistributedSampler(n, num_replicas=ranks, rank=rank, seed=seed, order="per_rank")
    if system == "croupier-torch-order":
        from croupier import DistributedSampler

        return DistributedSampler(n, num_replicas=ranks, rank=rank, seed=seed, order="torch")
    if system == "croupier-mixture":
        from croupier import MixtureSampler
        from croupier.bench._baselines import mixture_args

        cum, weights = mixture_args(n)
        return MixtureSampler(cum, weights, num_replicas=ranks, rank=rank, seed=seed)
    if system in ("croupier-mixture-per-rank-order", "croupier-mixture-balanced"):
        from croupier import MixtureSampler
        from croupier.bench._baselines import mixture_args

        cum, weights = mixture_args(n)
        fast = system.endswith("per-rank-order")
        return MixtureSampler(
            cum, weights, num_replicas=ranks, rank=rank, seed=seed,
            order="per_rank" if fast else "global", interleave="uniform" if fast else "balanced",
        )  # fmt: skip
    if system == "croupier-mixture-10k":
        from croupier import MixtureSampler
        from croupier.bench._baselines import many_mixture_args

        cum, weights = many_mixture_args(n)
        return MixtureSampler(cum, weights, num_replicas=ranks, rank=rank, seed=seed)
    if system == "kempnerforge-mixture":
        from croupier.bench._baselines import KempnerforgeStyleMixture, mixture_args

        cum, weights = mixture_args(n)
        return KempnerforgeStyleMixture(cum, weights, ranks, rank, seed)
    if system == "torch-sampler":
        from torch.utils.data import DistributedSampler as TorchSampler

        return TorchSampler(range(n), num_replicas=ranks, rank=rank, seed=seed)  # type: ignore[arg-type]
    if system == "torchdata-sampler":
        from torchdata.stateful_dataloader.sampler import (  # type: ignore[import-untyped]
            StatefulDistributedSampler,
        )

        return StatefulDistributedSampler(range(n), num_replicas=ranks, rank=rank, seed=seed)
    raise ValueError(f"not a sampler system: {system}")


def _resume_state(system: str, sampler: Any, epoch: int, position: int) -> Any:
    """A checkpoint at ``position`` of ``epoch``, in the system's own format (``None`` when the
    system cannot resume)."""
    if system.startswith("croupier"):
        sampler.set_epoch(epoch)
        sampler.set_skip(position)
        return sampler.state_dict()
    if system == "torchdata-sampler":
        return {"yielded": position}
    if system == "kempnerforge-mixture":
        return {"skip": position}  # its documented resume: set_skip, then the epoch rebuilt
    return None


def _reset_peak() -> None:
    """Resets the kernel's peak-RSS counter (Linux ``clear_refs``), so the next phase's peak
    is its own."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def _measure_sampler(spec: dict[str, Any]) -> dict[str, Any]:
    system, n, ranks, rank, seed = (spec[k] for k in ("system", "n", "ranks", "rank", "seed"))
    epoch = 1
    out: dict[str, Any] = {}
    # The process's one-time set-up (thread pools, lazily built module state), paid untimed by
    # a small sampler of the same system first, as a training process pays it before its
    # first epoch: the first index is the sampler's own time.
    warm = _sampler(system, MIN_N, ranks, rank, seed)
    warm.set_epoch(epoch)
    next(iter(warm))
    del warm
    # Time to the first index: construct, set the epoch, start iterating; a fresh sampler
    # each time, up to FIRST_TRIES times within FIRST_BUDGET seconds, the fastest kept (a
    # call this short is easily preempted on a busy machine; its own time is the least).
    tries: list[float] = []
    while len(tries) < FIRST_TRIES and sum(tries) < FIRST_BUDGET:
        t0 = time.perf_counter()
        s = _sampler(system, n, ranks, rank, seed)
        s.set_epoch(epoch)
        first = next(iter(s))
        tries.append(time.perf_counter() - t0)
        del s
    out["first_s"] = min(tries)
    # The whole epoch: torch's samplers give a list, croupier a numpy array (indices()).
    t0 = time.perf_counter()
    s = _sampler(system, n, ranks, rank, seed)
    s.set_epoch(epoch)
    whole = s.indices() if system.startswith("croupier") else list(s)
    out["epoch_s"] = time.perf_counter() - t0
    out["peak_mib"] = _status_mib("VmHWM")
    count = len(whole)
    out["count"] = count
    out["first_ok"] = bool(count and first == int(whole[0]))
    mid = count // 2
    at_mid = int(whole[mid]) if count else None
    if spec.get("digest", True):
        out["digest"] = _digest(whole)
    # Resume at mid-epoch: a fresh sampler, a checkpoint loaded, the next index (unless the
    # spec says "resume": false, as the world-size sweep does). croupier's checkpoint is taken
    # by the sampler that read the epoch, as a training job's is (what it found on the way,
    # such as the balanced interleave's boundaries, is in its state); the others' by a fresh
    # one, as their states hold nothing of the kind.
    state = None
    if spec.get("resume", True):
        saver = s if system.startswith("croupier") else _sampler(system, n, ranks, rank, seed)
        state = _resume_state(system, saver, epoch, mid)
    del whole, s
    if state is not None and count:
        _reset_peak()
        t0 = time.perf_counter()
        s = _sampler(system, n, ranks, rank, seed)
        s.set_epoch(epoch)
        if system == "kempnerforge-mixture":
            s.set_skip(state["skip"])
        else:
            s.load_state_dict(state)
        resumed = next(iter(s))
        out["resume_s"] = time.perf_counter() - t0
        out["resume_peak_mib"] = _status_mib("VmHWM")
        out["resume_ok"] = resumed == at_mid
    return out


def _measure_batches(spec: dict[str, Any]) -> dict[str, Any]:
    from croupier.bench._baselines import (
        BUCKETS,
        MAX_TOKENS,
        bench_lengths,
        padding_efficiency,
        python_bucket_batches,
    )

    system, n, ranks, rank, seed = (spec[k] for k in ("system", "n", "ranks", "rank", "seed"))
    lengths = bench_lengths(n, seed)  # the data, untimed
    base = _status_mib("VmRSS")
    epoch = 1
    out: dict[str, Any] = {"rss_base_mib": base}
    if system == "numpy-argsort":
        import numpy as np

        t0 = time.perf_counter()
        order = np.argsort(lengths, kind="stable")
        out["epoch_s"] = time.perf_counter() - t0
        out["count"] = len(order)
        out["peak_mib"] = _status_mib("VmHWM")
        return out
    if system == "python-buckets":
        import numpy as np

        t0 = time.perf_counter()
        batches = python_bucket_batches(lengths, MAX_TOKENS, BUCKETS, ranks, rank, seed, epoch)
        out["epoch_s"] = out["first_s"] = out["resume_s"] = time.perf_counter() - t0
        out["peak_mib"] = _status_mib("VmHWM")
        flat = [i for b in batches for i in b]
        offsets = np.cumsum([0, *map(len, batches)])
        out["efficiency"] = padding_efficiency(lengths, flat, offsets)
        out["count"] = len(batches)
        return out
    if system == "lhotse-buckets":
        return {**out, **_measure_lhotse(lengths, ranks, rank, seed, epoch)}
    from croupier import BucketBatchSampler

    batch_order = "per_rank" if system == "croupier-buckets-per-rank-order" else "global"

    def make() -> Any:
        s = BucketBatchSampler(
            lengths, max_tokens=MAX_TOKENS, buckets=BUCKETS, num_replicas=ranks, rank=rank,
            seed=seed, order=batch_order,
        )  # fmt: skip
        s.set_epoch(epoch)
        return s

    t0 = time.perf_counter()
    s = make()
    out["setup_s"] = time.perf_counter() - t0
    first = next(iter(s))
    out["first_s"] = time.perf_counter() - t0
    del s
    t0 = time.perf_counter()
    s = make()
    whole = s.batches()
    out["epoch_s"] = time.perf_counter() - t0
    out["peak_mib"] = _status_mib("VmHWM")
    out["count"] = len(whole)
    out["first_ok"] = bool(len(whole)) and first == whole[:1].tolist()[0]
    out["efficiency"] = padding_efficiency(lengths, whole.flat, whole.offsets)
    mid = len(whole) // 2
    at_mid = whole[mid : mid + 1].tolist()[0] if len(whole) else None
    state = {**s.state_dict(), "position": mid}
    del whole
    # Resume: a constructed sampler (its setup is the column above) loads a mid-epoch state.
    t0 = time.perf_counter()
    s.load_state_dict(state)
    resumed = next(iter(s))
    out["resume_s"] = time.perf_counter() - t0
    out["resume_ok"] = resumed == at_mid
    return out


def _measure_lhotse(lengths: Any, ranks: int, rank: int, seed: int, epoch: int) -> dict[str, Any]:
    """lhotse's ``DynamicBucketingSampler`` measured as croupier's bucket batches are: the
    first batch (construction included), the whole epoch, and a resume at mid-epoch (a
    constructed sampler loads the checkpoint, lhotse's fast-forward, and yields the next
    batch). Its output is a ``CutSet`` per batch; the timed loops turn each into indices."""
    import copy
    import importlib

    import numpy as np

    from croupier.bench import _lhotse
    from croupier.bench._baselines import BUCKETS, MAX_TOKENS, padding_efficiency

    importlib.import_module("lhotse.dataset")  # the sampler's module (lhotse imports it), untimed
    cuts = _lhotse.lazy_cuts(lengths)  # the data, read as the sampler iterates it

    def make() -> Any:
        return _lhotse.sampler(cuts, MAX_TOKENS, BUCKETS, ranks, rank, seed, epoch)

    out: dict[str, Any] = {}
    t0 = time.perf_counter()
    s = make()
    out["setup_s"] = time.perf_counter() - t0
    first = _lhotse.batch_indices(next(iter(s)))
    out["first_s"] = time.perf_counter() - t0
    del s
    t0 = time.perf_counter()
    s = make()
    whole = [_lhotse.batch_indices(batch) for batch in s]
    out["epoch_s"] = time.perf_counter() - t0
    out["peak_mib"] = _status_mib("VmHWM")
    out["count"] = len(whole)
    out["first_ok"] = bool(whole) and first == whole[0]
    offsets = np.cumsum([0, *map(len, whole)])
    out["efficiency"] = padding_efficiency(lengths, [i for b in whole for i in b], offsets)
    mid = len(whole) // 2
    at_mid = whole[mid] if whole else None
    state = _lhotse.mid_epoch_state(s, whole, mid)
    del whole, s
    # Resume: a constructed sampler (its setup is in the first column) loads the mid-epoch
    # checkpoint (a copy: loading consumes it) and yields its next batch.
    s = make()
    state = copy.deepcopy(state)
    t0 = time.perf_counter()
    s.load_state_dict(state)
    resumed = _lhotse.batch_indices(next(iter(s)))
    out["resume_s"] = time.perf_counter() - t0
    out["resume_ok"] = resumed == at_mid
    return out


READ_ROW_BYTES = 16  # 4 float32 per row
READ_CHUNK, READ_PRELOAD, READ_BATCH = 1024, 16, 256


def _measure_reads(spec: dict[str, Any]) -> dict[str, Any]:
    import tempfile
    from pathlib import Path

    import numpy as np

    system, n, ranks, rank, seed = (spec[k] for k in ("system", "n", "ranks", "rank", "seed"))
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="croupier-bench-") as tmp:
        path = Path(tmp) / "rows.npy"
        # The data, untimed: n rows of 4 float32, row i holding i, written and mapped.
        rows = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(n, 4))
        step = 1 << 22
        for lo in range(0, n, step):
            hi = min(n, lo + step)
            rows[lo:hi] = np.arange(lo, hi, dtype=np.float32)[:, None]
        rows.flush()
        del rows
        arr = np.load(path, mmap_mode="r")
        if system == "croupier-chunks":
            from croupier import ChunkSampler
            from croupier.samplers.chunk import read_request

            sampler = ChunkSampler(
                READ_CHUNK, READ_PRELOAD, READ_BATCH, seed=seed, num_replicas=ranks, rank=rank
            )
            t0 = time.perf_counter()
            count = 0
            for request in sampler.sample(n):
                for batch in read_request(arr, request):
                    count += len(batch)
        elif system == "random-reads":
            order = np.random.default_rng(seed).permutation(n)[rank::ranks].tolist()
            t0 = time.perf_counter()
            count = 0
            for i in order:
                count += len(np.asarray(arr[i]))  # dataset[i], as a DataLoader asks for it
            count //= 4
        else:
            raise ValueError(f"not a reads system: {system}")
        out["epoch_s"] = time.perf_counter() - t0
        out["count"] = count
        out["mb_s"] = count * READ_ROW_BYTES / out["epoch_s"] / 1e6 if out["epoch_s"] else None
        out["peak_mib"] = _status_mib("VmHWM")
        del arr
    return out


def elastic_world(ranks: int, rank: int) -> tuple[int, int]:
    """The world an elastic resume moves to, and the rank timed there: 3/4 of the ranks."""
    new = max(1, ranks * 3 // 4)
    return new, min(rank, new - 1)


def _measure_elastic(spec: dict[str, Any]) -> dict[str, Any]:
    system, n, ranks, rank, seed = (spec[k] for k in ("system", "n", "ranks", "rank", "seed"))
    new_ranks, new_rank = elastic_world(ranks, rank)
    epoch = 1
    out: dict[str, Any] = {"new_ranks": new_ranks}
    if system in ("croupier-elastic", "croupier-elastic-per-rank"):
        from croupier import DistributedSampler

        order = "per_rank" if system == "croupier-elastic-per-rank" else "global"
        # The checkpoint: every old rank consumed half its share (untimed, O(1)).
        old = DistributedSampler(n, num_replicas=ranks, rank=0, seed=seed, order=order)
        old.set_epoch(epoch)
        old.set_skip(len(old) // 2)
        state = old.state_dict()
        del old

        def resumed() -> Any:
            s = DistributedSampler(n, num_replicas=new_ranks, rank=new_rank, seed=seed, order=order)
            s.set_epoch(epoch)
            s.load_state_dict(state)
            return s

        t0 = time.perf_counter()
        first = next(iter(resumed()))
        out["resume_s"] = time.perf_counter() - t0
        _reset_peak()
        t0 = time.perf_counter()
        rest = resumed().indices()
        out["epoch_s"] = time.perf_counter() - t0
        out["peak_mib"] = _status_mib("VmHWM")
        out["count"] = len(rest)
        out["first_ok"] = bool(len(rest)) and first == int(rest[0])
        # This rank's share of a whole epoch on the new world, the memory yardstick.
        share = len(DistributedSampler(n, num_replicas=new_ranks, rank=new_rank))
        out["share_mib"] = share * (4 if n <= 2**32 else 8) / 2**20
        return out
    if system == "torch-elastic":
        import torch

        # What a job does without croupier: the epoch's global order as torch draws it, the
        # positions W ranks consumed (p each) cut off, the rest strided over the new ranks.
        per_rank = -(-n // ranks)
        consumed = per_rank // 2 * ranks
        t0 = time.perf_counter()
        g = torch.Generator().manual_seed(seed + epoch)
        perm = torch.randperm(n, generator=g)
        rest = perm[consumed:][new_rank::new_ranks].clone()
        del perm
        out["resume_s"] = out["epoch_s"] = time.perf_counter() - t0
        out["peak_mib"] = _status_mib("VmHWM")
        out["count"] = len(rest)
        return out
    raise ValueError(f"not an elastic system: {system}")


def _measure_permutation(spec: dict[str, Any]) -> dict[str, Any]:
    system, n, seed = spec["system"], spec["n"], spec["seed"]
    out: dict[str, Any] = {}
    p: Any
    if system == "croupier-permutation":
        import croupier

        t0 = time.perf_counter()
        p = croupier.permutation(n, seed=seed, epoch=1)
    elif system == "numpy-permutation":
        import numpy as np

        t0 = time.perf_counter()
        p = np.random.default_rng(seed).permutation(n)
    elif system == "torch-randperm":
        import torch

        g = torch.Generator().manual_seed(seed)
        t0 = time.perf_counter()
        p = torch.randperm(n, generator=g)
    else:
        raise ValueError(f"not a permutation system: {system}")
    out["epoch_s"] = time.perf_counter() - t0
    out["count"] = len(p)
    out["peak_mib"] = _status_mib("VmHWM")
    return out


def _megatron_inputs(system: str, n: int, seed: int) -> tuple[Any, ...]:
    """The untimed input of a megatron-family run of size ``n``: the blend's 100 weights, or
    ``n`` documents' lengths (1 to 2,000 tokens) and a shuffled document index."""
    import numpy as np

    rng = np.random.default_rng(seed)
    if system.endswith(("blend", "index-free")):
        weights = rng.random(100)
        return (weights / weights.sum(),)
    if system.endswith("sample-index"):
        sizes = rng.integers(1, 2000, size=n).astype(np.int32)
        return sizes, rng.permutation(n).astype(np.int32), int(sizes.sum())
    return ()


def _megatron_lm_random_sampler(
    total: int, consumed: int, mbs: int, rank: int, dp: int
) -> Iterator[list[int]]:
    """Megatron-LM's ``MegatronPretrainingRandomSampler`` with data sharding, as its source
    describes it: the epoch's ``torch.randperm`` of the rank's bucket (a generator seeded
    with the epoch) as a Python list, offset to the bucket, in micro-batches."""
    import torch

    group = mbs * dp
    active = total - total % group
    epoch, current = divmod(consumed, active)
    bucket = total // group * mbs
    g = torch.Generator()
    g.manual_seed(epoch)
    perm = torch.randperm(bucket, generator=g).tolist()
    batch: list[int] = []
    for x in perm[current // dp :]:
        batch.append(rank * bucket + x)
        if len(batch) == mbs:
            yield batch
            batch = []


def _measure_megatron(spec: dict[str, Any]) -> dict[str, Any]:
    import warnings

    import numpy as np

    system, n, seed = spec["system"], spec["n"], spec["seed"]
    if system.endswith("random-sampler"):
        return _measure_megatron_sampler(system, n)
    if system.endswith("index-free"):
        return _measure_index_free(n, seed)
    with warnings.catch_warnings():
        # megatron-core warns at import that Transformer Engine and Apex are absent.
        warnings.simplefilter("ignore")
        helpers: Any
        if system.startswith("croupier"):
            import croupier.compat.megatron

            helpers = croupier.compat.megatron
            shuffle = helpers.build_shuffle_index
        else:
            import importlib

            helpers = importlib.import_module("megatron.core.datasets.helpers")
            gpt_dataset = importlib.import_module("megatron.core.datasets.gpt_dataset")
            shuffle = gpt_dataset._build_shuffle_index
    inputs = _megatron_inputs(system, n, seed)
    base = _status_mib("VmRSS")
    out: dict[str, Any] = {"rss_base_mib": base}
    result: Any
    if system.endswith("blend"):
        (weights,) = inputs
        index, samples = np.zeros(n, np.int16), np.zeros(n, np.int64)
        t0 = time.perf_counter()
        helpers.build_blending_indices(index, samples, weights, 100, n, False)
        result = index
    elif system.endswith("shuffle"):
        t0 = time.perf_counter()
        result = shuffle(n, n, np.random.RandomState(seed))
    elif system.endswith("sample-index"):
        sizes, docs, tokens = inputs
        t0 = time.perf_counter()
        result = helpers.build_sample_idx(sizes, docs, 4096, 1, tokens, True, True)
    else:
        raise ValueError(f"not a megatron system: {system}")
    out["epoch_s"] = time.perf_counter() - t0
    out["count"] = len(result)
    out["peak_mib"] = _status_mib("VmHWM")
    out["digest"] = _digest(result)
    return out


def _measure_index_free(n: int, seed: int) -> dict[str, Any]:
    """Time to a fresh run's first sample with the index-free blend and shuffle index over
    ``n`` samples: both constructed, blend position 0 and its dataset's shuffle position read
    (megatron-core builds both whole first)."""
    from croupier.compat.megatron import IndexFreeBlend, IndexFreeShuffle

    (weights,) = _megatron_inputs("index-free", n, seed)
    base = _status_mib("VmRSS")
    t0 = time.perf_counter()
    blend = IndexFreeBlend(weights, n, seed=seed)
    dataset, sample = blend[0]
    count = int(blend.counts[dataset])
    position = int(IndexFreeShuffle(count, count, seed=seed)[sample])
    elapsed = time.perf_counter() - t0
    return {
        "rss_base_mib": base,
        "first_s": elapsed,
        "epoch_s": elapsed,
        "count": int(0 <= position < count),
        "peak_mib": _status_mib("VmHWM"),
    }


def _measure_megatron_sampler(system: str, n: int) -> dict[str, Any]:
    """One rank's epoch (rank 3 of 8, micro-batches of 4) of Megatron-LM's random sampler
    over ``n`` samples, every micro-batch drawn: time to the first and to the last."""
    import numpy as np

    from croupier.compat.megatron import MegatronPretrainingRandomSampler

    batches: Iterator[list[int]]
    base = _status_mib("VmRSS")
    t0 = time.perf_counter()
    if system.startswith("croupier"):
        batches = iter(MegatronPretrainingRandomSampler(None, n, 0, 4, 3, 8, True))
    else:
        batches = _megatron_lm_random_sampler(n, 0, 4, 3, 8)
    got = [next(batches, [])]
    first = time.perf_counter() - t0
    got.extend(batches)
    epoch = time.perf_counter() - t0
    peak = _status_mib("VmHWM")
    flat = np.fromiter((i for b in got for i in b), dtype=np.int64)
    return {
        "rss_base_mib": base,
        "first_s": first,
        "epoch_s": epoch,
        "count": len(flat),
        "peak_mib": peak,
        "digest": _digest(flat),
    }


#: The size of the sampler that pays a process's one-time set-up before the timed one.
MIN_N = 1000
#: Fresh samplers timed to their first index in one run (the fastest counts), within a budget
#: of seconds: a sampler that takes longer is timed once.
FIRST_TRIES, FIRST_BUDGET = 5, 0.2

#: The module of croupier's sampler each family measures, imported untimed by a croupier run
#: (the samplers load lazily).
CROUPIER_MODULES = {
    "samplers": ("croupier.samplers.distributed",),
    "elastic": ("croupier.samplers.distributed",),
    "mixtures": ("croupier.samplers.mixture",),
    "buckets": ("croupier.samplers.bucket",),
    "reads": ("croupier.samplers.chunk",),
}


def main(argv: list[str] | None = None) -> int:
    """Runs the measurement named by the JSON spec in ``argv[0]`` and prints the result."""
    spec = json.loads((argv if argv is not None else sys.argv[1:])[0])
    # Imports first, untimed: every system pays them once per process anyway, and the memory
    # a run adds is counted above them. croupier's samplers load lazily (the torch Samplers
    # import torch when it is installed): their modules load here, so that no first index
    # pays an import.
    mine = spec["system"].startswith("croupier")
    for module in (*spec["needs"], *(CROUPIER_MODULES.get(spec["family"], ()) if mine else ())):
        __import__(module)
    # The peak counts from here: an import's passing peak is not the run's.
    _reset_peak()
    base = _status_mib("VmRSS")
    measure = {
        "samplers": _measure_sampler,
        "mixtures": _measure_sampler,
        "buckets": _measure_batches,
        "reads": _measure_reads,
        "permutations": _measure_permutation,
        "elastic": _measure_elastic,
        "megatron": _measure_megatron,
    }[spec["family"]]
    result = measure(spec)
    # A family whose data is built untimed before its run (the buckets' lengths) reads its
    # base after building it.
    result.setdefault("rss_base_mib", base)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
