//! Random draws: the building blocks every sampler's randomness is made of, each keyed by
//! `(seed, epoch, purpose, id)` so that every rank draws the same value for the same thing
//! without communicating, identical on every platform and for every thread count.
//!
//! - `keyed`: a fast generator (xoshiro256++) seeded from a keyed ChaCha8 stream, for bulk
//!   draws (the permutation's buckets, a mixture's interleave).
//! - `cell_rng`: the keyed per-cell generators (SplitMix64) that class splitting and the
//!   seekable shuffles draw from, so that every rank makes the same decision for a cell.
//! - `hypergeom`: exact hypergeometric draws, bit-identical on every platform (no libm).
//! - `prp`: a keyed pseudo-random permutation of `[0, n)` whose positions are read one by one
//!   (a chunk order that is never materialised).
//! - `random_access`: the world-size-invariant order, a keyed permutation of `[0, n)` for any
//!   `n` read at any position, in bulk and in parallel (`order="global"`).

pub(crate) mod cell_rng;
pub(crate) mod hypergeom;
pub(crate) mod keyed;
pub(crate) mod prp;
pub(crate) mod random_access;
