"""croupier: fast, reproducible, resumable index samplers for PyTorch training.

The Rust core (``croupier._core``) shuffles, deals and batches sample indices over contiguous
buffers and hands them to Python as numpy arrays without a copy; the classes here wrap them as
``torch.utils.data`` samplers with checkpoint state. Importing croupier needs only numpy; the
samplers subclass ``torch.utils.data.Sampler`` when torch is installed.
"""

from croupier._core import __version__
from croupier._permutation import permutation
from croupier.samplers import DistributedSampler, StateError

__all__ = ["DistributedSampler", "StateError", "__version__", "permutation"]
