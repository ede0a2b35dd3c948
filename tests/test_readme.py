"""Every ``python`` example in README.md and the guides under docs/ runs as pasted, and the
README's test command is intact.

Each fenced ``python`` block is one test, named after the heading above it. A block right after
a ``<!-- fragment -->`` line is a piece of a larger program (a method of a Lightning module, the
lines of an Accelerate script): it is compiled, not run; ``tests/test_trainers.py`` runs the
real thing. A block runs with
``exec`` in a fresh namespace, in a temporary working directory, so it can use only what it
creates itself; tracebacks point at the README's own line numbers. In-process rather than one
interpreter per block: torch is imported once, which keeps the module to a few seconds.
"""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
# The documents whose examples run: the README and every page under docs/.
DOCUMENTS = [README, *sorted((ROOT / "docs").glob("*.md"))]
TEST_COMMAND = 'python -m pip install ".[test]" && cargo test --workspace && python -m pytest'
# Blocks that import torch, or use croupier's classes built on it (the loader and datasets).
_NEEDS_TORCH = re.compile(
    r"^\s*(import|from)\s+torch\b|\b(StatefulDataLoader|MemoryMappedDataset|HuggingFaceDataset)\b",
    re.M,
)


def _examples(text: str) -> list[tuple[str, int, str]]:
    """``(id, first line number, code)`` of each fenced ``python`` block in ``text`` (the id
    of a fragment ends in ``-fragment``)."""
    examples = []
    heading = "top"
    counts: dict[str, int] = {}
    start, lines, fragment, previous = 0, None, False, ""
    for number, line in enumerate(text.splitlines(), start=1):
        if lines is not None:
            if line.startswith("```"):
                name = re.sub(r"[^a-z0-9]+", "-", heading.lower()).strip("-")
                counts[name] = counts.get(name, 0) + 1
                suffix = "-fragment" if fragment else ""
                examples.append((f"{name}-{counts[name]}{suffix}", start, "\n".join(lines) + "\n"))
                lines = None
            else:
                lines.append(line)
        elif line.startswith("```python"):
            start, lines, fragment = number + 1, [], previous == "<!-- fragment -->"
        elif line.startswith("#"):
            heading = line.lstrip("#").strip()
        if line.strip():
            previous = line.strip()
    assert lines is None, f"the python block opened on line {start - 1} is not closed"
    return examples


EXAMPLES = _examples(README.read_text(encoding="utf-8"))
ALL_EXAMPLES = [
    (doc, f"{doc.stem}-{name}", first, code)
    for doc in DOCUMENTS
    for name, first, code in _examples(doc.read_text(encoding="utf-8"))
]


def _run(
    code: str, first_line: int, path: Path, monkeypatch: pytest.MonkeyPatch, doc: Path = README
) -> None:
    """Runs ``code`` as a script in ``path``; its exception, if any, propagates."""
    if _NEEDS_TORCH.search(code):
        pytest.importorskip("torch")
    monkeypatch.chdir(path)
    # Leading newlines make the line numbers of a traceback those of the document.
    compiled = compile("\n" * (first_line - 1) + code, str(doc), "exec")
    # A module of its own as __main__, as a script has: classes it defines pickle.
    main = types.ModuleType("__main__")
    monkeypatch.setitem(sys.modules, "__main__", main)
    exec(compiled, main.__dict__)


@pytest.mark.parametrize(
    ("doc", "first_line", "code"),
    [(d, s, c) for d, _, s, c in ALL_EXAMPLES],
    ids=[i for _, i, _, _ in ALL_EXAMPLES],
)
def test_documented_example_runs(doc, first_line, code, tmp_path, monkeypatch, request):
    if request.node.callspec.id.endswith("-fragment"):
        compile("\n" * (first_line - 1) + code, str(doc), "exec")
        return
    _run(code, first_line, tmp_path, monkeypatch, doc)


def test_a_broken_example_fails(tmp_path, monkeypatch):
    text = "# Example\n\n```python\nimport croupier\n\ncroupier.permutation(-1)\n```\n"
    [(name, first_line, code)] = _examples(text)
    assert name == "example-1"
    with pytest.raises(ValueError, match="n must be"):
        _run(code, first_line, tmp_path, monkeypatch)


def test_the_readme_has_an_example_per_sampler():
    code = "\n".join(code for _, _, code in EXAMPLES)
    for name in (
        "DistributedSampler(",
        "DataLoader(",
        "croupier.permutation(",
        "out=",
        ".indices()",
        "state_dict()",
        "load_state_dict(",
        'order="torch"',
    ):
        assert name in code, f"no README example uses {name}"


def test_the_test_command_is_intact():
    # .ci/run runs the first ```sh block after the marker verbatim (this is its awk, in Python).
    lines = README.read_text(encoding="utf-8").splitlines()
    marker = next(i for i, line in enumerate(lines) if "<!-- test-command" in line)
    start = next(i for i in range(marker + 1, len(lines)) if lines[i].startswith("```sh"))
    end = next(i for i in range(start + 1, len(lines)) if lines[i].startswith("```"))
    assert "\n".join(lines[start + 1 : end]) == TEST_COMMAND


def test_the_readme_is_short_and_its_links_lead_somewhere():
    """The README is read in five minutes (under 300 lines); the details live under docs/, and
    every link of the README and the docs into this repository (relative, or to its files on
    GitHub, as the README's must be to work on PyPI) names a file that exists."""
    assert len(README.read_text(encoding="utf-8").splitlines()) < 300
    repo = re.compile(r"https://github\.com/croupier-rs/croupier/(?:blob|tree)/main/(.*)")
    for doc in DOCUMENTS:
        for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", doc.read_text(encoding="utf-8")):
            ours = repo.fullmatch(target)
            if ours:
                path = ROOT / ours.group(1)
            elif "://" in target:
                continue
            else:
                path = doc.parent / target
            assert path.exists(), f"{doc.name} links to missing {target}"
