"""Memory estimates that hold: every call that checks memory before its work (the binding's
``sized``) peaks within the estimate it checked.

The estimates are read as the binding checks them (``CROUPIER_MEMORY_TRACE`` writes each to
standard error); an operation may make several checked calls, whose estimates add up (a
bucket read that keeps an epoch's plan checks the plan and the batches as one). The operation
runs in a fresh process, whose peak resident memory above what it held just before
(``VmHWM``) must stay within that sum (plus a small allowance for the allocator and Python).
Only calls of at least 64 MiB are refused when they cannot fit, so every shape here is at
least that large, and under ``CROUPIER_MEMORY_LIMIT=1`` each operation is refused before its
work. The mixture's calls are covered beside its other tests.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap

import pytest

# Allocator slack, numpy's array header, pages the interpreter touches while returning.
_ALLOWANCE = 8 * 2**20

_PROBE = """
import os, re, sys
import numpy as np
import croupier

def peak():
    with open("/proc/self/status") as f:
        return int(re.search(r"VmHWM:\\s+(\\d+) kB", f.read()).group(1)) * 1024

def rss():
    with open("/proc/self/status") as f:
        return int(re.search(r"VmRSS:\\s+(\\d+) kB", f.read()).group(1)) * 1024

{setup}
mode = sys.argv[1]
if mode == "refused":
    try:
        work()
    except MemoryError as e:
        print("REFUSED", e)
    else:
        print("UNCHECKED")
else:
    # Reset the high-water mark to the present (Linux: writing 5 to clear_refs).
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    before = rss()
    out = work()
    print("PEAK", peak() - before)
"""

CALLS = {
    "permutation u32": "work = lambda: croupier.permutation(20_000_000, seed=1)",
    "distributed global share": (
        "s = croupier.DistributedSampler(40_000_000, 2, 1)\nwork = s.indices"
    ),
    "distributed per-rank share": (
        "s = croupier.DistributedSampler(40_000_000, 2, 1, order='per_rank')\nwork = s.indices"
    ),
    "distributed per-rank share, huge W": (
        "s = croupier.DistributedSampler(2**33 + 7, 2**9, 5, order='per_rank')\nwork = s.indices"
    ),
    "distributed global share, huge W": (
        "s = croupier.DistributedSampler(2**45, 2**20, 3)\nwork = s.indices"
    ),
    "distributed unshuffled": (
        "s = croupier.DistributedSampler(40_000_000, 2, 0, shuffle=False)\nwork = s.indices"
    ),
    "distributed torch order": (
        "s = croupier.DistributedSampler(20_000_000, 2, 0, order='torch')\nwork = s.indices"
    ),
    "distributed elastic rest": (
        "old = croupier.DistributedSampler(100_000_000, 8, 0)\n"
        "old.set_skip(len(old) // 3)\n"
        "s = croupier.DistributedSampler(100_000_000, 3, 2)\n"
        "s.load_state_dict(old.state_dict())\n"
        "work = s.indices"
    ),
    "buckets, many buckets": (
        "lengths = (np.arange(30_000_000, dtype=np.uint64) * 7919) % 4000 + 1\n"
        "s = croupier.BucketBatchSampler(lengths, batch_size=64, buckets=1024, "
        "num_replicas=2, rank=0)\n"
        "work = s.batches"
    ),
    "buckets, per-rank order": (
        "lengths = (np.arange(30_000_000, dtype=np.uint64) * 7919) % 4000 + 1\n"
        "s = croupier.BucketBatchSampler(lengths, max_tokens=20_000, order='per_rank', "
        "num_replicas=2, rank=1)\n"
        "work = s.batches"
    ),
}
# The default run keeps one shape of each kind of call; the rest run with the slow tests.
FAST = {"distributed global share", "buckets, per-rank order", "permutation u32"}


def _run(call: str, mode: str, limit: str | None) -> tuple[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "CROUPIER_MEMORY_LIMIT"}
    env["CROUPIER_MEMORY_TRACE"] = "1"
    if limit is not None:
        env["CROUPIER_MEMORY_LIMIT"] = limit
    code = _PROBE.replace("{setup}", textwrap.dedent(CALLS[call]))
    out = subprocess.run(
        [sys.executable, "-c", code, mode], capture_output=True, text=True, env=env, timeout=900
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout, out.stderr


@pytest.mark.parametrize(
    "call", [c if c in FAST else pytest.param(c, marks=pytest.mark.slow) for c in CALLS]
)
def test_peak_memory_stays_within_the_estimate(call):
    if not os.path.exists("/proc/self/clear_refs"):
        pytest.skip("needs Linux's /proc/self/clear_refs to reset the peak")
    said, _ = _run(call, "refused", "1")
    assert "REFUSED" in said, f"{call}: not refused under CROUPIER_MEMORY_LIMIT=1: {said}"
    out, trace = _run(call, "run", None)
    # The setup's own calls (a sampler's construction) ran before the measured work.
    estimates = [int(b) for b in re.findall(r"memory estimate: .*: (\d+) bytes", trace)]
    peak = int(re.search(r"PEAK (-?\d+)", out).group(1))
    estimate = sum(estimates)
    assert peak <= estimate + _ALLOWANCE, (
        f"{call}: peaked {peak / 2**20:.1f} MiB above its start, estimates "
        f"{[round(e / 2**20, 1) for e in estimates]} MiB"
    )
    # The estimate is not a blanket over-claim either: a call refused at a fraction of its
    # memory would be refused on machines where it fits.
    assert estimate <= 4 * max(peak, 2**26), (call, estimate, peak)
