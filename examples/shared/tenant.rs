//! The tenancy of a scheduled queue pair in the programs that run as
//! tenants (`examples/rpc`, mtrdma-demo's `perf` and `remote_memory`),
//! which join through `mtrdma::Tenant`.

// Its items are `pub` for mtrdma-demo's library, which includes it too;
// in an example they are the crate's own.
#![allow(dead_code, unreachable_pub)]

use mtrdma::core::{TenantHandle, TenantId, TrafficClass};
use mtrdma::verbs::Tenancy;

/// A scheduled queue pair's tenant: the one its queue pair was built for,
/// where the process joined as a tenant (`tenant`), or else tenant 0 of
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
