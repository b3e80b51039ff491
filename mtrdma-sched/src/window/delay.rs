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

/// How many pieces posted a large one is remembered for (at least; at
/// most twice as many) as the piece size ([`DelayWindow`]'s `largest`).
const PIECE_MEMORY: u32 = 16;

/// The most samples [`DelayWindowConfig::filter`] may name.
const MAX_FILTER: u32 = 8;

/// The longest queue allowance a link rate gives
/// ([`DelayWindow::set_link_rate`]): a rate measured while the link was
/// nearly idle must not let the queue stand for longer.
pub const MAX_ALLOWANCE: Nanos = Nanos(100_000_000);
use crate::time::Nanos;

use super::{Admit, Signals, Verdicts, Window, WindowView};

/// The longest wait after a completion [`DelayWindowConfig::spread_ppm`]
/// may name: 16 pieces' time on the wire.
const MAX_SPREAD_PPM: u32 = 16_000_000;

/// Settings of a [`DelayWindow`]. [`DelayWindowConfig::for_piece`] gives
/// defaults for a piece size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DelayWindowConfig {
    /// The window at the start, in bytes. Default: one piece.
    pub initial_window: u64,
    /// The smallest window of a sender of weight 1 (a sender of weight
    /// `w` keeps `w` times it, and times its gain if under 1,
    /// [`DelayWindow::set_gain`]). Below one piece it is kept by sending
    /// one piece every `piece / window` round trips. Default: a quarter of
    /// a piece. The round trip of a sender that sleeps between pieces is,
    /// on a loaded host, mostly the time it takes to be woken: windows far
    /// under a piece then starve their senders for no queue at all (see
    /// `docs/delay-window.md` for the measurements behind each default).
    pub min_window: u64,
    /// The largest window. Default: 256 pieces.
    pub max_window: u64,
    /// Bytes added per round trip while the delay is under the target, for
    /// a sender of weight 1 (`w` times as many for weight `w`, and times
    /// its gain, [`DelayWindow::set_gain`]). Default:
    /// 1/8 of a piece. Senders sharing a port overshoot the target by
    /// about the sum of theirs before they all back off.
    pub additive_increase: u64,
    /// The sender's weight: senders that share a port keep windows, and so
    /// move bytes, in proportion to their weights. At least 1. Default 1.
    pub weight: u32,
    /// Each completion is judged on the lowest delay of the last this many
    /// pieces (1 to 8): one late piece is not taken for a queue, a run of
    /// them is. More than 1 favours senders that complete few pieces per
    /// round trip (the first late piece of each run is let off, and it is
    /// a larger share of a slow sender's bytes). Default 1: the target's
    /// floor absorbs a sleeping sender's noise.
    pub filter: u32,
    /// The target queueing delay as a share of the path's own delay, in
    /// parts per million. Default 1,000,000 (as long again as the path's
    /// own delay).
    pub target_ratio_ppm: u32,
    /// The target queueing delay is at least this. Default 800 us: a sender
    /// woken by completion events on a busy host sees its pieces complete
    /// hundreds of microseconds late now and then with no queue at all,
    /// and a target under that noise shrinks every window to its minimum.
    /// On hardware with senders that do not sleep (delays of a few
    /// microseconds), lower it: Swift's targets are tens of microseconds.
    pub target_floor: Nanos,
    /// With the link's rate known ([`DelayWindow::set_link_rate`]: the
    /// coordinator measures what the tenants move through the port), the
    /// queue allowance is the time this many bytes take at that rate, in
    /// place of [`target_floor`](Self::target_floor): a fixed time is a
    /// queue of few bytes on a slow link and of many on a fast one, while
    /// what a latency request waits behind is bytes. Default 10 KiB: with
    /// 4 KiB pieces, a latency request finds at most 16 KiB ahead of it
    /// (what [`Protection::for_bound`](crate::Protection::for_bound) gives
    /// for a 16 KiB bound).
    pub queue_bytes: u64,
    /// How strongly the window shrinks per unit of excess delay, in parts
    /// per million (Swift's beta). Default 800,000.
    pub decrease_ppm: u32,
    /// The most the window shrinks in one round trip, in parts per
    /// million. Default 500,000 (halved).
    pub max_decrease_ppm: u32,
    /// The path's own delay is the lowest sample of the last one to two
    /// such periods, so that a lasting change of path is learnt. Default
    /// 1 s.
    pub base_period: Nanos,
    /// Every this often (on the clock every sender shares: periods start
    /// at multiples of it), the window posts nothing for twice its target
    /// delay, so that the queue drains and every sender of the port,
    /// quiet at the same time, sees the path's own delay. A sender that
    /// started into a standing queue would otherwise take the queue for
    /// the path and keep it there. Zero turns it off. Default 500 ms.
    pub quiet_every: Nanos,
    /// With the link's rate known ([`DelayWindow::set_link_rate`]), other
    /// windows sharing the port (a sharing weight over its own weight,
    /// [`DelayWindow::set_sharing_weight`]) and a piece taking at least
    /// [`spread_from`](Self::spread_from) on the wire, after each
    /// completion that leaves another of its pieces on the wire the
    /// sender posts nothing for a time
    /// drawn at random (from its seed) between 0 and this many pieces'
    /// time on the wire, in parts per million of a piece; a completion
    /// during such a wait does not start another. 0 turns it off. Default
    /// 3,000,000 (3 pieces).
    ///
    /// A completion that leaves nothing of the sender's on the wire starts
    /// no wait: the wait would leave it idle rather than out of step, and
    /// the rate it is drawn from is what the tenants moved together (the
    /// coordinator's measure, a lower bound while the link is not full).
    /// Waits after every completion, drawn from a measured rate under the
    /// link's, held senders of a piece or so at that rate, which then
    /// never rose: on the emulated link at 180 Mbit/s, eight tenants next
    /// to the latency probe moved 27 and 33% of the link in two of five
    /// rounds, the rate stuck at about 50 Mbit/s (a piece seemingly 800
    /// us on the wire) until the probe ended; with this rule, 69 to 80%
    /// in five of five, in the same boot.
    ///
    /// Senders that see their completions within well under a piece's
    /// time on the wire of when the NIC made them (a host that wakes them
    /// on time, next to a slow link) fall into step, each finding the
    /// queue at the same point of the others' cycle every time, and the
    /// windows, whatever their weights and the coordinator's gains, settle
    /// on shares of their own. In the simulator under a 16 KiB bound (4
    /// KiB pieces, 100 us path) with 30 us of completion noise, 1:3:9 came
    /// out 48% off at 50 Mbit/s and 16% at 120 with no wait, and within 1%
    /// at 50 to 200 Mbit/s with up to 3 pieces' time. On the emulated link
    /// at 50 Mbit/s (a piece 655 us on the wire), 1:3:9 came out 2 to 42%
    /// off in eight runs with no wait and 0% in two with it, for 1% of
    /// what the tenants moved.
    pub spread_ppm: u32,
    /// The wait after a completion ([`spread_ppm`](Self::spread_ppm)) only
    /// where a piece takes at least this long on the wire at the link's
    /// rate: where it takes less, a host's own noise (a sender woken
    /// hundreds of microseconds late) already keeps the senders out of
    /// step, and the wait only costs. On the emulated link at 120 Mbit/s
    /// (273 us a piece), 1:3:9 was 1% off with no wait, and the wait cost
    /// the bulk tenants 97% of the link against 91% (72% against 52% next
    /// to the latency probe). Default 500 us. On hardware whose senders
    /// do not sleep, with slow links, lower it.
    pub spread_from: Nanos,
    /// Where in the round trip after a quiet time this sender starts
    /// again: any number, different for each sender (the engine uses the
    /// queue pair number), so that the senders of a port do not all post
    /// at the same moment when the quiet time ends. Default 0.
    pub seed: u64,
}

