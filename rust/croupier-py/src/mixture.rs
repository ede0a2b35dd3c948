//! `Mixture`: a weighted mixture of datasets on one rank (`MixtureSampler`).

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::config::{config, Config};
use crate::order::Order;
use crate::runtime::{bounded_long, core, sized_long, to_numpy};
use croupier_core::mix::Interleaving;

/// One phase of a mixture as Python passes it: `(start, nominal_length, weights,
/// temperature)`.
type PhaseArgs = (u64, u64, Vec<f64>, f64);

config! {
    /// Which rank's mixture, dealt how (`Mixture(sizes, phases, **config)`).
    struct MixtureConfig {
        num_replicas: u64,
        rank: u64,
        drop_last: bool,
        shuffle: bool,
        seed: u64,
        /// Positions per epoch (per rank in the per-rank order, global in the global one);
        /// `None` for one pass of every dataset (of its share, in the per-rank order).
        length: Option<u64>,
        /// `Order.GLOBAL` or `Order.PER_RANK`.
        order: Order,
        /// `"uniform"` or `"balanced"` (the global order's).
        interleave: String,
        /// With `shuffle`, whether each dataset's passes are permuted too.
        permute_samples: bool,
    }
}

impl MixtureConfig {
    fn core(&self) -> PyResult<croupier_core::MixtureConfig> {
        let c = self;
        let interleave = match c.interleave.as_str() {
            "uniform" => Interleaving::Uniform,
            "balanced" => Interleaving::Balanced,
            other => {
                return Err(PyValueError::new_err(format!(
                    "interleave must be 'uniform' or 'balanced', got {other:?}"
                )))
            }
        };
        Ok(croupier_core::MixtureConfig {
            deal: croupier_core::Deal {
                num_replicas: c.num_replicas,
                rank: c.rank,
                drop_last: c.drop_last,
            },
            shuffle: c.shuffle,
            seed: c.seed,
            length: c.length,
            order: c.order.core(),
            interleave,
            permute_samples: c.permute_samples,
        })
    }

    /// The keywords that build this config again (for pickling).
    fn to_kwargs<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        d.set_item("num_replicas", self.num_replicas)?;
        d.set_item("rank", self.rank)?;
        d.set_item("drop_last", self.drop_last)?;
        d.set_item("shuffle", self.shuffle)?;
        d.set_item("seed", self.seed)?;
        d.set_item("length", self.length)?;
        d.set_item("order", self.order)?;
        d.set_item("interleave", &self.interleave)?;
        d.set_item("permute_samples", self.permute_samples)?;
        Ok(d)
    }
}

config! {
    /// The world an elastic rest is dealt to (`Mixture.elastic_indices(epoch, start, stop,
    /// **rest)`).
    struct ElasticRest {
        /// The global position the old world's ranks had consumed up to.
        offset: u64,
        num_replicas: u64,
        rank: u64,
        drop_last: bool,
    }
}

/// A weighted mixture of datasets on one rank (`croupier_core::Mixture`): phases of exact
/// per-dataset counts, a uniform interleave, per-dataset pass streams.
#[pyclass(module = "croupier._core", frozen)]
pub(crate) struct Mixture {
    mixture: std::sync::Arc<croupier_core::Mixture>,
    /// The constructor's arguments, kept for pickling.
    sizes: Vec<u64>,
    phases: Vec<PhaseArgs>,
    config: MixtureConfig,
}

