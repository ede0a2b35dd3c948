"""ChunkSampler and croupier.compat.annbatch: contiguous slices, batches inside what was
loaded, every observation once per epoch, equal batch counts across ranks, annbatch's shards
and rounding, determinism, resume at every request and batch, bad input."""

from __future__ import annotations

import copy
import json
import pickle
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from croupier import ChunkSampler, StateError
from croupier.bench._systems import SYSTEMS
from croupier.cli import _parser
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


def test_value_stability_pin():
    # Deliberate pin of the chunk order since it became a keyed permutation evaluated per
    # position (0.2.0; the whole-list Fisher-Yates read slices 832:848 and 976:992 here). A
    # change here changes every user's read order: say so in CHANGELOG.md. The splits (the
    # in-memory order) are the ones the whole-list design gave: it did not change.
    s = ChunkSampler(16, 2, 8, seed=3, num_replicas=3, rank=1)
    s.set_epoch(1)
    first = next(iter(s.sample(1000)))
    assert first["slices"] == [slice(912, 928), slice(640, 656)]
    assert [b.tolist() for b in first["splits"]] == [
        [15, 8, 0, 5, 21, 19, 13, 24],
        [14, 11, 12, 27, 25, 2, 7, 6],
        [23, 26, 3, 29, 1, 30, 20, 16],
        [22, 31, 18, 4, 9, 17, 28, 10],
    ]


# A child process resumes a sampler near the end of an epoch and prints its first request.
_LATE_RESUME = textwrap.dedent(
    """
    import json, sys
    from croupier import ChunkSampler

    n_obs, back = int(sys.argv[1]), int(sys.argv[2])
    s = ChunkSampler(1024, 4, 256, seed=7, num_replicas=8, rank=5)
    total = s.n_iters(n_obs)
    s.load_state_dict({**s.state_dict(), "epoch": 3, "position": total - back, "n_obs": n_obs})
    req = next(iter(s.sample(n_obs)))
    print(json.dumps({
        "total": total,
        "slices": [[sl.start, sl.stop] for sl in req["slices"]],
        "splits": [b.tolist() for b in req["splits"]],
    }))
    """
)


def _run_with_timeout(args: list[str], seconds: float) -> str:
    """The stdout of ``python -c _LATE_RESUME *args``, failing the test (and killing the child)
    if it takes longer than ``seconds``: a design that lists the epoch's chunks would hang or
    run out of memory here, so it must fail, not stall the suite."""
    try:
        out = subprocess.run(
            [sys.executable, "-c", _LATE_RESUME, *args],
            capture_output=True,
            text=True,
            timeout=seconds,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"no first request within {seconds} s: is the resume O(chunks) again?")
    assert out.returncode == 0, out.stderr
    return out.stdout


@pytest.mark.parametrize("n_obs", [2**40, 2**62])
def test_resume_late_in_an_epoch_too_large_to_list(n_obs):
    # 2**30 and 2**52 chunks of 1024: a whole list of the chunk order (8 GiB and 32 PiB) was
    # what the first request used to wait for. Each request is now computed on its own, so a
    # resume 3 batches before the end yields at once (the timeout only catches a regression; no
    # time is asserted).
    back = 3
    result = json.loads(_run_with_timeout([str(n_obs), str(back)], seconds=60))
    assert result["total"] == n_obs // 1024 // 8 * (1024 // 256)  # chunks per rank * 4
    assert len(result["slices"]) == 4
    for start, stop in result["slices"]:
        assert start % 1024 == 0 and stop == start + 1024 and stop <= n_obs
    assert len({start for start, _ in result["slices"]}) == 4
    # The request's last `back` batches, each whole, inside what it loads.
    assert len(result["splits"]) == back
    assert all(len(b) == 256 and min(b) >= 0 and max(b) < 4096 for b in result["splits"])
    # The same request in this process (safe now that the child has shown it is quick):
    # deterministic across processes, and the one the last request of the epoch holds.
    s = ChunkSampler(1024, 4, 256, seed=7, num_replicas=8, rank=5)
    s.set_epoch(3)
    # The last request's 16 batches (4 chunks of 4).
    s.load_state_dict({**s.state_dict(), "position": result["total"] - 16, "n_obs": n_obs})
    last = next(iter(s.sample(n_obs)))
    assert [[sl.start, sl.stop] for sl in last["slices"]] == result["slices"]
    assert [b.tolist() for b in last["splits"][-back:]] == result["splits"]


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


