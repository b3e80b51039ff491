//! The delay window: how many bytes one sender may have in the NIC,
//! decided from the completion times of its own pieces.
//!
//! Schedulers order the work of the tenants they see. Tenants in other
//! processes (other containers) are not seen: their queue pairs feed the
//! same NIC port, and a bulk tenant that keeps megabytes in flight fills
//! the port's queue however well each process schedules its own work. A
//! latency request of any tenant then waits behind all of it.
//!
//! A [`Window`] bounds what one sender (a queue pair, or a process's bulk
//! traffic) keeps in the NIC. [`DelayWindow`] does it without any shared
//! state and without a daemon, as Swift and TIMELY do on hardware: each
//! piece's time from post to completion is a sample of the queue it went
//! through. While the samples stay near the lowest seen (the path's own
//! delay), the window grows by a little every round trip; when they rise
//! above a target, it shrinks in proportion to the excess. Every sender of
//! a shared port sees the same queue, so together they keep it near the
//! target, whatever their number, and share it in proportion to their
//! weights (additive increase scaled by the weight, multiplicative
//! decrease).
//!
//! Every completed piece counts for its bytes: it grows the window by
//! `increase x weight x bytes / window` (so by `increase x weight` per
//! round trip's worth of completions) or shrinks it by its share of a
//! round trip's cut. A sender that completes many pieces in a round trip
//! and one that completes few (a capped or slower one) are judged on the
//! same evidence per byte: neither is favoured by seeing more samples. Each
//! piece is judged on the lowest delay of the last
//! [`DelayWindowConfig::filter`] pieces, so one piece that completed late
//! because its sender was asleep is not taken for a queue.
//!
//! A window that ends inside a piece moves that fraction of a piece per
//! round trip too. Above one piece, one round trip in every
//! `piece / fraction` keeps a piece more in flight than the whole pieces
//! (a window of 2.5 pieces keeps 3 in flight every other round trip and 2
//! in between). Under one piece, one piece goes every `piece / window`
//! round trips (a quarter of a piece: one piece every fourth round trip),
//! each due one interval after the last was due, so that a piece its
//! sender posted late (it waited for the one before, or for a CPU) does
//! not push the later ones back: the sender moves `window` bytes per round
//! trip, as a larger window does. Each sender's intervals start at a point
//! of its own (from its seed), so that senders do not all go beyond their
//! windows at the same moment.
//!
//! The coordinator can set a gain on a window's growth and cuts
//! ([`DelayWindow::set_gain`], from [`ShareGains`](crate::share::ShareGains)):
//! tenants in separate processes then share the port by their weights where
//! the port's details would bend their shares.
//!
//! The target is the path's own delay plus a queue allowance: a share of
//! the path's delay ([`DelayWindowConfig::target_ratio_ppm`]; the path's
//! delay for a piece includes the time the piece takes on the wire, so on a
//! slower link the allowance is longer in time but about the same in
//! bytes), and at least [`DelayWindowConfig::target_floor`] (800 us by
//! default), which absorbs the noise of a sender that sleeps between its
//! completions on a busy host. No link rate is entered by hand. Where the
//! link's rate is measured (the coordinator publishes what the tenants
//! together move through the port, and the engine passes it on with
//! [`DelayWindow::set_link_rate`]), the allowance is the time
//! [`DelayWindowConfig::queue_bytes`] take at that rate instead of the
//! floor: what a latency request waits behind is bytes, and a fixed time
//! is a long wait on a slow link and a queue too short to keep a fast one
//! busy.
//!
//! Time the host adds is not the NIC's: a completion that wakes its
//! thread, which then waits for a CPU, is found late by that wait.
//! [`Window::on_completed_late`] takes the wait (the engine reads it from
//! the kernel's run-queue accounting of the thread) and the window judges
//! the piece without it, so that a busy host does not shrink every window
//! as a queue would.
//!
//! ```
//! use mtrdma_sched::{Admit, DelayWindow, DelayWindowConfig, Nanos, Window};
//!
//! // 4 KiB pieces; a path whose own delay is 100 us.
//! let mut w = DelayWindow::new(DelayWindowConfig::for_piece(4096)).unwrap();
//! let mut now = Nanos::ZERO;
//! assert_eq!(w.admit(0, 4096, now), Admit::Now);
//! for _ in 0..200 {
//!     w.on_sent(4096, now);
//!     w.on_completed(4096, now, now + Nanos::from_micros(100));
//!     now = now + Nanos::from_micros(100);
//! }
//! let grown = w.window();
//! assert!(grown > 4096, "an empty queue lets the window grow");
//! // The queue builds up: every piece now takes 2 ms, over the target
//! // (the path's 100 us and a queue of at least 800 us).
//! assert_eq!(w.target_delay(), Some(Nanos::from_micros(900)));
//! for _ in 0..50 {
//!     w.on_sent(4096, now);
//!     w.on_completed(4096, now, now + Nanos::from_millis(2));
//!     now = now + Nanos::from_millis(2);
//! }
//! assert!(w.window() < grown / 4, "a standing queue shrinks it");
//! ```

