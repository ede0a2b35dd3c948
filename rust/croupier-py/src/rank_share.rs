//! `RankShare`: one rank's share of a `DistributedSampler` epoch, whole, in ranges, or after
//! an elastic resume (the core's `Deal` is only a rank's place in its world; this is the
//! whole configuration of the share).

use croupier_core::Layout;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::config::{config, Config};
use crate::order::Order;
use crate::runtime::{check_memory, core, inline, sized, to_numpy};

/// Positions per piece of a streamed share (see `RankShare.window`).
const STREAM_WINDOW: u64 = 1 << 16;

config! {
    /// How one rank is dealt an epoch (`RankShare(**config)`).
    struct ShareConfig {
        /// The dataset length.
        n: u64,
        num_replicas: u64,
        rank: u64,
        shuffle: bool,
        seed: u64,
        drop_last: bool,
        order: Order,
    }
}

/// How one rank is dealt an epoch: the dataset length, the ranks, shuffling, seed,
/// `drop_last` and the order. Immutable; the epoch is given per call.
#[pyclass(module = "croupier._core", frozen)]
pub(crate) struct RankShare {
    layout: Layout,
    rank: u64,
    shuffle: bool,
    seed: u64,
    order: Order,
}

#[pymethods]
impl RankShare {
    #[new]
    #[pyo3(signature = (**config))]
    fn new(config: Option<&Bound<'_, PyDict>>) -> PyResult<Self> {
        let c = ShareConfig::from_kwargs(config, "RankShare")?;
        let layout = core(Layout::new(c.n, c.num_replicas, c.drop_last))?;
        core(layout.check_rank(c.rank))?;
        Ok(RankShare {
            layout,
            rank: c.rank,
            shuffle: c.shuffle,
            seed: c.seed,
            order: c.order,
        })
    }

    /// This rank's number of indices per epoch (torch's `num_samples`).
    #[getter]
    fn num_samples(&self) -> u64 {
        self.layout.num_samples()
    }

    /// `num_samples * num_replicas` (torch's `total_size`).
    #[getter]
    fn total_size(&self) -> u64 {
        self.layout.total_size()
    }