#[pymethods]
impl Mixture {
    #[new]
    #[pyo3(signature = (sizes, phases, **config))]
    fn new(
        sizes: Vec<u64>,
        phases: Vec<PhaseArgs>,
        config: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Self> {
        let config = MixtureConfig::from_kwargs(config, "Mixture")?;
        let specs: Vec<croupier_core::PhaseSpec> = phases
            .iter()
            .map(
                |(start, length, weights, temperature)| croupier_core::PhaseSpec {
                    start: *start,
                    length: *length,
                    weights: weights.clone(),
                    temperature: *temperature,
                },
            )
            .collect();
        let mixture = core(croupier_core::Mixture::new(&sizes, &specs, &config.core()?))?;
        Ok(Mixture {
            mixture: std::sync::Arc::new(mixture),
            sizes,
            phases,
            config,
        })
    }

    /// Positions per rank and epoch.
    fn __len__(&self) -> usize {
        self.mixture.len() as usize
    }

    /// Positions per rank and epoch.
    #[getter]
    fn length(&self) -> u64 {
        self.mixture.len()
    }

    /// Positions of the epoch's global sequence in the global order; `None` in the per-rank one.
    #[getter]
    fn global_length(&self) -> Option<u64> {
        self.mixture.global_len()
    }

    /// Samples in all datasets together.
    #[getter]
    fn total(&self) -> u64 {
        self.mixture.total()
    }

    /// Phase `phase`'s nominal counts per dataset.
    fn phase_counts(&self, phase: usize) -> PyResult<Vec<u64>> {
        self.mixture
            .phase_counts(phase)
            .map(<[u64]>::to_vec)
            .ok_or_else(|| {
                PyValueError::new_err(format!(
                    "phase must be in [0, {}), got {phase}",
                    self.phases.len()
                ))
            })
    }

    /// Positions `[start, stop)` (default: to the end) of this rank's sequence in `epoch`, as
    /// global indices into the concatenated datasets.
    #[pyo3(signature = (epoch, start=0, stop=None))]
    fn indices<'py>(
        &self,
        py: Python<'py>,
        epoch: u64,
        start: u64,
        stop: Option<u64>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let stop = stop.unwrap_or(self.mixture.len());
        let bytes = self.mixture.range_bytes(start, stop);
        let long = self.mixture.is_long(start, stop);
        let mixture = std::sync::Arc::clone(&self.mixture);
        // A balanced interleave replays its sequence up to `start` the first time (seconds at
        // 1e9), and a mixture of many datasets walks their trees: interruptible whatever the
        // size.
        let long = long || self.balanced();
        let what = "this rank's mixture indices";
        let work = move || mixture.range(epoch, start, stop);
        let out = if self.mixture.global_len().is_some() {
            // The global order's estimate holds whole leaves whatever the range: the output's
            // size and `is_long` decide whether the call is interruptible.
            let out_bytes = stop.saturating_sub(start).saturating_mul(8);
            bounded_long(py, (bytes, out_bytes), what, long, work)?
        } else {
            // The per-rank order's estimate grows with the blocks of passes it deals.
            sized_long(py, bytes, what, long, work)?
        };
        Ok(to_numpy(py, out))
    }

    /// New rank `rank`'s positions `[start, stop)` (default: to the end) of the rest of
    /// `epoch` of this mixture, continued on `num_replicas` ranks from global position
    /// `offset`: the old ranks' sequences, position after position, dealt with torch's
    /// arithmetic.
    #[pyo3(signature = (epoch, start=0, stop=None, **rest))]
    fn elastic_indices<'py>(
        &self,
        py: Python<'py>,
        epoch: u64,
        start: u64,
        stop: Option<u64>,
        rest: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let ElasticRest {
            offset,
            num_replicas,
            rank,
            drop_last,
        } = ElasticRest::from_kwargs(rest, "Mixture.elastic_indices")?;
        let el = core(self.mixture.elastic(offset, num_replicas, drop_last))?;
        let stop = stop.unwrap_or(el.num_samples());
        let bytes = self.mixture.elastic_range_bytes(&el, start, stop);
        let long = self.mixture.is_long(start, stop);
        let mixture = std::sync::Arc::clone(&self.mixture);
        let out = sized_long(
            py,
            bytes,
            "this rank's mixture indices after a change of world size",
            long || self.balanced(),
            move || mixture.elastic_range(&el, rank, epoch, start, stop),
        )?;
        Ok(to_numpy(py, out))
    }

    /// Bytes an `indices` call of `[start, stop)` (default: to the end) holds at its peak:
    /// the estimate the memory check uses.
    #[pyo3(signature = (start=0, stop=None))]
    fn range_bytes(&self, start: u64, stop: Option<u64>) -> u64 {
        self.mixture
            .range_bytes(start, stop.unwrap_or(self.mixture.len()))
    }

    /// Where an `indices` call starting at `start` should stop to hand out its first index
    /// soonest.
    fn first_stop(&self, start: u64) -> u64 {
        self.mixture.first_stop(start)
    }

    /// Every balanced phase's last leaf boundary known at or below global position
    /// `position`, as `(phase, position in the phase, counts per dataset)`: what a checkpoint
    /// records so that a resume replays at most a leaf of the balanced sequence. Replays
    /// nothing and waits for no replay; empty without the balanced interleave.
    fn balanced_boundaries(&self, position: u64) -> Vec<(usize, u64, Vec<u64>)> {
        self.mixture
            .balanced_boundaries(position)
            .into_iter()
            .map(|b| (b.phase, b.position, b.counts))
            .collect()
    }

    /// Records a boundary from `balanced_boundaries` (of a checkpoint of this mixture), so
    /// that reading from there replays the balanced sequence from it; with `check_only`, only
    /// checks it. `ValueError` for a phase without the balanced interleave, a position off its
    /// leaves, or counts that are not one per dataset, summing to the position, each within
    /// one sample of its share.
    #[pyo3(signature = (phase, position, counts, *, check_only=false))]
    fn seed_balanced(
        &self,
        phase: usize,
        position: u64,
        counts: Vec<u64>,
        check_only: bool,
    ) -> PyResult<()> {
        let boundary = croupier_core::BalancedBoundary {
            phase,
            position,
            counts,
        };
        core(self.mixture.seed_balanced(&boundary, !check_only))
    }

    /// Pickles as `Mixture(sizes, phases, **config)`.
    #[allow(clippy::type_complexity)]
    fn __getnewargs_ex__<'py>(
        &self,
        py: Python<'py>,
    ) -> PyResult<((Vec<u64>, Vec<PhaseArgs>), Bound<'py, PyDict>)> {
        Ok((
            (self.sizes.clone(), self.phases.clone()),
            self.config.to_kwargs(py)?,
        ))
    }

    fn __repr__(&self) -> String {
        format!(
            "Mixture(datasets={}, total={}, num_replicas={}, rank={}, length={}, phases={})",
            self.mixture.datasets(),
            self.mixture.total(),
            self.config.num_replicas,
            self.config.rank,
            self.mixture.len(),
            self.phases.len(),
        )
    }
}