impl DelayWindowConfig {
    /// Defaults for pieces of `piece_bytes` (at least 1).
    pub fn for_piece(piece_bytes: u64) -> DelayWindowConfig {
        let piece = piece_bytes.max(1);
        DelayWindowConfig {
            initial_window: piece,
            min_window: (piece / 4).max(1),
            max_window: piece.saturating_mul(256),
            additive_increase: (piece / 8).max(1),
            weight: 1,
            filter: 1,
            target_ratio_ppm: 1_000_000,
            target_floor: Nanos::from_micros(800),
            queue_bytes: 10 << 10,
            decrease_ppm: 800_000,
            max_decrease_ppm: 500_000,
            base_period: Nanos::from_secs(1),
            quiet_every: Nanos::from_millis(500),
            spread_ppm: 3_000_000,
            spread_from: Nanos::from_micros(500),
            seed: 0,
        }
    }

    /// Checks every value.
    ///
    /// # Errors
    /// [`ConfigError::Window`] naming the first value out of range.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |what: &'static str| Err(ConfigError::Window { what });
        if self.min_window == 0 {
            return bad("min_window must be at least 1 byte");
        }
        if self.max_window < self.min_window {
            return bad("max_window must be at least min_window");
        }
        if !(self.min_window..=self.max_window).contains(&self.initial_window) {
            return bad("initial_window must lie between min_window and max_window");
        }
        if self.additive_increase == 0 {
            return bad("additive_increase must be at least 1 byte");
        }
        if !(1..=MAX_WEIGHT).contains(&self.weight) {
            return bad("weight must be between 1 and MAX_WEIGHT (1,000,000)");
        }
        if !(1..=MAX_FILTER).contains(&self.filter) {
            return bad("filter must be between 1 and 8 samples");
        }
        if u64::from(self.decrease_ppm) > PPM {
            return bad("decrease_ppm must be at most 1,000,000");
        }
        if u64::from(self.max_decrease_ppm) >= PPM {
            return bad("max_decrease_ppm must be below 1,000,000 (a window never drops to 0)");
        }
        if self.base_period == Nanos::ZERO {
            return bad("base_period must be longer than 0");
        }
        if self.queue_bytes == 0 {
            return bad("queue_bytes must be at least 1 byte");
        }
        if self.spread_ppm > MAX_SPREAD_PPM {
            return bad("spread_ppm must be at most 16,000,000 (16 pieces)");
        }
        Ok(())
    }
}

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
            return if in_flight == 0 {
                Admit::Now
            } else {
                Admit::AfterCompletion
            };
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
mod tests {
    use super::*;

    const PIECE: u64 = 4096;

    /// The defaults without the target's floor and without quiet times:
    /// the target is twice the path's own delay, which keeps the arithmetic
    /// below readable.
    fn config() -> DelayWindowConfig {
        DelayWindowConfig {
            target_floor: Nanos::ZERO,
            quiet_every: Nanos::ZERO,
            ..DelayWindowConfig::for_piece(PIECE)
        }
    }

    fn window() -> DelayWindow {
        DelayWindow::new(config()).unwrap()
    }

    /// Sends one piece at a time, each taking `delay`, `n` times.
    fn run(w: &mut DelayWindow, now: &mut Nanos, delay: Nanos, n: usize) {
        for _ in 0..n {
            w.on_sent(PIECE, *now);
            w.on_completed(PIECE, *now, *now + delay);
            *now = *now + delay;
        }
    }

