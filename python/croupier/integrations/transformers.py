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

import glob
import json
import os
from collections.abc import Callable
from functools import partial
from typing import Any

from croupier.integrations.accelerate import pass_through
from croupier.samplers._base import BatchSampler, StatefulSampler

__all__ = ["CroupierTrainerMixin"]


#: The file the mixin writes into every checkpoint folder: the number of processes it was
#: saved on.
WORLD_FILE = "croupier_world.json"


class CroupierTrainerMixin:
    """Mix into a ``transformers.Trainer`` subclass (before ``Trainer``) whose
    ``_get_train_sampler`` returns a croupier sampler: every rank trains on its share of every
    epoch, once, reshuffled each epoch, and a resumed run trains exactly the batches the
    uninterrupted run would have.

    ``resume_from_checkpoint`` must run on the number of processes the checkpoint was saved on:
    the Trainer derives the epoch and the batches to skip from ``global_step`` and the loader's
    length, counts of the old world that name other samples on another, so a resume on another
    number of processes is refused with ``ValueError`` before anything trains."""

    def train(self, resume_from_checkpoint: Any = None, *args: Any, **kwargs: Any) -> Any:
        trainer: Any = self
        checkpoint = resume_from_checkpoint
        if isinstance(checkpoint, bool) and checkpoint:
            from transformers.trainer_utils import get_last_checkpoint

            checkpoint = get_last_checkpoint(trainer.args.output_dir)
        if isinstance(checkpoint, (str, os.PathLike)) and not trainer.args.ignore_data_skip:
            _check_world(os.fspath(checkpoint), trainer.args.world_size)
        parent: Any = super()
        return parent.train(resume_from_checkpoint, *args, **kwargs)

    def _save_rng_state(self, output_dir: str) -> None:
        trainer: Any = self
        parent: Any = super()
        parent._save_rng_state(output_dir)
        if trainer.args.should_save:
            with open(os.path.join(output_dir, WORLD_FILE), "w") as f:
                json.dump({"num_processes": trainer.args.world_size}, f)

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


def _saved_world(checkpoint: str) -> int | None:
    """The number of processes ``checkpoint`` was saved on: the mixin's record, else the
    Trainer's random states (one file per process), else unknown."""
    path = os.path.join(checkpoint, WORLD_FILE)
    if os.path.isfile(path):
        with open(path) as f:
            return int(json.load(f)["num_processes"])
    per_process = glob.glob(os.path.join(glob.escape(checkpoint), "rng_state_*.pth"))
    if per_process:
        return len(per_process)
    if os.path.isfile(os.path.join(checkpoint, "rng_state.pth")):
        return 1
    return None


def _check_world(checkpoint: str, world: int) -> None:
    """Refuses to resume ``checkpoint`` on ``world`` processes if it was saved on another
    number: the Trainer's skip would name other samples (a silent loss or repeat)."""
    saved = _saved_world(checkpoint)
    if saved is None or saved == world:
        return
    raise ValueError(
        f"checkpoint {checkpoint!r} was saved on {saved} processes, resumed on {world}: the "
        f"Trainer counts the epoch and the batches to skip in optimizer steps of {saved} "
        "processes, which name other samples here (part of the epoch would be lost or "
        f"repeated). Resume it on {saved} processes (torchrun --nproc_per_node {saved}), or "
        "take its weights without its data position (args.ignore_data_skip=True: the "
        "Trainer then starts an epoch over); croupier's samplers resume elastically "
        "under Lightning, Accelerate or a loop of your own (docs/trainers.md)"
    )


def _is_hf_dataset(dataset: Any) -> bool:
    import datasets

    return isinstance(dataset, datasets.Dataset)
