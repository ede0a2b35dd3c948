"""NeMo Automodel's names and defaults: ``from croupier.compat.nemo import
SequentialBucketSampler`` in place of
``nemo_automodel.components.datasets.diffusion.sampler.SequentialBucketSampler``.

The class is :class:`croupier.SequentialBucketSampler` with ``order="torch"`` by default, so it
yields exactly the batches NeMo's sampler yields for the same arguments and epoch, and its
states load in NeMo and NeMo's load here.
"""

from __future__ import annotations

from typing import Any

from croupier._dist import DistInfo
from croupier.samplers.sequential_bucket import SequentialBucketSampler as _Sampler

__all__ = ["SequentialBucketSampler"]


class SequentialBucketSampler(_Sampler):
    """NeMo Automodel's ``SequentialBucketSampler`` (signature and defaults), computed by
    croupier; ``order="torch"`` (NeMo's exact batches) unless told otherwise. See
    :class:`croupier.SequentialBucketSampler`.

    One rule differs from croupier's class, as NeMo has it: a loaded ``batches_yielded`` is
    a skip kept until the next iteration uses it, whatever the epoch is then. After
    ``load_state_dict({"epoch": 4, "batches_yielded": 3})`` and ``set_epoch(9)``, the next
    iteration yields epoch 9 from its fourth batch (croupier's class: from its first).
    """

    _skip_outlives_epoch = True

    def __init__(
        self,
        dataset: Any,
        base_batch_size: int = 32,
        base_resolution: tuple[int, int] = (512, 512),
        drop_last: bool = True,
        shuffle_buckets: bool = True,
        shuffle_within_bucket: bool = True,
        dynamic_batch_size: bool = False,
        seed: int = 42,
        num_replicas: int | None = None,
        rank: int | None = None,
        *,
        order: str = "torch",
        torch_version: str | None = None,
        dist_info: DistInfo = None,
    ) -> None:
        super().__init__(
            dataset,
            base_batch_size,
            base_resolution,
            drop_last,
            shuffle_buckets,
            shuffle_within_bucket,
            dynamic_batch_size,
            seed,
            num_replicas,
            rank,
            order=order,
            torch_version=torch_version,
            dist_info=dist_info,
        )
