"""Runs the benchmark: which measurements, in which order, skipped when they cannot fit."""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from croupier import __version__
from croupier.bench._systems import System, choose

__all__ = [
    "BenchConfig",
    "Interrupted",
    "Lines",
    "Plan",
    "Progress",
    "default_cpu_estimate",
    "machine",
    "plan",
    "run",
]

#: The default run's sizes: three decades, enough to show how each system scales (its CPU
#: time: :func:`default_cpu_estimate`).
DEFAULT_NS = (100_000, 1_000_000, 10_000_000)
#: The sizes of ``--all``.
ALL_NS = (1_000_000, 10_000_000, 100_000_000)
MIN_N, MAX_N = 1_000, 10**10
MAX_TIMEOUT = 1e6  # seconds; subprocess refuses much longer waits
METRICS = (
    "first_s",
    "epoch_s",
    "resume_s",
    "peak_mib",
    "setup_s",
    "efficiency",
    "mb_s",
    "share_mib",
)


@dataclass
class BenchConfig:
    """What ``croupier bench`` measures.

    Attributes:
        ns: dataset lengths (each in ``[1e3, 1e10]``).
        ranks: number of data-parallel ranks ``W``.
        rank: the rank whose share is timed.
        seeds: one repeat per seed and per ``repeats``; medians are reported, with the
            smallest and largest run.
        repeats: runs per seed. Runs go round-robin over the systems of one N (every
            system's first run, then every system's second run, ..., each round starting
            one system later).
        more_repeats: runs added, at most, to a measurement whose runs disagree by more
            than 2x (a noisy machine): its median then rests on more of them.
        systems: names from :data:`croupier.bench._systems.SYSTEMS` (default: the headline
            systems, or every system with ``everything``).
        families: run every system of these families instead (see ``FAMILIES``).
        everything: every system, not only the headline ones.
        timeout: seconds before one run is abandoned (reported as a timeout).
        memory_fraction: skip a run whose estimated memory exceeds this fraction of the
            memory available now.
    """

    ns: tuple[int, ...] = DEFAULT_NS
    ranks: int = 8
    rank: int = 3
    seeds: tuple[int, ...] = (0,)
    repeats: int = 3
    more_repeats: int = 2
    systems: tuple[str, ...] = ()
    families: tuple[str, ...] = ()
    everything: bool = False
    timeout: float = 1800.0
    memory_fraction: float = 0.8
    digest: bool = True


def available_memory() -> int:
    """Bytes of memory available for new work (``MemAvailable``), or 0 if unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def machine() -> dict[str, Any]:
    """A description of the machine and software the numbers come from."""
    info: dict[str, Any] = {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "croupier": __version__,
    }
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    info["cpu"] = line.split(":", 1)[1].strip()
                    break
        with open("/proc/meminfo") as f:
            info["memory_gib"] = round(int(f.readline().split()[1]) / (1 << 20), 1)
    except OSError:
        pass
    for module in ("numpy", "torch", "torchdata", "lhotse"):
        try:
            from importlib.metadata import version

            info[module] = version(module)
        except Exception:  # not installed
            info[module] = None
    return info


def installed(system: System) -> bool:
    """Whether every module ``system`` needs can be imported."""
    return all(importlib.util.find_spec(m) is not None for m in system.needs)


def _one(
    system: System, n: int, cfg: BenchConfig, seed: int, extra: dict[str, Any] | None = None
) -> dict[str, Any]:
    """One run of ``system`` at ``n`` in its own process; ``extra`` adds to the child's spec."""
    spec = {
        "system": system.name,
        "family": system.family,
        "needs": list(system.needs),
        "n": n,
        "ranks": cfg.ranks,
        "rank": cfg.rank,
        "seed": seed,
        "digest": cfg.digest,
        **(extra or {}),
    }
    cmd = [sys.executable, "-m", "croupier.bench._child", json.dumps(spec)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=cfg.timeout)
    except subprocess.TimeoutExpired:
        return {"status": "timeout", "detail": f"over {cfg.timeout:g} s"}
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        killed = done.returncode < 0 or "MemoryError" in done.stderr
        return {"status": "out of memory" if killed else "failed", "detail": tail}
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    result["status"] = "ok"
    return result


