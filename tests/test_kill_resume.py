"""A real kill and resume: 2 training processes on torch.distributed (gloo), each with a
StatefulDataLoader and 2 workers, checkpointing as they go, killed with SIGKILL at a random
batch, restarted from their last complete checkpoint. The sample ids trained across both runs
must be exactly those of an uninterrupted run: nothing lost, nothing repeated.

The elastic case kills 4 processes and restarts on 3: the epoch of the checkpoint continues
on 3 ranks, and the ids of both runs cover it as the uninterrupted 4-process run does, apart
from torch's padding (or, for the mixture, dropping) of fewer than 3 items of the rest."""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip("torch")

WORLD = 2
EPOCHS = 2
EVERY = 3  # batches between checkpoints

# The loader of each kind: the same in the training job (over the process group) and in the
# test (explicit ranks, for the uninterrupted run's batches).
_SETUP = textwrap.dedent(
    """
    import numpy as np
    from torch.utils.data import Dataset
    from croupier import BucketBatchSampler, DistributedSampler, MixtureSampler
    from croupier import StatefulDataLoader

    class Ids(Dataset):
        def __len__(self):
            return 600
        def __getitem__(self, i):
            return i

    def make_loader(kind, num_workers=2, **ranks):
        # ranks: num_replicas and rank, or none for the process group's.
        if kind == "distributed":
            return StatefulDataLoader(Ids(), 8, sampler=DistributedSampler(600, seed=3, **ranks),
                                      num_workers=num_workers)
        if kind == "mixture":
            sampler = MixtureSampler([0, 100, 350, 600], [0.2, 0.5, 0.3], seed=3, **ranks)
            return StatefulDataLoader(Ids(), 8, sampler=sampler, num_workers=num_workers)
        lengths = np.random.default_rng(3).integers(1, 300, size=600)
        sampler = BucketBatchSampler(lengths, max_tokens=1700, buckets=6, seed=3, **ranks)
        return StatefulDataLoader(Ids(), batch_sampler=sampler, num_workers=num_workers)
    """
)

# The training job: `kind`, the run directory and the rendezvous port on the command line;
# rank and world size from the environment, as torchrun sets them. A checkpoint records the
# world size it was saved on; a restart on another one continues its epoch (elastic resume).
_TRAIN = _SETUP + (
    textwrap.dedent(
        """
    import json, os, sys, time
    from pathlib import Path
    import torch.distributed as dist

    kind, run_dir, port = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    loader = make_loader(kind)

    # Resume from the newest step every rank of the world that saved it finished saving.
    def finished(step):
        saved_world = json.loads((run_dir / f"ckpt-{step}-rank0.json").read_text())["world"]
        return all(
            (run_dir / f"ckpt-{step}-rank{r}.json").exists() for r in range(saved_world))

    steps = [int(p.name.split("-")[1]) for p in run_dir.glob("ckpt-*-rank0.json")]
    complete = [s for s in steps if finished(s)]
    step = 0
    if complete:
        step = max(complete)
        saved = json.loads((run_dir / f"ckpt-{step}-rank0.json").read_text())
        own = run_dir / f"ckpt-{step}-rank{rank}.json"
        if rank < saved["world"]:
            saved = json.loads(own.read_text())
        loader.load_state_dict(saved["loader"])
    log = open(run_dir / f"ids-rank{rank}.jsonl", "a")
    while loader.epoch < EPOCHS:
        for batch in loader:
            step += 1
            entry = {"step": step, "epoch": loader.epoch, "ids": batch.tolist()}
            log.write(json.dumps(entry) + "\\n")
            log.flush()
            time.sleep(0.01)  # "training"
            if step % EVERY == 0:
                dist.barrier()
                tmp = run_dir / f"tmp-rank{rank}.json"
                tmp.write_text(json.dumps({"world": world, "loader": loader.state_dict()}))
                os.replace(tmp, run_dir / f"ckpt-{step}-rank{rank}.json")
    dist.barrier()
    dist.destroy_process_group()
    """
    )
    .replace("EPOCHS", str(EPOCHS))
    .replace("EVERY", str(EVERY))
)


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _launch(kind: str, run_dir: Path, world: int = WORLD) -> list[subprocess.Popen]:
    port = _port()
    procs = []
    for rank in range(world):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(world)}
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", _TRAIN, kind, str(run_dir), str(port)],
                env=env,
                stderr=subprocess.PIPE,
                text=True,
                start_new_session=True,  # its own process group: the kill reaches the workers
            )
        )
    return procs


