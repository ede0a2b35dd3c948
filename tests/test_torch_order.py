"""order="torch": exactly the index sequence of the installed torch's DistributedSampler.

If torch ever changes its CPU randperm, these tests fail and name the torch version.
"""

import hashlib

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from torch.utils.data import DistributedSampler as TorchDistributedSampler  # noqa: E402

from croupier import DistributedSampler, _core  # noqa: E402
from croupier._torch_order import TORCH_ORDERS, torch_randperm_order  # noqa: E402

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
        for variant in ("torch>=2.6", "torch<2.6"):  # the same below the large-n threshold
            got = _core.torch_randperm(n, seed, TORCH_ORDERS[variant])
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
    with pytest.raises(ValueError, match="order: state has 'torch', this sampler has 'global'"):
        fast.load_state_dict(state)


# torch.randperm(2**32 // 20 + 5) with manual_seed(1236), recorded from torch 2.15.0 itself
# (its first and last values and the digest of its little-endian uint32 values). Computing
# it takes torch about 40 s on one core; a torch of another version computes it again below.
LARGE_N_TORCH = "2.15.0"
LARGE_N_HEAD = [129976289, 186136072, 204016022, 177394936, 78654171, 4071163, 166768804, 48066765]
LARGE_N_TAIL = [147224223, 144257166, 117506621]
LARGE_N_DIGEST = "2506d4eecf328bcb9935309c8359cb0d0801b73eac72af23c0a674b75de4519b"


@pytest.mark.slow
def test_randperm_equals_torch_above_the_large_n_threshold():
    # torch switches to its inside-out variant with 64-bit draws at n >= 2**32 // 20.
    n = 2**32 // 20 + 5
    # Through the sampler on one rank, whose sequence is the permutation itself (epoch 2: torch
    # seeds seed + epoch). Its share and _core.torch_randperm both run the core's randperm,
    # so one 2e8 permutation checks it; the strided layout over more ranks is torch's
    # arithmetic, checked below the threshold.
    s = DistributedSampler(n, num_replicas=1, rank=0, seed=1234, order="torch")
    s.set_epoch(2)
    got = s.indices()
    assert len(got) == n
    if TORCH.split("+")[0] == LARGE_N_TORCH:
        assert got[:8].tolist() == LARGE_N_HEAD
        assert got[-3:].tolist() == LARGE_N_TAIL
        digest = hashlib.sha256(got.astype("<u4").tobytes()).hexdigest()
        assert digest == LARGE_N_DIGEST, f"the large-n variant differs from torch {TORCH}"
        return
    g = torch.Generator()
    g.manual_seed(1234 + 2)
    want = torch.randperm(n, generator=g).numpy()
    assert (got == want).all(), f"the large-n variant differs from torch {TORCH} at n={n}"


@pytest.mark.slow
def test_legacy_variant_equals_torch_2_1_above_the_threshold():
    # Fingerprint of torch 2.1.2's randperm(2**32 // 20 + 5) with manual_seed(1236), recorded
    # from torch 2.1.2 itself (torch 2.5.1 gives the same; 2.6.0 and later do not).
    got = _core.torch_randperm(2**32 // 20 + 5, 1236, _core.Order.TORCH_FORWARD)
    assert got.dtype == np.uint32
    assert got[:8].tolist() == [
        34354702,
        170438956,
        157402124,
        209782503,
        142042090,
        197328869,
        96257439,
        74720814,
    ]
    assert got[-3:].tolist() == [144778615, 128492343, 164864051]
    digest = hashlib.sha256(got.astype("<u4").tobytes()).hexdigest()
    assert digest == "1883ab4c36f94c1849b0ba6986afe67cd235d55ac76e7df033e1c4c0bff9310e"


@pytest.mark.parametrize(
    ("version", "variant"),
    [
        ("2.5.1", "torch<2.6"),
        ("1.13.1+cu117", "torch<2.6"),
        ("2.6.0+cu124", "torch>=2.6"),
        ("2.15.0", "torch>=2.6"),
        ("3.0", "torch>=2.6"),
        ("2.10.0a0+git1234", "torch>=2.6"),
        ("2.6.0a0+git1234", "torch<2.6"),
        ("2.7.0.dev20241215+cpu", "torch<2.6"),
        ("2.7.0.dev20250110+cpu", "torch>=2.6"),
    ],
)
def test_torch_version_selects_the_randperm_variant(version, variant):
    assert torch_randperm_order(version) == variant


def test_default_follows_the_torch_in_use():
    assert torch_randperm_order() == torch_randperm_order(TORCH)


def test_seed_plus_epoch_past_u64_is_refused_like_torch():
    s = DistributedSampler(5, num_replicas=1, rank=0, seed=2**64 - 1, order="torch")
    g = torch.Generator()
    with pytest.raises((RuntimeError, ValueError)):
        g.manual_seed(2**64)  # torch refuses the sum too
    with pytest.raises(ValueError, match=r"seed \+ epoch must be at most 2\*\*64 - 1"):
        s.set_epoch(1)
    with pytest.raises(ValueError, match=r"seed \+ epoch must be at most"):
        _core.RankShare(
            n=5,
            num_replicas=1,
            rank=0,
            shuffle=True,
            seed=2**64 - 1,
            drop_last=False,
            order=_core.Order.TORCH_INSIDE_OUT,
        ).indices(1)
    fast = DistributedSampler(5, num_replicas=1, rank=0, seed=2**64 - 1)
    fast.set_epoch(1)  # croupier's own order has no such limit
    assert sorted(fast) == [0, 1, 2, 3, 4]
    # Unshuffled, torch never seeds its generator, so it takes any epoch: so does croupier.
    plain = DistributedSampler(5, 1, 0, shuffle=False, seed=2**64 - 1, order="torch")
    theirs = TorchDistributedSampler(range(5), 1, 0, shuffle=False, seed=2**64 - 1)
    plain.set_epoch(7)
    theirs.set_epoch(7)
    assert list(plain) == list(theirs) == [0, 1, 2, 3, 4]


@pytest.mark.parametrize(
    ("kwargs", "exc", "message"),
    [
        ({"torch_version": "2.5"}, ValueError, "torch_version applies to order='torch' only"),
        (
            {"order": "torch", "torch_version": "latest"},
            ValueError,
            "torch_version must be a torch",
        ),
        ({"order": "torch", "torch_version": 2.5}, TypeError, "torch_version must be a str"),
    ],
)
def test_torch_version_is_checked(kwargs, exc, message):
    with pytest.raises(exc, match=message):
        DistributedSampler(10, num_replicas=1, rank=0, **kwargs)


def test_checkpoints_of_large_datasets_record_the_variant():
    big = _core.TORCH_LARGE_N
    old = DistributedSampler(big, num_replicas=8, rank=0, order="torch", torch_version="2.5.1")
    new = DistributedSampler(big, num_replicas=8, rank=0, order="torch", torch_version="2.6.0")
    assert old.state_dict()["torch_randperm"] == "torch<2.6"
    with pytest.raises(ValueError, match=r"torch_randperm: state has 'torch<2\.6'"):
        new.load_state_dict(old.state_dict())
    small_old = DistributedSampler(
        big - 1, num_replicas=8, rank=0, order="torch", torch_version="2.5"
    )
    small_new = DistributedSampler(big - 1, num_replicas=8, rank=0, order="torch")
    assert "torch_randperm" not in small_old.state_dict(), "below the threshold releases agree"
    small_new.load_state_dict(small_old.state_dict())