    /// Completes pieces of `bytes` adding up to `total`, each `delay` long.
    fn complete(w: &mut DelayWindow, now: &mut Nanos, bytes: u64, total: u64, delay: Nanos) {
        for _ in 0..total / bytes {
            w.on_sent(bytes, *now);
            w.on_completed(bytes, *now, *now + delay);
            *now = *now + Nanos(1);
        }
    }

    #[test]
    fn a_known_link_rate_sets_the_queue_allowance_in_bytes() {
        let mut w = DelayWindow::new(DelayWindowConfig::for_piece(PIECE)).unwrap();
        let mut now = Nanos::ZERO;
        run(&mut w, &mut now, Nanos::from_micros(100), 1);
        // No rate known: the floor (800 us) over the path's 100 us.
        assert_eq!(w.target_delay(), Some(Nanos::from_micros(900)));
        // 10 KiB at 25 MB/s take 409.6 us; at 6.25 MB/s 1638.4 us.
        w.set_link_rate(Some(25_000_000));
        assert_eq!(w.target_delay(), Some(Nanos(100_000 + 409_600)));
        w.set_link_rate(Some(6_250_000));
        assert_eq!(w.target_delay(), Some(Nanos(100_000 + 1_638_400)));
        // The share of the path's delay still applies when it is longer.
        w.set_link_rate(Some(1 << 40));
        assert_eq!(w.target_delay(), Some(Nanos::from_micros(200)));
        // A rate measured near idle does not let the queue stand for long.
        w.set_link_rate(Some(1));
        assert_eq!(w.target_delay(), Some(Nanos(100_000) + MAX_ALLOWANCE));
        // Forgotten: the floor again.
        w.set_link_rate(None);
        assert_eq!(w.target_delay(), Some(Nanos::from_micros(900)));
        w.set_link_rate(Some(0));
        assert_eq!(w.target_delay(), Some(Nanos::from_micros(900)));
    }

    /// After a completion, a sender sharing a link whose pieces take 500
    /// us or more on the wire, with another piece of its own still on the
    /// wire, waits a time of its own, under 3 pieces' time, before it
    /// posts again; on a faster link, with no rate known, alone, or with
    /// nothing else on the wire, it posts at once.
    #[test]
    fn waits_a_time_of_its_own_after_a_completion_only_where_pieces_are_long_on_the_wire() {
        // (rate in bytes per second, the weights sharing the port, pieces
        // still out after the completion, whether it waits): a 4 KiB piece
        // takes 819 us at 5 MB/s, 41 us at 100 MB/s.
        for (rate, sharing, still_out, waits) in [
            (Some(5_000_000u64), 3, 1, true),
            (Some(5_000_000), 3, 0, false),
            (Some(5_000_000), 1, 1, false),
            (Some(100_000_000), 3, 1, false),
            (None, 3, 1, false),
        ] {
            let at = format!("{rate:?}, sharing {sharing}, {still_out} still out");
            let mut w = DelayWindow::new(DelayWindowConfig {
                initial_window: 4 * PIECE,
                additive_increase: 1,
                ..config()
            })
            .unwrap();
            w.set_link_rate(rate);
            w.set_sharing_weight(sharing);
            let mut now = Nanos::from_secs(10);
            let mut waited = Vec::new();
            for _ in 0..64 {
                // Between quiet times (every 500 ms).
                if now.0 % 500_000_000 < 10_000_000 {
                    now = now + Nanos::from_millis(10);
                }
                let sent = now;
                for _ in 0..=still_out {
                    w.on_sent(PIECE, sent);
                }
                now = now + Nanos::from_micros(200);
                w.on_completed(PIECE, sent, now);
                match w.admit(still_out * PIECE, PIECE, now) {
                    Admit::Now => waited.push(0),
                    Admit::At(t) => waited.push((t - now).0),
                    Admit::AfterCompletion => panic!("{at}: the window has room"),
                }
                for _ in 0..still_out {
                    w.on_completed(PIECE, sent, now);
                }
                now = now + Nanos::from_millis(3);
            }
            let wire = PIECE * 1_000_000_000 / rate.unwrap_or(1 << 40);
            let longest = waited.iter().copied().max().unwrap();
            if waits {
                assert!(longest < 3 * wire, "{at}: waited {longest} ns");
                assert!(longest > wire, "{at}: waited at most {longest} ns");
                let distinct: std::collections::HashSet<_> = waited.iter().collect();
                assert!(distinct.len() > 32, "{at}: waits {waited:?}");
            } else {
                assert_eq!(longest, 0, "{at}: waited {longest} ns");
            }
        }
    }

    #[test]
    fn a_faster_link_keeps_the_same_bytes_queued() {
        // Pieces that take `delay` while the queue ahead of them is
        // `queue` long: the window shrinks once the queue passes the
        // allowance, which is shorter on the faster link.
        let shrinks = |rate: u64, queue_us: u64| {
            let mut w = DelayWindow::new(DelayWindowConfig {
                quiet_every: Nanos::ZERO,
                ..DelayWindowConfig::for_piece(PIECE)
            })
            .unwrap();
            w.set_link_rate(Some(rate));
            let mut now = Nanos::ZERO;
            run(&mut w, &mut now, Nanos::from_micros(100), 20);
            let before = w.window();
            run(&mut w, &mut now, Nanos::from_micros(100 + queue_us), 20);
            w.window() < before
        };
        // 600 us of queue: 15 KB at 25 MB/s (over 10 KiB), 3.75 KB at
        // 6.25 MB/s (under).
        assert!(shrinks(25_000_000, 600));
        assert!(!shrinks(6_250_000, 600));
    }

