"""``croupier bench``: argument parsing, the harness on tiny workloads, and its outputs."""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import json
import os
import sys

import pytest

from croupier import cli
from croupier.bench import BenchConfig, run
from croupier.bench._baselines import many_mixture_args
from croupier.bench._ranks import SweepConfig
from croupier.bench._ranks import plot as sweep_plot
from croupier.bench._ranks import run as run_sweep
from croupier.bench._ranks import table as sweep_table
from croupier.bench._report import table
from croupier.bench._systems import SYSTEMS, by_name

needs_torch = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None, reason="compares against torch's sampler"
)
needs_matplotlib = pytest.mark.skipif(
    importlib.util.find_spec("matplotlib") is None, reason="draws the plot with matplotlib"
)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("1000", 1000),
        ("1e8", 100_000_000),
        ("1_000", 1000),
        ("2**33+5", 2**33 + 5),
        ("2**20", 2**20),
    ],
)
def test_counts_are_parsed(text, value):
    assert cli._count(text) == value


@pytest.mark.parametrize("text", ["1.5", "abc", "1e-3", "2**x"])
def test_bad_counts_are_refused(text):
    with pytest.raises(argparse.ArgumentTypeError, match="not an integer"):
        cli._count(text)


@pytest.mark.parametrize(
    ("cfg", "match"),
    [
        (BenchConfig(ns=(10**10 + 1,)), r"--n must be in \[1e3, 1e10\]"),
        (BenchConfig(ns=(0,)), r"--n must be in \[1e3, 1e10\], got 0"),
        (BenchConfig(ns=()), "--n needs at least one size"),
        (BenchConfig(ranks=0), r"--ranks must be in \[1, 2\*\*63-1\], got 0"),
        (BenchConfig(ranks=4, rank=4), r"--rank must be in \[0, --ranks\) = \[0, 4\), got 4"),
        (BenchConfig(repeats=0), r"--repeats must be in \[1, 1000\], got 0"),
        (BenchConfig(seeds=()), "--seeds must be"),
        (BenchConfig(seeds=(2**64,)), "--seeds must be"),
        (BenchConfig(timeout=0), r"--timeout must be in \(0, 1e6\] seconds, got 0"),
        (BenchConfig(timeout=1e7), r"--timeout must be in \(0, 1e6\]"),
        (BenchConfig(everything=True, systems=("croupier",)), "--all runs every system"),
        (BenchConfig(timeout=float("nan")), r"--timeout must be in \(0, 1e6\]"),
        (BenchConfig(systems=("nope",)), "unknown system 'nope'"),
        (BenchConfig(families=("nope",)), "unknown family 'nope'"),
        (BenchConfig(systems=("croupier",), families=("reads",)), "not both"),
    ],
)
def test_bad_configs_are_refused_before_any_run(cfg, match):
    with pytest.raises(ValueError, match=match):
        run(cfg)


def test_every_system_has_a_known_baseline_and_estimate():
    names = {s.name for s in SYSTEMS}
    for s in SYSTEMS:
        assert s.baseline_for in names | {""}
        assert s.memory_estimate(10**9, 8) > 0
    # A rank's share of croupier needs ~N/W, torch's sampler ~N.
    assert by_name("croupier").memory_estimate(10**9, 8) < 2 << 30
    assert by_name("torch-sampler").memory_estimate(10**9, 8) > 40 << 30


@needs_torch
def test_harness_measures_checks_and_compares():
    lines: list[str] = []
    cfg = BenchConfig(
        repeats=1,
        ns=(5000,),
        ranks=4,
        rank=1,
        systems=("croupier", "torch-sampler", "croupier-torch-order", "croupier-permutation"),
    )
    results = run(cfg, progress=lines.append)
    rows = {r["system"]: r for r in results["rows"]}
    assert all(r["status"] == "ok" for r in rows.values()), rows
    for name in ("croupier", "torch-sampler", "croupier-torch-order"):
        assert rows[name]["runs"][0]["count"] == 1250
        assert rows[name]["checks_ok"]
        assert rows[name]["epoch_s"] > 0
        assert rows[name]["peak_mib"] >= rows[name]["rss_base_mib"] > 0
    assert "resume_s" in rows["croupier"] and "resume_s" not in rows["torch-sampler"]
    assert rows["croupier-permutation"]["runs"][0]["count"] == 5000
    # order="torch" yields torch's exact sequence: same digest.
    assert rows["croupier-torch-order"]["digest"] == rows["torch-sampler"]["digest"]
    assert rows["croupier"]["digest"] != rows["torch-sampler"]["digest"]
    text = table(results)
    assert "same output as torch" in text
    assert "| 5,000 | torch-sampler |" in text
    assert any("[4/4]" in line for line in lines)
    json.dumps(results)  # JSON-ready


