//! numpy's legacy `RandomState.shuffle`, on a numpy array in place (`croupier.compat.numpy`,
//! `croupier.compat.megatron`).

use croupier_core::shuffle::{legacy_shuffle as shuffle_typed, legacy_shuffle_rows, Mt19937};
use numpy::PyReadwriteArray1;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::runtime::long;

/// Arrays from this many bytes are shuffled interruptibly (Ctrl-C heard within milliseconds).
const INTERRUPTIBLE_FROM: usize = 1 << 22;

/// Shuffles the rows of `data` (a C-contiguous array's bytes, `row` bytes a row) as numpy's
/// legacy `RandomState.shuffle` does from the twister state `(key, pos)` of
/// `RandomState.get_state()`. `key` (624 words) is updated in place and the new position
/// returned; `set_state` with both leaves the `RandomState` as numpy's own shuffle would. On
/// Ctrl-C the array is left partly shuffled and `key` unchanged.
#[pyfunction]
pub(crate) fn legacy_shuffle<'py>(
    py: Python<'py>,
    mut data: PyReadwriteArray1<'py, u8>,
    row: usize,
    mut key: PyReadwriteArray1<'py, u32>,
    pos: usize,
) -> PyResult<usize> {
    let bytes = data
        .as_slice_mut()
        .map_err(|_| PyValueError::new_err("data must be C-contiguous"))?;
    if row == 0 || bytes.len() % row != 0 {
        return Err(PyValueError::new_err(format!(
            "row must divide the data's {} bytes, got {row}",
            bytes.len()
        )));
    }
    let words = key
        .as_slice_mut()
        .map_err(|_| PyValueError::new_err("key must be C-contiguous"))?;
    let mut mt = Mt19937 {
        key: words.try_into().map_err(|_| {
            PyValueError::new_err(format!("key must hold 624 words, got {}", words.len()))
        })?,
        pos,
    };
    if pos > croupier_core::shuffle::MT_WORDS {
        return Err(PyValueError::new_err(format!(
            "pos must be in [0, 624], got {pos}"
        )));
    }
    let big = bytes.len() >= INTERRUPTIBLE_FROM;
    let mt = long(py, big, move || {
        // Rows of 1, 2, 4 or 8 bytes, aligned, swap as integers; others byte by byte.
        if !typed(bytes, row, &mut mt) {
            legacy_shuffle_rows(bytes, row, &mut mt);
        }
        if croupier_core::Cancel::current_is_raised() {
            return Err(croupier_core::Error::Cancelled);
        }
        Ok(mt)
    })?;
    words.copy_from_slice(&mt.key);
    Ok(mt.pos)
}

/// Shuffles `bytes` as elements of `row` bytes when `row` is 1, 2, 4 or 8 and the data is
/// aligned for them; false otherwise (nothing done).
fn typed(bytes: &mut [u8], row: usize, mt: &mut Mt19937) -> bool {
    macro_rules! as_ints {
        ($t:ty) => {
            match bytemuck::try_cast_slice_mut::<u8, $t>(bytes) {
                Ok(ints) => {
                    shuffle_typed(ints, mt);
                    true
                }
                Err(_) => false,
            }
        };
    }
    match row {
        1 => as_ints!(u8),
        2 => as_ints!(u16),
        4 => as_ints!(u32),
        8 => as_ints!(u64),
        _ => false,
    }
}