    #[test]
    fn a_new_weight_applies_from_the_next_completion_and_a_bad_one_is_refused() {
        let mut w = DelayWindow::new(config()).unwrap();
        w.set_weight(4).unwrap();
        w.on_sent(PIECE, Nanos::ZERO);
        w.on_completed(PIECE, Nanos::ZERO, Nanos::from_micros(100));
        // A window of one piece grows by 4 x 1/8 piece for a window's worth.
        assert_eq!(w.window(), PIECE + 4 * PIECE / 8);
        assert!(w.set_weight(0).is_err());
        assert!(w.set_weight(MAX_WEIGHT + 1).is_err());
        assert_eq!(w.config().weight, 4);
    }

    #[test]
    fn grows_by_the_increase_times_the_weight_per_window_of_bytes() {
        for weight in [1u32, 4] {
            let mut w = DelayWindow::new(DelayWindowConfig { weight, ..config() }).unwrap();
            let mut now = Nanos::ZERO;
            // One piece completed, as large as the window: a whole round
            // trip's worth of bytes under the target.
            run(&mut w, &mut now, Nanos::from_micros(100), 1);
            assert_eq!(w.window(), PIECE + u64::from(weight) * PIECE / 8);
            assert_eq!(w.base_delay(), Some(Nanos::from_micros(100)));
            assert_eq!(w.target_delay(), Some(Nanos::from_micros(200)));
        }
        // A window of four pieces grows by about an eighth of a piece per
        // four pieces completed, not per piece.
        let mut w = DelayWindow::new(DelayWindowConfig {
            initial_window: 4 * PIECE,
            ..config()
        })
        .unwrap();
        let mut now = Nanos::ZERO;
        run(&mut w, &mut now, Nanos::from_micros(100), 4);
        let grown = w.window() - 4 * PIECE;
        assert!((PIECE / 8 - 8..=PIECE / 8).contains(&grown), "grew {grown}");
    }

    #[test]
    fn shrinks_in_proportion_to_the_excess_and_at_most_by_half_per_window() {
        let mut w = DelayWindow::new(DelayWindowConfig {
            filter: 2,
            ..config()
        })
        .unwrap();
        let mut now = Nanos::ZERO;
        run(&mut w, &mut now, Nanos::from_micros(100), 1);
        let before = w.window();
        // 250 us against a 200 us target, the filter's two samples both
        // late: a whole window's cut is 0.8 x 50/250 = 16%; a piece of
        // `PIECE` bytes applies PIECE/before of it.
        let late = |w: &mut DelayWindow, now: &mut Nanos, delay: u64| {
            w.on_sent(PIECE, *now);
            w.on_completed(PIECE, *now, *now + Nanos::from_micros(delay));
            *now = *now + Nanos::from_micros(delay);
        };
        late(&mut w, &mut now, 250);
        assert_eq!(
            w.window(),
            before + (PIECE / 8) * PIECE / before,
            "one late piece after a fast one is filtered out: the window grows"
        );
        let before = w.window();
        late(&mut w, &mut now, 250);
        // 16% of a window per window of bytes: 16% of a piece per piece.
        assert_eq!(w.window(), before - PIECE * 16 / 100);
        // A huge excess takes at most half a window per window of bytes.
        let mut w = DelayWindow::new(DelayWindowConfig {
            filter: 1,
            ..config()
        })
        .unwrap();
        let mut now = Nanos::ZERO;
        run(&mut w, &mut now, Nanos::from_micros(100), 1);
        let before = w.window();
        complete(&mut w, &mut now, before, before, Nanos::from_millis(50));
        assert_eq!(w.window(), before / 2);
    }

    #[test]
    fn judges_each_piece_on_the_lowest_of_the_last_few() {
        let mut w = DelayWindow::new(DelayWindowConfig {
            filter: 2,
            ..config()
        })
        .unwrap();
        let mut now = Nanos::ZERO;
        run(&mut w, &mut now, Nanos::from_micros(100), 50);
        // One slow piece (a descheduled thread) after a fast one: the
        // lowest of the last two is under the target, the window grows.
        let before = w.window();
        run(&mut w, &mut now, Nanos::from_micros(900), 1);
        assert!(w.window() > before, "one late piece is not a queue");
        // A second one: both are late, the window shrinks.
        let before = w.window();
        run(&mut w, &mut now, Nanos::from_micros(900), 1);
        assert!(w.window() < before, "two late pieces are");
        // With a filter of one (the default), the first late piece is
        // enough.
        let mut w = window();
        let mut now = Nanos::ZERO;
        run(&mut w, &mut now, Nanos::from_micros(100), 50);
        let before = w.window();
        run(&mut w, &mut now, Nanos::from_micros(900), 1);
        assert!(w.window() < before);
    }

    #[test]
    fn many_small_pieces_and_few_large_ones_count_the_same() {
        // Two senders see the same delays for the same bytes, one in whole
        // pieces and one in quarter pieces: their windows move alike, so a
        // sender that completes more pieces per round trip (a free one next
        // to a capped one) is not favoured.
        let mut whole = DelayWindow::new(DelayWindowConfig {
            initial_window: 8 * PIECE,
            ..config()
        })
        .unwrap();
        let mut quarters = whole.clone();
        let (mut a, mut b) = (Nanos::ZERO, Nanos::ZERO);
        for round in 0..200 {
            let delay = Nanos::from_micros(if round % 3 == 0 { 400 } else { 150 });
            // A round trip's worth in whole pieces, the same bytes for both.
            let total = (whole.window() / PIECE).max(1) * PIECE;
            complete(&mut whole, &mut a, PIECE, total, delay);
            complete(&mut quarters, &mut b, PIECE / 4, total, delay);
        }
        let (x, y) = (whole.window() as f64, quarters.window() as f64);
        assert!((x / y - 1.0).abs() < 0.05, "{x} vs {y}");
    }

