"""Map-style token datasets for language-model training: pre-tokenized files
(:class:`MemoryMappedDataset`) and Hugging Face datasets tokenized on load
(:class:`HuggingFaceDataset`, the ``hf`` extra). Both need torch; they return torch tensors."""

from typing import TYPE_CHECKING, Any

from croupier.datasets.memmap import MemoryMappedDataset

if TYPE_CHECKING:
    from croupier.datasets.huggingface import HuggingFaceDataset

__all__ = ["HuggingFaceDataset", "MemoryMappedDataset"]


def __getattr__(name: str) -> Any:
    # The hf extra is optional: its module loads on first use.
    if name == "HuggingFaceDataset":
        from croupier.datasets.huggingface import HuggingFaceDataset

        return HuggingFaceDataset
    raise AttributeError(f"module 'croupier.datasets' has no attribute {name!r}")
