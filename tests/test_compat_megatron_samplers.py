"""croupier.compat.megatron's MegatronPretrainingSampler and MegatronPretrainingRandomSampler
against a reference written from Megatron-LM's algorithm (tests/models/megatron_lm.py;
Megatron-LM is not on PyPI): the same micro-batches and the same ``consumed_samples`` over
sweeps of every argument and through random sequences of iterations, checkpoints and resumes
(on other numbers of ranks too); the ranks' batches disjoint and covering what Megatron covers;
bad input refused before anything changes."""

from __future__ import annotations

import pickle
import types
from collections import Counter
from itertools import islice

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from croupier._torch_order import torch_randperm_order  # noqa: E402
from croupier.compat.megatron import (  # noqa: E402
    MegatronPretrainingRandomSampler,
    MegatronPretrainingSampler,
)
from models.megatron_lm import RandomModel, sequential  # noqa: E402


@st.composite
def world(draw, least_total=1):
    mbs = draw(st.integers(1, 6))
    dp = draw(st.integers(1, 5))
    rank = draw(st.integers(0, dp - 1))
    total = draw(st.integers(max(least_total, 1), 200) | st.integers(mbs * dp, 3 * mbs * dp))
    return total, mbs, rank, dp


# -- the sequential sampler ----------------------------------------------------------------------


@given(w=world(), consumed=st.integers(0, 250), drop_last=st.booleans())
def test_sequential_batches_are_megatrons(w, consumed, drop_last):
    total, mbs, rank, dp = w
    consumed %= total
    s = MegatronPretrainingSampler(total, consumed, mbs, rank, dp, drop_last=drop_last)
    want = list(sequential(total, consumed, mbs, rank, dp, drop_last))
    assert list(s) == want
    assert list(s) == want  # iterating again starts again at consumed_samples
    assert len(s) == total
    assert s.consumed_samples == consumed
    groups = (total - consumed) // (mbs * dp)
    end = total if not drop_last and consumed + groups * mbs * dp < total else None
    assert s.state_dict()["consumed_samples"] == (end or consumed + groups * mbs * dp)


@given(w=world(), consumed=st.integers(0, 250), drop_last=st.booleans())
def test_sequential_ranks_are_disjoint_and_cover_the_whole_groups(w, consumed, drop_last):
    total, mbs, _, dp = w
    consumed %= total
    shares = [
        [i for b in MegatronPretrainingSampler(total, consumed, mbs, r, dp, drop_last) for i in b]
        for r in range(dp)
    ]
    ids = [i for share in shares for i in share]
    assert len(ids) == len(set(ids))
    covered = consumed + (total - consumed) // (mbs * dp) * mbs * dp
    assert sorted(ids) == list(range(consumed, total if not drop_last else covered))


@given(w=world(), consumed=st.integers(0, 250), stop=st.integers(0, 40))
def test_sequential_resumes_from_its_state_at_every_batch(w, consumed, stop):
    total, mbs, rank, dp = w
    consumed %= total
    s = MegatronPretrainingSampler(total, consumed, mbs, rank, dp)
    head = list(islice(iter(s), stop))
    state = s.state_dict()
    assert state["consumed_samples"] == consumed + len(head) * mbs * dp
    fresh = MegatronPretrainingSampler(total, consumed, mbs, rank, dp)
    fresh.load_state_dict(state)
    assert head + list(fresh) == list(sequential(total, consumed, mbs, rank, dp))
    if state["consumed_samples"] < total:  # Megatron's own resume: the count as consumed_samples
        again = MegatronPretrainingSampler(total, state["consumed_samples"], mbs, rank, dp)
        assert head + list(again) == list(s)


# -- the random sampler --------------------------------------------------------------------------