    #[test]
    fn windows_settle_in_proportion_to_their_weights() {
        // Two senders on one queue: the delay is over the target whenever
        // their windows add up to more than the port holds at the target.
        let mut light = window();
        let mut heavy = DelayWindow::new(DelayWindowConfig {
            weight: 3,
            ..config()
        })
        .unwrap();
        let (mut a, mut b) = (Nanos::ZERO, Nanos::ZERO);
        let capacity = 24 * PIECE;
        let mut ratios = Vec::new();
        for round in 0..4_000 {
            let over = light.window() + heavy.window() > capacity;
            let delay = Nanos::from_micros(if over { 300 } else { 100 });
            let (l, h) = (light.window(), heavy.window());
            complete(&mut light, &mut a, PIECE / 4, l.max(PIECE / 4), delay);
            complete(&mut heavy, &mut b, PIECE / 4, h.max(PIECE / 4), delay);
            if round >= 2_000 {
                ratios.push(heavy.window() as f64 / light.window() as f64);
            }
        }
        let mean = ratios.iter().sum::<f64>() / ratios.len() as f64;
        assert!((mean / 3.0 - 1.0).abs() < 0.05, "heavy / light = {mean}");
    }

    /// Keeps posting pieces as `w` admits them, each completing `rtt`
    /// after its post, for `rounds` round trips starting at `now`; returns
    /// the pieces posted per round trip.
    /// Each piece takes `rtt` and up to a tenth more (as real completions
    /// do), so that nothing locks to the round trips' phase.
    fn pieces_per_round_trip(w: &mut DelayWindow, now: &mut Nanos, rtt: Nanos, rounds: u64) -> f64 {
        pieces_per_round_trip_spread(w, now, rtt, rounds, 10)
    }

    /// As [`pieces_per_round_trip`], each piece taking `rtt` and up to
    /// `spread` percent more.
    fn pieces_per_round_trip_spread(
        w: &mut DelayWindow,
        now: &mut Nanos,
        rtt: Nanos,
        rounds: u64,
        spread: u64,
    ) -> f64 {
        // (posted, completes)
        let mut in_nic: Vec<(Nanos, Nanos)> = Vec::new();
        let mut sent = 0u64;
        let step = Nanos(rtt.0 / 100);
        let end = *now + Nanos(rtt.0 * rounds);
        while *now < end {
            while let Some(pos) = in_nic.iter().position(|&(_, done)| done <= *now) {
                let (posted, _) = in_nic.remove(pos);
                w.on_completed(PIECE, posted, *now);
            }
            while w.admit(in_nic.len() as u64 * PIECE, PIECE, *now) == Admit::Now {
                w.on_sent(PIECE, *now);
                let extra = splitmix64(sent) % (rtt.0 * spread / 100).max(1);
                in_nic.push((*now, *now + rtt + Nanos(extra)));
                sent += 1;
            }
            *now = *now + step;
        }
        sent as f64 / rounds as f64
    }

    #[test]
    fn a_gain_scales_the_growth_and_lowers_the_floor_as_a_weight_does() {
        let one = crate::share::GAIN_ONE;
        for (gain, growth, floor) in [
            (one, PIECE / 8, PIECE / 4),
            (2 * one, PIECE / 4, PIECE / 4),
            (one / 2, PIECE / 16, PIECE / 8),
        ] {
            let mut w = window();
            w.set_gain(gain);
            assert_eq!(w.gain(), gain);
            let mut now = Nanos::ZERO;
            // One piece as large as the window: a round trip's worth of
            // bytes under the target.
            run(&mut w, &mut now, Nanos::from_micros(100), 1);
            assert_eq!(w.window(), PIECE + growth, "gain {gain}");
            // Far over the target for long: down to the floor.
            for _ in 0..200 {
                run(&mut w, &mut now, Nanos::from_millis(2), 1);
            }
            assert_eq!(w.window(), floor, "gain {gain}");
        }
        // 0 counts as the least gain, never as a window of 0.
        let mut w = window();
        w.set_gain(0);
        assert_eq!(w.gain(), 1);
    }

    /// The port's windows share their growth: a window told that weights
    /// adding up to 4 share its port (its own weight 2 among them) grows by
    /// 2/4 of an increase; its cuts and floor are its own.
    #[test]
    fn the_weights_sharing_the_port_divide_the_growth() {
        // Growth: increase (512 B) x weight / sharing.
        for (sharing, weight, growth) in [(0, 1, 512), (1, 1, 512), (4, 2, 256), (8, 1, 64)] {
            let mut w = DelayWindow::new(DelayWindowConfig { weight, ..config() }).unwrap();
            w.set_sharing_weight(sharing);
            assert_eq!(w.sharing_weight(), sharing.max(1));
            let mut now = Nanos::ZERO;
            run(&mut w, &mut now, Nanos::from_micros(100), 1);
            assert_eq!(
                w.window(),
                PIECE + growth,
                "sharing {sharing}, weight {weight}"
            );
            for _ in 0..200 {
                run(&mut w, &mut now, Nanos::from_millis(2), 1);
            }
            assert_eq!(
                w.window(),
                PIECE / 4 * u64::from(weight),
                "the floor is its own"
            );
        }
    }