use crate::error::ConfigError;
use crate::policy::{MAX_WEIGHT, PPM};
use crate::time::Nanos;

use super::{Admit, Signals, Verdicts, Window, WindowView};

mod config;

pub use config::*;

/// A window that follows the delay of the sender's own pieces (see the
/// [module docs](self)).
#[derive(Debug, Clone)]
pub struct DelayWindow {
    config: DelayWindowConfig,
    window: u64,
    /// Lowest sample of the current and of the previous base period (ns;
    /// `u64::MAX`: none).
    base_now: u64,
    base_before: u64,
    period_start: Nanos,
    /// Smoothed round trip (ns; 0 until the first sample).
    srtt: u64,
    /// The last `filter` samples (ns), oldest overwritten first.
    recent: [u64; MAX_FILTER as usize],
    /// Samples taken so far (the next slot of `recent` is this modulo
    /// `filter`).
    samples: u64,
    /// The largest piece of the last [`PIECE_MEMORY`] to twice as many
    /// posted: samples of pieces under half of it are not used (a short
    /// piece's delay says less about the queue). Only recent pieces
    /// count, so that one large piece (a request sent whole) does not
    /// make every later piece of the usual size short, and the window
    /// deaf, for good.
    largest: u64,
    /// The largest piece posted since `largest` was last renewed, and how
    /// many pieces that was.
    largest_next: u64,
    posted_since: u32,
    /// When the last piece beyond the window's whole pieces was due (ns;
    /// `None`: none posted yet), and when the first piece completed.
    extra_at: Option<u64>,
    first_completion: u64,
    /// The coordinator's gain on the growth and cuts ([`DelayWindow::set_gain`]),
    /// parts per million.
    gain: u32,
    /// The weights of the tenants whose windows share the port, together
    /// ([`DelayWindow::set_sharing_weight`]; 1: not known).
    sharing_weight: u32,
    /// Bytes posted and not yet completed, as told by `on_sent` and
    /// `on_completed`.
    out: u64,
    /// Bytes of unsignaled pieces completed since the last sample, which
    /// the next sample judges ([`Window::on_completed_unsampled`]).
    unjudged: u64,
    /// The queue allowance from the link's rate (ns; 0: no rate known,
    /// `target_floor` applies), and the rate it was computed from.
    allowance: u64,
    link_rate: u64,
    /// Verdicts since the last [`Window::take_verdicts`].
    verdicts: Verdicts,
    /// Until when (ns) it posts nothing after its last completion
    /// ([`DelayWindowConfig::spread_ppm`]).
    spread_until: u64,
    /// Whether the coordinator permits a floor of one piece
    /// ([`DelayWindow::set_piece_floor`]).
    piece_floor: bool,
}

impl DelayWindow {
    /// A window with `config`'s settings.
    ///
    /// # Errors
    /// [`ConfigError::Window`] for a setting out of range.
    pub fn new(config: DelayWindowConfig) -> Result<DelayWindow, ConfigError> {
        config.validate()?;
        Ok(DelayWindow {
            window: config.initial_window,
            config,
            base_now: u64::MAX,
            base_before: u64::MAX,
            period_start: Nanos::ZERO,
            srtt: 0,
            recent: [u64::MAX; MAX_FILTER as usize],
            samples: 0,
            largest: 0,
            largest_next: 0,
            posted_since: 0,
            extra_at: None,
            first_completion: 0,
            gain: crate::share::GAIN_ONE,
            sharing_weight: 1,
            out: 0,
            unjudged: 0,
            allowance: 0,
            link_rate: 0,
            verdicts: Verdicts::default(),
            spread_until: 0,
            piece_floor: false,
        })
    }

