"""The world-size sweep of ``croupier bench --sweep-ranks``: how one rank's epoch of
``DistributedSampler`` (its default order, ``"global"``) costs as the number of ranks W grows
at a fixed N.

For every (N, W) it measures, each run in its own process (the ``croupier`` system of
:mod:`croupier.bench._child`, rank ``W // 2``, no resume), the time to the first index, the
time to the whole share (``indices()``, ``ceil(N / W)`` indices) and the memory the share
adds above the imports; then reports the time per index and its ratio to the smallest W's.
A per-rank cost that stays flat as W grows means each rank pays for its own share only.
"""

from __future__ import annotations

import functools
import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from croupier.bench._report import _n, _time, pyplot
from croupier.bench._runner import (
    BenchConfig,
    _cannot_run,
    _one,
    _summarise,
    machine,
    round_robin,
    show,
)
from croupier.bench._systems import by_name

__all__ = ["DEFAULT_NS", "DEFAULT_RANKS", "SweepConfig", "plot", "run", "table"]

DEFAULT_RANKS = (8, 64, 256, 1024, 4096)
DEFAULT_NS = (100_000_000, 1_000_000_000)


@dataclass
class SweepConfig:
    """What the world-size sweep measures.

    Attributes:
        ranks: world sizes W (at least one, each at least 1, no repeats); measured in
            increasing order, the smallest being the yardstick of the ratio column.
        ns: dataset lengths (each in ``[1, 1e10]``).
        seeds: one repeat per seed and per ``repeats``; medians are reported.
        repeats: runs per seed. Runs go round-robin over the world sizes of one N.
        timeout: seconds before one run is abandoned (reported as a timeout).
        memory_fraction: skip a run whose estimated memory exceeds this fraction of the
            memory available now.
    """

    ranks: tuple[int, ...] = DEFAULT_RANKS
    ns: tuple[int, ...] = DEFAULT_NS
    seeds: tuple[int, ...] = (0,)
    repeats: int = 3
    timeout: float = 1800.0
    memory_fraction: float = 0.8


def check(cfg: SweepConfig) -> None:
    """Raises ``ValueError`` naming the first option of ``cfg`` out of its range."""
    if not cfg.ranks:
        raise ValueError("--sweep-ranks must list at least one world size")
    for w in cfg.ranks:
        if not 1 <= w <= 2**63 - 1:
            raise ValueError(f"--sweep-ranks must each be in [1, 2**63-1], got {show(w)}")
    if len(set(cfg.ranks)) != len(cfg.ranks):
        raise ValueError(f"--sweep-ranks must not repeat, got {list(cfg.ranks)}")
    if not cfg.ns:
        raise ValueError("--n must list at least one dataset length")
    for n in cfg.ns:
        if not 1 <= n <= 10**10:
            raise ValueError(f"--n must be in [1, 1e10] for the sweep, got {show(n)}")
    if not 1 <= cfg.repeats <= 1000:
        raise ValueError(f"--repeats must be in [1, 1000], got {show(cfg.repeats)}")
    if not cfg.seeds or any(not 0 <= s < 2**64 for s in cfg.seeds):
        raise ValueError(f"--seeds must be in [0, 2**64), at least one, got {list(cfg.seeds)}")
    if not 0 < cfg.timeout <= 1e6:
        raise ValueError(f"--timeout must be in (0, 1e6] seconds, got {cfg.timeout:g}")


def _world(cfg: SweepConfig, w: int) -> BenchConfig:
    """The bench configuration of one world size: rank ``W // 2`` timed, no digest."""
    return BenchConfig(
        ranks=w,
        rank=w // 2,
        seeds=cfg.seeds,
        repeats=cfg.repeats,
        systems=("croupier",),
        timeout=cfg.timeout,
        memory_fraction=cfg.memory_fraction,
        digest=False,
    )


def _finish(row: dict[str, Any], world: BenchConfig) -> None:
    """Adds to ``row`` the medians of its runs, the share length, time per index and memory."""
    _summarise(row, world)
    ok = [r for r in row["runs"] if r.get("status") == "ok"]
    if not ok:
        return
    row["count"] = ok[0]["count"]
    row["added_mib"] = statistics.median(r["peak_mib"] - r["rss_base_mib"] for r in ok)
    row["ns_per_index"] = row["epoch_s"] / row["count"] * 1e9 if row["count"] else None


