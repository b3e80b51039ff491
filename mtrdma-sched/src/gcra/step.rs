//! The GCRA step over plain integers ([`gcra_decide`]) and on a shared
//! atomic ([`gcra_shared`]); see the parent module.

use std::sync::atomic::{AtomicU64, Ordering};

/// Fractional bits of an [`EmissionInterval`].
const FRAC_BITS: u32 = 32;

/// Nanoseconds per unit (per byte, or per work request) at a given rate, in
/// 32.32 fixed point, so that rates from 1 per second to hundreds of GB/s
/// are exact to better than one part in a billion.
///
/// ```
/// use mtrdma_sched::EmissionInterval;
/// // 100 Gb/s = 12.5e9 bytes/s: 1 MiB takes 83,886.08 ns, rounded up.
/// let i = EmissionInterval::from_rate(12_500_000_000).unwrap();
/// assert_eq!(i.increment(1 << 20), 83_887);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct EmissionInterval(u64);

impl EmissionInterval {
    /// The interval for `per_second` units per second; `None` for a rate of 0.
    pub fn from_rate(per_second: u64) -> Option<EmissionInterval> {
        if per_second == 0 {
            return None;
        }
        let fp = (1_000_000_000u128 << FRAC_BITS).div_ceil(u128::from(per_second));
        // per_second >= 1 gives at most 1e9 * 2^32 < 2^64.
        Some(EmissionInterval(u64::try_from(fp).unwrap_or(u64::MAX)))
    }

    /// Rebuilds an interval from [`to_bits`](Self::to_bits).
    pub const fn from_bits(bits: u64) -> EmissionInterval {
        EmissionInterval(bits)
    }

    /// The raw 32.32 fixed-point representation.
    pub const fn to_bits(self) -> u64 {
        self.0
    }

    /// Nanoseconds that `cost` units occupy at this rate, rounded up (so a
    /// shaped flow never exceeds its rate), saturating at `u64::MAX`.
    #[inline]
    pub fn increment(self, cost: u64) -> u64 {
        // Rounding up: add 2^32 - 1 before the shift (no u128 division).
        let ns = (u128::from(cost) * u128::from(self.0) + ((1u128 << FRAC_BITS) - 1)) >> FRAC_BITS;
        u64::try_from(ns).unwrap_or(u64::MAX)
    }
}

/// One GCRA decision, as a pure function over plain integers.
///
/// * `tat`: the current theoretical arrival time, in ns (0 for a fresh limit).
/// * `now`: the current time, in ns.
/// * `cost`: units (bytes, or work requests) the caller wants to send.
/// * `interval`: the rate.
/// * `tolerance`: burst tolerance in ns: how far the TAT may run ahead of
///   `now` and the request still conform (`interval.increment(burst)`).
///
/// Returns `Ok(new_tat)` if the request conforms (store `new_tat`), or
/// `Err(retry_at)`, the earliest time at which it would (leave the TAT).
///
/// A request conforms when `tat <= now + tolerance`, whatever its cost: a
/// request larger than the burst goes through and is paid for afterwards,
/// so nothing is refused forever, and over any interval of length `d` the
/// flow sends at most `rate * d + burst + one request`.
///
/// ```
/// use mtrdma_sched::{gcra_decide, EmissionInterval};
/// let per_byte = EmissionInterval::from_rate(1_000_000_000).unwrap(); // 1 GB/s
/// let tat = gcra_decide(0, 1_000, 500, per_byte, 0).unwrap();
/// assert_eq!(tat, 1_500);
/// assert_eq!(gcra_decide(tat, 1_200, 500, per_byte, 0), Err(1_500));
/// assert_eq!(gcra_decide(tat, 1_500, 500, per_byte, 0), Ok(2_000));
/// ```
#[inline]
pub fn gcra_decide(
    tat: u64,
    now: u64,
    cost: u64,
    interval: EmissionInterval,
    tolerance: u64,
) -> Result<u64, u64> {
    if tat > now.saturating_add(tolerance) {
        return Err(tat - tolerance);
    }
    Ok(tat.max(now).saturating_add(interval.increment(cost)))
}

