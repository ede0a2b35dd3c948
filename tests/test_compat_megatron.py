"""croupier.compat.megatron's index builders against megatron-core's own (its PyPI wheel): the
same arrays, dtypes included, and the RandomState left where megatron-core leaves it, over
sweeps of every argument; bad input refused with croupier's errors."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from croupier.compat.megatron import build_document_index, build_shuffle_index

with warnings.catch_warnings():
    # megatron-core warns at import that Transformer Engine and Apex are absent.
    warnings.simplefilter("ignore")
    gpt_dataset = pytest.importorskip("megatron.core.datasets.gpt_dataset")


def _same_state(a: np.random.RandomState, b: np.random.RandomState) -> bool:
    sa, sb = a.get_state(), b.get_state()
    return bool((sa[1] == sb[1]).all()) and sa[2:] == sb[2:]


@given(
    documents=st.lists(st.integers(0, 2**31 - 1), max_size=300),
    wide=st.booleans(),
    num_epochs=st.integers(1, 5),
    separate_final_epoch=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
def test_the_document_index_is_megatrons(documents, wide, num_epochs, separate_final_epoch, seed):
    docs = np.array(documents, dtype=np.int64 if wide else np.int32)
    ours, theirs = np.random.RandomState(seed), np.random.RandomState(seed)
    want = gpt_dataset._build_document_index(docs, num_epochs, theirs, separate_final_epoch)
    got = build_document_index(docs, num_epochs, ours, separate_final_epoch)
    assert got.dtype == want.dtype and np.array_equal(got, want)
    assert _same_state(ours, theirs)


@given(
    num_samples=st.integers(0, 5000),
    extra=st.integers(0, 3000),
    seed=st.integers(0, 2**32 - 1),
)
def test_the_shuffle_index_is_megatrons(num_samples, extra, seed):
    ours, theirs = np.random.RandomState(seed), np.random.RandomState(seed)
    total = num_samples + extra
    want = gpt_dataset._build_shuffle_index(num_samples, total, theirs)
    got = build_shuffle_index(num_samples, total, ours)
    assert got.dtype == want.dtype and np.array_equal(got, want)
    assert _same_state(ours, theirs)


def test_a_dataset_build_sequence_is_megatrons():
    # GPTDataset's order: the document index (separate final epoch), then the shuffle index,
    # from one RandomState, at a size where the swaps leave the cache.
    docs = np.arange(1_500_000, dtype=np.int32)
    ours, theirs = np.random.RandomState(1234), np.random.RandomState(1234)
    for build in (
        lambda r: gpt_dataset._build_document_index(docs, 3, r, True),
        lambda r: gpt_dataset._build_shuffle_index(2_000_000, 2_600_000, r),
    ):
        want = build(theirs)
        got = (
            build_document_index(docs, 3, ours, True)
            if want.dtype == np.int32
            else build_shuffle_index(2_000_000, 2_600_000, ours)
        )
        assert np.array_equal(got, want)
    assert _same_state(ours, theirs)


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda r: build_document_index(np.arange(3), 0, r, False), ValueError, "num_epochs"),
        (lambda r: build_document_index(np.arange(3), 1.5, r, False), TypeError, "num_epochs"),
        (lambda r: build_document_index(np.ones((2, 2), int), 1, r, False), TypeError, "1-D"),
        (lambda r: build_document_index(np.ones(3), 1, r, False), TypeError, "integers"),
        (lambda r: build_document_index(np.array([-1]), 1, r, False), ValueError, "ids in"),
        (lambda r: build_document_index(np.array([2**31]), 1, r, False), ValueError, "int32"),
        (lambda r: build_document_index(np.arange(3), 1, 7, False), TypeError, "RandomState"),
        (lambda r: build_shuffle_index(5, 4, r), ValueError, "total_size"),
        (lambda r: build_shuffle_index(-1, 4, r), ValueError, "num_samples"),
        (lambda r: build_shuffle_index(True, 4, r), TypeError, "num_samples"),
        (lambda r: build_shuffle_index(2, 4, np.random.default_rng()), TypeError, "legacy"),
    ],
)
def test_bad_input_is_refused_before_any_draw(call, error, match):
    state = np.random.RandomState(3)
    before = state.get_state()
    with pytest.raises(error, match=match):
        call(state)
    after = state.get_state()
    assert after[2] == before[2] and bool((after[1] == before[1]).all())