def _wait(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-3000:]


def _log(run_dir: Path, rank: int) -> list[dict]:
    path = run_dir / f"ids-rank{rank}.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    # The kill may cut the last line short.
    out = []
    for line in lines:
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            assert line is lines[-1]
    return out


def _kill(kind: str, run_dir: Path, world: int, kill_at: int) -> tuple[dict, int]:
    """Runs the job on ``world`` processes and SIGKILLs them once rank 0 trained ``kill_at``
    batches. Returns each rank's log and the step of the newest complete checkpoint; the logs
    move aside (what the restarted run repeats is what the killed run lost)."""
    procs = _launch(kind, run_dir, world)
    deadline = time.monotonic() + 300
    while len(_log(run_dir, 0)) < kill_at:
        assert time.monotonic() < deadline and all(p.poll() is None for p in procs)
        time.sleep(0.005)
    for p in procs:
        os.killpg(p.pid, signal.SIGKILL)
    for p in procs:
        p.communicate(timeout=60)  # reaps it and closes its pipe
    logs = {r: _log(run_dir, r) for r in range(world)}
    steps = [
        int(p.name.split("-")[1])
        for p in run_dir.glob("ckpt-*-rank0.json")
        if all((run_dir / p.name.replace("rank0", f"rank{r}")).exists() for r in range(world))
    ]
    resumed_from = max(steps)
    assert resumed_from >= EVERY
    for r in range(world):
        (run_dir / f"ids-rank{r}.jsonl").rename(run_dir / f"killed-rank{r}.jsonl")
    return logs, resumed_from


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["distributed", "mixture", "buckets"])
def test_killed_and_resumed_training_sees_exactly_the_uninterrupted_samples(kind, tmp_path):
    straight_dir = tmp_path / "straight"
    straight_dir.mkdir()
    _wait(_launch(kind, straight_dir))
    straight = {r: [e["ids"] for e in _log(straight_dir, r)] for r in range(WORLD)}
    total = len(straight[0])
    assert total > 4 * EVERY and all(len(v) == total for v in straight.values())

    run_dir = tmp_path / "killed"
    run_dir.mkdir()
    kill_at = random.Random(kind).randrange(EVERY + 1, total - 2)
    first, resumed_from = _kill(kind, run_dir, WORLD, kill_at)
    _wait(_launch(kind, run_dir))
    for r in range(WORLD):
        second = _log(run_dir, r)
        assert second[0]["step"] == resumed_from + 1
        trained = [e["ids"] for e in first[r] if e["step"] <= resumed_from]
        trained += [e["ids"] for e in second]
        assert trained == straight[r], f"rank {r}: the resumed run differs"


def _uninterrupted(kind: str, world: int) -> list[list[tuple[int, list[int]]]]:
    """Each rank's ``(epoch, ids)`` batches of an uninterrupted run on ``world`` processes: the
    job's loader with explicit ranks, in this process."""
    setup: dict = {}
    exec(_SETUP, setup)
    out = []
    for rank in range(world):
        loader = setup["make_loader"](kind, num_workers=0, num_replicas=world, rank=rank)
        batches = []
        while loader.epoch < EPOCHS:
            batches += [(loader.epoch, b.tolist()) for b in loader]
        out.append(batches)
    return out


