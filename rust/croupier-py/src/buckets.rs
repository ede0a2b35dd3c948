//! `Buckets`: token-budget length buckets and a rank's batches of any epoch
//! (`BucketBatchSampler`).

use croupier_core::Error;
use numpy::IntoPyArray;
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::config::{config, Config};
use crate::runtime::{core, long, sized_long, to_numpy};

/// Samples from which building a plan, or an epoch's plan, runs interruptibly (tens of
/// milliseconds and more; Ctrl-C is heard within a few milliseconds of the core's next look).
const LONG_FROM: u64 = 1 << 20;

config! {
    /// How samples are grouped and batched (`Buckets(lengths, **config)`).
    struct BucketsConfig {
        /// Bucket boundaries, or `None` for `num_buckets` quantile buckets.
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
        /// The global order's plan: quantile buckets replaced by padding-optimal ones, and
        /// batches filled to `max_tokens` with their running longest sample.
        global_plan: bool,
    }
}

config! {
    /// Which rank's batches, dealt how (`Buckets.range(epoch, start, stop, **deal)`).
    struct BatchDeal {
        num_replicas: u64,
        rank: u64,
        drop_last: bool,
        seed: u64,
        /// Shuffle the samples within each bucket.
        shuffle: bool,
        /// Shuffle the batch order (`bucket_order="shuffled"`).
        shuffle_batches: bool,
        /// `(origin, offset)`: the rest of an epoch first dealt over `origin` ranks, continued on
        /// `num_replicas` ranks from global batch position `offset` (an elastic resume).
        elastic: Option<(u64, u64)>,
    }
}

impl BatchDeal {
    /// The rank, its world and `drop_last`.
    fn deal(&self) -> croupier_core::Deal {
        croupier_core::Deal {
            num_replicas: self.num_replicas,
            rank: self.rank,
            drop_last: self.drop_last,
        }
    }

    /// How epoch `epoch`'s batches are drawn.
    fn draw(&self, epoch: u64) -> croupier_core::bucket::BatchDraw {
        croupier_core::bucket::BatchDraw {
            seed: self.seed,
            epoch,
            shuffle: self.shuffle,
            shuffle_batches: self.shuffle_batches,
        }
    }
}

impl BucketsConfig {
    /// The core's limits of a batch.
    fn limits(&self) -> croupier_core::bucket::Limits {
        croupier_core::bucket::Limits {
            batch_size: self.batch_size,
            max_tokens: self.max_tokens,
            multiple: self.multiple,
            quadratic: self.quadratic,
            oversized_alone: self.oversized_alone,
            full_batches: self.full_batches,
            fill_to_budget: self.global_plan,
        }
    }
}

/// Samples grouped into length buckets with their batch sizes (`croupier_core::BucketPlan`),
/// from which a rank's batches of any epoch are read.
#[pyclass(module = "croupier._core", frozen)]
pub(crate) struct Buckets {
    plan: std::sync::Arc<croupier_core::bucket::BucketPlan>,
    boundaries: Vec<u64>,
}

