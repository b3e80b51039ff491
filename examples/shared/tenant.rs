//! Joining a running coordinator as this process's tenant, and waiting
//! out a tenant's control-path rate limit: what the programs that run as
//! tenants (`examples/rpc`, mtrdma-demo's `perf` and `remote_memory`) share.

// Each example uses a part of it. Its items are `pub` for mtrdma-demo's
// library, which includes it too; in an example they are the crate's own.
#![allow(dead_code, unreachable_pub)]

use std::path::Path;
use std::time::{Duration, Instant};

use mtrdma::core::coordinator::register;
use mtrdma::core::{AdmissionError, TenantHandle, TenantId, TrafficClass};
use mtrdma::verbs::Tenancy;

/// The tenant a running coordinator at `socket` decides for this process
/// (none without a socket), or why it could not register.
pub fn join(socket: Option<&Path>) -> Result<Option<TenantHandle>, String> {
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

/// A scheduled queue pair's tenant: the one its queue pair was built for,
/// where the process joined a coordinator (`tenant`), or else tenant 0 of
/// this process, of `class`.
pub fn tenancy(tenant: Option<&TenantHandle>, class: TrafficClass) -> Tenancy {
    match tenant {
        Some(_) => Tenancy::OfQueuePair,
        None => Tenancy::Local {
            id: TenantId(0),
            class,
        },
    }
}

/// What `create` gives, waiting out the tenant's control-path rate limit
/// for up to `patience`, as an application would, rather than failing.
pub fn admitted_in_time<T>(
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
