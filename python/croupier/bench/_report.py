"""Turns ``croupier bench`` results into a table (with ratios), JSON and a log-log plot."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any

__all__ = ["figure", "notes", "plot", "table", "write_json"]


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
    """Memory added above the run's imports, then the peak RSS (imports included)."""
    peak, base = row.get("peak_mib"), row.get("rss_base_mib")
    if peak is None:
        return "-"
    if base is None:
        return f"- (peak {peak:,.0f})"
    text = f"+{peak - base:,.0f} (peak {peak:,.0f})"
    share = row.get("share_mib")
    if share:
        # An elastic resume's memory against the rank's share of a whole epoch.
        text += f", {(peak - base) / share:.2f}x its share of an epoch"
    return text


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
    megatron = [r for r in rows if r["family"] == "megatron"]
    lines: list[str] = []
    if samplers:
        lines += [
            "| N | sampler | first index | whole epoch | resume at mid-epoch | memory added, MiB "
            "(peak RSS) |",
            "| --- | --- | --- | --- | --- | --- |",
        ]
        lines += [_line(r, results, ("first_s", "epoch_s", "resume_s")) for r in samplers]
    if mixtures:
        if lines:
            lines.append("")
        lines += [
            "| N | mixture sampler | first index | whole epoch | resume at mid-epoch | memory "
            "added, MiB (peak RSS) |",
            "| --- | --- | --- | --- | --- | --- |",
        ]
        lines += [_line(r, results, ("first_s", "epoch_s", "resume_s")) for r in mixtures]
    if batches:
        if lines:
            lines.append("")
        lines += [
            "| N | batches | first batch | whole epoch | resume at mid-epoch | padding efficiency "
            "| memory added, MiB (peak RSS) |",
            "| --- | --- | --- | --- | --- | --- | --- |",
        ]
        lines += [
            _line(r, results, ("first_s", "epoch_s", "resume_s", "efficiency")) for r in batches
        ]
    if reads:
        if lines:
            lines.append("")
        lines += [
            "| N | reads (16-byte rows) | whole epoch | MB/s | memory added, MiB (peak RSS) |",
            "| --- | --- | --- | --- | --- |",
        ]
        lines += [_line(r, results, ("epoch_s", "mb_s")) for r in reads]
    if elastic:
        if lines:
            lines.append("")
        w = results["config"]["ranks"]
        lines += [
            f"| N | resume mid-epoch on {max(1, w * 3 // 4)} of {w} ranks | first index | "
            "the rest of the epoch | memory added, MiB (peak RSS) |",
            "| --- | --- | --- | --- | --- |",
        ]
        lines += [_line(r, results, ("resume_s", "epoch_s")) for r in elastic]
    if perms:
        if lines:
            lines.append("")
        lines += [
            "| N | full permutation | time | memory added, MiB (peak RSS) |",
            "| --- | --- | --- | --- |",
        ]
        lines += [_line(r, results, ("epoch_s",)) for r in perms]
    if megatron:
        if lines:
            lines.append("")
        lines += [
            "| N | Megatron's index or sampler epoch | time | memory added, MiB (peak RSS) |",
            "| --- | --- | --- | --- |",
        ]
        lines += [_line(r, results, ("epoch_s",)) for r in megatron]
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


def _range(r: dict[str, Any], key: str) -> str:
    """`` [fastest-slowest]`` of a time's runs, when they differ."""
    lo, hi = r.get("spread", {}).get(key, (None, None))
    if lo is None or lo == hi:
        return ""
    return f" [{_time(lo)}-{_time(hi)}]"


def _name(r: dict[str, Any], results: dict[str, Any]) -> str:
    """A system's name, marked when it is a hand-written stand-in (see :func:`notes`)."""
    hand = results["systems"].get(r["system"], {}).get("hand_written")
    return f"{r['system']} (hand-written)" if hand else r["system"]


_WORDS = {"first_s": "first index", "epoch_s": "whole epoch", "resume_s": "resume"}