    /// Its settings.
    pub fn config(&self) -> &DelayWindowConfig {
        &self.config
    }

    /// The path's own delay as learnt so far (the lowest recent sample).
    pub fn base_delay(&self) -> Option<Nanos> {
        let base = self.base_now.min(self.base_before);
        (base != u64::MAX).then_some(Nanos(base))
    }

    /// The smoothed round trip of recent pieces.
    pub fn smoothed_delay(&self) -> Option<Nanos> {
        (self.srtt != 0).then_some(Nanos(self.srtt))
    }

    /// The delay above which the window shrinks: the path's own delay
    /// and a queue allowance, the larger of
    /// [`target_ratio_ppm`](DelayWindowConfig::target_ratio_ppm) of the
    /// path's delay and either the time
    /// [`queue_bytes`](DelayWindowConfig::queue_bytes) take at the link's
    /// rate (when [`set_link_rate`](Self::set_link_rate) told one) or
    /// [`target_floor`](DelayWindowConfig::target_floor).
    pub fn target_delay(&self) -> Option<Nanos> {
        let base = self.base_delay()?.0;
        let floor = if self.allowance > 0 {
            self.allowance
        } else {
            self.config.target_floor.0
        };
        let queue = mul_ppm(base, self.config.target_ratio_ppm).max(floor);
        Some(Nanos(base.saturating_add(queue)))
    }

    /// Gives the sender another weight (a policy reload), from the next
    /// completion on; the window itself moves from there by the rule.
    ///
    /// # Errors
    /// [`ConfigError::Window`] for a weight of 0 or over
    /// [`MAX_WEIGHT`]; the weight is then unchanged.
    pub fn set_weight(&mut self, weight: u32) -> Result<(), ConfigError> {
        DelayWindowConfig {
            weight,
            ..self.config.clone()
        }
        .validate()?;
        self.config.weight = weight;
        Ok(())
    }

    /// Multiplies how fast the window grows by `ppm` parts per million and
    /// divides its cuts by as much (`GAIN_ONE`, 1,000,000: as its weight
    /// says; 0 counts as 1 ppm); a gain under 1 also lowers its smallest
    /// size, as a smaller weight would (one over 1 does not raise it). The
    /// coordinator keeps such a gain per tenant
    /// ([`ShareGains`](crate::share::ShareGains)) so that tenants in
    /// separate processes share a port by their weights where the port's
    /// details (piece sizes, when each sender sees the queue) would bend
    /// their shares. Cheap: call it as often as the gain changes.
    pub fn set_gain(&mut self, ppm: u32) {
        self.gain = ppm.max(1);
    }

    /// The gain on the window's growth, parts per million.
    pub fn gain(&self) -> u32 {
        self.gain
    }

    /// Tells the window the weights of the tenants whose windows share its
    /// port's growth, added up (its own among them; 0 and 1: alone, or not
    /// known), and divides its growth by that: together the windows then
    /// grow by one [`additive_increase`](DelayWindowConfig::additive_increase)
    /// per round trip, split by weight, however many tenants there are.
    /// Windows that each grow by a whole increase overshoot their target by
    /// about the sum of their increases before they all see it. The
    /// coordinator publishes the sum, as far
    /// as the link is full ([`sharing_for`](crate::share::sharing_for)).
    /// Cheap: call it as often as it changes.
    pub fn set_sharing_weight(&mut self, weights: u32) {
        self.sharing_weight = weights.max(1);
    }

    /// The weights sharing the port, as last told (1: not known).
    pub fn sharing_weight(&self) -> u32 {
        self.sharing_weight
    }

