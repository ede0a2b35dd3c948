"""MixtureSampler.indices(): the memory check's estimate holds the measured peak (issue 42).

Each shape runs in a fresh child process, which measures its peak resident set (``VmHWM``,
reset through ``/proc/self/clear_refs``) around one ``indices()`` call and compares it with
the estimate the memory check uses (``Mixture.range_bytes``). The peak must stay within the
estimate, and the estimate must not grow with the positions beyond the output (the scratch
is a bounded window, not per position). A call whose estimate is over
``CROUPIER_MEMORY_LIMIT`` is refused with ``MemoryError`` before any work.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.skipif(
    not os.path.exists("/proc/self/clear_refs"), reason="needs Linux's /proc/self/clear_refs"
)

CHILD = textwrap.dedent(
    """
    import gc, json, sys
    sys.modules["torch"] = None  # numpy only: torch's import is slow and beside the point
    import numpy as np
    import croupier

    def hwm():
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM"):
                    return int(line.split()[1]) * 1024
        raise RuntimeError("no VmHWM")

    for shape in json.loads(sys.argv[1]):
        sizes = [3] * shape["tiny"] + list(shape["sizes"])
        cum = np.concatenate([[0], np.cumsum(sizes)]).tolist()
        if shape["skew"]:
            weights = (np.random.default_rng(0).pareto(1.0, len(sizes)) + 1e-3).tolist()
        else:
            weights = [1.0] * len(sizes)
        s = croupier.MixtureSampler(
            cum, weights, shape["w"], shape["w"] - 1, num_samples=shape["positions"],
            order=shape["order"], interleave=shape["interleave"],
        )
        estimate = s._current().range_bytes(0, None)
        gc.collect()
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # the peak starts again from the current resident set
        before = hwm()
        try:
            out = s.indices()
        except MemoryError as e:
            print(json.dumps({"refused": str(e), "estimate": estimate, "grew": hwm() - before}))
            continue
        print(json.dumps({"peak": hwm() - before, "estimate": estimate, "out": out.nbytes}))
        del out, s
    """
)


def _measure(
    shapes: list[dict[str, object]], limit: int | None = None
) -> list[dict[str, int | str]]:
    """Each shape's peak and estimate, measured one after another in a fresh child."""
    env = {k: v for k, v in os.environ.items() if k != "CROUPIER_MEMORY_LIMIT"}
    if limit is not None:
        env["CROUPIER_MEMORY_LIMIT"] = str(limit)
    out = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(shapes)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return [json.loads(line) for line in out.stdout.strip().splitlines()]


def _shape(tiny, sizes, order="global", interleave="uniform", w=1, positions=None, skew=False):
    return {
        "tiny": tiny,
        "sizes": sizes,
        "order": order,
        "interleave": interleave,
        "w": w,
        "positions": positions,
        "skew": skew,
    }


SHAPES = [
    # Many tiny datasets (3 samples: oversampled, a pass every few positions) and a large one.
    _shape(5_000, [1_000_000], positions=300_000),
    _shape(5_000, [1_000_000], order="per_rank", positions=300_000),
    _shape(200, [20_000], interleave="balanced", positions=30_000),
    # One huge dataset among small ones.
    _shape(0, [1_000_000, 10, 1000]),
    _shape(0, [1_000_000, 10, 1000], order="per_rank"),
    # Many datasets, weights skewed.
    _shape(1_000, [50_000] * 5, positions=200_000, skew=True),
    _shape(1_000, [50_000] * 5, order="per_rank", positions=200_000, skew=True),
    # Huge W: each rank's few positions spread over every leaf.
    _shape(1_000, [2_000_000], w=1000),
    _shape(0, [1_000_000, 5_000], order="per_rank", w=100),
]

SLOW_SHAPES = [
    _shape(50_000, [10_000_000], positions=5_000_000),
    _shape(50_000, [10_000_000], positions=20_000_000),
    _shape(50_000, [10_000_000], order="per_rank", positions=5_000_000),
    _shape(20_000, [1_000_000], interleave="balanced", positions=1_000_000),
    _shape(0, [50_000_000]),
    _shape(0, [50_000_000], order="per_rank"),
]


def _check(shapes: list[dict[str, object]]) -> None:
    for shape, got in zip(shapes, _measure(shapes), strict=True):
        assert "peak" in got, (shape, got)
        peak, estimate, out = int(got["peak"]), int(got["estimate"]), int(got["out"])
        assert peak <= estimate, f"{shape}: peak {peak} over the estimate {estimate} (out {out})"


def test_the_peak_stays_within_the_estimate():
    _check(SHAPES)


@pytest.mark.slow
def test_the_peak_stays_within_the_estimate_at_scale():
    _check(SLOW_SHAPES)


def test_the_scratch_does_not_grow_with_the_positions():
    # 5,000 datasets of 3 and a large one: the estimate beyond the output is the same at 1e6
    # and 1e9 positions (a bounded window, not scratch per position).
    code = textwrap.dedent(
        """
        import sys
        sys.modules["torch"] = None  # numpy only: torch's import is slow and beside the point
        import numpy as np, croupier
        cum = np.concatenate([[0], np.cumsum([3] * 5_000 + [10**7])]).tolist()
        for order in ("global", "per_rank"):
            for n in (10**6, 10**9):
                s = croupier.MixtureSampler(cum, [1.0] * 5_001, 1, 0, num_samples=n, order=order)
                print(order, n, s._current().range_bytes(0, None))
        """
    )
    lines = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.split()
    est = {(lines[i], int(lines[i + 1])): int(lines[i + 2]) for i in range(0, len(lines), 3)}
    for order in ("global", "per_rank"):
        small, large = est[(order, 10**6)], est[(order, 10**9)]
        out = (10**9 - 10**6) * 4  # uint32 indices
        # The output grows, and a factor of it for the per-rank order's stream buffers; nothing
        # else.
        factor = 1 if order == "global" else 2
        assert large - small <= factor * out * 1.0001 + (1 << 26), (order, small, large)


def test_a_call_over_the_limit_is_refused_before_any_work():
    shape = _shape(5_000, [10_000_000], positions=10**9)
    (got,) = _measure([shape], limit=100_000_000)
    assert "refused" in got, got
    message = str(got["refused"])
    assert "mixture indices" in message and "CROUPIER_MEMORY_LIMIT" in message
    # Before any work: nothing near the output was touched.
    assert int(got["grew"]) < 50_000_000
