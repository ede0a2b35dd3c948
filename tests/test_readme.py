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
INSTALL_COMMAND = (
    "# No GPU? First the CPU-only torch (the default one brings 5 GB of CUDA libraries):\n"
    "#   python -m pip install torch --index-url https://download.pytorch.org/whl/cpu\n"
    'python -m pip install ".[test]"'
)
TEST_COMMAND = "cargo test --workspace && python -m pytest -n auto"
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
    if "megatron.patch(" in code:  # patch() and patch(index_free=True) import megatron-core
        import warnings

        with warnings.catch_warnings():
            # megatron-core warns at import that Transformer Engine and Apex are absent: a
            # user sees it once; here the first test to import megatron-core would fail on it.
            warnings.simplefilter("ignore")
            pytest.importorskip("megatron.core.datasets.gpt_dataset")
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


@pytest.mark.parametrize(
    ("marker", "command"), [("install-command", INSTALL_COMMAND), ("test-command", TEST_COMMAND)]
)
def test_the_install_and_test_commands_are_intact(marker, command):
    # .ci/run runs the first ```sh block after each marker verbatim (its awk, in Python): the
    # install builds croupier once with everything the main job and the tests need.
    lines = README.read_text(encoding="utf-8").splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith(f"<!-- {marker}"))
    start = next(i for i in range(at + 1, len(lines)) if lines[i].startswith("```sh"))
    end = next(i for i in range(start + 1, len(lines)) if lines[i].startswith("```"))
    assert "\n".join(lines[start + 1 : end]) == command


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


# -- the docs name only what exists ---------------------------------------------------------------

_PATH = re.compile(
    r"^\.?[\w./-]*[\w-]\.(rs|py|pyi|md|toml|json|yml|yaml|txt|cfg)$|^(\.ci|scripts)/[\w.-]+$"
)
_NAME = re.compile(r"^croupier(\.[A-Za-z_]\w*)+")
# Files the docs name that are not in the repository: what croupier writes when it runs (the
# bench's results, the world-size record of the trainers' callbacks) and a user's own file.
_NOT_IN_REPO = {"croupier-bench/bench.json", "croupier_world.json", "tokenizer.json"}


def _tracked_files() -> list[str]:
    """The repository's files, as paths relative to its root (build output left out)."""
    skip = {".git", "target", ".venv", "node_modules", ".hypothesis", "__pycache__", "dist"}
    out = []
    for path in ROOT.rglob("*"):
        rel = path.relative_to(ROOT)
        if path.is_file() and not skip.intersection(rel.parts):
            out.append(rel.as_posix())
    return out


def _label(doc: Path) -> str:
    return doc.relative_to(ROOT).as_posix() if doc.is_relative_to(ROOT) else doc.name


def _cited(doc: Path) -> list[tuple[int, str]]:
    """``(line, span)`` of every inline code span of ``doc`` outside fenced blocks."""
    spans, fenced = [], False
    for number, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            spans += [(number, s) for s in re.findall(r"`([^`\n]+)`", line)]
    return spans


def _missing_paths(docs: list[Path], files: list[str]) -> list[str]:
    """The cited file paths that name no file: a path from the repository's root or the
    document's folder, or the tail of one (``deal/rank.rs``, ``lib.rs``)."""
    missing = []
    for doc in docs:
        for number, span in _cited(doc):
            if not _PATH.match(span) or "*" in span or span in _NOT_IN_REPO:
                continue
            rel = span.lstrip("./") if span.startswith("./") else span
            if (ROOT / rel).exists() or (doc.parent / rel).exists():
                continue
            if any(f == rel or f.endswith("/" + rel) for f in files):
                continue
            missing.append(f"{_label(doc)}:{number}: {span}")
    return missing


def _resolves(dotted: str) -> bool:
    """Whether ``croupier.a.b.c`` names a module or an attribute of one."""
    import importlib
    import importlib.util

    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        module = ".".join(parts[:cut])
        try:
            obj = importlib.import_module(module)
        except ModuleNotFoundError as e:
            if e.name and not e.name.startswith("croupier") and importlib.util.find_spec(module):
                # An integration whose framework is not installed here (lightning in a venv
                # with torch alone): the module exists; its names are checked where it is.
                return True
            continue
        except ImportError:
            continue
        try:
            for attr in parts[cut:]:
                obj = getattr(obj, attr)
        except AttributeError:
            return False
        except ModuleNotFoundError as e:  # a name made on first use from a framework not here
            return bool(e.name) and not e.name.startswith("croupier")
        return True
    return False


def _missing_names(docs: list[Path]) -> list[str]:
    missing = []
    for doc in docs:
        for number, span in _cited(doc):
            m = _NAME.match(span)
            if m and not _resolves(m.group(0)):
                missing.append(f"{_label(doc)}:{number}: {m.group(0)}")
    return missing


def test_every_path_and_croupier_name_the_docs_cite_exists():
    """A doc that names a file that moved, or a ``croupier.`` name that was renamed, fails
    here instead of misleading a reader (the README, the guides under docs/, the CHANGELOG's
    unreleased section aside: it records history)."""
    pytest.importorskip("torch")  # croupier.loader and the compat modules import it
    files = _tracked_files()
    assert not _missing_paths(DOCUMENTS, files)
    assert not _missing_names(DOCUMENTS)


def test_the_drift_check_fails_on_a_stale_path_and_name(tmp_path):
    stale = tmp_path / "stale.md"
    stale.write_text(
        "See `rust/croupier-core/src/deal/seekable.rs` and `croupier.samplers.prp.Deal`;\n"
        "`docs/design.md`, `deal/rank.rs` and `croupier.DistributedSampler.set_epoch` exist.\n",
        encoding="utf-8",
    )
    files = _tracked_files()
    assert _missing_paths([stale], files) == ["stale.md:1: rust/croupier-core/src/deal/seekable.rs"]
    assert _missing_names([stale]) == ["stale.md:1: croupier.samplers.prp.Deal"]
