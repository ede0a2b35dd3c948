"""Integrations with the training frameworks whose data paths re-shard every sampler.

croupier's samplers already deal the data to the ranks. Lightning needs nothing (its
``isinstance`` check recognises them; docs/trainers.md), but Accelerate's ``prepare`` (and so the
Hugging Face Trainer) wraps every loader in a sharding batch sampler. The modules here make
that wrapper a pass-through for croupier's samplers; each imports its framework only when
used:

- :mod:`croupier.integrations.accelerate`: ``prepare(accelerator, *objects)``.
- :mod:`croupier.integrations.transformers`: ``CroupierTrainerMixin`` for ``Trainer``.
- :mod:`croupier.integrations.lightning`: ``ElasticResume``, the callback (registered through
  Lightning's entry points) for a resume from ``ckpt_path`` on another number of devices.
"""