def _batches(request):
    """One request's batches as observation ids (croupier's or annbatch's keys)."""
    slices = request["slices"] if "slices" in request else request["requests"]
    loaded = [i for sl in slices for i in range(sl.start, sl.stop)]
    return [[loaded[p] for p in split.tolist()] for split in request["splits"]]


def _pass(sampler, n_obs):
    """All batches of one sample() call as observation ids."""
    return [b for req in sampler.sample(n_obs) for b in _batches(req)]


def test_pickle_and_deepcopy_at_any_time():
    def make():
        return ChunkSampler(16, 4, 8, seed=1, num_replicas=2, rank=1)

    full = _epoch(make(), 1000)
    s = make()
    s.n_iters(1000)  # builds (and caches) the core's plan
    for clone in (pickle.loads(pickle.dumps(s)), copy.deepcopy(s)):
        assert clone.state_dict() == s.state_dict()
        assert _epoch(clone, 1000) == full
    # Mid-pass, a copy is a checkpoint: it continues where the pass is, and so does the original.
    it = s.sample(1000)
    first = _batches(next(it))
    clone = copy.deepcopy(s)
    assert clone.state_dict() == s.state_dict()
    # The copy also still knows the request handed out before it was made.
    assert clone.state_dict(batches_consumed=1) == s.state_dict(batches_consumed=1)
    assert clone.state_dict(batches_consumed=1)["position"] == 1
    assert first + _epoch(clone, 1000) == full
    assert first + [b for req in it for b in _batches(req)] == full


@pytest.mark.parametrize(("w", "drop_last"), [(1, False), (3, False), (3, True)])
def test_state_mid_request_resumes_at_every_batch(w, drop_last):
    def make():
        return ChunkSampler(12, 3, 4, seed=5, num_replicas=w, rank=w - 1, drop_last=drop_last)

    n_obs = 431
    full = _epoch(make(), n_obs)
    s = make()
    before = 0  # batches in the requests before the current one
    resumed_somewhere = 0
    for request in s.sample(n_obs):
        batches = _batches(request)
        assert s.state_dict(batches_consumed=len(batches)) == s.state_dict()
        for k in range(len(batches) + 1):
            state = json.loads(json.dumps(s.state_dict(batches_consumed=k)))
            assert state["position"] == before + k
            resumed = make()
            resumed.load_state_dict(state)
            rest = list(resumed.sample(n_obs))
            if k < len(batches):
                # the same request again, holding only its remaining batches
                assert rest[0]["slices"] == request["slices"]
                assert _batches(rest[0]) == batches[k:]
            assert [b for req in rest for b in _batches(req)] == full[before + k :]
            resumed_somewhere += 1
        before += len(batches)
    assert before == len(full) and resumed_somewhere == len(full) + len(list(s.sample(n_obs)))


def test_state_inside_a_resumed_partial_request():
    def make():
        return ChunkSampler(10, 2, 5, seed=2, num_replicas=1, rank=0)

    full = _epoch(make(), 100)  # 4 batches per request
    s = make()
    s.load_state_dict({**s.state_dict(), "position": 5, "n_obs": 100})
    assert s.state_dict(batches_consumed=0)["position"] == 5
    with pytest.raises(ValueError, match=r"batches_consumed must be in \[0, 0\]"):
        s.state_dict(batches_consumed=1)
    it = s.sample(100)
    partial = next(it)
    assert _batches(partial) == full[5:8]  # the rest of the second request
    state = s.state_dict(batches_consumed=2)
    assert state["position"] == 7
    t = make()
    t.load_state_dict(state)
    assert _epoch(t, 100) == full[7:]


