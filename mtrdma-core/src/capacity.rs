//! The capacity the coordinator divides among tenants: the policy's
//! nominal link rate until the link shows a queue, then a little more than
//! what the tenants together are seen to move through it.
//!
//! Fair rates that add up to more than the link carries decide nothing:
//! the link's queue does, and whoever keeps more bytes in it gets more of
//! the link. Delay windows bound that queue across processes, but they
//! share it only roughly by weight (a sender's own round trip, its CPU and
//! its piece size all move its share), while a rate is kept to within a
//! piece. So once the tenants' windows report a queue (a quarter of the
//! bytes they judge over their target, averaged over [`RECENT_NS`]) after
//! judging for [`PEAK_NS`] (windows that just started are still finding
//! the link's rate, and a capacity taken from them would hold them there),
//! the
//! coordinator divides [`HEADROOM`] more than the most the tenants moved
//! together in any [`BUCKET_NS`] of the last [`PEAK_NS`]. While they use
//! all they are given, that grows with them by the headroom every bucket;
//! it falls only while the windows report a queue (a tenant whose CPU
//! cannot keep up with its rate must not lower everyone's); where the link
//! stops them, it stays just above the link, the rates
//! decide all but the headroom of every tenant's share, and the windows
//! bound the queue the headroom would build. The windows' verdicts only
//! switch this on: on a busy host many of them are the host's noise (a
//! sender run late), and a capacity cut on them would starve the link.
//! The nominal rate comes back when no window has judged anything for
//! [`QUIET_NS`] or the measured capacity reaches it.
//!
//! Nothing here is entered by hand: the link's rate is what the tenants'
//! traffic shows it to be (this is not pacing below a configured rate).

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
}

impl LinkEstimate {
    /// Over how long what was moved is averaged.
    pub(crate) const SMOOTHING_NS: f64 = 200e6;
    /// How fast the estimate forgets a rate no longer moved.
    pub(crate) const HALF_LIFE_NS: f64 = 5e9;

    /// Takes `bytes_per_sec` moved over the last `elapsed_ns`; returns the
    /// estimate (bytes per second, 0 while nothing was moved).
    pub(crate) fn update(&mut self, bytes_per_sec: u64, elapsed_ns: u64) -> u64 {
        let dt = elapsed_ns as f64;
        let alpha = (dt / Self::SMOOTHING_NS).min(1.0);
        self.smoothed += alpha * (bytes_per_sec as f64 - self.smoothed);
        let decay = 0.5f64.powf(dt / Self::HALF_LIFE_NS);
        self.peak = (self.peak * decay).max(self.smoothed);
        self.peak as u64
    }
}

/// The share of judged bytes over the windows' target (averaged over
/// about [`RECENT_NS`]) at which the link counts as holding a queue.
pub(crate) const CONGESTED: f64 = 0.25;
/// The fewest bytes judged in an interval for its verdicts to count: one
/// late piece in a quiet interval is not a queue.
pub(crate) const MIN_JUDGED: u64 = 32 << 10;
/// The share of judged bytes over target is averaged over about this long.
pub(crate) const RECENT_NS: f64 = 60e6;
/// How much more than the most the tenants moved is divided: room for
/// them to show that the link carries more.
pub(crate) const HEADROOM: f64 = 0.03;
/// What was moved is averaged over buckets of this long...
pub(crate) const BUCKET_NS: u64 = 100_000_000;
/// ...and the most of the buckets of this long a time counts: a link that
/// got slower is followed within it.
pub(crate) const PEAK_NS: u64 = 2_000_000_000;
const BUCKETS: usize = (PEAK_NS / BUCKET_NS) as usize;
/// With no window judging for this long, the nominal rate comes back.
pub(crate) const QUIET_NS: u64 = 1_000_000_000;
/// The capacity is never set under this (bytes per second).
pub(crate) const FLOOR: f64 = 125_000.0;

/// What the tenants showed over one recomputation interval.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct LinkSignals {
    /// Bytes per second they moved together.
    pub(crate) moved: u64,
    /// Bytes their windows judged, and those over the windows' target.
    pub(crate) judged: u64,
    pub(crate) over_target: u64,
}

/// The capacity the coordinator divides (see the module docs).
#[derive(Debug, Clone)]
pub(crate) struct LinkCapacity {
    nominal: u64,
    moved: LinkEstimate,
    /// The share of judged bytes over the windows' target, averaged over
    /// about [`RECENT_NS`] of intervals that judged at least [`MIN_JUDGED`].
    over_share: f64,
    /// Mean bytes per second of each completed bucket (ring, by bucket
    /// number), and the bytes and time of the current one.
    means: [f64; BUCKETS],
    bucket: u64,
    bucket_bytes: f64,
    bucket_ns: u64,
    /// Whether the link was seen to hold a queue (the measured capacity is
    /// divided).
    queued: bool,
    /// Since when windows have judged without a quiet [`QUIET_NS`] (0:
    /// not judging): the measured capacity is taken only from traffic that
    /// has had [`PEAK_NS`] to settle (windows that just started have not
    /// found the link's rate yet).
    judging_since: u64,
    /// The measured capacity (bytes per second): it rises whenever the
    /// tenants move more, and falls only while the windows report a
    /// queue (a tenant that cannot use all of its rate, its CPU too busy,
    /// must not lower everyone's).
    capacity: f64,
    last_judged_ns: u64,
}

