"""Turns ``croupier bench`` results into a table (with ratios), JSON and a log-log plot."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["plot", "table", "write_json"]


def _time(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f} us"
    if seconds < 1:
        return f"{seconds * 1e3:.1f} ms"
    return f"{seconds:.2f} s"


def _n(n: int) -> str:
    """``1e8`` for powers of ten, digits with separators otherwise."""
    k = len(str(n)) - 1
    return f"1e{k}" if n == 10**k and k >= 3 else f"{n:,}"


def _ratio(theirs: float | None, ours: float | None) -> str:
    if theirs is None or ours is None or ours <= 0:
        return ""
    r = theirs / ours
    return f" ({r:,.0f}x)" if r >= 10 else f" ({r:.1f}x)"


def _mem(row: dict[str, Any]) -> str:
    peak, base = row.get("peak_mib"), row.get("rss_base_mib")
    if peak is None:
        return "-"
    added = f", +{peak - base:,.0f}" if base is not None else ""
    share = row.get("share_mib")
    if share and base is not None:
        # An elastic resume's memory against the rank's share of a whole epoch.
        added += f" ({(peak - base) / share:.2f}x its share of an epoch)"
    return f"{peak:,.0f}{added}"


def _find(rows: list[dict[str, Any]], system: str, n: int) -> dict[str, Any] | None:
    for r in rows:
        if r["system"] == system and r["n"] == n and r.get("status") == "ok":
            return r
    return None


def table(results: dict[str, Any]) -> str:
    """A Markdown table of the medians. Every row compared with another system carries, in
    parentheses, how many times longer (or more memory) the baseline took than the croupier
    side: on a baseline's row against croupier, and on the ``order="torch"`` row against
    torch's sampler, whose output it must equal (the row says whether it did)."""
    rows = results["rows"]
    samplers = [r for r in rows if r["family"] == "sampler"]
    perms = [r for r in rows if r["family"] == "permutation"]
    batches = [r for r in rows if r["family"] == "batches"]
    reads = [r for r in rows if r["family"] == "reads"]
    elastic = [r for r in rows if r["family"] == "elastic"]
    lines: list[str] = []
    if samplers:
        lines += [
            "| N | sampler | first index | whole epoch | resume at mid-epoch | peak RSS MiB "
            "(+ above imports) |",
            "| --- | --- | --- | --- | --- | --- |",
        ]
        lines += [_line(r, results, ("first_s", "epoch_s", "resume_s")) for r in samplers]
    if batches:
        if lines:
            lines.append("")
        lines += [
            "| N | batches | first batch | whole epoch | resume at mid-epoch | padding efficiency "
            "| peak RSS MiB (+ above imports) |",
            "| --- | --- | --- | --- | --- | --- | --- |",
        ]
        lines += [
            _line(r, results, ("first_s", "epoch_s", "resume_s", "efficiency")) for r in batches
        ]
    if reads:
        if lines:
            lines.append("")
        lines += [
            "| N | reads (16-byte rows) | whole epoch | MB/s | peak RSS MiB (+ above imports) |",
            "| --- | --- | --- | --- | --- |",
        ]
        lines += [_line(r, results, ("epoch_s", "mb_s")) for r in reads]
    if elastic:
        if lines:
            lines.append("")
        w = results["config"]["ranks"]
        lines += [
            f"| N | resume mid-epoch on {max(1, w * 3 // 4)} of {w} ranks | first index | "
            "the rest of the epoch | peak RSS MiB (+ above imports) |",
            "| --- | --- | --- | --- | --- |",
        ]
        lines += [_line(r, results, ("resume_s", "epoch_s")) for r in elastic]
    if perms:
        if lines:
            lines.append("")
        lines += [
            "| N | full permutation | time | peak RSS MiB (+ above imports) |",
            "| --- | --- | --- | --- |",
        ]
        lines += [_line(r, results, ("epoch_s",)) for r in perms]
    return "\n".join(lines)