/// [`gcra_decide`] on a TAT shared between threads or processes: one
/// compare-and-swap per decision (retried only when another decision landed
/// in between), so concurrent callers together never exceed the rate.
///
/// ```
/// use std::sync::atomic::AtomicU64;
/// use mtrdma_sched::{gcra_shared, EmissionInterval};
/// let tat = AtomicU64::new(0);
/// let per_wr = EmissionInterval::from_rate(1_000).unwrap(); // 1,000 per second
/// assert!(gcra_shared(&tat, 0, 1, per_wr, 0).is_ok());
/// assert_eq!(gcra_shared(&tat, 0, 1, per_wr, 0), Err(1_000_000));
/// ```
#[inline]
pub fn gcra_shared(
    tat: &AtomicU64,
    now: u64,
    cost: u64,
    interval: EmissionInterval,
    tolerance: u64,
) -> Result<(), u64> {
    let mut current = tat.load(Ordering::Relaxed);
    loop {
        let next = gcra_decide(current, now, cost, interval, tolerance)?;
        match tat.compare_exchange_weak(current, next, Ordering::AcqRel, Ordering::Relaxed) {
            Ok(_) => return Ok(()),
            Err(actual) => current = actual,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn interval_is_exact_for_round_rates() {
        let i = EmissionInterval::from_rate(1_000_000_000).unwrap();
        assert_eq!(i.increment(1), 1);
        assert_eq!(i.increment(12_345), 12_345);
        let slow = EmissionInterval::from_rate(1).unwrap();
        assert_eq!(slow.increment(3), 3_000_000_000);
        assert_eq!(EmissionInterval::from_rate(0), None);
    }

    #[test]
    fn increment_rounds_up_and_saturates() {
        // 3 units/ns: 1 unit is a third of a ns, charged as 1 ns.
        let i = EmissionInterval::from_rate(3_000_000_000).unwrap();
        assert_eq!(i.increment(1), 1);
        // 3,000 units are 1,000 ns; the interval is itself rounded up (by
        // under 2^-32 ns), so never less, and at most 1 ns more.
        assert_eq!(i.increment(3_000), 1_001);
        assert!(i.increment(3_000_000_000) - 1_000_000_000 <= 1);
        let slow = EmissionInterval::from_rate(1).unwrap();
        assert_eq!(slow.increment(u64::MAX), u64::MAX);
        assert_eq!(
            gcra_decide(u64::MAX - 5, u64::MAX - 5, 1 << 40, slow, 0),
            Ok(u64::MAX)
        );
    }

    #[test]
    fn threads_sharing_a_tat_never_exceed_rate_plus_burst() {
        // 1,000,000 units/s with a burst of 100: in 10 ms of virtual time at
        // most 10,000 + 100 + 1 units may conform, whoever asks.
        let interval = EmissionInterval::from_rate(1_000_000).unwrap();
        let tolerance = interval.increment(100);
        let tat = Arc::new(AtomicU64::new(0));
        let admitted: u64 = (0..4)
            .map(|_| {
                let tat = Arc::clone(&tat);
                std::thread::spawn(move || {
                    let mut n = 0u64;
                    for now in (0..10_000_000u64).step_by(250) {
                        for _ in 0..4 {
                            if gcra_shared(&tat, now, 1, interval, tolerance).is_ok() {
                                n += 1;
                            }
                        }
                    }
                    n
                })
            })
            .map(|h| h.join().unwrap())
            .sum();
        assert!(admitted <= 10_000 + 101, "admitted {admitted}");
        // Four threads offering 16 per microsecond keep it saturated.
        assert!(admitted >= 9_900, "admitted {admitted}");
    }
}
