//! The one-piece floor: a delay window that may not shrink below one
//! piece, permitted only while the latency tenants show it costs them
//! nothing.
//!
//! A [`DelayWindow`](crate::DelayWindow) under one piece sends one piece
//! every `piece / window` round trips, so its sender sleeps before nearly
//! every piece. On a host whose CPUs, not the link, limit the senders (the
//! emulated link: about 700 us of CPU per sleep against 300 us per piece)
//! that pacing costs the bulk tenants a third to a half of what plain
//! senders move, with no queue at the port to show for it. A floor of one
//! piece per window removes the sleeps; but where the port is what limits
//! them, eight windows of one 4 KiB piece are 32 KiB queued, twice a 16 KiB
//! bound. The windows cannot tell the two apart: their own pieces take
//! as long in both. Only a latency request, which waits behind whatever
//! stands at the port, can.
//!
//! So the coordinator tries the floor and asks the latency tenants:
//!
//! * [`Permit`]: the coordinator's word, read by every engine: whether the
//!   floor is on, and a generation that changes with every change of it.
//! * [`DelayShift`]: kept by a latency-class queue pair's engine under a
//!   bound. It keeps the delays (post to completion, less the host's
//!   run-queue wait) of its requests sent with the floor off, its
//!   reference, and of those sent in the current generation with it on,
//!   and reports the shift of the median between the two ([`Shift`]).
//!   Requests sent within [`SETTLE`] of a change are not counted: the
//!   queue takes time to follow.
//! * [`FloorControl`]: the coordinator's state machine. After a reference
//!   time with the floor off and enough samples, it gives the floor to one
//!   windowed sender; then, each time the latency tenants' report shows
//!   that their median delay surely moved by no more than what is allowed,
//!   to more: twice as many while it surely moved by no more than half of
//!   what is allowed (if each sender's floor adds about the same, twice
//!   the senders stay within it), one more otherwise. The coordinator
//!   allows a quarter of the time one piece takes at the link's
//!   measured rate: where the port limits the senders, the windows
//!   already keep most of the bound queued, and a piece more per sender
//!   would take the rest. As soon as a step surely moves the median
//!   further, it takes that step back (to the senders that last held, or
//!   one fewer) and waits before trying again, twice as long each time it
//!   fails (up to a minute). One step adds at most a piece per sender it
//!   adds to what stands at the port, for the hundred milliseconds or so
//!   it takes to judge it. A floor that holds is taken off for a short
//!   reference time every [`FloorControlConfig::refresh_every`], so
//!   that the reference follows the link. A windowed sender that comes starts without the floor (the
//!   caller keeps the senders in the order they came), and the next step
//!   gives it; one that leaves takes its floor with it. With no latency
//!   tenant reporting, the floor stays off: the windows then keep to the
//!   bound on their own, as without it.
//!
//! The comparison is of the median, in the same boot and the same minute,
//! with and without the floor: the host's noise (a probe woken late by a
//! busy CPU) is in both and cancels, where an absolute judgment against
//! the bound would be mostly noise on a loaded host.
//!
//! ```
//! use mtrdma_sched::piece_floor::{DelayShift, FloorControl, Shift};
//! use mtrdma_sched::Nanos;
//!
//! let mut control = FloorControl::default();
//! let mut probe = DelayShift::new();
//! let mut report = Shift::default();
//! // A piece takes 800 us: a step may move the median by 200 us.
//! let piece = Nanos::from_micros(800);
//! let mut now = Nanos::ZERO;
//! let mut most = 0;
//! // Four windowed senders; a latency request every millisecond, which
//! // each sender with the floor delays by 150 us: the coordinator gives
//! // the floor to one, then takes back the second (300 us).
//! for _ in 0..5_000 {
//!     let permit = control.permit(None);
//!     let delay = 100_000 + 150_000 * control.granted() as u64;
//!     if probe.record(permit, now, now + Nanos(delay)) {
//!         report = probe.report();
//!     }
//!     now = now + Nanos::from_millis(1);
//!     most = most.max(control.update(now, report, piece, 4));
//! }
//! assert_eq!(most, 2, "tried two");
//! assert_eq!(control.granted(), 1, "and kept one");
//! assert!(control.withdrawals() >= 1);
//! ```

use crate::time::Nanos;

/// Requests sent within this time after the permit changed are not
/// counted: the windows and the queue at the port take time to follow.
pub const SETTLE: Nanos = Nanos(50_000_000);

/// Delays kept of each kind (with the floor off, and on).
const KEEP: usize = 256;

