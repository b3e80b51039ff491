//! The engine behind every scheduled queue pair: which pieces go to the
//! NIC when, the requests they belong to, and the queue pairs they go to.

use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ibverbs_sys as ffi;
use mtrdma_core::{TenantHandle, TenantId, TrafficClass};
use mtrdma_sched::gate::{Gate, GrantOrder, Lane, Post};
use mtrdma_sched::{
    Admit, Dequeue, Descriptor, Grant, Nanos, Opcode as SchedOpcode, SchedulerConfig, Signals,
    TenantPolicy, TenantScheduler,
};

use super::{
    lock, wake_due, wake_instant, DefaultScheduler, Done, EngineClock, Gathered, Message, Op,
    PieceRef, PieceScheduler, ScheduleConfig, SharedConfig, Side, Who, WindowState, PARKED,
};
use crate::completion::WcStatus;
use crate::qp::{push_in_place, RawCompletion, RawSend, Region, SendOp, Sink, PARKED_DONE, RAW_WR};
use crate::slab::Slab;
use crate::Error;

/// One attached queue pair.
pub(super) struct Member<S: Sink> {
    /// Its side, or none for a queue pair with an engine of its own, whose
    /// pieces and finished requests go to `own_pieces` and `own_done`.
    side: Option<Arc<Side<S>>>,
    tenant: TenantId,
    quota: Option<TenantHandle>,
    /// Its pieces in the NIC, the pieces granted and not yet posted (the
    /// queue pair was full, the bulk budget spent, its window or its
    /// shared rate limit said wait), and its window: the rules of
    /// [`mtrdma_sched::gate`].
    lane: Lane<PieceRef>,
    /// When the shared rate limit lets the head of its pending pieces go
    /// (on the quota table's clock).
    retry_at: u64,
    /// Bytes accepted and not yet posted (its share of the tenant's demand
    /// in the quota table).
    backlog: u64,
    /// Requests accepted and not yet handed back.
    accepted: usize,
    /// Pieces in flight the engine posted raw (the others were parked in
    /// the queue pair's books, see [`Engine::may_park`]).
    raw_out: u32,
    /// Whether the window's weight is the tenant's (left at 1 in the
    /// configuration), so that a reload changes it too.
    window_takes_weight: bool,
    /// The quota table's policy sequence its tenant's weight and caps were
    /// read at (see [`Engine::follow_policy`]).
    policy_seq: u64,
}

impl<S: Sink> Member<S> {
    /// Its class.
    #[inline]
    pub(super) fn class(&self) -> TrafficClass {
        self.lane.class()
    }

    /// Requests accepted and not yet handed back.
    pub(super) fn accepted(&self) -> usize {
        self.accepted
    }

    /// Whether bytes accepted are not yet in the device (queued in the
    /// scheduler, or granted and waiting for room).
    pub(super) fn unposted(&self) -> bool {
        // The backlog is kept for tenants of the quota table; without one,
        // anything accepted may still be waiting.
        self.backlog > 0
            || !self.lane.pending().is_empty()
            || (self.quota.is_none() && self.accepted > 0)
    }

    /// Its window's state, if it has one.
    pub(super) fn window_state(&self) -> Option<WindowState> {
        self.lane.window().map(|w| {
            let v = w.view();
            WindowState {
                window_bytes: v.window_bytes,
                in_flight_bytes: self.lane.bytes_out(),
                base_delay: v.base_delay,
                smoothed_delay: v.smoothed_delay,
                target_delay: v.target_delay,
                weight: v.weight,
                gain_ppm: v.gain_ppm,
                sharing_weight: v.sharing_weight,
                queue_bytes: v.queue_bytes,
                piece_bytes: self.lane.piece_limit(),
            }
        })
    }
}

/// Everything behind a [`SharedScheduler`]: the queue pairs, their
/// requests, and the one scheduler that orders them.
pub(super) struct Engine<S: Sink, Q: PieceScheduler> {
    sched: Q,
    /// The piece size, the bulk budget and the latency count: what
    /// reaches the NIC when ([`mtrdma_sched::gate`]).
    gate: Gate,
    members: Slab<Member<S>>,
    messages: Slab<Message<S::Region>>,
    /// Members with pending pieces.
    /// Members' pending pieces, in the order granted.
    order: GrantOrder,
    next_seq: u64,
    /// Tenants whose policy was set on the scheduler itself.
    explicit: Vec<TenantId>,
    /// Whether any tenant was ever given caps in `sched` (which the fast
    /// path must then ask).
    capped: bool,
    clock: EngineClock,
    /// Shared with the queue pairs: see `ScheduledQueuePair::wake_at`.
    wake_at: Arc<AtomicU64>,
    /// Sides with pieces to post once the engine's lock is released.
    flush: Vec<Arc<Side<S>>>,
    /// The member whose owner holds the engine's lock (`usize::MAX`: none).
    caller: usize,
    /// Pieces decided for `caller`, which it posts itself.
    own_pieces: Vec<RawSend>,
    /// Requests of `caller` that finished, which it takes itself.
    own_done: Vec<Done<S>>,
    /// Piece completions being matched (kept for its capacity).
    scratch: Vec<RawCompletion>,
    /// `CLOCK_MONOTONIC` minus `clock` at creation: windows run on the
    /// clock every process shares, so that their quiet times line up
    /// across processes.
    shared_offset: u64,
    /// How long the thread that polls next waited for a CPU after a
    /// completion woke it (see `Waitable::woke_late`): the completions it
    /// finds are judged that much earlier by the windows.
    host_delay: Nanos,
    /// The earliest time (the engine's clock) a queue pair held back by
    /// its rate limit or window pacing may go again, found by this pump.
    timed_wake: u64,
    /// Whether every queue pair has an engine of its own (no sides): then
    /// nothing but completions and `timed_wake` makes work.
    solo: bool,
}

