//! Gains that bring the windows of tenants in separate processes to the
//! shares of their weights.
//!
//! Delay windows ([`DelayWindow`](crate::DelayWindow)) grow by their
//! tenant's weight per round trip and shrink by the same share of
//! themselves for the same excess delay, so in a fluid model tenants share
//! a port by their weights. On a real port they do not quite: a sender
//! whose window is under one piece posts at paced moments and sees the
//! queue as it is on average, while senders that post when a completion
//! frees room see it just after a piece has left; pieces of a few
//! kilobytes on a link of a few hundred megabits are a large part of the
//! queue the windows aim for; each sender's host wakes it at its own
//! pace. Each of these moves the shares away from the weights by tens of
//! percent, in either direction.
//!
//! The coordinator sees what every tenant moves. [`ShareGains`] takes that
//! every recomputation and keeps, per tenant, a gain on its window
//! ([`DelayWindow::set_gain`](crate::DelayWindow::set_gain)): a tenant
//! that moved less than its weighted share of what the contending tenants
//! moved together grows faster and is cut less, one that moved more grows
//! slower and is cut more,
//! until the shares are the weights' (an integral controller: it corrects
//! whatever bias there is without a model of it). Only tenants that want
//! more than they get count as contending: a tenant that is idle, sends
//! less than it could, or is held by its rate cap goes back to a gain of 1
//! (an idle one after [`ShareGainsConfig::forget_after`], so that a moment
//! with nothing queued does not undo what was learnt), and the others
//! share what it leaves. The gains of the contending tenants
//! are normalised to a geometric mean of 1, so that together they neither
//! drift up (a longer queue) nor down (an idle link).
//!
//! The gains change how fast windows grow and shrink, not their target:
//! every window still shrinks when its pieces' delay passes it, so
//! together they hold the queue a latency request waits behind where it
//! was. A tenant is never given more than [`MAX_GAIN`] or less than its
//! inverse, and a gain over 1 never raises a window's floor (which holds a
//! window up whatever the queue).
//!
//! ```
//! use mtrdma_sched::share::{ShareGains, TenantRate, GAIN_ONE};
//! use mtrdma_sched::{Nanos, TenantId};
//!
//! let mut gains = ShareGains::default();
//! let busy = |id, weight, bytes_per_sec| TenantRate {
//!     id: TenantId(id),
//!     weight,
//!     bytes_per_sec,
//!     wants_more: true,
//!     cap: None,
//! };
//! // Weights 1:1, but the first tenant moves a third of what both move.
//! let mut now = Nanos::ZERO;
//! for _ in 0..20 {
//!     now = now + Nanos::from_millis(20);
//!     gains.update(now, &[busy(1, 1, 1_000_000), busy(2, 1, 2_000_000)]);
//! }
//! assert!(gains.gain(TenantId(1)) > GAIN_ONE);
//! assert!(gains.gain(TenantId(2)) < GAIN_ONE);
//! ```

use std::collections::{HashMap, HashSet};

use crate::tenant::TenantId;
use crate::time::Nanos;

/// A gain of 1, in parts per million.
pub const GAIN_ONE: u32 = 1_000_000;

/// The most a gain multiplies a window's growth by and divides its cuts by
/// (and the least). A window's size goes with its growth over its cuts,
/// so gains from 1/4 to 4 move windows by up to 16 times either way.
pub const MAX_GAIN: f64 = 4.0;

/// Below this use of the link (parts per million of its measured rate),
/// windows do not share their growth ([`sharing_for`]).
pub const SHARE_FROM_PPM: u32 = 650_000;
/// From this use of the link on, windows share their growth fully
/// ([`sharing_for`]).
pub const SHARE_FULLY_PPM: u32 = 850_000;