impl Mixture {
    /// Whether the phases are interleaved by the balanced sequence.
    fn balanced(&self) -> bool {
        self.config.interleave == "balanced"
    }
}

/// The positions of a mixture's epochs in its order (`croupier_core::mix::EpochShape`): the
/// arithmetic of `MixtureSampler`'s length, schedules and elastic resumes. Immutable.
#[pyclass(module = "croupier._core", frozen)]
pub(crate) struct MixtureShape {
    shape: croupier_core::mix::EpochShape,
    /// The constructor's arguments, for pickling.
    args: (Vec<u64>, Option<u64>, Order, bool),
}

#[pymethods]
impl MixtureShape {
    /// Datasets of `sizes`, `num_samples` positions per rank (`None`: the order's default),
    /// in `order` (`Order.GLOBAL` or `Order.PER_RANK`).
    #[new]
    #[pyo3(signature = (sizes, *, num_samples, order, drop_last))]
    fn new(
        sizes: Vec<u64>,
        num_samples: Option<u64>,
        order: Order,
        drop_last: bool,
    ) -> PyResult<Self> {
        let shape = core(croupier_core::mix::EpochShape::new(
            sizes.clone(),
            num_samples,
            order.core(),
            drop_last,
        ))?;
        Ok(MixtureShape {
            shape,
            args: (sizes, num_samples, order, drop_last),
        })
    }

    /// Pickles as `MixtureShape(sizes, **keywords)`.
    fn __getnewargs_ex__<'py>(
        &self,
        py: Python<'py>,
    ) -> PyResult<((Vec<u64>,), Bound<'py, PyDict>)> {
        let (sizes, num_samples, order, drop_last) = &self.args;
        let d = PyDict::new(py);
        d.set_item("num_samples", *num_samples)?;
        d.set_item("order", *order)?;
        d.set_item("drop_last", *drop_last)?;
        Ok(((sizes.clone(),), d))
    }

    /// The positions of an epoch on `num_replicas` ranks that phases and schedules count.
    fn positions(&self, num_replicas: u64) -> PyResult<u64> {
        core(self.shape.positions(num_replicas))
    }

    /// Positions per rank of an epoch on `num_replicas` ranks.
    fn rank_length(&self, num_replicas: u64) -> PyResult<u64> {
        core(self.shape.rank_length(num_replicas))
    }

    /// The schedule position at which each of `num_replicas` ranks resumes at position `at`.
    fn schedule_position(&self, at: u64, num_replicas: u64) -> PyResult<u64> {
        core(self.shape.schedule_position(at, num_replicas))
    }

    /// Global positions of an epoch first dealt over `origin` ranks.
    fn global_end(&self, origin: u64) -> PyResult<u64> {
        core(self.shape.global_end(origin))
    }

    /// Positions worth computing at a time while iterating (`None`: a rank's epoch whole).
    #[getter]
    fn window(&self) -> Option<u64> {
        self.shape.window()
    }
}