@given(w=world(), epochs=st.integers(0, 3), groups=st.integers(0, 50), sharding=st.booleans())
@settings(max_examples=80)
def test_random_batches_are_megatrons_epoch_after_epoch(w, epochs, groups, sharding):
    total, mbs, rank, dp = w
    group = mbs * dp
    if total < group:
        total = group + total % group
    active = total - total % group
    consumed = epochs * active + groups % (active // group) * group
    s = MegatronPretrainingRandomSampler(None, total, consumed, mbs, rank, dp, sharding)
    model = RandomModel(total, consumed, mbs, rank, dp, sharding)
    for _ in range(3):  # Megatron's cyclic loader: each pass goes on from the last
        want = []
        for b in model:
            want.append((b, model.consumed))
        got = []
        for b in s:
            got.append((b, s.consumed_samples))
        assert got == want
        assert s.consumed_samples == model.consumed
        assert s.epoch == model.epochs_started[-1]  # the pass's epoch, Megatron's attribute


@given(w=world(), sharding=st.booleans(), epoch=st.integers(0, 3))
def test_random_ranks_are_disjoint_in_an_epoch(w, sharding, epoch):
    total, mbs, _, dp = w
    group = mbs * dp
    total = max(total, group)
    active = total - total % group
    shares = []
    for r in range(dp):
        s = MegatronPretrainingRandomSampler(None, total, epoch * active, mbs, r, dp, sharding)
        shares.append([i for b in s for i in b])
    ids = Counter(i for share in shares for i in share)
    assert max(ids.values()) == 1 and all(0 <= i < total for i in ids)
    if sharding:  # every rank its whole bucket: the groups' samples, nothing of the tail
        assert sorted(ids) == list(range(active))
    else:  # the permuted samples, whole micro-batches of each rank's stride
        assert len(ids) == sum(len(share) for share in shares)
        assert all(len(share) % mbs == 0 for share in shares)


class _Op:
    TAKE, REITERATE, RESUME, PICKLE = range(4)


@given(
    w=world(),
    sharding=st.booleans(),
    start=st.integers(0, 30),
    ops=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 25)), max_size=12),
    new_dp=st.integers(1, 4),
)
@settings(max_examples=100)
def test_random_sampler_through_random_iterations_checkpoints_and_resumes(
    w, sharding, start, ops, new_dp
):
    """Batches taken from live iterators, new iterators, resumes from ``state_dict()`` into a
    fresh sampler (on another number of ranks where the count fits its groups) and pickled
    copies: after each step the batches and ``consumed_samples`` are the model's."""
    total, mbs, rank, dp = w
    group = mbs * dp
    total = max(total, group)
    active = total - total % group
    consumed = start * group % (3 * active)
    s = MegatronPretrainingRandomSampler(None, total, consumed, mbs, rank, dp, sharding)
    model = RandomModel(total, consumed, mbs, rank, dp, sharding)
    ours, theirs = iter(s), iter(model)
    for op, k in ops:
        if op == _Op.TAKE:
            assert list(islice(ours, k)) == list(islice(theirs, k))
        elif op == _Op.REITERATE:
            ours, theirs = iter(s), iter(model)
        elif op == _Op.RESUME:
            state = s.state_dict()
            at = state["consumed_samples"]
            assert at == model.consumed
            dp2 = new_dp if at % (mbs * new_dp) == 0 and total >= mbs * new_dp else dp
            if at % active % (mbs * dp2):
                dp2 = dp
            rank2 = min(rank, dp2 - 1)
            s = MegatronPretrainingRandomSampler(None, total, 0, mbs, rank2, dp2, sharding)
            s.load_state_dict(state)
            model = RandomModel(total, at, mbs, rank2, dp2, sharding)
            rank, dp, group = rank2, dp2, mbs * dp2
            active = total - total % group
            ours, theirs = iter(s), iter(model)
        else:
            s = pickle.loads(pickle.dumps(s))
            ours, theirs = iter(s), iter(model)
        assert s.consumed_samples == model.consumed


def _random_seed_dataset(module):
    class RandomSeedDataset:
        def __init__(self):
            self.epochs = []

        def set_epoch(self, epoch):
            self.epochs.append(epoch)

    RandomSeedDataset.__module__ = module
    return RandomSeedDataset


def test_a_random_seed_dataset_gets_the_epoch_as_megatrons_does():
    theirs = _random_seed_dataset("megatron.training.datasets.data_samplers")

    class Mine(theirs):  # isinstance holds for a subclass: Megatron sets its epoch too
        pass

    for ds in (theirs(), Mine()):
        s = MegatronPretrainingRandomSampler(ds, 10, 8 + 4, 2, 0, 2, True)  # epoch 1, a group in
        epochs = []
        for _ in range(3):
            list(s)
            epochs.append(s.epoch)  # the iteration's epoch, as Megatron's attribute holds it
        assert ds.epochs == epochs == [1, 2, 3]
    for other in (
        _random_seed_dataset("megatron_utils")(),  # another package's class of that name
        types.SimpleNamespace(set_epoch=lambda e: pytest.fail("not Megatron's dataset")),
    ):
        list(MegatronPretrainingRandomSampler(other, 10, 0, 2, 0, 2, True))
        assert getattr(other, "epochs", []) == []


def test_consumed_samples_assigned_is_checked_and_followed():
    s = MegatronPretrainingRandomSampler(None, 10, 0, 1, 0, 2, False)
    for bad, error in [(1, ValueError), (-4, ValueError), (2.0, TypeError)]:
        with pytest.raises(error, match="consumed_samples"):
            s.consumed_samples = bad
        assert s.consumed_samples == 0
    s.consumed_samples = 12  # epoch 1, a group in: as a sampler made with that count
    assert list(s) == list(RandomModel(10, 12, 1, 0, 2, False))


