//! A tenant's rate limits as a handle applies them: the cap it caches
//! from the policy, charged against the tenant's shared TAT, and a debt
//! carried over when the rate changes.

use super::*;

/// A rate limit as cached by a handle: the rate, its interval and burst
/// tolerance (rate 0: no limit).
#[derive(Debug, Default)]
pub(super) struct CachedCap {
    pub(super) per_second: AtomicU64,
    pub(super) interval: AtomicU64,
    pub(super) tolerance: AtomicU64,
}

impl CachedCap {
    pub(super) fn set(&self, cap: Option<RateLimit>) {
        match cap.and_then(|c| EmissionInterval::from_rate(c.per_second).map(|i| (c, i))) {
            Some((c, i)) => {
                self.interval.store(i.to_bits(), Ordering::Relaxed);
                self.tolerance
                    .store(i.increment(c.burst), Ordering::Relaxed);
                self.per_second.store(c.per_second, Ordering::Relaxed);
            }
            None => self.per_second.store(0, Ordering::Relaxed),
        }
    }

    /// Charges `cost` against the shared TAT; `Err(retry_at)` when it does not conform.
    #[inline]
    pub(super) fn charge(&self, tat: &AtomicU64, now: u64, cost: u64) -> Result<(), u64> {
        if self.per_second.load(Ordering::Relaxed) == 0 {
            return Ok(());
        }
        gcra_shared(
            tat,
            now,
            cost,
            EmissionInterval::from_bits(self.interval.load(Ordering::Relaxed)),
            self.tolerance.load(Ordering::Relaxed),
        )
    }
}

/// A TAT charged at `from` units per second, carried over to a rate of
/// `to`: what is owed past `now` stays the same number of units, and so
/// takes `from / to` as long at the new rate (rounded up). A raised rate
/// then applies at once rather than after the old rate's debt has
/// cleared, and a lowered one is not dodged by a debt charged before. A
/// TAT not past `now` (nothing owed), or a rate of 0 (none), is kept.
#[inline]
pub(super) fn gcra_rescale(tat: u64, now: u64, from: u64, to: u64) -> u64 {
    if tat <= now || from == 0 || to == 0 || from == to {
        return tat;
    }
    let owed = (u128::from(tat - now) * u128::from(from)).div_ceil(u128::from(to));
    now.saturating_add(u64::try_from(owed).unwrap_or(u64::MAX))
}
