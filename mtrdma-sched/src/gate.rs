//! What reaches the NIC, and when: the rules every mtrdma engine keeps
//! around its [`Scheduler`](crate::Scheduler).
//!
//! A scheduler orders work; the [`Gate`] decides how much of it is in the
//! NIC at once. `mtrdma-verbs`' engine (every scheduled queue pair) and
//! the [`sim`](crate::sim) simulator both run these functions, so what the
//! simulator shows is what the data path does:
//!
//! * **The bulk budget.** The bulk-class bytes of all the engine's queue
//!   pairs together in the NIC are bounded: that, and not the scheduler's
//!   queues, is what a latency request finds ahead of it in the NIC's own
//!   FIFO. A piece larger than the budget still goes, alone, so nothing
//!   waits forever. Latency-class pieces do not count against it.
//! * **A queue pair's [`Lane`].** At most `slots` pieces of one queue pair
//!   in the NIC; its granted pieces leave in the order granted; and a bulk
//!   queue pair with a [`DelayWindow`](crate::DelayWindow) keeps in the NIC what the window
//!   allows, when its pacing allows (the cross-process protection).
//! * **The fast path.** A request of one piece with nothing it should wait
//!   behind, room in its lane and in the budget goes to the NIC without a
//!   trip through the scheduler's queues ([`Gate::unhindered`]).
//! * **When to ask the scheduler.** Only while a latency-class descriptor
//!   is queued or the budget has room ([`Gate::may_grant`]): a bulk grant
//!   taken with no room would wait with its queue pair, and a latency
//!   request enqueued after it would wait behind it.
//!
//! A piece is in the NIC from its post until its completion is seen
//! ([`Gate::sent`], [`Gate::completed`]).
//!
//! A queue pair whose oldest bulk piece has been in the NIC for
//! [`Gate::stall_after`] is stuck, not queued (its peer posts no receives
//! and the NIC retries, or the peer is gone and the NIC waits for
//! acknowledgements that do not come): [`Gate::release_if_stalled`] takes
//! its bytes off the budget, so that one stuck queue pair does not stop
//! every other queue pair's bulk traffic, and the lane posts nothing more
//! until what it has in the NIC completes (or fails).
//!
//! ```
//! use mtrdma_sched::gate::{Gate, Lane};
//! use mtrdma_sched::{Admit, Nanos, Opcode, TrafficClass};
//!
//! // 8 KiB pieces, 16 KiB of bulk bytes in the NIC.
//! let mut gate = Gate::new(8 << 10, 16 << 10);
//! let mut bulk: Lane<()> = Lane::new(TrafficClass::Bulk, 4, None);
//! let now = || Nanos(0);
//! assert!(gate.unhindered(&bulk, Opcode::Write, 8 << 10, true, now));
//! gate.sent(&mut bulk, 1, 8 << 10, now);
//! gate.sent(&mut bulk, 2, 8 << 10, now);
//! // The budget is spent: the next piece waits for a completion.
//! assert_eq!(gate.admits(&bulk, 8 << 10, now), Admit::AfterCompletion);
//! assert_eq!(gate.completed(&mut bulk, 1, now, Nanos::ZERO), Some(8 << 10));
//! assert_eq!(gate.admits(&bulk, 8 << 10, now), Admit::Now);
//! ```

use std::collections::VecDeque;

use crate::descriptor::{Grant, Opcode};
use crate::piece_floor::{DelayShift, Permit, Shift};
use crate::time::Nanos;
use crate::window::{Admit, Window};
use crate::TrafficClass;

/// The engine-wide rules: the piece size, the bulk budget, and the count
/// of latency-class descriptors queued in the scheduler.
#[derive(Debug, Clone)]
pub struct Gate {
    chunk_bytes: u64,
    budget: u64,
    bulk_in_flight: u64,
    latency_queued: usize,
    stall_after: Nanos,
}

/// How long a bulk piece may be in the NIC before its queue pair is taken
/// for stuck ([`Gate::release_if_stalled`]) by default: 100 ms, far more
/// than a budget's worth of bytes takes on any link mtrdma schedules
/// (256 KiB at 50 Mbit/s take 42 ms) and far less than what a stuck queue
/// pair holds (a peer may ask for 655 ms between retries of a SEND it
/// has no receive for).
pub const DEFAULT_STALL_AFTER: Nanos = Nanos(100_000_000);

