"""order="torch" against torch's own DistributedSampler at scale, each run in its own process.

Usage: python benches/torch_order_scale.py [N] [W] [RANK]   (defaults 1e8, 8, 3)

Measures the time to one rank's whole epoch of indices (torch: a list of ints; croupier: the
same list, and the numpy array from indices()) and each process's peak RSS, checks that all
produce the same indices (by a digest), and prints the ratios. Until `croupier bench`
takes this over, this script is how the order="torch" target is measured.
"""

from __future__ import annotations

import json
import subprocess
import sys

CHILD = r"""
import hashlib, json, resource, sys, time
import numpy as np
n, w, r, which = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
import torch  # a training process has torch imported either way
import croupier
from torch.utils.data import DistributedSampler as TorchSampler
rss = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
baseline = rss()
t0 = time.perf_counter()
if which == "torch":
    s = TorchSampler(range(n), num_replicas=w, rank=r, seed=0)
    s.set_epoch(1)
    idx = list(s)
else:
    s = croupier.DistributedSampler(n, num_replicas=w, rank=r, seed=0, order="torch")
    s.set_epoch(1)
    idx = s.indices() if which == "croupier" else list(s)
elapsed = time.perf_counter() - t0
peak = rss()
arr = np.asarray(idx, dtype=np.int64)
digest = hashlib.sha256(arr.tobytes()).hexdigest()
print(json.dumps({"seconds": elapsed, "peak_rss": peak, "baseline_rss": baseline,
                  "len": len(arr), "sha256": digest}))
"""


def run(which: str, n: int, w: int, r: int) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(n), str(w), str(r), which],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout)


def main() -> None:
    n = int(float(sys.argv[1])) if len(sys.argv) > 1 else 100_000_000
    w = int(sys.argv[2]) if len(sys.argv) > 2 else 8
    r = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    theirs = run("torch", n, w, r)
    ours = run("croupier", n, w, r)
    ours_list = run("croupier-list", n, w, r)
    same = all(
        m["sha256"] == theirs["sha256"] and m["len"] == theirs["len"] for m in (ours, ours_list)
    )
    print(f"N={n:,} W={w} rank={r}, epoch 1, seed 0: identical output: {same}")
    mib = 2**20
    rows = (
        ("torch: list(sampler)", theirs),
        ("croupier: list(sampler)", ours_list),
        ("croupier: indices()", ours),
    )
    for name, m in rows:
        added = (m["peak_rss"] - m["baseline_rss"]) / mib
        print(
            f"  {name:24s} {m['seconds']:8.2f} s  peak RSS {m['peak_rss'] / mib:6.0f} MiB "
            f"(process with torch imported: {m['baseline_rss'] / mib:.0f} MiB; "
            f"added by the sampler: {added:.0f} MiB)"
        )
    added = [m["peak_rss"] - m["baseline_rss"] for m in (theirs, ours)]
    print(
        f"  ratios against torch: list {theirs['seconds'] / ours_list['seconds']:.1f}x faster, "
        f"indices() {theirs['seconds'] / ours['seconds']:.1f}x faster; peak RSS of indices() "
        f"{theirs['peak_rss'] / ours['peak_rss']:.1f}x lower in all, "
        f"{added[0] / added[1]:.1f}x lower in what the sampler adds"
    )
    if not same:
        sys.exit(1)


if __name__ == "__main__":
    main()
