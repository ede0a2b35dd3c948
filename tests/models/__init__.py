"""Pure-Python reference models of croupier's documented sampler semantics (issue 42).

Each model is slow and obviously right and shares no code with the implementation: croupier
is used only as an oracle for a pseudorandom order that cannot be re-derived independently
(a fresh sampler iterated uninterrupted), and every such oracle output is itself checked
against the documented invariants (multisets, counts, passes) before the model relies on it.

- :mod:`models.world`: what every rank of a world yields, ``len``, what a state's position
  means, set_epoch/set_skip/load rules and elastic resume (shared by all samplers);
- :mod:`models.distributed`, :mod:`models.mixture`, :mod:`models.bucket`: the epoch's
  global order of each sampler and its documented invariants.
"""
