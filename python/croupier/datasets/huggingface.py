"""``HuggingFaceDataset``: a Hugging Face text dataset, tokenized on load and packed into
fixed-length sequences separated by EOS (the ``hf`` extra: ``datasets`` and ``tokenizers``).

kempnerforge's semantics (seed file 001):

- the split is loaded with ``datasets.load_dataset(dataset_name, dataset_config, split=split)``
  (a hub name, or a local directory or builder with local files: no network is needed for
  those, set ``HF_DATASETS_OFFLINE=1`` to be sure);
- every document's ``text_field`` is tokenized without special tokens and followed by the EOS
  token; documents that tokenize to nothing are skipped; the documents are concatenated in
  order and cut into non-overlapping windows of ``seq_len + 1`` tokens (the tokens after the
  last whole window are not used);
- sample ``i`` is ``{"input_ids": window[:-1], "labels": window[1:]}``, ``int64`` tensors of
  ``seq_len`` tokens, and with ``pack_sequences=True`` also ``doc_ids``, labels across a
  document boundary set to ``-100`` (see :mod:`croupier.datasets.memmap`).

Unlike kempnerforge, the tokenizer is read with the ``tokenizers`` library (a
``tokenizer.json`` file, or a directory holding one, as ``save_pretrained`` writes), documents
are tokenized in batches (``encode_batch``, parallel in Rust), the token stream is held as one
``uint32`` array (4 bytes per token), and the EOS token must be identifiable: from the
directory's ``tokenizer_config.json`` (``eos_token``) or a special token of the tokenizer named
like one (``</s>``, ``<|endoftext|>``, ``<eos>``, ``<|end_of_text|>``); kempnerforge falls back
to id 0 silently, here a tokenizer without one is refused.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from croupier._validate import as_int, check_bool, check_int
from croupier.datasets._sample import lm_sample

__all__ = ["HuggingFaceDataset"]

_EOS_NAMES = ("</s>", "<|endoftext|>", "<eos>", "<|end_of_text|>", "<|eos|>")
_BATCH = 1000  # documents per encode_batch call


def _need(module: str) -> Any:
    try:
        return __import__(module)
    except ImportError:
        raise ImportError(
            f"HuggingFaceDataset needs the {module!r} package: pip install 'croupier[hf]'"
        ) from None


def _tokenizer(tokenizer_path: str) -> tuple[Any, int]:
    """The tokenizer at ``tokenizer_path`` and its EOS token id."""
    tokenizers = _need("tokenizers")
    path = Path(tokenizer_path)
    file = path / "tokenizer.json" if path.is_dir() else path
    if not file.is_file():
        raise FileNotFoundError(
            f"tokenizer_path {tokenizer_path!r}: expected a tokenizer.json file or a directory "
            "holding one (as save_pretrained writes)"
        )
    tok = tokenizers.Tokenizer.from_file(str(file))
    eos: str | None = None
    config = file.parent / "tokenizer_config.json"
    if config.is_file():
        value = json.loads(config.read_text()).get("eos_token")
        eos = value.get("content") if isinstance(value, dict) else value
    if eos is None:
        special = {t.content for t in tok.get_added_tokens_decoder().values() if t.special}
        eos = next((name for name in _EOS_NAMES if name in special), None)
    eos_id = None if eos is None else tok.token_to_id(eos)
    if eos_id is None:
        raise ValueError(
            f"cannot tell the EOS token of the tokenizer at {tokenizer_path!r}: give its "
            f"directory a tokenizer_config.json with eos_token, or add one of {_EOS_NAMES} as "
            "a special token"
        )
    return tok, int(eos_id)


class HuggingFaceDataset(Dataset):  # type: ignore[type-arg]
    """A Hugging Face text dataset as a map-style dataset of packed token windows.

    Args:
        dataset_name: what ``datasets.load_dataset`` takes first: a hub name, a local
            directory of data files, or a builder name such as ``"json"`` (with
            ``dataset_config``).
        split: the split to load (``"train"``, ``"validation"``, ...).
        text_field: the column holding each document's text.
        seq_len: tokens per sample (``>= 1``).
        tokenizer_path: a ``tokenizer.json`` file or a directory holding one.
        dataset_config: the dataset's configuration name, if it has several.
        pack_sequences: add ``doc_ids`` and mask labels across document boundaries.

    Raises ``TypeError``/``ValueError`` for arguments of the wrong type or range, a missing
    text column, a tokenizer without an EOS token, or text too short for one sample;
    ``FileNotFoundError`` for a missing tokenizer; ``ImportError`` naming the ``hf`` extra
    when ``datasets`` or ``tokenizers`` is not installed.
    """

    def __init__(
        self,
        dataset_name: str,
        split: str,
        text_field: str,
        seq_len: int,
        tokenizer_path: str,
        dataset_config: str | None = None,
        pack_sequences: bool = False,
    ) -> None:
        for name, value in (
            ("dataset_name", dataset_name),
            ("split", split),
            ("text_field", text_field),
        ):
            if not isinstance(value, str) or not value:
                raise TypeError(f"{name} must be a non-empty str, got {value!r}")
        if not isinstance(tokenizer_path, (str, os.PathLike)):
            raise TypeError(f"tokenizer_path must be a path, got {type(tokenizer_path).__name__}")
        if dataset_config is not None and not isinstance(dataset_config, str):
            raise TypeError(f"dataset_config must be a str or None, got {dataset_config!r}")
        self.seq_len = check_int("seq_len", seq_len, 1)
        self.pack_sequences = check_bool("pack_sequences", pack_sequences)
        self.dataset_name, self.split, self.text_field = dataset_name, split, text_field
        self.dataset_config = dataset_config
        tok, self.eos_token_id = _tokenizer(os.fspath(tokenizer_path))
        datasets = _need("datasets")
        data = datasets.load_dataset(dataset_name, dataset_config, split=split)
        if text_field not in data.column_names:
            raise ValueError(
                f"text_field {text_field!r} is not a column of {dataset_name!r} "
                f"({split}); its columns are {data.column_names}"
            )
        self.tokens = self._tokenize(tok, data[text_field])
        window = self.seq_len + 1
        self._len = len(self.tokens) // window
        if self._len == 0:
            raise ValueError(
                f"{dataset_name!r} ({split}) tokenizes to {len(self.tokens)} tokens, fewer than "
                f"one sample of seq_len + 1 = {window}"
            )
        self._epoch = 0
        self._sample_idx = 0

    def _tokenize(self, tok: Any, texts: Any) -> np.ndarray[Any, Any]:
        """Every document's ids followed by EOS, concatenated, as one ``uint32`` array."""
        eos = np.array([self.eos_token_id], dtype=np.uint32)
        parts: list[np.ndarray[Any, Any]] = []
        for lo in range(0, len(texts), _BATCH):
            batch = [t if isinstance(t, str) else "" for t in texts[lo : lo + _BATCH]]
            for enc in tok.encode_batch(batch, add_special_tokens=False):
                if enc.ids:
                    parts.append(np.asarray(enc.ids, dtype=np.uint32))
                    parts.append(eos)
        return np.concatenate(parts) if parts else np.zeros(0, np.uint32)

    def __len__(self) -> int:
        """The number of whole ``seq_len + 1`` windows of the token stream."""
        return self._len

    def __getitem__(self, idx: int) -> dict[str, torch.Tensor]:
        """Sample ``idx``: ``input_ids`` and ``labels`` (and ``doc_ids`` when packing),
        ``int64`` tensors of ``seq_len`` tokens."""
        i = as_int("idx", idx)
        if not 0 <= i < self._len:
            raise IndexError(f"index {i} out of range [0, {self._len})")
        window = self.seq_len + 1
        tokens = torch.from_numpy(self.tokens[i * window : (i + 1) * window].astype(np.int64))
        return lm_sample(tokens, self.eos_token_id if self.pack_sequences else None)

    def state_dict(self) -> dict[str, int]:
        """kempnerforge's keys: ``{"epoch", "sample_idx", "total_sequences"}``. The position in
        the data belongs to the sampler (``StatefulDataLoader`` saves it); ``sample_idx`` is
        kept as loaded, for kempnerforge checkpoints."""
        return {"epoch": self._epoch, "sample_idx": self._sample_idx, "total_sequences": self._len}

    def load_state_dict(self, state: Any) -> None:
        """Restores ``epoch`` and ``sample_idx`` (missing keys keep their values); a different
        ``total_sequences`` is refused: the data or tokenizer changed since the checkpoint."""
        if not isinstance(state, dict):
            raise TypeError(f"state must be a dict, got {type(state).__name__}")
        epoch = check_int("state['epoch']", state.get("epoch", self._epoch), 0)
        sample_idx = check_int("state['sample_idx']", state.get("sample_idx", self._sample_idx), 0)
        total = state.get("total_sequences")
        if total is not None and as_int("state['total_sequences']", total) != self._len:
            raise ValueError(
                f"state['total_sequences'] is {total}, this data gives {self._len} sequences "
                f"of seq_len={self.seq_len}: the data or tokenizer changed since the checkpoint"
            )
        self._epoch, self._sample_idx = epoch, sample_idx

    def __repr__(self) -> str:
        return (
            f"HuggingFaceDataset({self.dataset_name!r}, split={self.split!r}, "
            f"seq_len={self.seq_len}, sequences={self._len}, tokens={len(self.tokens)})"
        )