def test_reads_family_reads_the_rank_share_both_ways():
    cfg = BenchConfig(
        repeats=1, ns=(6000,), ranks=3, rank=2, systems=("croupier-chunks", "random-reads")
    )
    results = run(cfg)
    rows = {r["system"]: r for r in results["rows"]}
    assert all(r["status"] == "ok" for r in rows.values()), rows
    # 6000 rows in chunks of 1024: 6 chunks (the last short), 2 per rank; rank 2 holds the
    # short one (6000 - 5 * 1024 = 880 rows): 1904 rows, 8 batches like the others (the last
    # partial), so nothing to pad.
    assert rows["random-reads"]["runs"][0]["count"] == 2000
    assert rows["croupier-chunks"]["runs"][0]["count"] == 1024 + 880
    assert rows["croupier-chunks"]["mb_s"] > 0
    text = table(results)
    assert "| 6,000 | random-reads (hand-written) |" in text and "MB/s" in text


def test_elastic_family_resumes_on_three_quarters_of_the_ranks():
    pytest.importorskip("torch")
    cfg = BenchConfig(
        repeats=1, ns=(10_007,), ranks=8, rank=7, systems=("croupier-elastic", "torch-elastic")
    )
    results = run(cfg)
    rows = {r["system"]: r for r in results["rows"]}
    assert all(r["status"] == "ok" for r in rows.values()), rows
    # Half of every old share (ceil(10007 / 8) = 1251 -> 625 each, 5000 in all) consumed; the
    # remaining 5007 dealt to 6 ranks: ceil(5007 / 6) = 835 for the last new rank (rank 5).
    assert rows["croupier-elastic"]["runs"][0]["count"] == 835
    assert rows["croupier-elastic"]["runs"][0]["new_ranks"] == 6
    assert rows["croupier-elastic"]["checks_ok"]
    assert rows["torch-elastic"]["runs"][0]["count"] == len(range(10_007)[5000:][5::6])
    text = table(results)
    assert "resume mid-epoch on 6 of 8 ranks" in text and "its share of an epoch" in text


def test_many_datasets_mixture_row():
    cum, weights = many_mixture_args(20_000)
    sizes = [b - a for a, b in itertools.pairwise(cum)]
    assert len(sizes) == 156 and min(sizes) >= 64 and cum[-1] == 20_000
    assert len(set(sizes)) > 10 and len(set(weights)) == 13  # unequal sizes and weights
    results = run(
        BenchConfig(repeats=1, ns=(20_000,), ranks=4, rank=1, systems=("croupier-mixture-10k",))
    )
    (row,) = results["rows"]
    assert row["status"] == "ok" and row["checks_ok"]
    assert row["runs"][0]["count"] == cum[-1] // 4  # the global sequence, dealt to 4 ranks


def test_repeats_go_round_robin_over_systems():
    lines: list[str] = []
    cfg = BenchConfig(
        ns=(3000,),
        repeats=2,
        more_repeats=0,  # (runs of a few microseconds are often 2x apart)
        systems=("croupier-permutation", "numpy-permutation"),
    )
    results = run(cfg, progress=lines.append)
    started = [line.split("] ")[1] for line in lines if line.endswith("...")]
    assert started == [
        "croupier-permutation N=3,000 seed=0 run 1/2 ...",
        "numpy-permutation N=3,000 seed=0 run 1/2 ...",
        "numpy-permutation N=3,000 seed=0 run 2/2 ...",
        "croupier-permutation N=3,000 seed=0 run 2/2 ...",
    ]
    for row in results["rows"]:
        assert [r["count"] for r in row["runs"]] == [3000, 3000]
        # The reported time is the median of the runs (of two: their mean).
        assert row["epoch_s"] == pytest.approx(sum(r["epoch_s"] for r in row["runs"]) / 2)