def _pair(
    r: dict[str, Any], results: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """``(baseline row, croupier row)`` of the comparison ``r`` is part of, if both ran."""
    other = _find(results["rows"], results["baselines"].get(r["system"], ""), r["n"])
    if other is None:
        return None
    return (other, r) if results["systems"][r["system"]]["ours"] else (r, other)


def _line(r: dict[str, Any], results: dict[str, Any], keys: tuple[str, ...]) -> str:
    cells = [_n(r["n"]), r["system"]]
    if r.get("status") != "ok":
        cells += [f"{r['status']}: {r.get('detail', '')}"] + [""] * len(keys)
        return "| " + " | ".join(cells) + " |"
    pair = _pair(r, results)
    for key in keys:
        if key == "efficiency":
            value = r.get(key)
            cells.append("-" if value is None else f"{value:.1%}")
            continue
        if key == "mb_s":
            value = r.get(key)
            cells.append("-" if value is None else f"{value:,.0f}")
            continue
        cells.append(
            _time(r.get(key)) + (_ratio(pair[0].get(key), pair[1].get(key)) if pair else "")
        )
    mem = _mem(r) + (_mem_ratio(*pair) if pair else "")
    if pair and results["systems"][r["system"]]["same_output"]:
        same = pair[0].get("digest") is not None and pair[0].get("digest") == r.get("digest")
        mem += "; same output as torch" if same else "; OUTPUT DIFFERS from torch"
    if not r.get("checks_ok", True):
        mem += " CHECK FAILED"
    return "| " + " | ".join([*cells, mem]) + " |"


def _mem_ratio(big: dict[str, Any], small: dict[str, Any]) -> str:
    """Ratio of the memory each added above its imports."""
    b = big.get("peak_mib", 0) - big.get("rss_base_mib", 0)
    s = small.get("peak_mib", 0) - small.get("rss_base_mib", 0)
    if b <= 0 or s <= 0:
        return ""
    return _ratio(b, s)


def write_json(results: dict[str, Any], path: Path) -> None:
    """Writes the full results (every run, the medians, the machine) as JSON."""
    path.write_text(json.dumps(results, indent=2) + "\n")


def pyplot() -> Any:
    """matplotlib's ``pyplot`` on the file-only Agg backend, or ``None`` when matplotlib is not
    installed (it is an optional ``bench`` dependency)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def plot(results: dict[str, Any], path: Path) -> bool:
    """Draws cost against N (log-log) for every system: time to the first index, to the whole
    epoch (or permutation), and peak RSS above the imports. Returns ``False`` when matplotlib
    is not installed."""
    plt = pyplot()
    if plt is None:
        return False
    rows = [r for r in results["rows"] if r.get("status") == "ok"]
    panels = (
        ("first_s", "time to the first index (s)"),
        ("epoch_s", "whole epoch / permutation (s)"),
        ("resume_s", "resume at mid-epoch (s)"),
        ("added_mib", "peak RSS above imports (MiB)"),
    )
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4.6))
    colors = plt.get_cmap("tab10")
    for ax, (key, title) in zip(axes, panels, strict=True):
        for i, system in enumerate(results["systems"]):
            pts = []
            for r in rows:
                if r["system"] != system:
                    continue
                value = r.get(key)
                if key == "added_mib" and "peak_mib" in r:
                    value = max(r["peak_mib"] - r.get("rss_base_mib", 0), 0.1)
                if value is not None and value > 0:
                    pts.append((r["n"], value))
            if pts:
                pts.sort()
                xs, ys = [p[0] for p in pts], [p[1] for p in pts]
                ax.loglog(xs, ys, marker="o", label=system, color=colors(i))
        ax.set_title(title)
        ax.set_xlabel("N (samples)")
        ax.grid(True, which="both", alpha=0.3)
    handles = {h.get_label(): h for ax in axes for h in ax.get_lines()}
    fig.legend(handles.values(), handles.keys(), loc="lower center", ncol=len(handles), fontsize=8)
    m = results["machine"]
    cfg = results["config"]
    fig.suptitle(
        f"croupier {m['croupier']} bench, W={cfg['ranks']} ranks, rank {cfg['rank']}: "
        f"{m.get('cpu', '?')}, {m.get('cpus')} cores, {m.get('memory_gib')} GiB"
    )
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
