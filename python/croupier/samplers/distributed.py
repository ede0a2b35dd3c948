"""``croupier.DistributedSampler``: a drop-in for ``torch.utils.data.DistributedSampler``.

The indices come from the Rust core; the sampler base keeps the epoch, position and state, so
this class holds only its configuration and argument checks.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import numpy.typing as npt

from croupier import _core
from croupier._dist import DistInfo, resolve_ranks
from croupier._torch import DistributedSamplerBase
from croupier._validate import (
    U64_MAX,
    check_bool,
    check_int,
    check_order,
    core_order_of,
    dataset_length,
    resume_hint,
)
from croupier.samplers._base import IndexSampler
from croupier.samplers._state import (
    KEMPNERFORGE,
    StateError,
    StateFormat,
    check_state,
    different,
)

__all__ = ["DistributedSampler"]


class DistributedSampler(IndexSampler, DistributedSamplerBase[int]):
    """Deals a dataset's indices to data-parallel ranks like torch's ``DistributedSampler``.

    Each epoch has one global order of the ``N`` samples (a seeded shuffle, or ``0..N-1`` with
    ``shuffle=False``). With ``drop_last=False`` it is padded by repeating its head until every
    rank gets the same count; with ``drop_last=True`` it is cut to a multiple of
    ``num_replicas``. Rank ``r`` takes global positions ``r, r + W, r + 2W, ...``, exactly as
    torch does, so ranks are disjoint apart from the padding and all have ``len(self)`` indices.

    Args:
        dataset: anything with ``__len__``, or an ``int`` number of samples (no dataset object
            is needed at billion scale).
        num_replicas: number of ranks ``W >= 1``; ``None`` asks ``dist_info``.
        rank: this rank, in ``[0, W)``; ``None`` asks ``dist_info``.
        shuffle: shuffle the order every epoch (seeded by ``seed`` and the epoch).
        seed: non-negative integer below ``2**64``; all ranks must use the same one.
        drop_last: cut the uneven tail instead of padding.
        order: ``"global"`` (the default): world-size-invariant, as torch's order is: the
            epoch is one keyed permutation of the ``N`` samples whatever ``num_replicas`` is,
            and rank ``r`` of ``W`` takes its positions ``r, r + W, ...``, so a run on 8 ranks
            and one on 64 see the same samples at every global step, and a resume on another
            world size continues the same sequence. Each rank computes only its own positions,
            a window at a time (memory stays small at any ``N``). ``"per_rank"``: croupier's
            earlier order (the default before 0.2.0's global order, then called ``"fast"``,
            still accepted with a ``DeprecationWarning``): uniform, disjoint across ranks, each
            rank's share drawn for its world size, so a different sequence for each one.
            ``"torch"``: exactly the sequence ``torch.utils.data.DistributedSampler`` yields for
            the same arguments and epoch (torch's CPU ``randperm`` seeded with ``seed + epoch``,
            reproduced in Rust), so a run can switch samplers mid-training without changing its
            data order; it builds the whole permutation on every rank.
        torch_version: with ``order="torch"``, the torch release whose ``randperm`` to
            reproduce, e.g. ``"2.5.1"`` (default: the torch in use, ``torch.__version__`` if
            imported, else the installed package; the newest algorithm if torch is absent).
            Releases up to 2.5 and from 2.6 on differ for datasets of ``2**32 // 20`` samples
            or more.
        dist_info: where ``num_replicas``/``rank`` come from when ``None``: ``None`` (an
            initialised ``torch.distributed``, else the ``RANK``/``WORLD_SIZE`` environment
            variables, else rank 0 of 1), ``"torch"``, ``"jax"``, or a callable returning
            ``(rank, world_size)``.

    Checkpointing: :meth:`state_dict` is a small JSON-serialisable dict holding the
    configuration, the epoch and ``position``, the number of this rank's indices of the epoch
    already consumed (handed out by the live iterator, or skipped). Loading it into a sampler
    with the same arguments continues with exactly the next index. Ranks advance in lockstep,
    so any rank's state can be loaded on any rank (``rank`` in a state is informational).

    Iterating again without :meth:`set_epoch` repeats the epoch from its start, as torch does;
    a pending :meth:`set_skip` or :meth:`load_state_dict` position applies to the next
    iteration only. :meth:`indices` is always what the next iteration yields.

    The configuration (``dataset``, ``num_replicas``, ``rank``, ``shuffle``, ``seed``,
    ``drop_last``, ``order``, ``num_samples``, ``total_size``) is fixed at construction:
    assigning one raises ``AttributeError``, so a checkpoint always describes what is iterated.
    A state of kempnerforge's ``DistributedSampler`` (``epoch, seed, num_replicas, rank``)
    loads too, as the start of its epoch.

    With torch installed it is an instance of ``torch.utils.data.DistributedSampler`` (whose
    constructor it never runs), so frameworks that test for one treat it as the rank-aware
    sampler it is: Lightning does not shard it a second time.
    """

    _config_names = (
        "dataset",
        "num_replicas",
        "rank",
        "shuffle",
        "seed",
        "drop_last",
        "order",
        "num_samples",
        "total_size",
    )
    _state_formats: ClassVar[tuple[StateFormat, ...]] = (KEMPNERFORGE,)

    def __init__(
        self,
        dataset: Any,
        num_replicas: int | None = None,
        rank: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        *,
        order: str = "global",
        dist_info: DistInfo = None,
        torch_version: str | None = None,
    ) -> None:
        n = dataset_length(dataset)
        order = check_order("DistributedSampler", order)
        core_order, randperm = core_order_of(order, torch_version)
        self.shuffle = check_bool("shuffle", shuffle)
        self.drop_last = check_bool("drop_last", drop_last)
        self.seed = check_int("seed", seed, 0, U64_MAX)
        num_replicas, rank = resolve_ranks(num_replicas, rank, dist_info)
        self.dataset = dataset
        self.order = order
        self._n = n
        self._randperm = randperm
        self._deal = _core.RankShare(
            n=n,
            num_replicas=num_replicas,
            rank=rank,
            shuffle=self.shuffle,
            seed=self.seed,
            drop_last=self.drop_last,
            order=core_order,
        )
        self.num_samples, self.total_size = self._deal.num_samples, self._deal.total_size
        super().__init__(num_replicas, rank, self.num_samples)

    def _config(self) -> dict[str, Any]:
        config: dict[str, Any] = {
            "order": self.order,
            "dataset_len": self._n,
            "shuffle": self.shuffle,
            "drop_last": self.drop_last,
            "seed": self.seed,
        }
        if self._deal.randperm_variant_matters:
            # Only here do torch releases disagree; a resume must use the same variant.
            config["torch_randperm"] = self._randperm
        return config

    def _epoch_length(self, num_replicas: int) -> int:
        return _core.layout(self._n, num_replicas, self.drop_last)[0]

    def _check_config(self, native: Mapping[str, Any]) -> None:
        # A state of another order (croupier 0.1's default among them) says how to resume it:
        # the base's check, its order difference worded with the fix (the other differences as
        # they are).
        fix = resume_hint(native.get("order"))
        if fix is None or native.get("order") == self.order:
            return
        try:
            check_state(native, ints=(), config=self._state_config())
        except StateError as e:
            if e.differences:
                raise different(
                    [f"{d} ({fix})" if d.startswith("order:") else d for d in e.differences]
                ) from None

    # Elastic resume: the epoch's global order (drawn for the world size it started with) from
    # the consumed prefix on, dealt with torch's arithmetic (croupier_core::Elastic).
    _elastic_supported = True

    def _global_end(self, origin: int) -> int:
        return int(_core.epoch_end(self._n, origin, self.drop_last))

    def _elastic_length(self, origin: int, offset: int, num_replicas: int) -> int:
        return _core.layout(self._global_end(origin) - offset, num_replicas, self.drop_last)[0]

    def _compute_elastic(
        self, origin: int, offset: int, epoch: int, start: int, stop: int | None
    ) -> npt.NDArray[Any]:
        arr = self._deal.elastic_indices(origin, offset, epoch, start, stop)
        arr.flags.writeable = False
        return arr

    def _elastic_first_stop(self, start: int, length: int) -> int:
        # Per-rank and shuffled: a short first piece reads a few positions of each old share
        # it meets, so the first index comes before the rest of the epoch is computed.
        return int(self._deal.elastic_first_stop(start, length))

    def _check_epoch(self, epoch: int) -> None:
        # torch seeds its generator only to shuffle: unshuffled, any epoch is fine, as in torch.
        self._deal.check_epoch(epoch)

    def _compute(self, epoch: int, start: int, stop: int | None) -> npt.NDArray[Any]:
        arr = self._deal.indices(epoch, start, stop)
        arr.flags.writeable = False  # shared by every view handed out
        return arr

    def _window(self) -> int | None:
        # Unshuffled or in the global order, any range costs its length: stream it instead of
        # holding the whole share.
        window: int | None = self._deal.window
        return window

    def _first_stop(self, start: int) -> int:
        # In the per-rank shuffled order: the end of the block holding `start`, or the next 64
        # positions inside a long block (read by random access), so the first index is ready
        # in milliseconds instead of after the whole share.
        return self._deal.first_stop(start)
