"""The ``croupier`` command line: ``croupier demo`` and ``croupier --version``."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

from croupier import __version__
from croupier.samplers import DistributedSampler

__all__ = ["main"]


def _demo(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    sampler = DistributedSampler(
        args.n, num_replicas=args.num_replicas, rank=args.rank, seed=args.seed
    )
    sampler.set_epoch(args.epoch)
    it = iter(sampler)
    first = [next(it) for _ in range(min(args.count, len(sampler)))]
    elapsed = time.perf_counter() - t0
    print(
        f"croupier {__version__}: N={args.n:,}, rank {args.rank} of {args.num_replicas}, "
        f"seed {args.seed}, epoch {args.epoch}"
    )
    print(f"this rank's epoch: {len(sampler):,} indices")
    print(f"first {len(first)} indices: {first}")
    print(f"time to the first indices: {elapsed:.3f} s")
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="croupier", description="Fast, reproducible, resumable index samplers for PyTorch."
    )
    parser.add_argument("--version", action="version", version=f"croupier {__version__}")
    sub = parser.add_subparsers(dest="command")
    demo = sub.add_parser("demo", help="print one rank's first indices and how long they took")
    demo.add_argument("--n", type=int, default=10_000_000, help="dataset length (default 1e7)")
    demo.add_argument("--num-replicas", type=int, default=8, help="number of ranks (default 8)")
    demo.add_argument("--rank", type=int, default=0, help="this rank (default 0)")
    demo.add_argument("--seed", type=int, default=0, help="shuffle seed (default 0)")
    demo.add_argument("--epoch", type=int, default=0, help="epoch (default 0)")
    demo.add_argument("--count", type=int, default=10, help="how many indices to print")
    demo.set_defaults(func=_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``croupier`` command."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    try:
        return int(args.func(args))
    except (ValueError, TypeError) as e:
        print(f"croupier: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
