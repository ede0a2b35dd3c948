//! croupier-core: seeded, reproducible index generation for data-parallel training.
//!
//! Pure Rust, no Python: every function here is a deterministic map from its arguments to an
//! index buffer, identical on every platform and for every thread count. The Python bindings
//! (`rust/croupier-py`) only convert arguments and hand the buffers over.
//!
//! - [`stream`]: the random streams, derived from `(seed, epoch, purpose, id)`, and unbiased
//!   bounded draws.
//! - [`cellrng`], [`hypergeom`]: keyed per-cell generators and exact, platform-independent
//!   hypergeometric draws.
//! - [`split`]: the values of chosen classes of a uniform random partition of `[0, n)`, by
//!   recursive hypergeometric splitting, without computing the other classes.
//! - [`permute`]: Fisher–Yates permutations over `u32` or `u64` buffers; [`parshuffle`]: full
//!   permutations on every core (Rao–Sandelius); `seekable`: a bucket shuffle whose positions
//!   can be read one by one, for the long blocks of a rank's share.
//! - [`partition`]: torch's `DistributedSampler` arithmetic (padding, `drop_last`, striding)
//!   and one rank's share of an epoch.
//! - [`torch`]: torch's CPU `randperm`, reproduced exactly (`order="torch"`).

pub mod cellrng;
mod combine;
pub mod error;
pub mod hypergeom;
pub mod index;
pub mod parshuffle;
pub mod partition;
pub mod permute;
mod seekable;
pub mod share;
pub mod split;
pub mod stream;
pub mod torch;

#[cfg(test)]
mod testkit;

pub use error::{Error, Result};
pub use index::{Index, Indices};
pub use parshuffle::permutation;
pub use partition::{first_stop, rank_indices, rank_range, Layout, Order};
pub use stream::{Purpose, Stream};
