//! The policies the table's tests share: its unit tests, and
//! `tests/table.rs`, which includes this file (hence the paths from the
//! crate root, where both have the policy types).

use crate::{LinkConfig, Policy, TenantEntry, TenantId, TrafficClass};

/// A policy of `tenants` on a 100 Gb/s link.
pub(crate) fn policy(tenants: Vec<TenantEntry>) -> Policy {
    Policy::new(LinkConfig::new(12_500_000_000), tenants)
}

/// A latency tenant held to 4 queue pairs and 1 MiB of memory regions,
/// and a bulk tenant of weight 3.
pub(crate) fn two_tenants() -> Policy {
    policy(vec![
        TenantEntry::new(TenantId(1), "kv")
            .with_class(TrafficClass::Latency)
            .with_max_qps(4)
            .with_max_mr_bytes(1 << 20),
        TenantEntry::new(TenantId(2), "bulk").with_weight(3),
    ])
}

/// A policy of `tenants` on a 1 MB/s link.
pub(crate) fn small_link(tenants: Vec<TenantEntry>) -> Policy {
    Policy::new(LinkConfig::new(1_000_000), tenants)
}
