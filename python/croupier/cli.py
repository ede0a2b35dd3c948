"""The ``croupier`` command line: ``croupier bench`` (and its ``--sweep-ranks`` world-size sweep),
``croupier demo``, ``croupier --version``.

Every mistake on the command line is one line naming the option and what it accepts, plus a
hint to ``--help``, before anything is printed or run; a bench run writes its results only
when it finishes, all files together, each naming the run.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import re
import shlex
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

from croupier import __version__
from croupier.bench._runner import show

__all__ = ["main"]

U64 = 2**64
I64_MAX = 2**63 - 1


class _UsageError(Exception):
    """A mistake on the command line: reported as one line and a hint, exit status 2."""


class _Parser(argparse.ArgumentParser):
    """argparse, with a mistake reported as one line and a hint instead of the usage text."""

    def error(self, message: str) -> NoReturn:
        _complain(self.prog, message)
        sys.exit(2)


def _complain(prog: str, message: str) -> None:
    print(f"{prog}: error: {message}\n(see '{prog} --help')", file=sys.stderr)


def _count(text: str) -> int:
    """An integer written as ``100000000``, ``1e8``, ``1_000`` or ``2**33+5``."""
    t = text.replace("_", "").strip()
    m = re.fullmatch(r"2\*\*(\d{1,4})([+-]\d+)?", t)
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


def _seconds(text: str) -> float:
    """A number of seconds in ``(0, 1e6]``."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not 0 < value <= 1e6:
        raise argparse.ArgumentTypeError(f"must be in (0, 1e6] seconds, got {text!r}")
    return value


def _in(option: str, value: int, lo: int, hi: int, hi_text: str | None = None) -> None:
    """Refuses ``value`` outside ``[lo, hi]`` naming ``option`` and the range."""
    if not lo <= value <= hi:
        raise _UsageError(
            f"{option} must be in [{lo:,}, {hi_text or f'{hi:,}'}], got {show(value)}"
        )


def _world(n: int | None, ranks: int, rank: int) -> None:
    """The ranks checks ``demo`` and ``bench`` share (and ``--n`` when given)."""
    if n is not None:
        _in("--n", n, 1, 10**10, "1e10")
    _in("--ranks", ranks, 1, I64_MAX, "2**63-1")
    if not 0 <= rank < ranks:
        raise _UsageError(f"--rank must be in [0, --ranks) = [0, {show(ranks)}), got {show(rank)}")


def _out_dir(text: str, stem: str) -> Path:
    """The output folder, checked (not created: that waits until there is something to
    write): a folder, or a path whose first existing parent is a writable folder, and where
    ``stem``.json, .md and .png can replace whatever is there."""
    if not text.strip():
        raise _UsageError("--out must name a folder")
    out = Path(text)
    if out.exists() and not out.is_dir():
        raise _UsageError(f"--out {text}: exists and is not a folder")
    first = out
    while not first.exists() and first.parent != first:
        first = first.parent
    if not first.is_dir():
        raise _UsageError(f"--out {text}: cannot create the folder ({first} is not a folder)")
    if not os.access(first, os.W_OK | os.X_OK):
        what = "the folder" if first == out else str(first)
        raise _UsageError(f"--out {text}: {what} is not writable")
    for ext in (".json", ".md", ".png"):
        target = out / f"{stem}{ext}"
        if target.exists() and not target.is_file():
            raise _UsageError(f"--out {text}: {target} is in the way (not a file)")
    _probe(out, text)
    return out


def _probe(out: Path, text: str) -> None:
    """Creates ``out`` (and its missing parents) and a file in it, then removes all of that:
    permissions alone do not tell (root passes every ``os.access`` check, yet cannot create
    a folder in ``/proc`` or write on a read-only file system)."""
    missing = []
    p = out
    while not p.exists() and p.parent != p:
        missing.append(p)
        p = p.parent
    made: list[Path] = []
    try:
        for folder in reversed(missing):
            try:
                folder.mkdir()
            except OSError as e:
                raise _UsageError(
                    f"--out {text}: cannot create the folder ({e.strerror or e})"
                ) from None
            made.append(folder)
        try:
            fd, probe = tempfile.mkstemp(prefix=".croupier-probe.", dir=out)
        except OSError as e:
            raise _UsageError(
                f"--out {text}: cannot write in the folder ({e.strerror or e})"
            ) from None
        os.close(fd)
        os.unlink(probe)
    finally:
        for folder in reversed(made):
            with contextlib.suppress(OSError):
                folder.rmdir()