    #[test]
    fn keeps_at_least_the_minimum_and_sends_its_fraction_of_a_piece() {
        for (weight, floor) in [(1u32, PIECE / 64), (4, PIECE / 16)] {
            let mut w = DelayWindow::new(DelayWindowConfig {
                min_window: PIECE / 64,
                weight,
                base_period: Nanos::from_secs(1_000),
                ..config()
            })
            .unwrap();
            let mut now = Nanos::ZERO;
            run(&mut w, &mut now, Nanos::from_micros(100), 1);
            for _ in 0..100 {
                run(&mut w, &mut now, Nanos::from_millis(10), 1);
            }
            // A sender of weight w keeps w times the minimum.
            assert_eq!(w.window(), floor);
            // One piece in flight: the next waits for its completion.
            assert_eq!(w.admit(PIECE, PIECE, now), Admit::AfterCompletion);
            // Nothing in flight and a round trip that rounds down: not
            // before the next one that rounds up.
            let mut waited = false;
            for _ in 0..64 {
                if let Admit::At(at) = w.admit(0, PIECE, now) {
                    assert!(at > now);
                    assert_eq!(w.admit(0, PIECE, at), Admit::Now);
                    waited = true;
                    break;
                }
                now = now + w.smoothed_delay().unwrap();
            }
            assert!(waited, "a window under one piece waits between pieces");
            // Pieces still taking 10 ms: the window stays at its floor and
            // moves floor/piece of a piece per round trip.
            let srtt = w.smoothed_delay().unwrap();
            let per_rtt = pieces_per_round_trip(&mut w, &mut now, srtt, 4096);
            let want = floor as f64 / PIECE as f64;
            assert!(
                (per_rtt / want - 1.0).abs() < 0.1,
                "weight {weight}: {per_rtt} pieces per round trip, want {want}"
            );
        }
    }

    /// A window of 0.6 pieces, pieces whose time varies from one to three
    /// round trips: a piece that could not go when it was due (the one
    /// before had not completed) goes as soon as it can, and the next is
    /// still due on time, so the sender moves its window's worth per
    /// (average) round trip.
    #[test]
    fn a_window_under_a_piece_moves_its_share_when_round_trips_vary() {
        // Held at 0.6 pieces: it may grow no further.
        let mut w = DelayWindow::new(DelayWindowConfig {
            initial_window: 6 * PIECE / 10,
            min_window: 1,
            max_window: 6 * PIECE / 10,
            target_ratio_ppm: 10_000_000,
            ..config()
        })
        .unwrap();
        let mut now = Nanos::ZERO;
        let rtt = Nanos::from_millis(1);
        let per_rtt = pieces_per_round_trip_spread(&mut w, &mut now, rtt, 2000, 200);
        // Pieces take 2 round trips on average: 0.6 / 2 pieces per `rtt`.
        let want = 0.6 / 2.0;
        assert!(
            (per_rtt / want - 1.0).abs() < 0.05,
            "{per_rtt} pieces per round trip, want {want}"
        );
    }

    #[test]
    fn a_window_that_ends_inside_a_piece_moves_that_fraction_per_round_trip() {
        // A window of 2.5 pieces, pieces that take 1 ms: 2.5 pieces per
        // millisecond, not 2 and not 3.
        for (window, want) in [
            (5 * PIECE / 2, 2.5),
            (PIECE / 3, 1.0 / 3.0),
            (21 * PIECE / 4, 5.25),
        ] {
            let mut w = DelayWindow::new(DelayWindowConfig {
                initial_window: window,
                min_window: 1,
                additive_increase: 1,
                // Every piece is under the target: the window does not
                // shrink, and grows by a byte per piece.
                target_ratio_ppm: 10_000_000,
                ..config()
            })
            .unwrap();
            let mut now = Nanos::ZERO;
            let per_rtt = pieces_per_round_trip(&mut w, &mut now, Nanos::from_millis(1), 400);
            // The window grew by a byte or a few per piece on the way.
            let want = want * (window + w.window()) as f64 / (2 * window) as f64;
            assert!(
                (per_rtt / want - 1.0).abs() < 0.05,
                "window {window}: {per_rtt} pieces per round trip, want {want}"
            );
        }
    }

    #[test]
    fn posts_nothing_for_twice_the_target_at_the_start_of_every_period() {
        let mut w = DelayWindow::new(DelayWindowConfig {
            target_floor: Nanos::ZERO,
            ..DelayWindowConfig::for_piece(PIECE)
        })
        .unwrap();
        let mut now = Nanos::ZERO;
        run(&mut w, &mut now, Nanos::from_micros(100), 24);
        // Target 200 us: quiet for the first 400 us of every 500 ms, on
        // the clock every sender shares, whatever is in flight; then each
        // sender starts again at a point of its own within one round trip
        // (100 us), which differs between senders and between periods.
        let period = Nanos::from_millis(500);
        let mut turns = Vec::new();
        for seed in 0..8 {
            let mut w = w.clone();
            w.config.seed = seed;
            for k in 1..4 {
                let start = Nanos(period.0 * k);
                let end = start + Nanos::from_micros(400);
                let Admit::At(resume) = w.admit(0, PIECE, start) else {
                    panic!("no quiet time at {start}");
                };
                assert!(resume >= end && resume < end + Nanos::from_micros(100));
                assert_eq!(w.admit(PIECE, PIECE, resume - Nanos(1)), Admit::At(resume));
                assert_eq!(w.admit(0, PIECE, resume), Admit::Now);
                assert_eq!(w.admit(0, PIECE, start - Nanos(1)), Admit::Now);
                turns.push(resume - start);
            }
        }
        turns.sort();
        turns.dedup();
        assert!(turns.len() >= 20, "senders start again apart: {turns:?}");
        // Before the path's delay is known there is no target, so no quiet.
        assert_eq!(window().admit(0, PIECE, period), Admit::Now);
    }