@needs_torch
def test_runs_that_cannot_fit_are_skipped_and_said_so():
    cfg = BenchConfig(repeats=1, ns=(10**10,), systems=("torch-sampler",))
    results = run(cfg)
    (row,) = results["rows"]
    assert row["status"] == "skipped"
    assert "GiB available" in row["detail"]
    assert "skipped" in table(results)


def test_sizes_the_timeout_cannot_hold_are_skipped_and_said_so():
    # croupier-chunks at 1e9: ~30 s of work by its estimate, with little memory.
    results = run(BenchConfig(repeats=1, ns=(10**9,), systems=("croupier-chunks",), timeout=5))
    (row,) = results["rows"]
    assert row["status"] == "skipped", row
    assert "over the 5 s timeout" in row["detail"]
    # lhotse's sampler runs up to 1e7 under the default timeout and is skipped at 1e8 (--all).
    lhotse, timeout = by_name("lhotse-buckets"), BenchConfig().timeout
    assert 10**7 * lhotse.s_per_index < timeout < 10**8 * lhotse.s_per_index


def test_bucket_rows_time_both_orders_and_compare_them():
    cfg = BenchConfig(
        repeats=1,
        ns=(20_000,),
        ranks=4,
        rank=1,
        systems=("croupier-buckets", "croupier-buckets-per-rank-order"),
    )
    results = run(cfg)
    rows = {r["system"]: r for r in results["rows"]}
    assert all(r["status"] == "ok" for r in rows.values()), rows
    for row in rows.values():
        assert row["checks_ok"]  # the first batch and the resumed batch are the epoch's
        assert row["runs"][0]["count"] > 0 and row["epoch_s"] > 0 and row["resume_s"] > 0
        assert 0.5 < row["efficiency"] <= 1
    # The global order carries bucket tails over padding-optimal buckets.
    assert (
        rows["croupier-buckets"]["efficiency"]
        > rows["croupier-buckets-per-rank-order"]["efficiency"]
    )
    assert results["baselines"]["croupier-buckets-per-rank-order"] == "croupier-buckets"
    (fast,) = [
        line
        for line in table(results).splitlines()
        if "| croupier-buckets-per-rank-order |" in line
    ]
    assert fast.count("x)") >= 3  # first batch, epoch and resume against the global order


def _without(monkeypatch, module: str) -> None:
    """``module`` looks uninstalled to the harness (its ``find_spec`` answers ``None``)."""
    import croupier.bench._runner as runner

    real = runner.importlib.util.find_spec

    def find_spec(name, *args, **kwargs):
        if name == module or name.startswith(module + "."):
            return None
        return real(name, *args, **kwargs)

    monkeypatch.setattr(runner.importlib.util, "find_spec", find_spec)


def test_without_lhotse_its_row_says_not_installed_and_the_rest_run(monkeypatch, tmp_path, capsys):
    """lhotse is an optional baseline: without it its row is "not installed", as torch's rows
    are without torch, and croupier's row runs alone, compared with nothing."""
    _without(monkeypatch, "lhotse")
    cfg = BenchConfig(
        repeats=1, ns=(5000,), ranks=8, rank=3, systems=("croupier-buckets", "lhotse-buckets")
    )
    results = run(cfg)
    rows = {r["system"]: r for r in results["rows"]}
    assert rows["lhotse-buckets"]["status"] == "not installed"
    assert rows["lhotse-buckets"]["detail"] == "needs lhotse"
    assert "runs" not in rows["lhotse-buckets"]  # never started
    assert rows["croupier-buckets"]["status"] == "ok" and rows["croupier-buckets"]["checks_ok"]
    text = table(results)
    assert "| 5,000 | lhotse-buckets | not installed: needs lhotse |" in text
    (ours,) = [line for line in text.splitlines() if "| croupier-buckets |" in line]
    assert "x)" not in ours
    # Asked for alone, it is refused before any work, like any system that is not installed.
    argv = ["bench", "--n", "5000", "--systems", "lhotse-buckets", "--out", str(tmp_path / "o")]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "nothing to run: lhotse-buckets at N=5,000 is not installed (needs lhotse)" in err
    assert not (tmp_path / "o").exists()