# -- demo -------------------------------------------------------------------------------------


def _demo(args: argparse.Namespace) -> int:
    _world(args.n, args.ranks, args.rank)
    _in("--seed", args.seed, 0, U64 - 1, "2**64-1")
    _in("--epoch", args.epoch, 0, U64 - 1, "2**64-1")
    _in("--count", args.count, 1, 10_000)
    # The core call a DistributedSampler with these arguments makes (its default order), so
    # the demo answers without importing torch (seconds and hundreds of MiB).
    from croupier import _core

    t0 = time.perf_counter()
    share = _core.RankShare(
        n=args.n, num_replicas=args.ranks, rank=args.rank, shuffle=True, seed=args.seed,
        drop_last=False, order=_core.Order.GLOBAL,
    )  # fmt: skip
    share.check_epoch(args.epoch)
    length = int(share.num_samples)
    first = share.indices(args.epoch, 0, min(args.count, length)).tolist()
    elapsed = time.perf_counter() - t0
    print(
        f"croupier {__version__}: N={args.n:,}, rank {args.rank} of {args.ranks}, "
        f"seed {args.seed}, epoch {args.epoch}"
    )
    print(f"this rank's epoch: {length:,} indices")
    print(f"first {len(first)} indices: {first}")
    print(f"time to the first indices: {elapsed:.3f} s")
    print(
        f"in training code: croupier.DistributedSampler({args.n}, num_replicas={args.ranks}, "
        f"rank={args.rank}, seed={args.seed}), then set_epoch({args.epoch})"
    )
    return 0


# -- bench ------------------------------------------------------------------------------------


def _header(m: dict[str, Any]) -> str:
    """One line naming the machine and the software versions of a run (lhotse's when it is
    installed: an optional baseline)."""
    return (
        f"croupier {m['croupier']}, {m.get('cpu', '?')}, {m.get('cpus')} cores, "
        f"{m.get('memory_gib')} GiB, Python {m['python']}, numpy {m.get('numpy')}, "
        f"torch {m.get('torch')}, torchdata {m.get('torchdata')}"
        + (f", lhotse {m['lhotse']}" if m.get("lhotse") else "")
    )


def _minutes(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.1f} min"


def _report(
    results: dict[str, Any],
    text: str,
    plot: Callable[[dict[str, Any], Path], bool],
    stem: Path,
) -> None:
    """Writes ``stem``.json (every run), .md (the table under the machine and the run) and .png
    (unless matplotlib is missing), and prints the table. Every file is rendered first and
    then all are moved into place together: an earlier run's files are replaced whole or not
    at all, and a stale plot of an earlier run is removed."""
    from croupier.bench._report import write_json

    run = results["run"]
    header = f"{_header(results['machine'])}\n`{run['command']}`, {run['started']}"
    paths = {ext: stem.with_suffix(ext) for ext in (".json", ".md", ".png")}
    tmp = {ext: p.with_name(f".{p.stem}.{os.getpid()}.tmp{ext}") for ext, p in paths.items()}
    try:
        stem.parent.mkdir(parents=True, exist_ok=True)
        write_json(results, tmp[".json"])
        tmp[".md"].write_text(f"{header}\n\n{text}\n")
        drew = plot(results, tmp[".png"])
        for ext, p in paths.items():
            if ext == ".png" and not drew:
                p.unlink(missing_ok=True)  # it belongs to an earlier run
                continue
            os.replace(tmp[ext], p)
    finally:
        for t in tmp.values():
            t.unlink(missing_ok=True)
    print(f"{header}\n\n{text}\n")
    wrote = [paths[".json"], paths[".md"]] + ([paths[".png"]] if drew else [])
    print("wrote " + ", ".join(map(str, wrote)), end="")
    print("" if drew else " (no plot: matplotlib is not installed)")


def _run_info(argv: Sequence[str]) -> dict[str, str]:
    """The command and the start time a run's files name."""
    started = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    return {"command": shlex.join(["croupier", *argv]), "started": started}


