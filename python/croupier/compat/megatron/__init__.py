"""Megatron: megatron-core's dataset indices and Megatron-LM's pretraining samplers, by their
names, giving the same arrays and the same micro-batches from the same arguments.

- :mod:`croupier.compat.megatron.indices`: megatron-core's index builders
  (``build_blending_indices``, ``build_exhaustive_blending_indices``, ``build_sample_idx``,
  ``build_document_index``, ``build_shuffle_index``) and :func:`patch`, which makes an
  installed megatron-core use them;
- :mod:`croupier.compat.megatron.index_free`: :class:`IndexFreeBlend` and
  :class:`IndexFreeShuffle`, croupier's keyed orders read by random access in place of a
  blend and a shuffle index, for new runs (``patch(index_free=True)``);
- :mod:`croupier.compat.megatron.samplers`: ``MegatronPretrainingSampler`` and
  ``MegatronPretrainingRandomSampler``, Megatron-LM's training batch samplers, with a state.
"""

from croupier.compat.megatron.index_free import IndexFreeBlend, IndexFreeShuffle, IndexView
from croupier.compat.megatron.indices import (
    Patch,
    build_blending_indices,
    build_document_index,
    build_exhaustive_blending_indices,
    build_sample_idx,
    build_shuffle_index,
    patch,
)
from croupier.compat.megatron.indices import (
    _patched as _patched,
)
from croupier.compat.megatron.samplers import (
    MegatronPretrainingRandomSampler,
    MegatronPretrainingSampler,
)

__all__ = [
    "IndexFreeBlend",
    "IndexFreeShuffle",
    "IndexView",
    "MegatronPretrainingRandomSampler",
    "MegatronPretrainingSampler",
    "Patch",
    "build_blending_indices",
    "build_document_index",
    "build_exhaustive_blending_indices",
    "build_sample_idx",
    "build_shuffle_index",
    "patch",
]
