//! The composed default scheduler: latency class first (with a starvation
//! guard), then weighted deficit round robin across tenants, each tenant
//! shaped by its GCRA caps.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use crate::{TenantId, TrafficClass};

use crate::chunk::ChunkPolicy;
use crate::descriptor::{Dequeue, Descriptor, Grant};
use crate::error::{ConfigError, RejectReason, Rejected};
use crate::gcra::{update_cap, Gcra};
use crate::guard::StarvationGuard;
use crate::id_hash::TenantIndex;
use crate::nodes::{Nodes, NIL};
use crate::policy::{SchedulerConfig, TenantPolicy};
use crate::ring::Ring;
use crate::time::Nanos;
use crate::Scheduler;

const LATENCY: usize = 0;
const BULK: usize = 1;

fn class_index(class: TrafficClass) -> usize {
    match class {
        TrafficClass::Latency => LATENCY,
        TrafficClass::Bulk => BULK,
    }
}

/// DRR cost of a piece: its bytes, and at least 1 so that a stream of
/// zero-byte work requests still uses up its quantum.
#[inline]
fn cost(len: u64) -> i64 {
    i64::try_from(len.max(1)).unwrap_or(i64::MAX)
}

/// One tenant's FIFO of one class, with its DRR state.
#[derive(Debug, Clone, Copy)]
#[repr(C)]
struct Lane {
    /// First node of the FIFO, [`NIL`] when it is empty.
    head: u32,
    /// Last node of the FIFO; meaningless when it is empty.
    tail: u32,
    /// Bytes of the head descriptor already granted.
    head_sent: u64,
    /// DRR deficit: bytes this queue may still send in its current turn.
    /// Bounded by `(-largest piece, quantum]`.
    deficit: i64,
}

impl Lane {
    const EMPTY: Lane = Lane {
        head: NIL,
        tail: NIL,
        head_sent: 0,
        deficit: 0,
    };
}

/// [`Hot::flags`]: the slot index sits in `class`'s active ring.
#[inline(always)]
const fn in_ring(class: usize) -> u8 {
    1 << class
}

/// [`Hot::flags`]: the `class` queue has received its quantum for the
/// current turn.
#[inline(always)]
const fn in_turn(class: usize) -> u8 {
    4 << class
}

/// [`Hot::flags`]: the tenant has rate caps (its [`Cold::caps`] is `Some`).
const CAPPED: u8 = 16;

/// [`Hot::flags`]: the tenant waits for its caps, out of the rings (its
/// `Caps::parked` is `Some`).
const PARKED: u8 = 32;

/// What every decision about a tenant reads and writes, in one cache line:
/// both class queues with their DRR state, the quantum, the queue length
/// and the ring, turn and cap flags. Policy and caps live in [`Cold`],
/// read only when the tenant has caps or its policy changes.
#[derive(Debug, Clone, Copy)]
#[repr(C, align(64))]
struct Hot {
    lanes: [Lane; 2],
    quantum: i64,
    /// Descriptors queued in both lanes (each holds a node, so this never
    /// exceeds the arena's `u32` indices).
    queued: u32,
    /// [`in_ring`], [`in_turn`], [`CAPPED`] and [`PARKED`] bits.
    flags: u8,
}

impl Hot {
    fn new(quantum: i64, capped: bool) -> Self {
        Hot {
            lanes: [Lane::EMPTY; 2],
            quantum,
            queued: 0,
            flags: if capped { CAPPED } else { 0 },
        }
    }
}

/// What the scheduler knows about a tenant beyond its [`Hot`] slot.
#[derive(Debug)]
struct Cold {
    policy: TenantPolicy,
    caps: Option<Caps>,
}

/// A tenant's GCRA shapers, and whether they hold it back now.
#[derive(Debug)]
struct Caps {
    bytes: Option<Gcra>,
    wrs: Option<Gcra>,
    /// When parked (not eligible under its caps), the time it may go again
    /// and the generation of the timer entry that will wake it. Only a
    /// tenant with caps can be parked, so this lives here, off the path of
    /// uncapped tenants ([`PARKED`] mirrors it in the hot slot).
    parked: Option<(u64, u64)>,
}

