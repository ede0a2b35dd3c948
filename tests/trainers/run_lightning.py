"""Lightning, 2 CPU processes (DDP over gloo), with Lightning's defaults
(``use_distributed_sampler=True``) and the loader from ``train_dataloader``; started as torchrun
starts its workers (``launch.py``), or alone, when Lightning starts the other processes.

    python run_lightning.py --kind K [--stateful] --out DIR --stage full|part1|part2 [--steps S] \
        [--workers W] [--accum A]

``part1`` trains ``S`` optimizer steps with a checkpoint at step ``S`` and stops; ``part2``
resumes from that checkpoint (``fit(ckpt_path=...)``) to the end. Alone, Lightning's ddp
strategy starts the other processes by running this script again.
"""

from __future__ import annotations

import glob
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from trainers.common import EPOCHS, Recorder, arguments, loader

a = arguments("--stateful")


class Model(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(1, 1)

    def setup(self, stage: str) -> None:
        self.rec = Recorder(a.out, self.global_rank)

    def training_step(self, batch, i):  # type: ignore[no-untyped-def]
        self.rec.add(batch["ids"])
        return torch.nn.functional.mse_loss(self.lin(batch["x"]), batch["y"])

    def configure_optimizers(self):  # type: ignore[no-untyped-def]
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def train_dataloader(self):  # type: ignore[no-untyped-def]
        return loader(
            a.kind, self.trainer.world_size, self.trainer.global_rank, a.stateful, a.workers
        )


common = {
    "accelerator": "cpu",
    "devices": a.devices,
    "strategy": "ddp",
    "max_epochs": EPOCHS,
    "accumulate_grad_batches": a.accum,
    "enable_progress_bar": False,
    "logger": False,
    "enable_model_summary": False,
}
ckpt = os.path.join(a.out, "ckpt")
if a.stage == "part1":
    save = ModelCheckpoint(dirpath=ckpt, every_n_train_steps=a.steps, save_top_k=-1)
    L.Trainer(max_steps=a.steps, callbacks=[save], **common).fit(Model())
elif a.stage == "part2":
    (path,) = glob.glob(os.path.join(ckpt, "*.ckpt"))
    L.Trainer(enable_checkpointing=False, **common).fit(Model(), ckpt_path=path)
else:
    L.Trainer(enable_checkpointing=False, **common).fit(Model())

# Tear the process group down while the interpreter is whole: Lightning leaves it to an
# atexit hook, and on a loaded machine gloo's threads then lost a race with the interpreter's
# teardown once ("terminate called without an active exception", exit -6, after a finished
# fit; pytorch/pytorch#179291 describes the race). A training script should do this anyway.
if torch.distributed.is_initialized():
    torch.distributed.destroy_process_group()
