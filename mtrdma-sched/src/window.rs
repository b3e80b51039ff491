//! Windows: how many bytes one sender may have in the NIC, decided from
//! the completion times of its own pieces.
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
//! target, whatever their number, and share it fairly (additive increase,
//! multiplicative decrease). A window smaller than one piece is kept by
//! pacing: one piece every `round trip x piece / window`.
//!
//! The target is the path's own delay plus a queue allowance: a share of
//! the path's delay ([`DelayWindowConfig::target_ratio_ppm`]; the path's
//! delay for a piece includes the time the piece takes on the wire, so on a
//! slower link the allowance is longer in time but about the same in
//! bytes), and at least [`DelayWindowConfig::target_floor`] (400 us by
//! default), which absorbs the noise of a sender that sleeps between its
//! completions on a busy host. No link rate is entered by hand.
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
//! // The queue builds up: every piece now takes 1 ms, over the target
//! // (the path's 100 us and a queue of at least 400 us).
//! assert_eq!(w.target_delay(), Some(Nanos::from_micros(500)));
//! for _ in 0..50 {
//!     w.on_sent(4096, now);
//!     w.on_completed(4096, now, now + Nanos::from_millis(1));
//!     now = now + Nanos::from_millis(1);
//! }
//! assert!(w.window() < grown / 4, "a standing queue shrinks it");
//! ```

use std::fmt;

use crate::error::ConfigError;
use crate::policy::PPM;
use crate::time::Nanos;

/// Whether a piece may go into the NIC now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    /// It may go now.
    Now,
    /// Not before this time (pacing), unless a completion changes that.
    At(Nanos),
    /// Not until a piece in flight completes.
    AfterCompletion,
}

/// A bound on the bytes one sender keeps in the NIC, told what happens to
/// its pieces.
///
/// The engine calls [`admit`](Self::admit) before posting a piece,
/// [`on_sent`](Self::on_sent) when it posts one and
/// [`on_completed`](Self::on_completed) when its completion is polled. The
/// window knows nothing of verbs; implement it to plug in a rule of your
/// own.
pub trait Window: fmt::Debug + Send {
    /// Whether a piece of `bytes` may be posted at `now` while `in_flight`
    /// bytes of this sender are in the NIC.
    fn admit(&self, in_flight: u64, bytes: u64, now: Nanos) -> Admit;

    /// A piece of `bytes` was posted at `now`.
    fn on_sent(&mut self, bytes: u64, now: Nanos);

    /// A piece of `bytes` posted at `sent_at` completed at `now`.
    fn on_completed(&mut self, bytes: u64, sent_at: Nanos, now: Nanos);

    /// The window now, in bytes.
    fn window(&self) -> u64;
}

