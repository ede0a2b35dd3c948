//! `Buckets`: length buckets and any rank's batches of any epoch, in the order chosen at
//! construction (`BucketBatchSampler`; `croupier_core::bucket::BucketSource`).

use std::sync::Arc;

use croupier_core::bucket::{BucketConfig, BucketOrder, BucketSource, EpochDraw, Limits};
use croupier_core::Error;
use numpy::IntoPyArray;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::config::{config, Config};
use crate::runtime::{core, long, sized_long, to_numpy};

/// Samples from which building the buckets, or reading batches, runs interruptibly (tens of
/// milliseconds and more; Ctrl-C is heard within a few milliseconds of the core's next look).
const LONG_FROM: u64 = 1 << 20;

config! {
    /// How samples are grouped, batched and ordered (`Buckets(lengths, **config)`).
    struct BucketsConfig {
        /// Bucket boundaries, or `None` for `num_buckets` buckets found the order's way.
        boundaries: Option<Vec<u64>>,
        num_buckets: u64,
        batch_size: Option<u64>,
        max_tokens: Option<u64>,
        /// Batch sizes are rounded down to a multiple of this.
        multiple: u64,
        /// `L + L**2 / quadratic` tokens per sample of length `L`, with `max_tokens`.
        quadratic: Option<u64>,
        /// A sample longer than `max_tokens` is served alone (else the Python layer refused it).
        oversized_alone: bool,
        /// Only full batches of `batch_size` (`drop_last` without `max_tokens`).
        full_batches: bool,
        /// `"global"` or `"per_rank"` (`BucketBatchSampler`'s names).
        order: String,
        /// The global order's run length (`None`: the default, 64); the per-rank order has
        /// no runs and takes `None` only.
        sync: Option<u64>,
        seed: u64,
        /// Shuffle the samples within each bucket.
        shuffle: bool,
        /// Shuffle the batch order (`bucket_order="shuffled"`).
        shuffle_batches: bool,
    }
}

config! {
    /// Which rank's batches (`Buckets.range(epoch, start, stop, **deal)`).
    struct BatchDeal {
        num_replicas: u64,
        rank: u64,
        drop_last: bool,
        /// `(origin, offset)`: the rest of an epoch first dealt over `origin` ranks, continued on
        /// `num_replicas` ranks from global batch position `offset` (an elastic resume).
        elastic: Option<(u64, u64)>,
    }
}

impl BucketsConfig {
    /// The core's configuration, the order's name and `sync` checked (before any work).
    fn core(self) -> PyResult<BucketConfig> {
        let order =
            match (self.order.as_str(), self.sync) {
                ("global", sync) => BucketOrder::Global {
                    sync: sync.unwrap_or(EpochDraw::default().sync),
                },
                ("per_rank", None) => BucketOrder::PerRank,
                ("per_rank", Some(_)) => return Err(PyValueError::new_err(
                    "sync applies to the global order (order='global'); the per-rank order has \
                     no runs",
                )),
                (other, _) => {
                    return Err(PyValueError::new_err(format!(
                        "order must be one of 'global', 'per_rank', got {other:?}"
                    )))
                }
            };
        if let BucketOrder::Global { sync } = order {
            core(EpochDraw::check_sync(sync))?;
        }
        Ok(BucketConfig {
            boundaries: self.boundaries,
            num_buckets: self.num_buckets,
            limits: Limits {
                batch_size: self.batch_size,
                max_tokens: self.max_tokens,
                multiple: self.multiple,
                quadratic: self.quadratic,
                oversized_alone: self.oversized_alone,
                full_batches: self.full_batches,
                carry: false, // the order's (BucketSource::new sets it)
            },
            order,
            seed: self.seed,
            shuffle: self.shuffle,
            shuffle_batches: self.shuffle_batches,
        })
    }
}

/// Samples grouped into length buckets, from which any rank's batches of any epoch are read
/// in the order chosen at construction; the global order's epoch plans are kept for the reads
/// that follow.
#[pyclass(module = "croupier._core", frozen)]
pub(crate) struct Buckets {
    source: Arc<BucketSource>,
}

