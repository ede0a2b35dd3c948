//! `Order`: which epoch order a share follows (croupier's per-rank or world-size-invariant one, or
//! torch's `randperm`).

use croupier_core::TorchRandperm;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyType;

/// An epoch order: croupier's own per-rank one (`PER_RANK`; `FAST`, its earlier name, is an
/// alias), its world-size-invariant one (`GLOBAL`: one keyed
/// permutation per epoch whatever the number of ranks), or torch's CPU `randperm` as releases
/// before 2.6 (`TORCH_FORWARD`) or from 2.6 on (`TORCH_INSIDE_OUT`) compute it; they differ
/// only for `2**32 // 20` samples or more.
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
pub(crate) enum Order {
    PerRank,
    TorchForward,
    TorchInsideOut,
    Global,
}

impl Order {
    pub(crate) fn core(self) -> croupier_core::Order {
        match self {
            Order::PerRank => croupier_core::Order::PerRank,
            Order::TorchForward => croupier_core::Order::Torch(TorchRandperm::Forward),
            Order::TorchInsideOut => croupier_core::Order::Torch(TorchRandperm::InsideOutForLargeN),
            Order::Global => croupier_core::Order::Global,
        }
    }

    /// Refuses an epoch the order cannot draw: torch seeds its generator with `seed + epoch`
    /// to shuffle, and `torch.manual_seed` refuses more than `2**64 - 1` (unshuffled, torch
    /// seeds nothing and any epoch is fine).
    pub(crate) fn check_epoch(self, shuffled: bool, seed: u64, epoch: u64) -> PyResult<()> {
        let torch = matches!(self, Order::TorchForward | Order::TorchInsideOut);
        if torch && shuffled && seed.checked_add(epoch).is_none() {
            return Err(PyValueError::new_err(format!(
                "seed + epoch must be at most 2**64 - 1 for order='torch' (torch.manual_seed \
                 refuses more), got seed={seed} epoch={epoch}"
            )));
        }
        Ok(())
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            Order::PerRank => "PER_RANK",
            Order::TorchForward => "TORCH_FORWARD",
            Order::TorchInsideOut => "TORCH_INSIDE_OUT",
            Order::Global => "GLOBAL",
        }
    }
}

/// What `__reduce__` returns: a callable and its arguments.
type Reduced<'py> = (Bound<'py, PyAny>, (Bound<'py, PyType>, &'static str));

#[pymethods]
impl Order {
    /// `PER_RANK` under its earlier name, for code and pickles that still use it.
    #[classattr]
    #[pyo3(name = "FAST")]
    fn fast_alias() -> Order {
        Order::PerRank
    }

    /// Pickles as `getattr(Order, name)`, so an unpickled order is the same member.
    fn __reduce__<'py>(&self, py: Python<'py>) -> PyResult<Reduced<'py>> {
        let getattr = py.import("builtins")?.getattr("getattr")?;
        Ok((getattr, (py.get_type::<Order>(), self.name())))
    }
}
