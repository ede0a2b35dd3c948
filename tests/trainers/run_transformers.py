"""The Hugging Face Trainer, 2 CPU processes (launched by torchrun, or with the variables it
sets), with ``CroupierTrainerMixin`` and ``_get_train_sampler`` returning the croupier sampler, as
transformers' docs say to supply a sampler.

    torchrun --nproc_per_node 2 run_transformers.py \
        --kind K --out DIR --stage full|part1|part2 [--steps S] [--workers W] [--accum A]

``part1`` trains ``S`` optimizer steps with a checkpoint at step ``S``; ``part2`` resumes with
``train(resume_from_checkpoint=...)``.
"""

from __future__ import annotations

import glob
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch
from transformers import Trainer, TrainingArguments

import croupier
from croupier.integrations.transformers import CroupierTrainerMixin
from trainers.common import BATCH, EPOCHS, Ids, Recorder, arguments, sampler, workers

a = arguments()
rank = int(os.environ.get("RANK", "0"))


class Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(1, 1)
        self.rec = Recorder(a.out, rank)

    def forward(self, ids, x, y):  # type: ignore[no-untyped-def]
        self.rec.add(ids)
        return {"loss": torch.nn.functional.mse_loss(self.lin(x), y)}


class MyTrainer(CroupierTrainerMixin, Trainer):
    def _get_train_sampler(self, train_dataset=None):  # type: ignore[no-untyped-def]
        return sampler(a.kind, self.args.world_size, self.args.process_index)


class LoaderTrainer(Trainer):
    def get_train_dataloader(self):  # type: ignore[no-untyped-def]
        s = sampler(a.kind, self.args.world_size, self.args.process_index)
        return croupier.StatefulDataLoader(
            self.train_dataset,
            batch_size=self.args.per_device_train_batch_size,
            sampler=s,
            **workers(self.args.dataloader_num_workers),
        )


args = TrainingArguments(
    output_dir=os.path.join(a.out, "ckpt"),
    use_cpu=True,
    ddp_backend="gloo",
    per_device_train_batch_size=BATCH,
    gradient_accumulation_steps=a.accum,
    dataloader_num_workers=a.workers,
    dataloader_persistent_workers=a.workers > 0,
    num_train_epochs=EPOCHS,
    learning_rate=0.01,
    report_to=[],
    logging_strategy="no",
    disable_tqdm=True,
    save_strategy="steps" if a.stage == "part1" else "no",
    save_steps=max(a.steps, 1),
    max_steps=a.steps if a.stage == "part1" else -1,
)
kind = LoaderTrainer if a.kind == "loader" else MyTrainer
trainer = kind(model=Model(), args=args, train_dataset=Ids())
resume = None
if a.stage == "part2":
    resume = sorted(glob.glob(os.path.join(a.out, "ckpt", "checkpoint-*")))[-1]
trainer.train(resume_from_checkpoint=resume)
