"""Accelerate: ``prepare`` loaders of croupier samplers without dealing their data twice.

``Accelerator.prepare`` wraps every map-style loader's batches in ``BatchSamplerShard``, which
hands process ``p`` of ``P`` every ``P``-th batch: right for a sampler that yields the whole
dataset, a loss of ``(P - 1) / P`` of the data for a croupier sampler, which already yields only
its rank's share (croupier's samplers refuse to be iterated that way). :func:`prepare` calls
``accelerator.prepare`` and turns the wrapper of every loader whose sampler is croupier's into a
pass-through: every batch of the rank's share, in order, whatever its size. The prepared loader
keeps everything else Accelerate does (device placement, gradient accumulation's end of epoch,
``skip_first_batches``), and ``set_epoch`` on it reaches the croupier sampler, also after
``skip_first_batches``::

    from croupier.integrations.accelerate import prepare

    sampler = croupier.DistributedSampler(dataset, num_replicas=accelerator.num_processes,
                                          rank=accelerator.process_index, seed=0)
    loader = DataLoader(dataset, batch_size=8, sampler=sampler)
    model, optimizer, loader = prepare(accelerator, model, optimizer, loader)

To resume mid-epoch, Accelerate's documented way is exact here: ``accelerator.load_state`` and
``accelerator.skip_first_batches(loader, batches_done)`` after ``loader.set_epoch(epoch)``.
"""

from __future__ import annotations

from typing import Any

from croupier.samplers._base import StatefulSampler

__all__ = ["croupier_sampler_of", "pass_through", "prepare"]


def prepare(accelerator: Any, *objects: Any, **kwargs: Any) -> Any:
    """``accelerator.prepare(*objects, **kwargs)``, then :func:`pass_through` on every prepared
    loader whose sampler is croupier's. Returns what ``accelerator.prepare`` returns."""
    prepared = accelerator.prepare(*objects, **kwargs)
    for obj in prepared if isinstance(prepared, tuple) else (prepared,):
        if croupier_sampler_of(obj) is not None:
            pass_through(obj)
    return prepared


def croupier_sampler_of(loader: Any) -> StatefulSampler[Any, Any] | None:
    """The croupier sampler a (prepared) loader draws from, if any: its index sampler, or its
    batch sampler, found through Accelerate's and torch's wrappers."""
    seen: set[int] = set()
    todo = [getattr(loader, "batch_sampler", None), getattr(loader, "sampler", None)]
    while todo:
        obj = todo.pop()
        if obj is None or id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, StatefulSampler):
            return obj
        todo += [getattr(obj, "batch_sampler", None), getattr(obj, "sampler", None)]
    return None


def pass_through(loader: Any) -> None:
    """Makes the ``BatchSamplerShard`` of an Accelerate-prepared ``loader`` a pass-through for
    its croupier sampler, as transformers does for its own rank-aware batch sampler: one
    process's view (every batch), no padding of a short last batch, batches of any size (a
    croupier batch sampler's sizes differ by bucket), and a ``sampler`` link so that the
    loader's ``set_epoch`` reaches the croupier sampler through ``skip_first_batches`` too.
    Raises ``TypeError`` if the loader draws from no croupier sampler."""
    sampler = croupier_sampler_of(loader)
    if sampler is None:
        raise TypeError(f"{type(loader).__name__} draws from no croupier sampler")
    shard = getattr(loader, "batch_sampler", None)
    while shard is not None and type(shard).__name__ != "BatchSamplerShard":
        shard = getattr(shard, "batch_sampler", None)
    if shard is None:
        return  # one process: Accelerate did not shard
    shard.num_processes = 1
    shard.process_index = 0
    shard.even_batches = False
    if shard.batch_sampler is sampler:  # a croupier batch sampler: sizes differ by bucket
        shard.batch_size = None
    shard.sampler = (
        sampler  # DataLoaderShard.set_epoch reaches batch_sampler(.batch_sampler).sampler
    )