    /// Tells the window the rate of the link its pieces cross, in bytes
    /// per second, as measured (`None` or 0: not known, and
    /// [`target_floor`](DelayWindowConfig::target_floor) applies). The
    /// queue allowance becomes the time
    /// [`queue_bytes`](DelayWindowConfig::queue_bytes) take at that rate
    /// (at least 1 us, at most [`MAX_ALLOWANCE`]). Cheap: call it as often
    /// as the measurement changes.
    pub fn set_link_rate(&mut self, bytes_per_sec: Option<u64>) {
        let rate = bytes_per_sec.unwrap_or(0);
        if rate == self.link_rate {
            // The engine tells it at every completion; the measurement
            // changes every few milliseconds.
            return;
        }
        self.link_rate = rate;
        self.allowance = match bytes_per_sec {
            Some(rate) if rate > 0 => {
                let ns = u128::from(self.config.queue_bytes) * 1_000_000_000 / u128::from(rate);
                u64::try_from(ns)
                    .unwrap_or(u64::MAX)
                    .clamp(1_000, MAX_ALLOWANCE.0)
            }
            _ => 0,
        };
    }

    /// Lets the window keep one piece (the largest of its recent pieces)
    /// whatever the delay, or takes that back (the coordinator's permit,
    /// [`piece_floor`](crate::piece_floor)). Under one piece a window
    /// paces its pieces, one every `piece / window` round trips, and its
    /// sender sleeps before nearly every piece; where the host's CPUs, not
    /// the port, limit the senders, those sleeps cost more than the piece.
    /// The floor is one piece whatever the weight and gain, and never
    /// above [`max_window`](DelayWindowConfig::max_window). Turned on, it
    /// raises the window to it at once.
    pub fn set_piece_floor(&mut self, on: bool) {
        self.piece_floor = on;
        if on {
            self.window = self.window.max(self.floor());
        }
    }

    /// Whether the window keeps one piece whatever the delay
    /// ([`set_piece_floor`](Self::set_piece_floor)).
    pub fn piece_floor(&self) -> bool {
        self.piece_floor
    }

    /// The smallest window: the configured one times the weight, or one
    /// piece where the coordinator permits it and that is more.
    fn floor(&self) -> u64 {
        let c = &self.config;
        if self.piece_floor && self.largest > 0 {
            return self.weighted_floor().max(self.largest.min(c.max_window));
        }
        self.weighted_floor()
    }

    /// The configured smallest window times the weight (and the gain, if
    /// under 1).
    fn weighted_floor(&self) -> u64 {
        let c = &self.config;
        // A gain under 1 lowers the floor as a smaller weight would; one
        // over 1 does not raise it (a floor holds a window up whatever the
        // queue, so a large one would keep a queue standing).
        let gain = u64::from(self.gain).min(PPM);
        let floor =
            u128::from(c.min_window) * u128::from(c.weight) * u128::from(gain) / u128::from(PPM);
        u64::try_from(floor)
            .unwrap_or(u64::MAX)
            .clamp(1, c.max_window)
    }

    /// The piece size: the largest piece posted so far.
    fn piece(&self) -> u64 {
        self.largest.max(1)
    }

    /// The window's fraction of a piece beyond its whole pieces, and the
    /// piece.
    fn fraction(&self) -> (u64, u64) {
        let piece = self.piece();
        (self.window % piece, piece)
    }

    /// The time between two pieces beyond the window's whole pieces: one
    /// round trip for each `fraction / piece` of a piece, so that the
    /// fraction moves its share of a piece per round trip (at most 65,536
    /// round trips; `None` for a window of whole pieces).
    fn extra_interval(&self) -> Option<u64> {
        let (frac, piece) = self.fraction();
        if frac == 0 {
            return None;
        }
        let srtt = u128::from(self.srtt.max(1));
        let gap = (srtt * u128::from(piece) / u128::from(frac)).min(srtt << 16);
        Some(u64::try_from(gap).unwrap_or(u64::MAX))
    }

    /// Where this sender's pieces beyond its window's whole pieces are
    /// counted from: when the last one was due (a window under one piece)
    /// or when the last round trip rounded up began (a larger one). The
    /// first is a point of this sender's own (from its seed) within one
    /// interval of its first completion, so that senders do not all go
    /// beyond their windows at the same moments.
    fn extra_anchor(&self, interval: u64) -> u64 {
        match self.extra_at {
            Some(at) => at,
            None => {
                let turn = splitmix64(self.config.seed) >> 32;
                let offset = (u128::from(interval) * u128::from(turn)) >> 32;
                self.first_completion
                    .saturating_add(offset as u64)
                    .saturating_sub(interval)
            }
        }
    }