/// How often queue pairs that hold bulk budget are polled by the others
/// when the budget is spent and their owners have not polled them.
pub(super) const REAP_INTERVAL_NS: u64 = 100_000;

/// How long pieces decided for a queue pair wait for its owner to post
/// them before another thread does.
pub(super) const HELP_AFTER_NS: u64 = 1_000_000;

/// The built-in scheduler for `config`: latency first, weighted DRR,
/// caps, chunks of `chunk_bytes`.
pub(crate) fn default_scheduler(config: &SharedConfig) -> Result<DefaultScheduler, Error> {
    TenantScheduler::new(SchedulerConfig {
        chunk_bytes: config.chunk_bytes,
        quantum_bytes: config.chunk_bytes,
        bulk_min_share_ppm: config.bulk_min_share_ppm,
        ..SchedulerConfig::default()
    })
    .map_err(Error::ScheduleConfig)
}

impl<S: Sink, Q: PieceScheduler> Engine<S, Q> {
    pub(super) fn new(
        config: SharedConfig,
        sched: Q,
        clock: EngineClock,
    ) -> Result<Engine<S, Q>, Error> {
        Ok(Engine {
            sched,
            gate: Gate::new(config.chunk_bytes, config.bulk_bytes_in_flight).with_stall_after(
                Nanos(u64::try_from(config.stall_after.as_nanos()).unwrap_or(u64::MAX)),
            ),
            members: Slab::default(),
            messages: Slab::default(),
            order: GrantOrder::default(),
            next_seq: 0,
            explicit: Vec::new(),
            capped: false,
            clock,
            wake_at: Arc::new(AtomicU64::new(u64::MAX)),
            flush: Vec::new(),
            caller: usize::MAX,
            own_pieces: Vec::new(),
            own_done: Vec::new(),
            scratch: Vec::new(),
            shared_offset: 0,
            host_delay: Nanos::ZERO,
            timed_wake: u64::MAX,
            solo: false,
        })
    }

    /// Adds queue pair `qpn` with `sq_room` send queue slots; returns its
    /// member key, tenant and class.
    pub(super) fn add_member(
        &mut self,
        side: Option<Arc<Side<S>>>,
        qpn: u32,
        sq_room: u32,
        who: Who,
        config: ScheduleConfig,
    ) -> Result<(usize, TenantId, TrafficClass), Error> {
        let Who {
            tenant,
            class,
            quota,
            protection,
        } = who;
        // Held to the policy's latency bound whatever the configuration
        // asked: its pieces and its window's queue allowance at most the
        // bound's, and its window's weight the tenant's (the bound's window
        // names none).
        let config = super::held(config, protection.as_ref());
        let piece_limit = protection.map_or(u64::MAX, |_| config.chunk_bytes);
        let policy_seq = quota.as_ref().map_or(0, TenantHandle::policy_seq);
        let tenant_weight = self.adopt_policy(
            tenant,
            quota
                .as_ref()
                .and_then(TenantHandle::policy)
                .map(|p| p.schedule),
        )?;
        let window_takes_weight = config.window.as_ref().is_some_and(|w| w.weight().is_none());
        let window = match (&config.window, class) {
            (Some(factory), TrafficClass::Bulk) => {
                if self.shared_offset == 0 {
                    self.shared_offset = self.clock.shared_offset();
                }
                // Queue pairs of one port start again after a quiet time
                // at points of their own; a window that names no weight
                // takes the tenant's, so that tenants in different
                // processes share the port by their policies' weights.
                let seed = u64::from(qpn);
                Some(
                    factory
                        .build(seed, tenant_weight)
                        .map_err(Error::ScheduleConfig)?,
                )
            }
            _ => None,
        };
        let slots = config.max_pieces_in_flight.max(1).min(sq_room);
        let mut lane = Lane::new(class, slots, window).with_piece_limit(piece_limit);
        // A latency queue pair of a coordinated table under a bound keeps
        // its delays with and without the one-piece floor for the
        // coordinator (`mtrdma_sched::piece_floor`).
        let judges_floor = class == TrafficClass::Latency
            && quota
                .as_ref()
                .is_some_and(|q| q.table().is_coordinated() && q.table().latency_bound().is_some());
        if judges_floor {
            if self.shared_offset == 0 {
                self.shared_offset = self.clock.shared_offset();
            }
            lane = lane.with_delay_shift();
        }
        let member = self.members.insert(Member {
            side,
            tenant,
            quota,
            lane,
            retry_at: 0,
            backlog: 0,
            accepted: 0,
            raw_out: 0,
            window_takes_weight,
            policy_seq,
        });
        Ok((member, tenant, class))
    }

    /// Matches the piece completions `member` polled (`raw`) to their
    /// requests, then decides what goes next if there may be anything
    /// (`due`: a wake-up the engine asked for has come).
    #[inline]
    pub(super) fn completed(&mut self, member: usize, raw: &[RawCompletion], due: bool) {
        self.process(member, raw);
        // With nothing queued or waiting there is nothing to decide unless
        // a wake-up is due.
        if due || !self.sched.is_empty() || !self.order.is_empty() {
            self.pump();
        }
    }

