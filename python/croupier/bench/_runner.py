"""Runs the benchmark: which measurements, in which order, skipped when they cannot fit."""

from __future__ import annotations

import functools
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
from croupier.bench._systems import SYSTEMS, System, by_name

__all__ = ["BenchConfig", "machine", "run"]

DEFAULT_NS = (1_000_000, 10_000_000, 100_000_000)
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
        ns: dataset lengths (each up to ``1e10``).
        ranks: number of data-parallel ranks ``W``.
        rank: the rank whose share is timed.
        seeds: one repeat per seed and per ``repeats``; medians are reported.
        repeats: runs per seed. Runs go round-robin over the systems of one N (every
            system's first run, then every system's second run, ..., each round starting
            one system later).
        systems: names from :data:`croupier.bench._systems.SYSTEMS` (default: all installed).
        timeout: seconds before one run is abandoned (reported as a timeout).
        memory_fraction: skip a run whose estimated memory exceeds this fraction of the
            memory available now.
    """

    ns: tuple[int, ...] = DEFAULT_NS
    ranks: int = 8
    rank: int = 3
    seeds: tuple[int, ...] = (0,)
    repeats: int = 1
    systems: tuple[str, ...] = ()
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
    for module in ("numpy", "torch", "torchdata"):
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
        return {"status": "timeout", "detail": f"over {cfg.timeout:.0f} s"}
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


def _median(runs: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in runs if r.get("status") == "ok" and key in r]
    return statistics.median(values) if values else None


def _cannot_run(system: System, n: int, cfg: BenchConfig) -> tuple[str, str] | None:
    """Why ``system`` is not run at ``n`` (status, detail), or ``None`` when it can run."""
    if not installed(system):
        return "not installed", f"needs {', '.join(system.needs)}"
    need, have = system.memory_estimate(n, cfg.ranks), available_memory()
    if have and need > cfg.memory_fraction * have:
        return "skipped", f"needs ~{need / 2**30:.1f} GiB, {have / 2**30:.1f} GiB available"
    return None


def _summarise(row: dict[str, Any], cfg: BenchConfig) -> None:
    """Adds to ``row`` its status, the medians of its runs and whether its checks held."""
    runs = row["runs"]
    ok = [r for r in runs if r.get("status") == "ok"]
    row["status"] = "ok" if ok else runs[0]["status"]
    if not ok:
        row["detail"] = runs[0].get("detail", "")
    for key in (*METRICS, "rss_base_mib"):
        value = _median(runs, key)
        if value is not None:
            row[key] = value
    digests = {r.get("digest") for r in ok if r.get("digest")}
    if len(digests) == 1 and len(cfg.seeds) == 1:
        row["digest"] = digests.pop()
    row["checks_ok"] = all(r.get("first_ok", True) and r.get("resume_ok", True) for r in ok)


def run(cfg: BenchConfig, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Runs every (system, N) pair of ``cfg`` and returns the results as a JSON-ready dict.

    ``progress`` receives one line per step (what runs, then how long it took, or why it was
    skipped).
    """
    say = progress or (lambda _line: None)
    for n in cfg.ns:
        if not 0 <= n <= 10**10:
            raise ValueError(f"n must be in [0, 1e10], got {n}")
    if cfg.ranks < 1:
        raise ValueError(f"ranks must be at least 1, got {cfg.ranks}")
    if not 0 <= cfg.rank < cfg.ranks:
        raise ValueError(f"rank must be in [0, ranks) = [0, {cfg.ranks}), got {cfg.rank}")
    if cfg.repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {cfg.repeats}")
    if not cfg.seeds or any(s < 0 for s in cfg.seeds):
        raise ValueError(f"seeds must be non-negative and at least one, got {list(cfg.seeds)}")
    chosen = [by_name(name) for name in cfg.systems] if cfg.systems else list(SYSTEMS)
    rows: list[dict[str, Any]] = []
    total, step = len(cfg.ns) * len(chosen), 0
    for n in cfg.ns:
        pending: list[tuple[System, dict[str, Any], str]] = []
        for system in chosen:
            step += 1
            head = f"[{step}/{total}] {system.name} N={n:,}"
            row: dict[str, Any] = {"system": system.name, "family": system.family, "n": n}
            rows.append(row)
            reason = _cannot_run(system, n, cfg)
            if reason:
                row["status"], row["detail"] = reason
                say(f"{head}: skipped, {row['detail']}")
                continue
            row["runs"] = []
            pending.append((system, row, head))
        round_robin(
            [(row, head, functools.partial(_one, system, n, cfg)) for system, row, head in pending],
            cfg.seeds,
            cfg.repeats,
            say,
        )
        for _system, row, _head in pending:
            _summarise(row, cfg)
    return {
        "config": asdict(cfg),
        "machine": machine(),
        "systems": {
            s.name: {
                "label": s.label,
                "family": s.family,
                "ours": s.ours,
                "same_output": s.same_output,
            }
            for s in chosen
        },
        "baselines": {s.name: s.baseline_for for s in chosen if s.baseline_for},
        "rows": rows,
    }
