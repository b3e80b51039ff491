//! GCRA (generic cell rate algorithm) rate shaping over one 64-bit word.
//!
//! The whole state of a shaper is its *theoretical arrival time* (TAT): the
//! time at which the shaped flow would be idle again if it had been sent at
//! exactly its rate. [`gcra_decide`] is the pure step function over plain
//! `u64`s; [`gcra_shared`] runs the very same step in a compare-and-swap
//! loop on an `AtomicU64` (the quota table's shared memory in
//! `mtrdma-core`); [`Gcra`] is the single-owner wrapper the schedulers use.

use crate::error::ConfigError;
use crate::time::Nanos;

mod step;

pub use step::{gcra_decide, gcra_shared, EmissionInterval};

/// The interval of a rate, or [`ConfigError::ZeroRate`].
pub(crate) fn interval_of(per_second: u64) -> Result<EmissionInterval, ConfigError> {
    EmissionInterval::from_rate(per_second).ok_or(ConfigError::ZeroRate)
}

/// A rate limit: a sustained rate and a burst allowance, in the same unit
/// (bytes, or work requests).
///
/// ```
/// use mtrdma_sched::RateLimit;
/// // 10 Gb/s with 64 KiB of burst.
/// let cap = RateLimit::gbits_per_sec(10).with_burst(64 << 10);
/// assert_eq!(cap.per_second, 1_250_000_000);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RateLimit {
    /// Sustained rate, in units per second. Must not be 0.
    pub per_second: u64,
    /// Units that may be sent back to back above the rate after an idle
    /// period (beyond the one request that is always let through).
    pub burst: u64,
}

impl RateLimit {
    /// `per_second` units per second with a burst of `burst` units.
    pub const fn new(per_second: u64, burst: u64) -> RateLimit {
        RateLimit { per_second, burst }
    }

    /// `per_second` units per second, no burst.
    pub const fn per_second(per_second: u64) -> RateLimit {
        RateLimit {
            per_second,
            burst: 0,
        }
    }

    /// A byte rate given in bits per second (rounded down to whole bytes).
    pub const fn bits_per_sec(bits: u64) -> RateLimit {
        RateLimit::per_second(bits / 8)
    }

    /// A byte rate given in Mb/s.
    pub const fn mbits_per_sec(mbits: u64) -> RateLimit {
        RateLimit::bits_per_sec(mbits.saturating_mul(1_000_000))
    }

    /// A byte rate given in Gb/s.
    pub const fn gbits_per_sec(gbits: u64) -> RateLimit {
        RateLimit::bits_per_sec(gbits.saturating_mul(1_000_000_000))
    }

    /// The same rate with a burst of `burst` units.
    pub const fn with_burst(self, burst: u64) -> RateLimit {
        RateLimit { burst, ..self }
    }
}

/// A GCRA shaper owned by one thread: a TAT plus its rate.
///
/// ```
/// use mtrdma_sched::{Gcra, Nanos, RateLimit};
/// // 1,000 work requests per second, bursts of 2 beyond the first.
/// let mut wr = Gcra::new(RateLimit::per_second(1_000).with_burst(2)).unwrap();
/// let now = Nanos::from_secs(1);
/// for _ in 0..3 {
///     assert!(wr.check(now, 1).is_ok());
/// }
/// // The fourth must wait one emission interval (1 ms) after the first.
/// assert_eq!(wr.check(now, 1), Err(Nanos::from_secs(1) + Nanos::from_millis(1)));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gcra {
    tat: u64,
    interval: EmissionInterval,
    tolerance: u64,
    limit: RateLimit,
}

impl Gcra {
    /// A fresh shaper (TAT 0) for `limit`.
    ///
    /// # Errors
    /// [`ConfigError::ZeroRate`] if the rate is 0.
    pub fn new(limit: RateLimit) -> Result<Gcra, ConfigError> {
        let interval = interval_of(limit.per_second)?;
        Ok(Gcra {
            tat: 0,
            interval,
            tolerance: interval.increment(limit.burst),
            limit,
        })
    }

    /// Sends `cost` units at `now` if they conform (and charges them), or
    /// returns the earliest time at which they would.
    #[inline]
    pub fn check(&mut self, now: Nanos, cost: u64) -> Result<(), Nanos> {
        let tat = self.peek(now, cost)?;
        self.tat = tat;
        Ok(())
    }

