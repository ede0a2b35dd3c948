"""croupier.DistributedSampler against the installed torch: padding, cutting, striding and
attributes equal torch's sampler's, and the sampler works inside torch's DataLoader."""

import pytest

torch = pytest.importorskip("torch")

from torch.utils.data import DataLoader, Dataset  # noqa: E402
from torch.utils.data import DistributedSampler as TorchDistributedSampler  # noqa: E402

from croupier import DistributedSampler  # noqa: E402


@pytest.mark.parametrize("drop_last", [False, True])
def test_unshuffled_equals_torch_sampler_exactly(drop_last):
    # Without shuffling the order is 0..N-1 in both, so this pins padding, cutting and striding
    # to the installed torch for every N and W in the sweep, N < W included.
    for n in [*range(0, 50), 97, 101, 128]:
        for w in range(1, 13):
            for r in range(w):
                ours = DistributedSampler(
                    n, num_replicas=w, rank=r, shuffle=False, drop_last=drop_last
                )
                theirs = TorchDistributedSampler(
                    range(n), num_replicas=w, rank=r, shuffle=False, drop_last=drop_last
                )
                assert list(ours) == list(theirs), (n, w, r)
                assert len(ours) == len(theirs)
                assert (ours.num_samples, ours.total_size) == (
                    theirs.num_samples,
                    theirs.total_size,
                )


def test_attributes_match_torch():
    ours = DistributedSampler(range(10), num_replicas=4, rank=3, seed=5, drop_last=True)
    theirs = TorchDistributedSampler(range(10), num_replicas=4, rank=3, seed=5, drop_last=True)
    for name in (
        "num_replicas",
        "rank",
        "epoch",
        "seed",
        "shuffle",
        "drop_last",
        "num_samples",
        "total_size",
    ):
        assert getattr(ours, name) == getattr(theirs, name), name
    assert ours.dataset is not None
    assert isinstance(ours, torch.utils.data.Sampler)


@pytest.mark.parametrize(("w", "r"), [(3, 3), (3, -1), (1, 1)])
def test_invalid_rank_has_torchs_words(w, r):
    # Code written for torch's sampler (torch's own tests among it) matches on these words.
    with pytest.raises(ValueError, match="Invalid rank") as theirs:
        TorchDistributedSampler(range(10), num_replicas=w, rank=r)
    with pytest.raises(ValueError, match="Invalid rank") as ours:
        DistributedSampler(range(10), num_replicas=w, rank=r)
    assert str(theirs.value) in str(ours.value)


def test_a_tensor_is_a_dataset():
    s = DistributedSampler(torch.zeros(7, 2), num_replicas=2, rank=0, shuffle=False)
    assert list(s) == [0, 2, 4, 6]


class _Echo(Dataset):
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return i


# torch warns when a machine has fewer CPUs than workers; the test is about correctness.
@pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")
def test_inside_a_dataloader_with_two_workers():
    ds = _Echo(1001)
    s = DistributedSampler(ds, num_replicas=2, rank=1, seed=3)
    s.set_epoch(2)
    loader = DataLoader(ds, batch_size=16, sampler=s, num_workers=2)
    got = [int(i) for batch in loader for i in batch]
    assert got == list(s)
    assert len(got) == len(s) == 501


def test_ranks_behind_dataloaders_with_drop_last_never_repeat_a_sample():
    # torch's own test of its sampler, as a user of croupier's would run it: positional
    # (dataset, num_replicas, rank), a tensor dataset, DataLoaders that drop the last batch.
    data = torch.IntTensor(range(9))
    seen = torch.IntTensor([])
    for rank in range(4):
        s = DistributedSampler(data, 4, rank)
        for batch in DataLoader(data, batch_size=2, drop_last=True, sampler=s):
            seen = torch.cat((seen, batch), 0)
    assert seen.size() == seen.unique().size()
    assert len(seen) == 4 * 2
