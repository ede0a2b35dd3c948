#!/usr/bin/env python3
"""Resume of a ``ChunkSampler`` at mid-epoch of 1e9 rows (chunks of 256, 4 per request,
batches of 64, W = 8): time from a fresh sampler (construction, ``n_iters``,
``load_state_dict``) to its first load request, median over seeds 0..6 and ranks 0 and W - 1,
one process. With ``--whole-epoch``, the time of rank 3's whole epoch instead (every request
of ``sample()``, seed 0).

    python benches/chunk_resume_1e9.py [--n 1000000000] [--chunk 256] [--ranks 8] [--whole-epoch]
"""

from __future__ import annotations

import argparse
import statistics
import time

from croupier import ChunkSampler

PRELOAD, BATCH = 4, 64


def resume(n: int, chunk: int, ranks: int, rank: int, seed: int) -> float:
    """Seconds from a fresh sampler to its first request after loading a mid-epoch state."""
    t0 = time.perf_counter()
    s = ChunkSampler(chunk, PRELOAD, BATCH, seed=seed, num_replicas=ranks, rank=rank)
    total = s.n_iters(n)
    s.load_state_dict({**s.state_dict(), "position": total // 2 + 1, "n_obs": n})
    next(iter(s.sample(n)))
    return time.perf_counter() - t0


def whole_epoch(n: int, chunk: int, ranks: int) -> tuple[int, float]:
    """Requests of rank 3's epoch and the seconds they took."""
    s = ChunkSampler(chunk, PRELOAD, BATCH, seed=0, num_replicas=ranks, rank=min(3, ranks - 1))
    t0 = time.perf_counter()
    k = sum(1 for _ in s.sample(n))
    return k, time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=10**9)
    parser.add_argument("--chunk", type=int, default=256)
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--whole-epoch", action="store_true")
    args = parser.parse_args()
    if args.whole_epoch:
        k, seconds = whole_epoch(args.n, args.chunk, args.ranks)
        print(f"n={args.n} chunk={args.chunk} W={args.ranks}: {k} requests in {seconds:.2f} s")
        return
    times = [
        resume(args.n, args.chunk, args.ranks, rank, seed)
        for seed in range(7)
        for rank in (0, args.ranks - 1)
    ]
    print(
        f"n={args.n} chunk={args.chunk} W={args.ranks}: median "
        f"{statistics.median(times) * 1e3:.2f} ms, min {min(times) * 1e3:.2f} ms, "
        f"max {max(times) * 1e3:.2f} ms over {len(times)} resumes"
    )


if __name__ == "__main__":
    main()
