//! `croupier._core`: the PyO3 face of croupier-core.
//!
//! This crate only converts: Python ints to `u64` (with errors that name the argument), the
//! work to croupier-core with the GIL released, and the resulting Rust buffers to numpy arrays
//! that own them (no copy). Index math lives in croupier-core.

use std::panic::{catch_unwind, AssertUnwindSafe};

use croupier_core::torch::TorchRandperm;
use croupier_core::{Error, Indices, Layout, Order};
use numpy::IntoPyArray;
use pyo3::exceptions::{PyMemoryError, PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyBool;

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

/// Runs `work` with the GIL released and maps its outcome to Python: a core error to its
/// exception, and a panic (a bug: the core validates its inputs) to `RuntimeError` rather than
/// pyo3's `PanicException`.
fn detached<T: Send>(
    py: Python<'_>,
    work: impl FnOnce() -> Result<T, Error> + Send,
) -> PyResult<T> {
    match py.detach(|| catch_unwind(AssertUnwindSafe(work))) {
        Ok(result) => result.map_err(|e| CoreError(e).into()),
        Err(panic) => {
            let msg = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            Err(PyRuntimeError::new_err(format!(
                "internal error in croupier, please report it: {msg}"
            )))
        }
    }
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

/// The upper bound of lengths, ranks and rank counts, and how messages write it.
const LEN_MAX: (u64, &str) = (croupier_core::index::MAX_LEN, "2**63 - 1");
/// The upper bound of seeds and epochs.
const WORD_MAX: (u64, &str) = (u64::MAX, "2**64 - 1");

/// A Python integer (anything with `__index__`, not `bool`) in `[0, max]`, or an error naming
/// `name` and the allowed range.
fn arg_u64(name: &str, obj: &Bound<'_, PyAny>, (max, max_text): (u64, &str)) -> PyResult<u64> {
    if obj.is_instance_of::<PyBool>() {
        return Err(PyTypeError::new_err(format!(
            "{name} must be an int, got bool"
        )));
    }
    match obj.extract::<u64>() {
        Ok(v) if v <= max => Ok(v),
        Err(_) if !obj.hasattr("__index__")? => Err(PyTypeError::new_err(format!(
            "{name} must be an int, got {}",
            obj.get_type().name()?
        ))),
        _ => Err(PyValueError::new_err(format!(
            "{name} must be in [0, {max_text}], got {}",
            obj.repr()?
        ))),
    }
}

/// The epoch's full permutation of `[0, n)`.
#[pyfunction]
#[pyo3(signature = (n, seed, epoch))]
fn permutation<'py>(
    py: Python<'py>,
    n: &Bound<'py, PyAny>,
    seed: &Bound<'py, PyAny>,
    epoch: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    let (n, seed, epoch) = (
        arg_u64("n", n, LEN_MAX)?,
        arg_u64("seed", seed, WORD_MAX)?,
        arg_u64("epoch", epoch, WORD_MAX)?,
    );
    let out = detached(py, || croupier_core::permutation(n, seed, epoch))?;
    Ok(to_numpy(py, out))
}

/// Fills a writable, contiguous 1-D `uint32` or `int64` array with the permutation of
/// `[0, len(out))` for `(seed, epoch)`: the values [`permutation`] returns, in place.
#[pyfunction]
#[pyo3(signature = (out, seed, epoch))]
fn permutation_into<'py>(
    py: Python<'py>,
    out: &Bound<'py, PyAny>,
    seed: &Bound<'py, PyAny>,
    epoch: &Bound<'py, PyAny>,
) -> PyResult<()> {
    let (seed, epoch) = (
        arg_u64("seed", seed, WORD_MAX)?,
        arg_u64("epoch", epoch, WORD_MAX)?,
    );
    if let Ok(mut arr) = out.extract::<numpy::PyReadwriteArray1<'py, u32>>() {
        let buf = arr
            .as_slice_mut()
            .map_err(|_| PyValueError::new_err("out must be C-contiguous"))?;
        if buf.len() as u64 > croupier_core::index::U32_MAX_LEN {
            return Err(PyValueError::new_err(
                "out must be int64 for more than 2**32 indices",
            ));
        }
        return detached(py, || {
            croupier_core::parshuffle::fill(buf, seed, epoch);
            Ok(())
        });
    }
    if let Ok(mut arr) = out.extract::<numpy::PyReadwriteArray1<'py, i64>>() {
        let buf = arr
            .as_slice_mut()
            .map_err(|_| PyValueError::new_err("out must be C-contiguous"))?;
        let buf: &mut [u64] = bytemuck::cast_slice_mut(buf);
        return detached(py, || {
            croupier_core::parshuffle::fill(buf, seed, epoch);
            Ok(())
        });
    }
    Err(PyTypeError::new_err(
        "out must be a writable 1-D numpy array of dtype uint32 or int64",
    ))
}

/// The epoch order named by a Python string: `"fast"`, `"torch>=2.6"` or `"torch<2.6"` (the
/// torch releases whose `randperm` to reproduce).
fn arg_order(order: &str) -> PyResult<Order> {
    match order {
        "fast" => Ok(Order::Fast),
        "torch>=2.6" => Ok(Order::Torch(TorchRandperm::InsideOutForLargeN)),
        "torch<2.6" => Ok(Order::Torch(TorchRandperm::Forward)),
        other => Err(PyValueError::new_err(format!(
            "order must be 'fast', 'torch>=2.6' or 'torch<2.6', got {other:?}"
        ))),
    }
}

