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

mod accept;
mod complete;
mod post;
mod pump;

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