/// The weights the windows of a link divide their growth by
/// ([`DelayWindow::set_sharing_weight`](crate::DelayWindow::set_sharing_weight)),
/// given the weights of the contending tenants added up
/// ([`ShareGains::sharing_weight`]) and how much of the link's measured
/// rate they use (what they move against the most they moved over the
/// last minutes), in parts per million.
///
/// Windows that each grow by a whole increase per round trip overshoot
/// their target by the sum of the increases, which on a full link is
/// queue a latency request waits behind: there they share one increase.
/// On a link they do not fill (their senders' host is busy, and a window
/// cut by a completion found late must grow back), they each grow by a
/// whole one: shared growth there cost eight senders on the emulated link
/// at 200 Mbit/s half of what they moved (28% of the link instead of 54%)
/// and nothing in latency. In between, from [`SHARE_FROM_PPM`] to
/// [`SHARE_FULLY_PPM`] of the link (the 85% the bulk tenants should keep),
/// the divisor goes from 1 to `weights` in proportion: the coordinator
/// shares the growth as far as the link stays full.
///
/// ```
/// use mtrdma_sched::share::sharing_for;
///
/// assert_eq!(sharing_for(8, 990_000), 8);
/// assert_eq!(sharing_for(8, 750_000), 5);
/// assert_eq!(sharing_for(8, 600_000), 1);
/// assert_eq!(sharing_for(0, 990_000), 1);
/// ```
pub fn sharing_for(weights: u32, utilization_ppm: u32) -> u32 {
    let weights = weights.max(1);
    let span = u64::from(SHARE_FULLY_PPM - SHARE_FROM_PPM);
    let into = u64::from(utilization_ppm.clamp(SHARE_FROM_PPM, SHARE_FULLY_PPM) - SHARE_FROM_PPM);
    let extra = ((u64::from(weights) - 1) * into + span / 2) / span;
    1 + u32::try_from(extra).unwrap_or(u32::MAX - 1)
}

/// The link's rate as the tenants' traffic shows it: what they moved
/// together, smoothed over about [`LinkEstimate::SMOOTHING_NS`], and the
/// highest such rate seen lately, which falls by half every
/// [`LinkEstimate::HALF_LIFE_NS`] while less is moved. Windows queue at
/// most `queue_bytes` at this rate: an estimate above the link's rate only
/// shortens their queues; one below (the link was not full) lasts only
/// until the tenants fill it. The coordinator keeps one
/// (`mtrdma_core`'s `LinkObserver`), and so does the simulator with
/// [`SimConfig::measured_link_rate`](crate::sim::SimConfig::measured_link_rate).
#[derive(Debug, Default, Clone, Copy)]
pub struct LinkEstimate {
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
    pub const SMOOTHING_NS: f64 = 200e6;
    /// How fast the estimate forgets a rate no longer moved.
    pub const HALF_LIFE_NS: f64 = 5e9;
    /// How fast the link's capacity, against which its use is judged, is
    /// forgotten.
    pub const CAPACITY_HALF_LIFE_NS: f64 = 120e9;

    /// Takes `bytes_per_sec` moved over the last `elapsed_ns`; returns the
    /// estimate (bytes per second, 0 while nothing was moved).
    pub fn update(&mut self, bytes_per_sec: u64, elapsed_ns: u64) -> u64 {
        let dt = elapsed_ns as f64;
        let alpha = (dt / Self::SMOOTHING_NS).min(1.0);
        self.smoothed += alpha * (bytes_per_sec as f64 - self.smoothed);
        let decay = 0.5f64.powf(dt / Self::HALF_LIFE_NS);
        self.peak = (self.peak * decay).max(self.smoothed);
        let decay = 0.5f64.powf(dt / Self::CAPACITY_HALF_LIFE_NS);
        self.capacity = (self.capacity * decay).max(self.smoothed);
        self.peak as u64
    }

    /// What is moved now, smoothed (bytes per second).
    pub fn smoothed(&self) -> f64 {
        self.smoothed
    }

    /// What is moved now (smoothed) as a share of the most moved over the
    /// last minutes, parts per million (0 before anything was moved).
    pub fn utilization_ppm(&self) -> u32 {
        if self.capacity <= 0.0 {
            return 0;
        }
        (self.smoothed / self.capacity * 1e6).clamp(0.0, 1e6) as u32
    }
}

/// What one tenant moved over the last recomputation interval.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TenantRate {
    /// The tenant.
    pub id: TenantId,
    /// Its policy's weight (0 counts as 1).
    pub weight: u32,
    /// Bytes per second it moved over the interval.
    pub bytes_per_sec: u64,
    /// Whether it had more to send than it was let (work waiting in its
    /// schedulers at the end of the interval).
    pub wants_more: bool,
    /// Its byte cap, bytes per second, if it has one.
    pub cap: Option<u64>,
}

