//! `Order`: which epoch order a share follows (croupier's fast or world-size-invariant one, or
//! torch's `randperm`).

use croupier_core::TorchRandperm;
use pyo3::prelude::*;
use pyo3::types::PyType;

/// An epoch order: croupier's own (`FAST`), its world-size-invariant one (`GLOBAL`: one keyed
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
    Fast,
    TorchForward,
    TorchInsideOut,
    Global,
}

impl Order {
    pub(crate) fn core(self) -> croupier_core::Order {
        match self {
            Order::Fast => croupier_core::Order::Fast,
            Order::TorchForward => croupier_core::Order::Torch(TorchRandperm::Forward),
            Order::TorchInsideOut => croupier_core::Order::Torch(TorchRandperm::InsideOutForLargeN),
            Order::Global => croupier_core::Order::Global,
        }
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            Order::Fast => "FAST",
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
    /// Pickles as `getattr(Order, name)`, so an unpickled order is the same member.
    fn __reduce__<'py>(&self, py: Python<'py>) -> PyResult<Reduced<'py>> {
        let getattr = py.import("builtins")?.getattr("getattr")?;
        Ok((getattr, (py.get_type::<Order>(), self.name())))
    }
}