@pytest.mark.parametrize(
    ("value", "exc"), [(-1, ValueError), (5, ValueError), (1.0, TypeError), (True, TypeError)]
)
def test_bad_batches_consumed_is_refused(value, exc):
    s = ChunkSampler(10, 2, 5, seed=0, num_replicas=1, rank=0)
    it = s.sample(100)
    next(it)  # a request of 4 batches
    before = s.state_dict()
    with pytest.raises(exc, match="batches_consumed"):
        s.state_dict(batches_consumed=value)
    assert s.state_dict() == before


def test_a_position_without_n_obs_is_refused():
    s = ChunkSampler(10, 2, 5, seed=0, num_replicas=1, rank=0)
    fresh = s.state_dict()
    assert fresh["n_obs"] == -1 and fresh["position"] == 0
    for position in (1, 2**62):
        with pytest.raises(StateError, match=r"state\['position'\] must be in \[0, 0\]"):
            s.load_state_dict({**fresh, "position": position})
        assert s.state_dict() == fresh
    s.load_state_dict({**fresh, "epoch": 3})
    assert s.state_dict() == {**fresh, "epoch": 3}
    three = ChunkSampler(10, 2, 5, seed=0, num_replicas=1, rank=0)
    three.set_epoch(3)
    assert _epoch(s, 100) == _epoch(three, 100)


def test_bench_help_lists_every_system():
    _, commands = _parser()
    text = "".join(commands["bench"].format_help().split())
    for system in SYSTEMS:
        assert system.name in text


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


def test_annbatch_copies_pickle_and_keep_their_passes():
    def make():
        return RandomSampler(16, 4, 8, rng=np.random.default_rng(11))

    reference = make()
    passes = [_pass(reference, 1000) for _ in range(3)]
    assert passes[0] != passes[1]
    r = make()
    r.n_iters(1000)
    clone = copy.deepcopy(r)
    assert clone.state_dict() == r.state_dict()
    assert [_pass(clone, 1000) for _ in range(2)] == passes[:2]
    assert _pass(r, 1000) == passes[0]
    after_a_pass = pickle.loads(pickle.dumps(r))
    assert _pass(after_a_pass, 1000) == passes[1] == _pass(r, 1000)


def test_annbatch_set_epoch_and_loaded_states_after_a_pass():
    def make():
        return RandomSampler(16, 4, 8, rng=np.random.default_rng(12))

    r = make()
    list(r.sample(1000))
    r.set_epoch(5)
    five = make()
    five.set_epoch(5)
    assert _pass(r, 1000) == _pass(five, 1000), "set_epoch after a pass is honoured"
    # A state saved at the end of a pass resumes with the next pass, not an empty one.
    r = make()
    first = _pass(r, 1000)
    end = r.state_dict()
    assert end["position"] == r.n_iters(1000) == len(first)
    second = _pass(r, 1000)
    resumed = make()
    resumed.load_state_dict(end)
    assert _pass(resumed, 1000) == second
    # A state saved mid-pass loads into a sampler that finished a pass, and is honoured.
    mid = make()
    it = mid.sample(1000)
    head = _batches(next(it))
    state = mid.state_dict()
    done = make()
    list(done.sample(1000))
    done.load_state_dict(state)
    assert head + _pass(done, 1000) == first


def test_annbatch_wrappers_of_one_sampler_do_not_interfere():
    n_obs, world = 1000, 4
    inner = RandomSampler(16, 4, 32, rng=np.random.default_rng(3))
    before = inner.state_dict()
    wrappers = [DistributedSampler(inner, dist_info=lambda r=r: (r, world)) for r in range(world)]
    iterators = [w.sample(n_obs) for w in wrappers]  # all started before any is read
    seen = [set() for _ in range(world)]
    for requests in zip(*iterators, strict=True):  # read in lockstep
        for r, req in enumerate(requests):
            seen[r].update(i for b in _batches(req) for i in b)
    per_rank = n_obs // world // 32 * 32
    for r in range(world):
        assert seen[r] == set(range(r * per_rank, (r + 1) * per_rank))
        assert wrappers[r].mask == slice(r * per_rank, (r + 1) * per_rank)
    assert inner.mask == slice(0, None) and inner.state_dict() == before, "inner untouched"


