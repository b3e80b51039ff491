//! Joining a running coordinator as this process's tenant, and waiting
//! out a tenant's control-path rate limit: what the examples that run as
//! tenants (perf, rpc, remote_memory) share.

// Each example uses a part of it.
#![allow(dead_code)]

use std::path::Path;
use std::time::{Duration, Instant};

use mtrdma::core::coordinator::register;
use mtrdma::core::{AdmissionError, TenantHandle};

/// The tenant a running coordinator at `socket` decides for this process
/// (none without a socket), or why it could not register.
pub(crate) fn join(socket: Option<&Path>) -> Result<Option<TenantHandle>, String> {
    socket
        .map(|socket| {
            register(socket).map_err(|e| {
                format!(
                    "registering with the coordinator at {}: {e}",
                    socket.display()
                )
            })
        })
        .transpose()
}

/// What `create` gives, waiting out the tenant's control-path rate limit
/// for up to `patience`, as an application would, rather than failing.
pub(crate) fn admitted_in_time<T>(
    patience: Duration,
    mut create: impl FnMut() -> Result<T, mtrdma::Error>,
) -> Result<T, mtrdma::Error> {
    let deadline = Instant::now() + patience;
    loop {
        match create() {
            Err(mtrdma::Error::Admission(AdmissionError::RateLimited {
                retry_after_ns, ..
            })) if Instant::now() < deadline => std::thread::sleep(Duration::from_nanos(
                retry_after_ns.clamp(1_000_000, 1_000_000_000),
            )),
            other => return other,
        }
    }
}