    /// Whether `cost` units would conform at `now`, without charging them:
    /// `Ok(tat)` is the TAT a [`check`](Self::check) would store.
    #[inline]
    pub fn peek(&self, now: Nanos, cost: u64) -> Result<u64, Nanos> {
        gcra_decide(self.tat, now.0, cost, self.interval, self.tolerance).map_err(Nanos)
    }

    /// Charges `cost` units at `now` whether or not they conform (for work
    /// already let through by another shaper).
    #[inline]
    pub fn charge(&mut self, now: Nanos, cost: u64) {
        self.tat = self
            .tat
            .max(now.0)
            .saturating_add(self.interval.increment(cost));
    }

    /// Changes the rate and burst, keeping the TAT: credit or debt already
    /// accrued carries over to the new rate.
    ///
    /// # Errors
    /// [`ConfigError::ZeroRate`] if the new rate is 0 (the old one is kept).
    pub fn set_limit(&mut self, limit: RateLimit) -> Result<(), ConfigError> {
        let interval = interval_of(limit.per_second)?;
        self.interval = interval;
        self.tolerance = interval.increment(limit.burst);
        self.limit = limit;
        Ok(())
    }

    /// The current limit.
    pub fn limit(&self) -> RateLimit {
        self.limit
    }

    /// The theoretical arrival time: when the flow would be idle again.
    pub fn tat(&self) -> Nanos {
        Nanos(self.tat)
    }

    /// The emission interval per unit.
    pub fn interval(&self) -> EmissionInterval {
        self.interval
    }

    /// The burst tolerance, in ns.
    pub fn tolerance(&self) -> Nanos {
        Nanos(self.tolerance)
    }
}

/// Charges a tenant's byte cap `bytes` for a piece of `len` bytes and its
/// work-request cap `wrs` for one if both allow it now; otherwise says
/// when both would (and charges neither).
#[inline]
pub(crate) fn admit_both(
    bytes: &mut Option<Gcra>,
    wrs: &mut Option<Gcra>,
    now: Nanos,
    len: u64,
) -> Result<(), Nanos> {
    let by_bytes = bytes.as_ref().map(|g| g.peek(now, len));
    let by_wrs = wrs.as_ref().map(|g| g.peek(now, 1));
    match (by_bytes, by_wrs) {
        (Some(Err(a)), Some(Err(b))) => Err(a.max(b)),
        (Some(Err(a)), _) | (_, Some(Err(a))) => Err(a),
        _ => {
            if let Some(g) = bytes.as_mut() {
                g.charge(now, len);
            }
            if let Some(g) = wrs.as_mut() {
                g.charge(now, 1);
            }
            Ok(())
        }
    }
}

/// A cap `old` set to the limit `new`, keeping its state (`None`: no cap).
pub(crate) fn update_cap(
    old: Option<Gcra>,
    new: Option<RateLimit>,
) -> Result<Option<Gcra>, ConfigError> {
    match (old, new) {
        (_, None) => Ok(None),
        (None, Some(limit)) => Gcra::new(limit).map(Some),
        (Some(mut g), Some(limit)) => {
            g.set_limit(limit)?;
            Ok(Some(g))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn burst_lets_that_many_through_back_to_back() {
        let mut g = Gcra::new(RateLimit::per_second(1_000_000).with_burst(9)).unwrap();
        let now = Nanos::from_secs(5);
        for _ in 0..10 {
            g.check(now, 1).unwrap();
        }
        let retry = g.check(now, 1).unwrap_err();
        assert_eq!(retry, now + Nanos(1_000));
        assert!(g.check(retry, 1).is_ok());
    }

    #[test]
    fn rate_change_keeps_the_tat() {
        let mut g = Gcra::new(RateLimit::per_second(1_000)).unwrap();
        g.check(Nanos(0), 10).unwrap(); // 10 ms of debt
        assert_eq!(g.tat(), Nanos::from_millis(10));
        g.set_limit(RateLimit::per_second(1_000_000)).unwrap();
        assert_eq!(g.tat(), Nanos::from_millis(10));
        assert_eq!(
            g.check(Nanos::from_millis(5), 1),
            Err(Nanos::from_millis(10))
        );
        assert_eq!(
            g.set_limit(RateLimit::per_second(0)),
            Err(ConfigError::ZeroRate)
        );
        assert_eq!(g.limit(), RateLimit::per_second(1_000_000));
    }
}
