"""Lightning: resume from ``ckpt_path`` on another number of devices, exactly.

A ``croupier.StatefulDataLoader`` returned from ``train_dataloader`` is saved in Lightning's
checkpoints and restored on resume, on any number of ranks: the restored loader continues the
epoch and its ``len`` is the batches the checkpoint records plus what it yields next. Lightning
counts an epoch's batches (``trainer.num_training_batches``) from ``len`` of the loader *before*
it restores the loader's state, and keeps that count for the following epochs. On the same
number of ranks the two agree (the whole epoch). On another, the resumed epoch has another
length than the new world's fresh epochs: Lightning would stop the resumed epoch early (more
ranks: each has fewer batches per fresh epoch than the resumed epoch's count) or stop the next
epochs early (fewer ranks). :class:`ElasticResume` sets the count from the restored loader
when training starts, and from the new world's loader at the start of every following epoch.

It needs no wiring: croupier registers it with Lightning's ``lightning.pytorch.callbacks_factory``
entry point (and ``pytorch_lightning.callbacks_factory``), so every ``Trainer`` gets it while
croupier is installed; it does nothing unless the training loader is a
``croupier.StatefulDataLoader``. Without the entry points (croupier on ``PYTHONPATH``, not
installed), pass it yourself: ``Trainer(callbacks=[ElasticResume()])``.
"""

from __future__ import annotations

import functools
import math
from typing import Any

__all__ = ["callbacks", "pytorch_lightning_callbacks"]  # and ElasticResume (made on first use)


def _sync(trainer: Any, resumed: bool) -> None:
    """Sets Lightning's count of the epoch's batches (``fit_loop.max_batches``) to what the
    training loader yields (its ``len`` under ``limit_train_batches``), when a croupier loader
    is among the training loaders; ``resumed``: the data fetcher's count too (it was taken
    before the loader's state was restored)."""
    from croupier.loader import StatefulDataLoader

    fit_loop = trainer.fit_loop
    combined = getattr(fit_loop, "_combined_loader", None)
    if combined is None:
        return
    loaders = list(combined.flattened)
    if not any(isinstance(dl, StatefulDataLoader) for dl in loaders):
        return
    counts = []
    for dl in loaders:
        try:
            length: float = len(dl)
        except TypeError:
            length = math.inf
        counts.append(_limited(length, trainer.limit_train_batches))
    mode = getattr(combined, "_mode", "max_size_cycle")
    batches = min(counts) if mode == "min_size" else max(counts)
    if batches == math.inf or batches == fit_loop.max_batches:
        return
    fit_loop.max_batches = int(batches)
    fetcher = getattr(fit_loop, "_data_fetcher", None)
    if resumed and fetcher is not None and getattr(fetcher, "length", None) is not None:
        fetcher.length = int(batches)  # batches of the epoch, the restored ones included
    interval = trainer.val_check_interval
    if isinstance(interval, float) and getattr(trainer, "_val_check_time_interval", None) is None:
        trainer.val_check_batch = max(1, int(batches * interval))


def _limited(length: float, limit: float) -> float:
    """Lightning's count of an epoch's batches under ``limit_train_batches``."""
    if length == 0 or length == math.inf:
        return length
    if isinstance(limit, int):
        return min(length, limit)
    return int(length * limit)


@functools.cache
def _callback_class(package: str) -> type:
    """``ElasticResume`` for ``package``'s ``Callback`` (``lightning.pytorch`` or
    ``pytorch_lightning``), made on first use so Lightning is imported only then."""
    import importlib

    base = importlib.import_module(package).Callback

    class ElasticResume(base):  # type: ignore[misc, valid-type]
        """Makes Lightning train exactly the rest of the epoch after a resume from
        ``ckpt_path`` on another number of ranks, and then whole epochs of the new world:
        sets ``trainer.num_training_batches`` from the restored ``croupier.StatefulDataLoader``
        when training starts, and from the loader at every epoch's start. A no-op for other
        loaders, and on the same number of ranks (the counts already agree)."""

        def on_train_start(self, trainer: Any, pl_module: Any) -> None:
            _sync(trainer, resumed=True)

        def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
            _sync(trainer, resumed=False)

        def __repr__(self) -> str:
            return "ElasticResume()"

    ElasticResume.__module__ = __name__
    return ElasticResume


def _make(package: str) -> Any:
    return _callback_class(package)()


def callbacks() -> list[Any]:
    """Entry point of ``lightning.pytorch.callbacks_factory``: ``[ElasticResume()]``."""
    return [_make("lightning.pytorch")]


def pytorch_lightning_callbacks() -> list[Any]:
    """Entry point of ``pytorch_lightning.callbacks_factory``: ``[ElasticResume()]`` for the
    standalone ``pytorch_lightning`` package."""
    return [_make("pytorch_lightning")]


def __getattr__(name: str) -> Any:
    if name == "ElasticResume":  # the class of the unified ``lightning`` package
        return _callback_class("lightning.pytorch")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