def round_robin(
    pending: list[tuple[dict[str, Any], str, Callable[[int], dict[str, Any]]]],
    seeds: tuple[int, ...],
    repeats: int,
    say: Callable[[str], None],
) -> None:
    """Runs every pending measurement ``(row, head, run)`` once per seed and repeat, appending
    ``run(seed)``'s result to ``row["runs"]``. Every measurement's run r comes before any
    one's run r + 1, so that a slow spell of a noisy machine falls on all of them alike rather
    than on one; each round starts one measurement later, so none always follows the same."""
    rounds = [(seed, rep) for seed in seeds for rep in range(repeats)]
    for r, (seed, rep) in enumerate(rounds):
        shift = r % len(pending) if pending else 0
        for row, head, run_one in pending[shift:] + pending[:shift]:
            say(f"{head} seed={seed} run {rep + 1}/{repeats} ...")
            t0 = time.perf_counter()
            result = run_one(seed)
            row["runs"].append(result)
            say(f"{head}: {result['status']} in {time.perf_counter() - t0:.1f} s")


def _values(runs: list[dict[str, Any]], key: str) -> list[float]:
    return [r[key] for r in runs if r.get("status") == "ok" and key in r]


#: The times whose runs must agree within :data:`WIDE` for a measurement to be steady.
SPREAD_KEYS = ("first_s", "epoch_s", "resume_s")
#: Runs of one measurement whose largest time is more than this many times the smallest
#: disagree: the machine was busy during some of them.
WIDE = 2.0


def wide(row: dict[str, Any]) -> list[str]:
    """The times of ``row`` whose runs disagree by more than :data:`WIDE`."""
    runs = row.get("runs", [])
    out = []
    for key in SPREAD_KEYS:
        values = _values(runs, key)
        if len(values) > 1 and max(values) > WIDE * min(values):
            out.append(key)
    return out


