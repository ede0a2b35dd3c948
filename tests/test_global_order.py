"""The world-size-invariant order (``order="global"``): one keyed permutation per epoch, the
same on every number of ranks; rank ``r`` of ``W`` takes its positions ``r, r + W, ...`` with
torch's padding and dropping; resumes are arithmetic, elastic ones included. The permutation's
statistical quality is tested in ``rust/croupier-core/tests/global_order_quality.rs``."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from croupier import DistributedSampler

WORLDS = [1, 2, 3, 4, 7, 8, 16, 1000]


def interleaved(n: int, w: int, **kw: object) -> np.ndarray:
    """The global sequence a world of ``w`` ranks trains on: step ``j`` takes position ``j`` of
    every rank, rank by rank."""
    shares = [
        DistributedSampler(n, num_replicas=w, rank=r, order="global", **kw).indices()
        for r in range(w)
    ]
    assert len({len(s) for s in shares}) == 1  # equal counts
    out = np.empty(len(shares[0]) * w, dtype=np.int64)
    for r, s in enumerate(shares):
        out[r::w] = s
    return out


def epoch_order(n: int, seed: int, epoch: int) -> np.ndarray:
    s = DistributedSampler(n, num_replicas=1, rank=0, order="global", seed=seed)
    s.set_epoch(epoch)
    return s.indices().astype(np.int64)


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(0, 3000),
    w=st.sampled_from(WORLDS),
    seed=st.integers(0, 2**64 - 1),
    epoch=st.integers(0, 2**20),
    drop_last=st.booleans(),
)
def test_every_world_trains_on_the_same_global_sequence(n, w, seed, epoch, drop_last):
    order = epoch_order(n, seed, epoch)
    assert sorted(order.tolist()) == list(range(n))  # one permutation of the epoch
    shares = []
    for r in range(w):
        s = DistributedSampler(
            n, num_replicas=w, rank=r, order="global", seed=seed, drop_last=drop_last
        )
        s.set_epoch(epoch)
        shares.append(s.indices().astype(np.int64))
    per = len(shares[0])
    assert all(len(x) == per for x in shares)
    g = np.empty(per * w, dtype=np.int64)
    for r, share in enumerate(shares):
        g[r::w] = share
    # The same prefix of the same sequence on every world: torch's dropping cuts it to a
    # multiple of w, its padding repeats the sequence's head.
    total = (n // w) * w if drop_last else -(-n // w) * w
    assert len(g) == total
    if n:
        assert g.tolist() == order[np.arange(total) % n].tolist()


@pytest.mark.parametrize("w", WORLDS)
def test_global_step_k_is_the_same_batch_on_every_world(w):
    # With a fixed global batch G = W * b, step k trains on positions [kG, (k+1)G): the
    # property torch's DistributedSampler has and that users rely on to rescale runs.
    n = 5000
    g = interleaved(n, w, seed=11)
    reference = interleaved(n, 1, seed=11)
    assert g[: n - n % w].tolist() == reference[: n - n % w].tolist()


def test_the_default_order_is_global_not_fast_and_moves_with_seed_and_epoch():
    a = epoch_order(10_000, 1, 0)
    fast = DistributedSampler(10_000, num_replicas=1, seed=1, order="per_rank").indices()
    assert a.tolist() != fast.tolist()
    assert a.tolist() == DistributedSampler(10_000, num_replicas=1, seed=1).indices().tolist()
    assert a.tolist() != epoch_order(10_000, 2, 0).tolist()
    assert a.tolist() != epoch_order(10_000, 1, 1).tolist()
    assert a.tolist() == epoch_order(10_000, 1, 0).tolist()


def test_value_stability_pins():
    # Deliberate pins of order="global": a change here changes every user's data order.
    assert epoch_order(10, 0, 0).tolist() == PIN_10
    s = DistributedSampler(10**6, num_replicas=8, rank=3, seed=1234, order="global")
    s.set_epoch(7)
    assert s.indices()[:8].tolist() == PIN_1E6_8_3
    big = DistributedSampler(3 * 10**9, num_replicas=4096, rank=4095, seed=5, order="global")
    assert big.indices()[:4].tolist() == PIN_3E9_4096_4095


PIN_10 = [4, 0, 1, 6, 5, 3, 2, 7, 9, 8]
PIN_1E6_8_3 = [304834, 114988, 907187, 364465, 188733, 726305, 89670, 74062]
PIN_3E9_4096_4095 = [1351327053, 1008037139, 693086643, 1709532015]


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 5000), w=st.sampled_from([1, 3, 8]), data=st.data())
def test_resume_anywhere_continues_exactly(n, w, data):
    s = DistributedSampler(n, num_replicas=w, rank=w - 1, order="global", seed=3)
    s.set_epoch(2)
    whole = s.indices().tolist()
    assert list(s) == whole  # streamed windows equal the whole share
    k = data.draw(st.integers(0, len(whole)))
    it = iter(s)
    head = [next(it) for _ in range(k)]
    fresh = DistributedSampler(n, num_replicas=w, rank=w - 1, order="global", seed=3)
    fresh.load_state_dict(s.state_dict())
    assert head + list(fresh) == whole
    copy = pickle.loads(pickle.dumps(s))
    assert list(copy) == whole[k:]


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 4000),
    old=st.sampled_from([1, 2, 3, 8]),
    new=st.sampled_from([1, 2, 5, 6, 16]),
    drop_last=st.booleans(),
    data=st.data(),
)
def test_elastic_resume_continues_the_same_global_sequence(n, old, new, drop_last, data):
    kw = {"order": "global", "seed": 9, "drop_last": drop_last}
    before = DistributedSampler(n, num_replicas=old, rank=0, **kw)
    p = data.draw(st.integers(0, len(before)))
    it = iter(before)
    for _ in range(p):
        next(it)
    state = before.state_dict()
    order = epoch_order(n, 9, 0)
    end = (n // old) * old if drop_last else n  # what the first world's epoch holds
    consumed = min(p * old, end)
    rest = [
        DistributedSampler(n, num_replicas=new, rank=r, **kw) for r in range(new)
    ]  # fmt: skip
    for s in rest:
        s.load_state_dict(state)
    if p == 0:
        # The start of the epoch: the new world's own epoch, as a fresh sampler's.
        fresh = [DistributedSampler(n, num_replicas=new, rank=r, **kw) for r in range(new)]
        assert [list(s) for s in rest] == [list(f) for f in fresh]
        return
    if consumed >= end or p == len(before):
        assert all(len(s) == 0 or list(s) == [] for s in rest)
        return
    shares = [s.indices().astype(np.int64) for s in rest]
    per = len(shares[0])
    g = np.empty(per * new, dtype=np.int64)
    for r, share in enumerate(shares):
        g[r::new] = share
    if old == new:
        # The same world: its own epoch goes on (padding repeats the epoch's head).
        total = (len(before) - p) * new
        assert g.tolist() == order[(p * new + np.arange(total)) % n].tolist()
        return
    left = end - consumed
    total = (left // new) * new if drop_last else -(-left // new) * new
    # The rest of the same permutation from the consumed position, dealt to the new world
    # with its padding or dropping: nothing consumed comes again, nothing is lost.
    assert g.tolist() == order[consumed + np.arange(total) % left].tolist()


def test_first_index_and_memory_do_not_depend_on_n():
    # The first index is computed alone (a short first window), whatever the share's size.
    s = DistributedSampler(2**62, num_replicas=8, rank=5, order="global", seed=1)
    it = iter(s)
    first = [next(it) for _ in range(3)]
    assert all(0 <= x < 2**62 for x in first)
    state = s.state_dict()
    again = DistributedSampler(2**62, num_replicas=8, rank=5, order="global", seed=1)
    again.load_state_dict({**state, "position": 1})
    assert next(iter(again)) == first[1]


def test_bad_order_is_refused():
    with pytest.raises(ValueError, match="order must be one of"):
        DistributedSampler(10, num_replicas=1, order="globl")
    with pytest.raises(ValueError, match="torch_version"):
        DistributedSampler(10, num_replicas=1, order="global", torch_version="2.5.1")


@pytest.mark.parametrize("order", ["global", "per_rank"])
@pytest.mark.parametrize("change", ["set_epoch", "load"])
def test_a_running_iteration_keeps_its_elastic_rest(order, change):
    # An iterator streams its epoch in windows; a set_epoch or a load while it runs must not
    # switch its later windows to another layout (found by review: windows re-read the
    # elastic rest, so the rest drifted onto the plain epoch's sequence).
    n = 300_000
    kw = {"order": order, "shuffle": order == "global", "seed": 2}
    old = DistributedSampler(n, num_replicas=4, rank=0, **kw)
    old.set_skip(1000)
    state = old.state_dict()
    want = DistributedSampler(n, num_replicas=2, rank=0, **kw)
    want.load_state_dict(state)
    expected = list(want)
    s = DistributedSampler(n, num_replicas=2, rank=0, **kw)
    s.load_state_dict(state)
    it = iter(s)
    got = [next(it) for _ in range(100_000)]
    if change == "set_epoch":
        s.set_epoch(1)
    else:
        s.load_state_dict(DistributedSampler(n, num_replicas=2, rank=0, **kw).state_dict())
    got += list(it)
    assert got == expected
    # And a plain iteration keeps its layout when an elastic state is loaded under it.
    plain = DistributedSampler(n, num_replicas=2, rank=0, **kw)
    whole = list(plain)
    it = iter(plain)
    head = [next(it) for _ in range(120_000)]
    plain.load_state_dict(state)
    assert head + list(it) == whole
    assert list(plain) == expected  # the next iteration is the loaded rest


def test_a_state_of_the_old_default_says_how_to_resume_it():
    old = DistributedSampler(100, num_replicas=2, rank=0, order="per_rank", seed=3).state_dict()
    with pytest.raises(ValueError, match="construct the sampler with order='per_rank'") as e:
        DistributedSampler(100, num_replicas=2, rank=0, seed=4).load_state_dict(old)
    assert any(d.startswith("seed: state has 3") for d in e.value.differences)
    resumed = DistributedSampler(100, num_replicas=2, rank=0, order="per_rank", seed=3)
    resumed.load_state_dict(old)  # as the message says
    with pytest.raises(TypeError, match="order must be a str"):
        DistributedSampler(100, num_replicas=2, rank=0, order=None)