/// A piece in the NIC. An RC send queue completes in order, so the front
/// of a lane's list is the next completion's piece. (Two words, so it
/// travels in registers.)
#[derive(Debug, Clone, Copy)]
struct Piece {
    /// The caller's tag for it (its request's key, typically).
    tag: usize,
    /// Bytes (a piece's scatter entry holds at most `u32::MAX`).
    len: u32,
    /// When it was posted, for a lane with a window or one whose bytes
    /// count against a bound ([`Gate::stamps`]); 0 otherwise.
    sent_at: u64,
}

/// One queue pair's way into the NIC: its pieces in flight, the pieces
/// granted to it and not yet posted (in order), and its delay window.
/// `H` is the scheduler's handle type.
#[derive(Debug)]
pub struct Lane<H> {
    class: TrafficClass,
    slots: u32,
    in_flight: VecDeque<Piece>,
    bytes_out: u64,
    pending: VecDeque<Grant<H>>,
    window: Option<Box<dyn Window>>,
    /// Bytes of its oldest pieces in the NIC that no longer count against
    /// the bulk budget: it stalled ([`Gate::release_if_stalled`]).
    released: u64,
    /// The largest piece it posts ([`Lane::with_piece_limit`]).
    piece_limit: u64,
    /// A latency lane's delays with and without the one-piece floor
    /// ([`Lane::with_delay_shift`]), the permit as last told, and whether
    /// a report is due.
    shift: Option<Box<DelayShift>>,
    permit: Permit,
    report_due: bool,
}

impl<H> Lane<H> {
    /// A lane for a queue pair of `class` that may have `slots` pieces in
    /// the NIC (at least 1), bounded also by `window` if it has one.
    pub fn new(class: TrafficClass, slots: u32, window: Option<Box<dyn Window>>) -> Lane<H> {
        Lane {
            class,
            slots: slots.max(1),
            in_flight: VecDeque::new(),
            bytes_out: 0,
            pending: VecDeque::new(),
            window,
            released: 0,
            piece_limit: u64::MAX,
            shift: None,
            permit: Permit::OFF,
            report_due: false,
        }
    }

    /// The same lane, keeping its pieces' delays with and without the
    /// coordinator's one-piece floor ([`piece_floor`](crate::piece_floor)):
    /// a latency-class lane under a latency bound. Its pieces are then
    /// timed; [`Gate::completed`] records each, and
    /// [`take_shift_report`](Self::take_shift_report) tells what it saw.
    pub fn with_delay_shift(mut self) -> Lane<H> {
        self.shift = Some(Box::default());
        self
    }

    /// Whether it keeps a delay shift ([`with_delay_shift`](Self::with_delay_shift)).
    #[inline]
    pub fn keeps_delay_shift(&self) -> bool {
        self.shift.is_some()
    }

    /// Tells the lane the coordinator's permit as it stands (for a lane
    /// that keeps a delay shift; cheap).
    #[inline]
    pub fn set_permit(&mut self, permit: Permit) {
        self.permit = permit;
    }

    /// What its delays show of the floor, when a report is due (every 16
    /// pieces timed, and at a change of the permit); `None` otherwise and
    /// for a lane that keeps none.
    pub fn take_shift_report(&mut self) -> Option<Shift> {
        if !std::mem::take(&mut self.report_due) {
            return None;
        }
        self.shift.as_mut().map(|s| s.report())
    }

    /// The same lane, posting pieces of at most `bytes` (at least 1):
    /// [`push_granted`](Self::push_granted) splits a larger grant of a
    /// WRITE or READ, whatever scheduler granted it. This is how a latency
    /// bound's piece size ([`Protection`](crate::Protection)) holds for a
    /// scheduler that chunks more coarsely, or not at all.
    pub fn with_piece_limit(mut self, bytes: u64) -> Lane<H> {
        self.piece_limit = bytes.max(1);
        self
    }

    /// The largest piece it posts (`u64::MAX`: no limit).
    pub fn piece_limit(&self) -> u64 {
        self.piece_limit
    }

    /// Whether it stalled ([`Gate::release_if_stalled`]) and has pieces
    /// of then still in the NIC: it posts nothing until they complete.
    #[inline]
    pub fn is_stalled(&self) -> bool {
        self.released > 0
    }

    /// Its class.
    #[inline]
    pub fn class(&self) -> TrafficClass {
        self.class
    }

    /// Pieces it may have in the NIC.
    pub fn slots(&self) -> u32 {
        self.slots
    }

    /// Pieces it has in the NIC.
    #[inline]
    pub fn in_flight(&self) -> usize {
        self.in_flight.len()
    }

