"""HuggingFaceDataset, offline: a small local corpus and a tokenizer trained here; tokens,
windows, EOS, packing, state, workers and bad input."""

from __future__ import annotations

import json
import os
import pickle

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("datasets")
tokenizers = pytest.importorskip("tokenizers")

from croupier import HuggingFaceDataset, StatefulDataLoader  # noqa: E402
from croupier.datasets._sample import IGNORE_INDEX  # noqa: E402

WORDS = [
    "the",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "a",
    "lazy",
    "dog",
    "while",
    "seven",
    "tired",
    "owls",
    "watch",
]


@pytest.fixture(autouse=True)
def _offline(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf-cache"))


@pytest.fixture
def corpus(tmp_path):
    """A local json-lines dataset (with an empty document) and a word-level tokenizer."""
    rng = np.random.default_rng(0)
    docs = [" ".join(rng.choice(WORDS, size=rng.integers(1, 12))) for _ in range(60)]
    docs[7] = ""
    data = tmp_path / "corpus"
    data.mkdir()
    with open(data / "train.jsonl", "w") as f:
        for i, d in enumerate(docs):
            f.write(json.dumps({"text": d, "id": i}) + "\n")
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(docs, trainers.WordLevelTrainer(special_tokens=["<unk>", "</s>"]))
    tok_dir = tmp_path / "tokenizer"
    tok_dir.mkdir()
    tok.save(str(tok_dir / "tokenizer.json"))
    return data, tok_dir, docs, tok


def _stream(docs, tok):
    """The reference token stream: each non-empty document's ids, then EOS."""
    eos = tok.token_to_id("</s>")
    out = []
    for d in docs:
        ids = tok.encode(d, add_special_tokens=False).ids
        if ids:
            out += [*ids, eos]
    return out, eos


@pytest.mark.parametrize("seq_len", [1, 5, 16])
def test_windows_of_the_token_stream(corpus, seq_len):
    data, tok_dir, docs, tok = corpus
    ds = HuggingFaceDataset(str(data), "train", "text", seq_len, str(tok_dir))
    stream, eos = _stream(docs, tok)
    assert ds.eos_token_id == eos
    w = seq_len + 1
    assert len(ds) == len(stream) // w
    for i in range(len(ds)):
        window = stream[i * w : (i + 1) * w]
        sample = ds[i]
        assert set(sample) == {"input_ids", "labels"}
        assert sample["input_ids"].dtype == torch.int64
        assert sample["input_ids"].tolist() == window[:-1]
        assert sample["labels"].tolist() == window[1:]


def test_packing_adds_doc_ids_and_masks_labels(corpus):
    data, tok_dir, docs, tok = corpus
    ds = HuggingFaceDataset(str(data), "train", "text", 12, str(tok_dir), pack_sequences=True)
    stream, eos = _stream(docs, tok)
    for i in range(len(ds)):
        window = stream[i * 13 : (i + 1) * 13]
        s = ds[i]
        doc, expected_docs, expected_labels = 0, [], []
        for j in range(12):
            expected_docs.append(doc)
            expected_labels.append(IGNORE_INDEX if window[j] == eos else window[j + 1])
            doc += window[j] == eos
        assert s["doc_ids"].tolist() == expected_docs
        assert s["labels"].tolist() == expected_labels


def test_eos_from_tokenizer_config_and_a_file_path(corpus):
    data, tok_dir, _, tok = corpus
    (tok_dir / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<unk>"}))
    ds = HuggingFaceDataset(str(data), "train", "text", 8, str(tok_dir))
    assert ds.eos_token_id == tok.token_to_id("<unk>")
    (tok_dir / "tokenizer_config.json").unlink()
    by_file = HuggingFaceDataset(str(data), "train", "text", 8, str(tok_dir / "tokenizer.json"))
    assert by_file.eos_token_id == tok.token_to_id("</s>")


def test_state_keys_and_refusals(corpus):
    data, tok_dir, _, _ = corpus
    ds = HuggingFaceDataset(str(data), "train", "text", 8, str(tok_dir))
    assert ds.state_dict() == {"epoch": 0, "sample_idx": 0, "total_sequences": len(ds)}
    ds.load_state_dict({"epoch": 2, "sample_idx": 5, "total_sequences": len(ds)})
    assert ds.state_dict() == {"epoch": 2, "sample_idx": 5, "total_sequences": len(ds)}
    with pytest.raises(ValueError, match="changed"):
        ds.load_state_dict({"epoch": 1, "total_sequences": len(ds) + 1})
    with pytest.raises(ValueError, match="sample_idx"):
        ds.load_state_dict({"sample_idx": -1})
    assert ds.state_dict()["epoch"] == 2


def test_pickles_and_loads_in_workers(corpus):
    data, tok_dir, _, _ = corpus
    ds = HuggingFaceDataset(str(data), "train", "text", 4, str(tok_dir))
    again = pickle.loads(pickle.dumps(ds))
    assert again[3]["input_ids"].tolist() == ds[3]["input_ids"].tolist()
    loader = StatefulDataLoader(ds, 2, shuffle=False, num_workers=2, drop_last=True)
    got = torch.cat([b["input_ids"] for b in loader])
    assert got.tolist() == [ds[i]["input_ids"].tolist() for i in range(len(ds) // 2 * 2)]


def test_bad_input(corpus, tmp_path):
    data, tok_dir, _, _ = corpus
    ok = dict(dataset_name=str(data), split="train", text_field="text", seq_len=4)
    with pytest.raises(ValueError, match="seq_len"):
        HuggingFaceDataset(**{**ok, "seq_len": 0}, tokenizer_path=str(tok_dir))
    with pytest.raises(TypeError, match="text_field"):
        HuggingFaceDataset(**{**ok, "text_field": 3}, tokenizer_path=str(tok_dir))
    with pytest.raises(ValueError, match="'body' is not a column"):
        HuggingFaceDataset(**{**ok, "text_field": "body"}, tokenizer_path=str(tok_dir))
    with pytest.raises(FileNotFoundError, match=r"tokenizer\.json"):
        HuggingFaceDataset(**ok, tokenizer_path=str(tmp_path / "nowhere"))
    with pytest.raises(ValueError, match="fewer than one sample"):
        HuggingFaceDataset(**{**ok, "seq_len": 10**6}, tokenizer_path=str(tok_dir))
    from tokenizers import Tokenizer, models

    bare = Tokenizer(models.WordLevel({"a": 0, "<unk>": 1}, unk_token="<unk>"))
    bare.save(str(tmp_path / "bare.json"))
    with pytest.raises(ValueError, match="EOS"):
        HuggingFaceDataset(**ok, tokenizer_path=str(tmp_path / "bare.json"))
    assert os.environ["HF_DATASETS_OFFLINE"] == "1"
