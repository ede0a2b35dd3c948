"""The ``croupier`` command line as a newcomer meets it: every mistake is one line and a hint,
before anything is printed or run; ``demo`` and ``bench`` take sizes and ranks alike; a bench run
writes its files only when it succeeds, all together, each naming the run; the default run's
plan and its estimate; the progress display."""

from __future__ import annotations

import importlib.util
import io
import json
import os
from pathlib import Path

import pytest

import croupier
from croupier import cli
from croupier.bench import BenchConfig
from croupier.bench._progress import progress_for
from croupier.bench._runner import DEFAULT_NS, plan
from croupier.bench._systems import EXTRA_FAMILIES, FAMILIES, SYSTEMS, choose

needs_matplotlib = pytest.mark.skipif(
    importlib.util.find_spec("matplotlib") is None, reason="draws the plot with matplotlib"
)


def _refused(capsys, argv: list[str], match: str) -> None:
    """``argv`` exits with status 2, prints nothing on stdout and exactly one error line
    naming ``match`` plus the hint on stderr."""
    assert cli.main(argv) == 2
    out, err = capsys.readouterr()
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 2, err
    prog = f"croupier {argv[0]}" if argv and argv[0] in ("bench", "demo") else "croupier"
    assert lines[0].startswith(f"{prog}: error: "), err
    assert match in lines[0], err
    assert lines[1] == f"(see '{prog} --help')"


@pytest.mark.parametrize(
    ("argv", "match"),
    [
        (["bench", "--n", "0"], "--n must be in [1e3, 1e10], got 0"),
        (["bench", "--n", "-5"], "--n must be in [1e3, 1e10], got -5"),
        (["bench", "--n", "1e11"], "--n must be in [1e3, 1e10]"),
        (["bench", "--n", "1e400"], "argument --n: not an integer: '1e400'"),
        (["bench", "--n", "abc"], "argument --n: not an integer: 'abc'"),
        (["bench", "--n"], "argument --n: expected at least one argument"),
        (["bench", "--n", "1e30"], "--n must be in [1e3, 1e10], got 1e+30"),
        (["bench", "--n", "10"], "got 10 (below 1e3 there is nothing to time)"),
        (["bench", "--timeout", "0"], "argument --timeout: must be in (0, 1e6] seconds"),
        (["bench", "--timeout", "-1"], "argument --timeout: must be in (0, 1e6] seconds"),
        (["bench", "--timeout", "nan"], "argument --timeout: must be in (0, 1e6] seconds"),
        (["bench", "--timeout", "inf"], "argument --timeout: must be in (0, 1e6] seconds"),
        (["bench", "--timeout", "1e10"], "argument --timeout: must be in (0, 1e6] seconds"),
        (["bench", "--all", "--systems", "croupier"], "--all runs every system: not with"),
        (["bench", "--n", "1e10", "--systems", "torch-sampler"], "nothing to run: torch-sampler"),
        (["bench", "--num-replicas", "4", "--rank", "4"], "[0, 4), got 4"),
        (["bench", "--timeout", "soon"], "argument --timeout: not a number of seconds"),
        (["bench", "--systems", "nope"], "unknown system 'nope'"),
        (["bench", "--families", "nope"], "argument --families: invalid choice: 'nope'"),
        (["bench", "--systems", "croupier", "--families", "reads"], "not both"),
        (["bench", "--repeats", "0"], "--repeats must be in [1, 1000], got 0"),
        (["bench", "--seeds", "-1"], "--seeds must be in [0, 2**64)"),
        (["bench", "--ranks", "0"], "--ranks must be in [1, 2**63-1], got 0"),
        (["bench", "--rank", "8"], "--rank must be in [0, --ranks) = [0, 8), got 8"),
        (["bench", "--bad"], "unrecognized arguments: --bad"),
        (["demo", "--count", "-1"], "--count must be in [1, 10,000], got -1"),
        (["demo", "--count", "0"], "--count must be in [1, 10,000], got 0"),
        (["demo", "--rank", "8"], "--rank must be in [0, --ranks) = [0, 8), got 8"),
        (["demo", "--num-replicas", "4", "--rank", "4"], "[0, 4), got 4"),
        (["demo", "--ranks", "0"], "--ranks must be in [1, 2**63-1], got 0"),
        (["demo", "--n", "-1"], "--n must be in [1, 1e10], got -1"),
        (["demo", "--n", "1.5"], "argument --n: not an integer: '1.5'"),
        (["demo", "--seed", "-1"], "--seed must be in [0, 2**64-1], got -1"),
        (["demo", "--epoch", "2**64"], "--epoch must be in [0, 2**64-1]"),
        (["demo", "--bad"], "unrecognized arguments: --bad"),
        (["nope"], "argument command: invalid choice: 'nope'"),
    ],
)
def test_every_mistake_is_one_line_and_a_hint(capsys, tmp_path, argv, match):
    out = tmp_path / "out"
    if argv[0] == "bench":
        argv = [*argv, "--out", str(out)]
    _refused(capsys, argv, match)
    assert not out.exists()  # refused before any work


