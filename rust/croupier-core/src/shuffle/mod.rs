//! Shuffling: every way croupier permutes a buffer of indices.
//!
//! - `fisher_yates`: seeded Durstenfeld Fisher–Yates over `u32`/`u64` buffers, with unbiased
//!   bounded draws and software prefetch of the swap target on large buffers.
//! - `parallel`: the full permutation of `[0, n)` on every core ([`permutation`], [`fill`];
//!   Rao–Sandelius: values dealt to cache-sized buckets, each bucket shuffled), the same for
//!   every thread count.
//! - `write_combine`: software write-combining for `parallel`'s bucket scatters (values staged
//!   in cache lines, whole lines written with non-temporal stores).
//! - `torch_randperm`: torch's CPU `randperm` reproduced exactly ([`torch_randperm()`],
//!   [`TorchRandperm`]), for `order="torch"`.
//! - `drawn_steps`: the loop of a shuffle whose stream is sequential (numpy's, torch's): the
//!   draws a block ahead, their targets prefetched, on a second thread for long buffers.
//! - `numpy_legacy`: numpy's legacy `RandomState.shuffle` reproduced exactly
//!   ([`legacy_shuffle`], [`Mt19937`] with numpy's state layout), for Megatron-Core's indices.

pub(crate) mod drawn_steps;
pub(crate) mod fisher_yates;
pub(crate) mod numpy_legacy;
pub(crate) mod parallel;
pub(crate) mod torch_randperm;
pub(crate) mod write_combine;

pub use numpy_legacy::{legacy_shuffle, legacy_shuffle_rows, Mt19937, MT_WORDS};
pub use parallel::{fill, permutation, permutation_bytes};
pub use torch_randperm::{
    randperm as torch_randperm, TorchGenerator, TorchRandperm, LARGE_N_THRESHOLD,
};
