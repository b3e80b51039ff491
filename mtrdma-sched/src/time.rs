//! Time as the scheduler sees it: a nanosecond count fed in by the caller.

use std::fmt;
use std::ops::{Add, Sub};
use std::sync::atomic::{AtomicU64, Ordering};

/// A point in time, in nanoseconds since an origin chosen by the [`Clock`]
/// that produced it.
///
/// The schedulers never read a clock themselves: every decision takes a
/// `Nanos` so that tests run in virtual time and the same code runs on a
/// real clock in production. Arithmetic saturates instead of overflowing.
///
/// ```
/// use mtrdma_sched::Nanos;
/// let t = Nanos::from_micros(3) + Nanos(500);
/// assert_eq!(t, Nanos(3_500));
/// assert_eq!(t - Nanos::from_micros(4), Nanos::ZERO);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Nanos(pub u64);

impl Nanos {
    /// The origin.
    pub const ZERO: Nanos = Nanos(0);
    /// The latest representable time; used as "never".
    pub const MAX: Nanos = Nanos(u64::MAX);

    /// `us` microseconds.
    pub const fn from_micros(us: u64) -> Nanos {
        Nanos(us.saturating_mul(1_000))
    }

    /// `ms` milliseconds.
    pub const fn from_millis(ms: u64) -> Nanos {
        Nanos(ms.saturating_mul(1_000_000))
    }

    /// `s` seconds.
    pub const fn from_secs(s: u64) -> Nanos {
        Nanos(s.saturating_mul(1_000_000_000))
    }

    /// The raw nanosecond count.
    pub const fn as_nanos(self) -> u64 {
        self.0
    }

    /// This time as fractional seconds (for reports).
    pub fn as_secs_f64(self) -> f64 {
        self.0 as f64 / 1e9
    }
}

impl Add for Nanos {
    type Output = Nanos;
    fn add(self, rhs: Nanos) -> Nanos {
        Nanos(self.0.saturating_add(rhs.0))
    }
}

impl Sub for Nanos {
    type Output = Nanos;
    fn sub(self, rhs: Nanos) -> Nanos {
        Nanos(self.0.saturating_sub(rhs.0))
    }
}

impl fmt::Display for Nanos {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ns", self.0)
    }
}

/// A monotonic source of [`Nanos`].
///
/// The verbs layer holds a `Clock` and passes its readings to a
/// [`Scheduler`](crate::Scheduler); tests use a [`ManualClock`].
pub trait Clock {
    /// The current time. Successive calls never go backwards.
    fn now(&self) -> Nanos;
}

/// The real clock: `quanta`'s TSC-backed monotonic clock, counted from the
/// moment this value was created.
///
/// ```
/// use mtrdma_sched::{Clock, QuantaClock};
/// let clock = QuantaClock::new();
/// let a = clock.now();
/// assert!(clock.now() >= a);
/// ```
#[derive(Debug, Clone)]
pub struct QuantaClock {
    clock: quanta::Clock,
    /// Raw reading at creation.
    origin: u64,
}

impl QuantaClock {
    /// A clock whose origin ([`Nanos::ZERO`]) is now.
    pub fn new() -> QuantaClock {
        let clock = quanta::Clock::new();
        let origin = clock.raw();
        QuantaClock { clock, origin }
    }
}

impl Default for QuantaClock {
    fn default() -> Self {
        QuantaClock::new()
    }
}

impl Clock for QuantaClock {
    #[inline]
    fn now(&self) -> Nanos {
        Nanos(self.clock.delta_as_nanos(self.origin, self.clock.raw()))
    }
}

/// A clock that only moves when told to: virtual time for tests and the
/// simulator.
///
/// ```
/// use mtrdma_sched::{Clock, ManualClock, Nanos};
/// let clock = ManualClock::new(Nanos(10));
/// clock.advance(Nanos(5));
/// assert_eq!(clock.now(), Nanos(15));
/// clock.set(Nanos(100));
/// assert_eq!(clock.now(), Nanos(100));
/// ```
#[derive(Debug, Default)]
pub struct ManualClock {
    now: AtomicU64,
}

impl ManualClock {
    /// A clock reading `start`.
    pub fn new(start: Nanos) -> ManualClock {
        ManualClock {
            now: AtomicU64::new(start.0),
        }
    }

    /// Moves the clock forward by `by`.
    pub fn advance(&self, by: Nanos) {
        let _ = self
            .now
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |t| {
                Some(t.saturating_add(by.0))
            });
    }

    /// Moves the clock to `to`; a time earlier than the current one is
    /// ignored, so the clock stays monotonic.
    pub fn set(&self, to: Nanos) {
        self.now.fetch_max(to.0, Ordering::Relaxed);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Nanos {
        Nanos(self.now.load(Ordering::Relaxed))
    }
}
