//! `ChunkPlan`: a rank's chunked reading plan (`ChunkSampler`).

use numpy::IntoPyArray;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::config::{config, Config};
use crate::runtime::{core, detached, to_numpy};

config! {
    /// A rank's reading plan, as `ChunkSampler` sets it (`ChunkPlan(**config)`).
    struct ChunkConfig {
        /// The rows `[start, stop)` read.
        start: u64,
        stop: u64,
        chunk_size: u64,
        /// Chunks per load request.
        preload: u64,
        batch_size: u64,
        shuffle: bool,
        drop_last: bool,
        seed: u64,
        num_replicas: u64,
        rank: u64,
    }
}

impl From<&ChunkConfig> for croupier_core::chunk::ChunkConfig {
    fn from(c: &ChunkConfig) -> Self {
        croupier_core::chunk::ChunkConfig {
            start: c.start,
            stop: c.stop,
            chunk_size: c.chunk_size,
            preload: c.preload,
            batch_size: c.batch_size,
            shuffle: c.shuffle,
            seed: c.seed,
            deal: croupier_core::Deal {
                num_replicas: c.num_replicas,
                rank: c.rank,
                drop_last: c.drop_last,
            },
        }
    }
}

/// A rank's chunked reading plan (`croupier_core::chunk::ChunkPlan`): chunk order and load
/// requests of any epoch.
#[pyclass(module = "croupier._core", frozen)]
pub(crate) struct ChunkPlan {
    plan: std::sync::Arc<croupier_core::chunk::ChunkPlan>,
}

#[pymethods]
impl ChunkPlan {
    #[new]
    #[pyo3(signature = (**config))]
    fn new(config: Option<&Bound<'_, PyDict>>) -> PyResult<Self> {
        let config = ChunkConfig::from_kwargs(config, "ChunkPlan")?;
        let plan = core(croupier_core::chunk::ChunkPlan::new(
            &croupier_core::chunk::ChunkConfig::from(&config),
        ))?;
        Ok(ChunkPlan {
            plan: std::sync::Arc::new(plan),
        })
    }

    /// Batches every rank yields per epoch.
    #[getter]
    fn batches(&self) -> u64 {
        self.plan.batches()
    }

    /// Load requests this rank yields per epoch.
    #[getter]
    fn requests(&self) -> u64 {
        self.plan.requests()
    }

    /// Batches of one full request.
    #[getter]
    fn batches_per_request(&self) -> u64 {
        self.plan.batches_per_request()
    }

    /// Request `j` of `epoch`, computed on its own in O(`preload`) chunk ids:
    /// `(starts, stops, positions, offsets)`, batch `i` being
    /// `positions[offsets[i]:offsets[i + 1]]`.
    #[allow(clippy::type_complexity)]
    fn request<'py>(
        &self,
        py: Python<'py>,
        epoch: u64,
        j: u64,
    ) -> PyResult<(
        Bound<'py, PyAny>,
        Bound<'py, PyAny>,
        Bound<'py, PyAny>,
        Bound<'py, PyAny>,
    )> {
        let plan = std::sync::Arc::clone(&self.plan);
        let req = detached(py, move || plan.request(epoch, j))?;
        let (starts, stops): (Vec<u64>, Vec<u64>) = req.ranges.into_iter().unzip();
        Ok((
            starts.into_pyarray(py).into_any(),
            stops.into_pyarray(py).into_any(),
            to_numpy(py, req.positions),
            req.offsets.into_pyarray(py).into_any(),
        ))
    }
}
