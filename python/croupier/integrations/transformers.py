"""The Hugging Face ``Trainer`` with croupier's samplers: ``CroupierTrainerMixin``.

``Trainer`` prepares its loaders with Accelerate, which deals every loader's batches to the
processes a second time (see :mod:`croupier.integrations.accelerate`), and passes any sampler
from ``_get_train_sampler`` as an index sampler. The mixin builds the loader of a croupier
sampler as it should be (an index sampler batched by ``per_device_train_batch_size``, a batch
sampler as the loader's ``batch_sampler``), prepares it with the sharding turned into a
pass-through, and lets ``Trainer`` do the rest: ``set_epoch`` every epoch, and on
``resume_from_checkpoint`` its skip of the batches already trained in the epoch (exact, because
the epoch reaches the sampler through the skipping wrapper)::

    from croupier.integrations.transformers import CroupierTrainerMixin

    class MyTrainer(CroupierTrainerMixin, Trainer):
        def _get_train_sampler(self, train_dataset=None):
            return croupier.DistributedSampler(
                self.train_dataset, num_replicas=self.args.world_size,
                rank=self.args.process_index, seed=self.args.seed,
            )

Samplers that are not croupier's go through ``Trainer``'s own path unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

from croupier.integrations.accelerate import pass_through
from croupier.samplers._base import BatchSampler, StatefulSampler

__all__ = ["CroupierTrainerMixin"]


class CroupierTrainerMixin:
    """Mix into a ``transformers.Trainer`` subclass (before ``Trainer``) whose
    ``_get_train_sampler`` returns a croupier sampler: every rank trains on its share of every
    epoch, once, reshuffled each epoch, and a resumed run trains exactly the batches the
    uninterrupted run would have."""

    def _get_dataloader(
        self,
        dataset: Any,
        description: str,
        batch_size: int,
        sampler_fn: Callable[[Any], Any] | None = None,
        is_training: bool = False,
        dataloader_key: str | None = None,
    ) -> Any:
        import torch.utils.data

        sampler = None
        if sampler_fn is not None and not isinstance(dataset, torch.utils.data.IterableDataset):
            sampler = sampler_fn(dataset)
        trainer: Any = self
        if isinstance(sampler, BatchSampler):
            loader = self._batch_sampler_loader(dataset, description, sampler, is_training)
            if dataloader_key is not None and trainer.args.dataloader_persistent_workers:
                # As Trainer does: reuse it at the next evaluation, not a new set of workers.
                trainer.__dict__.setdefault("_eval_dataloaders", {})[dataloader_key] = loader
            return loader
        parent: Any = super()
        loader = parent._get_dataloader(
            dataset,
            description,
            batch_size,
            sampler_fn=None if sampler_fn is None else (lambda _: sampler),
            is_training=is_training,
            dataloader_key=dataloader_key,
        )
        if isinstance(sampler, StatefulSampler):
            pass_through(loader)
        return loader

    def _batch_sampler_loader(
        self, dataset: Any, description: str, batch_sampler: BatchSampler, is_training: bool
    ) -> Any:
        """The loader of a croupier batch sampler, with ``Trainer``'s loader options, as
        ``Trainer`` builds one for its own rank-aware batch sampler."""
        from torch.utils.data import DataLoader
        from transformers.trainer_utils import seed_worker
        from transformers.utils import is_datasets_available

        trainer: Any = self
        args = trainer.args
        collator = trainer.data_collator
        if is_datasets_available() and _is_hf_dataset(dataset):
            dataset = trainer._remove_unused_columns(dataset, description=description)
        else:
            collator = trainer._get_collator_with_removed_columns(collator, description=description)
        params: dict[str, Any] = {
            "batch_sampler": batch_sampler,
            "collate_fn": collator,
            "num_workers": args.dataloader_num_workers,
            "pin_memory": args.dataloader_pin_memory,
            "persistent_workers": args.dataloader_persistent_workers,
            "multiprocessing_context": args.dataloader_multiprocessing_context,
            "prefetch_factor": args.dataloader_prefetch_factor,
            "in_order": args.dataloader_in_order,
        }
        if is_training:
            params["worker_init_fn"] = partial(
                seed_worker, num_workers=args.dataloader_num_workers, rank=args.process_index
            )
        loader = trainer.accelerator.prepare(DataLoader(dataset, **params))
        pass_through(loader)
        return loader


def _is_hf_dataset(dataset: Any) -> bool:
    import datasets

    return isinstance(dataset, datasets.Dataset)
