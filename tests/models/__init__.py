"""Pure-Python reference models of croupier's documented sampler semantics, for the stateful
tests (``tests/test_stateful_*.py``).

Each model is a small, slow, obviously right restatement of one sampler's documented
behaviour and shares no code with ``croupier``: croupier is used only as an oracle for a
pseudorandom order that cannot be re-derived independently (a fresh sampler iterated
uninterrupted), and every such oracle output is itself checked against the documented
invariants (multisets, counts, passes) before a model relies on it.

- :mod:`models.world`: what every rank of a world yields, ``len``, what a state's position
  means, the set_epoch/set_skip/load rules and elastic resume (shared by the index and
  bucket samplers);
- :mod:`models.distributed`, :mod:`models.mixture`, :mod:`models.bucket`: each epoch's global
  order and its documented invariants;
- :mod:`models.stateful_loader`, :mod:`models.sequential_bucket`, :mod:`models.chunk`,
  :mod:`models.rank_aware`: the loader and the samplers of NeMo, annbatch and TransferQueue.
"""
