//! Megatron-Core's dataset helpers (`croupier.compat.megatron`): the greedy blend, exhaustive
//! or not, its per-dataset sample positions, and the sample index.

use numpy::{PyArrayMethods, PyReadonlyArray1, PyReadwriteArray1};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::runtime::long;

/// Blends of this many positions and more run interruptibly (Ctrl-C heard within milliseconds).
const INTERRUPTIBLE_FROM: usize = 1 << 20;

fn readonly<'a, T: numpy::Element>(
    array: &'a PyReadonlyArray1<'_, T>,
    name: &str,
) -> PyResult<&'a [T]> {
    array
        .as_slice()
        .map_err(|_| PyValueError::new_err(format!("{name} must be C-contiguous")))
}

fn contiguous<'a, T>(
    slice: Result<&'a mut [T], numpy::AsSliceError>,
    name: &str,
) -> PyResult<&'a mut [T]> {
    slice.map_err(|_| PyValueError::new_err(format!("{name} must be C-contiguous")))
}

/// megatron-core's `build_blending_indices` into `out` (the `int16` dataset index viewed as
/// `uint16`) and `samples` (the dataset sample index, as long), every position of them.
#[pyfunction]
pub(crate) fn greatest_error_blend<'py>(
    py: Python<'py>,
    weights: PyReadonlyArray1<'py, f64>,
    mut out: PyReadwriteArray1<'py, u16>,
    mut samples: PyReadwriteArray1<'py, i64>,
) -> PyResult<()> {
    let weights = readonly(&weights, "weights")?;
    let out = contiguous(out.as_slice_mut(), "dataset_index")?;
    let samples = contiguous(samples.as_slice_mut(), "dataset_sample_index")?;
    let big = out.len() >= INTERRUPTIBLE_FROM;
    long(py, big, move || {
        croupier_core::greatest_error_blend(weights, out, samples)
    })
}

/// megatron-core's `build_exhaustive_blending_indices` into `out` and `samples` (each as long
/// as the sizes' sum).
#[pyfunction]
pub(crate) fn exhaustive_greatest_error_blend<'py>(
    py: Python<'py>,
    sizes: PyReadonlyArray1<'py, u64>,
    mut out: PyReadwriteArray1<'py, u16>,
    mut samples: PyReadwriteArray1<'py, i64>,
) -> PyResult<()> {
    let sizes = readonly(&sizes, "sizes")?;
    let out = contiguous(out.as_slice_mut(), "dataset_index")?;
    let samples = contiguous(samples.as_slice_mut(), "dataset_sample_index")?;
    let big = out.len() >= INTERRUPTIBLE_FROM;
    long(py, big, move || {
        croupier_core::exhaustive_greatest_error_blend(sizes, out, samples)
    })
}

/// Megatron-LM's sequential sampler's micro-batches of groups `[start, stop)`, flattened:
/// group `k`'s `mbs` samples from `first + k * group`.
#[pyfunction]
pub(crate) fn micro_batches<'py>(
    py: Python<'py>,
    first: u64,
    group: u64,
    mbs: u64,
    start: u64,
    stop: u64,
) -> PyResult<Bound<'py, numpy::PyArray1<i64>>> {
    use numpy::IntoPyArray;
    let out = crate::runtime::core(
        py.detach(|| croupier_core::deal::micro_batches(first, group, mbs, start, stop)),
    )?;
    Ok(out.into_pyarray(py))
}

