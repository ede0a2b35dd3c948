"""Reference models of croupier's documented sampler semantics for the stateful tests.

Each module is a small, slow, obviously right pure-Python restatement of one sampler's
documented behaviour; it shares no code with ``croupier`` (an oracle for a pseudorandom order
that cannot be re-derived independently is the only use of croupier a model may make).
"""
