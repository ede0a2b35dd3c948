//! `SequentialBuckets`: NeMo Automodel's bucket-by-bucket batches (`SequentialBucketSampler`).

use numpy::IntoPyArray;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::config::{config, Config};
use crate::order::Order;
use crate::runtime::{core, sized_long, to_numpy};

config! {
    /// How the buckets are dealt (`SequentialBuckets(buckets, sizes, **config)`).
    struct SequentialConfig {
        num_replicas: u64,
        rank: u64,
        drop_last: bool,
        /// Shuffle the order of the buckets.
        shuffle_buckets: bool,
        /// Shuffle the samples within each bucket.
        shuffle_within: bool,
        order: Order,
    }
}

impl TryFrom<&SequentialConfig> for croupier_core::bucket::SequentialConfig {
    type Error = PyErr;

    fn try_from(c: &SequentialConfig) -> PyResult<Self> {
        Ok(croupier_core::bucket::SequentialConfig {
            deal: croupier_core::Deal {
                num_replicas: c.num_replicas,
                rank: c.rank,
                drop_last: c.drop_last,
            },
            shuffle_buckets: c.shuffle_buckets,
            shuffle_within: c.shuffle_within,
            order: match c.order.core() {
                croupier_core::Order::PerRank => croupier_core::bucket::SeqOrder::Own,
                croupier_core::Order::Torch(v) => croupier_core::bucket::SeqOrder::Torch(v),
                croupier_core::Order::Global => {
                    return Err(PyValueError::new_err(
                        "SequentialBuckets takes order PER_RANK or a TORCH order, got GLOBAL",
                    ))
                }
            },
        })
    }
}

/// NeMo Automodel's bucket-by-bucket batches on one rank
/// (`croupier_core::bucket::SequentialBuckets`).
#[pyclass(module = "croupier._core", frozen)]
pub(crate) struct SequentialBuckets {
    inner: std::sync::Arc<croupier_core::bucket::SequentialBuckets>,
    order: Order,
}

#[pymethods]
impl SequentialBuckets {
    #[new]
    #[pyo3(signature = (buckets, sizes, **config))]
    fn new(
        buckets: Vec<Vec<u64>>,
        sizes: Vec<u64>,
        config: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Self> {
        let config = SequentialConfig::from_kwargs(config, "SequentialBuckets")?;
        let inner = core(croupier_core::bucket::SequentialBuckets::new(
            &buckets,
            &sizes,
            &croupier_core::bucket::SequentialConfig::try_from(&config)?,
        ))?;
        Ok(SequentialBuckets {
            inner: std::sync::Arc::new(inner),
            order: config.order,
        })
    }

    /// Refuses an epoch the order cannot draw with `seed` (torch's: `seed + epoch` at most
    /// `2**64 - 1`; the buckets are always shuffled).
    fn check_epoch(&self, seed: u64, epoch: u64) -> PyResult<()> {
        self.order.check_epoch(true, seed, epoch)
    }

    /// Batches per rank and epoch.
    fn __len__(&self) -> usize {
        self.inner.len() as usize
    }

    /// Batches of bucket `j` (in the dataset's sorted key order) on every rank.
    fn bucket_batches(&self, j: usize) -> u64 {
        self.inner.bucket_batches(j)
    }

    /// This rank's batches `[start, stop)` of `epoch`: `(indices, offsets)`.
    fn range<'py>(
        &self,
        py: Python<'py>,
        seed: u64,
        epoch: u64,
        start: u64,
        stop: u64,
    ) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyAny>)> {
        let bytes = self.inner.range_bytes();
        let inner = std::sync::Arc::clone(&self.inner);
        // Buckets shuffled whole: interruptible over many samples, whatever the batches.
        let long = inner.range_bytes() / 8 >= 1 << 20; // the samples
        let (flat, offsets) = sized_long(py, bytes, "this rank's batches", long, move || {
            inner.range(seed, epoch, start, stop)
        })?;
        Ok((to_numpy(py, flat), offsets.into_pyarray(py).into_any()))
    }
}