impl Buckets {
    fn build<L: Copy + Into<u64> + Send + Sync>(
        lengths: &[L],
        boundaries: Option<Vec<u64>>,
        num_buckets: u64,
        limits: croupier_core::bucket::Limits,
    ) -> Result<Self, Error> {
        let boundaries = match boundaries {
            Some(b) => b,
            None if limits.fill_to_budget => croupier_core::bucket::padding_boundaries(
                lengths,
                num_buckets.max(1),
                limits.quadratic.filter(|_| limits.max_tokens.is_some()),
                |l| limits.fits(l),
            ),
            None => croupier_core::bucket::quantile_boundaries(lengths, num_buckets.max(1)),
        };
        let plan = croupier_core::bucket::BucketPlan::new(lengths, &boundaries, limits)?;
        Ok(Buckets {
            plan: std::sync::Arc::new(plan),
            boundaries,
        })
    }
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
        let config = BucketsConfig::from_kwargs(config, "Buckets")?;
        let limits = config.limits();
        let (boundaries, num_buckets) = (config.boundaries, config.num_buckets);
        // Copied out of the borrowed numpy memory while attached; the work runs detached,
        // interruptibly over many lengths.
        if let Ok(arr) = lengths.extract::<numpy::PyReadonlyArray1<'_, u32>>() {
            let lengths: Vec<u32> = arr.as_array().to_vec();
            return long(py, lengths.len() as u64 >= LONG_FROM, move || {
                Self::build(&lengths, boundaries, num_buckets, limits)
            });
        }
        if let Ok(arr) = lengths.extract::<numpy::PyReadonlyArray1<'_, u64>>() {
            let lengths: Vec<u64> = arr.as_array().to_vec();
            return long(py, lengths.len() as u64 >= LONG_FROM, move || {
                Self::build(&lengths, boundaries, num_buckets, limits)
            });
        }
        Err(PyTypeError::new_err(
            "lengths must be a 1-D numpy array of uint32 or uint64",
        ))
    }

    /// The bucket boundaries in use (a bucket is `[b_j, b_{j+1})`).
    #[getter]
    fn boundaries(&self) -> Vec<u64> {
        self.boundaries.clone()
    }

    /// A fingerprint of the lengths (16 hex digits), for checkpoints.
    #[getter]
    fn digest(&self) -> String {
        format!("{:016x}", self.plan.digest())
    }

    /// Batches of an epoch over all ranks, before padding or cutting.
    #[getter]
    fn batches(&self) -> u64 {
        self.plan.batches()
    }

    /// Per bucket: `(members, batch size, batches, longest sample)`; the last entry holds the
    /// samples longer than `max_tokens`.
    fn buckets(&self) -> Vec<(u64, u64, u64, u64)> {
        self.plan.buckets()
    }

    /// The batches `[start, stop)` of `epoch` that `deal` (a [`BatchDeal`]: the rank, its
    /// world, the shuffles, an elastic rest) names: `(indices, offsets)`, batch `i` being
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
        let el = d
            .elastic
            .map(|(origin, offset)| self.elastic(origin, offset, d.num_replicas, d.drop_last))
            .transpose()?;
        let (rank_deal, draw) = (d.deal(), d.draw(epoch));
        let bytes = self.plan.range_bytes(start, stop);
        let plan = std::sync::Arc::clone(&self.plan);
        // Buckets computed whole: interruptible over many samples, whatever the batches.
        let long = plan.len() >= LONG_FROM;
        let (flat, offsets) =
            sized_long(py, bytes, "this rank's batches", long, move || match el {
                None => plan.rank_batches_range(rank_deal, draw, start..stop),
                Some(el) => plan.elastic_batches_range(&el, rank_deal.rank, draw, start..stop),
            })?;
        Ok((to_numpy(py, flat), offsets.into_pyarray(py).into_any()))
    }

    /// Batches of every epoch of the global order, over all ranks, before padding or cutting.
    #[getter]
    fn global_batches(&self) -> u64 {
        self.plan.global_batches()
    }

    /// Per bucket, its batches in every epoch of the global order (the oversized one last).
    fn global_bucket_batches(&self) -> Vec<u64> {
        self.plan.global_bucket_batches()
    }

    /// The global batch plan of `epoch` (`BucketBatchSampler(order="global")`): the runs
    /// placed, and with `keep` every bucket cut now and kept (up to `KEEP_ORDERS` samples);
    /// without, each read cuts the buckets it reads from.
    #[pyo3(signature = (epoch, *, seed, shuffle, shuffle_batches, sync, keep))]
    #[allow(clippy::too_many_arguments)]
    fn epoch(
        &self,
        py: Python<'_>,
        epoch: u64,
        seed: u64,
        shuffle: bool,
        shuffle_batches: bool,
        sync: u64,
        keep: bool,
    ) -> PyResult<BucketEpoch> {
        let draw = epoch_draw(epoch, seed, shuffle, shuffle_batches, sync);
        let plan = std::sync::Arc::clone(&self.plan);
        let bytes = if keep {
            croupier_core::bucket::EpochBatches::new_bytes(&plan)
        } else {
            0
        };
        let long_anyway = plan.len() >= LONG_FROM;
        let batches = sized_long(
            py,
            bytes,
            "the epoch's bucket orders",
            long_anyway,
            move || {
                if keep {
                    croupier_core::bucket::EpochBatches::new(&plan, draw)
                } else {
                    croupier_core::bucket::EpochBatches::lazy(&plan, draw)
                }
            },
        )?;
        Ok(BucketEpoch {
            plan: std::sync::Arc::clone(&self.plan),
            batches: std::sync::Arc::new(batches),
        })
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
        Ok(self
            .elastic(origin, offset, num_replicas, drop_last)?
            .num_samples())
    }
}

