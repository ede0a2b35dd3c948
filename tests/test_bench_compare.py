"""scripts/bench-compare: ratios per group, best of runs, the margin, and what it refuses."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "bench-compare"
_loader = importlib.machinery.SourceFileLoader("bench_compare", str(SCRIPT))
_spec = importlib.util.spec_from_loader("bench_compare", _loader)
assert _spec is not None
bench_compare = importlib.util.module_from_spec(_spec)
_loader.exec_module(bench_compare)


def run(**groups: tuple[float, dict[str, float]]) -> dict:
    """A pytest-benchmark JSON: group -> (croupier's median, {alternative: median})."""
    benches = []
    for group, (ours, theirs) in groups.items():
        for name, median in {f"test_croupier_{group}": ours, **theirs}.items():
            benches.append(
                {
                    "group": group,
                    "name": name,
                    "fullname": f"benches/test_{group}.py::{name}",
                    "stats": {"median": median},
                }
            )
    return {"benchmarks": benches, "machine_info": {"cpu": {"brand_raw": "cpu", "count": 2}}}


def write(tmp_path: Path, name: str, data: dict) -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


def test_ratio_is_the_fastest_alternative_over_croupier():
    got = bench_compare.ratios(run(a=(2.0, {"test_torch_a": 10.0, "test_numpy_a": 8.0})))
    assert got["a"]["ratio"] == 4.0 and got["a"]["alternative"] == "test_numpy_a"


def test_baseline_is_the_median_and_comparison_the_best_of_runs(tmp_path, capsys):
    runs = [
        write(tmp_path, f"r{i}.json", run(a=(1.0, {"test_torch_a": r})))
        for i, r in enumerate((10.0, 12.0, 20.0))
    ]
    base = tmp_path / "base.json"
    assert (
        bench_compare.main([*map(str, runs), "--margin", "0.3", "--write-baseline", str(base)]) == 0
    )
    recorded = json.loads(base.read_text())
    assert recorded["groups"]["a"]["ratio"] == 12.0 and recorded["margin"] == 0.3
    # 8.5x alone is 29% below 12x: passes; 8.0x alone is 33% below: fails; the best of 8x and
    # 9x passes.
    ok = write(tmp_path, "ok.json", run(a=(1.0, {"test_torch_a": 8.5})))
    slow = write(tmp_path, "slow.json", run(a=(1.0, {"test_torch_a": 8.0})))
    better = write(tmp_path, "better.json", run(a=(1.0, {"test_torch_a": 9.0})))
    assert bench_compare.main([str(ok), "--baseline", str(base)]) == 0
    assert bench_compare.main([str(slow), "--baseline", str(base)]) == 1
    assert "FAIL (more than 30% slower, and below the baseline's runs)" in capsys.readouterr().out
    assert bench_compare.main([str(slow), str(better), "--baseline", str(base)]) == 0


def test_the_failing_groups_benchmarks_are_written_for_a_second_run(tmp_path):
    runs = [
        write(tmp_path, f"r{i}.json", run(a=(1.0, {"test_torch_a": 10.0}), b=(1.0, {"t_b": 5.0})))
        for i in range(2)
    ]
    base = tmp_path / "base.json"
    bench_compare.main([*map(str, runs), "--margin", "0.3", "--write-baseline", str(base)])
    # Group a falls to 2x (fails), b holds: only a's two benchmarks are run again.
    now = write(tmp_path, "now.json", run(a=(1.0, {"test_torch_a": 2.0}), b=(1.0, {"t_b": 5.0})))
    rerun = tmp_path / "rerun.txt"
    assert bench_compare.main([str(now), "--baseline", str(base), "--rerun", str(rerun)]) == 1
    assert rerun.read_text().splitlines() == [
        "benches/test_a.py::test_croupier_a",
        "benches/test_a.py::test_torch_a",
    ]
    # The second run holds only a; judged with the first, each group by its best run.
    again = write(tmp_path, "again.json", run(a=(1.0, {"test_torch_a": 9.0})))
    assert bench_compare.main([str(now), str(again), "--baseline", str(base), "--rerun",
                               str(rerun)]) == 0  # fmt: skip
    assert rerun.read_text() == ""  # nothing to run again


def test_a_ratio_the_baseline_itself_measured_is_not_a_regression(tmp_path):
    # A noisy group: runs of 4x, 10x and 12x, median 10x. 5x is 50% below the median but above
    # the slowest recorded run: it passes; 3.9x is below both and fails.
    runs = [
        write(tmp_path, f"r{i}.json", run(a=(1.0, {"test_torch_a": r})))
        for i, r in enumerate((4.0, 10.0, 12.0))
    ]
    base = tmp_path / "base.json"
    bench_compare.main([*map(str, runs), "--margin", "0.3", "--write-baseline", str(base)])
    noisy = write(tmp_path, "noisy.json", run(a=(1.0, {"test_torch_a": 5.0})))
    slower = write(tmp_path, "slower.json", run(a=(1.0, {"test_torch_a": 3.9})))
    assert bench_compare.main([str(noisy), "--baseline", str(base)]) == 0
    assert bench_compare.main([str(slower), "--baseline", str(base)]) == 1


def test_a_missing_group_fails_and_a_new_one_is_reported(tmp_path, capsys):
    base = tmp_path / "base.json"
    bench_compare.main(
        [
            str(write(tmp_path, "r.json", run(a=(1.0, {"test_torch_a": 5.0})))),
            "--write-baseline",
            str(base),
        ]
    )
    other = write(tmp_path, "o.json", run(b=(1.0, {"test_torch_b": 5.0})))
    assert bench_compare.main([str(other), "--baseline", str(base)]) == 1
    out = capsys.readouterr().out
    assert "missing" in out and "new" in out


def test_a_group_without_exactly_one_croupier_test_is_refused(tmp_path):
    data = run(a=(1.0, {}))
    with pytest.raises(SystemExit, match="must hold one test_croupier_"):
        bench_compare.ratios(data)


def test_the_committed_baseline_covers_every_bench_group():
    baseline = json.loads((SCRIPT.parent.parent / "benches" / "baseline-small.json").read_text())
    assert 0 < baseline["margin"] < 0.5, "a twice-slower core must fail"
    assert len(baseline["groups"]) == 25
    for name, group in baseline["groups"].items():
        assert group["croupier"].startswith("test_croupier")
        # Every group shows croupier faster, except the loader's cost per step, where croupier
        # does more (a checkpoint state every step) and must stay within 10% (1.02x recorded,
        # 0.92-0.94x in the VM state where single-threaded work ran twice as fast: 0.95x the
        # median of both; docs/performance.md), and the mixture's global order timed against
        # croupier's own per-rank order: it buys world-size invariance and whole passes, and at
        # this size (1e6, one leaf) costs about 3x (docs/performance.md);
        # and the bucket sampler's global order resuming against its per-rank order (seven
        # resumes across the epoch; each reads one bucket's batches: about 1x).
        least = {
            "loader epoch, a state every step": 0.9,
            "mixture global order vs per-rank order: rank epoch, W=8": 0.2,
            "bucket batches global order vs per-rank order: resume at mid-epoch, W=8": 0.5,
        }.get(name, 1)
        assert group["ratio"] > least


def _bench_groups() -> dict[str, list[tuple[str, bool]]]:
    """The groups named in ``benches/`` marks: group -> [(test, whether it needs an optional
    package)]. A test needs one when it takes a fixture that calls ``pytest.importorskip``
    (groups named at run time, ``benchmark.group = ...``, are left out)."""
    import ast

    groups: dict[str, list[tuple[str, bool]]] = {}
    for path in sorted((SCRIPT.parent.parent / "benches").glob("test_*.py")):
        tree = ast.parse(path.read_text())
        functions = [n for n in tree.body if isinstance(n, ast.FunctionDef)]
        optional = {
            f.name
            for f in functions
            if any(
                isinstance(c, ast.Call) and getattr(c.func, "attr", "") == "importorskip"
                for c in ast.walk(f)
            )
        }
        for f in functions:
            for mark in f.decorator_list:
                if not (
                    isinstance(mark, ast.Call) and getattr(mark.func, "attr", "") == "benchmark"
                ):
                    continue
                for kw in mark.keywords:
                    if kw.arg == "group" and isinstance(kw.value, ast.Constant):
                        needs = any(a.arg in optional for a in f.args.args)
                        groups.setdefault(kw.value.value, []).append((f.name, needs))
    return groups


def test_optional_baselines_skip_whole_groups():
    """Every group holds one test_croupier_* and an alternative, and a test of an optional
    baseline (lhotse's) shares its group only with tests that skip with it: without the
    package the group is absent, never croupier alone (which bench-compare refuses), and the
    committed baseline's groups are the same with it or without."""
    groups = _bench_groups()
    baseline = json.loads((SCRIPT.parent.parent / "benches" / "baseline-small.json").read_text())
    optional = {group for group, tests in groups.items() if any(needs for _, needs in tests)}
    assert optional == {
        "bucket batches vs lhotse, rank epoch of N/100, W=8",
        "bucket batches vs lhotse, resume at mid-epoch of N/100, W=8",
    }
    assert not optional & set(baseline["groups"])
    for group, tests in groups.items():
        names = [name for name, _ in tests]
        assert sum(name.startswith("test_croupier") for name in names) == 1, (group, names)
        assert len(names) >= 2, (group, names)
        assert len({needs for _, needs in tests}) == 1, (group, tests)


def test_a_reference_build_measured_in_the_same_session_replaces_the_recorded_ratios(
    tmp_path, capsys
):
    """With ``--reference``, a group fails only against the reference build's runs of this
    session, on croupier's own time: a machine state that halves every alternative's time
    (5x recorded, 2.5x now on both sides) passes, and a croupier half as fast as the
    reference fails, with the failing group's benchmarks written for a second run on each
    side."""
    base = tmp_path / "base.json"
    recorded = write(
        tmp_path, "rec.json", run(a=(1.0, {"test_torch_a": 5.0}), b=(1.0, {"t_b": 5.0}))
    )
    bench_compare.main([str(recorded), "--margin", "0.3", "--write-baseline", str(base)])
    assert json.loads(base.read_text())["commit"]  # what CI builds as the reference
    ref = write(tmp_path, "ref.json", run(a=(1.0, {"test_torch_a": 2.5}), b=(1.0, {"t_b": 2.5})))
    same = write(tmp_path, "same.json", run(a=(1.0, {"test_torch_a": 2.4}), b=(1.0, {"t_b": 2.6})))
    assert bench_compare.main([str(same), "--baseline", str(base)]) == 1  # recorded: fails
    assert bench_compare.main([str(same), "--baseline", str(base), "--reference", str(ref)]) == 0
    assert "the reference build" in capsys.readouterr().out
    # Against the reference, croupier's own time decides: an alternative that ran twice as
    # fast in this commit's run (torch.randperm moves so within one CI run) is not croupier
    # slowing down.
    quick_alternative = write(
        tmp_path, "alt.json", run(a=(1.0, {"test_torch_a": 1.2}), b=(1.0, {"t_b": 2.5}))
    )
    args = ["--baseline", str(base), "--reference", str(ref)]
    assert bench_compare.main([str(quick_alternative), *args]) == 0
    slower = write(
        tmp_path, "slow.json", run(a=(2.0, {"test_torch_a": 2.5}), b=(1.0, {"t_b": 2.5}))
    )
    rerun, rerun_ref = tmp_path / "rerun.txt", tmp_path / "rerun-ref.txt"
    assert (
        bench_compare.main(
            [str(slower), *args, "--rerun", str(rerun), "--rerun-reference", str(rerun_ref)]
        )
        == 1
    )
    assert "FAIL" in capsys.readouterr().out
    expected = ["benches/test_a.py::test_croupier_a", "benches/test_a.py::test_torch_a"]
    assert rerun.read_text().splitlines() == expected
    assert rerun_ref.read_text().splitlines() == expected
    # A ratio the reference itself measured in this session is noise, not a regression (as
    # for the recorded runs); two slow runs of this commit are still slow.
    ref_slow = write(tmp_path, "ref2.json", run(a=(2.0, {"test_torch_a": 2.5})))
    assert bench_compare.main([str(slower), *args, "--reference", str(ref_slow)]) == 0
    assert bench_compare.main([str(slower), str(slower), *args]) == 1


def test_rerun_reference_needs_a_reference(tmp_path):
    now = write(tmp_path, "now.json", run(a=(1.0, {"test_torch_a": 5.0})))
    with pytest.raises(SystemExit):
        bench_compare.main([str(now), "--rerun-reference", str(tmp_path / "x.txt")])


def test_against_the_reference_the_better_of_median_and_fastest_round_counts(tmp_path):
    """A process that waits on the scheduler slows croupier's typical round but not its
    fastest (two builds of the same code: medians 66 and 101 us, fastest rounds 49 and 54 us
    in one CI run); a slower croupier slows both."""

    def timed(median: float, fastest: float) -> dict:
        data = run(a=(median, {"test_torch_a": 1.0}))
        for b in data["benchmarks"]:
            if b["name"].startswith("test_croupier"):
                b["stats"]["min"] = fastest
        return data

    base = tmp_path / "base.json"
    bench_compare.main(
        [str(write(tmp_path, "r.json", timed(66, 49))), "--write-baseline", str(base)]
    )
    ref = write(tmp_path, "ref.json", timed(66, 49))
    args = ["--baseline", str(base), "--reference", str(ref)]
    waits = write(tmp_path, "waits.json", timed(101, 54))
    slower = write(tmp_path, "slower.json", timed(101, 75))
    assert bench_compare.main([str(waits), *args]) == 0
    assert bench_compare.main([str(slower), *args]) == 1
