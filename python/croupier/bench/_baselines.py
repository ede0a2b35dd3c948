"""Baselines that are not installable packages: the algorithms other systems document,
implemented here from their documentation (no code copied), so that ``croupier bench`` measures
what users run today against croupier in one process run."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

__all__ = [
    "BUCKETS",
    "MAX_TOKENS",
    "MIXTURE_DATASETS",
    "KempnerforgeStyleMixture",
    "bench_lengths",
    "mixture_args",
    "padding_efficiency",
    "python_bucket_batches",
]

#: Datasets of the benchmark mixture: N split into this many equal datasets.
MIXTURE_DATASETS = 100


def mixture_args(n: int) -> tuple[list[int], list[float]]:
    """The benchmark mixture over ``n`` samples: cumulative sizes of 100 near-equal datasets and
    fixed unequal weights (1 to 100), so some datasets are oversampled and most undersampled."""
    base, extra = divmod(n, MIXTURE_DATASETS)
    sizes = [base + (i < extra) for i in range(MIXTURE_DATASETS)]
    cum = [0]
    for s in sizes:
        cum.append(cum[-1] + s)
    return cum, [float(1 + i) for i in range(MIXTURE_DATASETS)]


MANY_DATASETS = 10_000


def many_mixture_args(n: int) -> tuple[list[int], list[float]]:
    """A mixture of many datasets of unequal sizes over ``n`` samples: ``min(10,000, n // 128)``
    datasets, each of 64 samples plus a share of the rest that goes 1 : 2 : ... : 100 in a
    repeating saw, with unequal weights 1 to 13."""
    count = max(1, min(MANY_DATASETS, n // 128))
    shares = [1 + i % 100 for i in range(count)]
    total = sum(shares)
    sizes = [64 + (n - 64 * count) * s // total for s in shares]
    sizes[-1] += n - sum(sizes)
    cum = [0]
    for size in sizes:
        cum.append(cum[-1] + size)
    return cum, [float(1 + (i * 7919) % 13) for i in range(count)]


class KempnerforgeStyleMixture:
    """kempnerforge's ``MixtureSampler`` algorithm as its documentation and docstrings describe
    it: every epoch, each rank shuffles every dataset with ``torch.randperm`` (one generator
    seeded with ``seed + epoch``), takes its strided share as a Python list, draws its target
    count from it (wrapping around to oversample), concatenates all datasets and reshuffles the
    whole list with one more ``randperm``; targets are ``round(p_i * total)`` fixed up to the
    total; resuming skips positions of the rebuilt list (``set_skip``)."""

    def __init__(
        self,
        cumulative_sizes: list[int],
        weights: list[float],
        num_replicas: int,
        rank: int,
        seed: int,
    ) -> None:
        n = len(cumulative_sizes) - 1
        self.sizes = [cumulative_sizes[i + 1] - cumulative_sizes[i] for i in range(n)]
        self.offsets = list(cumulative_sizes[:n])
        total_w = sum(weights)
        self.probs = [w / total_w for w in weights]
        self.num_replicas, self.rank, self.seed = num_replicas, rank, seed
        per_rank = sum(s // num_replicas for s in self.sizes)
        self.targets = [round(p * per_rank) for p in self.probs]
        diff = per_rank - sum(self.targets)
        order = sorted(range(n), key=lambda i: -self.probs[i])
        for i in range(abs(diff)):
            self.targets[order[i % n]] += 1 if diff > 0 else -1
        self.epoch = 0
        self.skip = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def set_skip(self, skip: int) -> None:
        self.skip = skip

    def __len__(self) -> int:
        return sum(self.targets)

    def __iter__(self) -> Iterator[int]:
        import torch

        g = torch.Generator().manual_seed(self.seed + self.epoch)
        result: list[int] = []
        w, r = self.num_replicas, self.rank
        for size, offset, target in zip(self.sizes, self.offsets, self.targets, strict=True):
            if target <= 0 or size == 0:
                continue
            order = torch.randperm(size, generator=g).tolist()
            share = order[: size - size % w][r::w]
            if not share:
                continue
            reps = math.ceil(target / len(share))
            drawn = (share * reps)[:target]
            result.extend(i + offset for i in drawn)
        perm = torch.randperm(len(result), generator=g).tolist()
        result = [result[p] for p in perm]
        skip, self.skip = self.skip, 0
        return iter(result[skip:])


#: Buckets of the benchmark's bucket batching, croupier's and the baseline's alike.
BUCKETS = 64
#: The token budget of the benchmark's batches.
MAX_TOKENS = 65_536


def bench_lengths(n: int, seed: int) -> Any:
    """Token counts of ``n`` samples, log-normal (median about 245, a long tail) in
    ``[1, 16384]``: the benchmark's variable-length dataset."""
    import numpy as np

    rng = np.random.default_rng(seed)
    return np.clip(rng.lognormal(5.5, 1.0, n), 1, 16_384).astype(np.uint32)


def python_bucket_batches(
    lengths: Any, max_tokens: int, buckets: int, num_replicas: int, rank: int, seed: int, epoch: int
) -> list[list[int]]:
    """The usual Python bucket batching, as fairseq's ``batch_by_size`` and lhotse's bucketing
    samplers describe it: a stable argsort of the lengths, ``buckets`` equal-count buckets of
    it, each shuffled, greedy batches under the padded budget ``len(batch) * max_len``, the
    batch order shuffled, torch's padding to a multiple of ``num_replicas``, then this rank's
    batches. A resume rebuilds the epoch and skips batches."""
    import numpy as np

    rng = np.random.default_rng(seed + epoch)
    order = np.argsort(lengths, kind="stable")
    size_of = lengths.tolist()
    batches: list[list[int]] = []
    for bucket in np.array_split(order, buckets):
        members = bucket.copy()
        rng.shuffle(members)
        cur: list[int] = []
        cur_max = 0
        for i in members.tolist():
            longest = max(cur_max, size_of[i])
            if cur and (len(cur) + 1) * longest > max_tokens:
                batches.append(cur)
                cur, cur_max = [i], size_of[i]
            else:
                cur.append(i)
                cur_max = longest
        if cur:
            batches.append(cur)
    perm = rng.permutation(len(batches))
    batches = [batches[p] for p in perm]
    per_rank = math.ceil(len(batches) / num_replicas)
    batches += batches[: per_rank * num_replicas - len(batches)]
    return batches[rank::num_replicas]


def padding_efficiency(lengths: Any, flat: Any, offsets: Any) -> float:
    """Real tokens over padded tokens (``len(batch) * max_len`` summed over batches)."""
    import numpy as np

    if len(offsets) < 2:
        return 1.0
    lens = np.asarray(lengths)[np.asarray(flat, dtype=np.int64)].astype(np.int64)
    starts = np.asarray(offsets[:-1], dtype=np.int64)
    sizes = np.diff(np.asarray(offsets, dtype=np.int64))
    keep = sizes > 0
    maxes = np.maximum.reduceat(lens, starts[keep]) if len(lens) else np.zeros(0)
    return float(lens.sum() / (sizes[keep] * maxes).sum())