    /// With a window of at least one piece: the start of the last round
    /// trip at or before `now` that rounds the window up (they start
    /// every interval from the anchor), if one has started.
    fn rounded_up_since(&self, interval: u64, now: u64) -> Option<u64> {
        let anchor = self.extra_anchor(interval);
        let since = now.checked_sub(anchor)?;
        Some(anchor + since / interval * interval)
    }

    /// The time over which senders start again after a quiet time: one
    /// round trip, or the rounds a window under one piece takes per piece.
    fn restart_spread(&self) -> u64 {
        let piece = self.piece();
        if self.window >= piece {
            return self.srtt;
        }
        let spread = u128::from(self.srtt) * u128::from(piece) / u128::from(self.window.max(1));
        u64::try_from(spread).unwrap_or(u64::MAX)
    }

    /// When this sender may post again if `now` falls in the quiet time of
    /// its period or before its own start after it: twice the target
    /// delay from the period's start, then a point of its own (from its
    /// seed and the period) within one round trip or pacing gap; each of
    /// the two at most a quarter of the period. A sender that learnt a
    /// long delay (it started behind a queue that took seconds to drain)
    /// would otherwise stay quiet from one period into the next for ever,
    /// and never post the pieces that would teach it the shorter delay.
    #[inline]
    fn quiet_until(&self, now: Nanos) -> Option<Nanos> {
        let every = self.config.quiet_every.0;
        if every == 0 {
            return None;
        }
        let target = self.target_delay()?.0;
        let start = now.0 - now.0 % every;
        let end = start.saturating_add(target.saturating_mul(2).min(every / 4));
        let spread = self.restart_spread().min(every / 4);
        let turn =
            splitmix64(self.config.seed ^ (now.0 / every).wrapping_mul(0x9e37_79b9_7f4a_7c15));
        let offset = (u128::from(spread) * u128::from(turn >> 32)) >> 32;
        let resume = end.saturating_add(offset as u64);
        (now.0 < resume).then_some(Nanos(resume))
    }

    /// The verdict of one completed piece of `bytes` whose (filtered)
    /// delay is `sample`: it counts for `bytes / window` of a round trip.
    fn decide(&mut self, sample: u64, bytes: u64) {
        let Some(target) = self.target_delay().map(|t| t.0) else {
            return;
        };
        let floor = self.floor();
        let c = &self.config;
        let window = self.window.max(1);
        self.verdicts.judged = self.verdicts.judged.saturating_add(bytes);
        if sample > target {
            self.verdicts.over_target = self.verdicts.over_target.saturating_add(bytes);
        }
        if sample <= target {
            // increase x weight / the weights sharing the growth per round
            // trip's worth of bytes.
            let grow = u128::from(c.additive_increase)
                * u128::from(c.weight)
                * u128::from(self.gain)
                * u128::from(bytes)
                / (u128::from(window) * u128::from(PPM) * u128::from(self.sharing_weight));
            let grow = u64::try_from(grow).unwrap_or(u64::MAX);
            self.window = self
                .window
                .saturating_add(grow.max(1))
                .min(c.max_window)
                .max(floor);
        } else {
            // A round trip's cut is decrease x (sample - target) / sample
            // of the window, at most max_decrease (Swift's multiplicative
            // decrease); each completed byte takes its share, so that a
            // window's worth of bytes takes the whole cut however many
            // pieces carried them.
            let excess = u128::from(sample - target) * u128::from(c.decrease_ppm)
                / u128::from(sample.max(1));
            let cut = excess.min(u128::from(c.max_decrease_ppm));
            // The coordinator's gain divides the cut as it multiplies the
            // growth: a window's size goes with the growth over the cut.
            let take = cut * u128::from(bytes) / u128::from(self.gain.max(1));
            let take = u64::try_from(take).unwrap_or(u64::MAX);
            self.window = self.window.saturating_sub(take).max(floor);
        }
    }
}

