//! Bucket batching: samples grouped by length, batches within a bucket under a size or
//! padded-token budget, and the batches dealt to the ranks in equal numbers.
//!
//! - [`quantiles`]: default bucket boundaries from length quantiles.
//! - [`plan`]: the buckets, batch sizes and a rank's batches of an epoch.
//! - [`sequential`]: NeMo Automodel's bucket-by-bucket order.

pub mod plan;
pub mod quantiles;
pub mod sequential;

pub use plan::{BatchDraw, BucketPlan, Limits};
pub use quantiles::quantile_boundaries;
pub use sequential::{SeqOrder, SequentialBuckets, SequentialConfig};