def test_lhotse_row_measures_its_dynamic_bucketing_sampler():
    pytest.importorskip("lhotse")
    cfg = BenchConfig(
        repeats=1, ns=(20_000,), ranks=8, rank=3, systems=("croupier-buckets", "lhotse-buckets")
    )
    results = run(cfg)
    rows = {r["system"]: r for r in results["rows"]}
    assert all(r["status"] == "ok" for r in rows.values()), rows
    row = rows["lhotse-buckets"]
    assert row["checks_ok"]  # its first batch is the epoch's, its resume yields batch mid
    assert row["runs"][0]["count"] > 0 and 0.5 < row["efficiency"] <= 1
    assert 0 < row["setup_s"] <= row["first_s"] and row["epoch_s"] > 0 and row["resume_s"] > 0
    assert results["machine"]["lhotse"]
    (line,) = [x for x in table(results).splitlines() if "| lhotse-buckets |" in x]
    assert line.count("x)") >= 3  # against croupier-buckets


def test_lhotse_mid_epoch_state_is_the_checkpoint_lhotse_takes_there():
    """The bench resumes lhotse from a state made from the end of the epoch (replaying half
    an epoch to take a real one would double the run): it equals the real one."""
    pytest.importorskip("lhotse")
    from croupier.bench import _lhotse
    from croupier.bench._baselines import BUCKETS, MAX_TOKENS, bench_lengths

    cuts = _lhotse.lazy_cuts(bench_lengths(20_000, 0))
    s = _lhotse.sampler(cuts, MAX_TOKENS, BUCKETS, 8, 3, seed=0, epoch=1)
    whole = [_lhotse.batch_indices(b) for b in s]
    mid = len(whole) // 2
    made = _lhotse.mid_epoch_state(s, whole, mid)
    real = _lhotse.sampler(cuts, MAX_TOKENS, BUCKETS, 8, 3, seed=0, epoch=1)
    it = iter(real)
    for _ in range(mid):
        next(it)
    assert real.state_dict() == made
    resumed = _lhotse.sampler(cuts, MAX_TOKENS, BUCKETS, 8, 3, seed=0, epoch=1)
    resumed.load_state_dict(made)
    assert [_lhotse.batch_indices(b) for b in resumed] == whole[mid:]