impl LinkCapacity {
    /// Starts at the policy's `nominal` rate (bytes per second).
    pub(crate) fn new(nominal: u64) -> LinkCapacity {
        LinkCapacity {
            nominal,
            moved: LinkEstimate::default(),
            over_share: 0.0,
            means: [0.0; BUCKETS],
            bucket: 0,
            bucket_bytes: 0.0,
            bucket_ns: 0,
            queued: false,
            judging_since: 0,
            capacity: 0.0,
            last_judged_ns: 0,
        }
    }

    /// A new policy's nominal rate (a reload).
    pub(crate) fn set_nominal(&mut self, nominal: u64) {
        self.nominal = nominal;
    }

    /// The most the tenants moved in a completed bucket lately (bytes per
    /// second).
    fn peak(&self) -> f64 {
        self.means.iter().copied().fold(0.0, f64::max)
    }

    /// Takes one interval of `elapsed_ns` ending at `now_ns`; returns the
    /// link estimate for the windows' queue allowance (bytes per second, 0
    /// while nothing was moved).
    pub(crate) fn update(&mut self, now_ns: u64, elapsed_ns: u64, s: LinkSignals) -> u64 {
        let estimate = self.moved.update(s.moved, elapsed_ns);
        let bucket = now_ns / BUCKET_NS;
        if bucket != self.bucket {
            if self.bucket_ns > 0 {
                let mean = self.bucket_bytes * 1e9 / self.bucket_ns as f64;
                self.means[(self.bucket % BUCKETS as u64) as usize] = mean;
            }
            // Buckets skipped (no interval ended in them) moved nothing
            // that was counted: forget them.
            let gone = bucket.saturating_sub(self.bucket).min(BUCKETS as u64 + 1);
            for b in 1..gone {
                self.means[((self.bucket + b) % BUCKETS as u64) as usize] = 0.0;
            }
            self.bucket = bucket;
            self.bucket_bytes = 0.0;
            self.bucket_ns = 0;
        }
        self.bucket_bytes += s.moved as f64 * elapsed_ns as f64 / 1e9;
        self.bucket_ns += elapsed_ns;

        if s.judged > 0 {
            if self.judging_since == 0 {
                self.judging_since = now_ns.max(1);
            }
            self.last_judged_ns = now_ns;
        } else if now_ns.saturating_sub(self.last_judged_ns) >= QUIET_NS {
            // No window judges: nothing shows a queue.
            self.queued = false;
            self.over_share = 0.0;
            self.judging_since = 0;
            return estimate;
        }
        if s.judged >= MIN_JUDGED {
            let alpha = (elapsed_ns as f64 / RECENT_NS).min(1.0);
            let share = s.over_target as f64 / s.judged as f64;
            self.over_share += alpha * (share - self.over_share);
        }
        let congested = self.over_share >= CONGESTED;
        let seen = (self.peak() * (1.0 + HEADROOM)).max(FLOOR);
        let settled =
            self.judging_since != 0 && now_ns.saturating_sub(self.judging_since) >= PEAK_NS;
        if congested && settled && self.peak() > 0.0 {
            self.capacity = seen;
            self.queued = true;
        } else if self.queued {
            self.capacity = self.capacity.max(seen);
        }
        if self.queued && self.capacity >= self.nominal as f64 {
            self.queued = false;
        }
        estimate
    }

    /// The capacity to divide now (bytes per second).
    pub(crate) fn divided(&self) -> u64 {
        if self.queued {
            self.capacity.min(self.nominal as f64) as u64
        } else {
            self.nominal
        }
    }

    /// Whether the capacity divided is measured (the link holds a queue)
    /// rather than the nominal rate.
    pub(crate) fn measured(&self) -> bool {
        self.queued
    }