def notes(results: dict[str, Any]) -> str:
    """What to know before reading the table: whether the run is complete, whether the machine
    was busy or a measurement's runs disagree, and the key (what the figures and marks mean,
    what each hand-written baseline stands for)."""
    lines: list[str] = []
    if results.get("incomplete"):
        lines.append("**Incomplete**: the run was interrupted; these are the runs that finished.")
    load = results.get("load") or {}
    if load.get("max") is not None and load.get("cores") and load["max"] > load["cores"]:
        lines.append(
            f"**The machine was busy**: a load average up to {load['max']:.1f} on "
            f"{load['cores']} cores during the run (its own runs count about 1); times are "
            "inflated, and ratios less sure."
        )
    wide = [r for r in results["rows"] if r.get("wide")]
    if wide:
        lines.append(
            "**Runs more than 2x apart**: "
            + "; ".join(
                f"{r['system']} at N = {_n(r['n'])} ({', '.join(_WORDS[k] for k in r['wide'])})"
                for r in wide
            )
            + ". The machine was busy for part of them: read the median with its range."
        )
    cfg = results["config"]
    runs = cfg.get("repeats", 1) * len(cfg.get("seeds", [0]))
    more = cfg.get("more_repeats", 0) * len(cfg.get("seeds", [0]))
    each = f"{runs} run(s)" + (f", up to {runs + more} where they disagreed" if more else "")
    key = (
        f"Key: every time is the median of {each}, each run in its own process, with "
        "[fastest-slowest] when they differ; a sampler's first index: in each run the fastest "
        "of up to 5 fresh samplers (one when it takes over 0.2 s), after a small one paid the "
        "process's set-up; (29x): how many times longer the alternative "
        "took than croupier (on a memory cell: how much more memory it added); memory: what the "
        "run added above the modules it imports (read after them), in MiB, and the peak RSS, "
        "which counts those modules too (torch's are about 450 MiB)."
    )
    hand = [(n, s["hand_written"]) for n, s in results["systems"].items() if s.get("hand_written")]
    if hand:
        key += " Hand-written: croupier's own implementation of a documented algorithm, where no"
        key += " package that does it installs here: " + "; ".join(
            f"{name}, {what}" for name, what in hand
        )
        key += "."
    lines.append(key)
    return "\n\n".join(lines)


def _line(r: dict[str, Any], results: dict[str, Any], keys: tuple[str, ...]) -> str:
    cells = [_n(r["n"]), _name(r, results)]
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
            _time(r.get(key))
            + _range(r, key)
            + (_ratio(pair[0].get(key), pair[1].get(key)) if pair else "")
        )
    mem = _mem(r) + (_mem_ratio(*pair) if pair else "")
    if pair and results["systems"][r["system"]]["same_output"]:
        same = pair[0].get("digest") is not None and pair[0].get("digest") == r.get("digest")
        other = "torch"
        if r["family"] == "megatron":
            other = "Megatron-LM" if r["system"].endswith("sampler") else "megatron-core"
        mem += f"; same output as {other}" if same else f"; OUTPUT DIFFERS from {other}"
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


# Each family's row of panels: its title, and the metrics it has (whole epoch, first index,
# resume, memory added), each with the words of its panel.
FAMILY_TITLES = {
    "samplers": "Samplers",
    "mixtures": "Mixtures (100 datasets)",
    "buckets": "Token-budget buckets",
    "reads": "Reads (16-byte rows)",
    "elastic": "Elastic resume",
    "permutations": "Full permutation",
    "megatron": "Megatron-Core's indices",
}
METRIC_WORDS = {
    "epoch_s": "one rank's whole epoch",
    "first_s": "first index",
    "resume_s": "resume mid-epoch",
    "added_mib": "memory added",
}
# The elastic family's epoch is the rest of one, and its resume the first index after it.
ELASTIC_WORDS = {"epoch_s": "the rest of the epoch", "resume_s": "first index after it"}
PANELS = tuple(METRIC_WORDS)
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


def _added(r: dict[str, Any]) -> tuple[float, float, float] | None:
    """Memory a row's runs added above their imports, in MiB: median, smallest, largest."""
    added = [
        x["peak_mib"] - x["rss_base_mib"]
        for x in r.get("runs", [])
        if x.get("status") == "ok" and "peak_mib" in x and "rss_base_mib" in x
    ]
    if not added and "peak_mib" in r and "rss_base_mib" in r:
        added = [r["peak_mib"] - r["rss_base_mib"]]
    if not added:
        return None
    return statistics.median(added), min(added), max(added)


def _point(r: dict[str, Any], key: str) -> tuple[float, float, float] | None:
    """A row's median of ``key`` with its smallest and largest run (``None`` if it has none)."""
    if key == "added_mib":
        return _added(r)
    value = r.get(key)
    if value is None or value <= 0:
        return None
    lo, hi = r.get("spread", {}).get(key, (value, value))
    return value, lo, hi


