"""A real kill and resume: 2 training processes on torch.distributed (gloo), each with a
StatefulDataLoader and 2 workers, checkpointing as they go, killed with SIGKILL at a random
batch, restarted from their last complete checkpoint. The sample ids trained across both runs
must be exactly those of an uninterrupted run: nothing lost, nothing repeated."""

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
from pathlib import Path

import pytest

pytest.importorskip("torch")

WORLD = 2
EPOCHS = 2
EVERY = 3  # batches between checkpoints

# The training job: `kind`, the run directory and the rendezvous port on the command line;
# rank and world size from the environment, as torchrun sets them.
_TRAIN = (
    textwrap.dedent(
        """
    import json, os, sys, time
    from pathlib import Path
    import numpy as np
    import torch.distributed as dist
    from torch.utils.data import Dataset
    from croupier import BucketBatchSampler, DistributedSampler, MixtureSampler
    from croupier import StatefulDataLoader

    kind, run_dir, port = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )

    class Ids(Dataset):
        def __len__(self):
            return 600
        def __getitem__(self, i):
            return i

    if kind == "distributed":
        loader = StatefulDataLoader(Ids(), 8, sampler=DistributedSampler(600, seed=3),
                                    num_workers=2)
    elif kind == "mixture":
        sampler = MixtureSampler([0, 100, 350, 600], [0.2, 0.5, 0.3], seed=3)
        loader = StatefulDataLoader(Ids(), 8, sampler=sampler, num_workers=2)
    else:
        lengths = np.random.default_rng(3).integers(1, 300, size=600)
        sampler = BucketBatchSampler(lengths, max_tokens=2000, buckets=6, seed=3)
        loader = StatefulDataLoader(Ids(), batch_sampler=sampler, num_workers=2)

    # Resume from the newest step both ranks finished saving.
    steps = [int(p.name.split("-")[1]) for p in run_dir.glob(f"ckpt-*-rank{rank}.json")]
    complete = [s for s in steps if all(
        (run_dir / f"ckpt-{s}-rank{r}.json").exists() for r in range(world))]
    step = 0
    if complete:
        step = max(complete)
        saved = json.loads((run_dir / f"ckpt-{step}-rank{rank}.json").read_text())
        loader.load_state_dict(saved["loader"])
    log = open(run_dir / f"ids-rank{rank}.jsonl", "a")
    while loader.epoch < EPOCHS:
        for batch in loader:
            step += 1
            log.write(json.dumps({"step": step, "ids": batch.tolist()}) + "\\n")
            log.flush()
            time.sleep(0.01)  # "training"
            if step % EVERY == 0:
                dist.barrier()
                tmp = run_dir / f"tmp-rank{rank}.json"
                tmp.write_text(json.dumps({"loader": loader.state_dict()}))
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


def _launch(kind: str, run_dir: Path) -> list[subprocess.Popen]:
    port = _port()
    procs = []
    for rank in range(WORLD):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(WORLD)}
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
    procs = _launch(kind, run_dir)
    deadline = time.monotonic() + 300
    while len(_log(run_dir, 0)) < kill_at:
        assert time.monotonic() < deadline and all(p.poll() is None for p in procs)
        time.sleep(0.005)
    for p in procs:
        os.killpg(p.pid, signal.SIGKILL)
    for p in procs:
        p.communicate(timeout=60)  # reaps it and closes its pipe
    first = {r: _log(run_dir, r) for r in range(WORLD)}
    steps = [
        int(p.name.split("-")[1])
        for p in run_dir.glob("ckpt-*-rank0.json")
        if (run_dir / p.name.replace("rank0", "rank1")).exists()
    ]
    resumed_from = max(steps)
    assert resumed_from >= EVERY
    for r in range(WORLD):  # what the resumed run repeats is what the killed run lost
        (run_dir / f"ids-rank{r}.jsonl").rename(run_dir / f"killed-rank{r}.jsonl")
    _wait(_launch(kind, run_dir))
    for r in range(WORLD):
        second = _log(run_dir, r)
        assert second[0]["step"] == resumed_from + 1
        trained = [e["ids"] for e in first[r] if e["step"] <= resumed_from]
        trained += [e["ids"] for e in second]
        assert trained == straight[r], f"rank {r}: the resumed run differs"