/// The fewest samples of each kind for a shift to be reported.
pub const MIN_SAMPLES: u32 = 64;

/// The coordinator's word on the floor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Permit {
    /// Whether windows may not shrink below one piece.
    pub on: bool,
    /// Changes with every change of `on` (wrapping).
    pub generation: u32,
}

impl Permit {
    /// No floor: what holds where none is published.
    pub const OFF: Permit = Permit {
        on: false,
        generation: 0,
    };

    /// As one word of shared memory: bit 0 `on`, bits 1 to 32 the
    /// generation.
    pub fn to_word(self) -> u64 {
        (u64::from(self.generation) << 1) | u64::from(self.on)
    }

    /// From a word [`to_word`](Self::to_word) wrote; `None` for one no
    /// permit gives (bits above 32 set: the memory is not a permit's).
    pub fn from_word(word: u64) -> Option<Permit> {
        if word >> 33 != 0 {
            return None;
        }
        Some(Permit {
            on: word & 1 == 1,
            generation: (word >> 1) as u32,
        })
    }
}

/// What a latency sender reports ([`DelayShift::report`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Shift {
    /// The generation of the permit its samples are of (the low 15 bits,
    /// as [`to_word`](Self::to_word) keeps them).
    pub generation: u16,
    /// Requests counted in that generation. Not carried in a word that
    /// gives a range (it reads back as 0).
    pub samples: u32,
    /// With the floor on, once both kinds have [`MIN_SAMPLES`]: how far
    /// the median delay of those requests lies from the median of the
    /// reference, in nanoseconds, as a range that holds it with about
    /// 95% confidence (the medians' spread estimated from their samples'
    /// interquartile ranges). `None` with the floor off or too few
    /// samples.
    pub range: Option<ShiftRange>,
}

/// How far the median delay moved ([`Shift::range`]), in nanoseconds:
/// likely between `low` and `high`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShiftRange {
    /// The least it likely moved (negative: it likely fell).
    pub low: i64,
    /// The most it likely moved.
    pub high: i64,
}

/// Units of a range in a word, in nanoseconds, and its bounds (24 bits
/// signed: about half a second either way).
const UNIT_NS: i64 = 64;
const FIELD_MAX: i64 = (1 << 23) - 1;

impl Shift {
    /// One word of shared memory: bit 63 set when a range is given; then
    /// bits 0 to 23 its low end and 24 to 47 its high end (signed, in
    /// units of 64 ns, saturating at about 0.54 s either way), else bits
    /// 0 to 31 the samples; bits 48 to 62 the generation's low 15 bits.
    /// 0 is "nothing reported".
    pub fn to_word(self) -> u64 {
        let field = |ns: i64| ((ns / UNIT_NS).clamp(-FIELD_MAX, FIELD_MAX) as u64) & 0xff_ffff;
        let body = match self.range {
            Some(r) => field(r.low) | (field(r.high) << 24) | (1 << 63),
            None => u64::from(self.samples),
        };
        body | (u64::from(self.generation & 0x7fff) << 48)
    }

    /// From a word [`to_word`](Self::to_word) wrote (any word reads as
    /// some report; the coordinator checks its generation, and a range
    /// whose ends are out of order reads as none).
    pub fn from_word(word: u64) -> Shift {
        let field = |bits: u64| {
            let v = (bits & 0xff_ffff) as i64;
            (if v > FIELD_MAX { v - (1 << 24) } else { v }) * UNIT_NS
        };
        let generation = ((word >> 48) & 0x7fff) as u16;
        if word >> 63 == 1 {
            let range = ShiftRange {
                low: field(word),
                high: field(word >> 24),
            };
            Shift {
                generation,
                samples: 0,
                range: (range.low <= range.high).then_some(range),
            }
        } else {
            Shift {
                generation,
                samples: word as u32,
                range: None,
            }
        }
    }

    /// Whether it is of `permit`'s generation (the low 15 bits, as words
    /// keep them).
    pub fn is_of(&self, permit: Permit) -> bool {
        (self.generation & 0x7fff) == (permit.generation & 0x7fff) as u16
    }
}

/// The last [`KEEP`] delays of one kind, in nanoseconds.
#[derive(Debug, Clone)]
struct Ring {
    delays: Vec<u64>,
    next: usize,
}

impl Ring {
    fn new() -> Ring {
        Ring {
            delays: Vec::with_capacity(KEEP),
            next: 0,
        }
    }

    fn push(&mut self, delay: u64) {
        if self.delays.len() < KEEP {
            self.delays.push(delay);
        } else {
            self.delays[self.next] = delay;
        }
        self.next = (self.next + 1) % KEEP;
    }

