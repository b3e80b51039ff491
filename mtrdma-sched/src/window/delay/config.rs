//! [`DelayWindowConfig`]: a delay window's settings, their defaults and
//! their checks, and the bounds they are held to.

use super::*;

/// How many pieces posted a large one is remembered for (at least; at
/// most twice as many) as the piece size ([`DelayWindow`]'s `largest`).
pub(super) const PIECE_MEMORY: u32 = 16;

/// The most samples [`DelayWindowConfig::filter`] may name.
pub(super) const MAX_FILTER: u32 = 8;

/// The longest queue allowance a link rate gives
/// ([`DelayWindow::set_link_rate`]): a rate measured while the link was
/// nearly idle must not let the queue stand for longer.
pub const MAX_ALLOWANCE: Nanos = Nanos(100_000_000);

/// The longest wait after a completion [`DelayWindowConfig::spread_ppm`]
/// may name: 16 pieces' time on the wire.
pub(super) const MAX_SPREAD_PPM: u32 = 16_000_000;

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
