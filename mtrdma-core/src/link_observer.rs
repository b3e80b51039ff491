//! What the coordinator sees of the link: the rate the tenants together
//! move through it (published for the windows' queue allowance), and the
//! share of the bytes their delay windows judged over their target (shown
//! in the coordinator's view).

/// The link's rate as the tenants' traffic shows it: what they moved
/// together, smoothed over about [`LinkEstimate::SMOOTHING_NS`], and the
/// highest such rate seen lately, which falls by half every
/// [`LinkEstimate::HALF_LIFE_NS`] while less is moved. Windows queue at
/// most `queue_bytes` at this rate: an estimate above the link's rate only
/// shortens their queues; one below (the link was not full) lasts only
/// until the tenants fill it.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct LinkEstimate {
    smoothed: f64,
    peak: f64,
    /// The highest smoothed rate seen over the last minutes (falls by
    /// half every [`LinkEstimate::CAPACITY_HALF_LIFE_NS`]): what the link
    /// can carry, against which its use is judged. Windows that hold
    /// themselves back move less, and a shorter memory would take that
    /// for the link's rate.
    capacity: f64,
}

impl LinkEstimate {
    /// Over how long what was moved is averaged.
    pub(crate) const SMOOTHING_NS: f64 = 200e6;
    /// How fast the estimate forgets a rate no longer moved.
    pub(crate) const HALF_LIFE_NS: f64 = 5e9;
    /// How fast the link's capacity, against which its use is judged, is
    /// forgotten.
    pub(crate) const CAPACITY_HALF_LIFE_NS: f64 = 120e9;

    /// Takes `bytes_per_sec` moved over the last `elapsed_ns`; returns the
    /// estimate (bytes per second, 0 while nothing was moved).
    pub(crate) fn update(&mut self, bytes_per_sec: u64, elapsed_ns: u64) -> u64 {
        let dt = elapsed_ns as f64;
        let alpha = (dt / Self::SMOOTHING_NS).min(1.0);
        self.smoothed += alpha * (bytes_per_sec as f64 - self.smoothed);
        let decay = 0.5f64.powf(dt / Self::HALF_LIFE_NS);
        self.peak = (self.peak * decay).max(self.smoothed);
        let decay = 0.5f64.powf(dt / Self::CAPACITY_HALF_LIFE_NS);
        self.capacity = (self.capacity * decay).max(self.smoothed);
        self.peak as u64
    }

    /// What is moved now (smoothed) as a share of the most moved over the
    /// last minutes, parts per million (0 before anything was moved).
    pub(crate) fn utilization_ppm(&self) -> u32 {
        if self.capacity <= 0.0 {
            return 0;
        }
        (self.smoothed / self.capacity * 1e6).clamp(0.0, 1e6) as u32
    }
}

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

    /// The link's use is what is moved now against the highest rate seen
    /// over the last minutes: full while the tenants keep moving it, less
    /// when they move less, and still less a minute later (the estimate
    /// the windows' allowance follows has come down by then).
    #[test]
    fn the_links_use_is_what_is_moved_against_the_highest_rate_seen() {
        let mut e = LinkEstimate::default();
        assert_eq!(e.utilization_ppm(), 0);
        for _ in 0..50 {
            e.update(25_000_000, TICK);
        }
        assert!(e.utilization_ppm() > 999_000, "{}", e.utilization_ppm());
        for _ in 0..50 {
            e.update(15_000_000, TICK);
        }
        // 15 against 25 MB/s, the highest having fallen for a second
        // (half every 2 minutes): about 0.6.
        let used = e.utilization_ppm();
        assert!((595_000..=610_000).contains(&used), "{used}");
        for _ in 0..(60_000_000_000 / TICK) {
            e.update(15_000_000, TICK);
        }
        // A minute on: 15 against 25 x 0.71.
        let used = e.utilization_ppm();
        assert!((830_000..=870_000).contains(&used), "{used}");
        assert!(
            e.update(15_000_000, TICK) < 16_000_000,
            "the estimate has followed"
        );
    }
}
