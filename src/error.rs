//! The facade's error: every member crate's error a program meets on the
//! way from joining as a tenant to posting, so that one `?` serves them
//! all and a caller can still match on where it came from.

use mtrdma_core::coordinator::CoordinatorError;
use mtrdma_core::registry::RegistryError;
use mtrdma_core::tenant::{JoinError, RateLimited};
use mtrdma_core::{AdmissionError, PolicyError, TableError};

/// Why an mtrdma operation failed: the member crate's own error, unchanged
/// (its message, its source chain and its fields).
///
/// ```no_run
/// fn run() -> Result<(), mtrdma::Error> {
///     let tenant = mtrdma::Tenant::from_env()?; // a JoinError
///     let ctx = mtrdma::Context::open_first_active()?; // a verbs error
///     let pd = ctx.alloc_pd()?;
///     let _qp = pd.queue_pair().tenant(&tenant).build()?;
///     Ok(())
/// }
/// # fn main() { let _ = run(); }
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// From the verbs layer: devices, queue pairs, regions, posting,
    /// admission of what is created for a tenant.
    #[error(transparent)]
    Verbs(#[from] mtrdma_verbs::Error),
    /// Joining as a tenant ([`Tenant::join`](crate::Tenant::join)).
    #[error(transparent)]
    Join(#[from] JoinError),
    /// A policy file or policy.
    #[error(transparent)]
    Policy(#[from] PolicyError),
    /// The quota table.
    #[error(transparent)]
    Table(#[from] TableError),
    /// A tenant's quota or control-path rate, asked of its handle
    /// directly.
    #[error(transparent)]
    Admission(#[from] AdmissionError),
    /// Running a coordinator, or registering with one.
    #[error(transparent)]
    Coordinator(#[from] CoordinatorError),
    /// The endpoint registry.
    #[error(transparent)]
    Registry(#[from] RegistryError),
}

impl RateLimited for Error {
    fn retry_after(&self) -> Option<std::time::Duration> {
        match self {
            Error::Verbs(e) => e.retry_after(),
            Error::Admission(e) => e.retry_after(),
            _ => None,
        }
    }
}
