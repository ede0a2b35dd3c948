//! Keyword arguments as typed configs. A constructor or method with many settings takes them as
//! keywords (`**config` at runtime; the stub lists each one) and extracts them by name into a
//! `#[derive(FromPyObject)]` struct, so no call passes a long positional list and adding a
//! setting is one named field. A keyword the struct does not know, or one it needs and did not
//! get, is a `TypeError` naming it: nothing is accepted and ignored.

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

/// Declares a typed config: the struct, read from a dict by field name, and its
/// [`Config::KEYWORDS`], taken from the same field list (so the two cannot disagree).
macro_rules! config {
    (
        $(#[$meta:meta])*
        struct $name:ident {
            $($(#[$field_meta:meta])* $field:ident: $ty:ty,)*
        }
    ) => {
        $(#[$meta])*
        #[derive(pyo3::FromPyObject)]
        #[pyo3(from_item_all)]
        struct $name {
            $($(#[$field_meta])* $field: $ty,)*
        }

        impl $crate::config::Config for $name {
            const KEYWORDS: &'static [&'static str] = &[$(stringify!($field)),*];
        }
    };
}
pub(crate) use config;

/// A typed config read from keyword arguments.
pub(crate) trait Config: Sized {
    /// The keywords, in the order the stub lists them.
    const KEYWORDS: &'static [&'static str];

    /// Reads `kwargs` (the keywords of a call to `what`) into the config.
    fn from_kwargs(kwargs: Option<&Bound<'_, PyDict>>, what: &str) -> PyResult<Self>
    where
        for<'a, 'py> Self: FromPyObject<'a, 'py>,
    {
        let Some(kwargs) = kwargs else {
            return Err(missing(what, Self::KEYWORDS));
        };
        for key in kwargs.keys() {
            let key: String = key.extract()?;
            if !Self::KEYWORDS.contains(&key.as_str()) {
                return Err(PyTypeError::new_err(format!(
                    "{what}() got an unexpected keyword argument '{key}'"
                )));
            }
        }
        let absent: Vec<&str> = Self::KEYWORDS
            .iter()
            .copied()
            .filter(|k| !kwargs.contains(*k).unwrap_or(false))
            .collect();
        if !absent.is_empty() {
            return Err(missing(what, &absent));
        }
        kwargs.as_any().extract::<Self>().map_err(|e| {
            // "failed to extract field XConfig.key" and why, as the error it was (a wrong type
            // a TypeError, a negative or too large int an OverflowError), naming the call.
            let py = kwargs.py();
            let e: PyErr = e.into();
            match e.cause(py) {
                Some(cause) => {
                    PyErr::from_type(cause.get_type(py), format!("{what}(): {e}: {cause}"))
                }
                None => PyTypeError::new_err(format!("{what}(): {e}")),
            }
        })
    }
}

fn missing(what: &str, keys: &[&str]) -> PyErr {
    PyTypeError::new_err(format!(
        "{what}() missing required keyword arguments: {}",
        keys.join(", ")
    ))
}
