"""MemoryMappedDataset: kempnerforge's cutting into samples, file ends, packing, state,
workers and every bad input."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from croupier import MemoryMappedDataset, StatefulDataLoader  # noqa: E402
from croupier.datasets.memmap import IGNORE_INDEX  # noqa: E402


def _write(tmp_path, arrays, names=None):
    for i, arr in enumerate(arrays):
        name = names[i] if names else f"shard-{i:03d}.npy"
        np.save(tmp_path / name, arr)
    return tmp_path


def _expected_samples(arrays, seq_len):
    """The reference cutting: each file's whole seq_len chunks, in sorted file order."""
    out = []
    for arr in arrays:
        for k in range(len(arr) // seq_len):
            out.append(arr[k * seq_len : (k + 1) * seq_len].astype(np.int64))
    return out


@pytest.mark.parametrize("dtype", [np.uint16, np.uint32])
def test_samples_are_each_files_whole_chunks_in_sorted_order(tmp_path, dtype):
    rng = np.random.default_rng(0)
    arrays = [rng.integers(0, 60000, size=n).astype(dtype) for n in (100, 16, 15, 0, 47, 33)]
    _write(tmp_path, arrays)
    ds = MemoryMappedDataset(tmp_path, seq_len=16)
    expected = _expected_samples(arrays, 16)
    assert len(ds) == len(expected) == 6 + 1 + 0 + 0 + 2 + 2
    for i, tokens in enumerate(expected):
        sample = ds[i]
        assert set(sample) == {"input_ids", "labels"}
        assert sample["input_ids"].dtype == torch.int64 and sample["labels"].dtype == torch.int64
        assert sample["input_ids"].tolist() == tokens[:-1].tolist()
        assert sample["labels"].tolist() == tokens[1:].tolist()


def test_file_order_is_sorted_by_name_and_pattern_filters(tmp_path):
    _write(
        tmp_path,
        [np.full(4, 2, np.uint16), np.full(4, 1, np.uint16), np.full(4, 9, np.uint16)],
        names=["b.npy", "a.npy", "c.other.npy"],
    )
    (tmp_path / "notes.txt").write_text("not tokens")
    ds = MemoryMappedDataset(tmp_path, seq_len=4, file_pattern="[ab].npy")
    assert [p.name for p in ds.files] == ["a.npy", "b.npy"]
    assert ds[0]["input_ids"].tolist() == [1, 1, 1] and ds[1]["labels"].tolist() == [2, 2, 2]


def test_many_tiny_files(tmp_path):
    arrays = [np.arange(i, i + 5, dtype=np.uint32) for i in range(300)]
    _write(tmp_path, arrays)
    ds = MemoryMappedDataset(tmp_path, seq_len=2)
    expected = _expected_samples(arrays, 2)
    assert len(ds) == 600
    assert all(ds[i]["input_ids"].tolist() == e[:-1].tolist() for i, e in enumerate(expected))


def test_index_bounds_and_types(tmp_path):
    _write(tmp_path, [np.arange(32, dtype=np.uint16)])
    ds = MemoryMappedDataset(tmp_path, seq_len=8)
    assert ds[np.int64(3)]["labels"].tolist() == list(range(25, 32))
    for bad in (-1, 4, 10**20):
        with pytest.raises(IndexError, match=r"out of range \[0, 4\)"):
            ds[bad]
    with pytest.raises(TypeError, match="idx"):
        ds[1.0]


def test_packing_marks_documents_and_masks_labels_across_them(tmp_path):
    eos = 0
    tokens = np.array([10, 20, 0, 30, 40, 0, 0, 50, 60, 70], dtype=np.uint16)
    _write(tmp_path, [tokens])
    ds = MemoryMappedDataset(tmp_path, seq_len=5, pack_sequences=True, eos_token_id=eos)
    first, second = ds[0], ds[1]
    assert first["input_ids"].tolist() == [10, 20, 0, 30]
    assert first["doc_ids"].tolist() == [0, 0, 0, 1]
    assert first["labels"].tolist() == [20, 0, IGNORE_INDEX, 40]
    assert second["input_ids"].tolist() == [0, 0, 50, 60]
    assert second["doc_ids"].tolist() == [0, 1, 2, 2]
    assert second["labels"].tolist() == [IGNORE_INDEX, IGNORE_INDEX, 60, 70]
    # Reference rule, position by position: a label is kept iff its input is not EOS.
    for sample in (first, second):
        for j, tok in enumerate(sample["input_ids"].tolist()):
            assert (sample["labels"][j] == IGNORE_INDEX) == (tok == eos)


def test_without_packing_eos_changes_nothing(tmp_path):
    _write(tmp_path, [np.array([1, 0, 2, 3], np.uint16)])
    plain = MemoryMappedDataset(tmp_path, seq_len=4)[0]
    with_eos = MemoryMappedDataset(tmp_path, seq_len=4, eos_token_id=0)[0]
    assert set(with_eos) == {"input_ids", "labels"}
    assert all(plain[k].tolist() == with_eos[k].tolist() for k in plain)


def test_state_dict_has_kempnerforge_keys_and_refuses_other_data(tmp_path):
    _write(tmp_path, [np.arange(40, dtype=np.uint16)])
    ds = MemoryMappedDataset(tmp_path, seq_len=8)
    assert ds.state_dict() == {"epoch": 0, "total_samples": 5}
    ds.load_state_dict({"epoch": 3, "total_samples": 5})
    assert ds.state_dict() == {"epoch": 3, "total_samples": 5}
    ds.load_state_dict({"epoch": 4})
    assert ds.state_dict()["epoch"] == 4
    with pytest.raises(ValueError, match="data changed"):
        ds.load_state_dict({"epoch": 1, "total_samples": 6})
    with pytest.raises(ValueError, match="epoch"):
        ds.load_state_dict({"epoch": -1})
    with pytest.raises(TypeError, match="state"):
        ds.load_state_dict([("epoch", 1)])
    assert ds.state_dict()["epoch"] == 4


def test_close_pickle_and_reopen(tmp_path):
    _write(tmp_path, [np.arange(64, dtype=np.uint32)])
    ds = MemoryMappedDataset(tmp_path, seq_len=8)
    before = ds[3]["input_ids"].tolist()
    blob = pickle.dumps(ds)
    assert len(blob) < 2000, "the pickle carries the file list, not the tokens"
    ds.close()
    ds.close()
    assert ds[3]["input_ids"].tolist() == before  # mapped again on use
    again = pickle.loads(blob)
    assert again[3]["input_ids"].tolist() == before and len(again) == 8
    with MemoryMappedDataset(tmp_path, seq_len=8) as scoped:
        assert len(scoped) == 8


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_works_in_dataloader_workers(tmp_path, context):
    arrays = [np.arange(i * 100, i * 100 + 90, dtype=np.uint32) for i in range(3)]
    _write(tmp_path, arrays)
    ds = MemoryMappedDataset(tmp_path, seq_len=10)
    loader = StatefulDataLoader(
        ds, 4, shuffle=False, num_workers=2, multiprocessing_context=context
    )
    got = torch.cat([b["input_ids"] for b in loader]).tolist()
    expected = [e[:-1].tolist() for e in _expected_samples(arrays, 10)]
    assert got == expected


def test_bad_input_is_refused(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a directory"):
        MemoryMappedDataset(tmp_path / "missing", seq_len=8)
    with pytest.raises(FileNotFoundError, match="no files matching"):
        MemoryMappedDataset(tmp_path, seq_len=8)
    np.save(tmp_path / "a.npy", np.arange(10, dtype=np.uint16))
    for seq_len in (0, 1, -3):
        with pytest.raises(ValueError, match="seq_len"):
            MemoryMappedDataset(tmp_path, seq_len=seq_len)
    with pytest.raises(TypeError, match="seq_len"):
        MemoryMappedDataset(tmp_path, seq_len=8.0)
    with pytest.raises(TypeError, match="data_dir"):
        MemoryMappedDataset(3, seq_len=8)
    with pytest.raises(ValueError, match="eos_token_id is required"):
        MemoryMappedDataset(tmp_path, seq_len=8, pack_sequences=True)
    with pytest.raises(TypeError, match="pack_sequences"):
        MemoryMappedDataset(tmp_path, seq_len=8, pack_sequences="yes")
    with pytest.raises(ValueError, match="eos_token_id"):
        MemoryMappedDataset(tmp_path, seq_len=8, eos_token_id=-1)
    for name, arr, words in [
        ("b.npy", np.arange(10, dtype=np.int64), "uint16 or uint32"),
        ("b.npy", np.arange(10, dtype=np.float32), "uint16 or uint32"),
        ("b.npy", np.zeros((2, 5), np.uint16), "1-D"),
    ]:
        np.save(tmp_path / name, arr)
        with pytest.raises(ValueError, match=words):
            MemoryMappedDataset(tmp_path, seq_len=8)
    (tmp_path / "b.npy").write_bytes(b"\x00raw tokens, not .npy")
    with pytest.raises(ValueError, match=r"\.npy"):
        MemoryMappedDataset(tmp_path, seq_len=8)
