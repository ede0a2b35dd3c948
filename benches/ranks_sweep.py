#!/usr/bin/env python3
"""One rank's epoch of ``DistributedSampler(order="fast")`` across world sizes: time per index
of the whole share (``indices()``), time to the first index, and the memory the share adds,
for W in {8, 64, 256, 1024, 4096} at N = 1e8 and 1e9; each measurement in its own process
(median of ``--repeats``), a table on stdout and a log-log plot.

    python benches/ranks_sweep.py [--n 1e8 1e9] [--ranks 8 64 256 1024 4096] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

_CHILD = """
import json, sys, time
from croupier import DistributedSampler
n, w = int(sys.argv[1]), int(sys.argv[2])
def rss():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
base = rss()
t = time.perf_counter()
first = next(iter(DistributedSampler(n, num_replicas=w, rank=w // 2, seed=1)))
first_s = time.perf_counter() - t
t = time.perf_counter()
share = DistributedSampler(n, num_replicas=w, rank=w // 2, seed=1).indices()
epoch_s = time.perf_counter() - t
assert int(share[0]) == first
print(json.dumps({"first_s": first_s, "epoch_s": epoch_s, "count": len(share),
                  "added_mib": rss() - base}))
"""


def measure(n: int, w: int, repeats: int) -> dict[str, float]:
    runs = []
    for _ in range(repeats):
        out = subprocess.run(
            [sys.executable, "-c", _CHILD, str(n), str(w)],
            capture_output=True,
            text=True,
            check=True,
        )
        runs.append(json.loads(out.stdout))
    row = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    row["ns_per_index"] = row["epoch_s"] / row["count"] * 1e9
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", nargs="+", type=float, default=[1e8, 1e9])
    parser.add_argument("--ranks", nargs="+", type=int, default=[8, 64, 256, 1024, 4096])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("croupier-bench"))
    args = parser.parse_args()
    rows = []
    print("| N | W | per index | vs W=8 | first index | whole share | memory added |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for n in map(int, args.n):
        base = None
        for w in args.ranks:
            row = {"n": n, "w": w, **measure(n, w, args.repeats)}
            rows.append(row)
            base = base or row["ns_per_index"]
            print(
                f"| {n:.0e} | {w} | {row['ns_per_index']:.0f} ns | "
                f"{row['ns_per_index'] / base:.2f}x | {row['first_s'] * 1e3:.1f} ms | "
                f"{row['epoch_s'] * 1e3:.1f} ms | {row['added_mib']:.0f} MiB |",
                flush=True,
            )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "ranks-sweep.json").write_text(json.dumps(rows, indent=2) + "\n")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.2))
    for n in sorted({r["n"] for r in rows}):
        pts = [r for r in rows if r["n"] == n]
        ws = [r["w"] for r in pts]
        axes[0].loglog(ws, [r["ns_per_index"] for r in pts], marker="o", label=f"N={n:.0e}")
        axes[1].loglog(ws, [r["first_s"] * 1e3 for r in pts], marker="o", label=f"N={n:.0e}")
    axes[0].set_title("whole share: ns per index")
    axes[1].set_title("first index (ms)")
    for ax in axes:
        ax.set_xlabel("W (ranks)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(args.out / "ranks-sweep.png", dpi=110)
    print(f"wrote {args.out / 'ranks-sweep.json'} and {args.out / 'ranks-sweep.png'}")


if __name__ == "__main__":
    main()