def panel_title(family: str, key: str) -> str:
    """The title of ``family``'s panel of ``key``."""
    words = ELASTIC_WORDS.get(key) if family == "elastic" else None
    return f"{FAMILY_TITLES[family]}: {words or METRIC_WORDS[key]}"


def figure(results: dict[str, Any]) -> Any:
    """A row of panels per family, one per metric it has (whole epoch, first index, resume,
    memory added above the imports), each against N (log-log) with every system's median and
    the range of its runs as error bars; croupier drawn the same way (thick, red, round
    markers) in every panel, each panel with its own legend, the machine and the command in
    the caption. Readable at any number of panels. Needs matplotlib."""
    plt = pyplot()
    from matplotlib.ticker import FuncFormatter, NullFormatter

    rows = [r for r in results["rows"] if r.get("status") == "ok"]
    systems = results["systems"]
    grid = []
    for family in FAMILY_TITLES:
        mine = [r for r in rows if r["family"] == family]
        keys = [k for k in PANELS if any((_point(r, k) or (0,))[0] > 0 for r in mine)]
        if keys:
            grid.append((family, keys))
    cols = max([len(keys) for _f, keys in grid] + [2])
    fig, axes = plt.subplots(
        max(len(grid), 1), cols, figsize=(4.4 * cols, 3.5 * max(len(grid), 1) + 1.3),
        squeeze=False,
    )  # fmt: skip
    padded = grid + [("", [])] * (len(axes) - len(grid))
    for line, (family, keys) in zip(axes, padded, strict=True):
        for ax in line[len(keys) :]:
            ax.remove()
        for ax, key in zip(line, keys, strict=False):
            _panel(ax, family, key, rows, systems)
            memory = key == "added_mib"
            ax.yaxis.set_major_formatter(
                FuncFormatter(lambda v, _: f"{v:.3g} MiB") if memory else FuncFormatter(
                    lambda v, _: _tick_time(v)
                )
            )  # fmt: skip
            ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: _n(round(v))))
            for axis in (ax.xaxis, ax.yaxis):
                axis.set_minor_formatter(NullFormatter())
            ax.set_title(panel_title(family, key), fontsize=9.5)
            ax.set_xlabel("N, samples (log scale)", fontsize=8.5)
            ax.set_ylabel("MiB added (log scale)" if memory else "time (log scale)", fontsize=8.5)
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(loc="best", fontsize=7, framealpha=0.9)
    cfg = results["config"]
    fig.suptitle(
        f"croupier bench, lower is better: W={cfg['ranks']} ranks, rank {cfg['rank']} timed; "
        "medians, bars from the fastest to the slowest run",
        fontsize=11,
        wrap=True,
    )
    fig.text(0.01, 0.01, caption(results), fontsize=7, ha="left", va="bottom", color="#444")
    fig.tight_layout(rect=(0, 0.6 / fig.get_figheight(), 1, 1 - 0.15 / fig.get_figheight()))
    return fig


def _panel(
    ax: Any, family: str, key: str, rows: list[dict[str, Any]], systems: dict[str, Any]
) -> None:
    """Draws every system of ``family`` in ``ax``: ``key`` against N, with its runs' range."""
    ours_seen = theirs_seen = 0
    xs: list[float] = []
    ys: list[float] = []
    for name, info in systems.items():
        pts = sorted(
            (r["n"], *pt)
            for r in rows
            if r["system"] == name and r["family"] == family
            for pt in [_point(r, key)]
            if pt is not None and pt[0] > 0
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
        n = [p[0] for p in pts]
        mid = [p[1] for p in pts]
        below = [max(p[1] - p[2], 0.0) for p in pts]
        above = [max(p[3] - p[1], 0.0) for p in pts]
        ax.errorbar(n, mid, yerr=[below, above], label=name, capsize=2.5, **style)
        xs += n
        ys += [p[2] for p in pts if p[2] > 0] + [p[3] for p in pts]
    ax.set_xscale("log")
    ax.set_yscale("log")
    # Whole decades on both axes, so that each has labelled ticks (in units) at its ends.
    ax.set_xlim(*_decades(xs, pad=True))
    ax.set_ylim(*_decades(ys))
