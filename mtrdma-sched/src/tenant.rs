//! Tenant identity and traffic classes.

use std::fmt;

/// Identifies a tenant: the unit of isolation (a container, a process, a
/// service) whose work requests and resources are scheduled and counted
/// together.
///
/// ```
/// use mtrdma_sched::TenantId;
/// let t = TenantId(7);
/// assert_eq!(t.to_string(), "tenant 7");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct TenantId(pub u32);

impl fmt::Display for TenantId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "tenant {}", self.0)
    }
}

/// The traffic class of a work request.
///
/// Latency-sensitive work is served with strict priority over bulk work
/// (with a starvation guard that keeps bulk's minimum share).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum TrafficClass {
    /// Small messages whose tail latency matters (RPCs, probes, locks).
    Latency,
    /// Throughput-oriented transfers; may be split into chunks.
    #[default]
    Bulk,
}

impl fmt::Display for TrafficClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TrafficClass::Latency => "latency",
            TrafficClass::Bulk => "bulk",
        })
    }
}
