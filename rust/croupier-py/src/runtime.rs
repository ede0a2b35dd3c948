//! What every call shares: the thread pool of each process, running work with the GIL
//! released and Ctrl-C heard, panics and core errors as Python exceptions, the memory check
//! before a large call, and buffers handed to numpy without a copy.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicPtr, Ordering};

use croupier_core::{Error, Indices};
use numpy::IntoPyArray;
use pyo3::exceptions::{PyKeyboardInterrupt, PyMemoryError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;

/// Core errors as Python exceptions: bad arguments are `ValueError`, unallocatable buffers
/// `MemoryError`.
struct CoreError(Error);

impl From<CoreError> for PyErr {
    fn from(e: CoreError) -> PyErr {
        match e.0 {
            Error::OutOfRange { .. } => PyValueError::new_err(e.0.to_string()),
            Error::Alloc { .. } => PyMemoryError::new_err(e.0.to_string()),
            // Only a call whose flag was raised (Ctrl-C) stops so, and its caller raises the
            // signal handler's exception instead; never seen otherwise.
            Error::Cancelled => PyKeyboardInterrupt::new_err(e.0.to_string()),
        }
    }
}

pub(crate) fn core<T>(result: Result<T, Error>) -> PyResult<T> {
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
pub(crate) fn pool() -> PyResult<&'static rayon::ThreadPool> {
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
pub(crate) fn detached<T: Send>(
    py: Python<'_>,
    work: impl FnOnce() -> Result<T, Error> + Send,
) -> PyResult<T> {
    let pool = pool()?;
    match py.detach(|| pool.install(|| catch_unwind(AssertUnwindSafe(work)))) {
        Ok(result) => core(result),
        Err(panic) => Err(panic_error(panic)),
    }
}

/// [`detached`] for a call the core runs on the calling thread alone (it says so, as
/// `croupier_core::rank_range_is_inline` does): the work runs here, with the GIL released,
/// and no thread pool is woken or, in a fresh process, started. Such calls are short (tens of
/// microseconds), so they need no Ctrl-C handling; errors and panics map as in [`detached`].
pub(crate) fn inline<T: Send>(
    py: Python<'_>,
    work: impl FnOnce() -> Result<T, Error> + Send,
) -> PyResult<T> {
    match py.detach(|| catch_unwind(AssertUnwindSafe(work))) {
        Ok(result) => core(result),
        Err(panic) => Err(panic_error(panic)),
    }
}

/// Calls whose buffers take at least this many bytes run interruptibly.
const INTERRUPTIBLE_FROM: u64 = 1 << 26;

/// [`detached`] for a call that builds a buffer: the work runs on a thread of its own, with a thread pool of
/// its own, while the calling thread waits, checking Python's signals every 10 ms. When a
/// signal handler raises (Ctrl-C's `KeyboardInterrupt`), the call's cancellation flag is
/// raised: every thread of the call carries it, and the core's long loops stop at their next
/// look at it (a few milliseconds); the caller waits for that, so no thread keeps running
/// behind, and the exception reaches Python. Short calls (`bytes` below
/// [`INTERRUPTIBLE_FROM`]) run as [`detached`] does.
///
/// Every call that builds a buffer goes through here: `bytes` is what it will hold, checked
/// first against the memory available ([`check_memory`], naming `what`), so no heavy call
/// can skip the check.
pub(crate) fn sized<T: Send>(
    py: Python<'_>,
    bytes: u64,
    what: &str,
    work: impl FnOnce() -> Result<T, Error> + Send,
) -> PyResult<T> {
    sized_long(py, bytes, what, false, work)
}

/// [`sized`] for a call that may run long whatever its buffer (`long`: a balanced mixture's
/// replay of its sequence up to a resume position), interruptible then as a large call is.
pub(crate) fn sized_long<T: Send>(
    py: Python<'_>,
    bytes: u64,
    what: &str,
    long_anyway: bool,
    work: impl FnOnce() -> Result<T, Error> + Send,
) -> PyResult<T> {
    bounded_long(py, (bytes, bytes), what, long_anyway, work)
}

/// [`sized_long`] for a call whose `bytes` bound its scratch without measuring its time (a
/// global mixture's leaves, held whatever the range's length): `bytes` is checked against
/// the memory available, but only the output's `out_bytes` and `long_anyway` make the call
/// interruptible. A short call then runs on the process's threads, without the call's own
/// thread and pool (starting them cost a rank's whole mixture share at 1e6 a fifth of its
/// time, their memory arenas returned and faulted in again at every call).
pub(crate) fn bounded_long<T: Send>(
    py: Python<'_>,
    (bytes, out_bytes): (u64, u64),
    what: &str,
    long_anyway: bool,
    work: impl FnOnce() -> Result<T, Error> + Send,
) -> PyResult<T> {
    check_memory(bytes, what)?;
    long(py, long_anyway || out_bytes >= INTERRUPTIBLE_FROM, work)
}

/// [`detached`] for a call that holds no large buffer but may run long (a bucket plan built
/// over millions of lengths, a whole epoch's plan, a balanced mixture's replay, a shuffle of
/// a numpy array in place): with `long`, interruptible as [`sized`]'s large calls are (a
/// thread and a thread pool of the call's own, about a tenth of a millisecond); without, as
/// [`detached`]. The work may borrow (an array the caller holds): its thread is scoped to the
/// call, which returns only once that thread has ended, after a Ctrl-C too.
pub(crate) fn long<T: Send>(
    py: Python<'_>,
    long: bool,
    work: impl FnOnce() -> Result<T, Error> + Send,
) -> PyResult<T> {
    if !long {
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
    std::thread::scope(|scope| {
        let (tx, rx) = std::sync::mpsc::channel();
        let flag = cancel.clone();
        let worker = std::thread::Builder::new()
            .name("croupier-call".into())
            .spawn_scoped(scope, move || {
                flag.attach();
                let outcome = call_pool.install(|| catch_unwind(AssertUnwindSafe(work)));
                drop(call_pool);
                let _ = tx.send(outcome);
            })
            .map_err(|e| {
                PyRuntimeError::new_err(format!("croupier: cannot start a thread: {e}"))
            })?;
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
                    // Joined here, so that its panic (if any) does not leave the scope.
                    py.detach(move || {
                        let _ = worker.join();
                    });
                    return Err(PyRuntimeError::new_err(
                        "internal error in croupier, please report it: the worker thread vanished",
                    ));
                }
            }
        }
    })
}

/// Installs, once per process, a panic hook that says nothing for a thread whose call was
/// cancelled (Ctrl-C): what such work computes after the flag is raised is meaningless (a loop
/// stopped early leaves a buffer short or half-shuffled) and is discarded, so a check that
/// fails on it is not news to the user. Every other panic is reported as before.
pub(crate) fn quiet_panics_of_abandoned_work() {
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
pub(crate) fn panic_error(panic: Box<dyn std::any::Any + Send>) -> PyErr {
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
pub(crate) fn to_numpy(py: Python<'_>, indices: Indices) -> Bound<'_, PyAny> {
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
pub(crate) fn available_memory() -> Option<u64> {
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
///
/// With `CROUPIER_MEMORY_TRACE` set, every estimate is written to standard error (`croupier:
/// memory estimate: <what>: <bytes> bytes`), checked or not: how a user sees what a call will
/// take, and how the tests compare estimates with measured peaks.
pub(crate) fn check_memory(bytes: u64, what: &str) -> PyResult<()> {
    const CHECKED_FROM: u64 = 1 << 26;
    if std::env::var_os("CROUPIER_MEMORY_TRACE").is_some() {
        eprintln!("croupier: memory estimate: {what}: {bytes} bytes");
    }
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
