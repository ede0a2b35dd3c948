"""ChunkSampler and croupier.compat.annbatch: contiguous slices, batches inside what was
loaded, every observation once per epoch, equal batch counts across ranks, annbatch's shards
and rounding, determinism, resume at every request and batch, bad input."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from croupier import ChunkSampler, StateError
from croupier.compat.annbatch import DistributedSampler, RandomSampler
from croupier.samplers.chunk import read_request


def _epoch(sampler, n_obs):
    """The epoch's batches as observation ids, checking each request on the way."""
    batches = []
    for req in sampler.sample(n_obs):
        loaded = []
        for s in req["slices"]:
            assert isinstance(s, slice) and s.step is None
            assert 0 <= s.start < s.stop <= n_obs
            assert s.stop - s.start <= sampler.chunk_size
            loaded.extend(range(s.start, s.stop))
        for split in req["splits"]:
            assert split.ndim == 1 and len(split) <= sampler.batch_size
            assert int(split.min()) >= 0 and int(split.max()) < len(loaded)  # inside the load
            batches.append([loaded[p] for p in split.tolist()])
    return batches


@settings(max_examples=80)
@given(
    n_obs=st.integers(0, 700),
    chunk=st.integers(1, 40),
    preload=st.integers(1, 4),
    per_batch=st.integers(1, 5),
    w=st.integers(1, 7),
    drop_last=st.booleans(),
    shuffle=st.booleans(),
)
def test_ranks_cover_the_epoch_in_equal_batch_counts(
    n_obs, chunk, preload, per_batch, w, drop_last, shuffle
):
    # batch_size divides chunk * preload: choose it among the divisors.
    memory = chunk * preload
    divisors = [d for d in range(1, memory + 1) if memory % d == 0]
    batch_size = divisors[per_batch % len(divisors)]
    samplers = [
        ChunkSampler(
            chunk,
            preload,
            batch_size,
            shuffle=shuffle,
            drop_last=drop_last,
            seed=4,
            num_replicas=w,
            rank=r,
        )
        for r in range(w)
    ]
    epochs = [_epoch(s, n_obs) for s in samplers]
    counts = {len(e) for e in epochs}
    assert counts == {samplers[0].n_iters(n_obs)}, "every rank yields the same batch count"
    flat = [i for e in epochs for b in e for i in b]
    batches = samplers[0].n_iters(n_obs)
    if drop_last:
        assert len(flat) == len(set(flat)), "nothing repeats when dropping"
        assert len(flat) == w * batches * batch_size, "whole batches only"
        # What is dropped: the chunks past a multiple of W, and less than a chunk plus a
        # batch on each rank.
        assert n_obs - len(flat) < w * chunk + w * (chunk + batch_size)
    else:
        assert set(flat) == set(range(n_obs)), "every observation is read"
        whole = -(-n_obs // chunk) % w == 0 and n_obs % chunk == 0
        if whole and all(len(e) * batch_size == n_obs // w for e in epochs):
            assert len(flat) == n_obs  # nothing to pad: exactly once


def test_without_shuffle_the_epoch_is_in_order():
    s = ChunkSampler(10, 3, 5, shuffle=False, num_replicas=1, rank=0)
    assert [i for b in _epoch(s, 95) for i in b] == list(range(95))
    reqs = list(s.sample(95))
    assert [r["slices"] for r in reqs][-1] == [slice(90, 95)]


def test_deterministic_per_seed_and_epoch():
    def run(seed, epoch):
        s = ChunkSampler(16, 2, 8, seed=seed, num_replicas=3, rank=1)
        s.set_epoch(epoch)
        return _epoch(s, 1000)

    assert run(1, 0) == run(1, 0)
    assert run(1, 0) != run(1, 1) and run(1, 0) != run(2, 0)
    again = ChunkSampler(16, 2, 8, seed=1, num_replicas=3, rank=1)
    assert _epoch(again, 1000) == _epoch(again, 1000), "sampling again repeats the epoch"


@pytest.mark.parametrize("drop_last", [False, True])
def test_resume_at_every_batch(drop_last):
    def make():
        return ChunkSampler(12, 2, 6, seed=3, num_replicas=2, rank=1, drop_last=drop_last)

    n_obs = 250
    full = _epoch(make(), n_obs)
    for b in range(len(full) + 1):
        s = make()
        s.sample(n_obs)  # a sampler that has seen n_obs
        state = {**s.state_dict(), "position": b, "n_obs": n_obs}
        resumed = make()
        resumed.load_state_dict(json.loads(json.dumps(state)))
        assert full[:b] + _epoch(resumed, n_obs) == full, f"resumed at batch {b}"


def test_state_while_iterating_counts_whole_requests():
    s = ChunkSampler(10, 2, 5, seed=0, num_replicas=1, rank=0)
    it = s.sample(100)
    assert s.state_dict()["position"] == 0
    next(it)
    assert s.state_dict()["position"] == 4
    state = s.state_dict()
    rest = [b for req in it for b in req["splits"]]
    resumed = ChunkSampler(10, 2, 5, seed=0, num_replicas=1, rank=0)
    resumed.load_state_dict(state)
    assert [b.tolist() for req in resumed.sample(100) for b in req["splits"]] == [
        b.tolist() for b in rest
    ]
    assert s.state_dict()["position"] == s.n_iters(100)


def test_bad_states_and_data_changes_are_refused():
    s = ChunkSampler(10, 2, 5, seed=0, num_replicas=2, rank=0)
    list(s.sample(100))
    good = s.state_dict()
    for bad, error in [
        ({**good, "seed": 1}, StateError),
        ({**good, "num_replicas": 3}, StateError),
        ({**good, "position": 10**6}, StateError),
        ({**good, "epoch": -1}, StateError),
        ({**good, "position": 1.5}, TypeError),
        ([1, 2], TypeError),
    ]:
        with pytest.raises(error):
            s.load_state_dict(bad)
    s.load_state_dict({**good, "position": 3})
    with pytest.raises(ValueError, match="data changed"):
        s.sample(120)


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="multiple of batch_size"):
        ChunkSampler(10, 3, 4)
    for name, args in [("chunk_size", (0, 1, 1)), ("preload_nchunks", (1, 0, 1))]:
        with pytest.raises(ValueError, match=name):
            ChunkSampler(*args)
    with pytest.raises(ValueError, match="batch_size"):
        ChunkSampler(4, 1, 0)
    with pytest.raises(TypeError, match="shuffle"):
        ChunkSampler(4, 1, 2, shuffle="yes")
    with pytest.raises(ValueError, match="rank"):
        ChunkSampler(4, 1, 2, num_replicas=2, rank=2)
    with pytest.raises(TypeError, match="mask"):
        ChunkSampler(4, 1, 2, mask=(0, 3))
    s = ChunkSampler(4, 1, 2, mask=slice(5, 50))
    with pytest.raises(ValueError, match="mask"):
        s.validate(20)
    with pytest.raises(ValueError, match="n_obs"):
        s.n_iters(-1)


def test_reading_a_memmap_with_the_requests(tmp_path):
    data = np.lib.format.open_memmap(
        tmp_path / "x.npy", mode="w+", dtype=np.float32, shape=(500, 3)
    )
    data[:] = np.arange(1500, dtype=np.float32).reshape(500, 3)
    data.flush()
    arr = np.load(tmp_path / "x.npy", mmap_mode="r")
    s = ChunkSampler(32, 4, 16, seed=2, num_replicas=1, rank=0)
    rows = []
    for req in s.sample(len(arr)):
        for batch in read_request(arr, req):
            rows.extend(batch[:, 0].astype(int).tolist())
    assert sorted(rows) == list(range(0, 1500, 3))


# -- croupier.compat.annbatch -------------------------------------------------------------


def test_annbatch_random_sampler_protocol_and_keys():
    s = RandomSampler(chunk_size=16, preload_nchunks=4, batch_size=32, rng=np.random.default_rng(0))
    assert s.shuffle and s.batch_size == 32 and s.mask == slice(0, None)
    first = list(s.sample(1000))
    assert set(first[0]) == {"requests", "chunks", "splits"}
    assert first[0]["requests"] is first[0]["chunks"]
    second = list(s.sample(1000))
    key = [[b.tolist() for b in r["splits"]] for r in first]
    assert key != [[b.tolist() for b in r["splits"]] for r in second], "a new order per call"
    assert s.n_iters(1000) == -(-1000 // 32)


@pytest.mark.parametrize("enforce", [True, False])
def test_annbatch_distributed_shards_are_contiguous_and_rounded(enforce):
    n_obs, world, batch = 1003, 4, 32
    per_rank = n_obs // world
    if enforce:
        per_rank -= per_rank % batch
    counts, seen = set(), []
    for rank in range(world):
        inner = RandomSampler(16, 4, batch, rng=np.random.default_rng(rank))
        ds = DistributedSampler(
            inner, dist_info=lambda rank=rank: (rank, world), enforce_equal_batches=enforce
        )
        batches = [
            [i for s in req["requests"] for i in range(s.start, s.stop)] for req in ds.sample(n_obs)
        ]
        ids = {i for b in batches for i in b}
        assert ids == set(range(rank * per_rank, (rank + 1) * per_rank))
        assert ds.mask == slice(rank * per_rank, (rank + 1) * per_rank)
        counts.add(ds.n_iters(n_obs))
        seen.extend(ids)
    assert len(seen) == len(set(seen))
    if enforce:
        assert counts == {per_rank // batch}
    with pytest.raises(ValueError, match="Unknown dist_info"):
        DistributedSampler(RandomSampler(16, 4, 32), dist_info="mpi")