    #[test]
    fn a_completion_found_late_by_the_host_is_judged_on_the_nics_time() {
        let mut w = window();
        let mut now = Nanos::ZERO;
        run(&mut w, &mut now, Nanos::from_micros(100), 24);
        assert_eq!(w.target_delay(), Some(Nanos::from_micros(200)));
        // Every piece is found 1 ms after it was posted, 900 us of which
        // its thread waited for a CPU: 100 us at the NIC, the window grows.
        let mut late = w.clone();
        let before = w.window();
        for _ in 0..16 {
            late.on_sent(PIECE, now);
            late.on_completed_late(
                PIECE,
                now,
                now + Nanos::from_millis(1),
                Nanos::from_micros(900),
            );
            w.on_sent(PIECE, now);
            w.on_completed(PIECE, now, now + Nanos::from_millis(1));
            now = now + Nanos::from_millis(1);
        }
        assert!(late.window() > before, "{} <= {before}", late.window());
        assert!(
            w.window() < before,
            "without the host's delay taken off it shrinks"
        );
        // More taken off than the whole sample: judged at the path's own
        // delay, which the host's delay never lowers.
        late.on_sent(PIECE, now);
        late.on_completed_late(
            PIECE,
            now,
            now + Nanos::from_micros(150),
            Nanos::from_millis(5),
        );
        assert_eq!(late.base_delay(), Some(Nanos::from_micros(100)));
    }

    #[test]
    fn a_sender_that_learnt_a_long_delay_still_posts_in_every_period() {
        // Its first pieces waited 300 ms behind a queue that drained: its
        // target (600 ms) and its round trip are longer than the quiet
        // times' period (500 ms), and its window is at its floor.
        let mut w = DelayWindow::new(DelayWindowConfig {
            target_floor: Nanos::ZERO,
            ..DelayWindowConfig::for_piece(PIECE)
        })
        .unwrap();
        let mut now = Nanos::ZERO;
        run(&mut w, &mut now, Nanos::from_millis(300), 8);
        assert!(w.target_delay().unwrap() > Nanos::from_millis(500));
        let period = Nanos::from_millis(500);
        for k in 4..40 {
            let start = Nanos(period.0 * k);
            // Quiet for at most half of the period, then it may post.
            let resume = match w.admit(0, PIECE, start) {
                Admit::At(at) => at,
                other => panic!("no quiet time at {start}: {other:?}"),
            };
            assert!(
                resume - start <= Nanos(period.0 / 2),
                "quiet until {resume} from {start}"
            );
            assert_eq!(w.admit(0, PIECE, resume), Admit::Now);
        }
    }

    #[test]
    fn by_default_keeps_a_quarter_piece_and_a_target_of_at_least_the_floor() {
        let mut w = DelayWindow::new(DelayWindowConfig {
            quiet_every: Nanos::ZERO,
            base_period: Nanos::from_secs(1_000),
            ..DelayWindowConfig::for_piece(PIECE)
        })
        .unwrap();
        let mut now = Nanos::ZERO;
        run(&mut w, &mut now, Nanos::from_micros(100), 1);
        // 100 us of path: the target's queue is the floor, not 100 us.
        assert_eq!(w.target_delay(), Some(Nanos::from_micros(900)));
        // 850 us is under the target: the window grows.
        let before = w.window();
        run(&mut w, &mut now, Nanos::from_micros(850), 1);
        assert!(w.window() > before);
        // However long the pieces take, a sender keeps a quarter of a
        // piece: one piece every four round trips.
        run(&mut w, &mut now, Nanos::from_millis(10), 100);
        assert_eq!(w.window(), PIECE / 4);
        let srtt = w.smoothed_delay().unwrap();
        let per_rtt = pieces_per_round_trip(&mut w, &mut now, srtt, 400);
        assert!(
            (per_rtt - 0.25).abs() < 0.02,
            "{per_rtt} pieces per round trip"
        );
    }

    #[test]
    fn one_large_piece_does_not_make_the_window_deaf_to_the_usual_ones() {
        // A request sent whole of 4 pieces, then pieces of the usual size
        // that meet a standing queue (2 ms each): their samples count
        // again once the large piece is out of memory, and the window
        // shrinks.
        let mut w = window();
        let mut now = Nanos::ZERO;
        run(&mut w, &mut now, Nanos::from_micros(100), 20);
        let before = w.window();
        w.on_sent(4 * PIECE, now);
        w.on_completed(4 * PIECE, now, now + Nanos::from_micros(100));
        now = now + Nanos::from_micros(100);
        run(
            &mut w,
            &mut now,
            Nanos::from_millis(2),
            2 * PIECE_MEMORY as usize + 8,
        );
        assert!(
            w.window() < before / 2,
            "the usual pieces' delays are heard: {before} -> {}",
            w.window()
        );
    }

    #[test]
    fn a_piece_larger_than_the_window_goes_alone_whenever_the_sender_polls() {
        // A window a few bytes over 4 pieces, and a request sent whole of
        // 4.5 pieces: with nothing in flight it goes at once, at any time
        // (not only in the round trips that round the window up, which a
        // late sender would miss); beside a piece in flight it waits.
        let mut w = DelayWindow::new(DelayWindowConfig {
            initial_window: 4 * PIECE,
            additive_increase: 1,
            quiet_every: Nanos::ZERO,
            ..config()
        })
        .unwrap();
        let mut now = Nanos::ZERO;
        run(&mut w, &mut now, Nanos::from_micros(100), 1);
        let big = 4 * PIECE + PIECE / 2;
        assert!(w.window() > 4 * PIECE && w.window() < big);
        for late in 0..50 {
            let at = now + Nanos::from_micros(37 * late);
            assert_eq!(w.admit(0, big, at), Admit::Now, "{late}");
        }
        assert_ne!(w.admit(PIECE, big, now), Admit::Now);
    }