    fn clear(&mut self) {
        self.delays.clear();
        self.next = 0;
    }

    fn len(&self) -> usize {
        self.delays.len()
    }

    /// The median and the interquartile range.
    fn quartiles(&self, scratch: &mut Vec<u64>) -> (u64, u64) {
        scratch.clear();
        scratch.extend_from_slice(&self.delays);
        let n = scratch.len();
        if n == 0 {
            return (0, 0);
        }
        let mut at = |k: usize| *scratch.select_nth_unstable(k.min(n - 1)).1;
        let (median, q1, q3) = (at(n / 2), at(n / 4), at(n * 3 / 4));
        (median, q3.saturating_sub(q1))
    }
}

/// A latency sender's delays with the floor off and on (see the
/// [module docs](self)).
#[derive(Debug, Clone)]
pub struct DelayShift {
    reference: Ring,
    trial: Ring,
    permit: Permit,
    /// When this sender first saw `permit` (ns of the shared clock).
    since: u64,
    /// Requests counted in `permit`'s generation.
    counted: u32,
    scratch: Vec<u64>,
}

impl Default for DelayShift {
    fn default() -> Self {
        DelayShift::new()
    }
}

impl DelayShift {
    /// Nothing seen yet.
    pub fn new() -> DelayShift {
        DelayShift {
            reference: Ring::new(),
            trial: Ring::new(),
            permit: Permit::OFF,
            since: 0,
            counted: 0,
            scratch: Vec::with_capacity(KEEP),
        }
    }

    /// Takes a request sent at `sent_at` that completed at `done_at`
    /// (less the host's delay), under `permit` as it is at completion.
    /// Returns whether a report is due: every 16 requests counted, and at
    /// a change of the permit.
    pub fn record(&mut self, permit: Permit, sent_at: Nanos, done_at: Nanos) -> bool {
        let changed = permit != self.permit;
        if changed {
            // Each generation with the floor on is judged on its own
            // samples, against those of the last time it was off: the
            // reference is of the link as it is now.
            if permit.on {
                self.trial.clear();
            } else {
                self.reference.clear();
            }
            self.permit = permit;
            self.since = done_at.0;
            self.counted = 0;
        }
        if sent_at.0 < self.since.saturating_add(SETTLE.0) {
            return changed;
        }
        let delay = done_at.0.saturating_sub(sent_at.0);
        if permit.on {
            self.trial.push(delay);
        } else {
            self.reference.push(delay);
        }
        self.counted = self.counted.saturating_add(1);
        changed || self.counted % 16 == 0
    }

    /// What it has seen of the current generation.
    pub fn report(&mut self) -> Shift {
        let enough = |r: &Ring| r.len() >= MIN_SAMPLES as usize;
        let range = if self.permit.on && enough(&self.trial) && enough(&self.reference) {
            let (on, on_iqr) = self.trial.quartiles(&mut self.scratch);
            let (off, off_iqr) = self.reference.quartiles(&mut self.scratch);
            // A median's standard error is about 1.25 sigma / sqrt(n), and
            // sigma about IQR / 1.35; two of them either way.
            let var = |iqr: u64, n: usize| {
                let se = 0.926 * iqr as f64 / (n as f64).sqrt();
                se * se
            };
            let margin =
                2.0 * (var(on_iqr, self.trial.len()) + var(off_iqr, self.reference.len())).sqrt();
            let shift = on as f64 - off as f64;
            Some(ShiftRange {
                low: (shift - margin) as i64,
                high: (shift + margin) as i64,
            })
        } else {
            None
        };
        Shift {
            generation: (self.permit.generation & 0x7fff) as u16,
            samples: self.counted,
            range,
        }
    }
}

/// Settings of [`FloorControl`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FloorControlConfig {
    /// The least time with the floor off before it is given (at the
    /// start and after a refresh). Its delays are the reference the steps
    /// are judged against: it is given only once the latency tenants
    /// report [`MIN_SAMPLES`] of them, however long that takes. Default
    /// 1 s: after a floor is taken off, the windows take a few hundred
    /// milliseconds to shrink, and a reference taken while they do is
    /// too high (in the simulator, a reference of 300 ms let eight
    /// senders at 50 Mbit/s past the bound).
    pub reference: Nanos,
    /// With a shift reported and within what is allowed, the least time
    /// before the floor is given to one more sender. Default 0: as soon as
    /// a report of the new generation has [`MIN_SAMPLES`] samples.
    pub step: Nanos,
    /// With the floor given and no shift reported for this long (no
    /// latency tenant sends), it is taken off. Default 3 s.
    pub patience: Nanos,
    /// After a step that moved the median too far, the wait before it is
    /// tried again; it doubles with every failure in a row. Default 2 s.
    pub backoff: Nanos,
    /// The longest wait. Default 60 s.
    pub max_backoff: Nanos,
    /// A floor that holds is taken off for [`reference`](Self::reference)
    /// this often, so that the reference follows the link. Default 30 s.
    pub refresh_every: Nanos,
}