def test_a_new_sequential_iterator_has_handed_out_nothing():
    s = MegatronPretrainingSampler(100, 4, 2, 1, 4)
    it = iter(s)
    next(it)
    assert s.state_dict()["consumed_samples"] == 12
    iter(s)
    assert s.state_dict()["consumed_samples"] == 4


def test_the_randperm_variant_is_the_torch_in_use_or_the_one_named():
    s = MegatronPretrainingRandomSampler(None, 100, 0, 2, 0, 2, False)
    assert s.randperm == torch_randperm_order()
    old = MegatronPretrainingRandomSampler(None, 100, 0, 2, 0, 2, False, randperm="torch<2.6")
    assert old.state_dict()["randperm"] == "torch<2.6"
    with pytest.raises(ValueError, match=r"randperm: state has 'torch<2\.6'"):
        s.load_state_dict(old.state_dict())


def test_batches_through_a_dataloader_with_forked_workers():
    from torch.utils.data import DataLoader

    model = RandomModel(1000, 40 * 4, 4, 1, 2, False)
    s = MegatronPretrainingRandomSampler(range(1000), 1000, 40 * 4, 4, 1, 2, False)
    loader = DataLoader(range(1000), batch_sampler=s, num_workers=2)
    assert [b.tolist() for b in loader] == list(model)
    seq = MegatronPretrainingSampler(1003, 7, 3, 2, 3)
    loader = DataLoader(range(1003), batch_sampler=seq, num_workers=2)
    assert [b.tolist() for b in loader] == list(sequential(1003, 7, 3, 2, 3))


# -- bad input -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "error", "match"),
    [
        ((0, 0, 1, 0, 1), ValueError, r"total_samples must be in \[1, "),
        ((10, 10, 1, 0, 1), ValueError, "consumed_samples must be below total_samples"),
        ((10, -1, 1, 0, 1), ValueError, r"consumed_samples must be in \[0, "),
        ((10, 0, 0, 0, 1), ValueError, r"micro_batch_size must be in \[1, "),
        ((10, 0, 1, 0, 0), ValueError, r"data_parallel_size must be in \[1, "),
        ((10, 0, 1, 2, 2), ValueError, r"data_parallel_rank must be in \[0, 1\], got 2"),
        ((10, 0, 1.0, 0, 1), TypeError, "micro_batch_size must be an int"),
    ],
)
def test_the_sequential_sampler_refuses_bad_input(args, error, match):
    with pytest.raises(error, match=match):
        MegatronPretrainingSampler(*args)


@pytest.mark.parametrize(
    ("args", "kwargs", "error", "match"),
    [
        ((10, 0, 4, 0, 3, True), {}, ValueError, "total_samples must be at least micro_batch"),
        ((10, 2, 2, 0, 2, True), {}, ValueError, "consumed_samples must leave whole micro-batch"),
        ((10, 0, 2, 0, 2, "yes"), {}, TypeError, "data_sharding"),
        ((10, 0, 2, 0, 2, True), {"randperm": "torch"}, ValueError, "randperm"),
    ],
)
def test_the_random_sampler_refuses_bad_input(args, kwargs, error, match):
    with pytest.raises(error, match=match):
        MegatronPretrainingRandomSampler(None, *args, **kwargs)


def test_a_refused_state_leaves_the_sampler_as_it_was():
    s = MegatronPretrainingRandomSampler(None, 100, 24, 4, 0, 2, True)
    before = s.state_dict()
    for state, match in [
        ({**before, "consumed_samples": 4}, "whole micro-batch groups"),
        ({**before, "total_samples": 99}, "total_samples: state has 99"),
        ({**before, "kind": "megatron-pretraining"}, "state is of 'megatron-pretraining'"),
        ({**before, "version": 2}, "state version 2"),
        ({**before, "consumed_samples": -8}, r"consumed_samples'\] must be in \[0, "),
    ]:
        with pytest.raises(ValueError, match=match):
            s.load_state_dict(state)
        assert s.state_dict() == before
    for state, match in [
        ({}, "state lacks 'kind', 'version', 'consumed_samples'"),
        ({"consumed_samples": 8}, "state lacks 'kind'"),
        ({**before, "micro_batch_size": 4.0}, "micro_batch_size: state has 4.0"),
        ({**before, "data_sharding": 1}, "data_sharding: state has 1"),
    ]:
        with pytest.raises(ValueError, match=match):
            s.load_state_dict(state)
        assert s.state_dict() == before
    seq = MegatronPretrainingSampler(100, 3, 4, 0, 2)
    with pytest.raises(ValueError, match="at most total_samples"):
        seq.load_state_dict({**seq.state_dict(), "consumed_samples": 101})
    assert seq.consumed_samples == 3