    /// Takes up a policy reload: when the quota table's policy changed
    /// since `member`'s tenant's weight and caps were read, reads them
    /// again into the scheduler (unless set with
    /// [`SharedScheduler::set_policy`]) and into the windows of its
    /// tenant's queue pairs that follow its weight. One atomic load per
    /// request when nothing changed.
    #[inline]
    pub(super) fn follow_policy(&mut self, member: usize) {
        let m = self.member(member);
        let Some(q) = &m.quota else {
            return;
        };
        let seq = q.policy_seq();
        if seq != m.policy_seq {
            self.policy_changed(member, seq);
        }
    }

    #[cold]
    #[inline(never)]
    pub(super) fn policy_changed(&mut self, member: usize, seq: u64) {
        let m = self.member_mut(member);
        m.policy_seq = seq;
        let tenant = m.tenant;
        let Some(policy) = m.quota.as_ref().and_then(TenantHandle::policy) else {
            return;
        };
        let weight = match self.adopt_policy(tenant, Some(policy.schedule)) {
            Ok(weight) => weight,
            Err(e) => {
                tracing::warn!(%tenant, error = %e, "keeping the last weight and caps");
                return;
            }
        };
        for m in self.members.values_mut() {
            if m.tenant != tenant {
                continue;
            }
            m.policy_seq = seq;
            if let (Some(w), true) = (m.lane.window_mut(), m.window_takes_weight) {
                w.signals(&Signals {
                    weight: Some(weight),
                    ..Signals::default()
                });
            }
        }
    }

    /// Takes `tenant`'s weight and caps from its quota-table policy (the
    /// defaults without one) into the scheduler, unless they were set with
    /// [`SharedScheduler::set_policy`]: the scheduler then holds a capped
    /// tenant back itself (the others keep its turns) rather than granting
    /// pieces the quota table would refuse. Returns the weight the
    /// tenant's windows follow: the scheduler's for it, or the policy's
    /// where the scheduler keeps none (one of the user's own).
    pub(super) fn adopt_policy(
        &mut self,
        tenant: TenantId,
        policy: Option<TenantPolicy>,
    ) -> Result<u32, Error> {
        let policy = policy.unwrap_or_default();
        if !self.explicit.contains(&tenant) {
            self.set_policy(tenant, policy)?;
        }
        Ok(self
            .sched
            .policy(tenant)
            .map_or(policy.weight, |p| p.weight))
    }

    /// Sets `tenant`'s weight and caps in the scheduler.
    pub(super) fn set_policy(
        &mut self,
        tenant: TenantId,
        policy: TenantPolicy,
    ) -> Result<(), Error> {
        self.sched
            .set_policy(tenant, policy)
            .map_err(Error::ScheduleConfig)?;
        self.capped |= policy.byte_cap.is_some() || policy.wr_cap.is_some();
        Ok(())
    }

    pub(super) fn now(&self) -> Nanos {
        Nanos(self.clock.now().0)
    }

    /// The engine's clock as the windows see it (shared by every process).
    #[inline]
    pub(super) fn window_now(clock: &EngineClock, offset: u64) -> Nanos {
        Nanos(clock.now().0.saturating_add(offset))
    }

    #[inline]
    pub(super) fn member(&self, member: usize) -> &Member<S> {
        self.members
            .get(member)
            .expect("a queue pair's member entry lives as long as it does")
    }

    #[inline]
    pub(super) fn member_mut(&mut self, member: usize) -> &mut Member<S> {
        self.members
            .get_mut(member)
            .expect("a queue pair's member entry lives as long as it does")
    }

    /// Whether `member`'s request of `len` bytes may be posted now as the
    /// direct path posts it, its region parked in the queue pair's own
    /// books (its completion then comes out of the queue pair's poll in
    /// order, and the engine only counts the piece): a queue pair with an
    /// engine of its own, no shared rate limit or caps to charge, a request
    /// of one piece with nothing queued ahead, room in the NIC, and no raw
    /// piece in flight (whose request would finish after this one's).
    #[inline]
    pub(super) fn may_park(&self, member: usize, op: SendOp, len: u64) -> bool {
        let m = self.member(member);
        m.side.is_none()
            && m.quota.is_none()
            && m.lane.window().is_none()
            && !self.capped
            && m.raw_out == 0
            && self.unhindered(m, op.kind(), len)
    }

    /// Whether `m`'s request of `len` bytes may skip the scheduler's
    /// queues (before caps and rate limits): [`Gate::unhindered`].
    #[inline]
    pub(super) fn unhindered(&self, m: &Member<S>, op: SchedOpcode, len: u64) -> bool {
        // A time to try again is found when the request is pumped.
        self.gate
            .unhindered(&m.lane, op, len, self.sched.is_empty(), || {
                Self::window_now(&self.clock, self.shared_offset)
            })
    }

    /// Counts a request of `len` bytes that `may_park` let go, posted.
    #[inline]
    pub(super) fn parked(&mut self, member: usize, len: u32) {
        let m = self
            .members
            .get_mut(member)
            .expect("a queue pair's member entry lives as long as it does");
        // No window on a parked queue pair (`may_park`): no clock reading.
        self.gate
            .sent(&mut m.lane, PARKED, u64::from(len), || Nanos(0));
        m.accepted += 1;
    }

    /// Counts one parked request as finished (its completion went to the
    /// owner from the queue pair's poll).
    #[inline]
    pub(super) fn parked_done(&mut self, member: usize) {
        let m = self
            .members
            .get_mut(member)
            .expect("a queue pair's member entry lives as long as it does");
        let done = self
            .gate
            .completed(&mut m.lane, PARKED, || Nanos(0), Nanos::ZERO);
        if done.is_none() {
            tracing::error!("completion for a parked request that is not in flight");
            return;
        }
        m.accepted -= 1;
    }