def _load() -> float | None:
    """The 1-minute load average, or ``None`` where the platform has none."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def _cannot_run(system: System, n: int, cfg: BenchConfig) -> tuple[str, str] | None:
    """Why ``system`` is not run at ``n`` (status, detail), or ``None`` when it can run."""
    if not installed(system):
        return "not installed", f"needs {', '.join(system.needs)}"
    need, have = system.memory_estimate(n, cfg.ranks), available_memory()
    if have and need > cfg.memory_fraction * have:
        return "skipped", f"needs ~{need / 2**30:.1f} GiB, {have / 2**30:.1f} GiB available"
    # A size whose work alone (the estimate without the process start) is over the timeout
    # would only time out: lhotse's sampler at 1e8 is estimated at about two hours.
    work = n * system.s_per_index
    if work > cfg.timeout:
        took = f"{work:,.0f} s" if work < 90 else f"{work / 60:,.0f} min"
        return "skipped", f"estimated at ~{took} of CPU, over the {cfg.timeout:g} s timeout"
    return None


def _summarise(row: dict[str, Any], cfg: BenchConfig) -> None:
    """Adds to ``row`` its status, the medians of its runs with their smallest and largest
    (``spread``), the times whose runs disagree (``wide``) and whether its checks held."""
    runs = row["runs"]
    ok = [r for r in runs if r.get("status") == "ok"]
    row["status"] = "ok" if ok else runs[0]["status"]
    if not ok:
        row["detail"] = runs[0].get("detail", "")
    spread = {}
    for key in (*METRICS, "rss_base_mib"):
        values = _values(runs, key)
        if values:
            row[key] = statistics.median(values)
            spread[key] = [min(values), max(values)]
    row["spread"] = spread
    row["wide"] = wide(row)
    digests = {r.get("digest") for r in ok if r.get("digest")}
    if len(digests) == 1 and len(cfg.seeds) == 1:
        row["digest"] = digests.pop()
    row["checks_ok"] = all(r.get("first_ok", True) and r.get("resume_ok", True) for r in ok)


def check(cfg: BenchConfig) -> list[System]:
    """Refuses a configuration that cannot run (``ValueError`` naming the option and its
    range), before any work; returns the systems it measures."""
    if not cfg.ns:
        raise ValueError("--n needs at least one size")
    for n in cfg.ns:
        if not MIN_N <= n <= MAX_N:
            why = " (below 1e3 there is nothing to time)" if n < MIN_N else ""
            raise ValueError(f"--n must be in [1e3, 1e10], got {show(n)}{why}")
    if not 1 <= cfg.ranks <= 2**63 - 1:
        raise ValueError(f"--ranks must be in [1, 2**63-1], got {show(cfg.ranks)}")
    if not 0 <= cfg.rank < cfg.ranks:
        raise ValueError(
            f"--rank must be in [0, --ranks) = [0, {show(cfg.ranks)}), got {show(cfg.rank)}"
        )
    if not 1 <= cfg.repeats <= 1000:
        raise ValueError(f"--repeats must be in [1, 1000], got {show(cfg.repeats)}")
    if not cfg.seeds or any(not 0 <= s < 2**64 for s in cfg.seeds):
        raise ValueError(f"--seeds must be in [0, 2**64), at least one, got {list(cfg.seeds)}")
    if not 0 < cfg.timeout <= MAX_TIMEOUT:
        raise ValueError(f"--timeout must be in (0, 1e6] seconds, got {cfg.timeout:g}")
    if cfg.everything and (cfg.systems or cfg.families):
        raise ValueError("--all runs every system: not with --systems or --families")
    return choose(cfg.systems, cfg.families, cfg.everything)


def show(value: int) -> str:
    """An integer for a message: digits with separators, or ``1.2e+30`` when very long."""
    return f"{value:,}" if abs(value) < 10**15 else f"{value:.3g}"


@dataclass(frozen=True)
class Plan:
    """One system at one N: why it is not run (``skip``: status and detail) or what it is
    expected to cost (CPU seconds of all its runs, peak bytes of one)."""

    system: System
    n: int
    skip: tuple[str, str] | None
    cpu_s: float
    peak_bytes: int


def plan(cfg: BenchConfig) -> list[Plan]:
    """Every (system, N) pair of ``cfg``, N by N, with its estimate or the reason it is skipped
    (not installed, more memory than is available, or more time than the timeout)."""
    chosen = check(cfg)
    runs = len(cfg.seeds) * cfg.repeats
    out = []
    for n in cfg.ns:
        for system in chosen:
            skip = _cannot_run(system, n, cfg)
            cpu = 0.0 if skip else system.cpu_estimate(n) * runs
            # The interpreter and its imports (torch's are ~450 MiB) plus the work.
            peak = 0 if skip else system.memory_estimate(n, cfg.ranks) + (512 << 20)
            out.append(Plan(system, n, skip, cpu, peak))
    return out


class Progress:
    """Where a run reports: ``say`` a line, ``advance`` by the estimated CPU seconds of a
    finished run (a progress bar counts those)."""

    def say(self, line: str) -> None:
        """One line about the run."""

    def advance(self, estimated_s: float) -> None:
        """A run of ``estimated_s`` estimated seconds is done."""

    def close(self) -> None:
        """The run is over."""


def run(
    cfg: BenchConfig, progress: Progress | Callable[[str], None] | None = None
) -> dict[str, Any]:
    """Runs every (system, N) pair of ``cfg`` and returns the results as a JSON-ready dict.

    ``progress`` hears of every step: a :class:`Progress`, or a function that receives one
    line per step (what runs, then how long it took, or why it was skipped).
    """
    if progress is None:
        progress = Progress()
    elif not isinstance(progress, Progress):
        progress = Lines(progress)
    pairs = plan(cfg)
    runs = len(cfg.seeds) * cfg.repeats
    rows: list[dict[str, Any]] = []
    loads: list[float] = []
    total = len(pairs)
    pending: list[tuple[dict[str, Any], str, Callable[[int], dict[str, Any]]]] = []

    def finish(incomplete: bool) -> dict[str, Any]:
        kept = []
        for row in rows:
            if "runs" in row and not row["runs"]:
                continue  # interrupted before its first run
            if "runs" in row:
                _summarise(row, cfg)
            kept.append(row)
        results = _results(cfg, pairs, kept, loads)
        if incomplete:
            results["incomplete"] = True
        return results

    try:
        for n in cfg.ns:
            pending = []
            for step, p in enumerate(pairs, 1):
                if p.n != n:
                    continue
                head = f"[{step}/{total}] {p.system.name} N={n:,}"
                row: dict[str, Any] = {"system": p.system.name, "family": p.system.family, "n": n}
                rows.append(row)
                if p.skip:
                    row["status"], row["detail"] = p.skip
                    progress.say(f"{head}: skipped, {row['detail']}")
                    continue
                row["runs"] = []
                one = _counted(progress, p.cpu_s / runs, p.system, n, cfg, loads)
                pending.append((row, head, one))
            round_robin(pending, cfg.seeds, cfg.repeats, progress.say)
            noisy = [entry for entry in pending if wide(entry[0])]
            if noisy and cfg.more_repeats:
                progress.say(
                    f"{len(noisy)} measurement(s) at N={n:,} with runs more than {WIDE:g}x "
                    f"apart: {cfg.more_repeats} more run(s) each"
                )
                round_robin(noisy, cfg.seeds, cfg.more_repeats, progress.say)
    except KeyboardInterrupt as stop:
        raise Interrupted(finish(incomplete=True)) from stop
    return finish(incomplete=False)


class Interrupted(KeyboardInterrupt):
    """Ctrl-C (or SIGTERM) during :func:`run`: ``results`` holds every run that finished,
    summarised, and ``results["incomplete"]`` is true."""

    def __init__(self, results: dict[str, Any]) -> None:
        super().__init__("interrupted")
        self.results = results


def _results(
    cfg: BenchConfig, pairs: list[Plan], rows: list[dict[str, Any]], loads: list[float]
) -> dict[str, Any]:
    """The JSON-ready results of a run: its configuration, the machine, the systems and the
    rows, and the load average seen before each run (``load``: its largest, and the cores)."""
    chosen = list(dict.fromkeys(p.system for p in pairs))
    return {
        "config": asdict(cfg),
        "machine": machine(),
        "load": {"max": max(loads, default=None), "cores": os.cpu_count()},
        "systems": {
            s.name: {
                "label": s.label,
                "family": s.family,
                "ours": s.ours,
                "same_output": s.same_output,
                "hand_written": s.hand_written,
            }
            for s in chosen
        },
        "baselines": {s.name: s.baseline_for for s in chosen if s.baseline_for},
        "rows": rows,
    }


class Lines(Progress):
    """A :class:`Progress` that hands each line to a function."""

    def __init__(self, say: Callable[[str], None]) -> None:
        self._say = say

    def say(self, line: str) -> None:
        self._say(line)


def _counted(
    progress: Progress,
    estimate: float,
    system: System,
    n: int,
    cfg: BenchConfig,
    loads: list[float],
) -> Callable[[int], dict[str, Any]]:
    """One run of ``system`` at ``n`` for a seed, then the progress advanced by its estimate;
    the load average just before it goes to ``loads``."""

    def one(seed: int) -> dict[str, Any]:
        load = _load()
        if load is not None:
            loads.append(load)
        result = _one(system, n, cfg, seed)
        progress.advance(estimate)
        return result

    return one


def default_cpu_estimate() -> float:
    """CPU seconds the default ``croupier bench`` is estimated to take (every headline
    system installed): the one figure ``--help``, the plan line and the README quote."""
    cfg = BenchConfig()
    runs = len(cfg.seeds) * cfg.repeats
    return sum(s.cpu_estimate(n) * runs for n in cfg.ns for s in choose())
