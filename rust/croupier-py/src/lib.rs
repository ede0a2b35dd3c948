//! `croupier._core`: the PyO3 face of croupier-core.
//!
//! This crate only converts. Arguments arrive as typed values (`u64`, `bool`, the [`Order`]
//! enum, the [`Deal`] configuration of a rank's share); the work runs in croupier-core with the
//! GIL released; the resulting Rust buffers become numpy arrays that own them (no copy).
//!
//! Where arguments are checked: user-facing checks, with messages that name the argument and
//! its range, are made once, in Python (`python/croupier/_validate.py`), before any call
//! reaches this module. The core checks its own invariants again as a library must, and those
//! errors arrive here as `ValueError` (`MemoryError` for buffers that cannot be allocated). A
//! value of the wrong type or sign is refused by the conversion itself (`TypeError` or
//! `OverflowError`), which only a caller of this private module can meet.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicPtr, Ordering};

use croupier_core::{Error, Indices, Layout, TorchRandperm};
use numpy::IntoPyArray;
use pyo3::exceptions::{PyImportError, PyMemoryError, PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyType;

/// Core errors as Python exceptions: bad arguments are `ValueError`, unallocatable buffers
/// `MemoryError`.
struct CoreError(Error);

impl From<CoreError> for PyErr {
    fn from(e: CoreError) -> PyErr {
        match e.0 {
            Error::OutOfRange { .. } => PyValueError::new_err(e.0.to_string()),
            Error::Alloc { .. } => PyMemoryError::new_err(e.0.to_string()),
        }
    }
}

fn core<T>(result: Result<T, Error>) -> PyResult<T> {
    result.map_err(|e| CoreError(e).into())
}

/// The thread pool of one process.
struct ProcessPool {
    pid: u32,
    pool: rayon::ThreadPool,
}

/// This process's pool, or null before the first parallel call.
static POOL: AtomicPtr<ProcessPool> = AtomicPtr::new(std::ptr::null_mut());

/// The pool croupier's parallel work runs on in this process.
///
/// Not rayon's global pool: after `fork` (DataLoader workers, `multiprocessing`) a child has
/// the parent's pool in memory but none of its threads, so work sent to it would wait forever,
/// and the global pool cannot be rebuilt. croupier's pool is tagged with the id of the process
/// that built it, and a child builds its own on its first call. The results never depend on
/// the pool (work is split by data, not by thread). Pools are never freed: a parent's pool
/// seen from a child must not be torn down there (its threads and locks are the parent's), so
/// each process that uses croupier keeps one.
fn pool() -> PyResult<&'static rayon::ThreadPool> {
    let pid = std::process::id();
    loop {
        let current = POOL.load(Ordering::Acquire);
        // SAFETY: a non-null POOL points to a leaked `ProcessPool`, never freed.
        if let Some(found) = unsafe { current.as_ref() } {
            if found.pid == pid {
                return Ok(&found.pool);
            }
        }
        let pool = rayon::ThreadPoolBuilder::new()
            .thread_name(|i| format!("croupier-{i}"))
            .build()
            .map_err(|e| PyRuntimeError::new_err(format!("croupier: no thread pool: {e}")))?;
        let fresh = Box::into_raw(Box::new(ProcessPool { pid, pool }));
        match POOL.compare_exchange(current, fresh, Ordering::AcqRel, Ordering::Acquire) {
            // SAFETY: `fresh` is now the leaked, never-freed pool of this process.
            Ok(_) => return Ok(unsafe { &(*fresh).pool }),
            // Another thread installed a pool first: drop ours (built here, its threads are
            // this process's) and look again.
            // SAFETY: `fresh` came from `Box::into_raw` above and was never shared.
            Err(_) => drop(unsafe { Box::from_raw(fresh) }),
        }
    }
}

/// Runs `work` with the GIL released, on this process's pool, and maps its outcome to Python:
/// a core error to its exception, and a panic (a bug: the core validates its inputs) to
/// `RuntimeError` rather than pyo3's `PanicException`.
fn detached<T: Send>(
    py: Python<'_>,
    work: impl FnOnce() -> Result<T, Error> + Send,
) -> PyResult<T> {
    let pool = pool()?;
    match py.detach(|| pool.install(|| catch_unwind(AssertUnwindSafe(work)))) {
        Ok(result) => core(result),
        Err(panic) => Err(panic_error(panic)),
    }
}

