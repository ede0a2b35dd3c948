//! The one error type of the core. Every fallible function returns it; the bindings map it to
//! Python exceptions in a single `From` impl.

/// What went wrong, in words that name the argument and the allowed range.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// An argument outside its allowed range.
    #[error("{name} must be {allowed}, got {got}")]
    OutOfRange {
        /// The argument's name as the user wrote it.
        name: &'static str,
        /// The allowed range, e.g. `"in [0, num_replicas) = [0, 8)"`.
        allowed: String,
        /// The value given.
        got: String,
    },
    /// A buffer that cannot be allocated (too large for this machine or address space).
    #[error("cannot allocate {bytes} bytes for {what}")]
    Alloc {
        /// What the buffer was for.
        what: &'static str,
        /// Requested size in bytes.
        bytes: u128,
    },
    /// The call was abandoned ([`crate::Cancel`]): a stage that looked at the raised flag
    /// stopped there. The caller that raised the flag discards it.
    #[error("the call was cancelled")]
    Cancelled,
}

/// Result with the core's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// Shorthand for [`Error::OutOfRange`].
    pub(crate) fn out_of_range(
        name: &'static str,
        allowed: impl Into<String>,
        got: impl ToString,
    ) -> Self {
        Error::OutOfRange {
            name,
            allowed: allowed.into(),
            got: got.to_string(),
        }
    }
}
