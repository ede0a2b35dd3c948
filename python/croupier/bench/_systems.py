"""What ``croupier bench`` compares: each system, what it measures and how much memory it needs.

Five families. *Sampler* systems produce one rank's epoch of a ``DistributedSampler`` or, for the
mixture systems, of a 100-dataset ``MixtureSampler`` over the same N (time to the first index,
to the whole epoch, to the first index after resuming at mid-epoch).
*Batches* systems produce one rank's epoch of token-budget batches over N log-normal lengths
(time to the first batch, to the whole epoch, to the first batch after resuming, and the
padding efficiency), ``numpy.argsort`` alone being the yardstick. *Reads* systems read one
rank's epoch of N rows of 16 bytes from a memory-mapped ``.npy`` file (time to read them all
and the throughput in MB/s): in ``ChunkSampler`` load requests, or row by row in shuffled
order as a map-style dataset is read. *Elastic* systems resume an epoch checkpointed at its
middle on W ranks on ``W' = max(1, 3W/4)`` ranks (8 -> 6) and produce one new rank's rest of
the epoch (time to its first index after loading the state, to the whole rest, peak memory).
*Permutation* systems produce a full permutation of ``[0, N)`` (time to the whole of it).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["SYSTEMS", "System", "by_name"]


@dataclass(frozen=True)
class System:
    """One benchmarked implementation."""

    name: str
    family: str  # "sampler", "batches", "reads", "elastic" or "permutation"
    label: str
    needs: tuple[str, ...]  # importable modules it needs
    bytes_per_index: float  # working memory per sample of N (per share sample if per_rank)
    per_rank: bool = False  # memory scales with N / W instead of N
    # The system it is compared with: a baseline names the croupier system it is measured
    # against; a croupier system may name a baseline that yields the same output.
    baseline_for: str = ""
    same_output: bool = False  # its output must equal that of `baseline_for`

    @property
    def ours(self) -> bool:
        """Whether this is croupier's (the faster side of a ratio)."""
        return self.name.startswith("croupier")

    def memory_estimate(self, n: int, ranks: int) -> int:
        """Bytes the run needs above the interpreter, a rough upper estimate."""
        count = n / ranks if self.per_rank else n
        per_index = self.bytes_per_index
        if self.ours and n > 2**32:
            per_index *= 2  # croupier's buffers widen from uint32 to int64 above 2**32
        return int(count * per_index) + (64 << 20)


SYSTEMS: tuple[System, ...] = (
    System(
        "croupier",
        "sampler",
        'croupier.DistributedSampler(order="fast")',
        ("croupier",),
        bytes_per_index=8,
        per_rank=True,
    ),
    System(
        "torch-sampler",
        "sampler",
        "torch.utils.data.DistributedSampler",
        ("torch",),
        # a torch tensor, a Python list of N ints and the int objects: ~50 bytes measured
        bytes_per_index=56,
        baseline_for="croupier",
    ),
    System(
        "torchdata-sampler",
        "sampler",
        "torchdata StatefulDistributedSampler",
        ("torch", "torchdata"),
        bytes_per_index=56,
        baseline_for="croupier",
    ),
    System(
        "croupier-torch-order",
        "sampler",
        'croupier.DistributedSampler(order="torch")',
        ("croupier", "torch"),
        bytes_per_index=4.5,
        baseline_for="torch-sampler",
        same_output=True,
    ),
    System(
        "croupier-mixture",
        "sampler",
        "croupier.MixtureSampler (100 datasets)",
        ("croupier",),
        bytes_per_index=12,
        per_rank=True,
    ),
    System(
        "croupier-mixture-10k",
        "sampler",
        "croupier.MixtureSampler (10,000 datasets of unequal sizes)",
        ("croupier",),
        bytes_per_index=12,
        per_rank=True,
    ),
    System(
        "kempnerforge-mixture",
        "sampler",
        "kempnerforge-style MixtureSampler (100 datasets)",
        ("torch",),
        # every dataset's randperm as a list, the rank's lists, the reshuffled list
        bytes_per_index=64,
        baseline_for="croupier-mixture",
    ),
    System(
        "croupier-buckets",
        "batches",
        "croupier.BucketBatchSampler (token budget)",
        ("croupier",),
        # the lengths as given and copied (u32 + u64), the buckets' members (u64)
        bytes_per_index=24,
    ),
    System(
        "python-buckets",
        "batches",
        "Python bucketing (argsort, buckets, greedy token batches)",
        ("numpy",),
        # the argsort, a list of lengths and the batches as lists of ints
        bytes_per_index=72,
        baseline_for="croupier-buckets",
    ),
    System(
        "numpy-argsort",
        "batches",
        'numpy.argsort(lengths, kind="stable") alone',
        ("numpy",),
        bytes_per_index=12,
        baseline_for="croupier-buckets",
    ),
    System(
        "croupier-chunks",
        "reads",
        "croupier.ChunkSampler (chunks of 1,024 rows, 16 per request)",
        ("croupier",),
        # one request's rows and positions (the file is in the page cache, not counted)
        bytes_per_index=0.1,
        per_rank=True,
    ),
    System(
        "random-reads",
        "reads",
        "row-by-row reads in shuffled order (a map-style dataset)",
        ("numpy",),
        # the rank's shuffled row ids as Python ints
        bytes_per_index=40,
        per_rank=True,
        baseline_for="croupier-chunks",
    ),
    System(
        "croupier-elastic",
        "elastic",
        "croupier.DistributedSampler resumed mid-epoch on 3/4 of the ranks",
        ("croupier",),
        # the rest of the epoch on the new rank (u32) and one old share's piece (about half
        # an old share), per sample of the share
        bytes_per_index=8,
        per_rank=True,
    ),
    System(
        "torch-elastic",
        "elastic",
        "consumed-samples arithmetic over torch.randperm (Megatron's way, done by hand)",
        ("torch",),
        # the whole permutation (int64) and the rank's slice of the rest
        bytes_per_index=10,
        baseline_for="croupier-elastic",
    ),
    System(
        "croupier-permutation",
        "permutation",
        "croupier.permutation",
        ("croupier",),
        bytes_per_index=4.5,
    ),
    System(
        "numpy-permutation",
        "permutation",
        "numpy.random.default_rng().permutation",
        ("numpy",),
        bytes_per_index=8,
        baseline_for="croupier-permutation",
    ),
    System(
        "torch-randperm",
        "permutation",
        "torch.randperm",
        ("torch",),
        bytes_per_index=8,
        baseline_for="croupier-permutation",
    ),
)


def by_name(name: str) -> System:
    """The system called ``name``."""
    for s in SYSTEMS:
        if s.name == name:
            return s
    raise ValueError(f"unknown system {name!r}; known: {', '.join(s.name for s in SYSTEMS)}")