#[pymethods]
impl Buckets {
    #[new]
    #[pyo3(signature = (lengths, **config))]
    fn new(
        py: Python<'_>,
        lengths: &Bound<'_, PyAny>,
        config: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Self> {
        let config = BucketsConfig::from_kwargs(config, "Buckets")?.core()?;
        fn build<L: Copy + Into<u64> + Send + Sync>(
            lengths: &[L],
            config: BucketConfig,
        ) -> Result<Buckets, Error> {
            Ok(Buckets {
                source: Arc::new(BucketSource::new(lengths, config)?),
            })
        }
        // Copied out of the borrowed numpy memory while attached; the work runs detached,
        // interruptibly over many lengths.
        if let Ok(arr) = lengths.extract::<numpy::PyReadonlyArray1<'_, u32>>() {
            let lengths: Vec<u32> = arr.as_array().to_vec();
            return long(py, lengths.len() as u64 >= LONG_FROM, move || {
                build(&lengths, config)
            });
        }
        if let Ok(arr) = lengths.extract::<numpy::PyReadonlyArray1<'_, u64>>() {
            let lengths: Vec<u64> = arr.as_array().to_vec();
            return long(py, lengths.len() as u64 >= LONG_FROM, move || {
                build(&lengths, config)
            });
        }
        Err(PyTypeError::new_err(
            "lengths must be a 1-D numpy array of uint32 or uint64",
        ))
    }

    /// The bucket boundaries in use (a bucket is `[b_j, b_{j+1})`).
    #[getter]
    fn boundaries(&self) -> Vec<u64> {
        self.source.boundaries().to_vec()
    }

    /// The global order's run length, `None` in the per-rank order.
    #[getter]
    fn sync(&self) -> Option<u64> {
        match self.source.order() {
            BucketOrder::Global { sync } => Some(sync),
            BucketOrder::PerRank => None,
        }
    }

    /// A fingerprint of the lengths (16 hex digits), for checkpoints.
    #[getter]
    fn digest(&self) -> String {
        format!("{:016x}", self.source.plan().digest())
    }

    /// Batches of every epoch over all ranks, before padding or cutting.
    #[getter]
    fn batches(&self) -> u64 {
        self.source.batches()
    }

    /// Per bucket: `(members, batch size, batches per epoch, longest sample)`; the last
    /// entry holds the samples longer than `max_tokens`.
    fn buckets(&self) -> Vec<(u64, u64, u64, u64)> {
        self.source.buckets()
    }

    /// The epochs whose global batch plans are kept, oldest first.
    #[getter]
    fn kept_epochs(&self) -> Vec<u64> {
        self.source.kept_epochs()
    }

    /// The batches `[start, stop)` of `epoch` that `deal` (a [`BatchDeal`]: the rank, its
    /// world, an elastic rest) names: `(indices, offsets)`, batch `i` being
    /// `indices[offsets[i]:offsets[i + 1]]`.
    #[pyo3(signature = (epoch, start, stop, **deal))]
    fn range<'py>(
        &self,
        py: Python<'py>,
        epoch: u64,
        start: u64,
        stop: u64,
        deal: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyAny>)> {
        let d = BatchDeal::from_kwargs(deal, "Buckets.range")?;
        if let Some((origin, offset)) = d.elastic {
            // Refused before any work.
            core(
                self.source
                    .elastic(origin, offset, d.num_replicas, d.drop_last),
            )?;
        }
        let deal = croupier_core::Deal {
            num_replicas: d.num_replicas,
            rank: d.rank,
            drop_last: d.drop_last,
        };
        let bytes = self.source.range_bytes(epoch, &(start..stop));
        let what = if bytes > self.source.plan().range_bytes(start, stop) {
            "the epoch's bucket orders and this rank's batches"
        } else {
            "this rank's batches"
        };
        let source = Arc::clone(&self.source);
        // Buckets are cut whole: interruptible over many samples, whatever the batches.
        let long = source.len() >= LONG_FROM;
        let (flat, offsets) = sized_long(py, bytes, what, long, move || {
            source.range(epoch, deal, d.elastic, start..stop)
        })?;
        Ok((to_numpy(py, flat), offsets.into_pyarray(py).into_any()))
    }

    /// Batches per rank for the rest of an epoch first dealt over `origin` ranks, continued
    /// on `num_replicas` ranks from global batch position `offset` (an elastic resume).
    fn elastic_batches(
        &self,
        origin: u64,
        offset: u64,
        num_replicas: u64,
        drop_last: bool,
    ) -> PyResult<u64> {
        Ok(core(self.source.elastic(origin, offset, num_replicas, drop_last))?.num_samples())
    }
}