    /// Positions `[start, stop)` (default: to the end) of the sequence this rank receives in
    /// `epoch`, padded or cut as torch does.
    #[pyo3(signature = (epoch, start=0, stop=None))]
    fn indices<'py>(
        &self,
        py: Python<'py>,
        epoch: u64,
        start: u64,
        stop: Option<u64>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let stop = stop.unwrap_or(self.layout.num_samples());
        let draw = self.draw(epoch);
        let bytes = croupier_core::rank_range_bytes(&self.layout, self.rank, draw, start..stop);
        let what = match self.order {
            Order::PerRank | Order::Global => "this rank's indices",
            _ => "torch's order (the whole permutation, as torch builds it)",
        };
        let (layout, rank) = (self.layout, self.rank);
        let work = move || croupier_core::rank_range(&layout, rank, draw, start..stop);
        // A first window or a resume's first index: on this thread, so that a fresh process's
        // first index starts no thread pool.
        let out = if croupier_core::rank_range_is_inline(draw, start..stop) {
            check_memory(bytes, what)?; // traced as every estimate is; small, never refused
            inline(py, work)?
        } else {
            sized(py, bytes, what, work)?
        };
        Ok(to_numpy(py, out))
    }

    /// Where an `indices` call starting at `start` should stop to hand out its first index
    /// soonest: in the per-rank shuffled order the end of the block holding `start`, or
    /// `start + 64` inside a long block (read by random access); else `num_samples`.
    fn first_stop(&self, start: u64) -> PyResult<u64> {
        core(croupier_core::first_stop(
            &self.layout,
            self.rank,
            self.shuffle,
            self.order.core(),
            start,
        ))
    }

    /// Positions worth computing at a time while iterating (`None`: the rest of the share at
    /// once). Unshuffled or in the global order a range costs its length, so the share is
    /// streamed; the per-rank and torch orders compute a share whole.
    #[getter]
    fn window(&self) -> Option<u64> {
        (!self.shuffle || self.order == Order::Global).then_some(STREAM_WINDOW)
    }

    /// Where the first piece of an elastic rest from `start` (of `length` positions) should
    /// stop: in the per-rank shuffled order a few positions of each old share it meets, so
    /// the first index comes before the rest is computed; else the rest at once.
    fn elastic_first_stop(&self, start: u64, length: u64) -> u64 {
        if self.shuffle && self.order == Order::PerRank {
            start
                .saturating_add(croupier_core::deal::ELASTIC_FIRST_STOP)
                .min(length)
        } else {
            length
        }
    }

    /// Refuses an epoch the order cannot draw: torch seeds its generator with `seed + epoch`
    /// to shuffle, and `torch.manual_seed` refuses more than `2**64 - 1`.
    fn check_epoch(&self, epoch: u64) -> PyResult<()> {
        self.order.check_epoch(self.shuffle, self.seed, epoch)
    }

    /// Whether torch releases disagree on this share (torch's order, shuffled, from
    /// `TORCH_LARGE_N` samples on): a checkpoint must then record the `randperm` variant.
    #[getter]
    fn randperm_variant_matters(&self) -> bool {
        let torch = matches!(self.order, Order::TorchForward | Order::TorchInsideOut);
        torch && self.shuffle && self.layout.n() >= croupier_core::LARGE_N_THRESHOLD
    }

    /// Positions `[start, stop)` (default: to the end) of this rank's sequence for the rest of
    /// `epoch`, first dealt over `origin` ranks, continued from global position `offset`.
    #[pyo3(signature = (origin, offset, epoch, start=0, stop=None))]
    fn elastic_indices<'py>(
        &self,
        py: Python<'py>,
        origin: u64,
        offset: u64,
        epoch: u64,
        start: u64,
        stop: Option<u64>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let el = self.elastic(origin, offset)?;
        let stop = stop.unwrap_or(el.num_samples());
        let draw = self.draw(epoch);
        let bytes = el.range_bytes(draw, start..stop.max(start));
        let rank = self.rank;
        let out = sized(
            py,
            bytes,
            "this rank's indices after a change of world size",
            move || el.range(rank, draw, start..stop),
        )?;
        Ok(to_numpy(py, out))
    }

    /// Pickles as `RankShare(**config)`.
    fn __getnewargs_ex__<'py>(&self, py: Python<'py>) -> PyResult<((), Bound<'py, PyDict>)> {
        let d = PyDict::new(py);
        d.set_item("n", self.layout.n())?;
        d.set_item("num_replicas", self.layout.num_replicas())?;
        d.set_item("rank", self.rank)?;
        d.set_item("shuffle", self.shuffle)?;
        d.set_item("seed", self.seed)?;
        d.set_item("drop_last", self.layout.drop_last())?;
        d.set_item("order", self.order)?;
        Ok(((), d))
    }

    fn __repr__(&self) -> String {
        format!(
            "RankShare(n={}, num_replicas={}, rank={}, shuffle={}, seed={}, drop_last={}, order=Order.{})",
            self.layout.n(),
            self.layout.num_replicas(),
            self.rank,
            if self.shuffle { "True" } else { "False" },
            self.seed,
            if self.layout.drop_last() { "True" } else { "False" },
            self.order.name(),
        )
    }
}

impl RankShare {
    /// How this rank's epoch `epoch` is drawn.
    fn draw(&self, epoch: u64) -> croupier_core::Draw {
        croupier_core::Draw {
            shuffle: self.shuffle,
            order: self.order.core(),
            seed: self.seed,
            epoch,
        }
    }

    fn elastic(&self, origin: u64, offset: u64) -> PyResult<croupier_core::Elastic> {
        core(croupier_core::Elastic::new(
            self.layout.n(),
            origin,
            self.layout.drop_last(),
            offset,
            self.layout.num_replicas(),
        ))
    }
}