def test_bad_output_folders_are_refused(capsys, tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("x")
    _refused(capsys, ["bench", "--out", str(afile)], "exists and is not a folder")
    _refused(capsys, ["bench", "--out", str(afile / "sub")], "cannot create the folder")
    _refused(capsys, ["bench", "--out", ""], "--out must name a folder")
    (tmp_path / "res" / "bench.md").mkdir(parents=True)
    _refused(capsys, ["bench", "--out", str(tmp_path / "res")], "bench.md is in the way")
    if os.geteuid() != 0:  # root writes anywhere
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        _refused(capsys, ["bench", "--out", str(locked)], "the folder is not writable")


def test_an_output_folder_that_cannot_be_made_or_written_is_refused_before_any_work(
    capsys, tmp_path, monkeypatch
):
    """Permissions do not tell (root passes them): the folder is made and written to first,
    and left as it was; no measurement runs."""
    import croupier.bench._runner as runner

    def one(*args, **kwargs):
        raise AssertionError("a measurement ran")

    monkeypatch.setattr(runner, "_one", one)
    bench = ["bench", "--n", "1e5", "--systems", "croupier"]
    _refused(capsys, [*bench, "--out", "/proc/nope"], "--out /proc/nope: cannot create the folder")
    _refused(capsys, [*bench, "--out", "/proc/nope/deeper"], "cannot create the folder")
    _refused(capsys, [*bench, "--out", "/proc"], "--out /proc: cannot write in the folder")
    # A folder that can be made is made and removed again by the check, parents included.
    monkeypatch.setattr(cli, "_bench", lambda args, argv: cli._out_dir(args.out, "bench") and 0)
    assert cli.main([*bench, "--out", str(tmp_path / "a" / "b")]) == 0
    assert list(tmp_path.iterdir()) == []


def test_demo_takes_sizes_and_ranks_as_bench_does(capsys):
    assert cli.main(["demo", "--n", "1e5", "--ranks", "4", "--rank", "3", "--count", "3"]) == 0
    out = capsys.readouterr().out
    assert "N=100,000, rank 3 of 4" in out and "this rank's epoch: 25,000 indices" in out
    assert "first 3 indices: [" in out
    # The indices are the sampler's, which the demo names.
    got = out.split("first 3 indices: ")[1].split("\n")[0]
    sampler = croupier.DistributedSampler(10**5, num_replicas=4, rank=3, seed=0)
    assert got == str(list(sampler)[:3])
    assert "croupier.DistributedSampler(100000, num_replicas=4, rank=3, seed=0)" in out
    # --num-replicas, torch's name, is the same option.
    assert cli.main(["demo", "--n", "2**10", "--num-replicas", "4", "--count", "2"]) == 0
    assert "N=1,024, rank 0 of 4" in capsys.readouterr().out


def test_the_default_run_is_the_headline_systems_three_times_with_one_cpu_estimate():
    """The default: croupier and the main alternative of each family at three decades of N,
    3 runs each, estimated by the per-system cost model; that one estimate is what --help,
    the plan line and the README say. --all is every system."""
    from croupier.bench._runner import default_cpu_estimate

    headline = choose()
    assert {s.family for s in headline} == set(FAMILIES) - set(EXTRA_FAMILIES)
    for family in set(FAMILIES) - set(EXTRA_FAMILIES):
        mine = [s for s in headline if s.family == family]
        assert any(s.ours for s in mine) and any(not s.ours for s in mine), family
    assert DEFAULT_NS == (10**5, 10**6, 10**7) and BenchConfig().repeats == 3
    # Every headline system's estimate, installed here or not (plan() leaves out the ones
    # that are not: without torch, a third of them).
    cpu = 3 * sum(s.cpu_estimate(n) for s in headline for n in DEFAULT_NS)
    assert default_cpu_estimate() == pytest.approx(cpu)
    assert 300 < cpu < 720, cpu
    planned = plan(BenchConfig())
    assert [(p.system.name, p.n) for p in planned] == [
        (s.name, n) for n in DEFAULT_NS for s in headline
    ]
    assert all(p.cpu_s == 3 * p.system.cpu_estimate(p.n) for p in planned if p.skip is None)
    words = f"estimated at {cli._minutes(cpu)} of CPU"
    assert words in cli._parser()[1]["bench"].description
    assert words in (Path(__file__).parent.parent / "README.md").read_text()
    assert choose(everything=True) == list(SYSTEMS)
    assert [s.name for s in choose(families=("buckets",))] == [
        "croupier-buckets",
        "croupier-buckets-per-rank-order",
        "python-buckets",
        "lhotse-buckets",
        "numpy-argsort",
    ]
    assert [s.name for s in choose(systems=("torch-sampler", "croupier", "croupier"))] == [
        "torch-sampler",
        "croupier",
    ]


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_is_a_bar_with_the_time_left_on_a_terminal_and_lines_elsewhere():
    log = io.StringIO()
    lines = progress_for(10.0, log)
    lines.say("[1/2] croupier N=1,000 seed=0 run 1/1 ...")
    lines.advance(5.0)
    lines.close()
    assert log.getvalue() == "[1/2] croupier N=1,000 seed=0 run 1/1 ...\n"
    pytest.importorskip("tqdm")
    term = _Terminal()
    bar = progress_for(10.0, term)
    bar.say("[1/2] croupier N=1,000 seed=0 run 1/1 ...")
    bar.say("[1/2] croupier N=1,000: ok in 0.1 s")
    bar.advance(5.0)
    bar.close()
    shown = term.getvalue()
    assert "left" in shown and "50%" in shown
    assert "[1/2] croupier N=1,000: ok in 0.1 s" in shown


def _small(out, *extra: str) -> list[str]:
    return [
        "bench", "--n", "2000", "--ranks", "2", "--rank", "1",
        "--systems", "croupier-permutation", "numpy-permutation", "--repeats", "1",
        "--out", str(out), *extra,
    ]  # fmt: skip


@needs_matplotlib
def test_results_name_their_run_and_are_replaced_whole_or_not_at_all(capsys, tmp_path):
    out = tmp_path / "res"
    assert cli.main(_small(out)) == 0
    capsys.readouterr()
    names = ("bench.json", "bench.md", "bench.png")
    before = {name: (out / name).read_bytes() for name in names}
    data = json.loads(before["bench.json"])
    command = data["run"]["command"]
    assert command.startswith("croupier bench --n 2000") and command.endswith(str(out))
    assert command in before["bench.md"].decode()
    # A run in which nothing succeeds (every run times out) writes nothing, and creates no
    # folder.
    assert cli.main(_small(out, "--timeout", "1e-3")) == 1
    err = capsys.readouterr().err
    assert "no run succeeded (timeout: over 0.001 s" in err and "nothing written" in err
    assert {name: (out / name).read_bytes() for name in names} == before
    assert cli.main(_small(tmp_path / "new", "--timeout", "1e-3")) == 1
    assert not (tmp_path / "new").exists()
    # A run whose report fails half-way (the plot) replaces none of the earlier files.
    import croupier.bench._report as report

    def broken(results, path):
        path.write_bytes(b"half a plot")
        raise RuntimeError("the plot broke")

    original = report.plot
    report.plot = broken
    try:
        with pytest.raises(RuntimeError, match="the plot broke"):
            cli.main(_small(out))
    finally:
        report.plot = original
    assert {name: (out / name).read_bytes() for name in names} == before
    assert sorted(p.name for p in out.iterdir()) == sorted(names)  # no temporary files left


def test_a_run_with_a_failed_measurement_is_written_and_exits_1(capsys, tmp_path, monkeypatch):
    """The results name the failure in the table; the exit status says a run failed."""
    import croupier.bench._runner as runner

    real = runner._one

    def one(system, n, cfg, seed, extra=None):
        if system.name == "numpy-permutation":
            return {"status": "timeout", "detail": "over 1 s"}
        return real(system, n, cfg, seed, extra)

    monkeypatch.setattr(runner, "_one", one)
    out = tmp_path / "res"
    assert cli.main(_small(out)) == 1
    std = capsys.readouterr()
    assert "1 measurement failed or timed out in some run: numpy-permutation" in std.err
    assert "| 2,000 | numpy-permutation | timeout: over 1 s |" in std.out
    assert "numpy-permutation | timeout" in (out / "bench.md").read_text()


def _children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.append(int(entry))
    return found


def _running(pid: int) -> bool:
    """Whether ``pid`` is a live process (a killed child not yet reaped is a zombie, dead)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="finds the child through /proc")
@pytest.mark.parametrize("signame", ["SIGTERM", "SIGHUP", "SIGINT"])
def test_a_stopped_run_kills_its_measurement_and_writes_nothing(tmp_path, signame):
    """SIGTERM and SIGHUP are handled as Ctrl-C: the running measurement's process is killed
    (not left to run out its timeout), nothing is written, exit status 130."""
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "res"
    code = (
        "import signal, sys\n"
        "signal.signal(signal.SIGINT, signal.default_int_handler)\n"  # as in a terminal
        "from croupier import cli\n"
        "sys.exit(cli.main(sys.argv[1:]))\n"
    )
    argv = [
        "bench",
        "--n",
        "1e7",
        "--systems",
        "python-buckets",
        "--repeats",
        "1",
        "--out",
        str(out),
    ]
    proc = subprocess.Popen([sys.executable, "-c", code, *argv], stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    children: list[int] = []
    while not children and time.monotonic() < deadline:
        time.sleep(0.1)
        children = _children(proc.pid)
    assert children, "the measurement never started"
    time.sleep(1.0)
    proc.send_signal(getattr(signal, signame))
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "interrupted; nothing written" in err and "Traceback" not in err
    time.sleep(0.5)
    assert not any(_running(c) for c in children)
    assert not out.exists()


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="finds the child through /proc")
def test_ctrl_c_writes_the_runs_that_finished_marked_incomplete(tmp_path):
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "res"
    code = (
        "import signal, sys\n"
        "signal.signal(signal.SIGINT, signal.default_int_handler)\n"  # as in a terminal
        "from croupier import cli\n"
        "sys.exit(cli.main(sys.argv[1:]))\n"
    )
    argv = ["bench", "--n", "1e3", "1e7", "--systems", "python-buckets", "--repeats", "1"]
    proc = subprocess.Popen(
        [sys.executable, "-c", code, *argv, "--out", str(out)], stderr=subprocess.PIPE, text=True
    )

    def at_1e7(pid: int) -> bool:
        try:
            with open(f"/proc/{pid}/cmdline") as f:
                return '"n": 10000000' in f.read()
        except OSError:
            return False

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not any(at_1e7(c) for c in _children(proc.pid)):
        time.sleep(0.05)
    assert any(at_1e7(c) for c in _children(proc.pid)), "the run at 1e7 never started"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "the runs that finished are in" in err and "bench-incomplete.*" in err
    assert not (out / "bench.json").exists()  # a complete run's files are never replaced so
    results = json.loads((out / "bench-incomplete.json").read_text())
    assert results["incomplete"] is True
    assert [(r["system"], r["n"], r["status"]) for r in results["rows"]] == [
        ("python-buckets", 1000, "ok")
    ]
    assert "**Incomplete**" in (out / "bench-incomplete.md").read_text()
