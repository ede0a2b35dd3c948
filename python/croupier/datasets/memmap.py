"""``MemoryMappedDataset``: pre-tokenized ``.npy`` token files, memory-mapped, cut into samples.

kempnerforge's semantics (seed file 001), so its configurations and checkpoints carry over:

- the files are ``sorted(data_dir.glob(file_pattern))``, each a 1-D ``uint16`` or ``uint32``
  array of token ids saved with ``numpy.save``, logically concatenated in that order;
- each file is cut into ``len(file) // seq_len`` non-overlapping samples of ``seq_len`` tokens;
  the tokens after a file's last whole sample are not used, and no sample spans two files
  (a file shorter than ``seq_len`` contributes nothing);
- sample ``i`` is ``{"input_ids": tokens[:-1], "labels": tokens[1:]}``, ``int64`` tensors of
  ``seq_len - 1`` tokens (pass ``seq_len = context + 1`` for a context of ``context`` tokens).

With ``pack_sequences=True`` (which needs ``eos_token_id``) a sample holds several documents
separated by EOS tokens, and also gets ``doc_ids``: the document of each input position, counted
from 0 within the sample and increased after each EOS; a label whose token belongs to another
document than its input position is ``-100`` (the cross-entropy ignore index), so no position
learns to predict across a document boundary. ``eos_token_id`` is used only for packing.

Reading sample ``i`` copies its ``seq_len`` mapped tokens once, into the ``int64`` tensor both
outputs are views of. Pickling (DataLoader workers with ``spawn``, ``forkserver``) sends the
file list, not the data: each process maps the files again on first use.
"""

from __future__ import annotations

import bisect
import os
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
from torch.utils.data import Dataset

from croupier._validate import as_int, check_bool, check_int
from croupier.datasets._sample import IGNORE_INDEX, lm_sample

__all__ = ["IGNORE_INDEX", "MemoryMappedDataset"]

_DTYPES = (np.dtype(np.uint16), np.dtype(np.uint32))


def _open(path: Path) -> np.ndarray[Any, Any]:
    """``path`` memory-mapped, checked to be a 1-D uint16/uint32 ``.npy`` array."""
    try:
        loaded: object = np.load(path, mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError) as e:
        raise ValueError(
            f"MemoryMappedDataset reads .npy files written by numpy.save; cannot read {path}: {e}"
        ) from None
    # np.load maps a .npy file; it reads an empty one into memory, and gives an archive for .npz.
    if not isinstance(loaded, np.ndarray):
        raise ValueError(f"{path} is not a .npy array (np.load gave {type(loaded).__name__})")
    arr: np.ndarray[Any, Any] = loaded
    if arr.ndim != 1:
        raise ValueError(
            f"{path} holds a {arr.ndim}-D array of shape {arr.shape}; token files must be 1-D"
        )
    if arr.dtype not in _DTYPES:
        raise ValueError(f"{path} holds {arr.dtype} tokens; token files must be uint16 or uint32")
    return arr


