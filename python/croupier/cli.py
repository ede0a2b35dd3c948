"""The ``croupier`` command line: ``croupier bench`` (and its ``--sweep-ranks`` world-size sweep),
``croupier demo``, ``croupier --version``."""

from __future__ import annotations

import argparse
import re
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from croupier import __version__

__all__ = ["main"]


def _demo(args: argparse.Namespace) -> int:
    from croupier.samplers import DistributedSampler

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


def _count(text: str) -> int:
    """An integer written as ``100000000``, ``1e8``, ``1_000`` or ``2**33+5``."""
    t = text.replace("_", "").strip()
    m = re.fullmatch(r"2\*\*(\d+)([+-]\d+)?", t)
    if m:
        return int(2 ** int(m.group(1))) + int(m.group(2) or 0)
    try:
        return int(t)
    except ValueError:
        pass
    try:
        value = float(t)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if not value.is_integer():
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}")
    return int(value)


def _header(m: dict[str, Any]) -> str:
    """One line naming the machine and the software versions of a run."""
    return (
        f"croupier {m['croupier']}, {m.get('cpu', '?')}, {m.get('cpus')} cores, "
        f"{m.get('memory_gib')} GiB, Python {m['python']}, numpy {m.get('numpy')}, "
        f"torch {m.get('torch')}, torchdata {m.get('torchdata')}"
    )


def _report(
    results: dict[str, Any],
    text: str,
    plot: Callable[[dict[str, Any], Path], bool],
    stem: Path,
) -> None:
    """Writes ``stem``.json (every run), .md (the table under the machine) and .png (unless
    matplotlib is missing), and prints the table."""
    from croupier.bench._report import write_json

    json_path, md_path, png_path = (stem.with_suffix(ext) for ext in (".json", ".md", ".png"))
    write_json(results, json_path)
    header = _header(results["machine"])
    md_path.write_text(f"{header}\n\n{text}\n")
    drew = plot(results, png_path)
    print(f"{header}\n\n{text}\n")
    print(f"wrote {json_path}, {md_path}", end="")
    print(f", {png_path}" if drew else " (no plot: matplotlib is not installed)")


def _sweep(args: argparse.Namespace) -> int:
    from croupier.bench._ranks import DEFAULT_NS, SweepConfig, check, plot, run, table

    given = [
        f"--{name}" for name in ("systems", "ranks", "rank") if getattr(args, name) is not None
    ]
    if given:
        raise ValueError(
            f"--sweep-ranks cannot be combined with {', '.join(given)}: the sweep times "
            "croupier alone, rank W // 2 of each W it lists"
        )
    cfg = SweepConfig(
        ranks=tuple(args.sweep_ranks),
        ns=tuple(args.n) if args.n is not None else DEFAULT_NS,
        seeds=tuple(args.seeds),
        repeats=args.repeats if args.repeats is not None else 3,
        timeout=args.timeout,
    )
    check(cfg)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    print(
        f"croupier bench --sweep-ranks: W in {sorted(cfg.ranks)}, N in "
        f"{[f'{n:,}' for n in cfg.ns]}, seeds {list(cfg.seeds)}, {cfg.repeats} run(s) each; "
        f"results in {out}/",
        file=sys.stderr,
    )
    results = run(cfg, progress=lambda line: print(line, file=sys.stderr, flush=True))
    _report(results, table(results), plot, out / "ranks-sweep")
    return 0


def _bench(args: argparse.Namespace) -> int:
    if args.sweep_ranks is not None:
        return _sweep(args)
    from croupier.bench import BenchConfig, run
    from croupier.bench._report import plot, table
    from croupier.bench._runner import DEFAULT_NS

    cfg = BenchConfig(
        ns=tuple(args.n) if args.n is not None else DEFAULT_NS,
        ranks=args.ranks if args.ranks is not None else 8,
        rank=args.rank if args.rank is not None else 3,
        seeds=tuple(args.seeds),
        repeats=args.repeats if args.repeats is not None else 1,
        systems=tuple(args.systems or ()),
        timeout=args.timeout,
    )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    print(
        f"croupier bench: N in {[f'{n:,}' for n in cfg.ns]}, {cfg.ranks} ranks (rank "
        f"{cfg.rank}), seeds {list(cfg.seeds)}, {cfg.repeats} run(s) each; results in {out}/",
        file=sys.stderr,
    )
    results = run(cfg, progress=lambda line: print(line, file=sys.stderr, flush=True))
    _report(results, table(results), plot, out / "bench")
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="croupier", description="Fast, reproducible, resumable index samplers for PyTorch."
    )
    parser.add_argument("--version", action="version", version=f"croupier {__version__}")
    sub = parser.add_subparsers(dest="command")
    bench = sub.add_parser(
        "bench",
        help="compare croupier with torch, torchdata and numpy (time, resume, peak RSS)",
        description="Runs each system in its own subprocess, one at a time, and prints a "
        "table of medians with ratios; writes bench.json, bench.md and bench.png. With "
        "--sweep-ranks, runs the world-size sweep instead: one rank's "
        'DistributedSampler(order="fast") epoch for each W and N (time per index, first '
        "index, memory added); writes ranks-sweep.json, ranks-sweep.md and ranks-sweep.png.",
    )
    bench.add_argument(
        "--n",
        nargs="+",
        type=_count,
        default=None,
        help="dataset lengths, up to 1e10 (default: 1e6 1e7 1e8; with --sweep-ranks 1e8 1e9); "
        "1e8 and 2**33+5 work",
    )
    bench.add_argument("--ranks", type=_count, default=None, help="number of ranks W (default 8)")
    bench.add_argument("--rank", type=_count, default=None, help="the rank timed (default 3)")
    bench.add_argument("--seeds", nargs="+", type=_count, default=[0], help="seeds (default 0)")
    bench.add_argument(
        "--repeats",
        type=int,
        default=None,
        help="runs per seed (default 1; with --sweep-ranks 3)",
    )
    bench.add_argument(
        "--sweep-ranks",
        nargs="+",
        type=_count,
        default=None,
        metavar="W",
        help="run the world-size sweep over these W (e.g. 8 64 256 1024 4096) instead of the "
        "systems table; not with --systems, --ranks or --rank",
    )
    from croupier.bench._systems import SYSTEMS  # stdlib only: keeps --help light

    bench.add_argument(
        "--systems",
        nargs="+",
        default=None,
        help="which systems (default: all installed): " + ", ".join(s.name for s in SYSTEMS),
    )
    bench.add_argument("--timeout", type=float, default=1800.0, help="seconds per run")
    bench.add_argument("--out", default="croupier-bench", help="output folder")
    bench.set_defaults(func=_bench)
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