/// Calls whose buffers take at least this many bytes run interruptibly.
const INTERRUPTIBLE_FROM: u64 = 1 << 26;

/// [`detached`] for a long call: the work runs on a thread of its own, with a thread pool of
/// its own, while the calling thread waits, checking Python's signals every 10 ms. When a
/// signal handler raises (Ctrl-C's `KeyboardInterrupt`), the call's cancellation flag is
/// raised: every thread of the call carries it, and the core's long loops stop at their next
/// look at it (a few milliseconds); the caller waits for that, so no thread keeps running
/// behind, and the exception reaches Python. Short calls (`bytes` below
/// [`INTERRUPTIBLE_FROM`]) run as [`detached`] does.
fn interruptible<T: Send + 'static>(
    py: Python<'_>,
    bytes: u64,
    work: impl FnOnce() -> Result<T, Error> + Send + 'static,
) -> PyResult<T> {
    if bytes < INTERRUPTIBLE_FROM {
        return detached(py, work);
    }
    let threads = pool()?.current_num_threads();
    let cancel = croupier_core::Cancel::new();
    let carried = cancel.clone();
    // The call's own pool: its threads carry the flag (the process pool's serve every call).
    let call_pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .thread_name(|i| format!("croupier-call-{i}"))
        .start_handler(move |_| carried.attach())
        .build()
        .map_err(|e| PyRuntimeError::new_err(format!("croupier: no thread pool: {e}")))?;
    let (tx, rx) = std::sync::mpsc::channel();
    let flag = cancel.clone();
    let worker = std::thread::Builder::new()
        .name("croupier-call".into())
        .spawn(move || {
            flag.attach();
            let outcome = call_pool.install(|| catch_unwind(AssertUnwindSafe(work)));
            drop(call_pool);
            let _ = tx.send(outcome);
        })
        .map_err(|e| PyRuntimeError::new_err(format!("croupier: cannot start a thread: {e}")))?;
    let mut rx = rx;
    loop {
        // The receiver moves into the detached wait and back (it is Send, not Sync).
        let (outcome, back) = py.detach(move || {
            let outcome = rx.recv_timeout(std::time::Duration::from_millis(10));
            (outcome, rx)
        });
        rx = back;
        match outcome {
            Ok(Ok(result)) => return core(result),
            Ok(Err(panic)) => return Err(panic_error(panic)),
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                if let Err(interrupt) = py.check_signals() {
                    cancel.raise();
                    // The work stops at its next look at the flag; its result is dropped.
                    py.detach(move || {
                        let _ = worker.join();
                    });
                    return Err(interrupt);
                }
            }
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                return Err(PyRuntimeError::new_err(
                    "internal error in croupier, please report it: the worker thread vanished",
                ))
            }
        }
    }
}

/// Installs, once per process, a panic hook that says nothing for a thread whose call was
/// cancelled (Ctrl-C): what such work computes after the flag is raised is meaningless (a loop
/// stopped early leaves a buffer short or half-shuffled) and is discarded, so a check that
/// fails on it is not news to the user. Every other panic is reported as before.
fn quiet_panics_of_abandoned_work() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let report = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !croupier_core::Cancel::current_is_raised() {
                report(info);
            }
        }));
    });
}

/// A panic's payload as the `RuntimeError` Python sees.
fn panic_error(panic: Box<dyn std::any::Any + Send>) -> PyErr {
    let msg = panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_default();
    PyRuntimeError::new_err(format!(
        "internal error in croupier, please report it: {msg}"
    ))
}

