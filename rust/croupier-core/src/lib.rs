//! croupier-core: seeded, reproducible index generation for data-parallel training.
//!
//! Pure Rust, no Python: every public function is a deterministic map from its arguments to an
//! index buffer, identical on every platform and for every thread count.
//!
//! # Layers
//!
//! 1. This crate: the math, with no Python types and no checkpoint state.
//! 2. The PyO3 binding crate (`rust/croupier-py`, the `croupier._core` extension module): it
//!    converts arguments, refuses calls that cannot fit in memory, and hands the buffers to
//!    numpy. It imports everything from this crate's root.
//! 3. The Python package (`python/croupier`): samplers with checkpoint state, built on the
//!    binding.
//!
//! # Map
//!
//! Each folder is one capability:
//!
//! - [`shuffle`]: permuting buffers: seeded Fisher–Yates, the parallel full permutation
//!   ([`permutation`], [`fill`]) with its write-combining scatters, and torch's CPU `randperm`
//!   reproduced exactly ([`torch_randperm()`]).
//! - [`deal`]: dealing an epoch to data-parallel ranks: torch's padding and striding
//!   ([`Layout`]; a rank's place in its world, [`Deal`]), a rank's positions in either order
//!   ([`rank_range`], [`first_stop`], [`Order`], drawn as a [`Draw`] says), and for the
//!   per-rank order (`order="per_rank"`, [`Order::PerRank`]) a rank's share computed alone (class splitting by exact hypergeometric
//!   draws with keyed per-cell generators, per-block orders, a seekable order for long
//!   blocks).
//!
//! - [`mix`]: weighted mixtures of datasets; [`bucket`]: bucket batching by length;
//!   [`pack`]: documents packed into fixed-length samples (Megatron-Core's sample index);
//!   [`chunk`]: chunked reading plans for on-disk arrays.
//!
//! The root holds what every folder uses (crate-private modules; what callers need is
//! re-exported here):
//!
//! - `draw`: the random draws everything is made of, each keyed by `(seed, epoch, purpose,
//!   id)`: keyed bulk generators, per-cell generators, exact hypergeometric draws, a keyed
//!   permutation read position by position.
//! - `stream`: the random streams, keyed by `(seed, epoch, purpose, id)`, key folding, and
//!   unbiased bounded draws.
//! - `index`: index element types ([`Index`]: `u32` up to [`U32_MAX_LEN`] samples, `u64`
//!   above, up to [`MAX_LEN`]) and owned buffers ([`Indices`]).
//! - `error`: the one error type, [`Error`].
//! - `cancel`: cooperative cancellation of long calls ([`Cancel`]), looked at by every long
//!   loop.
//! - `prefault`: a helper thread that faults a caller's fresh output in ahead of the threads
//!   writing it.
//!
//! Folders depend on the root; `deal` also uses `shuffle` (Fisher–Yates, torch's `randperm`,
//! the bucket kernels of the parallel permutation); `shuffle` uses nothing in `deal`.

#![warn(missing_docs)]

pub mod bucket;
mod cancel;
pub mod chunk;
pub mod deal;
mod draw;
mod error;
mod index;
pub mod mix;
pub mod pack;
mod prefault;
pub mod shuffle;
mod simd;
mod stream;

#[cfg(test)]
mod testkit;

pub use cancel::Cancel;
pub use deal::{
    first_stop, rank_range, rank_range_bytes, rank_range_is_inline, Deal, Draw, Elastic, Layout,
    Order,
};
pub use draw::random_access::RandomAccessPermutation;
pub use error::{Error, Result};
pub use index::{
    advise_huge, index_bytes, range_par, tile_par, try_with_capacity_huge, Index, Indices, MAX_LEN,
    U32_MAX_LEN,
};
pub use mix::{
    exhaustive_greatest_error_blend, greatest_error_blend, BalancedBoundary, Interleaving, Mixture,
    MixtureConfig, PhaseSpec, BLEND_MAX_DATASETS, BLEND_WEIGHT_SUM_TOLERANCE,
};
pub use pack::{sample_index, SampleIndexSpec, SampleIndexValue};
pub use shuffle::{
    fill, permutation, permutation_bytes, torch_randperm, TorchRandperm, LARGE_N_THRESHOLD,
};
