"""``croupier bench``: argument parsing, the harness on tiny workloads, and its outputs."""

from __future__ import annotations

import argparse
import importlib.util
import json

import pytest

from croupier import cli
from croupier.bench import BenchConfig, run
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
        (BenchConfig(ns=(10**10 + 1,)), r"n must be in \[0, 1e10\]"),
        (BenchConfig(ranks=0), "ranks must be at least 1"),
        (BenchConfig(ranks=4, rank=4), r"rank must be in \[0, ranks\) = \[0, 4\)"),
        (BenchConfig(repeats=0), "repeats must be at least 1"),
        (BenchConfig(seeds=()), "seeds must be"),
        (BenchConfig(systems=("nope",)), "unknown system 'nope'"),
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
    cfg = BenchConfig(ns=(6000,), ranks=3, rank=2, systems=("croupier-chunks", "random-reads"))
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
    assert "| 6,000 | random-reads |" in text and "MB/s" in text


def test_elastic_family_resumes_on_three_quarters_of_the_ranks():
    pytest.importorskip("torch")
    cfg = BenchConfig(ns=(10_007,), ranks=8, rank=7, systems=("croupier-elastic", "torch-elastic"))
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


def test_repeats_go_round_robin_over_systems():
    lines: list[str] = []
    cfg = BenchConfig(ns=(3000,), repeats=2, systems=("croupier-permutation", "numpy-permutation"))
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
    cfg = BenchConfig(ns=(10**10,), systems=("torch-sampler",))
    results = run(cfg)
    (row,) = results["rows"]
    assert row["status"] == "skipped"
    assert "GiB available" in row["detail"]
    assert "skipped" in table(results)


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
    assert (tmp_path / "bench.md").read_text().count("|") > 10
    png = (tmp_path / "bench.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_refuses_bad_arguments(capsys):
    assert cli.main(["bench", "--ranks", "2", "--rank", "5", "--n", "10"]) == 2
    assert "rank must be in [0, ranks)" in capsys.readouterr().err


def test_help_answers_without_importing_torch():
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from croupier import cli\n"
        "try:\n"
        "    cli.main(['--help'])\n"
        "except SystemExit:\n"
        "    pass\n"
        "print('torch' in sys.modules, 'croupier.samplers' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "bench" in out.stdout
    assert out.stdout.splitlines()[-1] == "False False"
