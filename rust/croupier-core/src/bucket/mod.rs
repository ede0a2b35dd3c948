//! Bucket batching: samples grouped by length, batches within a bucket under a size or
//! padded-token budget, and the batches dealt to the ranks in equal numbers.
//!
//! - `histogram`: how many samples have each length (what the boundary finders count).
//! - [`quantiles`]: bucket boundaries from length quantiles (the per-rank order's default).
//! - [`boundaries`]: bucket boundaries that minimise padding (the global order's default).
//! - [`plan`]: the buckets, batch sizes and a rank's batches of an epoch in the per-rank order.
//! - [`epoch`]: one epoch's batch plan for every world size (the global order: buckets with
//!   carried tails, batches full but a few).
//! - [`source`]: a sampler's batches of every epoch in its order ([`BucketOrder`]), the
//!   global order's epoch plans kept.
//! - [`sequential`]: NeMo Automodel's bucket-by-bucket order.

pub mod boundaries;
pub mod epoch;
mod histogram;
pub mod plan;
pub mod quantiles;
pub mod sequential;
pub mod source;

pub use boundaries::padding_boundaries;
pub use epoch::{EpochBatches, EpochDraw, KEEP_ORDERS};
pub use plan::{BatchDraw, BucketPlan, Limits};
pub use quantiles::quantile_boundaries;
pub use sequential::{SeqOrder, SequentialBuckets, SequentialConfig};
pub use source::{BucketConfig, BucketOrder, BucketSource};
