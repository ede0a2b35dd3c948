"""croupier.DistributedSampler: partition properties, torch's arithmetic, determinism, resume at
every position, pickling. Needs only numpy; comparisons with torch itself are in
test_torch_parity.py."""

import copy
import itertools
import json
import math
import pickle
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import croupier
from croupier import DistributedSampler, _core


def all_ranks(n, w, **kw):
    return [list(DistributedSampler(n, num_replicas=w, rank=r, **kw)) for r in range(w)]


def reference_share(order, w, r, drop_last):
    """torch's __iter__ arithmetic over a given global order, written as list operations."""
    n = len(order)
    num_samples = math.ceil((n - w) / w) if drop_last and n % w else math.ceil(n / w)
    total = num_samples * w
    idx = list(order)
    if not drop_last:
        pad = total - n
        idx += (idx * math.ceil(pad / n))[:pad] if pad > n else idx[:pad]
    else:
        idx = idx[:total]
    return idx[r:total:w]


sizes = st.integers(min_value=0, max_value=300)
replicas = st.integers(min_value=1, max_value=20)
seeds = st.integers(min_value=0, max_value=2**64 - 1)
epochs = st.integers(min_value=0, max_value=2**64 - 1)


@given(
    n=sizes, w=replicas, drop_last=st.booleans(), shuffle=st.booleans(), seed=seeds, epoch=epochs
)
def test_ranks_partition_the_dataset(n, w, drop_last, shuffle, seed, epoch):
    shares = []
    for r in range(w):
        s = DistributedSampler(
            n, num_replicas=w, rank=r, shuffle=shuffle, seed=seed, drop_last=drop_last
        )
        s.set_epoch(epoch)
        shares.append(list(s))
    lengths = {len(x) for x in shares}
    assert len(lengths) == 1, "every rank must get the same count"
    (length,) = lengths
    total = length * w
    seen = Counter(i for share in shares for i in share)
    assert all(0 <= i < n for i in seen)
    if drop_last:
        assert total == (n // w) * w
        assert all(c == 1 for c in seen.values()), "no index twice when dropping"
        assert sum(seen.values()) == total
    else:
        assert total == (math.ceil(n / w) * w if n else 0)
        assert set(seen) == set(range(n)), "every index is dealt"
        assert sum(c - 1 for c in seen.values()) == total - n, "exactly total_size - N repeats"


@given(n=sizes, w=replicas, drop_last=st.booleans(), seed=seeds, epoch=epochs)
def test_shares_stride_a_padded_global_order(n, w, drop_last, seed, epoch):
    # Interleaving the ranks' shares gives one global sequence with torch's structure:
    # distinct first occurrences, then padding that repeats the head of the order.
    shares = []
    for r in range(w):
        s = DistributedSampler(n, num_replicas=w, rank=r, seed=seed, drop_last=drop_last)
        s.set_epoch(epoch)
        shares.append(list(s))
    total = len(shares[0]) * w
    glob = [shares[j % w][j // w] for j in range(total)]
    kept = min(n, total)
    assert len(set(glob[:kept])) == kept
    for j in range(n, total):
        assert glob[j] == glob[(j - n) % n]
    assert reference_share(glob[:kept], w, 0, drop_last) == shares[0]


@settings(max_examples=30, deadline=None)
@given(
    w=st.integers(min_value=1, max_value=3),
    seed=seeds,
    data=st.data(),
)
def test_resume_across_block_boundaries(w, seed, data):
    # 30_001 samples: shares of 10_000+ positions span blocks [0, 1024), [1024, 2048),
    # [2048, 4096), [4096, 8192), [8192, ...
    n = 30_001
    whole = list(DistributedSampler(n, num_replicas=w, rank=w - 1, seed=seed))
    edges = [0, 1, 1023, 1024, 1025, 2047, 2048, 4096, 8191, 8192, 8193]
    edges += [len(whole) - 1, len(whole)]
    position = data.draw(st.sampled_from(edges) | st.integers(0, len(whole)))
    s = DistributedSampler(n, num_replicas=w, rank=w - 1, seed=seed)
    s.set_skip(position)
    assert list(s) == whole[position:]
    fresh = DistributedSampler(n, num_replicas=w, rank=w - 1, seed=seed)
    fresh.load_state_dict(json.loads(json.dumps(s.state_dict())))
    assert fresh.indices().tolist() == []
    again = DistributedSampler(n, num_replicas=w, rank=w - 1, seed=seed)
    it = iter(again)
    head = [next(it) for _ in range(position)]
    assert head == whole[:position]
    third = DistributedSampler(n, num_replicas=w, rank=w - 1, seed=seed)
    third.load_state_dict(again.state_dict())
    assert third.indices().tolist() == whole[position:]
    assert list(third) == whole[position:]


def test_deterministic_per_seed_and_epoch():
    a = DistributedSampler(1000, num_replicas=4, rank=2, seed=9)
    b = DistributedSampler(1000, num_replicas=4, rank=2, seed=9)
    assert list(a) == list(b)
    a.set_epoch(1)
    b.set_epoch(1)
    assert list(a) == list(b)
    assert list(a) == list(a), "iterating again repeats the epoch"
    first = list(DistributedSampler(1000, num_replicas=4, rank=2, seed=9))
    assert list(a) != first, "a new epoch reshuffles"
    assert list(DistributedSampler(1000, num_replicas=4, rank=2, seed=10)) != first


def test_value_stability_pins():
    # Deliberate pins of order="per_rank" (the default until the global order; kept for runs that
    # pass order="per_rank"): a change here changes those users' data order.
    assert list(DistributedSampler(10, num_replicas=1, rank=0, order="per_rank")) == [
        1,
        0,
        4,
        2,
        6,
        9,
        5,
        3,
        7,
        8,
    ]
    s = DistributedSampler(10, num_replicas=3, rank=1, seed=1234, order="per_rank")
    s.set_epoch(7)
    s0 = DistributedSampler(10, num_replicas=3, rank=0, seed=1234, order="per_rank")
    s0.set_epoch(7)
    pinned = [9, 1, 0, 3]
    assert list(s) == pinned
    # Position 10 is padding: it repeats global position 0, rank 0's first index.
    assert pinned[-1] == next(iter(s0))
    # From 16 ranks on, value leaves are permuted (a keyed permutation per leaf).
    many = DistributedSampler(100_000, num_replicas=64, rank=5, seed=3, order="per_rank")
    assert many.indices()[:6].tolist() == [56669, 41148, 99682, 29958, 67676, 2411]
    wide = DistributedSampler(3_000_000, num_replicas=1024, rank=1000, seed=3, order="per_rank")
    wide.set_epoch(2)
    assert wide.indices()[:6].tolist() == [2970872, 658022, 175212, 2941337, 754798, 871295]


@pytest.mark.parametrize("w", [15, 16, 64, 100, 1024])
def test_many_ranks_partition_the_epoch(w):
    # Across the switch to permuted leaves (16 ranks): shares disjoint, together every index
    # once plus torch's padding, each share's indices spread over the whole range.
    n = 50_003
    shares = [DistributedSampler(n, num_replicas=w, rank=r, seed=8).indices() for r in range(w)]
    flat = np.concatenate(shares)
    assert len({len(x) for x in shares}) == 1
    padding = len(flat) - n
    assert 0 <= padding < w
    assert set(flat.tolist()) == set(range(n))
    assert len(np.unique(flat)) == n  # only the padding repeats
    # Which rank value v lands in is flat over ranks: value ranges of n / 10 each hold about
    # a tenth of every share (chi-square over 10 ranges, summed over the ranks).
    edges = np.linspace(0, n, 11)
    chi2 = 0.0
    for share in shares:
        counts, _ = np.histogram(share, bins=edges)
        expected = len(share) / 10
        chi2 += ((counts - expected) ** 2 / expected).sum()
    dof = 9 * w
    assert chi2 < dof + 5 * np.sqrt(2 * dof), chi2
    # A resume reads any position by random access: the same index as the whole share.
    big = DistributedSampler(3_000_000, num_replicas=w, rank=w // 3, seed=8)
    whole = big.indices()
    for p in (0, 1, len(whole) // 3, len(whole) - 1):
        resumed = DistributedSampler(3_000_000, num_replicas=w, rank=w // 3, seed=8)
        resumed.set_skip(p)
        assert next(iter(resumed)) == whole[p]


def test_epochs_reshuffle_uniformly_enough():
    # Over 4000 epochs, index 0 lands in each of 8 positions about equally (chi-square, 7 dof).
    s = DistributedSampler(8, num_replicas=1, rank=0, seed=3)
    counts = np.zeros(8)
    for epoch in range(4000):
        s.set_epoch(epoch)
        counts[list(s).index(0)] += 1
    chi2 = ((counts - 500) ** 2 / 500).sum()
    assert chi2 < 24.32, counts  # P(chi2 > 24.32 | 7 dof) = 0.001


@given(
    n=st.integers(min_value=0, max_value=120),
    w=st.integers(min_value=1, max_value=9),
    data=st.data(),
    drop_last=st.booleans(),
)
def test_resume_at_every_position(n, w, data, drop_last):
    r = data.draw(st.integers(min_value=0, max_value=w - 1))
    epoch = data.draw(st.integers(min_value=0, max_value=5))
    make = lambda: DistributedSampler(n, num_replicas=w, rank=r, seed=77, drop_last=drop_last)  # noqa: E731
    s = make()
    s.set_epoch(epoch)
    full = list(s)
    for k in range(len(full) + 1):
        s = make()
        s.set_epoch(epoch)
        it = iter(s)
        head = [next(it) for _ in range(k)]
        state = s.state_dict()
        assert state["position"] == k
        saved = json.loads(json.dumps(state))
        rest_here = list(it)
        assert s.state_dict()["position"] == len(full)
        assert state == saved, "a saved state never changes as iteration goes on"
        fresh = make()
        fresh.load_state_dict(saved)
        assert fresh.state_dict() == saved, "load then state_dict gives the same state back"
        fresh.set_epoch(epoch)  # a resumed loop calls this; it must keep the position
        assert fresh.indices().tolist() == full[k:]
        assert head + list(fresh) == full
        assert rest_here == full[k:]


def test_set_skip_is_a_pending_start():
    s = DistributedSampler(50, num_replicas=2, rank=1, seed=4)
    full = list(s)
    s.set_skip(7)
    assert s.state_dict()["position"] == 7
    assert s.indices().tolist() == full[7:]
    assert list(s) == full[7:]
    assert list(s) == full, "the skip applies to the next iteration only"
    s.set_skip(len(s))
    assert list(s) == []


def test_a_loaded_position_belongs_to_its_epoch():
    s = DistributedSampler(50, num_replicas=2, rank=0)
    s.set_epoch(3)
    s.set_skip(5)
    state = s.state_dict()
    fresh = DistributedSampler(50, num_replicas=2, rank=0)
    fresh.load_state_dict(state)
    fresh.set_epoch(3)
    assert fresh.state_dict()["position"] == 5
    fresh.set_epoch(4)
    assert fresh.state_dict()["position"] == 0, "a new epoch starts at its beginning"
    fresh.epoch = 6
    assert fresh.epoch == 6 and fresh.state_dict()["epoch"] == 6


def test_a_finished_epoch_state_then_the_next_epoch_starts_at_zero():
    s = DistributedSampler(50, num_replicas=2, rank=1)
    list(s)
    fresh = DistributedSampler(50, num_replicas=2, rank=1)
    fresh.load_state_dict(s.state_dict())
    assert list(fresh) == []
    fresh.set_epoch(1)
    ref = DistributedSampler(50, num_replicas=2, rank=1)
    ref.set_epoch(1)
    assert list(fresh) == list(ref)


def test_set_skip_waits_for_the_next_iteration_whatever_its_epoch():
    # kempnerforge order: set_skip first, then the loop's set_epoch.
    s = DistributedSampler(50, num_replicas=2, rank=0)
    s.set_skip(4)
    s.set_epoch(2)
    ref = DistributedSampler(50, num_replicas=2, rank=0)
    ref.set_epoch(2)
    assert list(s) == list(ref)[4:]


def test_state_is_json_and_small():
    s = DistributedSampler(10**12, num_replicas=64, rank=5, shuffle=False)
    state = s.state_dict()
    assert json.loads(json.dumps(state)) == state
    assert {"epoch", "seed", "num_replicas", "rank", "position"} <= set(state)
    assert len(json.dumps(state)) < 300


def test_any_ranks_state_loads_on_any_rank():
    a = DistributedSampler(40, num_replicas=4, rank=0, seed=1)
    it = iter(a)
    for _ in range(3):
        next(it)
    b = DistributedSampler(40, num_replicas=4, rank=2, seed=1)
    full_b = list(b)
    b.load_state_dict(a.state_dict())
    assert list(b) == full_b[3:]


def test_indices_are_a_read_only_view_of_the_rust_buffer():
    s = DistributedSampler(1000, num_replicas=3, rank=1)
    idx = s.indices()
    base = idx
    while isinstance(base.base, np.ndarray):
        base = base.base
    assert type(base.base).__name__ == "PySliceContainer"
    assert idx.dtype == np.uint32
    assert not idx.flags.writeable
    with pytest.raises(ValueError):
        idx[0] = 1
    assert np.shares_memory(idx, s.indices())


def test_iteration_reports_progress_of_the_live_iterator_only():
    s = DistributedSampler(30, num_replicas=1, rank=0)
    old = iter(s)
    next(old)
    new = iter(s)
    next(new)
    next(new)
    next(old)
    assert s.state_dict()["position"] == 2


def test_pickle_and_copy_mid_iteration_are_checkpoints():
    s = DistributedSampler(40_000, num_replicas=1, rank=0, seed=2)
    full = list(s)
    it = iter(s)
    for _ in range(20_000):
        next(it)
    blob = pickle.dumps(s)
    assert len(blob) < 2000, "neither the cached epoch nor the current chunk is pickled"
    clone = pickle.loads(blob)
    twin = copy.copy(s)
    assert clone.state_dict() == twin.state_dict() == s.state_dict()
    next(it)
    assert s.state_dict()["position"] == 20_001
    assert twin.state_dict()["position"] == 20_000, "a copy does not follow the original"
    assert list(clone) == full[20_000:]


def test_pickle_round_trip_keeps_state_and_order():
    s = DistributedSampler(500, num_replicas=3, rank=2, seed=8, drop_last=True)
    s.set_epoch(4)
    full = list(s)
    s.set_skip(11)
    clone = pickle.loads(pickle.dumps(s))
    assert clone.state_dict() == s.state_dict()
    assert list(clone) == full[11:]
    assert len(pickle.dumps(s)) < 2000, "the cached epoch is not pickled"


def test_billion_scale_dataset_as_an_int_without_shuffle():
    n = 2**33 + 5
    s = DistributedSampler(n, num_replicas=2**20, rank=2**20 - 1, shuffle=False)
    assert len(s) == math.ceil(n / 2**20)
    idx = s.indices()
    assert idx.dtype == np.int64
    assert idx[0] == 2**20 - 1 and idx[1] == 2**21 - 1
    assert idx[-1] == (s.total_size - 1) % n  # padding wraps to the head


def test_import_works_with_only_numpy(tmp_path):
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['torch'] = None\n"
        "import croupier\n"
        "from croupier._torch import HAVE_TORCH\n"
        "assert not HAVE_TORCH\n"
        "s = croupier.DistributedSampler(10, num_replicas=2, rank=0)\n"
        "print(len(list(s)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "5"


def test_version_is_exposed():
    assert croupier.__version__ == _core.__version__


def test_position_is_exact_across_chunk_boundaries():
    _CHUNK = DistributedSampler._chunk

    n = 2 * _CHUNK + 7
    s = DistributedSampler(n, num_replicas=1, rank=0, seed=6)
    full = list(s)
    it = iter(s)
    taken = 0
    for k in (0, 1, _CHUNK - 1, _CHUNK, _CHUNK + 1, 2 * _CHUNK, n - 1, n):
        for _ in range(k - taken):
            next(it)
        taken = k
        state = s.state_dict()
        assert state["position"] == k
        fresh = DistributedSampler(n, num_replicas=1, rank=0, seed=6)
        fresh.load_state_dict(state)
        assert list(fresh) == full[k:]
    assert list(it) == []
    assert s.state_dict()["position"] == n


@pytest.mark.parametrize(
    "dataset",
    [np.arange(7), list(range(7)), range(7), np.int64(7)],
    ids=["ndarray", "list", "range", "numpy-int"],
)
def test_sized_datasets_and_integer_lengths(dataset):
    s = DistributedSampler(dataset, num_replicas=2, rank=0, shuffle=False)
    assert len(s) == 4
    assert list(s) == [0, 2, 4, 6]


@pytest.mark.parametrize("drop_last", [False, True])
def test_epoch_boundary_state_loads_on_a_different_number_of_replicas(drop_last):
    old = DistributedSampler(103, num_replicas=4, rank=1, seed=5, drop_last=drop_last)
    old.set_epoch(2)
    start = old.state_dict()
    list(old)
    done = old.state_dict()
    for w in (3, 8):
        new = DistributedSampler(103, num_replicas=w, rank=w - 1, seed=5, drop_last=drop_last)
        ref = DistributedSampler(103, num_replicas=w, rank=w - 1, seed=5, drop_last=drop_last)
        ref.set_epoch(2)
        new.load_state_dict(start)
        assert list(new) == list(ref), "at the start of the epoch: the whole epoch on w ranks"
        new.load_state_dict(done)
        assert new.state_dict()["position"] == len(new) and list(new) == []


def test_beyond_2_32_samples_and_a_million_ranks():
    # The extreme: N = 2**33 + 5 over 2**20 ranks; a share is 8193 int64 indices.
    n, w = 2**33 + 5, 2**20
    a = DistributedSampler(n, num_replicas=w, rank=w - 1, seed=3)
    b = DistributedSampler(n, num_replicas=w, rank=12345, seed=3)
    ia, ib = a.indices(), b.indices()
    assert ia.dtype == np.int64 and len(ia) == len(ib) == 8193
    # rank w-1 pads (n mod w = 5 ranks have 8193 values); its padding repeats rank w-6's first
    assert ia[-1] == next(iter(DistributedSampler(n, num_replicas=w, rank=w - 6, seed=3)))
    own = set(ia[:-1].tolist())
    assert len(own) == 8192 and own.isdisjoint(ib.tolist())
    assert max(own) < n and max(own) > 2**32
    # resume deep in the share
    b.set_skip(5000)
    assert list(b) == ib[5000:].tolist()


@pytest.mark.parametrize("order", ["per_rank", "torch"])
def test_a_running_iterator_keeps_its_epoch(order):
    # torch's samplers fix the epoch's list when iteration starts; so must croupier, also when
    # its first block is handed out before the rest is computed.
    n = 50_000
    want0 = list(DistributedSampler(n, num_replicas=2, rank=1, order=order))
    s = DistributedSampler(n, num_replicas=2, rank=1, order=order)
    it = iter(s)
    head = [next(it) for _ in range(10)]
    s.set_epoch(1)
    assert head + list(it) == want0
    fresh1 = DistributedSampler(n, num_replicas=2, rank=1, order=order)
    fresh1.set_epoch(1)
    assert list(s) == list(fresh1) != want0


@settings(max_examples=25, deadline=None)
@given(w=st.integers(min_value=1, max_value=2), seed=seeds, data=st.data())
def test_resume_inside_bucketed_blocks(w, seed, data):
    # 200_003 samples: shares of 100_000+ positions whose blocks from 65_536 on are longer than
    # 2**15 and ordered by the bucket shuffle; a resume there reads its first 64 positions by
    # random access, then the rest of the share whole. Both must continue the epoch exactly.
    n = 200_003
    whole = DistributedSampler(n, num_replicas=w, rank=w - 1, seed=seed).indices().tolist()
    edges = [65_535, 65_536, 65_537, 65_536 + 63, 65_536 + 64, 131_071, 131_072, 131_073]
    edges = [e for e in edges if e <= len(whole)] + [len(whole) - 64, len(whole) - 1]
    position = data.draw(st.sampled_from(edges) | st.integers(65_536, len(whole)))
    s = DistributedSampler(n, num_replicas=w, rank=w - 1, seed=seed)
    s.set_skip(position)
    it = iter(s)
    head = list(itertools.islice(it, 100))
    assert head == whole[position : position + 100]
    assert head + list(it) == whole[position:]
    fresh = DistributedSampler(n, num_replicas=w, rank=w - 1, seed=seed)
    fresh.load_state_dict(s.state_dict())
    assert fresh.indices().tolist() == []