/// megatron-core's `build_sample_idx`: a new `(num_samples + 1, 2)` array, `int64` when
/// `wide`, else `int32`.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
pub(crate) fn sample_index<'py>(
    py: Python<'py>,
    sizes: PyReadonlyArray1<'py, i32>,
    document_index: PyReadonlyArray1<'py, i32>,
    seq_length: i32,
    num_epochs: i32,
    tokens_per_epoch: i64,
    drop_last_partial_sequence: bool,
    add_extra_token: i32,
    wide: bool,
) -> PyResult<Bound<'py, PyAny>> {
    let sizes = readonly(&sizes, "sizes")?;
    let docs = readonly(&document_index, "document_indices")?;
    let spec = croupier_core::SampleIndexSpec {
        seq_length,
        num_epochs,
        tokens_per_epoch,
        drop_last_partial_sequence,
        add_extra_token,
    };
    let rows = crate::runtime::core(spec.num_samples())? as usize + 1;
    let big = docs.len() >= INTERRUPTIBLE_FROM || rows >= INTERRUPTIBLE_FROM;
    fn build<'py, T: croupier_core::SampleIndexValue + numpy::Element>(
        py: Python<'py>,
        sizes: &[i32],
        docs: &[i32],
        spec: croupier_core::SampleIndexSpec,
        rows: usize,
        big: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        crate::runtime::check_memory(
            (rows * 2 * std::mem::size_of::<T>()) as u64,
            "the sample index",
        )?;
        let flat = long(py, big, move || {
            // Zeroed memory taken untouched from the kernel: onto huge pages before the walk
            // (and the core's prefault helper) first touches it.
            let mut flat = vec![T::of(0); 2 * rows];
            croupier_core::advise_huge(&flat);
            croupier_core::sample_index(sizes, docs, &spec, &mut flat)
                .map_err(named_document_indices)?;
            Ok(flat)
        })?;
        let array = numpy::PyArray1::from_vec(py, flat);
        Ok(array.reshape([rows, 2])?.into_any())
    }
    if wide {
        build::<i64>(py, sizes, docs, spec, rows, big)
    } else {
        build::<i32>(py, sizes, docs, spec, rows, big)
    }
}

/// A core error about its `document_index` argument, named as megatron-core's
/// `build_sample_idx` (and croupier's) names it: `document_indices`.
fn named_document_indices(e: croupier_core::Error) -> croupier_core::Error {
    match e {
        croupier_core::Error::OutOfRange {
            name: "document_index",
            allowed,
            got,
        } => croupier_core::Error::OutOfRange {
            name: "document_indices",
            allowed,
            got: got.replacen("document_index", "document_indices", 1),
        },
        e => e,
    }
}

/// `[0, total)` in a fresh array, `uint32` or (`wide`) `int64` as megatron-core's shuffle index
/// takes, written by all threads (numpy's `arange` touches the fresh memory on one).
#[pyfunction]
pub(crate) fn index_range(py: Python<'_>, total: u64, wide: bool) -> PyResult<Bound<'_, PyAny>> {
    if !wide && total > u32::MAX as u64 + 1 {
        return Err(PyValueError::new_err(format!(
            "total must be at most 2**32 for uint32 values, got {total}"
        )));
    }
    let bytes = total * if wide { 8 } else { 4 };
    crate::runtime::check_memory(bytes, "the index range")?;
    let big = total as usize >= INTERRUPTIBLE_FROM;
    if wide {
        let v = long(py, big, move || croupier_core::range_par::<u64>(total))?;
        let v: Vec<i64> = bytemuck::allocation::cast_vec(v);
        Ok(numpy::PyArray1::from_vec(py, v).into_any())
    } else {
        let v = long(py, big, move || croupier_core::range_par::<u32>(total))?;
        Ok(numpy::PyArray1::from_vec(py, v).into_any())
    }
}

/// `values` repeated `times` times in a fresh `int32` array, written by all threads
/// (megatron-core's document index starts from it; numpy's `tile` copies on one thread).
#[pyfunction]
pub(crate) fn index_tile<'py>(
    py: Python<'py>,
    values: PyReadonlyArray1<'py, i32>,
    times: u64,
) -> PyResult<Bound<'py, numpy::PyArray1<i32>>> {
    let values = readonly(&values, "values")?;
    let total = (values.len() as u64).saturating_mul(times);
    crate::runtime::check_memory(total.saturating_mul(4), "the tiled index")?;
    let big = total as usize >= INTERRUPTIBLE_FROM;
    let v = long(py, big, move || croupier_core::tile_par(values, times))?;
    Ok(numpy::PyArray1::from_vec(py, v))
}
