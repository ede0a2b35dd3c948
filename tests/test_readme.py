"""Every Python example in README.md runs as pasted, each in a fresh interpreter."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"


def _examples() -> list[tuple[str, str]]:
    """``(id, code)`` of each fenced ``python`` block, named after the heading above it."""
    examples = []
    heading = "top"
    counts: dict[str, int] = {}
    in_block, lines = False, []
    for line in README.read_text(encoding="utf-8").splitlines():
        if in_block:
            if line.startswith("```"):
                in_block = False
                name = re.sub(r"[^a-z0-9]+", "-", heading.lower()).strip("-")
                counts[name] = counts.get(name, 0) + 1
                examples.append((f"{name}-{counts[name]}", "\n".join(lines) + "\n"))
            else:
                lines.append(line)
        elif line.startswith("```python"):
            in_block, lines = True, []
        elif line.startswith("#"):
            heading = line.lstrip("#").strip()
    return examples


EXAMPLES = _examples()


def test_the_readme_has_an_example_per_sampler():
    code = "\n".join(code for _, code in EXAMPLES)
    for name in ("DistributedSampler(", "croupier.permutation(", "state_dict()", 'order="torch"'):
        assert name in code, f"no README example uses {name}"


@pytest.mark.parametrize("code", [code for _, code in EXAMPLES], ids=[i for i, _ in EXAMPLES])
def test_readme_example_runs(code, tmp_path):
    if re.search(r"^\s*(import|from) torch\b", code, re.M) and not importlib.util.find_spec(
        "torch"
    ):
        pytest.skip("the example needs torch")
    script = tmp_path / "example.py"
    script.write_text(code, encoding="utf-8")
    out = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