def _epoch_items(kind: str, ranks: list[list[tuple[int, list[int]]]], epoch: int) -> list:
    """The sampler's items in ``epoch`` of each rank's ``(epoch, ids)`` batches: ids for an
    index sampler, batches (as tuples) for the bucket sampler."""
    batches = [ids for rank in ranks for e, ids in rank if e == epoch]
    if kind == "buckets":
        return [tuple(b) for b in batches]
    return [i for b in batches for i in b]


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["distributed", "mixture", "buckets"])
def test_killed_on_4_processes_and_resumed_on_3_covers_the_epoch(kind, tmp_path):
    straight = _uninterrupted(kind, 4)
    total = len(straight[0])
    assert total > 4 * EVERY and all(len(v) == total for v in straight)
    # No checkpoint falls on the end of an epoch: the restart always continues one mid-way.
    assert total // EPOCHS % EVERY
    kill_at = random.Random(f"elastic-{kind}").randrange(EVERY + 1, total - 2)
    first, resumed_from = _kill(kind, tmp_path, 4, kill_at)
    saved = json.loads((tmp_path / f"ckpt-{resumed_from}-rank0.json").read_text())["loader"]
    _wait(_launch(kind, tmp_path, 3))
    second = [[(e["epoch"], e["ids"]) for e in _log(tmp_path, r)] for r in range(3)]

    # Up to its checkpoint, the killed run is the uninterrupted one; the restart follows it.
    before = []
    for r in range(4):
        trained = [(e["epoch"], e["ids"]) for e in first[r] if e["step"] <= resumed_from]
        assert trained == straight[r][:resumed_from], f"rank {r} differs before the kill"
        before.append(trained)
    assert all(_log(tmp_path, r)[0]["step"] == resumed_from + 1 for r in range(3))
    # The new ranks yield equal numbers of batches in each epoch (else DDP would hang).
    counts = [Counter(e for e, _ in rank) for rank in second]
    assert counts[0] == counts[1] == counts[2] and max(counts[0]) == EPOCHS - 1

    whole_on_3 = _uninterrupted(kind, 3)
    for epoch in range(saved["epoch"]):  # before the checkpoint's epoch: the 4 ranks' own
        assert Counter(_epoch_items(kind, before, epoch)) == Counter(
            _epoch_items(kind, straight, epoch)
        )
    for epoch in range(saved["epoch"] + 1, EPOCHS):  # after it: whole epochs on 3 ranks
        assert Counter(_epoch_items(kind, second, epoch)) == Counter(
            _epoch_items(kind, whole_on_3, epoch)
        )
    # The epoch of the checkpoint: what the 4 ranks trained, then its rest dealt to 3 ranks.
    epoch = saved["epoch"]
    old, new = _epoch_items(kind, before, epoch), _epoch_items(kind, second, epoch)
    full = Counter(_epoch_items(kind, straight, epoch))
    got = Counter(old) + Counter(new)
    assert old and new
    if kind != "mixture":
        # Nothing lost, nothing trained before comes again; torch's padding repeats fewer
        # than 3 items of the rest's head.
        assert set(got) == set(full), f"{len(set(full) - set(got))} items lost"
        assert not (set(old) & set(new)), "items trained before the kill came again"
        rest = len(full) - len(set(old))
        assert len(new) == -(-rest // 3) * 3
    else:
        # The mixture's oversampled dataset comes twice an epoch: the uninterrupted epoch's
        # multiset (each pass as it was), less (drop_last) fewer than 3 items of the rest.
        rest = sum(full.values()) - len(old)
        assert len(new) == rest // 3 * 3
        assert not (got - full)
        assert sum((full - got).values()) == rest % 3
    # The restart's checkpoints of that epoch record the world it began on.
    for path in tmp_path.glob("ckpt-*-rank0.json"):
        ckpt = json.loads(path.read_text())
        if ckpt["world"] == 3 and ckpt["loader"]["epoch"] == epoch:
            assert ckpt["loader"]["sampler"]["elastic"]["origin_num_replicas"] == 4
