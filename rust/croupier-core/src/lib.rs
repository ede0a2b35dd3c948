//! croupier-core: seeded, reproducible index generation for data-parallel training.
//!
//! Pure Rust, no Python: every public function is a deterministic map from its arguments to an
//! index buffer, identical on every platform and for every thread count. The PyO3 binding crate
//! (`rust/croupier-py`) only converts arguments and hands the buffers to numpy; the Python
//! package (`python/croupier`) turns them into samplers with checkpoint state.
//!
//! # Map
//!
//! Each folder is one capability:
//!
//! - [`shuffle`]: permuting buffers: seeded Fisher–Yates, the parallel full permutation
//!   ([`permutation`], [`fill`]) with its write-combining scatters, and torch's CPU `randperm`
//!   reproduced exactly ([`torch_randperm()`]).
//! - [`deal`]: dealing an epoch to data-parallel ranks: torch's padding and striding
//!   ([`Layout`]), a rank's positions in either order ([`rank_range`], [`Order`]), and for
//!   `order="fast"` a rank's share computed alone (class splitting by exact hypergeometric
//!   draws, per-block orders, a seekable order for long blocks).
//!
//! The root holds what every folder uses: [`stream`] (the random streams, keyed by
//! `(seed, epoch, purpose, id)`, and unbiased bounded draws), `cell_rng` (keyed per-cell
//! generators for the splitting trees), [`index`] (element types and owned buffers), [`error`].
//! Weighted mixtures and bucket batching will get folders of their own (`mix/`, `batch/`).

mod cell_rng;
pub mod deal;
pub mod error;
pub mod index;
pub mod shuffle;
pub mod stream;

#[cfg(test)]
mod testkit;

pub use deal::{first_stop, rank_indices, rank_range, rank_range_bytes, Layout, Order};
pub use error::{Error, Result};
pub use index::{index_bytes, Index, Indices, MAX_LEN, U32_MAX_LEN};
pub use shuffle::{
    fill, permutation, permutation_bytes, torch_randperm, TorchRandperm, LARGE_N_THRESHOLD,
};
pub use stream::{Purpose, Stream};