    /// Accepts a request whose range `check_send` found to be `sge`:
    /// lets it go now if it may (the fast path), or queues it. Returns the
    /// piece when its owner is to post it at once (the caller holding the
    /// engine, or a queue pair with an engine of its own); anything else
    /// decided is in `own_pieces` or the books.
    #[inline]
    pub(super) fn post_send(
        &mut self,
        member: usize,
        op: Op,
        region: S::Region,
        range: Range<usize>,
        sge: ffi::ibv_sge,
        context: u64,
    ) -> Result<Option<RawSend>, (Error, S::Region)> {
        self.accept(member, op, region, range, sge, context, None)
            .map_err(|(error, region, _)| (error, region))
    }

    /// [`post_send`](Self::post_send) of a gather request (see
    /// [`ScheduledQueuePair::post_send_gather`]): `region` its first,
    /// `gather` the others and its scatter list, `len` its bytes. It goes
    /// whole, never split. On refusal every region comes back.
    #[allow(clippy::type_complexity)]
    pub(super) fn post_gather(
        &mut self,
        member: usize,
        op: SendOp,
        region: S::Region,
        gather: Box<Gathered<S::Region>>,
        len: u32,
        context: u64,
    ) -> Result<Option<RawSend>, (Error, S::Region, Box<Gathered<S::Region>>)> {
        let op = Op { op, whole: true };
        let sge = gather.sges.first().copied().unwrap_or_default();
        self.accept(
            member,
            op,
            region,
            0..len as usize,
            sge,
            context,
            Some(gather),
        )
        .map_err(|(error, region, gather)| (error, region, gather.expect("given")))
    }

    /// [`post_send`](Self::post_send), for a gather request too.
    #[inline]
    #[allow(clippy::too_many_arguments, clippy::type_complexity)]
    fn accept(
        &mut self,
        member: usize,
        Op { op, whole }: Op,
        region: S::Region,
        range: Range<usize>,
        sge: ffi::ibv_sge,
        context: u64,
        gather: Option<Box<Gathered<S::Region>>>,
    ) -> Result<Option<RawSend>, (Error, S::Region, Option<Box<Gathered<S::Region>>>)> {
        self.follow_policy(member);
        let len = (range.end - range.start) as u64;
        let seq = self.next_seq;
        self.next_seq += 1;
        let kind = op.kind();
        let m = self.member(member);
        let (tenant, class) = (m.tenant, m.class());
        // Fast path: nothing in the way and the tenant's caps in this
        // scheduler let it go now: post it without a trip through the
        // scheduler's queues (if its shared rate limit agrees).
        // A request sent whole that is longer than a piece waits for the
        // scheduler, which grants it as one piece.
        let fast = self.unhindered(m, kind, len)
            && (!self.capped || self.sched.admit_now(tenant, len, self.now()).is_ok());
        let go = fast && self.rate_allows(member, len);
        let ud = region.datagram();
        let mut extra = region.extra(true, true);
        let sge = match &gather {
            Some(gather) => gather.lower(&mut extra),
            None => sge,
        };
        let message = self.messages.insert(Message {
            member,
            seq,
            op,
            region,
            start: range.start,
            len,
            context,
            // Sent now: its one piece is out, and the last.
            pieces_out: u32::from(go),
            last_granted: go,
            granted: if go { len } else { 0 },
            abandoned: false,
            status: WcStatus::Success,
            gather,
        });
        self.member_mut(member).accepted += 1;
        if go {
            let raw = RawSend::new(RAW_WR | message as u64, op, true, sge, ud, extra, false);
            return Ok(self.launch(member, raw, len));
        }
        let handle = PieceRef { message, seq };
        if fast {
            // Held back by its shared rate limit only (its caps here have
            // been charged): the wake-up time must say when to try again.
            self.add_backlog(member, len);
            self.make_pending(Grant {
                tenant,
                class,
                op: kind,
                handle,
                offset: 0,
                len,
                is_last: true,
            });
            self.pump();
            return Ok(None);
        }
        let mut descriptor = Descriptor::new(tenant, class, kind, len, handle);
        if whole {
            descriptor = descriptor.whole();
        }
        if let Err(rejected) = self.sched.enqueue(descriptor, self.now()) {
            self.member_mut(member).accepted -= 1;
            let message = self.messages.remove(message).expect("just stored");
            return Err((
                Error::Rejected(rejected.reason),
                message.region,
                message.gather,
            ));
        }
        self.gate.enqueued(class);
        self.add_backlog(member, len);
        self.pump();
        Ok(None)
    }

    /// Counts `len` accepted bytes as the tenant's demand until posted.
    pub(super) fn add_backlog(&mut self, member: usize, len: u64) {
        let m = self.member_mut(member);
        if let Some(q) = &m.quota {
            m.backlog += len;
            q.add_backlog(i64::try_from(len).unwrap_or(i64::MAX));
        }
    }

    /// Queues a granted piece behind its queue pair's other pending ones;
    /// returns its member, unless its queue pair was detached.
    pub(super) fn make_pending(&mut self, grant: Grant<PieceRef>) -> Option<(usize, usize)> {
        let Some(msg) = self
            .messages
            .get(grant.handle.message)
            .filter(|m| m.seq == grant.handle.seq)
        else {
            // The queue pair it belonged to was detached.
            return None;
        };
        let member = msg.member;
        let m = self.member_mut(member);
        let class = m.class();
        // A grant larger than the queue pair's pieces may be (a scheduler
        // that chunks more coarsely than the latency bound) goes as
        // several.
        let pieces = m.lane.push_granted(grant);
        for _ in 0..pieces {
            self.order.push(class, member);
        }
        Some((member, pieces))
    }