    #[test]
    fn the_piece_floor_holds_one_piece_whatever_the_delay_and_the_gain() {
        let mut w = DelayWindow::new(config()).unwrap();
        w.set_gain(250_000);
        let mut now = Nanos::ZERO;
        // A standing queue: every piece takes ten times the path's delay.
        let run = |w: &mut DelayWindow, now: &mut Nanos, n: u32| {
            for i in 0..n {
                let delay = if i == 0 { 100 } else { 1_000 };
                w.on_sent(PIECE, *now);
                w.on_completed(PIECE, *now, *now + Nanos::from_micros(delay));
                *now = *now + Nanos::from_micros(delay);
            }
        };
        run(&mut w, &mut now, 200);
        assert!(
            w.window() < PIECE / 4,
            "gain 1/4 lowers the floor: {}",
            w.window()
        );
        w.signals(&Signals {
            piece_floor: Some(true),
            ..Signals::default()
        });
        assert!(w.piece_floor());
        assert_eq!(w.window(), PIECE, "raised to one piece at once");
        run(&mut w, &mut now, 200);
        assert_eq!(w.window(), PIECE, "held there by the floor");
        assert_eq!(
            w.admit(0, PIECE, now),
            Admit::Now,
            "no pacing under a piece"
        );
        w.signals(&Signals {
            piece_floor: Some(false),
            ..Signals::default()
        });
        run(&mut w, &mut now, 200);
        assert!(
            w.window() < PIECE / 4,
            "taken back, it shrinks: {}",
            w.window()
        );
    }

    #[test]
    fn admits_while_the_window_has_room() {
        let mut w = DelayWindow::new(DelayWindowConfig {
            initial_window: 4 * PIECE,
            additive_increase: 1,
            ..config()
        })
        .unwrap();
        let mut now = Nanos::ZERO;
        run(&mut w, &mut now, Nanos::from_micros(100), 1);
        let win = w.window();
        assert!(win > 4 * PIECE && win < 4 * PIECE + 8);
        assert_eq!(w.admit(0, PIECE, now), Admit::Now);
        assert_eq!(w.admit(3 * PIECE, PIECE, now), Admit::Now);
        // A fifth piece: the window ends a few bytes into it, so it goes
        // only in the few round trips that round the window up.
        w.on_sent(PIECE, now);
        assert!(matches!(w.admit(4 * PIECE, PIECE, now), Admit::At(_)));
        // A sixth never fits: only a completion makes room.
        assert_eq!(w.admit(5 * PIECE, PIECE, now), Admit::AfterCompletion);
    }

    #[test]
    fn ignores_short_pieces_and_relearns_the_base_each_period() {
        let mut w = window();
        let mut now = Nanos::ZERO;
        run(&mut w, &mut now, Nanos::from_micros(300), 5);
        // A 16 B piece's fast completion says nothing of the queue.
        w.on_completed(16, now, now + Nanos::from_micros(10));
        assert_eq!(w.base_delay(), Some(Nanos::from_micros(300)));
        // A longer path (say, rerouted) is learnt within two periods.
        run(&mut w, &mut now, Nanos::from_micros(500), 200_000);
        assert_eq!(w.base_delay(), Some(Nanos::from_micros(500)));
    }

    #[test]
    fn tells_the_bytes_it_judged_and_those_over_its_target() {
        let mut w = window();
        let mut now = Nanos::ZERO;
        // Path 100 us, target 200 us: ten pieces on time.
        run(&mut w, &mut now, Nanos::from_micros(100), 10);
        let v = w.take_verdicts();
        assert_eq!(v.judged, 10 * PIECE);
        assert_eq!(v.over_target, 0);
        assert_eq!(w.take_verdicts(), Verdicts::default(), "taken once");
        // A queue: four pieces at 500 us, one short piece (not judged).
        run(&mut w, &mut now, Nanos::from_micros(500), 4);
        w.on_completed(16, now, now + Nanos::from_millis(5));
        let v = w.take_verdicts();
        assert_eq!((v.judged, v.over_target), (4 * PIECE, 4 * PIECE));
    }

    #[test]
    fn refuses_settings_out_of_range() {
        let ok = DelayWindowConfig::for_piece(PIECE);
        assert!(ok.validate().is_ok());
        for bad in [
            DelayWindowConfig {
                min_window: 0,
                ..ok.clone()
            },
            DelayWindowConfig {
                max_window: 1,
                ..ok.clone()
            },
            DelayWindowConfig {
                initial_window: ok.max_window + 1,
                ..ok.clone()
            },
            DelayWindowConfig {
                additive_increase: 0,
                ..ok.clone()
            },
            DelayWindowConfig {
                max_decrease_ppm: 1_000_000,
                ..ok.clone()
            },
            DelayWindowConfig {
                decrease_ppm: 1_000_001,
                ..ok.clone()
            },
            DelayWindowConfig {
                base_period: Nanos::ZERO,
                ..ok.clone()
            },
            DelayWindowConfig {
                weight: 0,
                ..ok.clone()
            },
            DelayWindowConfig {
                weight: MAX_WEIGHT + 1,
                ..ok.clone()
            },
            DelayWindowConfig {
                filter: 0,
                ..ok.clone()
            },
            DelayWindowConfig {
                filter: MAX_FILTER + 1,
                ..ok.clone()
            },
        ] {
            let err = DelayWindow::new(bad).unwrap_err();
            assert!(matches!(err, ConfigError::Window { .. }), "{err}");
        }
        // A zero-byte piece still gives valid defaults.
        assert!(DelayWindowConfig::for_piece(0).validate().is_ok());
    }
}
