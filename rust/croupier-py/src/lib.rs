//! `croupier._core`: the PyO3 face of croupier-core.
//!
//! This crate only converts. Arguments arrive as typed values (`u64`, `bool`, the [`Order`]
//! enum, the [`RankShare`] configuration of a rank's share); the work runs in croupier-core
//! with the GIL released; the resulting Rust buffers become numpy arrays that own them (no copy).
//!
//! Where arguments are checked: user-facing checks, with messages that name the argument and
//! its range, are made once, in Python (`python/croupier/_validate.py`), before any call
//! reaches this module; the few that depend on the order are made here, by the class that
//! owns the order, before it computes anything. The core checks its own invariants again as a library must, and those
//! errors arrive here as `ValueError` (`MemoryError` for buffers that cannot be allocated). A
//! value of the wrong type or sign is refused by the conversion itself (`TypeError` or
//! `OverflowError`), which only a caller of this private module can meet.
//!
//! One file per Python class (`order`, `rank_share`, `buckets`, `sequential`, `chunk`;
//! `mixture` holds `MixtureShape` too), `numpy_legacy` for numpy's legacy shuffle, `megatron` for Megatron-Core's dataset helpers,
//! the module's functions here, and `runtime` for what every call shares: the per-process
//! thread pool, the GIL released, Ctrl-C, panics and errors, the memory check, numpy buffers.

mod buckets;
mod chunk;
mod config;
mod megatron;
mod mixture;
mod numpy_legacy;
mod order;
mod rank_share;
mod runtime;
mod sequential;

use std::panic::{catch_unwind, AssertUnwindSafe};

use croupier_core::Layout;
use numpy::IntoPyArray;
use pyo3::exceptions::{PyImportError, PyTypeError, PyValueError};
use pyo3::prelude::*;

use crate::buckets::Buckets;
use crate::chunk::ChunkPlan;
use crate::mixture::{Mixture, MixtureShape};
use crate::order::Order;
use crate::rank_share::RankShare;
use crate::runtime::{core, detached, quiet_panics_of_abandoned_work, sized, to_numpy};
use crate::sequential::SequentialBuckets;

/// `(num_samples, total_size)` of torch's `DistributedSampler` for these arguments.
#[pyfunction]
fn layout(n: u64, num_replicas: u64, drop_last: bool) -> PyResult<(u64, u64)> {
    let layout = core(Layout::new(n, num_replicas, drop_last))?;
    Ok((layout.num_samples(), layout.total_size()))
}

/// The end of an epoch of `n` positions dealt over `num_replicas` ranks: `n`, or with
/// `drop_last` the positions it keeps (where an elastic rest of it ends).
#[pyfunction]
fn epoch_end(n: u64, num_replicas: u64, drop_last: bool) -> PyResult<u64> {
    Ok(core(Layout::new(n, num_replicas, drop_last))?.epoch_end())
}

/// The epoch's full permutation of `[0, n)`.
#[pyfunction]
fn permutation(py: Python<'_>, n: u64, seed: u64, epoch: u64) -> PyResult<Bound<'_, PyAny>> {
    let bytes = croupier_core::permutation_bytes(n);
    let out = sized(py, bytes, "the permutation", move || {
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
        return Err(PyValueError::new_err(format!(
            "order must be Order.TORCH_FORWARD or Order.TORCH_INSIDE_OUT, got Order.{}",
            order.name()
        )));
    };
    let bytes = n.saturating_mul(croupier_core::index_bytes(n));
    let out = sized(py, bytes, "randperm", move || {
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
        // rust-numpy's owner of a Rust buffer handed over whole (`into_pyarray`) is a Python
        // type it creates on first use: created here too, not at a first sampler's first call.
        drop(vec![0u32].into_pyarray(py));
    }))
    .map_err(|_| PyImportError::new_err("croupier: numpy's C API could not be loaded"))
}

/// The compiled core of croupier (private: use the `croupier` package).
///
/// `gil_used = false`: on a free-threaded Python the module does not need the GIL. Its only
/// shared state is the per-process thread pool, published through an atomic pointer; `Order`
/// and the classes are frozen (immutable, so `Sync`; `Buckets` keeps its epoch plans behind a
/// mutex); every call works on its own buffers, or, for
/// `permutation_into`, on an array borrowed mutably through rust-numpy's borrow checking.
#[pymodule(gil_used = false)]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    load_numpy_api(m.py())?;
    quiet_panics_of_abandoned_work();
    // The core picks its AVX2 kernels by run-time detection, which runs `cpuid` several times
    // on its first use: about 30 us in a VM, where every `cpuid` exits to the hypervisor. Paid
    // here, once, rather than by a first sampler's first index.
    #[cfg(target_arch = "x86_64")]
    let _ = std::arch::is_x86_feature_detected!("avx2");
    m.add_class::<Order>()?;
    m.add_class::<RankShare>()?;
    // Its name before 0.2.0: samplers pickled then name `croupier._core.Deal`.
    m.add("Deal", m.getattr("RankShare")?)?;
    m.add_class::<Mixture>()?;
    m.add_class::<MixtureShape>()?;
    m.add_class::<Buckets>()?;
    m.add_class::<SequentialBuckets>()?;
    m.add_class::<ChunkPlan>()?;
    m.add_function(wrap_pyfunction!(layout, m)?)?;
    m.add_function(wrap_pyfunction!(epoch_end, m)?)?;
    m.add_function(wrap_pyfunction!(permutation, m)?)?;
    m.add_function(wrap_pyfunction!(permutation_into, m)?)?;
    m.add_function(wrap_pyfunction!(torch_randperm, m)?)?;
    m.add_function(wrap_pyfunction!(numpy_legacy::legacy_shuffle, m)?)?;
    m.add_function(wrap_pyfunction!(megatron::greatest_error_blend, m)?)?;
    m.add_function(wrap_pyfunction!(
        megatron::exhaustive_greatest_error_blend,
        m
    )?)?;
    m.add_function(wrap_pyfunction!(megatron::sample_index, m)?)?;
    m.add_function(wrap_pyfunction!(megatron::micro_batches, m)?)?;
    m.add_function(wrap_pyfunction!(megatron::index_range, m)?)?;
    m.add_function(wrap_pyfunction!(megatron::index_tile, m)?)?;
    m.add("BLEND_MAX_DATASETS", croupier_core::BLEND_MAX_DATASETS)?;
    m.add(
        "BLEND_WEIGHT_SUM_TOLERANCE",
        croupier_core::BLEND_WEIGHT_SUM_TOLERANCE,
    )?;
    m.add("MAX_LEN", croupier_core::MAX_LEN)?;
    m.add("U32_MAX_LEN", croupier_core::U32_MAX_LEN)?;
    m.add("TORCH_LARGE_N", croupier_core::LARGE_N_THRESHOLD)?;
    m.add("MIX_FIRST_STOP", croupier_core::mix::MIX_FIRST_STOP)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
