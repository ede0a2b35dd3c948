"""Accelerate, 2 CPU processes (launched by torchrun, or with the variables it sets), the
loader prepared with ``croupier.integrations.accelerate.prepare`` (``--plain``: with
``accelerator.prepare``, which croupier must refuse loudly).

    torchrun --nproc_per_node 2 run_accelerate.py \
        --kind K --out DIR --stage full|part1|part2 [--steps S] [--workers W] [--accum A]

``part1`` trains ``S`` optimizer steps (of ``A`` batches, under ``accelerator.accumulate``),
``save_state`` and stops; ``part2`` ``load_state``s and resumes as
Accelerate's docs say: ``set_epoch`` and ``skip_first_batches`` for the epoch in progress;
with ``--elastic`` (any number of processes) it iterates the restored loader instead.
"""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch
from accelerate import Accelerator

from croupier.integrations.accelerate import prepare
from trainers.common import EPOCHS, Recorder, arguments, loader

a = arguments("--plain", "--elastic")

acc = Accelerator(cpu=True, gradient_accumulation_steps=a.accum)
model = torch.nn.Linear(1, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
dl = loader(a.kind, acc.num_processes, acc.process_index, n_workers=a.workers)
if a.plain:
    model, opt, dl = acc.prepare(model, opt, dl)
else:
    model, opt, dl = prepare(acc, model, opt, dl)
rec = Recorder(a.out, acc.process_index)
state_dir = os.path.join(a.out, "state")

# Batches trained, and optimizer steps taken (the last of an epoch takes what is left of it).
done, updates, first_epoch, skip = 0, 0, 0, 0
if a.stage == "part2":
    acc.load_state(state_dir)  # the loader's state too (croupier's prepare has it saved)
    if a.elastic:  # on any number of processes: the restored loader continues the epoch
        first_epoch = dl.state_dict()["epoch"]
    else:  # Accelerate's skip by count, on the same number of processes
        with open(os.path.join(state_dir, "step.json")) as f:
            done = json.load(f)
        first_epoch, skip = divmod(done, len(dl))


def train() -> bool:
    global done, updates
    for epoch in range(first_epoch, EPOCHS):
        dl.set_epoch(epoch)
        batches = acc.skip_first_batches(dl, skip) if epoch == first_epoch and skip else dl
        for batch in batches:
            rec.add(batch["ids"])
            with acc.accumulate(model):
                loss = torch.nn.functional.mse_loss(model(batch["x"]), batch["y"])
                acc.backward(loss)
                opt.step()
                opt.zero_grad()
            done += 1
            updates += acc.sync_gradients
            if a.stage == "part1" and updates == a.steps and acc.sync_gradients:
                acc.save_state(state_dir)
                if acc.is_main_process:
                    with open(os.path.join(state_dir, "step.json"), "w") as f:
                        json.dump(done, f)
                return False
    return True


train()
acc.wait_for_everyone()
acc.end_training()