    /// Posts `member`'s first pending piece if its queue pair, the bulk
    /// budget, its window and its shared rate limit let it go now, noting
    /// when to look again if pacing or the rate limit names a time.
    pub(super) fn post_head(&mut self, member: usize) -> Post {
        let m = self.member(member);
        let Some(len) = m.lane.pending().front().map(|g| g.len) else {
            return Post::Held;
        };
        if self.gate.budget_holds(&m.lane, len) {
            return Post::Budget;
        }
        let (clock, offset) = (&self.clock, self.shared_offset);
        match self
            .gate
            .admits(&m.lane, len, || Self::window_now(clock, offset))
        {
            Admit::Now => {}
            Admit::At(at) => {
                // Window pacing: the window's clock is the engine's plus
                // `offset`.
                let at = at.0.saturating_sub(offset);
                self.timed_wake = self.timed_wake.min(at);
                return Post::Held;
            }
            Admit::AfterCompletion => return Post::Held,
        }
        if !self.rate_allows(member, len) {
            let m = self.member(member);
            if let Some(q) = &m.quota {
                let wait = m.retry_at.saturating_sub(q.now_ns());
                self.timed_wake = self.timed_wake.min(self.clock.now().0 + wait);
            }
            return Post::Held;
        }
        let m = self.member_mut(member);
        let grant = m.lane.pop_pending().expect("checked above");
        self.post_piece(member, grant);
        Post::Posted
    }

    /// Whether `member`'s tenant may post `len` bytes now by its shared rate
    /// limit (charging it if so; otherwise noting when to try again).
    #[inline]
    pub(super) fn rate_allows(&mut self, member: usize, len: u64) -> bool {
        let m = self.member_mut(member);
        let Some(q) = &m.quota else {
            return true;
        };
        let now = q.now_ns();
        if now < m.retry_at {
            return false;
        }
        match q.check_rate(now, len, 1) {
            Ok(()) => true,
            Err(at) => {
                m.retry_at = at;
                false
            }
        }
    }

    /// Posts pending pieces, then new ones from the scheduler, while the
    /// queue pairs, the bulk budget and the rate limits allow.
    pub(super) fn pump(&mut self) {
        self.timed_wake = u64::MAX;
        let wake = self.pump_until();
        self.wake_at.store(wake, Ordering::Release);
    }

    /// [`pump`](Self::pump); returns when the engine next wants to be
    /// pumped if no piece completes and nothing is posted before then.
    pub(super) fn pump_until(&mut self) -> u64 {
        let mut order = std::mem::take(&mut self.order);
        order.drain(|member| self.post_head(member));
        self.order = order;
        let mut reaped = false;
        // Grants waiting for their queue pair do not hold up the others,
        // but their number is bounded so the scheduler keeps the order.
        let pending_cap = Gate::pending_bound(self.members.len(), self.solo);
        let reap_soon = self.clock.now().0.saturating_add(REAP_INTERVAL_NS);
        while self.order.len() < pending_cap {
            if !self.gate.may_grant() {
                // Nothing may go until a bulk piece completes; queue pairs
                // whose owners have not polled may hold finished ones.
                if reaped {
                    return self.soon(reap_soon);
                }
                reaped = true;
                self.reap_others();
                self.release_stalled();
                continue;
            }
            let grant = match self.sched.dequeue(self.now()) {
                Dequeue::Ready(grant) => grant,
                Dequeue::Wait(at) if self.order.is_empty() => return at.0,
                Dequeue::Wait(at) => return at.0.min(self.soon(reap_soon)),
                Dequeue::Empty if self.order.is_empty() => return u64::MAX,
                Dequeue::Empty => return self.soon(reap_soon),
            };
            self.gate.granted(&grant);
            let class = grant.class;
            match self.make_pending(grant) {
                Some((member, 1)) => {
                    let mut order = std::mem::take(&mut self.order);
                    order.drain_newest(class, member, |member| self.post_head(member));
                    self.order = order;
                }
                // Split: as many of its pieces go as its lane lets.
                Some(_) => {
                    let mut order = std::mem::take(&mut self.order);
                    order.drain(|member| self.post_head(member));
                    self.order = order;
                }
                None => {}
            }
        }
        self.soon(reap_soon)
    }

    /// When to look again at pieces that wait: a queue pair with an engine
    /// of its own waits only for its completions or for `timed_wake` (what
    /// its rate limit or window pacing named, as found so far in this
    /// pump); a shared engine also looks again at `reap_soon` for the
    /// other queue pairs' sake.
    #[inline]
    pub(super) fn soon(&self, reap_soon: u64) -> u64 {
        if self.solo {
            self.timed_wake
        } else {
            reap_soon
        }
    }

    /// Polls the queue pairs that hold bulk pieces in the NIC (their
    /// finished requests wait in `done` for their owners).
    /// Takes the queue pairs whose oldest bulk piece has been in the NIC
    /// too long off the bulk budget ([`Gate::release_if_stalled`]).
    pub(super) fn release_stalled(&mut self) {
        let now = Self::window_now(&self.clock, self.shared_offset);
        for m in self.members.values_mut() {
            if self.gate.release_if_stalled(&mut m.lane, now) {
                tracing::warn!(
                    tenant = m.tenant.0,
                    stalled_ms = self.gate.stall_after().0 / 1_000_000,
                    "a scheduled queue pair's oldest piece has been in the NIC too long (its peer posts no receives, or is gone): its bytes no longer hold the other queue pairs' bulk traffic, and it posts nothing more until they complete"
                );
            }
        }
    }

