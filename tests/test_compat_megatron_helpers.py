"""croupier.compat.megatron's blends and sample index against megatron-core's compiled helpers
(its PyPI wheel): the same arrays over sweeps of every argument, bad input refused before
anything is written, and patch() making a whole BlendedMegatronDatasetBuilder build produce
byte-identical cache files and the same samples."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import croupier.compat.megatron as cm

with warnings.catch_warnings():
    # megatron-core warns at import that Transformer Engine and Apex are absent.
    warnings.simplefilter("ignore")
    helpers = pytest.importorskip("megatron.core.datasets.helpers")
    gpt_dataset = pytest.importorskip("megatron.core.datasets.gpt_dataset")
    from megatron.core.datasets.utils import normalize


def _blend(fn, weights, size):
    index, sample = np.zeros(size, np.int16), np.zeros(size, np.int64)
    fn(index, sample, weights, len(weights), size, False)
    return index, sample


def _same_blend(weights, size):
    want = _blend(helpers.build_blending_indices, weights, size)
    got = _blend(cm.build_blending_indices, weights, size)
    assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])


@given(
    raw=st.lists(
        st.one_of(st.just(0.0), st.just(1.0), st.floats(1e-6, 1e3)), min_size=1, max_size=40
    ).filter(lambda w: sum(w) > 0),
    size=st.integers(0, 3000),
)
def test_the_blend_is_megatrons(raw, size):
    _same_blend(normalize(raw), size)


@pytest.mark.parametrize(
    "raw",
    [
        [1.0] * 100,
        [1.0 / d for d in range(1, 101)],
        list(np.random.default_rng(5).random(100)),
        list(np.random.default_rng(6).random(7) ** 6),
        [2.0, 1.0, 1.0],
        [1e-9, 1.0, 1e-6, 3.0],
    ],
    ids=["equal-100", "zipf-100", "random-100", "skewed-7", "dyadic", "tiny"],
)
def test_long_blends_are_megatrons(raw):
    # Long enough for the candidates' floor to move and every block path to run.
    _same_blend(normalize(raw), 300_000)


@given(sizes=st.lists(st.integers(1, 300), min_size=1, max_size=30))
def test_the_exhaustive_blend_is_megatrons(sizes):
    total = sum(sizes)
    want = (np.zeros(total, np.int16), np.zeros(total, np.int64))
    got = (np.zeros(total, np.int16), np.zeros(total, np.int64))
    helpers.build_exhaustive_blending_indices(*want, np.array(sizes, np.int64), len(sizes))
    cm.build_exhaustive_blending_indices(*got, sizes, len(sizes))
    assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])
    assert np.array_equal(np.bincount(got[0], minlength=len(sizes)), sizes)


@pytest.mark.parametrize(
    ("weights", "size"), [([0.75, 0.25], 8), ([0.5, 0.3, 0.2], 10), ([0.6, 0.4], 7)]
)
def test_the_blend_prints_megatrons_lines(capfd, weights, size):
    # megatron-core's C++ writes to file descriptor 1 (std::cout): capfd reads both.
    w = np.array(weights)
    helpers.build_blending_indices(
        np.zeros(size, np.int16), np.zeros(size, np.int64), w, len(w), size, True
    )
    theirs = capfd.readouterr().out.splitlines()
    cm.build_blending_indices(
        np.zeros(size, np.int16), np.zeros(size, np.int64), w, len(w), size, True
    )
    ours = capfd.readouterr().out.splitlines()
    assert ours == theirs
    assert ours[0] == "> building indices for blended datasets ..."


@given(
    sizes=st.lists(st.integers(0, 60), min_size=1, max_size=40).filter(lambda s: sum(s) > 8),
    epochs=st.integers(1, 3),
    seq=st.integers(2, 64),
    drop=st.booleans(),
    extra=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
def test_the_sample_index_is_megatrons(sizes, epochs, seq, drop, extra, seed):
    lengths = np.array(sizes, np.int32)
    rng = np.random.default_rng(seed)
    docs = np.concatenate([rng.permutation(len(sizes)) for _ in range(epochs)]).astype(np.int32)
    tokens = int(lengths.sum())
    try:
        want = helpers.build_sample_idx(lengths, docs, seq, epochs, tokens, drop, extra)
    except AssertionError:
        # megatron-core's own check of its int32 index (the stream ends in an empty document).
        with pytest.raises(ValueError, match="leaves"):
            cm.build_sample_idx(lengths, docs, seq, epochs, tokens, drop, extra)
        return
    got = cm.build_sample_idx(lengths, docs, seq, epochs, tokens, drop, extra)
    assert got.dtype == want.dtype and np.array_equal(got, want)


@pytest.mark.parametrize("last", [0, 1, 2])
@pytest.mark.parametrize("extra", [True, False])
def test_a_stream_shorter_than_its_epochs_says_is_refused_where_megatron_asserts(last, extra):
    # tokens_per_epoch 10 over documents of 3 + last tokens: the rows past the documents' end
    # repeat the last document at its length less the extra token, -1 for an empty one with
    # the extra token, which megatron-core's int32 check refuses.
    lengths, docs = np.array([3, last], np.int32), np.array([0, 1], np.int32)
    try:
        want = helpers.build_sample_idx(lengths, docs, 2, 1, 10, True, extra)
    except AssertionError:
        assert last == 0 and extra
        with pytest.raises(ValueError, match=r"leaves \[0, 3\].*empty document"):
            cm.build_sample_idx(lengths, docs, 2, 1, 10, True, extra)
        return
    got = cm.build_sample_idx(lengths, docs, 2, 1, 10, True, extra)
    assert not (last == 0 and extra)
    assert got.dtype == want.dtype and np.array_equal(got, want)
    assert got[-1].tolist() == [1, last - int(extra)]  # the rows past the end


def test_a_large_sample_index_is_megatrons():
    # Millions of documents: the parallel pieces meet where one walk would go on.
    rng = np.random.default_rng(3)
    lengths = rng.integers(1, 3000, size=1_000_000).astype(np.int32)
    docs = np.concatenate([rng.permutation(len(lengths)) for _ in range(2)]).astype(np.int32)
    tokens = int(lengths.sum())
    want = helpers.build_sample_idx(lengths, docs, 4096, 2, tokens, True, True)
    got = cm.build_sample_idx(lengths, docs, 4096, 2, tokens, True, True)
    assert got.dtype == want.dtype == np.int32 and np.array_equal(got, want)


def _arrays(size=4):
    return np.zeros(size, np.int16), np.zeros(size, np.int64)


@pytest.mark.parametrize(
    "call, error, match",
    [
        (
            lambda: cm.build_blending_indices(*_arrays(), [0.5, 0.4], 2, 4, False),
            ValueError,
            "sum to 1",
        ),
        (
            lambda: cm.build_blending_indices(*_arrays(), [1.5, -0.5], 2, 4, False),
            ValueError,
            "at least 0",
        ),
        (
            lambda: cm.build_blending_indices(*_arrays(), [1.0], 40_000, 4, False),
            ValueError,
            "int16",
        ),
        (
            lambda: cm.build_blending_indices(*_arrays(), [1.0], 2, 4, False),
            ValueError,
            "num_datasets",
        ),
        (
            lambda: cm.build_blending_indices(*_arrays(), [1.0], 1, 9, False),
            ValueError,
            "at least 9",
        ),
        (
            lambda: cm.build_blending_indices(
                np.zeros(4, np.int32), np.zeros(4, np.int64), [1.0], 1, 4, False
            ),
            TypeError,
            "int16",
        ),
        (lambda: cm.build_blending_indices(*_arrays(), [1.0], 1, -1, False), ValueError, "size"),
        (
            lambda: cm.build_exhaustive_blending_indices(*_arrays(), [2, 0, 2], 3),
            ValueError,
            "at least 1",
        ),
        (
            lambda: cm.build_exhaustive_blending_indices(*_arrays(), [3, 3], 2),
            ValueError,
            "at least 6",
        ),
        (
            lambda: cm.build_sample_idx(np.array([3], np.int32), np.array([], np.int32), 2, 1, 3),
            ValueError,
            "empty",
        ),
        (
            lambda: cm.build_sample_idx(np.array([3], np.int32), np.array([0], np.int32), 2, 0, 3),
            ValueError,
            "num_epochs",
        ),
        (
            lambda: cm.build_sample_idx(np.array([3], np.int32), np.array([1], np.int32), 2, 1, 3),
            ValueError,
            r"^document_indices must be ids in \[0, 1\), got document_indices\[0\] = 1",
        ),
        (
            lambda: cm.build_sample_idx(
                np.array([3, -1], np.int32), np.array([0, 1], np.int32), 2, 1, 3
            ),
            ValueError,
            "sizes",
        ),
        (
            lambda: cm.build_sample_idx(
                np.array([3], np.int32), np.array([0, -1], np.int32), 2, 1, 3
            ),
            ValueError,
            r"^document_indices must be ids in \[0, 1\), got document_indices\[1\] = -1",
        ),
        (
            lambda: cm.build_blending_indices(*_arrays(), ["0.5", "x"], 2, 4, False),
            TypeError,
            "weights must be a 1-D array of numbers",
        ),
        (
            lambda: cm.build_exhaustive_blending_indices(*_arrays(), [[1], [1, 2]], 2),
            TypeError,
            "sizes must be a 1-D array of integers",
        ),
        (
            lambda: cm.build_sample_idx([[3], [3, 4]], np.array([0], np.int32), 2, 1, 3),
            TypeError,
            "sizes must be a 1-D array of integers",
        ),
        (
            lambda: cm.build_sample_idx(np.array([3.0]), np.array([0], np.int32), 2, 1, 3),
            TypeError,
            "sizes",
        ),
    ],
)
def test_bad_input_is_refused_before_anything_is_written(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_a_refused_blend_writes_nothing():
    index, sample = np.full(4, 7, np.int16), np.full(4, 7, np.int64)
    with pytest.raises(ValueError):
        cm.build_blending_indices(index, sample, [0.5, 0.4], 2, 4, False)
    assert (index == 7).all() and (sample == 7).all()


def test_patch_swaps_the_helpers_and_gives_them_back():
    originals = (helpers.build_blending_indices, gpt_dataset._build_shuffle_index)
    with cm.patch():
        assert helpers.build_blending_indices is cm.build_blending_indices
        assert helpers.build_sample_idx is cm.build_sample_idx
        assert gpt_dataset._build_document_index is cm.build_document_index
        with cm.patch():
            assert cm._patched()
        assert cm._patched(), "an inner patch must not undo the outer one"
    assert (helpers.build_blending_indices, gpt_dataset._build_shuffle_index) == originals
    handle = cm.patch()
    handle.undo()
    handle.undo()
    assert not cm._patched()


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def builds(tmp_path_factory) -> dict[str, dict]:
    """The same BlendedMegatronDatasetBuilder build by megatron-core, under patch() (a cache
    directory of its own) and under patch(index_free=True) (in megatron-core's cache
    directory, after it), each in a fresh process."""
    work = tmp_path_factory.mktemp("megatron")
    script = Path(__file__).with_name("megatron_build.py")
    results = {}
    for mode, cache in (
        ("megatron", "megatron"),
        ("croupier", "croupier"),
        ("index-free", "megatron"),
    ):
        run = subprocess.run(
            [sys.executable, str(script), str(work), str(_port()), mode, str(work / cache)],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert run.returncode == 0, run.stderr[-3000:]
        results[mode] = json.loads(run.stdout.strip().splitlines()[-1])
    return results


def test_a_blended_build_under_patch_is_byte_identical(builds):
    ours, theirs = builds["croupier"], builds["megatron"]
    assert ours["patched"] and not theirs["patched"]
    # Three GPTDatasets and the BlendedDataset, per split: every cached index file.
    assert len(theirs["files"]) >= 40
    assert ours["files"] == theirs["files"]
    assert ours["samples"] == theirs["samples"]


def test_an_index_free_build_writes_no_blend_or_shuffle_and_takes_the_same_samples(builds):
    ours, theirs = builds["index-free"], builds["megatron"]
    assert ours["patched"]
    # In megatron-core's cache directory: its files untouched, ours beside them, no blend or
    # shuffle index among them, the document and sample indices byte-identical to its own.
    added = {n: h for n, h in ours["files"].items() if n not in theirs["files"]}
    assert {n: ours["files"][n] for n in theirs["files"]} == theirs["files"]
    assert added and all("-index_free-" in n for n in added)
    assert not any("BlendedDataset" in n or "shuffle_index" in n for n in added)
    suffixes = ("description.txt", "document_index.npy", "sample_index.npy", "shuffle_ranges.json")
    for suffix in suffixes:
        mine = sorted(n for n in added if n.endswith(suffix))
        assert len(mine) == 9, suffix  # three GPTDatasets per split
        if suffix.endswith(".npy"):
            for n in mine:
                assert added[n] == theirs["files"][n.replace("-index_free", "")]
    for split, blend in ours["blends"].items():
        size = theirs["samples"][split][0]
        assert ours["samples"][split][0] == size == len(blend["positions"])
        assert blend["same"], "a blended sample must be its dataset's sample"
        total = sum(blend["weights"])
        taken: dict[int, list[int]] = {}
        for d, s in blend["positions"]:
            taken.setdefault(d, []).append(s)
        for d, w in enumerate(blend["weights"]):
            samples = sorted(taken.get(d, []))
            # Largest remainder: within one sample of the weight; each of 0 .. c_d - 1 once.
            assert abs(len(samples) - w / total * size) < 1
            assert samples == list(range(len(samples)))
            assert len(samples) <= blend["sizes"][d]
        for shuffle, samples in blend["shuffles"]:
            assert sorted(shuffle) == list(range(samples))