    /// The share of bytes the windows judged over their target lately.
    pub(crate) fn over_share(&self) -> f64 {
        self.over_share
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TICK: u64 = 20_000_000;
    const LINK: u64 = 25_000_000;
    const NOMINAL: u64 = 12_500_000_000;

    fn queue(moved: u64) -> LinkSignals {
        LinkSignals {
            moved,
            judged: 100_000,
            over_target: 60_000,
        }
    }

    fn clear(moved: u64) -> LinkSignals {
        LinkSignals {
            moved,
            judged: 100_000,
            over_target: 1_000,
        }
    }

    /// Runs `n` ticks of `signals` from `*now`.
    fn ticks(c: &mut LinkCapacity, now: &mut u64, n: usize, signals: LinkSignals) {
        for _ in 0..n {
            *now += TICK;
            c.update(*now, TICK, signals);
        }
    }

    /// A capacity whose tenants' windows have judged, with no queue, for
    /// the time it takes before a queue counts, moving `moved`.
    fn settled(nominal: u64, now: &mut u64, moved: u64) -> LinkCapacity {
        let mut c = LinkCapacity::new(nominal);
        ticks(&mut c, now, (PEAK_NS / TICK) as usize, clear(moved));
        c
    }

    fn near(got: u64, want: f64, within: f64) -> bool {
        (got as f64 / want - 1.0).abs() <= within
    }

    #[test]
    fn divides_the_nominal_rate_until_the_link_holds_a_queue() {
        let mut c = LinkCapacity::new(NOMINAL);
        let mut now = 0;
        // Windows that just started are still finding the link's rate: a
        // queue they see then does not count.
        ticks(&mut c, &mut now, 10, queue(LINK / 2));
        assert!(!c.measured());
        ticks(&mut c, &mut now, (PEAK_NS / TICK) as usize, clear(LINK));
        assert_eq!(c.divided(), NOMINAL);
        assert!(!c.measured());
        // One interval's late pieces, or a few late pieces in a quiet
        // interval, are not a queue.
        ticks(&mut c, &mut now, 1, queue(LINK));
        let few = LinkSignals {
            moved: LINK,
            judged: 4096,
            over_target: 4096,
        };
        ticks(&mut c, &mut now, 5, few);
        assert!(!c.measured());
        // A queue that lasts: a little more than what the link carried.
        ticks(&mut c, &mut now, 2, queue(LINK));
        assert!(c.measured());
        assert!(
            near(c.divided(), LINK as f64 * (1.0 + HEADROOM), 0.001),
            "{}",
            c.divided()
        );
    }

    #[test]
    fn grows_with_tenants_that_use_all_they_are_given_and_stops_at_the_link() {
        let mut now = 0;
        let mut c = settled(NOMINAL, &mut now, LINK / 2);
        // The queue is seen while the tenants move half the link.
        ticks(&mut c, &mut now, 10, queue(LINK / 2));
        assert!(near(
            c.divided(),
            LINK as f64 / 2.0 * (1.0 + HEADROOM),
            0.001
        ));
        // They move what they are given, up to the link: the capacity
        // follows them up by the headroom per bucket, within three seconds
        // (24 buckets at 3%), and stays just above the link.
        for _ in 0..200 {
            let given = c.divided().min(LINK);
            ticks(&mut c, &mut now, 1, clear(given));
        }
        assert!(
            near(c.divided(), LINK as f64 * (1.0 + HEADROOM), 0.001),
            "{}",
            c.divided()
        );
        assert!(c.measured(), "a quiet queue keeps the measured capacity");
    }

    #[test]
    fn follows_a_slower_link_within_the_peak_time() {
        let mut now = 0;
        let mut c = settled(NOMINAL, &mut now, LINK);
        ticks(&mut c, &mut now, 50, queue(LINK));
        ticks(
            &mut c,
            &mut now,
            (PEAK_NS / TICK) as usize + 10,
            queue(LINK / 2),
        );
        assert!(
            near(c.divided(), LINK as f64 / 2.0 * (1.0 + HEADROOM), 0.001),
            "{}",
            c.divided()
        );
    }

    #[test]
    fn falls_only_while_the_windows_report_a_queue() {
        let mut now = 0;
        let mut c = settled(NOMINAL, &mut now, LINK);
        ticks(&mut c, &mut now, 10, queue(LINK));
        let first = c.divided();
        // The tenants move less (one's CPU cannot keep up with its rate)
        // with no queue: the capacity stays.
        ticks(
            &mut c,
            &mut now,
            (PEAK_NS / TICK) as usize + 10,
            clear(LINK * 9 / 10),
        );
        assert_eq!(c.divided(), first);
        // With a queue, it follows what is moved down.
        ticks(&mut c, &mut now, 5, queue(LINK * 9 / 10));
        assert!(
            near(c.divided(), LINK as f64 * 0.9 * (1.0 + HEADROOM), 0.001),
            "{}",
            c.divided()
        );
    }

    #[test]
    fn returns_to_nominal_when_no_window_judges_or_the_link_is_faster() {
        let mut now = 0;
        let mut c = settled(NOMINAL, &mut now, LINK);
        ticks(&mut c, &mut now, 5, queue(LINK));
        assert!(c.measured());
        ticks(
            &mut c,
            &mut now,
            (QUIET_NS / TICK) as usize,
            LinkSignals {
                moved: LINK,
                ..LinkSignals::default()
            },
        );
        assert_eq!(c.divided(), NOMINAL);
        // Measured up to the nominal rate: the nominal rate again.
        let mut c = settled(30_000_000, &mut now, LINK);
        ticks(&mut c, &mut now, 10, queue(LINK));
        assert!(c.measured());
        ticks(&mut c, &mut now, 20, clear(30_000_000));
        assert_eq!(c.divided(), 30_000_000);
        assert!(!c.measured());
    }

    #[test]
    fn never_under_the_floor() {
        let mut now = 0;
        let mut c = settled(NOMINAL, &mut now, 10);
        ticks(&mut c, &mut now, 10, queue(10));
        assert_eq!(c.divided(), FLOOR as u64);
    }
}