fn epoch_draw(
    epoch: u64,
    seed: u64,
    shuffle: bool,
    shuffle_batches: bool,
    sync: u64,
) -> croupier_core::bucket::EpochDraw {
    croupier_core::bucket::EpochDraw {
        seed,
        epoch,
        shuffle,
        shuffle_batches,
        sync,
    }
}

impl Buckets {
    fn elastic(
        &self,
        origin: u64,
        offset: u64,
        num_replicas: u64,
        drop_last: bool,
    ) -> PyResult<croupier_core::Elastic> {
        core(croupier_core::Elastic::new(
            self.plan.batches(),
            origin,
            drop_last,
            offset,
            num_replicas,
        ))
    }
}

config! {
    /// Which rank's batches of an epoch plan (`BucketEpoch.range(start, stop, **deal)`).
    struct EpochDeal {
        num_replicas: u64,
        rank: u64,
        drop_last: bool,
        /// `(origin, offset)`: the rest of the epoch first dealt over `origin` ranks, continued
        /// on `num_replicas` ranks from global batch position `offset` (an elastic resume).
        elastic: Option<(u64, u64)>,
    }
}

/// One epoch's global batch plan (`croupier_core::bucket::EpochBatches`), the same for every
/// world size, from which any rank's batches are read.
#[pyclass(module = "croupier._core", frozen)]
pub(crate) struct BucketEpoch {
    plan: std::sync::Arc<croupier_core::bucket::BucketPlan>,
    batches: std::sync::Arc<croupier_core::bucket::EpochBatches>,
}

#[pymethods]
impl BucketEpoch {
    /// Batches in the epoch over all ranks, before padding or cutting.
    #[getter]
    fn batches(&self) -> u64 {
        self.batches.batches()
    }

    /// Batches per rank for the rest of the epoch first dealt over `origin` ranks, continued
    /// on `num_replicas` ranks from global batch position `offset`.
    fn elastic_batches(
        &self,
        origin: u64,
        offset: u64,
        num_replicas: u64,
        drop_last: bool,
    ) -> PyResult<u64> {
        Ok(self
            .elastic(origin, offset, num_replicas, drop_last)?
            .num_samples())
    }

    /// The batches `[start, stop)` that `deal` (an [`EpochDeal`]) names: `(indices, offsets)`,
    /// batch `i` being `indices[offsets[i]:offsets[i + 1]]`.
    #[pyo3(signature = (start, stop, **deal))]
    fn range<'py>(
        &self,
        py: Python<'py>,
        start: u64,
        stop: u64,
        deal: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyAny>)> {
        let d = EpochDeal::from_kwargs(deal, "BucketEpoch.range")?;
        let el = d
            .elastic
            .map(|(origin, offset)| self.elastic(origin, offset, d.num_replicas, d.drop_last))
            .transpose()?;
        let deal = croupier_core::Deal {
            num_replicas: d.num_replicas,
            rank: d.rank,
            drop_last: d.drop_last,
        };
        let bytes = self.plan.range_bytes(start, stop);
        let (plan, batches) = (
            std::sync::Arc::clone(&self.plan),
            std::sync::Arc::clone(&self.batches),
        );
        // Without kept orders a read cuts its buckets: interruptible over many samples.
        let long = plan.len() >= LONG_FROM;
        let (flat, offsets) =
            sized_long(py, bytes, "this rank's batches", long, move || match el {
                None => batches.range(&plan, deal, start..stop),
                Some(el) => batches.elastic_range(&plan, &el, deal.rank, start..stop),
            })?;
        Ok((to_numpy(py, flat), offsets.into_pyarray(py).into_any()))
    }
}

impl BucketEpoch {
    fn elastic(
        &self,
        origin: u64,
        offset: u64,
        num_replicas: u64,
        drop_last: bool,
    ) -> PyResult<croupier_core::Elastic> {
        core(croupier_core::Elastic::new(
            self.batches.batches(),
            origin,
            drop_last,
            offset,
            num_replicas,
        ))
    }
}