class MemoryMappedDataset(Dataset):  # type: ignore[type-arg]
    """Pre-tokenized ``.npy`` token files as a map-style dataset of fixed-length samples.

    Args:
        data_dir: the directory holding the token files.
        seq_len: tokens per sample (``>= 2``); ``input_ids`` and ``labels`` are its first and
            last ``seq_len - 1`` tokens.
        file_pattern: glob pattern of the token files in ``data_dir`` (not recursive), taken
            in sorted order.
        pack_sequences: add ``doc_ids`` and mask labels across document boundaries (needs
            ``eos_token_id``).
        eos_token_id: the token that ends a document (used with ``pack_sequences``).

    Raises ``FileNotFoundError`` for a missing directory or no matching files, ``ValueError``
    for a file that is not a 1-D ``uint16``/``uint32`` ``.npy`` array, a ``seq_len`` below 2,
    or packing without ``eos_token_id``; ``TypeError`` for arguments of the wrong type.
    """

    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        seq_len: int,
        file_pattern: str = "*.npy",
        pack_sequences: bool = False,
        eos_token_id: int | None = None,
    ) -> None:
        if not isinstance(data_dir, (str, os.PathLike)):
            raise TypeError(
                f"data_dir must be a path (str or os.PathLike), got {type(data_dir).__name__}"
            )
        self.seq_len = check_int("seq_len", seq_len, 2)
        if not isinstance(file_pattern, str) or not file_pattern:
            raise TypeError(f"file_pattern must be a non-empty str, got {file_pattern!r}")
        self.pack_sequences = check_bool("pack_sequences", pack_sequences)
        if eos_token_id is not None:
            eos_token_id = check_int("eos_token_id", eos_token_id, 0, 2**32 - 1)
        if self.pack_sequences and eos_token_id is None:
            raise ValueError("eos_token_id is required when pack_sequences=True")
        self.eos_token_id = eos_token_id
        self.data_dir = Path(data_dir)
        self.file_pattern = file_pattern
        if not self.data_dir.is_dir():
            raise FileNotFoundError(f"data_dir {str(self.data_dir)!r} is not a directory")
        self.files = sorted(p for p in self.data_dir.glob(file_pattern) if p.is_file())
        if not self.files:
            raise FileNotFoundError(f"no files matching {file_pattern!r} in {str(self.data_dir)!r}")
        maps = [np.asarray(_open(p)) for p in self.files]
        self._maps: list[np.ndarray[Any, Any]] | None = maps
        counts = np.array([len(m) // self.seq_len for m in maps], dtype=np.int64)
        #: ``starts[f]`` is the first sample of file ``f``; ``starts[-1]`` the total.
        self.starts = np.concatenate(([0], np.cumsum(counts)))
        self._starts = self.starts.tolist()  # bisect on a list beats searchsorted per call
        self._len = int(self.starts[-1])
        self._epoch = 0

    def __len__(self) -> int:
        """The number of samples: each file's whole ``seq_len`` chunks, summed."""
        return self._len

    def _file_maps(self) -> list[np.ndarray[Any, Any]]:
        maps = self._maps
        if maps is None:  # unpickled in another process, or closed: map the files again
            # Plain ndarray views of the maps: slicing a numpy.memmap runs Python code per
            # slice (its __array_finalize__), a plain view does not.
            maps = [np.asarray(_open(p)) for p in self.files]
            self._maps = maps
        return maps

    def tokens(self, idx: int) -> npt.NDArray[Any]:
        """Sample ``idx``'s ``seq_len`` tokens: a read-only view of the mapped file."""
        i = idx if type(idx) is int else as_int("idx", idx)
        if not 0 <= i < self._len:
            raise IndexError(f"index {i} out of range [0, {self._len})")
        f = bisect.bisect_right(self._starts, i) - 1
        lo = (i - self._starts[f]) * self.seq_len
        return self._file_maps()[f][lo : lo + self.seq_len]

    def __getitem__(self, idx: int) -> dict[str, Any]:
        """Sample ``idx`` (``0 <= idx < len(self)``): ``input_ids`` and ``labels`` (and
        ``doc_ids`` when packing), ``int64`` tensors of ``seq_len - 1`` tokens."""
        tokens = torch.from_numpy(self.tokens(idx).astype(np.int64))
        if self.pack_sequences:
            return lm_sample(tokens, self.eos_token_id)
        return {"input_ids": tokens[:-1], "labels": tokens[1:]}

    # -- checkpoints, pickling, closing ------------------------------------------------------

    def state_dict(self) -> dict[str, int]:
        """kempnerforge's keys: ``{"epoch", "total_samples"}``. The dataset has no position of
        its own (the sampler has); ``total_samples`` is ``len(self)``."""
        return {"epoch": self._epoch, "total_samples": self._len}

    def load_state_dict(self, state: Any) -> None:
        """Restores ``epoch`` (``total_samples`` is derived from the files, as in kempnerforge;
        a different one is refused: the files changed). Missing keys keep their values."""
        if not isinstance(state, dict):
            raise TypeError(f"state must be a dict, got {type(state).__name__}")
        epoch = check_int("state['epoch']", state.get("epoch", self._epoch), 0)
        total = state.get("total_samples")
        if total is not None and as_int("state['total_samples']", total) != self._len:
            raise ValueError(
                f"state['total_samples'] is {total}, these files give {self._len} samples of "
                f"seq_len={self.seq_len}: the data changed since the checkpoint"
            )
        self._epoch = epoch

    def close(self) -> None:
        """Releases the memory maps: each is unmapped once no array from :meth:`tokens` still
        refers to it (samples from ``__getitem__`` are copies and never do). A later read
        maps the files again. Safe to call twice."""
        self._maps = None

    def __enter__(self) -> MemoryMappedDataset:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_maps"] = None  # the file list travels, the mapped data does not
        return state

    def __repr__(self) -> str:
        return (
            f"MemoryMappedDataset({str(self.data_dir)!r}, seq_len={self.seq_len}, "
            f"files={len(self.files)}, samples={self._len}, pack_sequences={self.pack_sequences})"
        )