/// `torch.randperm(n, generator=torch.Generator().manual_seed(seed))` on the CPU, exactly, as
/// the torch releases named by `order` (`"torch>=2.6"` or `"torch<2.6"`) compute it.
#[pyfunction]
#[pyo3(signature = (n, seed, order))]
fn torch_randperm<'py>(
    py: Python<'py>,
    n: &Bound<'py, PyAny>,
    seed: &Bound<'py, PyAny>,
    order: &str,
) -> PyResult<Bound<'py, PyAny>> {
    let (n, seed) = (arg_u64("n", n, LEN_MAX)?, arg_u64("seed", seed, WORD_MAX)?);
    let Order::Torch(variant) = arg_order(order)? else {
        return Err(PyValueError::new_err(format!(
            "order must be 'torch>=2.6' or 'torch<2.6', got {order:?}"
        )));
    };
    let out = detached(py, || croupier_core::torch::randperm(n, seed, variant))?;
    Ok(to_numpy(py, out))
}

/// `(num_samples, total_size)` of torch's `DistributedSampler` for these arguments.
#[pyfunction]
#[pyo3(signature = (n, num_replicas, drop_last))]
fn layout(
    n: &Bound<'_, PyAny>,
    num_replicas: &Bound<'_, PyAny>,
    drop_last: bool,
) -> PyResult<(u64, u64)> {
    let layout = arg_layout(n, num_replicas, drop_last)?;
    Ok((layout.num_samples(), layout.total_size()))
}

/// A layout from Python arguments.
fn arg_layout(
    n: &Bound<'_, PyAny>,
    num_replicas: &Bound<'_, PyAny>,
    drop_last: bool,
) -> PyResult<Layout> {
    Ok(Layout::new(
        arg_u64("n", n, LEN_MAX)?,
        arg_u64("num_replicas", num_replicas, LEN_MAX)?,
        drop_last,
    )
    .map_err(CoreError)?)
}

/// Positions `[start, stop)` (default: all) of the sequence `rank` receives in `epoch`
/// (padding and `drop_last` as torch).
#[pyfunction]
#[pyo3(signature = (n, num_replicas, rank, shuffle, seed, epoch, drop_last, order, start=None, stop=None))]
#[allow(clippy::too_many_arguments)]
fn rank_indices<'py>(
    py: Python<'py>,
    n: &Bound<'py, PyAny>,
    num_replicas: &Bound<'py, PyAny>,
    rank: &Bound<'py, PyAny>,
    shuffle: bool,
    seed: &Bound<'py, PyAny>,
    epoch: &Bound<'py, PyAny>,
    drop_last: bool,
    order: &str,
    start: Option<&Bound<'py, PyAny>>,
    stop: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyAny>> {
    let layout = arg_layout(n, num_replicas, drop_last)?;
    let order = arg_order(order)?;
    let (rank, seed, epoch) = (
        arg_u64("rank", rank, LEN_MAX)?,
        arg_u64("seed", seed, WORD_MAX)?,
        arg_u64("epoch", epoch, WORD_MAX)?,
    );
    let start = start.map_or(Ok(0), |s| arg_u64("start", s, LEN_MAX))?;
    let stop = stop.map_or(Ok(layout.num_samples()), |s| arg_u64("stop", s, LEN_MAX))?;
    let out = detached(py, || {
        croupier_core::rank_range(&layout, rank, shuffle, order, seed, epoch, start, stop)
    })?;
    Ok(to_numpy(py, out))
}

/// Where a call starting at `start` should stop to hand out its first index soonest (in the
/// fast shuffled order the end of the block holding `start`, or `start + 64` inside a long
/// block; else `num_samples`).
#[pyfunction]
#[pyo3(signature = (n, num_replicas, rank, shuffle, drop_last, order, start))]
#[allow(clippy::too_many_arguments)]
fn first_stop(
    n: &Bound<'_, PyAny>,
    num_replicas: &Bound<'_, PyAny>,
    rank: &Bound<'_, PyAny>,
    shuffle: bool,
    drop_last: bool,
    order: &str,
    start: &Bound<'_, PyAny>,
) -> PyResult<u64> {
    let layout = arg_layout(n, num_replicas, drop_last)?;
    let order = arg_order(order)?;
    let rank = arg_u64("rank", rank, LEN_MAX)?;
    let start = arg_u64("start", start, LEN_MAX)?;
    Ok(croupier_core::first_stop(&layout, rank, shuffle, order, start).map_err(CoreError)?)
}

/// The compiled core of croupier (private: use the `croupier` package).
#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(permutation, m)?)?;
    m.add_function(wrap_pyfunction!(permutation_into, m)?)?;
    m.add_function(wrap_pyfunction!(layout, m)?)?;
    m.add_function(wrap_pyfunction!(rank_indices, m)?)?;
    m.add_function(wrap_pyfunction!(first_stop, m)?)?;
    m.add_function(wrap_pyfunction!(torch_randperm, m)?)?;
    m.add("MAX_LEN", croupier_core::index::MAX_LEN)?;
    m.add("TORCH_LARGE_N", croupier_core::torch::LARGE_N_THRESHOLD)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