impl Default for FloorControlConfig {
    fn default() -> Self {
        FloorControlConfig {
            reference: Nanos::from_secs(1),
            step: Nanos::ZERO,
            patience: Nanos::from_secs(3),
            backoff: Nanos::from_secs(2),
            max_backoff: Nanos::from_secs(60),
            refresh_every: Nanos::from_secs(30),
        }
    }
}

/// The coordinator's state machine for the floor (see the
/// [module docs](self)): how many of the windowed senders have it.
#[derive(Debug, Clone)]
pub struct FloorControl {
    config: FloorControlConfig,
    /// Senders given the floor: the first `granted` of the caller's order.
    granted: usize,
    /// The generation of the permit; changes with every change of
    /// `granted`.
    generation: u32,
    /// Since when the current generation stands, and when a shift of it
    /// was last heard.
    since: u64,
    heard: u64,
    /// With none granted: not before this.
    off_until: u64,
    /// Holding below the last step that failed: not tried again before
    /// this (0: no step failed, or the wait is over).
    retry_at: u64,
    /// Senders to give the floor to at once after a refresh (as many as
    /// had it).
    resume: usize,
    /// The most senders a report of their generation showed within what
    /// is allowed (kept through refreshes; cleared when the floor lapses
    /// for want of reports, and lowered when senders leave or a step back
    /// goes below it): where a step that fails goes back to.
    held: usize,
    /// When to take it off for a fresh reference.
    refresh_at: u64,
    /// The windowed senders at the last update.
    senders: usize,
    backoff: u64,
    /// Whether a step was taken back since the last refresh (cleared by
    /// a refresh with none taken back, and when the floor lapses for want
    /// of reports).
    failed_since_refresh: bool,
    withdrawals: u64,
    last_shift: Option<ShiftRange>,
}

impl Default for FloorControl {
    fn default() -> Self {
        FloorControl::new(FloorControlConfig::default())
    }
}

impl FloorControl {
    /// None given, with `config`'s timings.
    pub fn new(config: FloorControlConfig) -> FloorControl {
        FloorControl {
            granted: 0,
            generation: 0,
            since: 0,
            heard: 0,
            off_until: config.reference.0,
            retry_at: 0,
            resume: 0,
            held: 0,
            refresh_at: 0,
            senders: 0,
            backoff: config.backoff.0,
            failed_since_refresh: false,
            withdrawals: 0,
            last_shift: None,
            config,
        }
    }

    /// How many senders have the floor: the first this many of the order
    /// the caller keeps ([`update`](Self::update)'s `senders`).
    pub fn granted(&self) -> usize {
        self.granted
    }

    /// The permit of a sender at `index` in the caller's order of windowed
    /// senders (on for the first [`granted`](Self::granted)), or, with
    /// `None`, of a latency sender (on while any sender has it: its
    /// delays are then the floor's trial).
    pub fn permit(&self, index: Option<usize>) -> Permit {
        Permit {
            on: index.map_or(self.granted > 0, |i| i < self.granted),
            generation: self.generation,
        }
    }

    /// The windowed senders at the last [`update`](Self::update).
    pub fn senders(&self) -> usize {
        self.senders
    }

    /// Steps taken back: the latency tenants' median moved by more than
    /// allowed.
    pub fn withdrawals(&self) -> u64 {
        self.withdrawals
    }

    /// The last shift the latency tenants reported with the floor given.
    pub fn last_shift(&self) -> Option<ShiftRange> {
        self.last_shift
    }

    fn grant(&mut self, n: usize, now: u64) {
        if n != self.granted {
            self.granted = n;
            self.generation = self.generation.wrapping_add(1);
            self.since = now;
            self.heard = now;
        }
    }

