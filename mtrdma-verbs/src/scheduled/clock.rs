//! The engine's time. The engine reads the time only through its
//! [`EngineClock`], and reads it lazily (a request that may go at once
//! reads no clock): the real clock in every queue pair, or a clock a test
//! moves by hand, so that the whole engine (windows, pacing, the stall
//! release, wake-ups) runs on the null sink in virtual time.

#[cfg(any(test, feature = "test-util"))]
use std::sync::Arc;

#[cfg(any(test, feature = "test-util"))]
use mtrdma_sched::ManualClock;
use mtrdma_sched::{Clock, Nanos, QuantaClock};

/// Where the engine's time comes from.
#[derive(Debug, Clone)]
pub(crate) enum EngineClock {
    /// `quanta`'s clock, counted from the engine's creation.
    Real(QuantaClock),
    /// A clock that moves only when its owner moves it (the null sink's
    /// tests and fuzzing).
    #[cfg(any(test, feature = "test-util"))]
    Manual(Arc<ManualClock>),
}

impl EngineClock {
    /// The real clock, starting now.
    pub(crate) fn real() -> EngineClock {
        EngineClock::Real(QuantaClock::new())
    }

    /// What turns the engine's time into the time windows run on: the
    /// real clock's distance from `CLOCK_MONOTONIC`, which every process
    /// shares (so that quiet times line up across processes); nothing for
    /// a manual clock, whose virtual time is the windows' too.
    pub(crate) fn shared_offset(&self) -> u64 {
        match self {
            EngineClock::Real(c) => mtrdma_core::clock::monotonic_ns().saturating_sub(c.now().0),
            #[cfg(any(test, feature = "test-util"))]
            EngineClock::Manual(_) => 0,
        }
    }

    /// The engine's time now.
    #[inline]
    pub(crate) fn now(&self) -> Nanos {
        match self {
            EngineClock::Real(c) => c.now(),
            #[cfg(any(test, feature = "test-util"))]
            EngineClock::Manual(c) => c.now(),
        }
    }
}