def _finish(results: dict[str, Any], write: Callable[[], None]) -> int:
    """Writes the results unless no run succeeded (nothing replaced then). Exit status 1 if a
    run failed or timed out (the table says which), else 0."""
    rows = results["rows"]
    if not any(r.get("status") == "ok" for r in rows):
        tried = [r for r in rows if "runs" in r] or rows
        why = f"{tried[0].get('status')}: {tried[0].get('detail', '')}" if tried else "none ran"
        print(f"croupier bench: no run succeeded ({why}); nothing written", file=sys.stderr)
        return 1
    try:
        write()
    except OSError as e:
        print(f"croupier bench: cannot write the results: {e}", file=sys.stderr)
        return 1
    bad = [r for r in rows if r.get("runs") and any(x.get("status") != "ok" for x in r["runs"])]
    if bad:
        print(
            f"croupier bench: {_plural(len(bad), 'measurement')} failed or timed out in some "
            f"run: {', '.join(sorted({r['system'] for r in bad}))} (see the table)",
            file=sys.stderr,
        )
        return 1
    return 0


def _plural(count: int, noun: str) -> str:
    return f"{count:,} {noun}{'' if count == 1 else 's'}"


class _Stopped(KeyboardInterrupt):
    """SIGTERM or SIGHUP during a run: handled as Ctrl-C (the running measurement is killed,
    nothing is written)."""


def _stop_on_signals() -> Callable[[], None]:
    """Turns SIGTERM and SIGHUP into :class:`_Stopped` until the returned function is
    called."""
    import signal

    def stop(signum: int, _frame: object) -> None:
        raise _Stopped(signal.Signals(signum).name)

    saved: dict[Any, Any] = {}
    for name in ("SIGTERM", "SIGHUP"):
        sig = getattr(signal, name, None)
        if sig is not None:
            # Outside the main thread signal.signal raises: the signals are left alone.
            with contextlib.suppress(ValueError):
                saved[sig] = signal.signal(sig, stop)

    def restore() -> None:
        for sig, handler in saved.items():
            signal.signal(sig, handler)

    return restore


def _sweep(args: argparse.Namespace, argv: Sequence[str]) -> int:
    from croupier.bench._ranks import DEFAULT_NS, SweepConfig, check, plot, run, table

    given = [
        f"--{name.replace('_', '-')}"
        for name in ("systems", "families", "ranks", "rank")
        if getattr(args, name) is not None
    ] + (["--all"] if args.all else [])
    if given:
        raise _UsageError(
            f"--sweep-ranks cannot be combined with {', '.join(given)}: the sweep times "
            "croupier alone, rank W // 2 of each W it lists"
        )
    cfg = SweepConfig(
        ranks=tuple(args.sweep_ranks),
        ns=tuple(dict.fromkeys(args.n)) if args.n is not None else DEFAULT_NS,
        seeds=tuple(dict.fromkeys(args.seeds)),
        repeats=args.repeats if args.repeats is not None else 3,
        timeout=args.timeout,
    )
    try:
        check(cfg)
    except ValueError as e:
        raise _UsageError(str(e)) from None
    out = _out_dir(args.out, "ranks-sweep")
    info = _run_info(argv)
    print(
        f"croupier bench --sweep-ranks: W in {sorted(cfg.ranks)}, N in "
        f"{[f'{n:,}' for n in cfg.ns]}, seeds {list(cfg.seeds)}, {cfg.repeats} run(s) each; "
        f"results in {out}/",
        file=sys.stderr,
    )
    restore = _stop_on_signals()
    try:
        results = run(cfg, progress=lambda line: print(line, file=sys.stderr, flush=True))
    finally:
        restore()
    results["run"] = info
    return _finish(results, lambda: _report(results, table(results), plot, out / "ranks-sweep"))