impl Window for DelayWindow {
    #[inline]
    fn admit(&self, in_flight: u64, bytes: u64, now: Nanos) -> Admit {
        if let Some(end) = self.quiet_until(now) {
            return Admit::At(end);
        }
        if now.0 < self.spread_until {
            return Admit::At(Nanos(self.spread_until));
        }
        if in_flight.saturating_add(bytes) <= self.window {
            return Admit::Now;
        }
        if self.srtt == 0 || self.largest == 0 {
            // Nothing learnt yet: a first piece goes.
            return Admit::now_if(in_flight == 0);
        }
        // The window ends inside a piece: every `piece / fraction` round
        // trips, one round trip keeps a piece more than the whole pieces,
        // so that the fraction moves its share of a piece per round trip.
        let (frac, piece) = self.fraction();
        let whole = self.window - frac;
        if in_flight.saturating_add(bytes) > whole + piece || frac == 0 {
            return Admit::AfterCompletion;
        }
        let Some(interval) = self.extra_interval() else {
            return Admit::AfterCompletion;
        };
        let due = if whole == 0 {
            // Under one piece: one piece per interval, whenever the one
            // before has completed.
            self.extra_anchor(interval).saturating_add(interval)
        } else if in_flight == 0 {
            // Above, and nothing in flight: a piece larger than the window
            // (a request sent whole) goes alone. Waiting for the round
            // trip that rounds the window up, a sender that polls later
            // than that round trip lasts would miss it every time.
            return Admit::Now;
        } else {
            // Above: the window is a piece larger for one round trip in
            // every interval.
            match self.rounded_up_since(interval, now.0) {
                Some(start) if now.0 < start.saturating_add(self.srtt.min(interval)) => {
                    return Admit::Now;
                }
                Some(start) => start.saturating_add(interval),
                None => self.extra_anchor(interval),
            }
        };
        if now.0 >= due {
            Admit::Now
        } else {
            Admit::At(Nanos(due))
        }
    }

    #[inline]
    fn on_sent(&mut self, bytes: u64, now: Nanos) {
        self.largest = self.largest.max(bytes);
        self.largest_next = self.largest_next.max(bytes);
        self.posted_since += 1;
        if self.posted_since >= PIECE_MEMORY {
            self.largest = std::mem::take(&mut self.largest_next);
            self.posted_since = 0;
        }
        if let Some(interval) = self.extra_interval() {
            if self.window >= self.piece() {
                // Keep the anchor near: a window that changes its fraction
                // changes the interval from here on, not the phase so far.
                if let Some(start) = self.rounded_up_since(interval, now.0) {
                    self.extra_at = Some(start);
                }
            } else if self.out.saturating_add(bytes) > self.window {
                // A piece beyond a window under one piece. The next is due
                // one interval after this one was due, so that a piece
                // posted late (its sender waited for a completion or for a
                // CPU) does not push the later ones back; but a sender that
                // posted none for long does not save them up (at most half
                // an interval early), and one posted before it was due (a
                // first piece) counts from when it went.
                let due = self.extra_anchor(interval).saturating_add(interval);
                let floor = now.0.saturating_sub(interval / 2);
                self.extra_at = Some(due.clamp(floor, now.0));
            }
        }
        self.out = self.out.saturating_add(bytes);
    }

    fn on_completed(&mut self, bytes: u64, sent_at: Nanos, now: Nanos) {
        self.completed(bytes, sent_at, now, 0);
    }

    /// The path's own delay is learnt from the whole sample (a host delay
    /// taken off could make it look shorter than it is); the piece is
    /// judged without the host's delay, and never below the path's own.
    fn on_completed_late(&mut self, bytes: u64, sent_at: Nanos, now: Nanos, host: Nanos) {
        self.completed(bytes, sent_at, now, host.0);
    }

    /// Its bytes leave the window at once; the next sample judges them
    /// with its own.
    fn on_completed_unsampled(&mut self, bytes: u64, _sent_at: Nanos, _now: Nanos) {
        self.out = self.out.saturating_sub(bytes);
        self.unjudged = self.unjudged.saturating_add(bytes);
    }

    #[inline]
    fn window(&self) -> u64 {
        self.window
    }

    fn take_verdicts(&mut self) -> Verdicts {
        std::mem::take(&mut self.verdicts)
    }

