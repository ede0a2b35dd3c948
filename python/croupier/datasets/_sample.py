"""One language-model sample from a window of tokens: inputs, next-token labels and, for packed
documents, document ids with the labels across document boundaries masked."""

from __future__ import annotations

import torch

__all__ = ["IGNORE_INDEX", "lm_sample"]

IGNORE_INDEX = -100
"""The label of a position whose next token starts another document (packed samples): the
ignore index of ``torch.nn.functional.cross_entropy``."""


def lm_sample(tokens: torch.Tensor, eos_token_id: int | None) -> dict[str, torch.Tensor]:
    """``{"input_ids": tokens[:-1], "labels": tokens[1:]}`` (views of the ``int64`` window);
    with ``eos_token_id`` (packing) also ``doc_ids``, the document of each input position
    (counted from 0, increased after each EOS), and every label whose input position is an EOS
    set to :data:`IGNORE_INDEX`: no position learns to predict the next document's first
    token."""
    inputs, labels = tokens[:-1], tokens[1:]
    if eos_token_id is None:
        return {"input_ids": inputs, "labels": labels}
    ends = inputs.eq(eos_token_id)
    return {
        "input_ids": inputs,
        "labels": labels.masked_fill(ends, IGNORE_INDEX),
        "doc_ids": torch.cumsum(ends, 0) - ends.long(),
    }
