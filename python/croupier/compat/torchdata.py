"""torchdata's ``StatefulDistributedSampler`` (``torchdata.stateful_dataloader.sampler``) on
croupier: torchdata's names (``yielded``, ``next_yielded``), its defaults, and its indices
(torch's ``DistributedSampler`` order by default), so ``from croupier.compat.torchdata import
StatefulDistributedSampler`` replaces torchdata's import, and a state torchdata saved
(``{"yielded": n}``, or with ``"epoch"``) loads here, mid-epoch: a run can switch samplers
without repeating or losing a sample. Its own states are croupier's (exact, with the epoch and
configuration), plus ``"yielded"``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from croupier._dist import DistInfo
from croupier._validate import check_int
from croupier.samplers._state import KEMPNERFORGE, StateFormat
from croupier.samplers.distributed import DistributedSampler

__all__ = ["TORCHDATA", "StatefulDistributedSampler"]


def _from_torchdata(state: Mapping[str, Any], mine: dict[str, Any]) -> dict[str, Any]:
    # torchdata saves no epoch (its users call set_epoch before loading): the current one.
    yielded = check_int("state['yielded']", state["yielded"], 0)
    return {**mine, "epoch": state.get("epoch", mine["epoch"]), "position": yielded}


TORCHDATA = StateFormat(
    name="torchdata's StatefulDistributedSampler",
    keys=frozenset({"yielded"}),
    optional=frozenset({"epoch"}),
    to_native=_from_torchdata,
    position_key="yielded",
)
"""``{"yielded": n}`` (optionally with ``"epoch"``), the state of torchdata's
``StatefulDistributedSampler``: ``n`` indices of the epoch (the current one unless given) are
consumed."""


class StatefulDistributedSampler(DistributedSampler):
    """torchdata's ``StatefulDistributedSampler(dataset, num_replicas=None, rank=None,
    shuffle=True, seed=0, drop_last=False)``, computed by croupier; ``order="torch"`` (the
    indices torchdata's sampler yields) unless told otherwise.

    ``yielded`` is the number of this rank's indices of the epoch consumed so far and
    ``next_yielded`` the position the next iteration starts at (``None`` when it starts the
    epoch afresh); assigning ``next_yielded`` is :meth:`set_skip`. :meth:`load_state_dict`
    takes a state of this class, of torchdata's sampler (``{"yielded": n}``, with an optional
    ``"epoch"``) or of kempnerforge's, through the base's one loading path (``TORCHDATA`` and
    ``KEMPNERFORGE`` are its state formats); anything else, a negative ``yielded`` or
    one past the epoch is refused (``ValueError``) and leaves the sampler unchanged. See
    :class:`croupier.DistributedSampler`.
    """

    _state_formats = (TORCHDATA, KEMPNERFORGE)
    _derived_state_keys = ("yielded",)

    def __init__(
        self,
        dataset: Any,
        num_replicas: int | None = None,
        rank: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        *,
        order: str = "torch",
        dist_info: DistInfo = None,
        torch_version: str | None = None,
    ) -> None:
        super().__init__(
            dataset,
            num_replicas,
            rank,
            shuffle,
            seed,
            drop_last,
            order=order,
            dist_info=dist_info,
            torch_version=torch_version,
        )

    @property
    def yielded(self) -> int:
        """This rank's indices of the epoch handed out (or skipped) so far."""
        return self._position_now()

    @property
    def next_yielded(self) -> int | None:
        """Where the next iteration starts, if not at the epoch's beginning."""
        return self._pending_start() or None

    @next_yielded.setter
    def next_yielded(self, value: int | None) -> None:
        self.set_skip(0 if value is None else value)

    def _state_at(self, epoch: int, position: int) -> dict[str, Any]:
        return {**super()._state_at(epoch, position), "yielded": position}