def _bench(args: argparse.Namespace, argv: Sequence[str]) -> int:
    if args.sweep_ranks is not None:
        return _sweep(args, argv)
    from croupier.bench import BenchConfig, run
    from croupier.bench._progress import progress_for
    from croupier.bench._report import notes, plot, table
    from croupier.bench._runner import ALL_NS, DEFAULT_NS, Interrupted
    from croupier.bench._runner import plan as plan_runs

    ranks = args.ranks if args.ranks is not None else 8
    rank = args.rank if args.rank is not None else 3
    _world(None, ranks, rank)
    cfg = BenchConfig(
        ns=tuple(dict.fromkeys(args.n))
        if args.n is not None
        else (ALL_NS if args.all else DEFAULT_NS),
        ranks=ranks,
        rank=rank,
        seeds=tuple(dict.fromkeys(args.seeds)),
        repeats=args.repeats if args.repeats is not None else BenchConfig.repeats,
        systems=tuple(args.systems or ()),
        families=tuple(args.families or ()),
        everything=args.all,
        timeout=args.timeout,
    )
    try:
        planned = plan_runs(cfg)
    except ValueError as e:
        raise _UsageError(str(e)) from None
    todo = [p for p in planned if p.skip is None]
    if not todo:
        first = planned[0]
        status, detail = first.skip or ("", "")
        raise _UsageError(
            f"nothing to run: {first.system.name} at N={first.n:,} is {status} ({detail})"
            + ("" if len(planned) == 1 else f", and so is every other of the {len(planned)}")
        )
    out = _out_dir(args.out, "bench")
    info = _run_info(argv)
    cpu = sum(p.cpu_s for p in todo)
    peak = max((p.peak_bytes for p in todo), default=0)
    systems = len({p.system.name for p in planned})
    runs = len(todo) * len(cfg.seeds) * cfg.repeats
    print(
        f"croupier bench: {_plural(systems, 'system')} at N = "
        f"{', '.join(f'{n:,}' for n in cfg.ns)}, {cfg.ranks:,} ranks (rank {cfg.rank:,}), "
        f"seeds {list(cfg.seeds)}, {_plural(cfg.repeats, 'run')} each: {_plural(runs, 'run')}, "
        f"one at a time, about {_minutes(cpu)} of CPU and {peak / 2**30:.1f} GiB at most; "
        f"results in {out}/",
        file=sys.stderr,
    )
    progress = progress_for(cpu)
    restore = _stop_on_signals()
    try:
        results = run(cfg, progress=progress)
    except Interrupted as stop:
        # The runs that finished are kept: written, marked incomplete, if any succeeded.
        results = stop.results
    finally:
        restore()
        progress.close()
    results["run"] = info

    # An interrupted run's files have their own name: the last complete run's stay.
    stem = out / ("bench-incomplete" if results.get("incomplete") else "bench")

    def write() -> None:
        _report(results, f"{table(results)}\n\n{notes(results)}", plot, stem)

    if not results.get("incomplete"):
        return _finish(results, write)
    if not any(r.get("status") == "ok" for r in results["rows"]):
        raise KeyboardInterrupt  # nothing finished: nothing written
    with contextlib.suppress(OSError):
        write()
        print(
            f"croupier bench: interrupted; the runs that finished are in {stem}.*, marked "
            "incomplete",
            file=sys.stderr,
        )
        return 130
    raise KeyboardInterrupt


# -- the parser -------------------------------------------------------------------------------


