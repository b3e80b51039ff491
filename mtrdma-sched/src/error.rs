//! Errors: invalid configuration, and descriptors handed back on refusal.

use crate::TenantId;
use thiserror::Error;

use crate::descriptor::Descriptor;

/// A configuration or policy value the schedulers cannot work with.
///
/// Returned instead of panicking; nothing is changed when it is returned.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ConfigError {
    /// A rate limit of zero units per second would block forever.
    #[error(
        "a rate limit must allow at least 1 unit per second; to stop a tenant, remove it instead"
    )]
    ZeroRate,
    /// A tenant with weight 0 would never be served.
    #[error("{tenant} has weight 0; weights must be at least 1")]
    ZeroWeight {
        /// The tenant whose policy was refused.
        tenant: TenantId,
    },
    /// A weight above [`MAX_WEIGHT`](crate::MAX_WEIGHT).
    #[error("{tenant} has weight {weight}, above the maximum of {max}; scale all weights down")]
    WeightTooLarge {
        /// The tenant whose policy was refused.
        tenant: TenantId,
        /// The weight asked for.
        weight: u32,
        /// The largest weight accepted.
        max: u32,
    },
    /// Chunks of zero bytes would never make progress.
    #[error("chunk size must be at least 1 byte")]
    ZeroChunk,
    /// A DRR quantum smaller than a chunk would cost extra rounds per chunk.
    #[error("DRR quantum of {quantum} bytes is below the chunk size of {chunk} bytes; raise the quantum to at least the chunk size")]
    QuantumBelowChunk {
        /// The quantum asked for.
        quantum: u64,
        /// The chunk size it must cover.
        chunk: u64,
    },
    /// A quantum so large that weighted deficits could overflow.
    #[error("DRR quantum of {quantum} bytes is above the maximum of {max} bytes")]
    QuantumTooLarge {
        /// The quantum asked for.
        quantum: u64,
        /// The largest quantum accepted.
        max: u64,
    },
    /// A guaranteed bulk share of 100% or more would starve the latency class.
    #[error("bulk minimum share of {ppm} ppm is not below 1,000,000 ppm (100%)")]
    BulkShareTooLarge {
        /// The share asked for, in parts per million.
        ppm: u32,
    },
    /// A [`DelayWindowConfig`](crate::DelayWindowConfig) value out of range.
    #[error("invalid window setting: {what}")]
    Window {
        /// Which value, and the range it must lie in.
        what: &'static str,
    },
    /// A [`Protection`](crate::Protection) (a latency bound and what
    /// follows from it) out of range.
    #[error("invalid protection setting: {what}")]
    Protection {
        /// Which value, and the range it must lie in.
        what: &'static str,
    },
    /// A per-tenant queue limit of zero would refuse every descriptor.
    #[error("the per-tenant queue limit must be at least 1 descriptor")]
    ZeroQueueLimit,
}

/// Why a descriptor was refused by [`Scheduler::enqueue`](crate::Scheduler::enqueue).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum RejectReason {
    /// The tenant has no policy in this scheduler.
    #[error("{0} is not known to the scheduler; set its policy first")]
    UnknownTenant(TenantId),
    /// The tenant already has as many descriptors queued as allowed.
    #[error("{tenant} already has {limit} descriptors queued; poll completions and retry")]
    QueueFull {
        /// The tenant whose queue is full.
        tenant: TenantId,
        /// The configured per-tenant limit.
        limit: usize,
    },
}

/// A refused descriptor, handed back to the caller with the reason, so the
/// work request it stands for is never silently dropped.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("descriptor refused: {reason}")]
pub struct Rejected<H> {
    /// Why it was refused.
    pub reason: RejectReason,
    /// The descriptor, unchanged.
    pub descriptor: Descriptor<H>,
}