    fn signals(&mut self, signals: &Signals) {
        if let Some(rate) = signals.link_rate {
            self.set_link_rate(Some(rate));
        }
        if let Some(ppm) = signals.gain_ppm {
            self.set_gain(ppm);
        }
        if let Some(weights) = signals.sharing_weight {
            self.set_sharing_weight(weights);
        }
        if let Some(weight) = signals.weight {
            // A weight out of range (a policy validates them) keeps the
            // one it has.
            let _ = self.set_weight(weight);
        }
        if let Some(on) = signals.piece_floor {
            if on != self.piece_floor {
                self.set_piece_floor(on);
            }
        }
    }

    fn view(&self) -> WindowView {
        WindowView {
            window_bytes: self.window,
            base_delay: self.base_delay(),
            smoothed_delay: self.smoothed_delay(),
            target_delay: self.target_delay(),
            weight: self.config.weight,
            gain_ppm: self.gain,
            sharing_weight: self.sharing_weight,
            queue_bytes: self.config.queue_bytes,
        }
    }
}

impl DelayWindow {
    /// After a completion at `now`: the wait before the next post
    /// ([`DelayWindowConfig::spread_ppm`]), unless one is under way, the
    /// link's rate is not known, the sender has no other piece on the
    /// wire, no other window shares the port or a piece is shorter on the
    /// wire than [`DelayWindowConfig::spread_from`].
    fn spread(&mut self, now: u64) {
        if self.config.spread_ppm == 0 || self.link_rate == 0 || now < self.spread_until {
            return;
        }
        if self.out < self.piece() {
            // Nothing else of this sender's is on the wire: a wait would
            // idle it, not put it out of step (see `spread_ppm`'s docs).
            return;
        }
        if self.sharing_weight <= self.config.weight {
            // No other window shares the port's growth (the coordinator's
            // sum is its own weight, or unknown): nobody to fall into step
            // with, and the wait would only cost.
            return;
        }
        // A piece's time on the wire (ns) against `spread_from`, without a
        // division: this runs at every completion.
        let piece_ns_x_rate = u128::from(self.piece()) * 1_000_000_000;
        if piece_ns_x_rate < u128::from(self.config.spread_from.0) * u128::from(self.link_rate) {
            return;
        }
        let wire = piece_ns_x_rate / u128::from(self.link_rate);
        let span = wire * u128::from(self.config.spread_ppm) / u128::from(PPM);
        let draw = splitmix64(self.config.seed ^ self.samples.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        let wait = (span * u128::from(draw >> 32)) >> 32;
        self.spread_until = now.saturating_add(u64::try_from(wait).unwrap_or(u64::MAX));
    }

    /// See [`Window::on_completed_late`] (`host` 0: on time).
    fn completed(&mut self, bytes: u64, sent_at: Nanos, now: Nanos, host: u64) {
        self.out = self.out.saturating_sub(bytes);
        self.spread(now.0);
        if bytes.saturating_mul(2) < self.largest {
            return;
        }
        // The unsignaled pieces this completion reported are judged by it.
        let judged = bytes.saturating_add(std::mem::take(&mut self.unjudged));
        let sample = (now - sent_at).0.max(1);
        self.srtt = if self.srtt == 0 {
            self.first_completion = now.0;
            sample
        } else {
            // srtt += (sample - srtt) / 8
            (self.srtt * 7 + sample) / 8
        };
        if now - self.period_start >= self.config.base_period {
            self.base_before = self.base_now;
            self.base_now = sample;
            self.period_start = now;
        } else {
            self.base_now = self.base_now.min(sample);
        }
        let base = self.base_delay().map_or(0, |b| b.0);
        let sample = sample.saturating_sub(host).max(base).max(1);
        let filter = u64::from(self.config.filter);
        self.recent[(self.samples % filter) as usize] = sample;
        self.samples += 1;
        let lowest = self.recent[..filter as usize]
            .iter()
            .copied()
            .min()
            .unwrap_or(sample);
        self.decide(lowest, judged);
    }
}

/// A well-mixed 64-bit hash of `x` (SplitMix64's finaliser).
pub(crate) fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// `x * ppm / 1e6`, saturating.
fn mul_ppm(x: u64, ppm: u32) -> u64 {
    let v = u128::from(x) * u128::from(ppm) / u128::from(PPM);
    u64::try_from(v).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests;