    /// Bytes it has in the NIC.
    #[inline]
    pub fn bytes_out(&self) -> u64 {
        self.bytes_out
    }

    /// Whether another piece fits its slots (never while it is stalled).
    #[inline]
    pub fn has_room(&self) -> bool {
        (self.in_flight.len() as u32) < self.slots && self.released == 0
    }

    /// Its delay window.
    #[inline]
    pub fn window(&self) -> Option<&dyn Window> {
        self.window.as_deref()
    }

    /// Its delay window, to retune (link rate, weight) or read verdicts.
    #[inline]
    pub fn window_mut(&mut self) -> Option<&mut (dyn Window + 'static)> {
        self.window.as_deref_mut()
    }

    /// Pieces granted to it and not yet posted.
    #[inline]
    pub fn pending(&self) -> &VecDeque<Grant<H>> {
        &self.pending
    }

    /// Queues a granted piece behind its other pending ones.
    #[inline]
    pub fn push_pending(&mut self, grant: Grant<H>) {
        self.pending.push_back(grant);
    }

    /// Queues `grant` behind its other pending pieces, split into pieces
    /// of at most [`piece_limit`](Self::piece_limit) if it is a WRITE or
    /// READ larger than that (only the last of them carries `is_last`);
    /// returns the number of pieces queued (each one entry of the
    /// [`GrantOrder`]).
    pub fn push_granted(&mut self, grant: Grant<H>) -> usize
    where
        H: Clone,
    {
        if grant.len <= self.piece_limit || !grant.op.is_splittable() {
            self.pending.push_back(grant);
            return 1;
        }
        let limit = self.piece_limit;
        let end = grant.offset.saturating_add(grant.len);
        let mut offset = grant.offset;
        let mut pieces = 0;
        while offset < end {
            let len = limit.min(end - offset);
            self.pending.push_back(Grant {
                handle: grant.handle.clone(),
                offset,
                len,
                is_last: grant.is_last && offset + len == end,
                ..grant
            });
            offset += len;
            pieces += 1;
        }
        pieces
    }

    /// Takes the first pending piece (once [`Gate::admits`] let it go).
    #[inline]
    pub fn pop_pending(&mut self) -> Option<Grant<H>> {
        self.pending.pop_front()
    }

    /// Bytes of its pieces in the NIC that count against the bulk budget.
    pub fn bulk_bytes_out(&self) -> u64 {
        self.bulk_bytes(self.bytes_out) - self.released
    }

    /// What `len` bytes of this lane count against the bulk budget.
    #[inline]
    fn bulk_bytes(&self, len: u64) -> u64 {
        if self.class == TrafficClass::Latency {
            0
        } else {
            len
        }
    }

    /// What its window says of a piece of `len` bytes at `now` (read only
    /// with a window). A window may hold a piece back for a time, but not
    /// until a completion when none of the lane's pieces is in the NIC:
    /// none would come, and the piece (one larger than the window, such
    /// as a request sent whole) would wait forever. Alone, it goes.
    #[inline]
    fn window_admits(&self, len: u64, now: impl FnOnce() -> Nanos) -> Admit {
        match &self.window {
            Some(w) => match w.admit(self.bytes_out, len, now()) {
                Admit::AfterCompletion if self.in_flight.is_empty() => Admit::Now,
                verdict => verdict,
            },
            None => Admit::Now,
        }
    }
}

/// What became of a lane's first pending piece when an engine tried to
/// post it ([`GrantOrder::drain`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Post {
    /// It went to the NIC.
    Posted,
    /// Its lane held it back (slots, window, rate limit): the others go on.
    Held,
    /// The bulk budget held it back ([`Gate::budget_holds`]): no later
    /// bulk piece goes ahead of it.
    Budget,
}

/// The order in which pieces waiting in lanes were granted, so that they
/// reach the NIC in the scheduler's order: latency-class pieces first,
/// then bulk pieces, which take the budget strictly in the order granted
/// (a smaller piece granted later does not go ahead of one the budget
/// holds back, and a spent budget costs one look however many wait); a
/// piece whose own lane holds it back does not hold up the others. Lanes
/// are named by the caller's keys.
#[derive(Debug, Default)]
pub struct GrantOrder {
    order: [VecDeque<usize>; 2],
    /// Whether the last look at each class stopped at the budget.
    stopped: [bool; 2],
}

impl GrantOrder {
    /// Notes a piece granted to lane `key` of `class`, queued in the lane.
    #[inline]
    pub fn push(&mut self, class: TrafficClass, key: usize) {
        self.order[class_index(class)].push_back(key);
    }