/// Settings of a [`DelayWindow`]. [`DelayWindowConfig::for_piece`] gives
/// defaults for a piece size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DelayWindowConfig {
    /// The window at the start, in bytes. Default: one piece.
    pub initial_window: u64,
    /// The smallest window. Below one piece it is kept by pacing: one
    /// piece every `round trip x piece / window`. Default: a quarter of a
    /// piece. Pacing reads the round trip of a sender that sleeps between
    /// pieces, which on a loaded host is mostly the time it takes to be
    /// woken: windows far under a piece then starve their senders for no
    /// queue at all (at 1/64 of a piece, four bulk senders moved under 1%
    /// of the link on the emulated one).
    pub min_window: u64,
    /// The largest window. Default: 256 pieces.
    pub max_window: u64,
    /// Bytes added per round trip while the delay is under the target.
    /// Default: 1/8 of a piece. Senders sharing a port overshoot the
    /// target by about their number times this before they all back off.
    pub additive_increase: u64,
    /// The target queueing delay as a share of the path's own delay, in
    /// parts per million. Default 1,000,000 (as long again as the path's
    /// own delay).
    pub target_ratio_ppm: u32,
    /// The target queueing delay is at least this. Default 400 us: a sender
    /// woken by completion events on a busy host sees its pieces complete
    /// hundreds of microseconds late now and then with no queue at all,
    /// and a target under that noise shrinks every window to its minimum.
    /// On hardware with senders that do not sleep (delays of a few
    /// microseconds), lower it: Swift's targets are tens of microseconds.
    pub target_floor: Nanos,
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
            target_ratio_ppm: 1_000_000,
            target_floor: Nanos::from_micros(400),
            decrease_ppm: 800_000,
            max_decrease_ppm: 500_000,
            base_period: Nanos::from_secs(1),
            quiet_every: Nanos::from_millis(500),
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
        if u64::from(self.decrease_ppm) > PPM {
            return bad("decrease_ppm must be at most 1,000,000");
        }
        if u64::from(self.max_decrease_ppm) >= PPM {
            return bad("max_decrease_ppm must be below 1,000,000 (a window never drops to 0)");
        }
        if self.base_period == Nanos::ZERO {
            return bad("base_period must be longer than 0");
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
    /// Lowest sample of the round in progress, and when it ends.
    round_min: u64,
    round_end: Nanos,
    /// The largest piece seen: samples of pieces under half of it are not
    /// used (a short piece's delay says less about the queue).
    largest: u64,
    last_sent_at: Nanos,
    last_sent_bytes: u64,
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
            round_min: u64::MAX,
            round_end: Nanos::ZERO,
            largest: 0,
            last_sent_at: Nanos::ZERO,
            last_sent_bytes: 0,
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

    /// The delay above which the window shrinks.
    pub fn target_delay(&self) -> Option<Nanos> {
        let base = self.base_delay()?.0;
        let queue = mul_ppm(base, self.config.target_ratio_ppm).max(self.config.target_floor.0);
        Some(Nanos(base.saturating_add(queue)))
    }

    /// The time between pieces that keeps a window smaller than the last
    /// piece (0 when the window holds it).
    fn pacing_gap(&self) -> u64 {
        if self.last_sent_bytes <= self.window {
            return 0;
        }
        let gap = u128::from(self.srtt) * u128::from(self.last_sent_bytes)
            / u128::from(self.window.max(1));
        u64::try_from(gap).unwrap_or(u64::MAX)
    }

    /// When this sender may post again if `now` falls in the quiet time of
    /// its period or before its own start after it: twice the target
    /// delay from the period's start, then a point of its own (from its
    /// seed and the period) within one round trip or pacing gap.
    #[inline]
    fn quiet_until(&self, now: Nanos) -> Option<Nanos> {
        let every = self.config.quiet_every.0;
        if every == 0 {
            return None;
        }
        let target = self.target_delay()?.0;
        let start = now.0 - now.0 % every;
        let end = start.saturating_add(target.saturating_mul(2));
        let spread = self.srtt.max(self.pacing_gap());
        let turn =
            splitmix64(self.config.seed ^ (now.0 / every).wrapping_mul(0x9e37_79b9_7f4a_7c15));
        let offset = (u128::from(spread) * u128::from(turn >> 32)) >> 32;
        let resume = end.saturating_add(offset as u64);
        (now.0 < resume).then_some(Nanos(resume))
    }

    /// One round's verdict on its lowest sample.
    fn decide(&mut self, sample: u64) {
        let Some(target) = self.target_delay().map(|t| t.0) else {
            return;
        };
        let c = &self.config;
        if sample <= target {
            self.window = self
                .window
                .saturating_add(c.additive_increase)
                .min(c.max_window);
        } else {
            // Shrink by decrease x (sample - target) / sample, at most
            // max_decrease (Swift's multiplicative decrease).
            let excess = u128::from(sample - target) * u128::from(c.decrease_ppm)
                / u128::from(sample.max(1));
            let cut = (excess as u64).min(u64::from(c.max_decrease_ppm));
            let kept = u128::from(self.window) * u128::from(PPM - cut) / u128::from(PPM);
            self.window = (kept as u64).max(c.min_window);
        }
    }
}

