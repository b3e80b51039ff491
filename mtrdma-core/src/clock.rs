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