def test_annbatch_wrapper_state_resumes_in_a_fresh_wrapper():
    def make(rank):
        inner = RandomSampler(16, 4, 8, rng=np.random.default_rng(4))
        return DistributedSampler(inner, dist_info=lambda: (rank, 2))

    full = _pass(make(1), 1000)
    ds = make(1)
    it = ds.sample(1000)
    head = _batches(next(it))[:3]
    state = json.loads(json.dumps(ds.state_dict(batches_consumed=3)))
    resumed = make(1)
    resumed.load_state_dict(state)
    assert head + _pass(resumed, 1000) == full
    other = make(0)
    with pytest.raises(StateError, match="mask_start"):
        other.load_state_dict(state)
    assert other.mask == slice(0, None) and other.state_dict()["position"] == 0


def test_state_of_a_rank_outside_the_world_is_refused():
    s = ChunkSampler(4, 2, 4, seed=1, num_replicas=2, rank=1)
    before = s.state_dict()
    for rank in (2, 7):
        with pytest.raises(ValueError, match=r"state\['rank'\] must be in \[0, 1\]"):
            s.load_state_dict({**before, "rank": rank})
    assert s.state_dict() == before
    s.load_state_dict({**before, "rank": 0})  # a rank of this world loads


def test_request_size_overflow_is_refused_at_construction():
    with pytest.raises(ValueError, match=r"chunk_size \* preload_nchunks must be < 2\*\*64"):
        ChunkSampler(2**62, 4, 4)
    assert ChunkSampler(2**62, 3, 1).n_iters(10) == 10  # just below the limit


def test_annbatch_wrapper_refuses_a_sampler_that_already_shards():
    for rank in range(2):
        inner = ChunkSampler(4, 2, 4, seed=0, num_replicas=2, rank=rank)
        with pytest.raises(ValueError, match="sampler has num_replicas=2"):
            DistributedSampler(inner, dist_info=lambda rank=rank: (rank, 2))
    ChunkSampler(4, 2, 4, seed=0, num_replicas=1, rank=0)  # num_replicas=1 is wrapped fine
    DistributedSampler(ChunkSampler(4, 2, 4, seed=0, num_replicas=1), dist_info=lambda: (1, 2))


def test_annbatch_wrapper_loads_a_state_saved_before_sampling():
    def make():
        inner = RandomSampler(4, 2, 4, rng=np.random.default_rng(0))
        return DistributedSampler(inner, dist_info=lambda: (1, 2))

    d = make()
    start = d.state_dict()
    assert start["n_obs"] == -1
    full = _pass(d, 64)
    d.load_state_dict(json.loads(json.dumps(start)))  # the start of training
    assert d.mask == slice(0, None) and d.state_dict() == start
    assert _pass(d, 64) == full and d.mask == slice(32, 64)


@pytest.mark.parametrize(
    ("dist_info", "exc", "match"),
    [
        (lambda: (True, 2), TypeError, "rank must be an int, got bool"),
        (lambda: (0, True), TypeError, "world_size must be an int, got bool"),
        (lambda: (0.0, 2), TypeError, "rank must be an int, got float"),
        (lambda: (2, 2), ValueError, r"rank should be in the interval \[0, 1\]"),
        (lambda: (0, 0), ValueError, "num_replicas"),
    ],
)
def test_annbatch_wrapper_checks_dist_info_results(dist_info, exc, match):
    with pytest.raises(exc, match=match):
        DistributedSampler(RandomSampler(4, 1, 4), dist_info=dist_info)


def test_annbatch_wrapper_accepts_numpy_integer_ranks():
    d = DistributedSampler(RandomSampler(4, 1, 4), dist_info=lambda: (np.int64(1), np.int32(2)))
    d.validate(64)
    assert d.mask == slice(32, 64)
