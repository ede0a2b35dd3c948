"""croupier inside the trainers people use: Lightning, Accelerate and the Hugging Face Trainer.

The multi-process tests run each framework for real, 2 CPU processes over gloo on 127.0.0.1,
with croupier's samplers passed as the framework's docs (and docs/trainers.md) say, record the
ids every rank trained on, and compare them batch for batch with what the samplers yield
(``trainers/common.py``): every sample of every epoch per the sampler's rules, a new order each
epoch, and after a run stopped (mid-way through the second epoch, or right after the first
epoch's last batch) and resumed from the framework's own checkpoint, exactly the batches the
uninterrupted run trains; with loader worker processes and gradient accumulation too. The
in-process tests check the pieces: the types frameworks test for, the loud refusals of the
unsafe paths, the loader's epoch.
"""

from __future__ import annotations

import os
import socket
import sys
from collections import Counter

import pytest

torch = pytest.importorskip("torch")  # before the runners' module, which imports it

from trainers.common import N, batches_in, batches_per_epoch, expected, recorded  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
WORLD = 2


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run(
    framework: str,
    out: str,
    *args: str,
    world: int = WORLD,
    env: dict[str, str] | None = None,
    own_launcher: bool = False,
) -> None:
    """Runs a framework's runner on ``world`` processes, started as torchrun starts its workers
    (``trainers/launch.py``: the same variables, ``env://`` rendezvous on 127.0.0.1), each
    framework taking them for torchrun's, Lightning too. A failing rank stops the others.
    ``own_launcher``: Lightning starts its other processes itself, from one ``python`` run
    of the script (``devices=world``), as a user's ``python train.py`` does."""
    import subprocess
    import tempfile

    from trainers.launch import launch

    script = os.path.join(HERE, "trainers", f"run_{framework}.py")
    env = {
        **os.environ,
        **(env or {}),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(_port()),
        "OMP_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "PYTHONWARNINGS": "ignore",
    }
    argv = ["--out", out, *args]
    if framework == "lightning":
        argv += ["--devices", str(world)]
    if own_launcher:
        assert framework == "lightning", "only Lightning starts its own processes"
        run = subprocess.run(
            [sys.executable, script, *argv], env=env, capture_output=True, text=True, timeout=600
        )
        assert run.returncode == 0, (run.stdout + run.stderr)[-9000:]
        return
    with tempfile.TemporaryDirectory() as logs:
        code, output = launch(script, argv, env, world, logs, timeout=600)
    assert code == 0, output


def _check(kind: str, out: str) -> None:
    """Every rank trained exactly the sampler's batches of both epochs, in order."""
    for rank in range(WORLD):
        want = expected(kind, WORLD, rank)
        got = recorded(out, rank)
        assert got == want, f"rank {rank}: {len(got)} batches trained, {len(want)} expected"
    per_epoch = batches_per_epoch(kind, WORLD)
    first = [b for r in range(WORLD) for b in expected(kind, WORLD, r, 1)]
    both = [b for r in range(WORLD) for b in expected(kind, WORLD, r)]
    assert both[:per_epoch] != both[per_epoch : 2 * per_epoch]  # reshuffled
    if kind in ("distributed", "loader"):
        # Every id once per epoch (DistributedSampler pads none here: N divides evenly).
        assert sorted(i for b in first for i in b) == list(range(N))
    if kind == "buckets":  # every id; padding repeats fewer than W whole batches
        ids = Counter(i for b in first for i in b)
        assert set(ids) == set(range(N))
        assert sum(ids.values()) - N <= max(len(b) for b in first) * (WORLD - 1)
    if kind == "mixture":  # 200 positions per rank (the datasets' shares), all in range
        ids = Counter(i for b in first for i in b)
        assert sum(ids.values()) == N and max(ids) < N


# -- multi-process runs with the real packages ------------------------------------------------

