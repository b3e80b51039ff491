//! Configuration of the composed scheduler and of each tenant.

use crate::TenantId;

use crate::chunk::ChunkPolicy;
use crate::error::ConfigError;
use crate::gcra::RateLimit;

/// The largest tenant weight accepted.
pub const MAX_WEIGHT: u32 = 1_000_000;

/// The largest DRR quantum accepted, in bytes (4 GiB).
pub const MAX_QUANTUM: u64 = 1 << 32;

/// Parts per million in a whole.
pub(crate) const PPM: u64 = 1_000_000;

/// Settings of a [`TenantScheduler`](crate::TenantScheduler) shared by all
/// tenants.
///
/// ```
/// use mtrdma_sched::SchedulerConfig;
/// let config = SchedulerConfig {
///     chunk_bytes: 16 << 10,
///     quantum_bytes: 16 << 10,
///     ..SchedulerConfig::default()
/// };
/// assert!(config.validate().is_ok());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchedulerConfig {
    /// WRITE/READ descriptors larger than this are split into chunks of at
    /// most this many bytes. Default 64 KiB.
    pub chunk_bytes: u64,
    /// Bytes a weight-1 tenant may send per DRR round (a tenant of weight
    /// `w` gets `w` times this). At least `chunk_bytes`. Default 64 KiB.
    pub quantum_bytes: u64,
    /// Share of the link, in parts per million, that bulk traffic keeps
    /// while the latency class is saturated (the starvation guard); 0
    /// turns the guard off. Default 100,000 (10%).
    pub bulk_min_share_ppm: u32,
    /// Descriptors one tenant may have queued at once; more are refused
    /// with [`RejectReason::QueueFull`](crate::RejectReason::QueueFull).
    /// Default 65,536.
    pub max_queued_per_tenant: usize,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig {
            chunk_bytes: 64 << 10,
            quantum_bytes: 64 << 10,
            bulk_min_share_ppm: 100_000,
            max_queued_per_tenant: 1 << 16,
        }
    }
}

impl SchedulerConfig {
    /// Checks every value, returning the first problem found.
    ///
    /// # Errors
    /// [`ConfigError::ZeroChunk`], [`ConfigError::QuantumBelowChunk`],
    /// [`ConfigError::QuantumTooLarge`], [`ConfigError::BulkShareTooLarge`]
    /// or [`ConfigError::ZeroQueueLimit`].
    pub fn validate(&self) -> Result<(), ConfigError> {
        ChunkPolicy::new(self.chunk_bytes)?;
        if self.quantum_bytes < self.chunk_bytes {
            return Err(ConfigError::QuantumBelowChunk {
                quantum: self.quantum_bytes,
                chunk: self.chunk_bytes,
            });
        }
        if self.quantum_bytes > MAX_QUANTUM {
            return Err(ConfigError::QuantumTooLarge {
                quantum: self.quantum_bytes,
                max: MAX_QUANTUM,
            });
        }
        if u64::from(self.bulk_min_share_ppm) >= PPM {
            return Err(ConfigError::BulkShareTooLarge {
                ppm: self.bulk_min_share_ppm,
            });
        }
        if self.max_queued_per_tenant == 0 {
            return Err(ConfigError::ZeroQueueLimit);
        }
        Ok(())
    }
}

/// How one tenant is treated: its DRR weight and optional rate caps.
///
/// With only weights set, the scheduler is work conserving (an idle
/// tenant's share goes to the others); a cap holds a tenant to its rate
/// even when the link is otherwise idle.
///
/// ```
/// use mtrdma_sched::{RateLimit, TenantPolicy};
/// let policy = TenantPolicy::weight(4)
///     .with_byte_cap(RateLimit::gbits_per_sec(25).with_burst(256 << 10))
///     .with_wr_cap(RateLimit::per_second(2_000_000));
/// assert_eq!(policy.weight, 4);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TenantPolicy {
    /// Relative share among backlogged tenants; at least 1.
    pub weight: u32,
    /// Cap on bytes per second, if any.
    pub byte_cap: Option<RateLimit>,
    /// Cap on work requests (posted pieces) per second, if any.
    pub wr_cap: Option<RateLimit>,
}

impl Default for TenantPolicy {
    fn default() -> Self {
        TenantPolicy::weight(1)
    }
}

impl TenantPolicy {
    /// Weight `weight`, no caps.
    pub const fn weight(weight: u32) -> TenantPolicy {
        TenantPolicy {
            weight,
            byte_cap: None,
            wr_cap: None,
        }
    }

    /// The same policy with a byte-rate cap.
    pub const fn with_byte_cap(self, cap: RateLimit) -> TenantPolicy {
        TenantPolicy {
            byte_cap: Some(cap),
            ..self
        }
    }

    /// The same policy with a work-request-rate cap.
    pub const fn with_wr_cap(self, cap: RateLimit) -> TenantPolicy {
        TenantPolicy {
            wr_cap: Some(cap),
            ..self
        }
    }

    /// Checks the policy for `tenant`.
    ///
    /// # Errors
    /// [`ConfigError::ZeroWeight`], [`ConfigError::WeightTooLarge`] or
    /// [`ConfigError::ZeroRate`].
    pub fn validate(&self, tenant: TenantId) -> Result<(), ConfigError> {
        if self.weight == 0 {
            return Err(ConfigError::ZeroWeight { tenant });
        }
        if self.weight > MAX_WEIGHT {
            return Err(ConfigError::WeightTooLarge {
                tenant,
                weight: self.weight,
                max: MAX_WEIGHT,
            });
        }
        for cap in [self.byte_cap, self.wr_cap].into_iter().flatten() {
            crate::gcra::interval_of(cap.per_second)?;
        }
        Ok(())
    }
}