/// Hands a core buffer to numpy without copying: `uint32` as is, `u64` reinterpreted in place
/// as `int64` (every index is below 2**63; same size and alignment, so the allocation is kept).
fn to_numpy(py: Python<'_>, indices: Indices) -> Bound<'_, PyAny> {
    match indices {
        Indices::U32(v) => v.into_pyarray(py).into_any(),
        Indices::U64(v) => bytemuck::allocation::cast_vec::<u64, i64>(v)
            .into_pyarray(py)
            .into_any(),
    }
}

/// Memory a call may still take, in bytes: `MemAvailable + SwapFree`, capped by the cgroup's
/// `memory.max - memory.current` (a container's limit, which `/proc/meminfo` does not show)
/// and by `CROUPIER_MEMORY_LIMIT` (bytes) when set. `None` where none of these can be read.
fn available_memory() -> Option<u64> {
    let mut found: Option<u64> = None;
    let mut cap = |v: u64| found = Some(found.map_or(v, |f| f.min(v)));
    if let Ok(text) = std::fs::read_to_string("/proc/meminfo") {
        let field = |name: &str| {
            text.lines()
                .find(|l| l.starts_with(name))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        };
        if let Some(avail) = field("MemAvailable:") {
            cap((avail + field("SwapFree:").unwrap_or(0)).saturating_mul(1024));
        }
    }
    let cgroup = |file: &str| {
        std::fs::read_to_string(format!("/sys/fs/cgroup/{file}"))
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
    };
    if let (Some(max), Some(current)) = (cgroup("memory.max"), cgroup("memory.current")) {
        cap(max.saturating_sub(current));
    }
    if let Some(limit) = std::env::var("CROUPIER_MEMORY_LIMIT")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
    {
        cap(limit);
    }
    found
}

/// Refuses, before any work, a call whose buffers need more memory than is available: a
/// `MemoryError` naming the bytes, instead of minutes of work and then a failed allocation (or
/// the kernel's OOM killer). Small calls are not checked.
fn check_memory(bytes: u64, what: &str) -> PyResult<()> {
    const CHECKED_FROM: u64 = 1 << 26;
    if bytes < CHECKED_FROM {
        return Ok(());
    }
    match available_memory() {
        Some(available) if bytes > available => Err(PyMemoryError::new_err(format!(
            "croupier: {what} needs about {:.2} GiB ({bytes} bytes), but only {:.2} GiB are \
             available (MemAvailable + SwapFree, the cgroup limit, CROUPIER_MEMORY_LIMIT)",
            bytes as f64 / (1u64 << 30) as f64,
            available as f64 / (1u64 << 30) as f64,
        ))),
        _ => Ok(()),
    }
}

/// An epoch order: croupier's own (`FAST`), or torch's CPU `randperm` as releases before 2.6
/// (`TORCH_FORWARD`) or from 2.6 on (`TORCH_INSIDE_OUT`) compute it; they differ only for
/// `2**32 // 20` samples or more.
#[pyclass(
    module = "croupier._core",
    frozen,
    from_py_object,
    eq,
    eq_int,
    hash,
    rename_all = "SCREAMING_SNAKE_CASE"
)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Order {
    Fast,
    TorchForward,
    TorchInsideOut,
}

impl Order {
    fn core(self) -> croupier_core::Order {
        match self {
            Order::Fast => croupier_core::Order::Fast,
            Order::TorchForward => croupier_core::Order::Torch(TorchRandperm::Forward),
            Order::TorchInsideOut => croupier_core::Order::Torch(TorchRandperm::InsideOutForLargeN),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Order::Fast => "FAST",
            Order::TorchForward => "TORCH_FORWARD",
            Order::TorchInsideOut => "TORCH_INSIDE_OUT",
        }
    }
}

/// What `__reduce__` returns: a callable and its arguments.
type Reduced<'py> = (Bound<'py, PyAny>, (Bound<'py, PyType>, &'static str));

#[pymethods]
impl Order {
    /// Pickles as `getattr(Order, name)`, so an unpickled order is the same member.
    fn __reduce__<'py>(&self, py: Python<'py>) -> PyResult<Reduced<'py>> {
        let getattr = py.import("builtins")?.getattr("getattr")?;
        Ok((getattr, (py.get_type::<Order>(), self.name())))
    }
}