    pub(super) fn reap_others(&mut self) {
        let holders: Vec<usize> = self
            .members
            .iter()
            .filter(|(_, m)| m.side.is_some() && m.lane.bulk_bytes_out() > 0)
            .map(|(k, _)| k)
            .collect();
        for member in holders {
            if let Err(e) = self.reap(member) {
                tracing::warn!(error = %e, "polling a scheduled queue pair failed");
            }
        }
    }

    /// Polls `member`'s completion queue: receives go to its `done`, pieces
    /// are matched to their requests, and finished requests go to `done`.
    pub(super) fn reap(&mut self, member: usize) -> Result<(), Error> {
        let Some(side) = self.member(member).side.clone() else {
            return Ok(());
        };
        let result = side.try_reap();
        let mut raw = std::mem::take(&mut self.scratch);
        if side.mail.load(Ordering::Acquire) {
            std::mem::swap(&mut raw, &mut lock(&side.book).raw);
        }
        self.process(member, &raw);
        raw.clear();
        self.scratch = raw;
        result
    }

    /// Matches the piece completions `member`'s side has collected to
    /// their requests.
    #[inline]
    pub(super) fn process(&mut self, member: usize, raw: &[RawCompletion]) {
        for c in raw {
            if c.wr_id == PARKED_DONE {
                self.parked_done(member);
            } else {
                let message = (c.wr_id & !RAW_WR) as usize;
                self.piece_done(member, message, c.status, c.sampled);
            }
        }
    }

    /// Accounts one finished piece.
    #[inline]
    pub(super) fn piece_done(
        &mut self,
        member: usize,
        message: usize,
        status: WcStatus,
        sampled: bool,
    ) {
        let (clock, offset, host) = (&self.clock, self.shared_offset, self.host_delay);
        let m = self
            .members
            .get_mut(member)
            .expect("a queue pair's member entry lives as long as it does");
        if let (Some(w), Some(q)) = (m.lane.window_mut(), &m.quota) {
            // The queue allowance in bytes at the link's measured rate, the
            // coordinator's gain that brings the tenants' shares to their
            // weights, the weights the link's windows share their growth
            // with, and whether they may keep one piece whatever the delay.
            let now = Self::window_now(clock, offset).0;
            w.signals(&q.window_signals(now));
        } else if let (Some(q), true) = (&m.quota, m.lane.keeps_delay_shift()) {
            // A latency queue pair judging the floor: its delays are the
            // trial's while any tenant has it.
            let now = Self::window_now(clock, offset).0;
            m.lane.set_permit(q.floor_permit(now));
        }
        let now = || Self::window_now(clock, offset);
        let done = if sampled {
            self.gate.completed(&mut m.lane, message, now, host)
        } else {
            self.gate.completed_unsampled(&mut m.lane, message, now)
        };
        if done.is_none() {
            tracing::error!(message, "completion for a piece that is not in flight");
            return;
        }
        if let (Some(w), Some(q)) = (m.lane.window_mut(), &m.quota) {
            // What the window saw, for the coordinator's capacity.
            let v = w.take_verdicts();
            if v.judged > 0 {
                q.record_verdicts(v.judged, v.over_target);
            }
        } else if let (Some(q), Some(shift)) = (&m.quota, m.lane.take_shift_report()) {
            q.report_delay_shift(shift);
        }
        m.raw_out -= 1;
        let Some(msg) = self.messages.get_mut(message) else {
            return;
        };
        if !status.is_success() && msg.status.is_success() {
            msg.status = status;
        }
        if !msg.status.is_success() && !msg.last_granted {
            // Failed with pieces not yet granted: it reports as soon as
            // its pieces in the NIC are back, not after the scheduler has
            // paced out the rest (which is dropped as it comes: its bytes
            // leave the tenant's backlog now).
            msg.last_granted = true;
            msg.abandoned = true;
            let left = msg.len.saturating_sub(msg.granted);
            if let Some(q) = &m.quota {
                m.backlog = m.backlog.saturating_sub(left);
                q.add_backlog(-i64::try_from(left).unwrap_or(i64::MAX));
            }
        }
        if msg.pieces_out == 1 && msg.last_granted {
            // Its last piece: finished (the count is not written first, so
            // the move out of the slab does not wait for that store).
            self.finish(message);
        } else {
            msg.pieces_out -= 1;
        }
    }

    pub(super) fn post_piece(&mut self, member: usize, grant: Grant<PieceRef>) {
        let PieceRef { message, seq } = grant.handle;
        let Some(msg) = self.messages.get_mut(message).filter(|m| m.seq == seq) else {
            return;
        };
        if msg.abandoned {
            // The rest of a request that failed: its bytes left the
            // backlog when it did.
            return;
        }
        if grant.is_last {
            msg.last_granted = true;
        }
        msg.granted = msg.granted.saturating_add(grant.len);
        let m = self
            .members
            .get_mut(member)
            .expect("pending pieces belong to attached queue pairs");
        if let Some(q) = &m.quota {
            m.backlog = m.backlog.saturating_sub(grant.len);
            q.add_backlog(-i64::try_from(grant.len).unwrap_or(i64::MAX));
        }
        if !msg.status.is_success() {
            // The request already failed: its remaining pieces are dropped.
            self.finish_if_done(message);
            return;
        }
        let wr_id = RAW_WR | message as u64;
        if let Some(gather) = &msg.gather {
            if grant.offset != 0 || !grant.is_last {
                // A gather request goes whole (its descriptor says so);
                // should a scheduler split it, fail it rather than send
                // part of its list.
                msg.status = WcStatus::LocalLength;
                self.finish_if_done(message);
                return;
            }
            let mut extra = msg.region.extra(true, true);
            let sge = gather.lower(&mut extra);
            let ud = msg.region.datagram();
            let raw = RawSend::new(wr_id, msg.op, true, sge, ud, extra, false);
            msg.pieces_out += 1;
            if let Some(raw) = self.launch(member, raw, grant.len) {
                self.own_pieces.push(raw);
            }
            return;
        }
        let Some(mut sge) = msg.region.sge(&(msg.start..msg.start + msg.len as usize)) else {
            // Checked at `post_send`; should it ever fail, fail the request
            // rather than leave it waiting forever.
            msg.status = WcStatus::LocalLength;
            self.finish_if_done(message);
            return;
        };
        sge.addr += grant.offset;
        sge.length = u32::try_from(grant.len).unwrap_or(u32::MAX);
        let (ud, extra) = (
            msg.region.datagram(),
            msg.region.extra(grant.offset == 0, grant.is_last),
        );
        // Its request's last piece reports at once; the others may report
        // with a later piece of their list.
        let mut raw = RawSend::new(wr_id, msg.op, grant.is_last, sge, ud, extra, !grant.is_last);
        if let Some((addr, _)) = &mut raw.remote {
            *addr += grant.offset;
        }
        msg.pieces_out += 1;
        if let Some(raw) = self.launch(member, raw, grant.len) {
            self.own_pieces.push(raw);
        }
    }

