//! The composed default scheduler: latency class first (with a starvation
//! guard), then weighted deficit round robin across tenants, each tenant
//! shaped by its GCRA caps.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

use mtrdma_core::{TenantId, TrafficClass};

use crate::chunk::ChunkPolicy;
use crate::descriptor::{Dequeue, Descriptor, Grant};
use crate::error::{ConfigError, RejectReason, Rejected};
use crate::gcra::Gcra;
use crate::guard::StarvationGuard;
use crate::id_hash::TenantIndex;
use crate::policy::{SchedulerConfig, TenantPolicy};
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
#[derive(Debug)]
#[repr(C)]
struct ClassQueue<H> {
    items: VecDeque<Descriptor<H>>,
    /// Bytes of the head descriptor already granted.
    head_sent: u64,
    /// DRR deficit: bytes this queue may still send in its current turn.
    /// Bounded by `(-largest piece, quantum]`.
    deficit: i64,
    /// Whether the slot index sits in this class's active ring.
    in_ring: bool,
    /// Whether the queue has received its quantum for the current turn.
    in_turn: bool,
}

impl<H> ClassQueue<H> {
    fn new() -> Self {
        ClassQueue {
            items: VecDeque::new(),
            head_sent: 0,
            deficit: 0,
            in_ring: false,
            in_turn: false,
        }
    }
}

/// A tenant's GCRA shapers, and whether they hold it back now.
#[derive(Debug)]
struct Caps {
    bytes: Option<Gcra>,
    wrs: Option<Gcra>,
    /// When parked (not eligible under its caps), the time it may go again
    /// and the generation of the timer entry that will wake it. Only a
    /// tenant with caps can be parked, so this lives here, off the path of
    /// uncapped tenants.
    parked: Option<(u64, u64)>,
}

impl Caps {
    fn build(
        old: Option<Box<Caps>>,
        policy: &TenantPolicy,
    ) -> Result<Option<Box<Caps>>, ConfigError> {
        let (old_bytes, old_wrs, parked) = match old {
            Some(c) => (c.bytes, c.wrs, c.parked),
            None => (None, None, None),
        };
        let bytes = update_cap(old_bytes, policy.byte_cap)?;
        let wrs = update_cap(old_wrs, policy.wr_cap)?;
        Ok(if bytes.is_none() && wrs.is_none() {
            None
        } else {
            Some(Box::new(Caps { bytes, wrs, parked }))
        })
    }

    /// Checks both caps for a piece of `len` bytes; charges both and returns
    /// `Ok` only if both conform, else returns when both would.
    #[inline]
    fn admit(&mut self, now: Nanos, len: u64) -> Result<(), Nanos> {
        let bytes = self.bytes.as_ref().map(|g| g.peek(now, len));
        let wrs = self.wrs.as_ref().map(|g| g.peek(now, 1));
        match (bytes, wrs) {
            (Some(Err(a)), Some(Err(b))) => Err(a.max(b)),
            (Some(Err(a)), _) | (_, Some(Err(a))) => Err(a),
            _ => {
                if let Some(g) = self.bytes.as_mut() {
                    g.charge(now, len);
                }
                if let Some(g) = self.wrs.as_mut() {
                    g.charge(now, 1);
                }
                Ok(())
            }
        }
    }
}

/// Everything the scheduler knows about one tenant.
///
/// Laid out for the common decision (a bulk piece of an uncapped tenant):
/// `quantum`, `caps` and `queued` in the first cache line, the whole bulk
/// queue in the third, the policy (read only when it changes) in between.
#[derive(Debug)]
#[repr(C, align(64))]
struct Slot<H> {
    quantum: i64,
    /// Rate caps and the parked state, boxed: most tenants have none, and
    /// the hot part of a slot stays small.
    caps: Option<Box<Caps>>,
    queued: usize,
    policy: TenantPolicy,
    queues: [ClassQueue<H>; 2],
}

impl<H> Slot<H> {
    /// Whether the slot is parked by the timer entry `(at, gen)`.
    #[inline]
    fn parked_by(&self, at: u64, gen: u64) -> bool {
        self.caps
            .as_ref()
            .is_some_and(|c| c.parked == Some((at, gen)))
    }
}

/// Whether a slot with these caps waits for them (and is out of the rings).
#[inline]
fn is_parked(caps: Option<&Caps>) -> bool {
    caps.is_some_and(|c| c.parked.is_some())
}

