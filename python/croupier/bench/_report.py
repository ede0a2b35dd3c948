"""Turns ``croupier bench`` results into a table (with ratios), JSON and a log-log plot."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

__all__ = ["figure", "plot", "table", "write_json"]


def _time(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 1e-6:
        return f"{seconds * 1e9:.0f} ns"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f} us"
    if seconds < 1:
        return f"{seconds * 1e3:.1f} ms"
    return f"{seconds:.2f} s"


def _tick_time(seconds: float) -> str:
    """A round time for an axis tick: ``100 us``, ``1 ms``, ``10 s``."""
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6), ("ns", 1e-9)):
        if seconds >= scale * 0.999 or unit == "ns":
            return f"{seconds / scale:.3g} {unit}"
    raise AssertionError("unreachable")


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
    samplers = [r for r in rows if r["family"] == "samplers"]
    mixtures = [r for r in rows if r["family"] == "mixtures"]
    perms = [r for r in rows if r["family"] == "permutations"]
    batches = [r for r in rows if r["family"] == "buckets"]
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
    if mixtures:
        if lines:
            lines.append("")
        lines += [
            "| N | mixture sampler | first index | whole epoch | resume at mid-epoch | peak RSS "
            "MiB (+ above imports) |",
            "| --- | --- | --- | --- | --- | --- |",
        ]
        lines += [_line(r, results, ("first_s", "epoch_s", "resume_s")) for r in mixtures]
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
    systems = results["systems"]
    # croupier's side is the denominator; between two of croupier's own (an earlier order
    # as the baseline of the new one), the row naming its target is the baseline.
    mine, its_target = systems[r["system"]]["ours"], systems[other["system"]]["ours"]
    return (other, r) if mine and not its_target else (r, other)


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


def _decades(values: list[float], pad: bool = False) -> tuple[float, float]:
    """The whole decades around ``values``, a little wider each side (a third of a decade if
    ``pad``) so that markers at the ends are not cut."""
    lo, hi = math.floor(math.log10(min(values))), math.ceil(math.log10(max(values)))
    if hi == lo:
        hi += 1
    margin = 10 ** (1 / 3 if pad else 0.08)
    return 10.0**lo / margin, 10.0**hi * margin


# What each family's panel shows: its title and the metric (time, seconds).
PANELS = {
    "samplers": ("Samplers: one rank's whole epoch", "epoch_s"),
    "mixtures": ("Mixtures (100 datasets): one rank's epoch", "epoch_s"),
    "buckets": ("Token-budget buckets: one rank's epoch", "epoch_s"),
    "reads": ("Reads of one rank's rows (16 B each)", "epoch_s"),
    "elastic": ("Elastic resume: the rest of the epoch", "epoch_s"),
    "permutations": ("Full permutation of [0, N)", "epoch_s"),
}
#: How croupier's lines look in every panel (a second croupier system in a panel is dashed);
#: the alternatives get the other colours, thinner, dashed, each its own marker.
OURS = {"color": "#c0392b", "linewidth": 2.8, "marker": "o", "markersize": 7, "zorder": 3}
THEIRS = ("#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#7f7f7f")
MARKERS = ("s", "^", "D", "v", "P", "X")


def caption(results: dict[str, Any]) -> str:
    """The machine and the command a result came from, for a plot's caption."""
    m, run = results["machine"], results.get("run", {})
    machine = (
        f"{m.get('cpu', '?')}, {m.get('cpus')} cores, {m.get('memory_gib')} GiB; croupier "
        f"{m['croupier']}, Python {m['python']}, numpy {m.get('numpy')}, torch {m.get('torch')}"
    )
    command = f"{run['command']}  ({run['started']})" if run else ""
    return f"{machine}\n{command}".rstrip()


def plot(results: dict[str, Any], path: Path) -> bool:
    """Draws :func:`figure` into the PNG file ``path``. Returns ``False`` when matplotlib is not
    installed."""
    plt = pyplot()
    if plt is None:
        return False
    fig = figure(results)
    fig.savefig(path, dpi=110, format="png")
    plt.close(fig)
    return True


def figure(results: dict[str, Any]) -> Any:
    """One panel per family: the time each system takes against N (log-log), croupier drawn
    the same way (thick, red, round markers) in every panel, each panel with its own legend,
    the machine and the command in the caption. Needs matplotlib."""
    plt = pyplot()
    from matplotlib.ticker import FuncFormatter, NullFormatter

    rows = [r for r in results["rows"] if r.get("status") == "ok"]
    systems = results["systems"]
    families = [f for f in PANELS if any(r["family"] == f for r in rows)]
    cols = min(3, max(len(families), 1))
    lines_ = -(-max(len(families), 1) // cols)
    fig, axes = plt.subplots(lines_, cols, figsize=(5.4 * cols, 4.1 * lines_ + 1.1), squeeze=False)
    flat = [ax for line in axes for ax in line]
    for ax in flat[len(families) :]:
        ax.remove()
    for ax, family in zip(flat, families, strict=False):
        title, key = PANELS[family]
        ours_seen = theirs_seen = 0
        xs: list[float] = []
        ys: list[float] = []
        for name, info in systems.items():
            pts = sorted(
                (r["n"], r[key])
                for r in rows
                if r["system"] == name and r["family"] == family and r.get(key, 0) > 0
            )
            if not pts:
                continue
            if info["ours"]:
                style: dict[str, Any] = {**OURS, "linestyle": "--" if ours_seen else "-"}
                ours_seen += 1
            else:
                style = {
                    "color": THEIRS[theirs_seen % len(THEIRS)],
                    "marker": MARKERS[theirs_seen % len(MARKERS)],
                    "linewidth": 1.6,
                    "markersize": 6,
                    "linestyle": "--",
                }
                theirs_seen += 1
            ax.loglog([p[0] for p in pts], [p[1] for p in pts], label=name, **style)
            xs += [p[0] for p in pts]
            ys += [p[1] for p in pts]
        # Whole decades on both axes, so that each has labelled ticks (in units) at its ends.
        ax.set_xlim(*_decades(xs, pad=True))
        ax.set_ylim(*_decades(ys))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: _n(round(v))))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: _tick_time(v)))
        for axis in (ax.xaxis, ax.yaxis):
            axis.set_minor_formatter(NullFormatter())
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("N, samples (log scale)")
        ax.set_ylabel("time (log scale)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(loc="best", fontsize=8, framealpha=0.9)
    cfg = results["config"]
    fig.suptitle(
        f"croupier bench: time against N, lower is better (W={cfg['ranks']} ranks, "
        f"rank {cfg['rank']} timed)",
        fontsize=12,
    )
    fig.text(0.01, 0.01, caption(results), fontsize=7.5, ha="left", va="bottom", color="#444")
    fig.tight_layout(rect=(0, 0.55 / fig.get_figheight(), 1, 1))
    return fig