def run(cfg: SweepConfig, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Runs every (N, W) pair of ``cfg`` and returns the results as a JSON-ready dict
    (``config``, ``machine`` and one row per pair with its runs and medians).

    ``progress`` receives one line per step (what runs, then how long it took, or why it was
    skipped). Arguments are checked before any run.
    """
    check(cfg)
    say = progress or (lambda _line: None)
    system = by_name("croupier")
    ranks = sorted(cfg.ranks)
    rows: list[dict[str, Any]] = []
    total, step = len(cfg.ns) * len(ranks), 0
    for n in cfg.ns:
        pending: list[tuple[BenchConfig, dict[str, Any], str]] = []
        for w in ranks:
            step += 1
            head = f"[{step}/{total}] N={n:,} W={w}"
            world = _world(cfg, w)
            row: dict[str, Any] = {"n": n, "w": w, "rank": world.rank}
            rows.append(row)
            reason = _cannot_run(system, n, world)
            if reason:
                row["status"], row["detail"] = reason
                say(f"{head}: skipped, {row['detail']}")
                continue
            row["runs"] = []
            pending.append((world, row, head))
        # Round-robin over the world sizes, as `croupier bench` does over systems.
        round_robin(
            [
                (row, head, functools.partial(_one, system, n, world, extra={"resume": False}))
                for world, row, head in pending
            ],
            cfg.seeds,
            cfg.repeats,
            say,
        )
        for world, row, _head in pending:
            _finish(row, world)
    return {"config": asdict(cfg), "machine": machine(), "rows": rows}


def table(results: dict[str, Any]) -> str:
    """A Markdown table of the medians, one line per (N, W): time per index of the whole share,
    its ratio to the smallest W's at the same N, time to the first index and to the whole
    share, and the memory the share added above the imports."""
    rows = results["rows"]
    smallest = min(r["w"] for r in rows) if rows else 0
    lines = [
        f"| N | W | per index | vs W={smallest} | first index | whole share | memory added |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        cells = [_n(r["n"]), str(r["w"])]
        if r.get("status") != "ok":
            cells += [f"{r.get('status', '?')}: {r.get('detail', '')}", "", "", "", ""]
            lines.append("| " + " | ".join(cells) + " |")
            continue
        base = next(
            (
                b
                for b in rows
                if b["n"] == r["n"] and b["w"] == smallest and b.get("status") == "ok"
            ),
            None,
        )
        per, base_per = r.get("ns_per_index"), base.get("ns_per_index") if base else None
        cells += [
            "-" if per is None else f"{per:.0f} ns",
            f"{per / base_per:.2f}x" if per is not None and base_per else "-",
            _time(r.get("first_s")),
            _time(r.get("epoch_s")),
            f"{r['added_mib']:,.0f} MiB",
        ]
        if not r.get("checks_ok", True):
            cells[-1] += " CHECK FAILED"
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(results: dict[str, Any], path: Path) -> bool:
    """Draws, against W (log-log), one line per N: time per index of the whole share, time to
    the first index and memory added. Returns ``False`` when matplotlib is not installed."""
    plt = pyplot()
    if plt is None:
        return False
    rows = [r for r in results["rows"] if r.get("status") == "ok"]
    panels = (
        ("ns_per_index", 1.0, "whole share: ns per index"),
        ("first_s", 1e3, "first index (ms)"),
        ("added_mib", 1.0, "memory added (MiB)"),
    )
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4.4))
    for ax, (key, scale, title) in zip(axes, panels, strict=True):
        for n in sorted({r["n"] for r in rows}):
            pts = [
                (r["w"], r[key] * scale)
                for r in rows
                if r["n"] == n and r.get(key) is not None and r[key] > 0
            ]
            if pts:
                ax.loglog(*zip(*pts, strict=True), marker="o", label=f"N={_n(n)}")
        ax.set_title(title)
        ax.set_xlabel("W (ranks)")
        ax.grid(True, which="both", alpha=0.3)
        if ax.get_lines():
            ax.legend()
    m = results["machine"]
    fig.suptitle(
        f'croupier {m["croupier"]} DistributedSampler(order="global"), rank W // 2: '
        f"{m.get('cpu', '?')}, {m.get('cpus')} cores, {m.get('memory_gib')} GiB"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110, format="png")
    plt.close(fig)
    return True