# One run per distinct wiring (issue 43: the runs that repeated a wiring with another sampler
# became the in-process tests below and the samplers' own resume tests). Each resume test
# checks every batch of both epochs against the sampler's, so it proves coverage and the
# reshuffle too (the first part of each is a plain run through the first epoch).
RESUMES = [
    # (framework, kind, where part1 stops: "mid" in the second epoch or at the "end" of the
    # first, extra args): stopped there, resumed from the framework's checkpoint.
    # Lightning: croupier's loader with workers and accumulation; a stateful sampler in
    # Lightning's own loader (its fit loop saves it); a batch sampler at an epoch's end.
    ("lightning", "loader", "mid", ("--workers", "2", "--accum", "2")),
    ("lightning", "mixture", "mid", ("--stateful",)),
    ("lightning", "buckets", "end", ("--stateful", "--workers", "2")),
    # Accelerate: a sampler through prepare() with workers and accumulation; a batch sampler;
    # croupier's loader at an epoch's end.
    ("accelerate", "distributed", "mid", ("--workers", "2", "--accum", "2")),
    ("accelerate", "buckets", "mid", ()),
    ("accelerate", "loader", "end", ()),
    # The HF Trainer: a sampler with workers and accumulation; a batch sampler with an
    # accumulation that does not divide the epoch; croupier's loader at an epoch's end.
    ("transformers", "distributed", "mid", ("--workers", "2", "--accum", "2")),
    ("transformers", "buckets", "mid", ("--accum", "3")),
    ("transformers", "loader", "end", ("--workers", "2")),
]


def _needs(framework: str) -> None:
    pytest.importorskip({"transformers": "transformers"}.get(framework, framework))


@pytest.mark.slow
@pytest.mark.parametrize(("framework", "kind", "where", "extra"), RESUMES)
def test_a_stopped_run_resumes_exactly(framework, kind, where, extra, tmp_path):
    _needs(framework)
    if framework == "transformers":
        pytest.importorskip("accelerate")
    accum = int(extra[extra.index("--accum") + 1]) if "--accum" in extra else 1
    per_epoch = -(-batches_per_epoch(kind, WORLD) // accum)  # optimizer steps
    steps = per_epoch + 4 if where == "mid" else per_epoch
    out = str(tmp_path)
    _run(framework, out, "--kind", kind, "--stage", "part1", "--steps", str(steps), *extra)
    trained = batches_in(kind, WORLD, steps, accum)
    assert all(len(recorded(out, r)) == trained for r in range(WORLD))
    _run(framework, out, "--kind", kind, "--stage", "part2", *extra)
    _check(kind, out)


@pytest.mark.slow
def test_a_run_lightning_starts_by_itself_resumes_exactly(tmp_path):
    """``python train.py`` with ``devices=2``: Lightning's own launcher runs the script again
    for the second process (the other tests start the ranks as torchrun does). Stopped in the
    second epoch and resumed from Lightning's checkpoint: every batch of both epochs."""
    _needs("lightning")
    kind, out = "mixture", str(tmp_path)
    steps = batches_per_epoch(kind, WORLD) + 4
    _run("lightning", out, "--kind", kind, "--stage", "part1", "--steps", str(steps),
         "--stateful", own_launcher=True)  # fmt: skip
    assert all(len(recorded(out, r)) == steps for r in range(WORLD))
    _run("lightning", out, "--kind", kind, "--stage", "part2", "--stateful", own_launcher=True)
    _check(kind, out)


# Batches each of the 2 ranks trains in the first epoch before the stop: the rest of the
# epoch (400 - 2 * 9 * 8 = 256 ids) divides by neither 3 ranks nor the batch of 8.
ELASTIC_STEPS = 9
ELASTIC = [  # (framework, kind, processes of the resumed run): one grows, one shrinks
    ("lightning", "loader", 3),
    ("accelerate", "distributed", 1),
    ("transformers", "distributed", 1),  # refused: the HF Trainer counts the old world's steps
]


def _entry_points(tmp_path) -> dict[str, str]:
    """A ``PYTHONPATH`` under which croupier's entry points, as ``pyproject.toml`` declares
    them, are installed (croupier on the path as a source tree has none): what an installed
    croupier gives Lightning."""
    import tomllib

    with open(os.path.join(os.path.dirname(HERE), "pyproject.toml"), "rb") as f:
        groups = tomllib.load(f)["project"]["entry-points"]
    info = tmp_path / "entry_points" / "croupier_entry_points-0.dist-info"
    info.mkdir(parents=True)
    metadata = "Metadata-Version: 2.1\nName: croupier-entry-points\nVersion: 0\n"
    (info / "METADATA").write_text(metadata)
    (info / "entry_points.txt").write_text(
        "".join(
            f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in names.items()) + "\n"
            for group, names in groups.items()
        )
    )
    path = [str(info.parent), os.environ.get("PYTHONPATH", "")]
    return {"PYTHONPATH": os.pathsep.join(p for p in path if p)}