impl<H> Slot<H> {
    fn new(policy: TenantPolicy, quantum_bytes: u64) -> Result<Self, ConfigError> {
        Ok(Slot {
            policy,
            quantum: quantum(quantum_bytes, policy.weight),
            queues: [ClassQueue::new(), ClassQueue::new()],
            queued: 0,
            caps: Caps::build(None, &policy)?,
        })
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
/// ```
/// use mtrdma_core::{TenantId, TrafficClass};
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
    slots: Vec<Slot<H>>,
    free: Vec<u32>,
    rings: [VecDeque<u32>; 2],
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
            slots: Vec::new(),
            free: Vec::new(),
            rings: [VecDeque::new(), VecDeque::new()],
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
            let slot = Slot::new(policy, self.config.quantum_bytes)?;
            let s = match self.free.pop() {
                Some(s) => {
                    // A freed slot may still sit in a ring; keep those flags
                    // so the entry is reused rather than duplicated.
                    let old = &mut self.slots[s as usize];
                    let in_ring = [old.queues[0].in_ring, old.queues[1].in_ring];
                    *old = slot;
                    old.queues[0].in_ring = in_ring[0];
                    old.queues[1].in_ring = in_ring[1];
                    s
                }
                None => {
                    self.slots.push(slot);
                    u32::try_from(self.slots.len() - 1).unwrap_or(u32::MAX)
                }
            };
            self.index.insert(tenant, s);
            return Ok(());
        };
        // New caps may let it go now; if not, its next visit parks it again.
        self.unpark(s);
        let slot = &mut self.slots[s as usize];
        // Validated above, so building the caps cannot fail half-way.
        slot.caps = Caps::build(slot.caps.take(), &policy)?;
        slot.policy = policy;
        slot.quantum = quantum(self.config.quantum_bytes, policy.weight);
        for q in &mut slot.queues {
            q.deficit = q.deficit.min(slot.quantum);
        }
        Ok(())
    }

    /// Removes `tenant` and hands back everything it had queued, in FIFO
    /// order per class (latency first). `None` if it was not known.
    pub fn remove_tenant(&mut self, tenant: TenantId) -> Option<Vec<Drained<H>>> {
        let s = self.index.remove(tenant)?;
        let slot = &mut self.slots[s as usize];
        let mut out = Vec::with_capacity(slot.queued);
        for q in &mut slot.queues {
            let mut granted = q.head_sent;
            for d in q.items.drain(..) {
                out.push(Drained {
                    descriptor: d,
                    granted_bytes: granted,
                });
                granted = 0;
            }
            q.head_sent = 0;
            q.deficit = 0;
            q.in_turn = false;
        }
        self.len -= slot.queued;
        slot.queued = 0;
        if let Some(c) = slot.caps.as_mut() {
            c.parked = None;
        }
        self.free.push(s);
        Some(out)
    }

    /// The policy of `tenant`, if known.
    pub fn policy(&self, tenant: TenantId) -> Option<TenantPolicy> {
        self.slot(tenant).map(|s| s.policy)
    }

    /// Descriptors `tenant` has queued (including one partly granted), if
    /// known.
    pub fn queued(&self, tenant: TenantId) -> Option<usize> {
        self.slot(tenant).map(|s| s.queued)
    }

    /// The DRR deficit of `tenant` in `class`, in bytes: what it may still
    /// send in its current turn. Always within `(-largest piece, quantum]`.
    pub fn deficit(&self, tenant: TenantId, class: TrafficClass) -> Option<i64> {
        self.slot(tenant)
            .map(|s| s.queues[class_index(class)].deficit)
    }

    /// The DRR quantum of `tenant` (its weight times the base quantum).
    pub fn quantum(&self, tenant: TenantId) -> Option<i64> {
        self.slot(tenant).map(|s| s.quantum)
    }

    /// Number of known tenants.
    pub fn tenant_count(&self) -> usize {
        self.index.len()
    }

    fn slot(&self, tenant: TenantId) -> Option<&Slot<H>> {
        self.index.get(tenant).map(|s| &self.slots[s as usize])
    }

    /// Puts a slot back into the rings of the classes it has work in.
    fn unpark(&mut self, s: u32) {
        let slot = &mut self.slots[s as usize];
        if slot.caps.as_mut().and_then(|c| c.parked.take()).is_none() {
            return;
        }
        for (c, q) in slot.queues.iter_mut().enumerate() {
            if !q.items.is_empty() && !q.in_ring {
                q.in_ring = true;
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
            let current = self.slots[s as usize].parked_by(at, gen);
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
            let &s = self.rings[CLASS].front()?;
            let slot = &mut self.slots[s as usize];
            let q = &mut slot.queues[CLASS];
            let Some(head) = q.items.front() else {
                // Idle or removed: leave the ring.
                self.rings[CLASS].pop_front();
                q.in_ring = false;
                continue;
            };
            if is_parked(slot.caps.as_deref()) {
                // Over its cap: leave the ring, keeping its deficit and its
                // turn.
                self.rings[CLASS].pop_front();
                q.in_ring = false;
                continue;
            }
            if !q.in_turn {
                q.in_turn = true;
                q.deficit += slot.quantum;
            }
            if q.deficit <= 0 {
                // Still paying for a piece larger than its quantum.
                q.in_turn = false;
                self.rings[CLASS].rotate_left(1);
                misses += 1;
                continue;
            }
            let remaining = head.bytes - q.head_sent;
            let len = self.chunks.next_len(head.op, remaining);
            if let Some(caps) = slot.caps.as_mut() {
                if let Err(at) = caps.admit(now, len) {
                    self.park(CLASS, s, at);
                    continue;
                }
            }
            q.deficit -= cost(len);
            let offset = q.head_sent;
            let grant = if len == remaining {
                let d = q.items.pop_front()?;
                q.head_sent = 0;
                slot.queued -= 1;
                self.len -= 1;
                Grant {
                    tenant: d.tenant,
                    class: d.class,
                    op: d.op,
                    handle: d.handle,
                    offset,
                    len,
                    is_last: true,
                }
            } else {
                q.head_sent += len;
                Grant {
                    tenant: head.tenant,
                    class: head.class,
                    op: head.op,
                    handle: head.handle.clone(),
                    offset,
                    len,
                    is_last: false,
                }
            };
            if q.items.is_empty() {
                // Idle: leave the ring; unspent credit is not banked, debt is.
                q.deficit = q.deficit.min(0);
                q.in_turn = false;
                q.in_ring = false;
                self.rings[CLASS].pop_front();
            } else if q.deficit <= 0 {
                q.in_turn = false;
                self.rings[CLASS].rotate_left(1);
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
        let slot = &mut self.slots[s as usize];
        if let Some(c) = slot.caps.as_mut() {
            c.parked = Some((at.0, self.timer_gen));
        }
        self.timers.push(Reverse((at.0, s, self.timer_gen)));
        self.rings[class].pop_front();
        slot.queues[class].in_ring = false;
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
            .map(|&s| {
                let slot = &self.slots[s as usize];
                let debt = -slot.queues[class].deficit;
                debt.max(0) / slot.quantum + 1
            })
            .min()
            .unwrap_or(1);
        for &s in &self.rings[class] {
            let slot = &mut self.slots[s as usize];
            slot.queues[class].deficit += (rounds - 1) * slot.quantum;
        }
    }

    /// The earliest time a parked tenant may send, dropping stale timers.
    fn next_wake(&mut self) -> Option<Nanos> {
        while let Some(&Reverse((at, s, gen))) = self.timers.peek() {
            if self.slots[s as usize].parked_by(at, gen) {
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

fn update_cap(
    old: Option<Gcra>,
    new: Option<crate::gcra::RateLimit>,
) -> Result<Option<Gcra>, ConfigError> {
    match (old, new) {
        (_, None) => Ok(None),
        (None, Some(limit)) => Gcra::new(limit).map(Some),
        (Some(mut g), Some(limit)) => {
            g.set_limit(limit)?;
            Ok(Some(g))
        }
    }
}

impl<H: Clone> Scheduler<H> for TenantScheduler<H> {
    fn enqueue(&mut self, d: Descriptor<H>, _now: Nanos) -> Result<(), Rejected<H>> {
        let Some(s) = self.index.get(d.tenant) else {
            return Err(reject(RejectReason::UnknownTenant(d.tenant), d));
        };
        let slot = &mut self.slots[s as usize];
        if slot.queued >= self.config.max_queued_per_tenant {
            let reason = RejectReason::QueueFull {
                tenant: d.tenant,
                limit: self.config.max_queued_per_tenant,
            };
            return Err(reject(reason, d));
        }
        let c = class_index(d.class);
        let q = &mut slot.queues[c];
        q.items.push_back(d);
        if !q.in_ring && !is_parked(slot.caps.as_deref()) {
            q.in_ring = true;
            self.rings[c].push_back(s);
        }
        slot.queued += 1;
        self.len += 1;
        Ok(())
    }

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
mod tests {
    use super::*;

    #[test]
    fn slot_is_three_cache_lines_with_the_bulk_queue_in_the_last() {
        assert_eq!(std::mem::size_of::<Slot<u64>>(), 192);
        assert_eq!(std::mem::align_of::<Slot<u64>>(), 64);
        let bulk = std::mem::offset_of!(Slot<u64>, queues) + std::mem::size_of::<ClassQueue<u64>>();
        assert!(bulk >= 128);
    }
}
