//! What the coordinator sees of the link: the rate the tenants together
//! move through it (published for the windows' queue allowance), and the
//! share of the bytes their delay windows judged over their target (shown
//! in the coordinator's view).

use mtrdma_sched::share::LinkEstimate;

/// The share of judged bytes over the windows' target is averaged over
/// about this long.
pub(crate) const RECENT_NS: f64 = 60e6;
/// The fewest bytes judged in an interval for its verdicts to count: one
/// late piece in a quiet interval says little.
pub(crate) const MIN_JUDGED: u64 = 32 << 10;
/// With no window judging for this long, the share is forgotten.
pub(crate) const QUIET_NS: u64 = 1_000_000_000;

/// What the tenants showed over one recomputation interval.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct LinkSignals {
    /// Bytes per second they moved together.
    pub(crate) moved: u64,
    /// Bytes their windows judged, and those over the windows' target.
    pub(crate) judged: u64,
    pub(crate) over_target: u64,
}

/// The link as the tenants' traffic shows it (see the module docs).
#[derive(Debug, Clone, Default)]
pub(crate) struct LinkObserver {
    moved: LinkEstimate,
    /// The share of judged bytes over the windows' target, averaged over
    /// about [`RECENT_NS`] of intervals that judged at least [`MIN_JUDGED`].
    over_share: f64,
    last_judged_ns: u64,
}

impl LinkObserver {
    /// Takes one interval of `elapsed_ns` ending at `now_ns`; returns the
    /// link estimate (bytes per second, 0 while nothing was moved).
    pub(crate) fn update(&mut self, now_ns: u64, elapsed_ns: u64, s: LinkSignals) -> u64 {
        let estimate = self.moved.update(s.moved, elapsed_ns);
        if s.judged > 0 {
            self.last_judged_ns = now_ns;
        } else if now_ns.saturating_sub(self.last_judged_ns) >= QUIET_NS {
            self.over_share = 0.0;
        }
        if s.judged >= MIN_JUDGED {
            let alpha = (elapsed_ns as f64 / RECENT_NS).min(1.0);
            let share = s.over_target as f64 / s.judged as f64;
            self.over_share += alpha * (share - self.over_share);
        }
        estimate
    }

    /// The share of bytes the windows judged over their target lately.
    pub(crate) fn over_share(&self) -> f64 {
        self.over_share
    }

    /// How much of the link estimate the tenants move now, parts per
    /// million ([`LinkEstimate::utilization_ppm`]).
    pub(crate) fn utilization_ppm(&self) -> u32 {
        self.moved.utilization_ppm()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TICK: u64 = 20_000_000;

    fn signals(judged: u64, over_target: u64) -> LinkSignals {
        LinkSignals {
            moved: 25_000_000,
            judged,
            over_target,
        }
    }

    #[test]
    fn averages_the_share_over_target_and_forgets_it_when_no_window_judges() {
        let mut o = LinkObserver::default();
        let mut now = 0;
        for _ in 0..20 {
            now += TICK;
            o.update(now, TICK, signals(100_000, 30_000));
        }
        assert!((o.over_share() - 0.3).abs() < 0.01, "{}", o.over_share());
        // A few late pieces in a quiet interval do not move it.
        now += TICK;
        o.update(now, TICK, signals(4096, 4096));
        assert!((o.over_share() - 0.3).abs() < 0.01, "{}", o.over_share());
        // No window judges for a second: forgotten.
        for _ in 0..(QUIET_NS / TICK) {
            now += TICK;
            o.update(now, TICK, signals(0, 0));
        }
        assert_eq!(o.over_share(), 0.0);
    }
}
