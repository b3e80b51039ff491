//! The clock shared by every process on the host.

use rustix::time::{clock_gettime, ClockId};

/// Nanoseconds of `CLOCK_MONOTONIC`: the same time base in every process,
/// which is what shared rate-limit state needs (a per-process calibrated
/// TSC clock would disagree between processes).
#[inline]
pub fn monotonic_ns() -> u64 {
    let ts = clock_gettime(ClockId::Monotonic);
    u64::try_from(ts.tv_sec).unwrap_or(0) * 1_000_000_000 + u64::try_from(ts.tv_nsec).unwrap_or(0)
}

/// A fast clock whose readings agree between every process that shares a
/// quota table: the TSC (through `quanta`) scaled with the *table's*
/// calibration, which its creator stores, rather than each process's own
/// (whose small differences would put processes' clocks apart by more and
/// more over time). Where `quanta` has no usable TSC its raw source is
/// `CLOCK_MONOTONIC` itself and the scale is one.
#[derive(Debug, Clone)]
pub struct SharedClock {
    clock: quanta::Clock,
    raw0: u64,
    ns0: u64,
    /// Nanoseconds per raw tick, 32.32 fixed point.
    mult: u64,
}

impl SharedClock {
    /// Calibrates a new clock: `(raw0, ns0, mult)` to store in the table.
    pub(crate) fn calibrate() -> (u64, u64, u64) {
        let clock = quanta::Clock::new();
        let raw0 = clock.raw();
        let ns0 = monotonic_ns();
        let mult = clock.delta_as_nanos(0, 1 << 32).max(1);
        (raw0, ns0, mult)
    }

    /// Builds the clock from a table's calibration; `Err` says why it
    /// cannot be used in this process (its raw source differs).
    pub(crate) fn from_params(raw0: u64, ns0: u64, mult: u64) -> Result<SharedClock, String> {
        if !(Self::MIN_MULT..=Self::MAX_MULT).contains(&mult) {
            return Err(format!("clock scale {mult} is out of range"));
        }
        let clock = quanta::Clock::new();
        let ours = clock.delta_as_nanos(0, 1 << 32).max(1);
        let diff = ours.abs_diff(mult);
        if diff > mult / 100 {
            return Err(format!(
                "this process's clock source runs at {ours} (32.32 ns per tick), the table's at {mult}"
            ));
        }
        Ok(SharedClock {
            clock,
            raw0,
            ns0,
            mult,
        })
    }

    /// 0.01 ns per tick.
    pub(crate) const MIN_MULT: u64 = (1 << 32) / 100;
    /// 100 ns per tick.
    pub(crate) const MAX_MULT: u64 = (1 << 32) * 100;

    /// Nanoseconds on the table's time base (close to `CLOCK_MONOTONIC`).
    #[inline]
    pub fn now_ns(&self) -> u64 {
        let ticks = self.clock.raw().saturating_sub(self.raw0);
        let ns = (u128::from(ticks) * u128::from(self.mult)) >> 32;
        self.ns0
            .saturating_add(u64::try_from(ns).unwrap_or(u64::MAX))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_clock_tracks_the_monotonic_clock_in_every_copy() {
        let (raw0, ns0, mult) = SharedClock::calibrate();
        let a = SharedClock::from_params(raw0, ns0, mult).unwrap();
        let b = SharedClock::from_params(raw0, ns0, mult).unwrap();
        let (t1, m1, t2) = (a.now_ns(), monotonic_ns(), b.now_ns());
        assert!(t1 <= t2, "two copies agree on order");
        assert!(t1.abs_diff(m1) < 50_000_000, "{t1} vs monotonic {m1}");
        assert!(SharedClock::from_params(raw0, ns0, 0).is_err());
        assert!(SharedClock::from_params(raw0, ns0, mult * 2).is_err());
    }
}