    /// Takes, at `now`, the latency tenants' report (the largest shifts of
    /// those of the current generation, [`merge`](Self::merge)), the time
    /// one `piece` takes at the link's rate and how many windowed
    /// `senders` there are; returns how many of them have the floor.
    ///
    /// A step may move the latency tenants' median by a quarter of
    /// `piece` (where the port limits the senders, the windows keep most
    /// of the bound queued already): it is taken back when the median
    /// surely moved further, and the next is taken only when it surely
    /// did not.
    pub fn update(&mut self, now: Nanos, report: Shift, piece: Nanos, senders: usize) -> usize {
        let now = now.0;
        let c = self.config;
        let latency = self.permit(None);
        let current = report.is_of(latency);
        let range = report.range.filter(|_| current && latency.on);
        if range.is_some() {
            self.last_shift = range;
            self.heard = now;
        }
        let piece = i64::try_from(piece.0).unwrap_or(i64::MAX);
        let allowed = piece / 4;
        self.senders = senders;
        if self.granted > senders {
            // Senders left: their floors go with them. One that comes
            // starts without it (the caller keeps them in the order they
            // came), and the next step gives it.
            self.grant(senders, now);
            self.held = self.held.min(senders);
        }
        if range.is_some_and(|r| r.high <= allowed) {
            self.held = self.held.max(self.granted);
        }
        if self.granted == 0 {
            let reference = current && report.samples >= MIN_SAMPLES;
            if senders > 0 && now >= self.off_until && reference {
                let n = self.resume.clamp(1, senders);
                self.grant(n, now);
                self.refresh_at = now.saturating_add(c.refresh_every.0);
            }
            return self.granted;
        }
        match range {
            Some(r) if r.low > allowed => {
                // The last step moved the median too far: take it back
                // (to the senders that last held, or one fewer), and wait
                // before trying again.
                self.withdrawals += 1;
                self.failed_since_refresh = true;
                let n = if self.held > 0 && self.held < self.granted {
                    self.held
                } else {
                    self.granted - 1
                };
                self.held = self.held.min(n);
                self.resume = n;
                self.retry_at = now.saturating_add(self.backoff).max(1);
                if n == 0 {
                    self.off_until = self.retry_at;
                }
                self.backoff = self.backoff.saturating_mul(2).min(c.max_backoff.0);
                self.grant(n, now);
            }
            _ if now.saturating_sub(self.heard) >= c.patience.0 => {
                // No latency tenant reports: no floor. The next to report
                // starts afresh, from one sender with doublings and the
                // first waits, whatever was taken back before.
                self.resume = 0;
                self.held = 0;
                self.failed_since_refresh = false;
                self.retry_at = 0;
                self.backoff = c.backoff.0;
                self.off_for_reference(now);
            }
            _ if now >= self.refresh_at => {
                // A whole period with no step taken back starts the waits
                // afresh; one with a step taken back keeps them (and the
                // step's next try).
                if !self.failed_since_refresh {
                    self.backoff = c.backoff.0;
                }
                self.failed_since_refresh = false;
                self.resume = self.granted;
                self.off_for_reference(now);
            }
            Some(r) if r.high <= allowed && self.granted < senders => {
                // Within what is allowed, surely: twice as many while the
                // median surely moved by no more than half of it (and no
                // step was taken back since the last reference), one more
                // otherwise.
                let waited = now >= self.retry_at;
                if waited && now.saturating_sub(self.since) >= c.step.0 {
                    self.retry_at = 0;
                    let double = r.high <= allowed / 2 && !self.failed_since_refresh;
                    let more = if double { self.granted } else { 1 };
                    self.grant((self.granted + more).min(senders), now);
                }
            }
            _ => {}
        }
        self.granted
    }

    /// Off for a fresh reference: a new generation even if it was off,
    /// so that the latency senders start their reference again.
    fn off_for_reference(&mut self, now: u64) {
        self.off_until = now.saturating_add(self.config.reference.0);
        self.granted = 0;
        self.generation = self.generation.wrapping_add(1);
        self.since = now;
        self.heard = now;
    }

    /// The report of several latency senders for `permit` (a latency
    /// sender's, [`permit`](Self::permit)`(None)`): those of its
    /// generation only; the largest of each end of their ranges, and the
    /// most samples.
    pub fn merge(permit: Permit, reports: impl IntoIterator<Item = Shift>) -> Shift {
        let mut out = Shift {
            generation: (permit.generation & 0x7fff) as u16,
            ..Shift::default()
        };
        let worse = |a: Option<ShiftRange>, b: Option<ShiftRange>| match (a, b) {
            (Some(a), Some(b)) => Some(ShiftRange {
                low: a.low.max(b.low),
                high: a.high.max(b.high),
            }),
            (a, b) => a.or(b),
        };
        for r in reports.into_iter().filter(|r| r.is_of(permit)) {
            out.samples = out.samples.max(r.samples);
            out.range = worse(out.range, r.range);
        }
        out
    }
}

#[cfg(test)]
mod tests;