impl Window for DelayWindow {
    #[inline]
    fn admit(&self, in_flight: u64, bytes: u64, now: Nanos) -> Admit {
        if let Some(end) = self.quiet_until(now) {
            return Admit::At(end);
        }
        if in_flight == 0 {
            if bytes <= self.window || self.srtt == 0 || self.last_sent_bytes == 0 {
                return Admit::Now;
            }
            // A window under one piece: one piece per `srtt x piece /
            // window`, counted from the last post.
            let at = self.last_sent_at + Nanos(self.pacing_gap());
            return if now >= at { Admit::Now } else { Admit::At(at) };
        }
        if in_flight.saturating_add(bytes) <= self.window {
            Admit::Now
        } else {
            Admit::AfterCompletion
        }
    }

    #[inline]
    fn on_sent(&mut self, bytes: u64, now: Nanos) {
        self.largest = self.largest.max(bytes);
        self.last_sent_at = now;
        self.last_sent_bytes = bytes;
    }

    fn on_completed(&mut self, bytes: u64, sent_at: Nanos, now: Nanos) {
        if bytes.saturating_mul(2) < self.largest {
            return;
        }
        let sample = (now - sent_at).0.max(1);
        self.srtt = if self.srtt == 0 {
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
        self.round_min = self.round_min.min(sample);
        if now >= self.round_end {
            let lowest = std::mem::replace(&mut self.round_min, u64::MAX);
            self.decide(lowest);
            self.round_end = now + Nanos(self.srtt);
        }
    }

    #[inline]
    fn window(&self) -> u64 {
        self.window
    }
}

/// A well-mixed 64-bit hash of `x` (SplitMix64's finaliser).
fn splitmix64(x: u64) -> u64 {
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

    /// The defaults without the target's floor: the target is twice the
    /// path's own delay, which keeps the arithmetic below readable.
    fn window() -> DelayWindow {
        DelayWindow::new(DelayWindowConfig {
            target_floor: Nanos::ZERO,
            ..DelayWindowConfig::for_piece(PIECE)
        })
        .unwrap()
    }

    /// Sends one piece at a time, each taking `delay`, `n` times.
    fn run(w: &mut DelayWindow, now: &mut Nanos, delay: Nanos, n: usize) {
        for _ in 0..n {
            w.on_sent(PIECE, *now);
            w.on_completed(PIECE, *now, *now + delay);
            *now = *now + delay;
        }
    }

    #[test]
    fn grows_by_the_increase_per_round_while_under_the_target() {
        let mut w = window();
        let mut now = Nanos::ZERO;
        run(&mut w, &mut now, Nanos::from_micros(100), 100);
        // One piece per round trip: every sample ends a round.
        assert_eq!(w.window(), PIECE + 100 * (PIECE / 8));
        assert_eq!(w.base_delay(), Some(Nanos::from_micros(100)));
        assert_eq!(w.target_delay(), Some(Nanos::from_micros(200)));
    }

    #[test]
    fn shrinks_in_proportion_to_the_excess_and_at_most_by_half() {
        let mut w = window();
        let mut now = Nanos::ZERO;
        run(&mut w, &mut now, Nanos::from_micros(100), 200);
        let before = w.window();
        // 250 us against a 200 us target: cut by 0.8 x 50/250 = 16%.
        w.on_sent(PIECE, now);
        w.on_completed(PIECE, now, now + Nanos::from_micros(250));
        let expected = before * 84 / 100;
        assert!(
            w.window().abs_diff(expected) <= 1,
            "{} vs {expected}",
            w.window()
        );
        // A huge excess halves it, no more.
        now = now + Nanos::from_millis(1);
        let before = w.window();
        w.on_sent(PIECE, now);
        w.on_completed(PIECE, now, now + Nanos::from_millis(50));
        assert_eq!(w.window(), before / 2);
    }

    #[test]
    fn decides_once_per_round_trip_on_the_lowest_sample() {
        let mut w = window();
        let mut now = Nanos::ZERO;
        run(&mut w, &mut now, Nanos::from_micros(100), 50);
        let before = w.window();
        // The round ends 100 us after the last completion. Pieces that
        // complete before then are only noted; the one that ends the round
        // decides on the lowest delay of all of them, so one slow piece (a
        // descheduled thread) is not taken for a queue.
        for (at, delay) in [(10, 900), (20, 150), (30, 700)] {
            let done = now + Nanos::from_micros(at);
            w.on_completed(PIECE, done - Nanos::from_micros(delay), done);
            assert_eq!(w.window(), before, "no decision inside a round");
        }
        let done = now + Nanos::from_micros(100);
        w.on_completed(PIECE, done - Nanos::from_micros(600), done);
        assert_eq!(w.window(), before + PIECE / 8, "150 us is under the target");
    }

    #[test]
    fn keeps_at_least_the_minimum_and_paces_below_one_piece() {
        let mut w = DelayWindow::new(DelayWindowConfig {
            quiet_every: Nanos::ZERO,
            min_window: PIECE / 64,
            ..DelayWindowConfig::for_piece(PIECE)
        })
        .unwrap();
        let mut now = Nanos::ZERO;
        run(&mut w, &mut now, Nanos::from_micros(100), 1);
        for _ in 0..100 {
            run(&mut w, &mut now, Nanos::from_millis(10), 1);
        }
        assert_eq!(w.window(), PIECE / 64);
        // One piece in flight: the next waits for its completion.
        assert_eq!(w.admit(PIECE, PIECE, now), Admit::AfterCompletion);
        // Nothing in flight: one piece per srtt x 64.
        w.on_sent(PIECE, now);
        let srtt = w.smoothed_delay().unwrap().0;
        match w.admit(0, PIECE, now) {
            Admit::At(at) => assert_eq!(at, now + Nanos(srtt * 64)),
            other => panic!("expected pacing, got {other:?}"),
        }
        assert_eq!(w.admit(0, PIECE, now + Nanos(srtt * 64)), Admit::Now);
    }

    #[test]
    fn posts_nothing_for_twice_the_target_at_the_start_of_every_period() {
        let mut w = window();
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
    fn by_default_keeps_a_quarter_piece_and_a_target_of_at_least_the_floor() {
        let mut w = DelayWindow::new(DelayWindowConfig {
            quiet_every: Nanos::ZERO,
            ..DelayWindowConfig::for_piece(PIECE)
        })
        .unwrap();
        let mut now = Nanos::ZERO;
        run(&mut w, &mut now, Nanos::from_micros(100), 1);
        // 100 us of path: the target's queue is the floor, not 100 us.
        assert_eq!(w.target_delay(), Some(Nanos::from_micros(500)));
        // 450 us is under the target: the window grows.
        run(&mut w, &mut now, Nanos::from_micros(450), 1);
        assert_eq!(w.window(), PIECE + 2 * (PIECE / 8));
        // However long the pieces take, a sender keeps a quarter of a
        // piece: one piece every four round trips.
        run(&mut w, &mut now, Nanos::from_millis(10), 100);
        assert_eq!(w.window(), PIECE / 4);
        w.on_sent(PIECE, now);
        let srtt = w.smoothed_delay().unwrap().0;
        assert_eq!(w.admit(0, PIECE, now), Admit::At(now + Nanos(srtt * 4)));
    }

    #[test]
    fn admits_while_the_window_has_room() {
        let mut w = window();
        let mut now = Nanos::ZERO;
        run(&mut w, &mut now, Nanos::from_micros(100), 24);
        assert_eq!(w.window(), PIECE * 4);
        assert_eq!(w.admit(0, PIECE, now), Admit::Now);
        assert_eq!(w.admit(3 * PIECE, PIECE, now), Admit::Now);
        assert_eq!(w.admit(3 * PIECE + 1, PIECE, now), Admit::AfterCompletion);
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
        ] {
            let err = DelayWindow::new(bad).unwrap_err();
            assert!(matches!(err, ConfigError::Window { .. }), "{err}");
        }
        // A zero-byte piece still gives valid defaults.
        assert!(DelayWindowConfig::for_piece(0).validate().is_ok());
    }
}
