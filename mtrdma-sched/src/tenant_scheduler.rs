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

/// A tenant's GCRA shapers.
#[derive(Debug)]
struct Caps {
    bytes: Option<Gcra>,
    wrs: Option<Gcra>,
}

impl Caps {
    fn build(
        old: Option<Box<Caps>>,
        policy: &TenantPolicy,
    ) -> Result<Option<Box<Caps>>, ConfigError> {
        let (old_bytes, old_wrs) = match old {
            Some(c) => (c.bytes, c.wrs),
            None => (None, None),
        };
        let bytes = update_cap(old_bytes, policy.byte_cap)?;
        let wrs = update_cap(old_wrs, policy.wr_cap)?;
        Ok(if bytes.is_none() && wrs.is_none() {
            None
        } else {
            Some(Box::new(Caps { bytes, wrs }))
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
#[derive(Debug)]
struct Slot<H> {
    policy: TenantPolicy,
    quantum: i64,
    queues: [ClassQueue<H>; 2],
    queued: usize,
    /// Rate caps, boxed: most tenants have none, and the hot part of a
    /// slot stays small.
    caps: Option<Box<Caps>>,
    /// When parked (not eligible under its caps), the time it may go again
    /// and the generation of the timer entry that will wake it.
    parked: Option<(u64, u64)>,
}

impl<H> Slot<H> {
    fn new(policy: TenantPolicy, quantum_bytes: u64) -> Result<Self, ConfigError> {
        Ok(Slot {
            policy,
            quantum: quantum(quantum_bytes, policy.weight),
            queues: [ClassQueue::new(), ClassQueue::new()],
            queued: 0,
            caps: Caps::build(None, &policy)?,
            parked: None,
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
        let slot = &mut self.slots[s as usize];
        // Validated above, so building the caps cannot fail half-way.
        slot.caps = Caps::build(slot.caps.take(), &policy)?;
        slot.policy = policy;
        slot.quantum = quantum(self.config.quantum_bytes, policy.weight);
        for q in &mut slot.queues {
            q.deficit = q.deficit.min(slot.quantum);
        }
        // New caps may let it go now; if not, its next visit parks it again.
        self.unpark(s);
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
        slot.parked = None;
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
        if slot.parked.take().is_none() {
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
            let current = self.slots[s as usize].parked == Some((at, gen));
            if current && at > now.0 {
                break;
            }
            self.timers.pop();
            if current {
                self.unpark(s);
            }
        }
    }

    /// Serves one piece from `class`'s ring, if any tenant there may send.
    fn serve(&mut self, class: usize, now: Nanos) -> Option<Grant<H>> {
        // Turns that ended in debt without serving; a whole ring of them
        // means every tenant is paying for a piece larger than its quantum.
        let mut misses = 0usize;
        loop {
            if misses >= self.rings[class].len() && misses > 0 {
                self.fast_forward(class);
                misses = 0;
            }
            let &s = self.rings[class].front()?;
            let slot = &mut self.slots[s as usize];
            let q = &mut slot.queues[class];
            if q.items.is_empty() || slot.parked.is_some() {
                // Idle, removed, or over its cap: leave the ring. A parked
                // tenant keeps its deficit and its turn.
                self.rings[class].pop_front();
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
                self.rings[class].rotate_left(1);
                misses += 1;
                continue;
            }
            let head = q.items.front()?;
            let len = self.chunks.next_len(head.op, head.bytes - q.head_sent);
            if let Err(at) = slot.caps.as_mut().map_or(Ok(()), |c| c.admit(now, len)) {
                self.timer_gen += 1;
                slot.parked = Some((at.0, self.timer_gen));
                self.timers.push(Reverse((at.0, s, self.timer_gen)));
                self.rings[class].pop_front();
                slot.queues[class].in_ring = false;
                continue;
            }
            let q = &mut slot.queues[class];
            q.deficit -= cost(len);
            let offset = q.head_sent;
            q.head_sent += len;
            let grant = if q.head_sent == q.items.front()?.bytes {
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
                let d = q.items.front()?;
                Grant {
                    tenant: d.tenant,
                    class: d.class,
                    op: d.op,
                    handle: d.handle.clone(),
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
                self.rings[class].pop_front();
            } else if q.deficit <= 0 {
                q.in_turn = false;
                self.rings[class].rotate_left(1);
            }
            if class == LATENCY {
                let bulk_waiting = !self.rings[BULK].is_empty();
                self.guard.on_latency(len, bulk_waiting);
            } else {
                self.guard.on_bulk(len);
            }
            return Some(grant);
        }
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
            if self.slots[s as usize].parked == Some((at, gen)) {
                return Some(Nanos(at));
            }
            self.timers.pop();
        }
        None
    }
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
            return Err(Rejected {
                reason: RejectReason::UnknownTenant(d.tenant),
                descriptor: d,
            });
        };
        let slot = &mut self.slots[s as usize];
        if slot.queued >= self.config.max_queued_per_tenant {
            return Err(Rejected {
                reason: RejectReason::QueueFull {
                    tenant: d.tenant,
                    limit: self.config.max_queued_per_tenant,
                },
                descriptor: d,
            });
        }
        let c = class_index(d.class);
        let q = &mut slot.queues[c];
        q.items.push_back(d);
        if !q.in_ring && slot.parked.is_none() {
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
        let order = if self.guard.bulk_first() && !self.rings[BULK].is_empty() {
            [BULK, LATENCY]
        } else {
            [LATENCY, BULK]
        };
        for class in order {
            if let Some(g) = self.serve(class, now) {
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