    /// Pieces waiting.
    #[inline]
    pub fn len(&self) -> usize {
        self.order[0].len() + self.order[1].len()
    }

    /// Whether no piece waits.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Forgets lane `key` of `class` (its queue pair is gone); returns how
    /// many of its pieces waited.
    pub fn remove_lane(&mut self, class: TrafficClass, key: usize) -> usize {
        let order = &mut self.order[class_index(class)];
        let before = order.len();
        order.retain(|&k| k != key);
        before - order.len()
    }

    /// Offers the waiting pieces to `post` in the order granted, latency
    /// class first: `post(key)` tries lane `key`'s first pending piece
    /// (a lane's own pieces are in order, so that is the earliest it has)
    /// and says what became of it.
    pub fn drain(&mut self, mut post: impl FnMut(usize) -> Post) {
        for c in 0..2 {
            self.stopped[c] = false;
            let mut k = 0;
            while k < self.order[c].len() {
                match post(self.order[c][k]) {
                    Post::Posted if k == 0 => {
                        // Usually the first: no shifting of the rest.
                        self.order[c].pop_front();
                    }
                    Post::Posted => {
                        self.order[c].remove(k);
                    }
                    Post::Held => k += 1,
                    Post::Budget => {
                        self.stopped[c] = true;
                        break;
                    }
                }
            }
        }
    }

    /// After [`push`](Self::push): offers the piece just granted to lane
    /// `key` of `class` to `post`, unless a piece granted before it waits
    /// for the budget (then it waits behind).
    #[inline]
    pub fn drain_newest(
        &mut self,
        class: TrafficClass,
        key: usize,
        post: impl FnOnce(usize) -> Post,
    ) {
        let c = class_index(class);
        if self.stopped[c] {
            return;
        }
        match post(key) {
            Post::Posted => {
                // The lane's earliest piece went: one of its entries goes
                // (they all name the lane); the newest, usually the last.
                let order = &mut self.order[c];
                if order.back() == Some(&key) {
                    order.pop_back();
                } else if let Some(at) = order.iter().rposition(|&k| k == key) {
                    order.remove(at);
                }
            }
            Post::Held => {}
            Post::Budget => self.stopped[c] = true,
        }
    }
}

#[inline]
fn class_index(class: TrafficClass) -> usize {
    match class {
        TrafficClass::Latency => 0,
        TrafficClass::Bulk => 1,
    }
}

impl Gate {
    /// Rules for pieces of at most `chunk_bytes` (WRITE and READ longer
    /// than that are split by the scheduler) and at most
    /// `bulk_bytes_in_flight` bulk bytes in the NIC (at least 1).
    pub fn new(chunk_bytes: u64, bulk_bytes_in_flight: u64) -> Gate {
        Gate {
            chunk_bytes,
            budget: bulk_bytes_in_flight.max(1),
            bulk_in_flight: 0,
            latency_queued: 0,
            stall_after: DEFAULT_STALL_AFTER,
        }
    }

    /// The same rules, with a queue pair taken for stuck once its oldest
    /// bulk piece has been in the NIC for `stall_after` (at least 1 ns;
    /// default [`DEFAULT_STALL_AFTER`]).
    pub fn with_stall_after(mut self, stall_after: Nanos) -> Gate {
        self.stall_after = Nanos(stall_after.0.max(1));
        self
    }

    /// How long a bulk piece may be in the NIC before its queue pair is
    /// taken for stuck.
    pub fn stall_after(&self) -> Nanos {
        self.stall_after
    }

    /// If `lane`'s oldest bulk piece has been in the NIC for
    /// [`stall_after`](Self::stall_after) at `now`, takes all its bytes in
    /// the NIC off the bulk budget (the others' pieces go again) and holds
    /// the lane until they complete; returns whether it did. Call it when
    /// the budget holds pieces back.
    pub fn release_if_stalled<H>(&mut self, lane: &mut Lane<H>, now: Nanos) -> bool {
        if !self.budget_counts(lane) || lane.released > 0 {
            return false;
        }
        let Some(oldest) = lane.in_flight.front() else {
            return false;
        };
        if now.0.saturating_sub(oldest.sent_at) < self.stall_after.0 {
            return false;
        }
        lane.released = lane.bytes_out;
        self.bulk_in_flight -= lane.released;
        true
    }

