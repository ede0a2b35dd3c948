"""Benchmark sizes: ``--bench-size small`` (the default: the whole suite in a few minutes on
2 cores, what .ci/run compares against its baseline) or ``large`` (for local work)."""

from __future__ import annotations

import pytest

SIZES = {
    # n: one rank's epoch (8 ranks); wide_n: the large world sizes; perm: full permutations
    "small": {"n": 1_000_000, "wide_n": 2_000_000, "perm": 2_000_000},
    "large": {"n": 10_000_000, "wide_n": 100_000_000, "perm": 100_000_000},
}


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--bench-size",
        choices=sorted(SIZES),
        default="small",
        help="benchmark sizes: small (default, a few minutes) or large (local work)",
    )


@pytest.fixture(scope="session")
def size(request: pytest.FixtureRequest) -> dict[str, int]:
    """The sizes of this run (see ``SIZES``)."""
    return SIZES[request.config.getoption("--bench-size")]
