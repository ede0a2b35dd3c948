"""order="torch": exactly the index sequence of the installed torch's DistributedSampler.

If torch ever changes its CPU randperm, these tests fail and name the torch version.
"""

import pytest
import torch
from torch.utils.data import DistributedSampler as TorchDistributedSampler

from croupier import DistributedSampler, _core

TORCH = torch.__version__

# 0..40 covers N < W for every W in the sweep; primes and powers of two around them.
SIZES = [*range(0, 41), 61, 64, 97, 127, 128, 251, 509, 1000, 1021, 2048, 4093]


def torch_shares(n, w, shuffle, seed, epoch, drop_last):
    out = []
    for r in range(w):
        s = TorchDistributedSampler(
            range(n), num_replicas=w, rank=r, shuffle=shuffle, seed=seed, drop_last=drop_last
        )
        s.set_epoch(epoch)
        out.append(list(s))
    return out


def our_shares(n, w, shuffle, seed, epoch, drop_last):
    out = []
    for r in range(w):
        s = DistributedSampler(
            n,
            num_replicas=w,
            rank=r,
            shuffle=shuffle,
            seed=seed,
            drop_last=drop_last,
            order="torch",
        )
        s.set_epoch(epoch)
        out.append(list(s))
    return out


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize(("seed", "epoch"), [(0, 0), (0, 1), (42, 3), (2**32 + 7, 5)])
def test_equals_torch_over_a_sweep(seed, epoch, shuffle, drop_last):
    for n in SIZES:
        for w in range(1, 17):
            want = torch_shares(n, w, shuffle, seed, epoch, drop_last)
            got = our_shares(n, w, shuffle, seed, epoch, drop_last)
            assert got == want, (
                f"order='torch' differs from torch {TORCH}'s DistributedSampler at N={n}, W={w}, "
                f"shuffle={shuffle}, seed={seed}, epoch={epoch}, drop_last={drop_last}"
            )


def test_randperm_equals_torch_below_the_large_n_threshold():
    for n, seed in [(0, 0), (1, 3), (2, 5), (1000, 9), (100_003, 2**40 + 1), (1_000_000, 77)]:
        g = torch.Generator()
        g.manual_seed(seed)
        want = torch.randperm(n, generator=g).numpy()
        got = _core.torch_randperm(n, seed)
        assert (got == want).all(), f"torch_randperm differs from torch {TORCH} at n={n}"


def test_state_skip_and_indices_work_in_torch_order():
    s = DistributedSampler(1000, num_replicas=3, rank=2, seed=5, order="torch")
    s.set_epoch(4)
    ref = TorchDistributedSampler(range(1000), num_replicas=3, rank=2, seed=5)
    ref.set_epoch(4)
    full = list(ref)
    assert s.indices().tolist() == full
    it = iter(s)
    head = [next(it) for _ in range(100)]
    state = s.state_dict()
    assert state["order"] == "torch"
    fresh = DistributedSampler(1000, num_replicas=3, rank=2, seed=5, order="torch")
    fresh.load_state_dict(state)
    assert head + list(fresh) == full
    fresh.set_skip(250)
    assert fresh.indices().tolist() == full[250:]
    fast = DistributedSampler(1000, num_replicas=3, rank=2, seed=5)
    with pytest.raises(ValueError, match="order: state has 'torch', this sampler has 'fast'"):
        fast.load_state_dict(state)


@pytest.mark.slow
def test_randperm_equals_torch_above_the_large_n_threshold():
    # torch switches to its inside-out variant with 64-bit draws at n >= 2**32 // 20.
    n = 2**32 // 20 + 5
    g = torch.Generator()
    g.manual_seed(1234 + 2)
    want = torch.randperm(n, generator=g).numpy()
    got = _core.torch_randperm(n, 1234 + 2)
    assert len(got) == n
    assert (got == want).all(), f"the large-n variant differs from torch {TORCH} at n={n}"
    del want, got
    # And through the sampler: rank 3 of 8, epoch 2, the torch strided layout.
    s = DistributedSampler(n, num_replicas=8, rank=3, seed=1234, order="torch")
    s.set_epoch(2)
    g = torch.Generator()
    g.manual_seed(1234 + 2)
    perm = torch.randperm(n, generator=g)
    total = s.total_size
    padded = torch.cat([perm, perm[: total - n]])
    assert (s.indices() == padded[3:total:8].numpy()).all()