    /// Whether `lane`'s pieces count against a bound: it is bulk, and the
    /// budget is not unbounded (a queue pair on an engine of its own has
    /// none). Only then can it hold others back, and be released.
    #[inline]
    fn budget_counts<H>(&self, lane: &Lane<H>) -> bool {
        lane.class != TrafficClass::Latency && self.budget != u64::MAX
    }

    /// Whether `lane`'s pieces are stamped with their posting time: for
    /// its window, or to find it stalled.
    #[inline]
    fn stamps<H>(&self, lane: &Lane<H>) -> bool {
        lane.window.is_some() || lane.shift.is_some() || self.budget_counts(lane)
    }

    /// The piece size.
    #[inline]
    pub fn chunk_bytes(&self) -> u64 {
        self.chunk_bytes
    }

    /// The bound on bulk bytes in the NIC.
    pub fn budget(&self) -> u64 {
        self.budget
    }

    /// Bulk bytes in the NIC.
    #[inline]
    pub fn bulk_in_flight(&self) -> u64 {
        self.bulk_in_flight
    }

    /// Latency-class descriptors queued in the scheduler.
    pub fn latency_queued(&self) -> usize {
        self.latency_queued
    }

    /// Whether a bulk piece of `len` bytes fits the budget now (always
    /// when no bulk byte is in the NIC).
    #[inline]
    pub fn bulk_fits(&self, len: u64) -> bool {
        self.bulk_in_flight == 0 || self.bulk_in_flight.saturating_add(len) <= self.budget
    }

    /// Whether the bulk budget, not the lane, holds back a piece of `len`
    /// bytes of `lane` ([`Post::Budget`]).
    #[inline]
    pub fn budget_holds<H>(&self, lane: &Lane<H>, len: u64) -> bool {
        lane.class != TrafficClass::Latency && !self.bulk_fits(len)
    }

    /// Whether a request of `op` and `len` bytes goes as one piece.
    #[inline]
    pub fn one_piece(&self, op: Opcode, len: u64) -> bool {
        len <= self.chunk_bytes || !op.is_splittable()
    }

    /// Whether the scheduler may be asked for a grant: a latency-class
    /// descriptor is queued, or the budget has room.
    #[inline]
    pub fn may_grant(&self) -> bool {
        self.latency_queued > 0 || self.bulk_fits(1)
    }

    /// Whether a request of `op` and `len` bytes on `lane` may skip the
    /// scheduler's queues (before caps and rate limits): it is one piece
    /// (of the gate's chunks and of the lane's piece limit); nothing it
    /// should wait behind is queued (for the latency class, no
    /// latency descriptor; for bulk, nothing at all: `sched_empty`); the
    /// lane has no pending piece and room; it fits the budget; and the
    /// lane's window lets it go at `now` (read only with a window).
    #[inline]
    pub fn unhindered<H>(
        &self,
        lane: &Lane<H>,
        op: Opcode,
        len: u64,
        sched_empty: bool,
        now: impl FnOnce() -> Nanos,
    ) -> bool {
        let latency = lane.class == TrafficClass::Latency;
        let nothing_ahead = if latency {
            self.latency_queued == 0
        } else {
            sched_empty
        };
        self.one_piece(op, len)
            && (len <= lane.piece_limit || !op.is_splittable())
            && nothing_ahead
            && lane.pending.is_empty()
            && lane.has_room()
            && (latency || self.bulk_fits(len))
            && lane.window_admits(len, now) == Admit::Now
    }

    /// Whether the first pending piece of `lane`, of `len` bytes, may go
    /// at `now` by its slots, the budget and its window (`now` read only
    /// with a window).
    #[inline]
    pub fn admits<H>(&self, lane: &Lane<H>, len: u64, now: impl FnOnce() -> Nanos) -> Admit {
        if !lane.has_room() || (lane.class != TrafficClass::Latency && !self.bulk_fits(len)) {
            return Admit::AfterCompletion;
        }
        lane.window_admits(len, now)
    }

    /// How many granted pieces may wait in lanes (for room, the budget, a
    /// window or a rate limit) before the scheduler is asked for more; the
    /// scheduler keeps the order of the rest. A lane of an engine of its
    /// own (`solo`) keeps one, so that the scheduler (perhaps one of the
    /// user's own) decides the order of the rest when room comes; an
    /// engine of `lanes` lanes keeps enough that one blocked lane does not
    /// hold up the others.
    #[inline]
    pub fn pending_bound(lanes: usize, solo: bool) -> usize {
        if solo {
            1
        } else {
            64.max(4 * lanes)
        }
    }