@needs_matplotlib
def test_cli_writes_table_json_and_plot(tmp_path, capsys):
    code = cli.main(
        [
            "bench",
            "--n",
            "2000",
            "--ranks",
            "2",
            "--rank",
            "1",
            "--systems",
            "croupier",
            "numpy-permutation",
            "--repeats",
            "1",
            "--out",
            str(tmp_path),
        ]
    )
    assert code == 0
    out = capsys.readouterr().out
    assert "| 2,000 | croupier |" in out
    assert "| 2,000 | numpy-permutation |" in out
    data = json.loads((tmp_path / "bench.json").read_text())
    assert data["config"]["ranks"] == 2
    assert data["machine"]["cpus"] >= 1
    md = (tmp_path / "bench.md").read_text()
    assert md.count("|") > 10
    assert "Key: every time is the median of 1 run(s)" in md  # the key under the table
    assert data["config"]["repeats"] == 1 and all(len(r["runs"]) == 1 for r in data["rows"])
    png = (tmp_path / "bench.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(("argv", "printed"), [(["--help"], "bench"), (["demo"], "indices")])
def test_help_and_demo_answer_without_importing_torch(argv, printed):
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from croupier import cli\n"
        "try:\n"
        f"    cli.main({argv!r})\n"
        "except SystemExit:\n"
        "    pass\n"
        "print('torch' in sys.modules, 'croupier.samplers' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert printed in out.stdout
    assert out.stdout.splitlines()[-1] == "False False"


def test_sweep_measures_one_share_per_world_size():
    lines: list[str] = []
    results = run_sweep(SweepConfig(ranks=(8, 2), ns=(10_001,), repeats=1), progress=lines.append)
    rows = results["rows"]
    # Measured in increasing W, rank W // 2 of each; a share is ceil(N / W) indices.
    assert [(r["n"], r["w"], r["rank"]) for r in rows] == [(10_001, 2, 1), (10_001, 8, 4)]
    assert all(r["status"] == "ok" for r in rows), rows
    assert [r["count"] for r in rows] == [5001, 1251]
    for r in rows:
        assert [run["count"] for run in r["runs"]] == [r["count"]]
        assert "resume_s" not in r["runs"][0]  # the sweep does not resume
        assert r["checks_ok"]
        assert r["ns_per_index"] == pytest.approx(r["epoch_s"] / r["count"] * 1e9)
        assert r["first_s"] > 0 and r["added_mib"] >= 0
    assert any("[2/2] N=10,001 W=8" in line for line in lines)
    text = sweep_table(results)
    assert "| N | W | per index | vs W=2 | first index | whole share | memory added |" in text
    assert "| 10,001 | 2 |" in text and "| 1.00x |" in text
    assert "| 10,001 | 8 |" in text
    assert list(results["config"]["ranks"]) == [8, 2] and results["machine"]["cpus"] >= 1
    json.dumps(results)  # JSON-ready


@pytest.mark.parametrize(
    ("cfg", "match"),
    [
        (SweepConfig(ranks=()), "at least one world size"),
        (SweepConfig(ranks=(8, 0)), r"--sweep-ranks must each be in \[1, 2\*\*63-1\], got 0"),
        (SweepConfig(ranks=(8, 64, 8)), "must not repeat"),
        (SweepConfig(ns=()), "at least one dataset length"),
        (SweepConfig(ns=(0,)), r"--n must be in \[1, 1e10\] for the sweep, got 0"),
        (SweepConfig(ns=(10**10 + 1,)), r"--n must be in \[1, 1e10\]"),
        (SweepConfig(repeats=0), r"--repeats must be in \[1, 1000\]"),
        (SweepConfig(seeds=(-1,)), r"--seeds must be in \[0, 2\*\*64\)"),
        (SweepConfig(timeout=0), r"--timeout must be in \(0, 1e6\] seconds"),
    ],
)
def test_bad_sweeps_are_refused_before_any_run(cfg, match):
    with pytest.raises(ValueError, match=match):
        run_sweep(cfg, progress=lambda line: pytest.fail(f"ran: {line}"))


@needs_matplotlib
def test_cli_sweep_writes_table_json_and_plot(tmp_path, capsys):
    out_dir = tmp_path / "sweep"
    argv = ["bench", "--sweep-ranks", "2", "8", "--n", "1e4", "--repeats", "1"]
    assert cli.main([*argv, "--out", str(out_dir)]) == 0
    out = capsys.readouterr().out
    assert "| 1e4 | 2 |" in out and "| 1e4 | 8 |" in out and "vs W=2" in out
    data = json.loads((out_dir / "ranks-sweep.json").read_text())
    assert [(r["w"], r["count"]) for r in data["rows"]] == [(2, 5000), (8, 1250)]
    assert data["config"]["repeats"] == 1
    assert (out_dir / "ranks-sweep.md").read_text().count("| 1e4 |") == 2
    assert (out_dir / "ranks-sweep.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_sweep_plot_is_skipped_without_matplotlib(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    results = {"machine": {"croupier": "x"}, "rows": []}
    assert sweep_plot(results, tmp_path / "ranks-sweep.png") is False
    assert not (tmp_path / "ranks-sweep.png").exists()


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        (["--systems", "croupier"], "--sweep-ranks cannot be combined with --systems"),
        (["--ranks", "4"], "--sweep-ranks cannot be combined with --ranks"),
        (["--rank", "1"], "--sweep-ranks cannot be combined with --rank"),
        (["--all"], "--sweep-ranks cannot be combined with --all"),
        (["--n", "0"], "--n must be in [1, 1e10] for the sweep, got 0"),
        (["--repeats", "0"], "--repeats must be in [1, 1000], got 0"),
        (["8"], "--sweep-ranks must not repeat"),
        (["0"], "--sweep-ranks must each be in [1, 2**63-1]"),
    ],
)
def test_cli_sweep_refuses_bad_arguments(tmp_path, capsys, extra, match):
    out_dir = tmp_path / "sweep"
    argv = ["bench", "--sweep-ranks", "2", "8", *extra, "--out", str(out_dir)]
    # A trailing W joins the --sweep-ranks list; the rest are options of their own.
    assert cli.main(argv) == 2
    assert match in capsys.readouterr().err
    assert not out_dir.exists()  # refused before any work


def test_cli_sweep_needs_world_sizes(capsys):
    assert cli.main(["bench", "--sweep-ranks"]) == 2
    assert "--sweep-ranks: expected at least one argument" in capsys.readouterr().err


def test_bench_help_lists_the_sweep(capsys):
    assert cli.main(["bench", "--help"]) == 0
    assert "--sweep-ranks" in capsys.readouterr().out