def _rest(kind: str, world: int, rank: int) -> list[list[int]]:
    """The batches ``rank`` of ``world`` trains in the rest of the first epoch, after WORLD
    ranks trained ELASTIC_STEPS batches each: the sampler's own elastic resume, batched."""
    from trainers.common import BATCH, sampler

    old = sampler(kind, WORLD, 0)
    it = iter(old)
    for _ in range(ELASTIC_STEPS * BATCH):
        next(it)
    new = sampler(kind, world, rank)
    new.load_state_dict(old.state_dict())
    ids = list(new)
    assert len(new) == ELASTIC_STEPS * BATCH + len(ids)  # the len rule
    return [ids[i : i + BATCH] for i in range(0, len(ids), BATCH)]


def _check_elastic(kind: str, out: str, before: list[list[list[int]]], world: int) -> None:
    """The resumed run on ``world`` ranks trained the rest of the first epoch (every id of it
    once, but torch's padding of the rest over ``world``), then the second epoch exactly as an
    uninterrupted run on ``world`` ranks trains it, batch for batch."""
    from trainers.common import BATCH

    per_epoch = batches_per_epoch(kind, world)
    rests = []
    for rank in range(world):
        got = recorded(out, rank)
        rest = _rest(kind, world, rank)
        second = expected(kind, world, rank)[per_epoch:]
        assert got[: len(rest)] == rest, f"rank {rank}: the rest of the first epoch"
        assert got[len(rest) :] == second, f"rank {rank}: the second epoch"
        rests += rest
    ids = Counter(i for batches in before for b in batches for i in b)
    ids.update(i for b in rests for i in b)
    assert set(ids) == set(range(N))  # nothing lost
    remaining = N - WORLD * ELASTIC_STEPS * BATCH
    assert sum(ids.values()) - N == -(-remaining // world) * world - remaining  # padding only


@pytest.mark.slow
@pytest.mark.parametrize(("framework", "kind", "world"), ELASTIC)
def test_a_run_stopped_mid_epoch_resumes_on_another_number_of_ranks(
    framework, kind, world, tmp_path
):
    """Stopped in the first epoch on 2 ranks and resumed from the framework's checkpoint on 1
    or 3: the rest of the epoch, then the new world's epochs (Lightning with croupier's
    callback from its entry point, Accelerate from the loader state ``save_state`` keeps). The
    HF Trainer counts its progress in optimizer steps of the old world: it is refused."""
    _needs(framework)
    if framework == "transformers":
        pytest.importorskip("accelerate")
    out = str(tmp_path)
    extra = ("--elastic",) if framework == "accelerate" else ()
    env = _entry_points(tmp_path) if framework == "lightning" else None
    steps = ("--steps", str(ELASTIC_STEPS))
    _run(framework, out, "--kind", kind, "--stage", "part1", *steps, *extra, env=env)
    before = [recorded(out, rank) for rank in range(WORLD)]
    assert [len(b) for b in before] == [ELASTIC_STEPS] * WORLD
    for rank in range(WORLD):
        os.remove(os.path.join(out, f"rank{rank}.jsonl"))
    part2 = ("--kind", kind, "--stage", "part2", *extra)
    if framework == "transformers":
        with pytest.raises(AssertionError, match=f"saved on 2 processes, resumed on {world}"):
            _run(framework, out, *part2, world=world)
        assert all(recorded(out, rank) == [] for rank in range(world))  # nothing trained
        return
    _run(framework, out, *part2, world=world, env=env)
    _check_elastic(kind, out, before, world)


@pytest.mark.slow
def test_a_batch_sampler_in_a_plain_dataloader_is_refused_loudly_by_lightning(tmp_path):
    """Lightning re-creates a plain DataLoader's batch sampler around its own sampler: the run
    fails with croupier's message naming the two ways out, instead of dealing twice."""
    _needs("lightning")
    with pytest.raises(AssertionError, match="already rank-aware: pass it in a croupier"):
        _run("lightning", str(tmp_path), "--kind", "buckets")


@pytest.mark.slow
def test_plain_accelerate_prepare_is_refused_loudly(tmp_path):
    """Without croupier's prepare, Accelerate would train each rank on half its share: the
    sampler refuses to be iterated that way, and the run fails with croupier's message."""
    _needs("accelerate")
    with pytest.raises(AssertionError, match="sharded a second time by accelerate"):
        _run("accelerate", str(tmp_path), "--kind", "distributed", "--plain")


# -- the pieces, in one process ------------------------------------------------------------------


def test_rank_aware_samplers_are_torch_distributed_samplers():
    """Lightning shards again any sampler that is not a torch DistributedSampler: croupier's
    index samplers are one (torch's constructor never runs: no process group needed, no
    attribute of torch's overrides croupier's), as is the sampler a StatefulDataLoader over a
    batch sampler shows."""
    import croupier
    from croupier.loader import StatefulDataLoader
    from trainers.common import Ids, lengths

    DS = torch.utils.data.DistributedSampler
    d = croupier.DistributedSampler(N, num_replicas=2, rank=1, seed=3)
    m = croupier.MixtureSampler([0, 150, N], [1.0, 2.0], num_replicas=2, rank=1)
    assert isinstance(d, DS) and isinstance(m, DS)
    assert (d.num_replicas, d.rank, d.num_samples, d.total_size, d.epoch) == (2, 1, 200, 400, 0)
    assert (m.num_samples, m.total_size) == (200, 400)
    d.set_epoch(4)
    assert d.epoch == 4 and list(d) == d.indices().tolist()
    b = croupier.BucketBatchSampler(lengths(), 8, num_replicas=2, rank=1)
    assert b.sampler is b  # frameworks pass the epoch on through batch_sampler.sampler
    loader = StatefulDataLoader(Ids(), batch_size=None, sampler=b)
    assert isinstance(loader.sampler, DS)
    loader.sampler.set_epoch(3)
    assert b.epoch == 3 and (loader.sampler.num_replicas, loader.sampler.rank) == (2, 1)
    twin = croupier.BucketBatchSampler(lengths(), 8, num_replicas=2, rank=1)
    twin.set_epoch(3)
    want = [i for batch in twin for i in batch]
    assert list(loader.sampler) == want and len(loader.sampler) == len(want)
    # Reading the view leaves a pending resume position where it was.
    b.set_skip(2)
    assert list(loader.sampler) == [i for batch in list(twin)[2:] for i in batch]
    assert b.state_dict()["position"] == 2


def test_a_batch_sampler_recreated_around_a_sampler_is_refused():
    """Lightning (use_distributed_sampler=True) re-creates a batch sampler as
    cls(DistributedSampler(dataset), batch_size=..., drop_last=...): croupier's batch samplers
    say what happened and what to do, instead of a confusing type error."""
    import croupier

    inner = torch.utils.data.DistributedSampler(range(10), num_replicas=2, rank=0)
    with pytest.raises(TypeError, match=r"re-creating it .*use_distributed_sampler=False"):
        croupier.BucketBatchSampler(inner, batch_size=8, drop_last=False)
    with pytest.raises(TypeError, match=r"re-creating it .*StatefulDataLoader"):
        croupier.SequentialBucketSampler(inner, base_batch_size=8, drop_last=False)


def test_a_second_sharding_by_accelerate_is_refused():
    """Accelerate's BatchSamplerShard over several processes would give each rank a fraction
    of its share: iterating a croupier sampler through it raises, naming the fix; the
    pass-through croupier's prepare makes is accepted."""
    accelerate = pytest.importorskip("accelerate.data_loader")
    import croupier

    s = croupier.DistributedSampler(N, num_replicas=2, rank=0)
    shard = accelerate.BatchSamplerShard(
        torch.utils.data.BatchSampler(s, 8, False), num_processes=2, process_index=0
    )
    with pytest.raises(RuntimeError, match=r"croupier.integrations.accelerate.prepare"):
        next(iter(shard))
    b = croupier.BucketBatchSampler(list(range(1, 50)), 4, num_replicas=2, rank=0)
    with pytest.raises(RuntimeError, match="sharded a second time"):
        next(iter(accelerate.BatchSamplerShard(b, num_processes=2, process_index=1)))
    shard.num_processes = 1
    assert [i for batch in shard for i in batch] == s.indices().tolist()
    one = croupier.DistributedSampler(N, num_replicas=1, rank=0)  # a single-rank sampler: fine
    two = accelerate.BatchSamplerShard(torch.utils.data.BatchSampler(one, 8, False), 2, 1)
    assert len(list(two)) == 25


@pytest.mark.parametrize("workers", [0, 2])
def test_the_loader_moves_on_after_its_last_batch_even_if_not_asked_for_more(workers):
    """Trainers stop after len(loader) batches and never drive the iterator to its end
    (Lightning, the HF Trainer): the epoch is done when its last batch is handed out, so the
    next iteration, and a checkpoint taken meanwhile, start the next epoch; an epoch set on the
    sampler directly (Lightning's set_epoch reaches loader.sampler) is followed."""
    import croupier
    from croupier.loader import StatefulDataLoader
    from trainers.common import Ids

    def make():
        s = croupier.DistributedSampler(N, num_replicas=2, rank=0, seed=3)
        kw = {"num_workers": workers, "multiprocessing_context": "fork"} if workers else {}
        return s, StatefulDataLoader(Ids(), batch_size=8, sampler=s, **kw)

    s, loader = make()
    epochs = []
    for e in range(3):
        it = iter(loader)
        epochs.append([next(it)["ids"].tolist() for _ in range(len(loader))])
        state = loader.state_dict()
        assert (state["epoch"], state["batches_yielded"]) == (e + 1, 0)
        assert loader.epoch == e  # the last batch is still out
        del it
        assert loader.epoch == e + 1
    for e, got in enumerate(epochs):
        s.set_epoch(e)
        ids = s.indices().tolist()
        assert got == [ids[i : i + 8] for i in range(0, len(ids), 8)]
    # An epoch set on the sampler itself, mid-way through the loader's: that epoch, whole.
    s, loader = make()
    it = iter(loader)
    next(it)
    del it
    s.set_epoch(5)
    got = [b["ids"].tolist() for b in loader]
    ids = s.indices().tolist()
    assert got == [ids[i : i + 8] for i in range(0, len(ids), 8)]
    assert loader.state_dict()["epoch"] == 6
    # An epoch set before the loader was built is where it starts.
    s = croupier.DistributedSampler(N, num_replicas=2, rank=0, seed=3)
    s.set_epoch(5)
    loader = StatefulDataLoader(Ids(), batch_size=8, sampler=s)
    assert loader.epoch == 5 and next(iter(loader))["ids"].tolist() == s.indices()[:8].tolist()


def test_the_epoch_reaches_a_batch_sampler_through_the_loaders_sampler():
    """Lightning passes the epoch to loader.sampler (and loader.batch_sampler.sampler): a
    StatefulDataLoader over a batch sampler follows it."""
    import croupier
    from croupier.loader import StatefulDataLoader
    from trainers.common import Ids, lengths

    b = croupier.BucketBatchSampler(lengths(), 8, num_replicas=2, rank=0, seed=1)
    loader = StatefulDataLoader(Ids(), batch_size=None, sampler=b)
    for epoch in (0, 1, 4):
        loader.sampler.set_epoch(epoch)
        loader.batch_sampler.sampler.set_epoch(epoch)
        twin = croupier.BucketBatchSampler(lengths(), 8, num_replicas=2, rank=0, seed=1)
        twin.set_epoch(epoch)
        assert [x["ids"].tolist() for x in loader] == list(twin)


@pytest.mark.parametrize("drop_last", [False, True])
def test_a_loader_rebuilt_around_its_batch_sampler_still_selects_the_epoch(drop_last):
    """The HF Trainer resumes a StatefulDataLoader from get_train_dataloader with Accelerate's
    skip_first_batches, a new torch DataLoader around ``loader.batch_sampler``, and passes the
    epoch to ``loader.batch_sampler.batch_sampler``: the epoch reaches croupier's sampler
    through it, and the rebuilt loader yields exactly the rest of that epoch."""
    data_loader = pytest.importorskip("accelerate.data_loader")
    import croupier
    from croupier.loader import StatefulDataLoader
    from trainers.common import Ids

    s = croupier.DistributedSampler(N - 3, num_replicas=2, rank=1, seed=3)
    loader = StatefulDataLoader(Ids(), batch_size=8, sampler=s, drop_last=drop_last)
    assert loader.batch_size == 8 and loader.drop_last is drop_last
    for epoch, skip in ((0, 0), (1, 7), (3, len(loader) - 1)):
        rebuilt = data_loader.skip_first_batches(loader, skip)
        rebuilt.batch_sampler.batch_sampler.set_epoch(epoch)
        assert s.epoch == epoch and loader.batch_sampler.epoch == epoch
        ids = s.indices().tolist()
        whole = [ids[i : i + 8] for i in range(0, len(ids), 8)]
        if drop_last:
            whole = [b for b in whole if len(b) == 8]
        assert [b["ids"].tolist() for b in rebuilt] == whole[skip:]
        assert len(whole) == len(loader)


def test_accelerates_wrapper_becomes_a_pass_through_or_is_refused():
    """croupier's prepare turns BatchSamplerShard into a pass-through that keeps
    num_processes and batch_size (Accelerate's total_batch_size, and gather_for_metrics'
    cut, read them); split_batches and dispatch_batches, which cannot serve a rank-aware
    sampler, are refused with the setting to change."""
    data_loader = pytest.importorskip("accelerate.data_loader")
    import croupier
    from croupier.integrations.accelerate import pass_through

    class Loader:
        def __init__(self, batch_sampler):
            self.batch_sampler = batch_sampler

    # Every index sampler is the same to Accelerate (a torch sampler it wraps): the
    # mixture (the trainer runs resume the distributed sampler) passes through alike.
    mixture = croupier.MixtureSampler([0, 150, N], [1.0, 2.0], num_replicas=2, rank=1, seed=2)
    for s in (croupier.DistributedSampler(N, num_replicas=2, rank=1, seed=2), mixture):
        shard = data_loader.BatchSamplerShard(
            torch.utils.data.BatchSampler(s, 8, False), num_processes=2, process_index=1
        )
        pass_through(Loader(shard))
        ids = s.indices().tolist()
        assert list(shard) == [ids[i : i + 8] for i in range(0, len(ids), 8)]
        assert len(shard) == 25 and (shard.num_processes, shard.batch_size) == (2, 8)
        assert shard.sampler is s
    split = data_loader.BatchSamplerShard(
        torch.utils.data.BatchSampler(s, 8, False), 2, 0, split_batches=True
    )
    with pytest.raises(ValueError, match="split_batches=True"):
        pass_through(Loader(split))

    class DataLoaderDispatcher(Loader):
        pass

    with pytest.raises(ValueError, match="dispatch_batches=False"):
        pass_through(DataLoaderDispatcher(torch.utils.data.BatchSampler(s, 8, False)))
    with pytest.raises(TypeError, match="no croupier sampler"):
        pass_through(Loader(torch.utils.data.BatchSampler(range(10), 2, False)))


def test_lightning_gets_croupiers_callback_from_its_entry_points():
    """pyproject.toml registers the callback with both Lightning packages' callbacks_factory
    groups; the factory gives a Lightning Callback, also importable by its name."""
    pytest.importorskip("lightning")
    import lightning.pytorch as pl
    import tomllib

    from croupier.integrations import lightning as integration

    with open(os.path.join(os.path.dirname(HERE), "pyproject.toml"), "rb") as f:
        groups = tomllib.load(f)["project"]["entry-points"]
    assert groups["lightning.pytorch.callbacks_factory"] == {
        "croupier": "croupier.integrations.lightning:callbacks"
    }
    assert "croupier" in groups["pytorch_lightning.callbacks_factory"]
    (callback,) = integration.callbacks()
    assert isinstance(callback, pl.Callback)
    assert isinstance(callback, integration.ElasticResume)


def test_accelerate_saves_the_loader_state_and_refuses_a_count_from_another_world():
    """croupier's prepare makes the prepared loader save croupier's loader state (Accelerate
    saves it with save_state: use_stateful_dataloader), exact at the batch handed out; a
    state from 2 ranks restored on 1 continues the epoch (len: the position plus the rest);
    skip_first_batches with the old world's count is refused, and on the same world it skips
    from the epoch's start (nothing skipped twice)."""
    pytest.importorskip("accelerate")
    from accelerate import Accelerator

    import croupier
    from croupier.integrations.accelerate import prepare
    from trainers.common import Ids

    acc = Accelerator(cpu=True)

    def prepared():
        s = croupier.DistributedSampler(N, num_replicas=1, rank=0, seed=3)
        return s, prepare(acc, torch.utils.data.DataLoader(Ids(), batch_size=8, sampler=s))

    _, loader = prepared()
    assert loader.use_stateful_dataloader
    it = iter(loader)
    for _ in range(5):
        next(it)
    state = loader.state_dict()
    assert (state["epoch"], state["batches_yielded"], state["sampler"]["position"]) == (0, 5, 40)
    del it
    old = croupier.DistributedSampler(N, num_replicas=2, rank=0, seed=3)
    old_it = iter(old)
    for _ in range(9 * 8):
        next(old_it)
    elastic = {"epoch": 0, "batches_yielded": 9, "sampler": old.state_dict()}
    _, loader = prepared()
    loader.load_state_dict(elastic)
    twin = croupier.DistributedSampler(N, num_replicas=1, rank=0, seed=3)
    twin.load_state_dict(old.state_dict())
    ids = list(twin)
    assert len(loader) == 9 + 32
    assert [b["ids"].tolist() for b in loader] == [ids[i : i + 8] for i in range(0, len(ids), 8)]
    assert loader.state_dict()["epoch"] == 1
    _, loader = prepared()
    loader.load_state_dict(elastic)
    with pytest.raises(ValueError, match=r"num_processes=2 on 1: .*without skip_first_batches"):
        next(iter(acc.skip_first_batches(loader, 9)))
    _, loader = prepared()
    loader.load_state_dict(state)  # the same world, 5 batches in
    ids = croupier.DistributedSampler(N, num_replicas=1, rank=0, seed=3).indices().tolist()
    whole = [ids[i : i + 8] for i in range(0, len(ids), 8)]
    assert [b["ids"].tolist() for b in acc.skip_first_batches(loader, 5)] == whole[5:]


def test_the_trainer_mixin_refuses_a_checkpoint_of_another_world(tmp_path):
    """The mixin's record of the number of processes (or the Trainer's per-process random
    states) against the resuming world: another number is refused, naming both."""
    from croupier.integrations.transformers import WORLD_FILE, _check_world

    ckpt = tmp_path / "checkpoint-9"
    ckpt.mkdir()
    for rank in range(2):
        (ckpt / f"rng_state_{rank}.pth").write_bytes(b"")
    _check_world(str(ckpt), 2)
    with pytest.raises(ValueError, match="saved on 2 processes, resumed on 3"):
        _check_world(str(ckpt), 3)
    (ckpt / WORLD_FILE).write_text('{"num_processes": 4}')
    with pytest.raises(ValueError, match="saved on 4 processes, resumed on 2"):
        _check_world(str(ckpt), 2)
    _check_world(str(tmp_path), 5)  # no record: nothing to compare