    /// Counts a descriptor of `class` the scheduler accepted.
    #[inline]
    pub fn enqueued(&mut self, class: TrafficClass) {
        if class == TrafficClass::Latency {
            self.latency_queued += 1;
        }
    }

    /// Counts a grant the scheduler handed out (its descriptor leaves the
    /// scheduler with its last piece).
    #[inline]
    pub fn granted<H>(&mut self, grant: &Grant<H>) {
        if grant.is_last && grant.class == TrafficClass::Latency {
            self.latency_queued -= 1;
        }
    }

    /// Counts a piece of `len` bytes, tagged `tag`, as posted on `lane`
    /// (`now` read only with a window, or for a bulk lane under a bounded
    /// budget, to find it stalled).
    #[inline]
    pub fn sent<H>(
        &mut self,
        lane: &mut Lane<H>,
        tag: usize,
        len: u64,
        now: impl FnOnce() -> Nanos,
    ) {
        let sent_at = if !self.stamps(lane) {
            0
        } else {
            let now = now();
            if let Some(w) = &mut lane.window {
                w.on_sent(len, now);
            }
            now.0
        };
        lane.in_flight.push_back(Piece {
            tag,
            len: u32::try_from(len).unwrap_or(u32::MAX),
            sent_at,
        });
        lane.bytes_out += len;
        self.bulk_in_flight += lane.bulk_bytes(len);
    }

    /// Counts the piece tagged `tag` on `lane` as completed, seen at `now`
    /// by a poller that woke `host` late (`now` read only with a window):
    /// the front piece, as an RC send queue completes in order, unless a
    /// refused post completed out of turn (then the newest piece so
    /// tagged: the one just refused). Returns its bytes, or `None` if no
    /// such piece is in flight.
    #[inline]
    pub fn completed<H>(
        &mut self,
        lane: &mut Lane<H>,
        tag: usize,
        now: impl FnOnce() -> Nanos,
        host: Nanos,
    ) -> Option<u64> {
        let (len, sent_at) = self.take_piece(lane, tag)?;
        if let Some(w) = &mut lane.window {
            w.on_completed_late(len, sent_at, now(), host);
        } else if let Some(shift) = &mut lane.shift {
            let at = crate::window::dated(sent_at, now(), host);
            lane.report_due |= shift.record(lane.permit, sent_at, at);
        }
        Some(len)
    }

    /// As [`completed`](Self::completed), for a piece that reported no
    /// completion of its own: it was posted unsignaled, and the completion
    /// of a later piece of its queue pair, found at `now`, reported it
    /// (the send queue completes in order). Its window counts its bytes
    /// back but takes no delay sample from it
    /// ([`Window::on_completed_unsampled`]).
    #[inline]
    pub fn completed_unsampled<H>(
        &mut self,
        lane: &mut Lane<H>,
        tag: usize,
        now: impl FnOnce() -> Nanos,
    ) -> Option<u64> {
        let (len, sent_at) = self.take_piece(lane, tag)?;
        if let Some(w) = &mut lane.window {
            w.on_completed_unsampled(len, sent_at, now());
        }
        Some(len)
    }

    /// Takes the piece tagged `tag` out of `lane`'s pieces in flight and
    /// the budget (see [`completed`](Self::completed)); its bytes and
    /// when it was sent.
    #[inline(always)]
    fn take_piece<H>(&mut self, lane: &mut Lane<H>, tag: usize) -> Option<(u64, Nanos)> {
        let piece = match lane.in_flight.front() {
            Some(p) if p.tag == tag => lane.in_flight.pop_front(),
            _ => lane
                .in_flight
                .iter()
                .rposition(|p| p.tag == tag)
                .and_then(|at| lane.in_flight.remove(at)),
        }?;
        let len = u64::from(piece.len);
        lane.bytes_out -= len;
        // A stalled lane's oldest bytes were taken off the budget already
        // (they complete first: the list is in posting order, and a piece
        // refused out of turn was never counted as stalled for long).
        let released = lane.released.min(lane.bulk_bytes(len));
        lane.released -= released;
        self.bulk_in_flight -= lane.bulk_bytes(len) - released;
        Some((len, Nanos(piece.sent_at)))
    }

    /// Gives back what `lane` held of the budget: its queue pair is gone,
    /// and its pieces will not be seen to complete.
    pub fn forget<H>(&mut self, lane: &Lane<H>) {
        self.bulk_in_flight -= lane.bulk_bytes_out();
    }
}

#[cfg(test)]
mod tests;