impl Caps {
    fn build(old: Option<Caps>, policy: &TenantPolicy) -> Result<Option<Caps>, ConfigError> {
        let (old_bytes, old_wrs, parked) = match old {
            Some(c) => (c.bytes, c.wrs, c.parked),
            None => (None, None, None),
        };
        let bytes = update_cap(old_bytes, policy.byte_cap)?;
        let wrs = update_cap(old_wrs, policy.wr_cap)?;
        Ok(if bytes.is_none() && wrs.is_none() {
            None
        } else {
            Some(Caps { bytes, wrs, parked })
        })
    }

    /// Checks both caps for a piece of `len` bytes; charges both and returns
    /// `Ok` only if both conform, else returns when both would.
    #[inline]
    fn admit(&mut self, now: Nanos, len: u64) -> Result<(), Nanos> {
        crate::gcra::admit_both(&mut self.bytes, &mut self.wrs, now, len)
    }
}

fn quantum(quantum_bytes: u64, weight: u32) -> i64 {
    // Both factors are validated (<= 2^32 and <= 2^20), so this fits.
    i64::try_from(quantum_bytes.saturating_mul(u64::from(weight))).unwrap_or(i64::MAX)
}

/// A descriptor taken out of a removed tenant's queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Drained<H> {
    /// The descriptor as it was enqueued.
    pub descriptor: Descriptor<H>,
    /// Bytes of it already granted (non-zero only for the head of a queue
    /// whose first chunks were posted).
    pub granted_bytes: u64,
}

/// The composed default scheduler.
///
/// * Latency-class descriptors go before bulk ones (strict priority), except
///   that bulk keeps [`SchedulerConfig::bulk_min_share_ppm`] of the bytes
///   while the latency class is saturated.
/// * Within a class, tenants share by weighted deficit round robin over
///   bytes: O(1) per decision whatever the number of tenants (a ring of
///   the tenants that have work, and a FIFO per tenant and class).
/// * WRITE/READ descriptors larger than [`SchedulerConfig::chunk_bytes`]
///   are granted one chunk at a time, each chunk a separate decision.
/// * A tenant with caps is shaped by GCRA; a tenant over its cap leaves the
///   ring, keeping its deficit and place in its turn, and comes back when
///   it conforms again. If no tenant may send, [`Dequeue::Wait`] says when
///   one may. Parking and waking cost O(log parked tenants).
///
/// With only weights set it is work conserving: a tenant that goes idle
/// leaves the ring at once and the others share its bytes.
///
/// Queued descriptors live in one arena with `u32` indices: enqueueing
/// panics if 2^32 - 1 descriptors are already queued across all tenants
/// (at least 96 GiB of them).
///
/// ```
/// use mtrdma_sched::{TenantId, TrafficClass};
/// use mtrdma_sched::{
///     Descriptor, Dequeue, Nanos, Opcode, RateLimit, Scheduler, SchedulerConfig, TenantPolicy,
///     TenantScheduler,
/// };
/// let mut s = TenantScheduler::new(SchedulerConfig::default()).unwrap();
/// s.set_policy(TenantId(1), TenantPolicy::weight(1)).unwrap();
/// s.set_policy(TenantId(2), TenantPolicy::weight(1)).unwrap();
/// let now = Nanos(0);
/// s.enqueue(Descriptor::new(TenantId(1), TrafficClass::Bulk, Opcode::Write, 1 << 20, "bulk"), now).unwrap();
/// s.enqueue(Descriptor::new(TenantId(2), TrafficClass::Latency, Opcode::Send, 16, "probe"), now).unwrap();
/// // The latency descriptor goes first, then the bulk one in 64 KiB chunks.
/// assert_eq!(s.dequeue(now).ready().unwrap().handle, "probe");
/// let first = s.dequeue(now).ready().unwrap();
/// assert_eq!((first.offset, first.len, first.is_last), (0, 64 << 10, false));
/// ```
#[derive(Debug)]
pub struct TenantScheduler<H> {
    config: SchedulerConfig,
    chunks: ChunkPolicy,
    index: TenantIndex,
    /// Per slot, what every decision touches.
    hot: Vec<Hot>,
    /// Per slot, the policy and caps.
    cold: Vec<Cold>,
    nodes: Nodes<H>,
    free: Vec<u32>,
    rings: [Ring; 2],
    timers: BinaryHeap<Reverse<(u64, u32, u64)>>,
    timer_gen: u64,
    guard: StarvationGuard,
    len: usize,
}