def _parser() -> tuple[_Parser, dict[str, _Parser]]:
    from croupier.bench._runner import default_cpu_estimate

    parser = _Parser(
        prog="croupier", description="Fast, reproducible, resumable index samplers for PyTorch."
    )
    parser.add_argument("--version", action="version", version=f"croupier {__version__}")
    sub = parser.add_subparsers(dest="command", parser_class=_Parser)
    bench = sub.add_parser(
        "bench",
        help="compare croupier with what people use instead (time, resume, peak RSS)",
        description="Runs each system in its own subprocess, one at a time, and prints a "
        "table of medians with ratios; writes bench.json, bench.md and bench.png. By default "
        "croupier and the main alternative of each family (samplers, mixtures, buckets, "
        "reads, elastic, permutations; megatron with --families megatron) at N = 1e5, 1e6, "
        "1e7, 3 runs each: estimated at "
        f"{_minutes(default_cpu_estimate())} of CPU. With "
        "--sweep-ranks, runs the world-size sweep instead: one rank's "
        'DistributedSampler(order="global") epoch for each W and N (time per index, first '
        "index, memory added); writes ranks-sweep.json, ranks-sweep.md and ranks-sweep.png.",
    )
    bench.add_argument(
        "--n",
        nargs="+",
        type=_count,
        default=None,
        metavar="N",
        help="dataset lengths in [1e3, 1e10] (with --sweep-ranks [1, 1e10]), written as 1e8, "
        "100_000_000 or 2**33+5 (default: 1e5 1e6 1e7; with --all 1e6 1e7 1e8; with "
        "--sweep-ranks 1e8 1e9)",
    )
    bench.add_argument(
        "--all",
        action="store_true",
        help="every system (not only the headline ones), at 1e6 1e7 1e8 unless --n says",
    )
    from croupier.bench._systems import FAMILIES, SYSTEMS  # stdlib only: keeps --help light

    bench.add_argument(
        "--families",
        nargs="+",
        default=None,
        choices=FAMILIES,
        metavar="FAMILY",
        help="every system of these families: " + ", ".join(FAMILIES),
    )
    bench.add_argument(
        "--systems",
        nargs="+",
        default=None,
        metavar="SYSTEM",
        help="these systems: " + ", ".join(s.name for s in SYSTEMS),
    )
    bench.add_argument(
        "--ranks",
        "--num-replicas",
        dest="ranks",
        type=_count,
        default=None,
        help="number of ranks W, in [1, 2**63-1] (default 8)",
    )
    bench.add_argument(
        "--rank", type=_count, default=None, help="the rank timed, in [0, W) (default 3)"
    )
    bench.add_argument(
        "--seeds", nargs="+", type=_count, default=[0], help="seeds in [0, 2**64) (default 0)"
    )
    bench.add_argument(
        "--repeats",
        type=_count,
        default=None,
        help="runs per seed, in [1, 1000] (default 3, and up to 2 more for a measurement whose "
        "runs disagree by more than 2x)",
    )
    bench.add_argument(
        "--sweep-ranks",
        nargs="+",
        type=_count,
        default=None,
        metavar="W",
        help="run the world-size sweep over these W (e.g. 8 64 256 1024 4096) instead of the "
        "systems table; not with --systems, --families, --all, --ranks or --rank",
    )
    bench.add_argument(
        "--timeout",
        type=_seconds,
        default=1800.0,
        help="seconds per run before it is abandoned, in (0, 1e6] (default 1800)",
    )
    bench.add_argument(
        "--out", default="croupier-bench", help="output folder (default croupier-bench)"
    )
    bench.set_defaults(func=_bench)
    demo = sub.add_parser(
        "demo",
        help="print one rank's first indices and how long they took",
        description="Builds one rank's croupier.DistributedSampler over N samples and prints "
        "its first indices and the time they took (a share shorter than --count prints all "
        "of it; torch's padding repeats the first indices when W does not divide N).",
    )
    demo.add_argument(
        "--n", type=_count, default=10_000_000, help="dataset length in [1, 1e10] (default 1e7)"
    )
    demo.add_argument(
        "--ranks",
        "--num-replicas",
        dest="ranks",
        type=_count,
        default=8,
        help="number of ranks W (default 8)",
    )
    demo.add_argument("--rank", type=_count, default=0, help="this rank, in [0, W) (default 0)")
    demo.add_argument(
        "--seed", type=_count, default=0, help="shuffle seed, in [0, 2**64) (default 0)"
    )
    demo.add_argument("--epoch", type=_count, default=0, help="epoch, in [0, 2**64) (default 0)")
    demo.add_argument(
        "--count",
        type=_count,
        default=10,
        help="how many indices to print, in [1, 10000] (default 10)",
    )
    demo.set_defaults(func=_demo)
    return parser, {"bench": bench, "demo": demo}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``croupier`` command."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser, commands = _parser()
    try:  # --help, --version and mistakes exit here (with the status argparse gives)
        args, extra = parser.parse_known_args(argv)
        if args.command is None:
            if extra:
                parser.error(f"unrecognized arguments: {' '.join(extra)}")
            parser.print_help()
            return 0
        command = commands[args.command]
        if extra:
            command.error(f"unrecognized arguments: {' '.join(extra)}")
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else 2
    try:
        return int(args.func(args, argv) if args.command == "bench" else args.func(args))
    except _UsageError as e:
        _complain(command.prog, str(e))
        return 2
    except KeyboardInterrupt:
        done = "; nothing written" if args.command == "bench" else ""
        print(f"{command.prog}: interrupted{done}", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