def _all_families_results() -> dict:
    """Results as a full run returns them, every system at three N (made-up times that grow
    with N, a range around each; the plot's layout is under test, not the numbers)."""
    rows = []
    for i, s in enumerate(SYSTEMS):
        for n in (10**5, 10**6, 10**7):
            epoch = n * 1e-8 * (i + 1)
            row = {
                "system": s.name, "family": s.family, "n": n, "status": "ok", "epoch_s": epoch,
                "first_s": 1e-3, "peak_mib": 600.0, "rss_base_mib": 500.0,
                "spread": {"epoch_s": [epoch * 0.9, epoch * 1.3]},
            }  # fmt: skip
            if s.family in ("samplers", "mixtures", "buckets", "elastic"):
                row["resume_s"] = 2e-3
            rows.append(row)
    return {
        "config": {"ranks": 8, "rank": 3},
        "machine": {"croupier": "0.2.0", "python": "3.11.7", "cpu": "AMD EPYC", "cpus": 2},
        "run": {"command": "croupier bench --all", "started": "2026-11-26 09:00 UTC"},
        "systems": {
            s.name: {"label": s.label, "family": s.family, "ours": s.ours, "same_output": False}
            for s in SYSTEMS
        },
        "rows": rows,
    }


def _inside(inner, outer) -> bool:
    return (
        inner.x0 >= outer.x0 - 1 and inner.y0 >= outer.y0 - 1
        and inner.x1 <= outer.x1 + 1 and inner.y1 <= outer.y1 + 1
    )  # fmt: skip