impl<H: Clone> TenantScheduler<H> {
    /// An empty scheduler with no tenants.
    ///
    /// # Errors
    /// Whatever [`SchedulerConfig::validate`] finds.
    pub fn new(config: SchedulerConfig) -> Result<Self, ConfigError> {
        config.validate()?;
        Ok(TenantScheduler {
            chunks: ChunkPolicy::new(config.chunk_bytes)?,
            guard: StarvationGuard::new(config.bulk_min_share_ppm, config.quantum_bytes),
            config,
            index: TenantIndex::default(),
            hot: Vec::new(),
            cold: Vec::new(),
            nodes: Nodes::new(),
            free: Vec::new(),
            rings: [Ring::new(), Ring::new()],
            timers: BinaryHeap::new(),
            timer_gen: 0,
            len: 0,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &SchedulerConfig {
        &self.config
    }

    /// Adds `tenant` with `policy`, or changes the policy of a known tenant
    /// while it runs. A changed cap keeps the tenant's GCRA state (its TAT),
    /// so a policy change neither forgives debt nor grants a fresh burst; a
    /// changed weight applies from the tenant's next DRR turn.
    ///
    /// # Errors
    /// Whatever [`TenantPolicy::validate`] finds; the old policy stays.
    pub fn set_policy(
        &mut self,
        tenant: TenantId,
        policy: TenantPolicy,
    ) -> Result<(), ConfigError> {
        policy.validate(tenant)?;
        let Some(s) = self.index.get(tenant) else {
            let caps = Caps::build(None, &policy)?;
            let hot = Hot::new(
                quantum(self.config.quantum_bytes, policy.weight),
                caps.is_some(),
            );
            let cold = Cold { policy, caps };
            let s = match self.free.pop() {
                Some(s) => {
                    // A freed slot may still sit in a ring; keep those flags
                    // so the entry is reused rather than duplicated.
                    let old = &mut self.hot[s as usize];
                    let rings = old.flags & (in_ring(LATENCY) | in_ring(BULK));
                    *old = hot;
                    old.flags |= rings;
                    self.cold[s as usize] = cold;
                    s
                }
                None => {
                    self.hot.push(hot);
                    self.cold.push(cold);
                    u32::try_from(self.hot.len() - 1).unwrap_or(u32::MAX)
                }
            };
            self.index.insert(tenant, s);
            return Ok(());
        };
        // New caps may let it go now; if not, its next visit parks it again.
        self.unpark(s);
        let hot = &mut self.hot[s as usize];
        let cold = &mut self.cold[s as usize];
        // Validated above, so building the caps cannot fail half-way.
        cold.caps = Caps::build(cold.caps.take(), &policy)?;
        if cold.caps.is_some() {
            hot.flags |= CAPPED;
        } else {
            hot.flags &= !CAPPED;
        }
        cold.policy = policy;
        hot.quantum = quantum(self.config.quantum_bytes, policy.weight);
        for lane in &mut hot.lanes {
            lane.deficit = lane.deficit.min(hot.quantum);
        }
        Ok(())
    }

    /// Removes `tenant` and hands back everything it had queued, in FIFO
    /// order per class (latency first). `None` if it was not known.
    pub fn remove_tenant(&mut self, tenant: TenantId) -> Option<Vec<Drained<H>>> {
        let s = self.index.remove(tenant)?;
        let hot = &mut self.hot[s as usize];
        let mut out = Vec::with_capacity(hot.queued as usize);
        for lane in &mut hot.lanes {
            let mut granted = lane.head_sent;
            let mut n = lane.head;
            while n != NIL {
                let (d, next) = self.nodes.release(n);
                if let Some(d) = d {
                    out.push(Drained {
                        descriptor: d,
                        granted_bytes: granted,
                    });
                }
                granted = 0;
                n = next;
            }
            // The deficit goes, the ring membership stays (see set_policy).
            *lane = Lane::EMPTY;
        }
        hot.flags &= !(in_turn(LATENCY) | in_turn(BULK) | PARKED);
        self.len -= hot.queued as usize;
        hot.queued = 0;
        if let Some(c) = self.cold[s as usize].caps.as_mut() {
            c.parked = None;
        }
        self.free.push(s);
        Some(out)
    }

    /// The policy of `tenant`, if known.
    pub fn policy(&self, tenant: TenantId) -> Option<TenantPolicy> {
        self.index.get(tenant).map(|s| self.cold[s as usize].policy)
    }

    /// Charges `tenant`'s caps for `len` bytes sent now without being
    /// queued: the caller's shortcut for a piece when nothing is queued
    /// ahead of it, which must still keep to the tenant's caps. `Ok` (and
    /// charged) if both caps allow it now, or the tenant has none or is
    /// unknown; otherwise when they would, and nothing is charged: queue
    /// the piece instead, and the scheduler shapes it.
    #[inline]
    pub fn admit_now(&mut self, tenant: TenantId, len: u64, now: Nanos) -> Result<(), Nanos> {
        let Some(s) = self.index.get(tenant) else {
            return Ok(());
        };
        if self.hot[s as usize].flags & CAPPED == 0 {
            return Ok(());
        }
        match self.cold[s as usize].caps.as_mut() {
            Some(caps) => caps.admit(now, len),
            None => Ok(()),
        }
    }

    /// Descriptors `tenant` has queued (including one partly granted), if
    /// known.
    pub fn queued(&self, tenant: TenantId) -> Option<usize> {
        self.hot_slot(tenant).map(|s| s.queued as usize)
    }

    /// The DRR deficit of `tenant` in `class`, in bytes: what it may still
    /// send in its current turn. Always within `(-largest piece, quantum]`.
    pub fn deficit(&self, tenant: TenantId, class: TrafficClass) -> Option<i64> {
        self.hot_slot(tenant)
            .map(|s| s.lanes[class_index(class)].deficit)
    }

    /// The DRR quantum of `tenant` (its weight times the base quantum).
    pub fn quantum(&self, tenant: TenantId) -> Option<i64> {
        self.hot_slot(tenant).map(|s| s.quantum)
    }

    /// Number of known tenants.
    pub fn tenant_count(&self) -> usize {
        self.index.len()
    }

    fn hot_slot(&self, tenant: TenantId) -> Option<&Hot> {
        self.index.get(tenant).map(|s| &self.hot[s as usize])
    }

    /// Whether slot `s` is parked by the timer entry `(at, gen)`.
    #[inline]
    fn parked_by(&self, s: u32, at: u64, gen: u64) -> bool {
        self.cold[s as usize]
            .caps
            .as_ref()
            .is_some_and(|c| c.parked == Some((at, gen)))
    }

    /// Puts a slot back into the rings of the classes it has work in.
    fn unpark(&mut self, s: u32) {
        let Some(caps) = self.cold[s as usize].caps.as_mut() else {
            return;
        };
        if caps.parked.take().is_none() {
            return;
        }
        let hot = &mut self.hot[s as usize];
        hot.flags &= !PARKED;
        for (c, lane) in hot.lanes.iter().enumerate() {
            if lane.head != NIL && hot.flags & in_ring(c) == 0 {
                hot.flags |= in_ring(c);
                self.rings[c].push_back(s);
            }
        }
    }

    /// Wakes parked tenants whose time has come, and drops timer entries
    /// that no longer match a parked tenant.
    #[inline]
    fn wake(&mut self, now: Nanos) {
        if self.timers.is_empty() {
            return;
        }
        while let Some(&Reverse((at, s, gen))) = self.timers.peek() {
            let current = self.parked_by(s, at, gen);
            if current && at > now.0 {
                break;
            }
            self.timers.pop();
            if current {
                self.unpark(s);
            }
        }
    }

    /// Serves one piece from `CLASS`'s ring, if any tenant there may send.
    ///
    /// The class is a constant so that each of the two copies indexes its
    /// ring and queues at fixed offsets.
    #[inline(always)]
    fn serve<const CLASS: usize>(&mut self, now: Nanos) -> Option<Grant<H>> {
        // Turns that ended in debt without serving; a whole ring of them
        // means every tenant is paying for a piece larger than its quantum.
        let mut misses = 0usize;
        loop {
            if misses > 0 && misses >= self.rings[CLASS].len() {
                self.fast_forward(CLASS);
                misses = 0;
            }
            let s = self.rings[CLASS].front()?;
            let hot = &mut self.hot[s as usize];
            let lane = &mut hot.lanes[CLASS];
            if lane.head == NIL || hot.flags & PARKED != 0 {
                // Idle or removed: leave the ring. Or over its cap: leave
                // the ring, keeping its deficit and its turn.
                self.rings[CLASS].pop_front();
                hot.flags &= !in_ring(CLASS);
                continue;
            }
            if hot.flags & in_turn(CLASS) == 0 {
                hot.flags |= in_turn(CLASS);
                lane.deficit += hot.quantum;
            }
            if lane.deficit <= 0 {
                // Still paying for a piece larger than its quantum.
                hot.flags &= !in_turn(CLASS);
                self.rings[CLASS].rotate();
                misses += 1;
                continue;
            }
            let n = lane.head;
            let head = self.nodes.get(n)?;
            let remaining = head.bytes - lane.head_sent;
            let len = if head.whole {
                remaining
            } else {
                self.chunks.next_len(head.op, remaining)
            };
            if hot.flags & CAPPED != 0 {
                if let Some(caps) = self.cold[s as usize].caps.as_mut() {
                    if let Err(at) = caps.admit(now, len) {
                        self.park(CLASS, s, at);
                        continue;
                    }
                }
            }
            lane.deficit -= cost(len);
            let grant = self
                .nodes
                .grant_piece(&mut lane.head, &mut lane.head_sent, len)?;
            if grant.is_last {
                hot.queued -= 1;
                self.len -= 1;
            }
            if lane.head == NIL {
                // Idle: leave the ring; unspent credit is not banked, debt is.
                lane.deficit = lane.deficit.min(0);
                hot.flags &= !(in_turn(CLASS) | in_ring(CLASS));
                self.rings[CLASS].pop_front();
            } else if lane.deficit <= 0 {
                hot.flags &= !in_turn(CLASS);
                self.rings[CLASS].rotate();
            }
            if CLASS == LATENCY {
                let bulk_waiting = !self.rings[BULK].is_empty();
                self.guard.on_latency(len, bulk_waiting);
            } else {
                self.guard.on_bulk(len);
            }
            return Some(grant);
        }
    }

    /// Takes slot `s`, over its caps until `at`, out of `class`'s ring (it
    /// is at the front) and sets the timer that will wake it.
    #[cold]
    #[inline(never)]
    fn park(&mut self, class: usize, s: u32, at: Nanos) {
        self.timer_gen += 1;
        let hot = &mut self.hot[s as usize];
        if let Some(c) = self.cold[s as usize].caps.as_mut() {
            c.parked = Some((at.0, self.timer_gen));
            hot.flags |= PARKED;
        }
        self.timers.push(Reverse((at.0, s, self.timer_gen)));
        self.rings[class].pop_front();
        hot.flags &= !in_ring(class);
    }

    /// Skips the DRR rounds in which no tenant of `class` could send: when
    /// every tenant in the ring is in debt, adds to each the quanta of the
    /// rounds it would have gone through before the first of them can send
    /// again. O(ring), and only reached when every piece is larger than its
    /// quantum (a SEND bigger than the quantum), so that such pieces do not
    /// cost one rotation per quantum of their size.
    fn fast_forward(&mut self, class: usize) {
        let rounds = self.rings[class]
            .iter()
            .map(|s| {
                let hot = &self.hot[s as usize];
                let debt = -hot.lanes[class].deficit;
                debt.max(0) / hot.quantum + 1
            })
            .min()
            .unwrap_or(1);
        for s in self.rings[class].iter() {
            let hot = &mut self.hot[s as usize];
            hot.lanes[class].deficit += (rounds - 1) * hot.quantum;
        }
    }

    /// The earliest time a parked tenant may send, dropping stale timers.
    fn next_wake(&mut self) -> Option<Nanos> {
        while let Some(&Reverse((at, s, gen))) = self.timers.peek() {
            if self.parked_by(s, at, gen) {
                return Some(Nanos(at));
            }
            self.timers.pop();
        }
        None
    }
}

/// A refusal; out of line, so the accepting path of `enqueue` stays short.
#[cold]
#[inline(never)]
fn reject<H>(reason: RejectReason, descriptor: Descriptor<H>) -> Rejected<H> {
    Rejected { reason, descriptor }
}

impl<H: Clone> Scheduler<H> for TenantScheduler<H> {
    #[inline]
    fn set_policy(&mut self, tenant: TenantId, policy: TenantPolicy) -> Result<(), ConfigError> {
        TenantScheduler::set_policy(self, tenant, policy)
    }

    #[inline]
    fn policy(&self, tenant: TenantId) -> Option<TenantPolicy> {
        TenantScheduler::policy(self, tenant)
    }

    #[inline]
    fn admit_now(&mut self, tenant: TenantId, len: u64, now: Nanos) -> Result<(), Nanos> {
        TenantScheduler::admit_now(self, tenant, len, now)
    }

    #[inline]
    fn enqueue(&mut self, d: Descriptor<H>, _now: Nanos) -> Result<(), Rejected<H>> {
        let Some(s) = self.index.get(d.tenant) else {
            return Err(reject(RejectReason::UnknownTenant(d.tenant), d));
        };
        let hot = &mut self.hot[s as usize];
        if hot.queued as usize >= self.config.max_queued_per_tenant {
            let reason = RejectReason::QueueFull {
                tenant: d.tenant,
                limit: self.config.max_queued_per_tenant,
            };
            return Err(reject(reason, d));
        }
        let c = class_index(d.class);
        let n = self.nodes.alloc(d);
        let lane = &mut hot.lanes[c];
        if lane.head == NIL {
            lane.head = n;
        } else {
            self.nodes.link(lane.tail, n);
        }
        lane.tail = n;
        if hot.flags & (in_ring(c) | PARKED) == 0 {
            hot.flags |= in_ring(c);
            self.rings[c].push_back(s);
        }
        hot.queued += 1;
        self.len += 1;
        Ok(())
    }
    #[inline]
    fn dequeue(&mut self, now: Nanos) -> Dequeue<H> {
        if self.len == 0 {
            return Dequeue::Empty;
        }
        self.wake(now);
        // Latency first, unless the guard says bulk's share is due. With no
        // latency work queued, serving latency first would find nothing, so
        // the common case (bulk only) goes straight to the bulk ring.
        let bulk_due = self.guard.bulk_first() && !self.rings[BULK].is_empty();
        let latency_first = !bulk_due && !self.rings[LATENCY].is_empty();
        if latency_first {
            if let Some(g) = self.serve::<LATENCY>(now) {
                return Dequeue::Ready(g);
            }
        }
        if let Some(g) = self.serve::<BULK>(now) {
            return Dequeue::Ready(g);
        }
        if !latency_first {
            if let Some(g) = self.serve::<LATENCY>(now) {
                return Dequeue::Ready(g);
            }
        }
        match self.next_wake() {
            Some(at) => Dequeue::Wait(at),
            None => Dequeue::Empty,
        }
    }

    fn len(&self) -> usize {
        self.len
    }
}

#[cfg(test)]
mod tests;
