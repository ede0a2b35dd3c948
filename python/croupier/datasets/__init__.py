"""Map-style token datasets for language-model training: pre-tokenized files
(:class:`MemoryMappedDataset`) and Hugging Face datasets tokenized on load
(:class:`HuggingFaceDataset`, the ``hf`` extra). Both need torch; they return torch tensors."""

from croupier.datasets.memmap import MemoryMappedDataset

__all__ = ["MemoryMappedDataset"]