    /// Counts `raw`, a piece of `len` bytes, as in flight on `member`'s
    /// queue pair and hands it to whoever posts it: back to the caller if
    /// the owner does (it holds the engine, or has no side), else to its
    /// side's book.
    #[inline]
    #[must_use]
    pub(super) fn launch(&mut self, member: usize, raw: RawSend, len: u64) -> Option<RawSend> {
        let message = (raw.wr_id & !RAW_WR) as usize;
        let (clock, offset) = (&self.clock, self.shared_offset);
        let m = self
            .members
            .get_mut(member)
            .expect("pieces belong to attached queue pairs");
        self.gate.sent(&mut m.lane, message, len, || {
            Self::window_now(clock, offset)
        });
        m.raw_out += 1;
        if let Some(q) = &m.quota {
            q.record_posted(len, 1);
        }
        let side = match &m.side {
            // Its owner holds the engine and posts it on the way out; no
            // piece of it waits in the book (that would set the mail).
            Some(side) if member != self.caller || side.mail.load(Ordering::Acquire) => side,
            _ => return Some(raw),
        };
        let now = self.clock.now().0;
        side.deliver(|book| {
            if book.to_post.is_empty() {
                book.decided_at = now;
            }
            book.to_post.push_back(raw);
        });
        if !self.flush.iter().any(|s| Arc::ptr_eq(s, side)) {
            self.flush.push(Arc::clone(side));
        }
        None
    }

    /// Completes a request once all its pieces are granted and done.
    pub(super) fn finish_if_done(&mut self, message: usize) {
        let ready = matches!(
            self.messages.get(message),
            Some(m) if m.pieces_out == 0 && m.last_granted
        );
        if ready {
            self.finish(message);
        }
    }

    /// Completes request `message` (all its pieces are done or dropped).
    #[inline]
    pub(super) fn finish(&mut self, message: usize) {
        let Some(m) = self.messages.remove(message) else {
            return;
        };
        let Some(owner) = self.members.get_mut(m.member) else {
            // Its queue pair was detached: the region is dropped.
            return;
        };
        owner.accepted -= 1;
        if let (Some(side), false) = (&owner.side, m.status.is_success()) {
            side.forget_refused(RAW_WR | message as u64);
        }
        match &owner.side {
            Some(side) if m.member != self.caller => side.deliver_done(m.complete()),
            _ => push_in_place(&mut self.own_done, m.complete()),
        }
    }

    /// Takes a queue pair out: its requests are dropped (their regions
    /// freed once the NIC is done with them, or never) and its share of
    /// the bulk budget returned. `own` is the queue pair of a member
    /// without a side, drained here. A member with a side (on a shared
    /// engine) is drained by the caller after letting go of the engine
    /// ([`Leaving::drain`]): draining waits for the NIC to flush the queue
    /// pair (up to seconds), and must not hold up the other queue pairs.
    pub(super) fn detach(&mut self, member: usize, own: Option<&mut S>) -> Option<Leaving<S>> {
        let m = self.members.remove(member)?;
        if let Some(q) = &m.quota {
            // What is still waiting here is no longer demand.
            q.add_backlog(-i64::try_from(m.backlog).unwrap_or(i64::MAX));
        }
        self.order.remove_lane(m.class(), member);
        self.gate.forget(&m.lane);
        let messages = self.messages.remove_where(|msg| msg.member == member);
        let regions = messages
            .into_iter()
            .flat_map(Message::into_regions)
            .collect();
        let leaving = match (&m.side, own) {
            (Some(side), _) => {
                // Pieces decided and not posted never reach the NIC.
                self.flush.retain(|s| !Arc::ptr_eq(s, side));
                lock(&side.book).to_post.clear();
                Some(Leaving {
                    side: Arc::clone(side),
                    regions,
                })
            }
            (None, Some(qp)) => {
                self.own_pieces.clear();
                keep_unless_drained(qp.shutdown(), regions);
                None
            }
            // No queue pair to drain: keep the regions.
            (None, None) => {
                keep_unless_drained(false, regions);
                None
            }
        };
        // Its queued descriptors stay in the scheduler until handed out
        // and are dropped then (their messages are gone).
        self.pump();
        leaving
    }
}

