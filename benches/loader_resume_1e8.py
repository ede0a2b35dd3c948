#!/usr/bin/env python3
"""Resume at mid-epoch of a 1e8-sample epoch through a loader with 2 workers (W=8, batch 16):
croupier's StatefulDataLoader with DistributedSampler beside torchdata's StatefulDataLoader with
its StatefulDistributedSampler, time from ``load_state_dict`` to the first batch, medians of
one run. Each measured resume starts in a quiet process (a croupier sampler computes the rest
of its epoch on a thread after a resume; the previous round's is waited for).

    python benches/loader_resume_1e8.py [--n 100000000]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import threading
import time
import warnings
from typing import Any

from torch.utils.data import Dataset
from torchdata.stateful_dataloader import StatefulDataLoader as TorchdataLoader
from torchdata.stateful_dataloader.sampler import StatefulDistributedSampler

from croupier import DistributedSampler, StatefulDataLoader

W, RANK, BATCH = 8, 3, 16


class Ids(Dataset):  # type: ignore[type-arg]
    """Sample ``i`` is ``i``: the loader is measured, not the data."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return i


def first_batch(make: Any, state: dict) -> float:
    for thread in threading.enumerate():
        if thread.name == "croupier-tail":
            thread.join()
    start = time.perf_counter()
    loader = make()
    loader.load_state_dict(state)
    it = iter(loader)
    next(it)
    elapsed = time.perf_counter() - start
    del it
    return elapsed


def set_counts(state: dict, samples: int, batches: int) -> None:
    """The counters torchdata's state holds after ``batches`` batches (what it would save)."""
    for key, value in state.items():
        if key in ("yielded", "samples_yielded"):
            state[key] = samples
        elif key == "_sampler_iter_yielded":
            state[key] = batches
        elif isinstance(value, dict):
            set_counts(value, samples, batches)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=10**8)
    n = parser.parse_args().n
    warnings.simplefilter("ignore")  # torchdata calls a deprecated torch function
    ds = Ids(n)
    half = n // W // BATCH // 2

    def ours() -> StatefulDataLoader:
        return StatefulDataLoader(ds, BATCH, sampler=DistributedSampler(n, W, RANK), num_workers=2)

    def theirs() -> TorchdataLoader:
        return TorchdataLoader(
            ds, BATCH, sampler=StatefulDistributedSampler(ds, W, RANK), num_workers=2
        )

    state = ours().state_dict()
    state.update(batches_yielded=half)
    state["sampler"]["position"] = half * BATCH
    loader = theirs()
    it = iter(loader)
    next(it)
    their_state = loader.state_dict()
    del it, loader
    set_counts(their_state, half * BATCH, half)
    gc.collect()
    mine = statistics.median(first_batch(ours, state) for _ in range(7))
    other = statistics.median(first_batch(theirs, their_state) for _ in range(3))
    print(
        f"n={n:.0e}: croupier {mine * 1000:.1f} ms, torchdata {other * 1000:.1f} ms, "
        f"{other / mine:.0f}x"
    )


if __name__ == "__main__":
    main()