/// Settings of [`ShareGains`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ShareGainsConfig {
    /// Over how long each tenant's rate is averaged before it is compared
    /// with its share. Default 100 ms: senders on a busy host move in
    /// bursts of tens of milliseconds.
    pub smoothing: Nanos,
    /// How fast a gain follows the error of its tenant's share, in parts
    /// per million: per second, the gain is multiplied by `e` raised to
    /// this times the tenant's shortfall as a part of its share (`(share -
    /// rate) / share`; a tenant moving 10% over its share has its gain cut
    /// by 1 - e^-0.5, 39%, per second at the default). Default 5,000,000:
    /// an error is mostly corrected within a second. A faster gain chases the
    /// noise of senders that a busy host runs in bursts: at 25 per second
    /// the gains of three tenants on the emulated link swung between 0.2
    /// and 5 from one second to the next.
    pub rate_per_sec_ppm: u32,
    /// A capped tenant that moves at least this share of its cap (parts
    /// per million) is held by its cap, not by its window. Default 900,000.
    pub capped_at_ppm: u32,
    /// A tenant that has not contended for this long has its gain back at
    /// 1; a shorter pause (a moment with nothing queued between two
    /// requests) keeps it. Default 1 s.
    pub forget_after: Nanos,
}

impl Default for ShareGainsConfig {
    fn default() -> ShareGainsConfig {
        ShareGainsConfig {
            smoothing: Nanos::from_millis(100),
            rate_per_sec_ppm: 5_000_000,
            capped_at_ppm: 900_000,
            forget_after: Nanos::from_secs(1),
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct State {
    /// Its rate, averaged over `smoothing` (bytes per second).
    rate: f64,
    gain: f64,
    /// When it last contended.
    contended_at: Nanos,
}

/// Per-tenant gains on the windows' growth (see the [module docs](self)).
#[derive(Debug, Clone, Default)]
pub struct ShareGains {
    config: ShareGainsConfig,
    tenants: HashMap<TenantId, State>,
    last: Option<Nanos>,
    /// The weights of the tenants with work waiting at the last update.
    sharing: u32,
}

impl ShareGains {
    /// Gains with `config`'s settings.
    pub fn new(config: ShareGainsConfig) -> ShareGains {
        ShareGains {
            config,
            ..ShareGains::default()
        }
    }

    /// Takes what every tenant moved over the interval ending at `now`
    /// and moves each contending tenant's gain toward the share of its
    /// weight. Tenants not named are forgotten (their gain is 1 again).
    pub fn update(&mut self, now: Nanos, rates: &[TenantRate]) {
        let elapsed = self.last.map_or(0, |last| now.0.saturating_sub(last.0));
        self.last = Some(now);
        let alpha = if elapsed == 0 {
            1.0
        } else {
            (elapsed as f64 / self.config.smoothing.0.max(1) as f64).min(1.0)
        };
        let power = (f64::from(self.config.rate_per_sec_ppm) / 1e6 * elapsed as f64 / 1e9).min(1.0);
        let capped_at = f64::from(self.config.capped_at_ppm) / 1e6;
        let forget = self.config.forget_after;
        let named: HashSet<TenantId> = rates.iter().map(|r| r.id).collect();
        self.tenants.retain(|id, _| named.contains(id));
        let mut contenders: Vec<&TenantRate> = Vec::new();
        self.sharing = 0;
        for r in rates {
            let moved = r.bytes_per_sec as f64;
            let held_by_cap = r.cap.is_some_and(|cap| moved >= capped_at * cap as f64);
            let contending = r.wants_more && !held_by_cap && r.bytes_per_sec > 0;
            let s = self.tenants.entry(r.id).or_insert(State {
                rate: moved,
                gain: 1.0,
                contended_at: now,
            });
            s.rate += alpha * (moved - s.rate);
            if contending {
                s.contended_at = now;
                self.sharing = self.sharing.saturating_add(r.weight.max(1));
                contenders.push(r);
            } else if now.0.saturating_sub(s.contended_at.0) >= forget.0 || held_by_cap {
                s.gain = 1.0;
            }
        }
        if contenders.len() < 2 {
            // Nobody to share with: back toward 1 at the same pace.
            for r in contenders {
                let s = self.tenants.get_mut(&r.id).expect("kept above");
                s.gain = s.gain.powf(1.0 - power);
            }
            return;
        }
        let total: f64 = contenders.iter().map(|r| self.tenants[&r.id].rate).sum();
        let weights: f64 = contenders.iter().map(|r| f64::from(r.weight.max(1))).sum();
        if total <= 0.0 {
            return;
        }
        let mut log_sum = 0.0;
        for r in &contenders {
            let s = self.tenants.get_mut(&r.id).expect("kept above");
            let share = total * f64::from(r.weight.max(1)) / weights;
            // The error is the shortfall against the share, as a part of
            // the share. A tenant's rate over one interval swings (a window
            // under one piece paces its pieces); judged by the logarithm of
            // share over rate, a burst to twice the share would weigh no
            // more than a fall to half of it, and the gain would settle
            // where the geometric mean of the rate is the share, with the
            // mean above it. In the simulator at 120 Mbit/s with up to
            // 100 us of completion noise, 1:3:9 came out 30% off that way
            // and 2% off this way.
            let error = ((share - s.rate) / share).clamp(-MAX_GAIN.ln(), MAX_GAIN.ln());
            s.gain = (s.gain * (error * power).exp()).clamp(1.0 / MAX_GAIN, MAX_GAIN);
            log_sum += s.gain.ln();
        }
        // A geometric mean of 1 among the contending tenants.
        let mean = (log_sum / contenders.len() as f64).exp();
        for r in &contenders {
            let s = self.tenants.get_mut(&r.id).expect("kept above");
            s.gain = (s.gain / mean).clamp(1.0 / MAX_GAIN, MAX_GAIN);
        }
    }

    /// The weights of the tenants that contended at the last update (work
    /// waiting, bytes moved, not held by a cap: the windows that bind),
    /// added up, or 0 if none did. Their windows share one
    /// increase per round trip ([`DelayWindow::set_sharing_weight`](crate::DelayWindow::set_sharing_weight)).
    pub fn sharing_weight(&self) -> u32 {
        self.sharing
    }

    /// A tenant's gain in parts per million ([`GAIN_ONE`] for a tenant
    /// that does not contend or is not known).
    pub fn gain(&self, id: TenantId) -> u32 {
        self.tenants
            .get(&id)
            .map_or(GAIN_ONE, |s| (s.gain * f64::from(GAIN_ONE)).round() as u32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn busy(id: u32, weight: u32, bytes_per_sec: u64) -> TenantRate {
        TenantRate {
            id: TenantId(id),
            weight,
            bytes_per_sec,
            wants_more: true,
            cap: None,
        }
    }

    fn ratio(gains: &ShareGains, id: u32) -> f64 {
        f64::from(gains.gain(TenantId(id))) / f64::from(GAIN_ONE)
    }

    /// A port that gives each tenant a share in proportion to its weight
    /// times its gain times a bias of its own (what the port's details do
    /// to the windows): the gains undo the bias, and the shares become
    /// the weights'.
    #[test]
    fn gains_undo_a_bias_until_the_shares_are_the_weights() {
        let weights = [1u32, 2, 4];
        let bias = [0.6, 1.3, 0.9];
        let link = 25e6;
        let mut gains = ShareGains::default();
        let mut now = Nanos::ZERO;
        let mut shares = [0.0; 3];
        for _ in 0..200 {
            let pull: Vec<f64> = (0..3)
                .map(|i| f64::from(weights[i]) * ratio(&gains, i as u32 + 1) * bias[i])
                .collect();
            let sum: f64 = pull.iter().sum();
            for i in 0..3 {
                shares[i] = pull[i] / sum;
            }
            let rates: Vec<TenantRate> = (0..3)
                .map(|i| busy(i as u32 + 1, weights[i], (link * shares[i]) as u64))
                .collect();
            now = now + Nanos::from_millis(20);
            gains.update(now, &rates);
        }
        for (i, &w) in weights.iter().enumerate() {
            let want = f64::from(w) / 7.0;
            assert!(
                (shares[i] / want - 1.0).abs() < 0.01,
                "shares {shares:?} for weights 1:2:4"
            );
        }
        // Normalised: a geometric mean of 1.
        let product: f64 = (1..=3).map(|i| ratio(&gains, i)).product();
        assert!((product - 1.0).abs() < 0.01, "product of gains {product}");
    }

    /// `n` updates of `gains` 20 ms apart from `now` on, with `rates`.
    fn every_20_ms(gains: &mut ShareGains, now: &mut Nanos, n: usize, rates: &[TenantRate]) {
        for _ in 0..n {
            *now = *now + Nanos::from_millis(20);
            gains.update(*now, rates);
        }
    }

    /// A tenant with nothing more to send, or held by its cap, does not
    /// contend: its gain is 1, and the tenants that do contend share
    /// what it leaves by their weights.
    #[test]
    fn only_tenants_that_want_more_contend() {
        let mut gains = ShareGains::default();
        let mut now = Nanos::ZERO;
        let rates = [
            // Idle: it sends what it has.
            TenantRate {
                wants_more: false,
                ..busy(1, 8, 1_000)
            },
            // Held at its cap.
            TenantRate {
                cap: Some(5_000_000),
                ..busy(2, 8, 4_900_000)
            },
            busy(3, 1, 2_000_000),
            busy(4, 1, 6_000_000),
        ];
        every_20_ms(&mut gains, &mut now, 50, &rates);
        assert_eq!(gains.gain(TenantId(1)), GAIN_ONE);
        assert_eq!(gains.gain(TenantId(2)), GAIN_ONE);
        // Only the contending tenants' windows share the growth: weights
        // 1 and 1, not the idle or capped tenants' 8s.
        assert_eq!(gains.sharing_weight(), 2);
        assert!(
            ratio(&gains, 3) > 1.5,
            "the one under its share grows faster"
        );
        assert!(ratio(&gains, 4) < 0.7, "the one over it slower");
        // One contending tenant alone has nothing to share with: its gain
        // goes back to 1 within a few seconds.
        every_20_ms(&mut gains, &mut now, 150, &[busy(3, 1, 2_000_000)]);
        assert!(
            (ratio(&gains, 3) - 1.0).abs() < 0.01,
            "{}",
            ratio(&gains, 3)
        );
        // Tenants not named are forgotten.
        assert_eq!(gains.gain(TenantId(4)), GAIN_ONE);
        assert_eq!(gains.sharing_weight(), 1);
        gains.update(now + Nanos::from_millis(20), &[]);
        assert_eq!(gains.sharing_weight(), 0);
    }

    /// However far off a tenant's share stays (it cannot use more), its
    /// gain stays within the bounds.
    #[test]
    fn gains_stay_within_their_bounds() {
        let mut gains = ShareGains::default();
        let rates = [busy(1, 1, 1), busy(2, 1_000_000, 1 << 40)];
        let mut now = Nanos::ZERO;
        every_20_ms(&mut gains, &mut now, 500, &rates);
        let max = (MAX_GAIN * f64::from(GAIN_ONE)) as u32;
        let min = (f64::from(GAIN_ONE) / MAX_GAIN) as u32;
        for id in [1, 2] {
            let g = gains.gain(TenantId(id));
            assert!((min..=max).contains(&g), "gain {g}");
        }
        // The first moves far less than its share: the larger gain.
        assert!(gains.gain(TenantId(1)) > gains.gain(TenantId(2)));
    }

    const ESTIMATE_TICK: u64 = 20_000_000;

    /// The link's use is what is moved now against the highest rate seen
    /// over the last minutes: full while the tenants keep moving it, less
    /// when they move less, and still less a minute later (the estimate
    /// the windows' allowance follows has come down by then).
    #[test]
    fn the_links_use_is_what_is_moved_against_the_highest_rate_seen() {
        let mut e = LinkEstimate::default();
        assert_eq!(e.utilization_ppm(), 0);
        for _ in 0..50 {
            e.update(25_000_000, ESTIMATE_TICK);
        }
        assert!(e.utilization_ppm() > 999_000, "{}", e.utilization_ppm());
        for _ in 0..50 {
            e.update(15_000_000, ESTIMATE_TICK);
        }
        // 15 against 25 MB/s, the highest having fallen for a second
        // (half every 2 minutes): about 0.6.
        let used = e.utilization_ppm();
        assert!((595_000..=610_000).contains(&used), "{used}");
        for _ in 0..(60_000_000_000 / ESTIMATE_TICK) {
            e.update(15_000_000, ESTIMATE_TICK);
        }
        // A minute on: 15 against 25 x 0.71.
        let used = e.utilization_ppm();
        assert!((830_000..=870_000).contains(&used), "{used}");
        assert!(
            e.update(15_000_000, ESTIMATE_TICK) < 16_000_000,
            "the estimate has followed"
        );
    }
}