/// A queue pair taken out of a shared engine ([`Engine::detach`]), still
/// to be drained, outside the engine's lock.
#[must_use = "the queue pair must be drained before its regions are freed"]
pub(super) struct Leaving<S: Sink> {
    side: Arc<Side<S>>,
    /// The regions of its requests, freed once the NIC is done with them.
    regions: Vec<S::Region>,
}

impl<S: Sink> Leaving<S> {
    /// Moves the queue pair to the error state and waits for the NIC to
    /// flush it, then frees its requests' regions (or keeps them for ever
    /// if it could not be drained: the NIC may still reach them).
    pub(super) fn drain(self) {
        let drained = {
            let mut qp = lock(&self.side.qp);
            lock(&self.side.book).to_post.clear();
            qp.shutdown()
        };
        keep_unless_drained(drained, self.regions);
    }
}

/// What the queue pairs' paths (`paths.rs`, `mod.rs`) see of the engine.
impl<S: Sink, Q: PieceScheduler> Engine<S, Q> {
    /// Marks an engine behind one queue pair of its own: no sides, so
    /// nothing but completions and timed wake-ups makes work.
    pub(super) fn set_solo(&mut self) {
        self.solo = true;
    }

    /// The pieces decided for the caller, which it posts itself.
    #[inline]
    pub(super) fn own_pieces_mut(&mut self) -> &mut Vec<RawSend> {
        &mut self.own_pieces
    }

    /// The caller's finished requests, which it takes itself.
    #[inline]
    pub(super) fn own_done_mut(&mut self) -> &mut Vec<Done<S>> {
        &mut self.own_done
    }

    /// [`completed`](Self::completed), the requests of `member` that
    /// finished appended to `out` (straight into it: the engine's own
    /// list is empty between calls).
    #[inline]
    pub(super) fn completed_into(
        &mut self,
        member: usize,
        raw: &[RawCompletion],
        due: bool,
        out: &mut Vec<Done<S>>,
    ) {
        std::mem::swap(out, &mut self.own_done);
        self.completed(member, raw, due);
        std::mem::swap(out, &mut self.own_done);
        out.append(&mut self.own_done);
    }

    /// Runs `f` with `member` as the caller: the pieces decided for it and
    /// its finished requests are left for it (`own_pieces_mut`,
    /// `own_done_mut`) rather than in its side's book.
    #[inline]
    pub(super) fn as_caller<R>(&mut self, member: usize, f: impl FnOnce(&mut Self) -> R) -> R {
        self.caller = member;
        let result = f(self);
        self.caller = usize::MAX;
        result
    }

    /// Moves to `into` the sides whose pieces the caller (whose side is
    /// `own`) posts once the engine's lock is released: its own, and, if
    /// it `helps` (a bulk queue pair), those whose owners have left
    /// decided pieces unposted for [`HELP_AFTER_NS`].
    pub(super) fn sides_to_post(
        &mut self,
        own: &Arc<Side<S>>,
        helps: bool,
        into: &mut Vec<Arc<Side<S>>>,
    ) {
        if self.flush.is_empty() {
            return;
        }
        let now = self.clock.now().0;
        self.flush.retain(|s| {
            let due = Arc::ptr_eq(s, own)
                || (helps && now.saturating_sub(lock(&s.book).decided_at) >= HELP_AFTER_NS);
            if due {
                into.push(Arc::clone(s));
            }
            !due
        });
    }

    /// Remembers that `side` has decided pieces in its book to post.
    pub(super) fn post_later(&mut self, side: &Arc<Side<S>>) {
        if !self.flush.iter().any(|s| Arc::ptr_eq(s, side)) {
            self.flush.push(Arc::clone(side));
        }
    }

    /// Whether a wake-up the engine asked for has come.
    #[inline]
    pub(super) fn wake_due(&self) -> bool {
        wake_due(&self.wake_at, &self.clock)
    }

    /// When the engine wants to be pumped without a completion.
    pub(super) fn wake_instant(&self) -> Option<Instant> {
        wake_instant(&self.wake_at, &self.clock)
    }

    /// What a queue pair reads the engine's wake-ups with, without its
    /// lock: the wake-up time and the clock it is on.
    pub(super) fn wake_handle(&self) -> (Arc<AtomicU64>, EngineClock) {
        (Arc::clone(&self.wake_at), self.clock.clone())
    }

    /// The thread that polls next waited `late` for a CPU after a
    /// completion woke it (see `Waitable::woke_late`).
    pub(super) fn woke_late(&mut self, late: Duration) {
        self.host_delay = Nanos(u64::try_from(late.as_nanos()).unwrap_or(u64::MAX));
    }

    /// Sets `tenant`'s weight and caps, which its quota-table policy no
    /// longer changes ([`SharedScheduler::set_policy`]).
    pub(super) fn set_explicit_policy(
        &mut self,
        tenant: TenantId,
        policy: TenantPolicy,
    ) -> Result<(), Error> {
        self.set_policy(tenant, policy)?;
        if !self.explicit.contains(&tenant) {
            self.explicit.push(tenant);
        }
        Ok(())
    }

    /// Queue pairs attached.
    pub(super) fn queue_pairs(&self) -> usize {
        self.members.len()
    }

    /// Pieces waiting in the scheduler's queues.
    pub(super) fn queued_pieces(&self) -> usize {
        self.sched.len()
    }

    /// Bulk bytes in the NIC.
    pub(super) fn bulk_in_flight(&self) -> u64 {
        self.gate.bulk_in_flight()
    }
}

/// Frees `regions` if their queue pair was `drained`; otherwise the NIC
/// may still reach them, and they are never freed.
fn keep_unless_drained<R>(drained: bool, regions: Vec<R>) {
    if !drained {
        for region in regions {
            std::mem::forget(region);
        }
    }
}
