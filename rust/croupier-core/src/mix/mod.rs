//! Weighted mixtures of many datasets: exact per-dataset counts, a seekable uniform
//! interleave, and per-dataset pass streams dealt to the ranks.
//!
//! - [`counts`]: temperature-scaled probabilities and largest-remainder counts.
//! - `passes`: one dataset's stream on one rank, pass after pass.
//! - `interleave`: which dataset each position of a phase draws from.
//! - [`mixture`]: a rank's epoch, phase by phase, computed over contiguous buffers.
//! - `global`: the world-size-invariant order, one global sequence read by random access.
//! - `balanced`: the balanced interleave, every prefix within one sample of its share.
//! - [`greatest_error`]: Megatron-Core's greedy blend (and its exhaustive form), exactly.
//! - [`shape`]: an epoch's positions per order and world size, and where a resume's fall.

pub(crate) mod balanced;
pub mod counts;
pub(crate) mod global;
pub mod greatest_error;
pub(crate) mod interleave;
pub mod mixture;
pub(crate) mod passes;
pub mod shape;

pub use counts::{largest_remainder, phase_counts, probabilities};
pub use global::{BalancedBoundary, Interleaving};
pub use greatest_error::{
    exhaustive_greatest_error_blend, greatest_error_blend, BLEND_MAX_DATASETS,
    BLEND_WEIGHT_SUM_TOLERANCE,
};
pub use mixture::{pass_shares, Mixture, MixtureConfig, PhaseSpec, MIX_FIRST_STOP};
pub use shape::{EpochShape, GLOBAL_WINDOW};
