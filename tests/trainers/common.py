"""What the framework runs share: the dataset of ids, the croupier samplers and loaders under
test (as each framework's docs tell users to pass them), the record of the ids each rank
trained on, and the batches an uninterrupted run trains (computed from the samplers alone)."""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

import croupier

N = 400
BATCH = 8
EPOCHS = 2
SEED = 3
# Mixture: two datasets of 150 and 250 ids, weighted 1:2.
MIX_SIZES = [0, 150, N]
MIX_WEIGHTS = [1.0, 2.0]
MAX_TOKENS = 200

KINDS = ("distributed", "mixture", "buckets", "loader")


class Ids(Dataset):  # type: ignore[type-arg]
    """Sample ``i`` is its id, a feature and a target for a one-weight model."""

    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"ids": torch.tensor(i), "x": torch.tensor([i / N]), "y": torch.tensor([1.0])}


def lengths() -> list[int]:
    return [(i * 7919) % 97 + 1 for i in range(N)]


def sampler(kind: str, world: int, rank: int) -> Any:
    """The croupier sampler of ``kind`` for ``rank`` of ``world``."""
    if kind in ("distributed", "loader"):
        return croupier.DistributedSampler(N, num_replicas=world, rank=rank, seed=SEED)
    if kind == "mixture":
        return croupier.MixtureSampler(
            MIX_SIZES, MIX_WEIGHTS, num_replicas=world, rank=rank, seed=SEED
        )
    if kind == "buckets":
        return croupier.BucketBatchSampler(
            lengths(), max_tokens=MAX_TOKENS, num_replicas=world, rank=rank, seed=SEED
        )
    raise ValueError(kind)


def workers(n: int) -> dict[str, Any]:
    """A loader's options for ``n`` worker processes, kept across epochs."""
    return {"num_workers": n, "persistent_workers": True} if n else {}


def loader(  # type: ignore[type-arg]
    kind: str, world: int, rank: int, stateful: bool = False, n_workers: int = 0
) -> DataLoader:
    """The loader a user writes: torch's DataLoader with the sampler (or batch sampler), or
    croupier's StatefulDataLoader (``kind == "loader"``, or ``stateful``), with ``n_workers``
    worker processes."""
    s = sampler(kind, world, rank)
    opts = workers(n_workers)
    if kind == "loader" or stateful:
        if kind == "buckets":
            return croupier.StatefulDataLoader(Ids(), batch_sampler=s, **opts)
        return croupier.StatefulDataLoader(Ids(), batch_size=BATCH, sampler=s, **opts)
    if kind == "buckets":
        return DataLoader(Ids(), batch_sampler=s, **opts)
    return DataLoader(Ids(), batch_size=BATCH, sampler=s, **opts)


def expected(kind: str, world: int, rank: int, epochs: int = EPOCHS) -> list[list[int]]:
    """The batches rank ``rank`` trains on in ``epochs`` uninterrupted epochs, epoch after
    epoch: the sampler's own output, batched as the loader batches it."""
    s = sampler(kind, world, rank)
    out: list[list[int]] = []
    for epoch in range(epochs):
        s.set_epoch(epoch)
        if kind == "buckets":
            out += [list(b) for b in s]
        else:
            ids = list(s)
            out += [ids[i : i + BATCH] for i in range(0, len(ids), BATCH)]
    return out


def batches_per_epoch(kind: str, world: int) -> int:
    return len(expected(kind, world, 0, epochs=1))


def batches_in(kind: str, world: int, updates: int, accum: int) -> int:
    """Batches trained in ``updates`` optimizer steps of ``accum`` batches each, the last step
    of an epoch taking what is left of it (as Lightning and the HF Trainer step)."""
    per_epoch = batches_per_epoch(kind, world)
    epochs, rest = divmod(updates, -(-per_epoch // accum))
    return epochs * per_epoch + rest * accum


class Recorder:
    """Appends each trained batch's ids to ``out/rank{r}.jsonl``."""

    def __init__(self, out: str, rank: int) -> None:
        self.path = os.path.join(out, f"rank{rank}.jsonl")

    def add(self, ids: torch.Tensor) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps([int(i) for i in ids.tolist()]) + "\n")


def recorded(out: str, rank: int) -> list[list[int]]:
    path = os.path.join(out, f"rank{rank}.jsonl")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f]


def arguments(*flags: str) -> argparse.Namespace:
    """A runner's command line: ``--kind``, ``--out``, ``--stage`` (full, part1, part2),
    ``--steps`` (the optimizer step part1 stops after), ``--workers`` (loader worker
    processes), ``--accum`` (batches per optimizer step), ``--devices`` (processes, for the
    runners that start their own), and the boolean ``flags`` it takes."""
    p = argparse.ArgumentParser()
    p.add_argument("--kind", required=True, choices=KINDS)
    p.add_argument("--out", required=True)
    p.add_argument("--stage", default="full", choices=("full", "part1", "part2"))
    p.add_argument("--steps", type=int, default=0)
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--accum", type=int, default=1)
    p.add_argument("--devices", type=int, default=2)
    for flag in flags:
        p.add_argument(flag, action="store_true")
    return p.parse_args()
