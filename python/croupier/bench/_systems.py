"""What ``croupier bench`` compares: each system, what it measures and how much memory it needs.

Seven families. *Samplers* produce one rank's epoch of a ``DistributedSampler`` (time to the first
index, to the whole epoch, to the first index after resuming at mid-epoch); *mixtures* the same
for one rank's epoch of a ``MixtureSampler`` over 100 datasets that add up to N.
*Buckets* systems produce one rank's epoch of token-budget batches over N log-normal lengths
(time to the first batch, to the whole epoch, to the first batch after resuming, and the
padding efficiency): croupier in its global order and its earlier per-rank one, the usual Python
bucketing, lhotse's ``DynamicBucketingSampler`` when lhotse is installed (an optional
baseline), ``numpy.argsort`` alone being the yardstick. *Reads* systems read one
rank's epoch of N rows of 16 bytes from a memory-mapped ``.npy`` file (time to read them all
and the throughput in MB/s): in ``ChunkSampler`` load requests, or row by row in shuffled
order as a map-style dataset is read. *Elastic* systems resume an epoch checkpointed at its
middle on W ranks on ``W' = max(1, 3W/4)`` ranks (8 -> 6) and produce one new rank's rest of
the epoch (time to its first index after loading the state, to the whole rest, peak memory).
*Permutations* produce a full permutation of ``[0, N)`` (time to the whole of it).
*Megatron* systems build Megatron-Core's dataset indices at size N with megatron-core's own
helpers or croupier's identical ones (``croupier.compat.megatron``): the blend of N positions
over 100 datasets, the shuffle index of N samples, and the sample index over N documents
(time to the whole array; the output must be the same); the same blend and shuffle index
index-free (time to construct them and read the first sample's position); and one rank's
epoch of Megatron-LM's ``MegatronPretrainingRandomSampler`` over N samples (rank 3 of 8,
micro-batches of 4, its default data sharding; time to every micro-batch, the same ones). Not
in the default run; megatron-core's systems skipped without megatron-core.

The *headline* systems (croupier and the main alternative of each family) are what a plain
``croupier bench`` runs; ``--all`` adds the rest. Each system's cost model (``startup_s``,
``s_per_index``: CPU seconds of one run) gives the estimate printed before a run starts, and
a size whose per-sample part alone is over the timeout is skipped rather than run out; its
``bytes_per_index`` skips a size that would not fit in the memory available. A system whose
``needs`` cannot be imported is reported as not installed, not run.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["EXTRA_FAMILIES", "FAMILIES", "SYSTEMS", "System", "by_name", "choose"]

#: The families, in the order tables and plots show them.
FAMILIES = (
    "samplers",
    "mixtures",
    "buckets",
    "reads",
    "elastic",
    "permutations",
    "megatron",
)
#: Families with no system in the default run (asked for with --families or --all).
EXTRA_FAMILIES = ("megatron",)


@dataclass(frozen=True)
class System:
    """One benchmarked implementation."""

    name: str
    family: str  # one of FAMILIES
    label: str
    needs: tuple[str, ...]  # importable modules it needs
    bytes_per_index: float  # working memory per sample of N (per share sample if per_rank)
    # CPU seconds of one run: the process, its imports and its untimed data, plus per sample
    # of N (measured on a 2-core EPYC VM at N = 1e6 to 1e8; an estimate, not a promise).
    startup_s: float
    s_per_index: float
    headline: bool = True  # in the default run
    per_rank: bool = False  # memory scales with N / W instead of N
    # The system it is compared with: a baseline names the croupier system it is measured
    # against; a croupier system may name a baseline that yields the same output.
    baseline_for: str = ""
    same_output: bool = False  # its output must equal that of `baseline_for`
    # A baseline written for croupier's benchmark from a documented algorithm, where no
    # package that does it installs here: what it stands for (tables mark it).
    hand_written: str = ""

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

    def cpu_estimate(self, n: int) -> float:
        """CPU seconds one run at ``n`` takes, roughly (imports included)."""
        return self.startup_s + n * self.s_per_index


SYSTEMS: tuple[System, ...] = (
    System(
        "croupier",
        "samplers",
        'croupier.DistributedSampler(order="global")',
        ("croupier",),
        bytes_per_index=8,
        startup_s=3.8,
        s_per_index=1.0e-08,
        per_rank=True,
    ),
    System(
        "croupier-per-rank-order",
        "samplers",
        'croupier.DistributedSampler(order="per_rank")',
        ("croupier",),
        bytes_per_index=8,
        startup_s=3.8,
        s_per_index=1.0e-08,
        per_rank=True,
        headline=False,
        baseline_for="croupier",
    ),
    System(
        "torch-sampler",
        "samplers",
        "torch.utils.data.DistributedSampler",
        ("torch",),
        # a torch tensor, a Python list of N ints and the int objects: ~50 bytes measured
        bytes_per_index=56,
        startup_s=3.9,
        s_per_index=3.8e-07,
        baseline_for="croupier",
    ),
    System(
        "torchdata-sampler",
        "samplers",
        "torchdata StatefulDistributedSampler",
        ("torch", "torchdata"),
        bytes_per_index=56,
        startup_s=3.8,
        s_per_index=5.3e-07,
        baseline_for="croupier",
    ),
    System(
        "croupier-torch-order",
        "samplers",
        'croupier.DistributedSampler(order="torch")',
        ("croupier", "torch"),
        bytes_per_index=4.5,
        startup_s=3.2,
        s_per_index=1.2e-07,
        headline=False,
        baseline_for="torch-sampler",
        same_output=True,
    ),
    System(
        "croupier-mixture",
        "mixtures",
        "croupier.MixtureSampler (100 datasets)",
        ("croupier",),
        bytes_per_index=12,
        startup_s=3.6,
        s_per_index=1.0e-08,
        per_rank=True,
    ),
    System(
        "croupier-mixture-per-rank-order",
        "mixtures",
        'croupier.MixtureSampler(order="per_rank") (100 datasets)',
        ("croupier",),
        bytes_per_index=12,
        startup_s=3.6,
        s_per_index=1.0e-08,
        per_rank=True,
        headline=False,
        baseline_for="croupier-mixture",
    ),
    System(
        "croupier-mixture-balanced",
        "mixtures",
        'croupier.MixtureSampler(interleave="balanced") (100 datasets)',
        ("croupier",),
        bytes_per_index=12,
        startup_s=3.6,
        # every rank replays the whole balanced sequence, about 35 ns a position
        s_per_index=1.0e-07,
        headline=False,
        per_rank=True,
        baseline_for="croupier-mixture",
    ),
    System(
        "croupier-mixture-10k",
        "mixtures",
        "croupier.MixtureSampler (10,000 datasets of unequal sizes)",
        ("croupier",),
        bytes_per_index=12,
        startup_s=3.2,
        s_per_index=2.5e-08,
        headline=False,
        per_rank=True,
    ),
    System(
        "kempnerforge-mixture",
        "mixtures",
        "kempnerforge-style MixtureSampler (100 datasets)",
        ("torch",),
        # every dataset's randperm as a list, the rank's lists, the reshuffled list
        bytes_per_index=64,
        startup_s=3.0,
        s_per_index=8.8e-07,
        baseline_for="croupier-mixture",
        hand_written="kempnerforge's MixtureSampler, whose package is not on PyPI",
    ),
    System(
        "croupier-buckets",
        "buckets",
        "croupier.BucketBatchSampler (token budget)",
        ("croupier",),
        # the lengths as given and copied (u32 + u64), the buckets' members (u64)
        bytes_per_index=24,
        startup_s=3.5,
        s_per_index=1.3e-07,
    ),
    System(
        "croupier-buckets-per-rank-order",
        "buckets",
        'croupier.BucketBatchSampler(order="per_rank") (token budget)',
        ("croupier",),
        # the lengths as given and copied (u32 + u64), the buckets' members (u64)
        bytes_per_index=24,
        startup_s=3.5,
        s_per_index=1.5e-07,
        headline=False,
        baseline_for="croupier-buckets",
    ),
    System(
        "python-buckets",
        "buckets",
        "Python bucketing (argsort, buckets, greedy token batches)",
        ("numpy",),
        # the argsort, a list of lengths and the batches as lists of ints
        bytes_per_index=72,
        startup_s=0.6,
        s_per_index=1.6e-06,
        baseline_for="croupier-buckets",
        hand_written="the length bucketing of fairseq- and ESPnet-style loaders, in numpy",
    ),
    System(
        "lhotse-buckets",
        "buckets",
        "lhotse DynamicBucketingSampler (lazy CutSet, max_duration as the token budget)",
        ("lhotse",),
        # the lengths (u32) and this rank's batches as lists of Python ints (~40 bytes a
        # sample of the share, 5 per sample of N at W=8) with their flat copy; the sampler's
        # buffer of 20,000 cuts (~20 MiB) is in the constant
        bytes_per_index=16,
        # every rank reads every cut, ~45 us each, an epoch and a half (the epoch, then the
        # resume's fast-forward over half of it); importing lhotse (and torch) takes ~4 s
        startup_s=6.5,
        s_per_index=6.5e-05,
        headline=False,
        baseline_for="croupier-buckets",
    ),
    System(
        "numpy-argsort",
        "buckets",
        'numpy.argsort(lengths, kind="stable") alone',
        ("numpy",),
        bytes_per_index=12,
        startup_s=0.3,
        s_per_index=2.4e-07,
        headline=False,
        baseline_for="croupier-buckets",
    ),
    System(
        "croupier-chunks",
        "reads",
        "croupier.ChunkSampler (chunks of 1,024 rows, 16 per request)",
        ("croupier",),
        # one request's rows and positions (the file is in the page cache, not counted)
        bytes_per_index=0.1,
        startup_s=3.3,
        s_per_index=3.0e-08,
        per_rank=True,
    ),
    System(
        "random-reads",
        "reads",
        "row-by-row reads in shuffled order (a map-style dataset)",
        ("numpy",),
        # the rank's shuffled row ids as Python ints
        bytes_per_index=40,
        startup_s=0.5,
        s_per_index=5.0e-07,
        per_rank=True,
        baseline_for="croupier-chunks",
        hand_written="a map-style dataset read row by row in shuffled order",
    ),
    System(
        "croupier-elastic",
        "elastic",
        'croupier.DistributedSampler(order="global") resumed mid-epoch on 3/4 of the ranks',
        ("croupier",),
        # the rest of the epoch on the new rank (u32) and one old share's piece (about half
        # an old share), per sample of the share
        bytes_per_index=8,
        startup_s=3.9,
        s_per_index=2.5e-08,
        per_rank=True,
    ),
    System(
        "croupier-elastic-per-rank",
        "elastic",
        'croupier.DistributedSampler(order="per_rank") resumed mid-epoch on 3/4 of the ranks',
        ("croupier",),
        # the rest of the epoch on the new rank (u32) and one old share's piece (about half
        # an old share), per sample of the share
        bytes_per_index=8,
        startup_s=3.9,
        s_per_index=2.5e-08,
        per_rank=True,
        headline=False,
        baseline_for="croupier-elastic",
    ),
    System(
        "torch-elastic",
        "elastic",
        "consumed-samples arithmetic over torch.randperm (Megatron's way, done by hand)",
        ("torch",),
        # the whole permutation (int64) and the rank's slice of the rest
        bytes_per_index=10,
        startup_s=3.9,
        s_per_index=7.0e-08,
        baseline_for="croupier-elastic",
        hand_written="Megatron's consumed-samples arithmetic over torch.randperm",
    ),
    System(
        "croupier-permutation",
        "permutations",
        "croupier.permutation",
        ("croupier",),
        bytes_per_index=4.5,
        startup_s=0.35,
        s_per_index=1.2e-08,
    ),
    System(
        "numpy-permutation",
        "permutations",
        "numpy.random.default_rng().permutation",
        ("numpy",),
        bytes_per_index=8,
        startup_s=0.35,
        s_per_index=1.1e-07,
        baseline_for="croupier-permutation",
    ),
    System(
        "torch-randperm",
        "permutations",
        "torch.randperm",
        ("torch",),
        bytes_per_index=8,
        startup_s=4.0,
        s_per_index=1.2e-07,
        baseline_for="croupier-permutation",
    ),
    System(
        "croupier-megatron-blend",
        "megatron",
        "croupier.compat.megatron.build_blending_indices (100 datasets)",
        ("croupier",),
        bytes_per_index=10,
        startup_s=0.5,
        s_per_index=5.5e-08,
        headline=False,
    ),
    System(
        "megatron-blend",
        "megatron",
        "megatron-core helpers.build_blending_indices (100 datasets)",
        ("megatron.core.datasets.helpers",),
        bytes_per_index=10,
        startup_s=6.0,
        s_per_index=1.6e-07,
        headline=False,
        baseline_for="croupier-megatron-blend",
        same_output=True,
    ),
    System(
        "croupier-megatron-shuffle",
        "megatron",
        "croupier.compat.megatron.build_shuffle_index",
        ("croupier",),
        bytes_per_index=4,
        startup_s=0.5,
        s_per_index=2.5e-08,
        headline=False,
    ),
    System(
        "megatron-shuffle",
        "megatron",
        "megatron-core gpt_dataset._build_shuffle_index (numpy RandomState.shuffle)",
        ("megatron.core.datasets.gpt_dataset",),
        bytes_per_index=4,
        startup_s=6.0,
        s_per_index=1.7e-07,
        headline=False,
        baseline_for="croupier-megatron-shuffle",
        same_output=True,
    ),
    System(
        "croupier-megatron-sample-index",
        "megatron",
        "croupier.compat.megatron.build_sample_idx (N documents, 4096 tokens a sample)",
        ("croupier",),
        bytes_per_index=12,
        startup_s=0.5,
        s_per_index=4.0e-08,
        headline=False,
    ),
    System(
        "megatron-sample-index",
        "megatron",
        "megatron-core helpers.build_sample_idx (N documents, 4096 tokens a sample)",
        ("megatron.core.datasets.helpers",),
        bytes_per_index=12,
        startup_s=6.0,
        s_per_index=6.0e-08,
        headline=False,
        baseline_for="croupier-megatron-sample-index",
        same_output=True,
    ),
    System(
        "croupier-megatron-index-free",
        "megatron",
        "croupier.compat.megatron index-free: the first sample's blend and shuffle position "
        "(100 datasets, nothing built)",
        ("croupier",),
        bytes_per_index=0,
        startup_s=0.5,
        s_per_index=0.0,
        headline=False,
    ),
    System(
        "croupier-megatron-random-sampler",
        "megatron",
        "croupier.compat.megatron.MegatronPretrainingRandomSampler (rank 3 of 8, micro-batch 4)",
        ("croupier",),
        bytes_per_index=2,
        startup_s=0.5,
        s_per_index=6.0e-09,
        headline=False,
    ),
    System(
        "megatron-random-sampler",
        "megatron",
        "Megatron-LM's MegatronPretrainingRandomSampler (rank 3 of 8, micro-batch 4)",
        ("torch",),
        bytes_per_index=8,
        startup_s=4.0,
        s_per_index=3.0e-08,
        headline=False,
        baseline_for="croupier-megatron-random-sampler",
        same_output=True,
        hand_written="Megatron-LM's MegatronPretrainingRandomSampler, which is not on PyPI",
    ),
)


# Names of systems before the per-rank order was renamed (it was "fast"): still accepted.
RENAMED = {
    "croupier-fast-order": "croupier-per-rank-order",
    "croupier-mixture-fast-order": "croupier-mixture-per-rank-order",
    "croupier-buckets-fast-order": "croupier-buckets-per-rank-order",
    "croupier-elastic-fast": "croupier-elastic-per-rank",
}


def by_name(name: str) -> System:
    """The system called ``name`` (or called so before a rename: :data:`RENAMED`)."""
    name = RENAMED.get(name, name)
    for s in SYSTEMS:
        if s.name == name:
            return s
    raise ValueError(f"unknown system {name!r}; known: {', '.join(s.name for s in SYSTEMS)}")


def choose(
    systems: tuple[str, ...] = (), families: tuple[str, ...] = (), everything: bool = False
) -> list[System]:
    """The systems a run measures: those named, else every system of the families named, else
    the headline systems (every system if ``everything``)."""
    if systems and families:
        raise ValueError("name --systems or --families, not both")
    if systems:
        return [by_name(name) for name in dict.fromkeys(systems)]
    for family in families:
        if family not in FAMILIES:
            raise ValueError(f"unknown family {family!r}; known: {', '.join(FAMILIES)}")
    if families:
        return [s for s in SYSTEMS if s.family in families]
    return [s for s in SYSTEMS if everything or s.headline]