@needs_matplotlib
def test_the_plot_shows_each_familys_epoch_first_index_resume_and_memory(tmp_path):
    """A row of log-log panels per family, one per metric it has (whole epoch, first index,
    resume, memory added), medians with the range of the runs as error bars, croupier drawn
    the same distinct way in each, every legend inside its own panel, title and caption
    (machine, command) inside the figure, no two panels overlapping; it renders to a PNG."""
    from croupier.bench._report import FAMILY_TITLES, OURS, figure, panel_title, plot

    results = _all_families_results()
    fig = figure(results)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    box = fig.bbox
    axes = fig.get_axes()
    has_resume = ("samplers", "mixtures", "buckets", "elastic")
    want = [
        panel_title(f, k)
        for f in FAMILY_TITLES
        for k in ("epoch_s", "first_s", "resume_s", "added_mib")
        if k != "resume_s" or f in has_resume
    ]
    assert [ax.get_title() for ax in axes] == want
    for ax in axes:
        assert ax.get_xscale() == ax.get_yscale() == "log"
        memory = ax.get_title().endswith("memory added")
        assert "N, samples" in ax.get_xlabel()
        assert ("MiB added" if memory else "time") in ax.get_ylabel()
        legend = ax.get_legend()
        assert legend is not None
        assert _inside(legend.get_window_extent(renderer), ax.get_window_extent(renderer))
        assert _inside(ax.get_tightbbox(renderer), box)
        labels = [t.get_text() for t in legend.get_texts()]
        family = next(f for f, t in FAMILY_TITLES.items() if ax.get_title().startswith(t + ":"))
        assert labels == [s.name for s in SYSTEMS if s.family == family]
        # Every system's medians with their runs' range: one error bar set each.
        assert [c.get_label() for c in ax.containers] == labels
        ours = [c.lines[0] for c in ax.containers if c.get_label().startswith("croupier")]
        theirs = [c.lines[0] for c in ax.containers if not c.get_label().startswith("croupier")]
        assert ours and theirs
        for line in ours:
            assert (line.get_color(), line.get_linewidth(), line.get_marker()) == (
                OURS["color"], OURS["linewidth"], OURS["marker"],
            )  # fmt: skip
        for line in theirs:
            assert line.get_color() != OURS["color"] and line.get_linewidth() < OURS["linewidth"]
        # Tick labels carry units: times like "1 ms", memory like "100 MiB".
        unit = ("MiB",) if memory else ("s", "ms", "us")
        assert any(t.get_text().endswith(unit) for t in ax.get_yticklabels())
    for a, b in itertools.combinations(axes, 2):
        assert not a.get_window_extent(renderer).overlaps(b.get_window_extent(renderer))
    texts = [t for t in fig.texts if "croupier bench --all" in t.get_text()]
    assert len(texts) == 1 and "AMD EPYC, 2 cores" in texts[0].get_text()
    assert _inside(texts[0].get_window_extent(renderer), box)
    assert _inside(fig._suptitle.get_window_extent(renderer), box)
    # One family, one metric: the title still fits.
    one = {**results, "rows": [r for r in results["rows"] if r["family"] == "permutations"]}
    for r in one["rows"]:
        r.pop("peak_mib"), r.pop("first_s")
    small = figure(one)
    small.canvas.draw()
    assert len(small.get_axes()) == 1
    assert _inside(small._suptitle.get_window_extent(small.canvas.get_renderer()), small.bbox)
    assert plot(one, tmp_path / "bench.png")
    assert (tmp_path / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# -- repeats, spreads, a busy machine, the key ----------------------------------------------------


def test_runs_that_disagree_get_more_runs_and_every_median_its_range(monkeypatch):
    """Three runs by default; a measurement whose runs are more than 2x apart gets
    ``more_repeats`` more, the steady one does not; each metric's median comes with its
    fastest and slowest run, and the load average before every run is kept."""
    from croupier.bench import _runner

    calls: dict[str, int] = {}

    def fake(system, n, cfg, seed, extra=None):
        k = calls[system.name] = calls.get(system.name, 0) + 1
        first = 1.0 if system.name == "croupier-permutation" else (1.0 if k % 2 else 3.0)
        return {"status": "ok", "epoch_s": first, "peak_mib": 10.0 + k, "rss_base_mib": 5.0}

    monkeypatch.setattr(_runner, "_one", fake)
    cfg = BenchConfig(ns=(1000,), systems=("croupier-permutation", "numpy-permutation"))
    results = run(cfg)
    rows = {r["system"]: r for r in results["rows"]}
    steady, noisy = rows["croupier-permutation"], rows["numpy-permutation"]
    assert len(steady["runs"]) == 3 and steady["wide"] == []
    assert len(noisy["runs"]) == 3 + cfg.more_repeats and noisy["wide"] == ["epoch_s"]
    assert noisy["epoch_s"] == 1.0 and noisy["spread"]["epoch_s"] == [1.0, 3.0]  # 1,3,1,3,1
    assert steady["spread"]["peak_mib"] == [11.0, 13.0] and steady["peak_mib"] == 12.0
    assert results["load"]["cores"] == os.cpu_count()
    assert results["load"]["max"] is None or results["load"]["max"] >= 0
    assert "incomplete" not in results


def test_the_table_shows_ranges_and_the_notes_a_busy_machine_disagreeing_runs_and_the_key():
    from croupier.bench._report import notes

    ours = {"label": "x", "family": "buckets", "ours": True, "same_output": False}
    theirs = {**ours, "ours": False, "hand_written": "greedy token batches in numpy"}
    base = {"family": "buckets", "n": 10**7, "status": "ok", "peak_mib": 700.0}
    results = {
        "config": {"ranks": 8, "rank": 3, "repeats": 3, "seeds": [0]},
        "systems": {"croupier-buckets": ours, "python-buckets": theirs},
        "baselines": {"python-buckets": "croupier-buckets"},
        "load": {"max": 3.5, "cores": 2},
        "rows": [
            {
                **base,
                "system": "croupier-buckets",
                "epoch_s": 0.8,
                "rss_base_mib": 530.0,
                "spread": {"epoch_s": [0.7, 2.0]},
                "wide": ["epoch_s"],
            },
            {
                **base,
                "system": "python-buckets",
                "epoch_s": 8.0,
                "rss_base_mib": 40.0,
                "spread": {"epoch_s": [8.0, 8.0]},
                "wide": [],
            },
        ],
    }
    text = table(results)
    assert "| 1e7 | croupier-buckets | - | 800.0 ms [700.0 ms-2.00 s] |" in text
    assert "| 1e7 | python-buckets (hand-written) | - | 8.00 s (10x) |" in text  # no range: equal
    assert "+170 (peak 700)" in text and "+660 (peak 700)" in text  # what each added
    said = notes(results)
    assert "**The machine was busy**: a load average up to 3.5 on 2 cores" in said
    assert "**Runs more than 2x apart**: croupier-buckets at N = 1e7 (whole epoch)" in said
    assert "Key: every time is the median of 3 run(s)" in said
    assert "python-buckets, greedy token batches in numpy" in said
    quiet = {**results, "load": {"max": 1.4, "cores": 2}}
    quiet["rows"] = [{**r, "wide": []} for r in results["rows"]]
    assert "busy" not in notes(quiet) and "2x apart" not in notes(quiet)