/// How one rank is dealt an epoch: the dataset length, the ranks, shuffling, seed,
/// `drop_last` and the order. Immutable; the epoch is given per call.
#[pyclass(module = "croupier._core", frozen)]
struct Deal {
    layout: Layout,
    rank: u64,
    shuffle: bool,
    seed: u64,
    order: Order,
}

#[pymethods]
impl Deal {
    #[new]
    #[pyo3(signature = (n, num_replicas, rank, shuffle, seed, drop_last, order))]
    fn new(
        n: u64,
        num_replicas: u64,
        rank: u64,
        shuffle: bool,
        seed: u64,
        drop_last: bool,
        order: Order,
    ) -> PyResult<Self> {
        let layout = core(Layout::new(n, num_replicas, drop_last))?;
        core(layout.check_rank(rank))?;
        Ok(Deal {
            layout,
            rank,
            shuffle,
            seed,
            order,
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
        let order = self.order.core();
        let bytes = croupier_core::rank_range_bytes(
            &self.layout,
            self.rank,
            self.shuffle,
            order,
            start,
            stop,
        );
        check_memory(
            bytes,
            match self.order {
                Order::Fast => "this rank's indices",
                _ => "torch's order (the whole permutation, as torch builds it)",
            },
        )?;
        let (layout, rank, shuffle, seed) = (self.layout, self.rank, self.shuffle, self.seed);
        let out = interruptible(py, bytes, move || {
            croupier_core::rank_range(&layout, rank, shuffle, order, seed, epoch, start, stop)
        })?;
        Ok(to_numpy(py, out))
    }

    /// Where an `indices` call starting at `start` should stop to hand out its first index
    /// soonest: in the fast shuffled order the end of the block holding `start`, or
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
        let order = self.order.core();
        let bytes = el.range_bytes(self.shuffle, order, start, stop.max(start));
        check_memory(bytes, "this rank's indices after a change of world size")?;
        let (rank, shuffle, seed) = (self.rank, self.shuffle, self.seed);
        let out = interruptible(py, bytes, move || {
            el.range(rank, shuffle, order, seed, epoch, start, stop)
        })?;
        Ok(to_numpy(py, out))
    }

    fn __getnewargs__(&self) -> (u64, u64, u64, bool, u64, bool, Order) {
        (
            self.layout.n(),
            self.layout.num_replicas(),
            self.rank,
            self.shuffle,
            self.seed,
            self.layout.drop_last(),
            self.order,
        )
    }

    fn __repr__(&self) -> String {
        format!(
            "Deal(n={}, num_replicas={}, rank={}, shuffle={}, seed={}, drop_last={}, order=Order.{})",
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

impl Deal {
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

/// Samples grouped into length buckets with their batch sizes (`croupier_core::BucketPlan`),
/// from which a rank's batches of any epoch are read.
#[pyclass(module = "croupier._core", frozen)]
struct Buckets {
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
    #[pyo3(signature = (lengths, boundaries, num_buckets, batch_size, max_tokens, multiple, oversized_alone, full_batches))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        lengths: &Bound<'_, PyAny>,
        boundaries: Option<Vec<u64>>,
        num_buckets: u64,
        batch_size: Option<u64>,
        max_tokens: Option<u64>,
        multiple: u64,
        oversized_alone: bool,
        full_batches: bool,
    ) -> PyResult<Self> {
        // Copied out of the borrowed numpy memory while attached; the work runs detached.
        let limits = croupier_core::bucket::Limits {
            batch_size,
            max_tokens,
            multiple,
            oversized_alone,
            full_batches,
        };
        if let Ok(arr) = lengths.extract::<numpy::PyReadonlyArray1<'_, u32>>() {
            let lengths: Vec<u32> = arr.as_array().to_vec();
            return detached(py, move || {
                Self::build(&lengths, boundaries, num_buckets, limits)
            });
        }
        if let Ok(arr) = lengths.extract::<numpy::PyReadonlyArray1<'_, u64>>() {
            let lengths: Vec<u64> = arr.as_array().to_vec();
            return detached(py, move || {
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

    /// Batches each rank yields per epoch with `num_replicas` ranks.
    fn rank_batches(&self, num_replicas: u64, drop_last: bool) -> PyResult<u64> {
        core(self.plan.rank_batches(num_replicas, drop_last))
    }

    /// Rank `rank`'s batches `[start, stop)` of `epoch`: `(indices, offsets)`, batch `i` being
    /// `indices[offsets[i]:offsets[i + 1]]`. With `elastic = (origin, offset)`: new rank
    /// `rank`'s batches of the rest of an epoch first dealt over `origin` ranks, continued on
    /// `num_replicas` ranks from global batch position `offset` (an elastic resume).
    #[pyo3(signature = (num_replicas, rank, drop_last, seed, epoch, shuffle, shuffle_batches, start, stop, elastic=None))]
    #[allow(clippy::too_many_arguments)]
    fn range<'py>(
        &self,
        py: Python<'py>,
        num_replicas: u64,
        rank: u64,
        drop_last: bool,
        seed: u64,
        epoch: u64,
        shuffle: bool,
        shuffle_batches: bool,
        start: u64,
        stop: u64,
        elastic: Option<(u64, u64)>,
    ) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyAny>)> {
        let el = elastic
            .map(|(origin, offset)| self.elastic(origin, offset, num_replicas, drop_last))
            .transpose()?;
        // About the samples of the batches asked for, as `u64` with their offsets.
        let per_batch = self.plan.len() / self.plan.batches().max(1) + 1;
        let bytes = per_batch
            .saturating_mul(stop.saturating_sub(start))
            .saturating_mul(8);
        let plan = std::sync::Arc::clone(&self.plan);
        let (flat, offsets) = interruptible(py, bytes, move || {
            let (seeds, shuffles, range) =
                ((seed, epoch), (shuffle, shuffle_batches), (start, stop));
            match el {
                None => {
                    plan.rank_batches_range(num_replicas, rank, drop_last, seeds, shuffles, range)
                }
                Some(el) => plan.elastic_batches_range(&el, rank, seeds, shuffles, range),
            }
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
        Ok(self
            .elastic(origin, offset, num_replicas, drop_last)?
            .num_samples())
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

/// A rank's chunked reading plan (`croupier_core::chunk::ChunkPlan`): chunk order and load
/// requests of any epoch.
#[pyclass(module = "croupier._core", frozen)]
struct ChunkPlan {
    plan: std::sync::Arc<croupier_core::chunk::ChunkPlan>,
}

#[pymethods]
impl ChunkPlan {
    #[new]
    #[pyo3(signature = (start, stop, chunk_size, preload, batch_size, shuffle, drop_last, seed, num_replicas, rank))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        start: u64,
        stop: u64,
        chunk_size: u64,
        preload: u64,
        batch_size: u64,
        shuffle: bool,
        drop_last: bool,
        seed: u64,
        num_replicas: u64,
        rank: u64,
    ) -> PyResult<Self> {
        let plan = core(croupier_core::chunk::ChunkPlan::new(
            start,
            stop,
            chunk_size,
            preload,
            batch_size,
            shuffle,
            drop_last,
            seed,
            num_replicas,
            rank,
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

    /// This rank's chunk ids of `epoch`, in reading order, as a `uint64` array: O(its own
    /// chunks). Sampling does not need it (each request is computed on its own).
    fn rank_chunks<'py>(&self, py: Python<'py>, epoch: u64) -> PyResult<Bound<'py, PyAny>> {
        let plan = std::sync::Arc::clone(&self.plan);
        let chunks = detached(py, move || Ok(plan.rank_chunks(epoch)))?;
        Ok(chunks.into_pyarray(py).into_any())
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

/// NeMo Automodel's bucket-by-bucket batches on one rank
/// (`croupier_core::bucket::SequentialBuckets`).
#[pyclass(module = "croupier._core", frozen)]
struct SequentialBuckets {
    inner: std::sync::Arc<croupier_core::bucket::SequentialBuckets>,
    /// Samples over all buckets, for the size of a call.
    samples: u64,
}

#[pymethods]
impl SequentialBuckets {
    #[new]
    #[pyo3(signature = (buckets, sizes, num_replicas, rank, drop_last, shuffle_buckets, shuffle_within, order))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        buckets: Vec<Vec<u64>>,
        sizes: Vec<u64>,
        num_replicas: u64,
        rank: u64,
        drop_last: bool,
        shuffle_buckets: bool,
        shuffle_within: bool,
        order: Order,
    ) -> PyResult<Self> {
        let order = match order.core() {
            croupier_core::Order::Fast => croupier_core::bucket::SeqOrder::Fast,
            croupier_core::Order::Torch(v) => croupier_core::bucket::SeqOrder::Torch(v),
        };
        let samples = buckets.iter().map(|b| b.len() as u64).sum();
        let inner = core(croupier_core::bucket::SequentialBuckets::new(
            &buckets,
            &sizes,
            num_replicas,
            rank,
            drop_last,
            (shuffle_buckets, shuffle_within),
            order,
        ))?;
        Ok(SequentialBuckets {
            inner: std::sync::Arc::new(inner),
            samples,
        })
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
        let bytes = self.samples.saturating_mul(8);
        let inner = std::sync::Arc::clone(&self.inner);
        let (flat, offsets) =
            interruptible(py, bytes, move || inner.range(seed, epoch, start, stop))?;
        Ok((to_numpy(py, flat), offsets.into_pyarray(py).into_any()))
    }
}

/// One phase of a mixture as Python passes it: `(start, nominal_length, weights,
/// temperature)`.
type PhaseArgs = (u64, u64, Vec<f64>, f64);

/// A mixture's constructor arguments, kept for pickling.
type MixtureArgs = (
    Vec<u64>,
    u64,
    u64,
    bool,
    bool,
    u64,
    Option<u64>,
    Vec<PhaseArgs>,
);

/// A weighted mixture of datasets on one rank (`croupier_core::Mixture`): phases of exact
/// per-dataset counts, a uniform interleave, per-dataset pass streams.
#[pyclass(module = "croupier._core", frozen)]
struct Mixture {
    mixture: std::sync::Arc<croupier_core::Mixture>,
    args: MixtureArgs,
}

#[pymethods]
impl Mixture {
    #[new]
    #[pyo3(signature = (sizes, num_replicas, rank, drop_last, shuffle, seed, length, phases))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        sizes: Vec<u64>,
        num_replicas: u64,
        rank: u64,
        drop_last: bool,
        shuffle: bool,
        seed: u64,
        length: Option<u64>,
        phases: Vec<PhaseArgs>,
    ) -> PyResult<Self> {
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
        let mixture = core(croupier_core::Mixture::new(
            &sizes,
            num_replicas,
            rank,
            drop_last,
            shuffle,
            seed,
            length,
            &specs,
        ))?;
        Ok(Mixture {
            mixture: std::sync::Arc::new(mixture),
            args: (
                sizes,
                num_replicas,
                rank,
                drop_last,
                shuffle,
                seed,
                length,
                phases,
            ),
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
                    self.args.7.len()
                ))
            })
    }

    /// How many positions of phase `phase` each dataset takes in `epoch` (its nominal counts
    /// unless the next phase starts before its nominal end).
    fn effective_counts(&self, epoch: u64, phase: usize) -> PyResult<Vec<u64>> {
        if phase >= self.args.7.len() {
            return Err(PyValueError::new_err(format!(
                "phase must be in [0, {}), got {phase}",
                self.args.7.len()
            )));
        }
        Ok(self.mixture.effective_counts(epoch, phase))
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
        check_memory(bytes, "this rank's mixture indices")?;
        let mixture = std::sync::Arc::clone(&self.mixture);
        let out = interruptible(py, bytes, move || mixture.range(epoch, start, stop))?;
        Ok(to_numpy(py, out))
    }

    /// New rank `rank`'s positions `[start, stop)` (default: to the end) of the rest of
    /// `epoch` of this mixture, continued on `num_replicas` ranks from global position
    /// `offset`: the old ranks' sequences, position after position, dealt with torch's
    /// arithmetic.
    #[pyo3(signature = (offset, num_replicas, rank, drop_last, epoch, start=0, stop=None))]
    #[allow(clippy::too_many_arguments)]
    fn elastic_indices<'py>(
        &self,
        py: Python<'py>,
        offset: u64,
        num_replicas: u64,
        rank: u64,
        drop_last: bool,
        epoch: u64,
        start: u64,
        stop: Option<u64>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let el = core(self.mixture.elastic(offset, num_replicas, drop_last))?;
        let stop = stop.unwrap_or(el.num_samples());
        // The output, and one old rank's range (about as long) with its own working memory.
        let old = stop.saturating_sub(start).saturating_mul(num_replicas) / self.args.1.max(1);
        let bytes = self
            .mixture
            .range_bytes(0, old.min(self.mixture.len()))
            .saturating_add(stop.saturating_sub(start).saturating_mul(8));
        check_memory(
            bytes,
            "this rank's mixture indices after a change of world size",
        )?;
        let mixture = std::sync::Arc::clone(&self.mixture);
        let out = interruptible(py, bytes, move || {
            mixture.elastic_range(&el, rank, epoch, start, stop)
        })?;
        Ok(to_numpy(py, out))
    }

    /// Where an `indices` call starting at `start` should stop to hand out its first index
    /// soonest.
    fn first_stop(&self, start: u64) -> u64 {
        start
            .saturating_add(croupier_core::mix::MIX_FIRST_STOP)
            .min(self.mixture.len())
    }

    fn __getnewargs__(&self) -> MixtureArgs {
        self.args.clone()
    }

    fn __repr__(&self) -> String {
        format!(
            "Mixture(datasets={}, total={}, num_replicas={}, rank={}, length={}, phases={})",
            self.mixture.datasets(),
            self.mixture.total(),
            self.args.1,
            self.args.2,
            self.mixture.len(),
            self.args.7.len(),
        )
    }
}

/// Per-rank positions of one pass of each dataset (`size // W` with `drop_last`, else
/// `ceil(size / W)`).
#[pyfunction]
fn pass_shares(sizes: Vec<u64>, num_replicas: u64, drop_last: bool) -> PyResult<Vec<u64>> {
    core(croupier_core::mix::pass_shares(
        &sizes,
        num_replicas,
        drop_last,
    ))
}

/// The normalised probabilities `w ** (1 / temperature) / sum`, with the core's checks.
#[pyfunction]
fn mixture_probabilities(weights: Vec<f64>, temperature: f64) -> PyResult<Vec<f64>> {
    core(croupier_core::mix::probabilities(
        &weights,
        temperature,
        "weights",
    ))
}

/// Largest-remainder counts of `probabilities * length`.
#[pyfunction]
fn largest_remainder(probabilities: Vec<f64>, length: u64) -> Vec<u64> {
    croupier_core::mix::largest_remainder(&probabilities, length)
}

/// `(num_samples, total_size)` of torch's `DistributedSampler` for these arguments.
#[pyfunction]
fn layout(n: u64, num_replicas: u64, drop_last: bool) -> PyResult<(u64, u64)> {
    let layout = core(Layout::new(n, num_replicas, drop_last))?;
    Ok((layout.num_samples(), layout.total_size()))
}

/// The epoch's full permutation of `[0, n)`.
#[pyfunction]
fn permutation(py: Python<'_>, n: u64, seed: u64, epoch: u64) -> PyResult<Bound<'_, PyAny>> {
    let bytes = croupier_core::permutation_bytes(n);
    check_memory(bytes, "the permutation")?;
    let out = interruptible(py, bytes, move || {
        croupier_core::permutation(n, seed, epoch)
    })?;
    Ok(to_numpy(py, out))
}

/// Fills a writable, contiguous 1-D `uint32` or `int64` array with the permutation of
/// `[0, len(out))` for `(seed, epoch)`: the values [`permutation`] returns, in place.
#[pyfunction]
fn permutation_into<'py>(
    py: Python<'py>,
    out: &Bound<'py, PyAny>,
    seed: u64,
    epoch: u64,
) -> PyResult<()> {
    if let Ok(mut arr) = out.extract::<numpy::PyReadwriteArray1<'py, u32>>() {
        let buf = arr
            .as_slice_mut()
            .map_err(|_| PyValueError::new_err("out must be C-contiguous"))?;
        if buf.len() as u64 > croupier_core::U32_MAX_LEN {
            return Err(PyValueError::new_err(
                "out must be int64 for more than 2**32 indices",
            ));
        }
        return detached(py, || {
            croupier_core::fill(buf, seed, epoch);
            Ok(())
        });
    }
    if let Ok(mut arr) = out.extract::<numpy::PyReadwriteArray1<'py, i64>>() {
        let buf = arr
            .as_slice_mut()
            .map_err(|_| PyValueError::new_err("out must be C-contiguous"))?;
        let buf: &mut [u64] = bytemuck::cast_slice_mut(buf);
        return detached(py, || {
            croupier_core::fill(buf, seed, epoch);
            Ok(())
        });
    }
    Err(PyTypeError::new_err(
        "out must be a writable 1-D numpy array of dtype uint32 or int64",
    ))
}

/// `torch.randperm(n, generator=torch.Generator().manual_seed(seed))` on the CPU, exactly, as
/// the torch releases named by `order` (`TORCH_FORWARD` or `TORCH_INSIDE_OUT`) compute it.
#[pyfunction]
fn torch_randperm(py: Python<'_>, n: u64, seed: u64, order: Order) -> PyResult<Bound<'_, PyAny>> {
    let croupier_core::Order::Torch(variant) = order.core() else {
        return Err(PyValueError::new_err(
            "order must be Order.TORCH_FORWARD or Order.TORCH_INSIDE_OUT, got Order.FAST",
        ));
    };
    let bytes = n.saturating_mul(croupier_core::index_bytes(n));
    check_memory(bytes, "randperm")?;
    let out = interruptible(py, bytes, move || {
        croupier_core::torch_randperm(n, seed, variant)
    })?;
    Ok(to_numpy(py, out))
}

/// Loads numpy's C API while the module is imported. rust-numpy loads it on first use,
/// importing numpy's `multiarray` module, and turns any failure there (a `KeyboardInterrupt`
/// arriving during that import, say) into a panic; here a failure is an import error instead,
/// and later calls never import anything.
fn load_numpy_api(py: Python<'_>) -> PyResult<()> {
    py.import("numpy")?;
    catch_unwind(AssertUnwindSafe(|| {
        numpy::PyArray1::<u32>::zeros(py, 0, false);
    }))
    .map_err(|_| PyImportError::new_err("croupier: numpy's C API could not be loaded"))
}

/// The compiled core of croupier (private: use the `croupier` package).
///
/// `gil_used = false`: on a free-threaded Python the module does not need the GIL. Its only
/// shared state is the per-process thread pool, published through an atomic pointer; `Order`
/// and `Deal` are frozen (immutable, so `Sync`); every call works on its own buffers, or, for
/// `permutation_into`, on an array borrowed mutably through rust-numpy's borrow checking.
#[pymodule(gil_used = false)]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    load_numpy_api(m.py())?;
    quiet_panics_of_abandoned_work();
    m.add_class::<Order>()?;
    m.add_class::<Deal>()?;
    m.add_class::<Mixture>()?;
    m.add_class::<Buckets>()?;
    m.add_class::<SequentialBuckets>()?;
    m.add_class::<ChunkPlan>()?;
    m.add_function(wrap_pyfunction!(pass_shares, m)?)?;
    m.add_function(wrap_pyfunction!(mixture_probabilities, m)?)?;
    m.add_function(wrap_pyfunction!(largest_remainder, m)?)?;
    m.add_function(wrap_pyfunction!(layout, m)?)?;
    m.add_function(wrap_pyfunction!(permutation, m)?)?;
    m.add_function(wrap_pyfunction!(permutation_into, m)?)?;
    m.add_function(wrap_pyfunction!(torch_randperm, m)?)?;
    m.add("MAX_LEN", croupier_core::MAX_LEN)?;
    m.add("U32_MAX_LEN", croupier_core::U32_MAX_LEN)?;
    m.add("TORCH_LARGE_N", croupier_core::LARGE_N_THRESHOLD)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
