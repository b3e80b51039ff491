//! The built-in scheduler's three ideas as pieces that compose through the
//! [`Scheduler`] trait: weighted deficit round robin across tenants
//! ([`Drr`]), strict priority of the latency class with a starvation guard
//! ([`Priority`]), and GCRA caps that shape each tenant's pieces before
//! they are scheduled ([`Shaped`]).
//!
//! [`composed`] puts them together as the built-in
//! [`TenantScheduler`](crate::TenantScheduler) behaves: caps outside (a
//! tenant's caps count its bytes of both classes), then latency first,
//! then DRR within each class. Take them apart to build other schedulers:
//! `Priority<FifoScheduler, Drr<H>>` serves the latency class in arrival
//! order; `Shaped<H, FifoScheduler>` is a FIFO with per-tenant caps. The
//! fused `TenantScheduler` stays the default for its cost (one cache line
//! per tenant per decision); `benches/sched.rs` compares the two.
//!
//! ```
//! use mtrdma_sched::compose::composed;
//! use mtrdma_sched::{
//!     Descriptor, Dequeue, Nanos, Opcode, RateLimit, Scheduler, SchedulerConfig, TenantId,
//!     TenantPolicy, TrafficClass,
//! };
//!
//! let mut s = composed::<u32>(&SchedulerConfig::default()).unwrap();
//! s.set_policy(TenantId(1), TenantPolicy::weight(1)).unwrap();
//! s.set_policy(TenantId(2), TenantPolicy::weight(1)).unwrap();
//! let d = |t, class, h| Descriptor::new(TenantId(t), class, Opcode::Write, 1 << 10, h);
//! s.enqueue(d(1, TrafficClass::Bulk, 10), Nanos(0)).unwrap();
//! s.enqueue(d(2, TrafficClass::Latency, 20), Nanos(0)).unwrap();
//! // The latency request goes first although it came second.
//! assert!(matches!(s.dequeue(Nanos(0)), Dequeue::Ready(g) if g.handle == 20));
//! assert!(matches!(s.dequeue(Nanos(0)), Dequeue::Ready(g) if g.handle == 10));
//! ```

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

use crate::chunk::ChunkPolicy;
use crate::descriptor::{Dequeue, Descriptor, Grant};
use crate::error::{ConfigError, RejectReason, Rejected};
use crate::gcra::{update_cap, Gcra};
use crate::guard::StarvationGuard;
use crate::id_hash::{IdMap, TenantIndex};
use crate::nodes::{Nodes, NIL};
use crate::policy::{SchedulerConfig, TenantPolicy};
use crate::ring::Ring;
use crate::time::Nanos;
use crate::{Scheduler, TenantId, TrafficClass};

/// DRR cost of a piece: its bytes, and at least 1 so that a stream of
/// zero-byte work requests still uses up its quantum.
#[inline]
fn cost(len: u64) -> i64 {
    i64::try_from(len.max(1)).unwrap_or(i64::MAX)
}

/// One tenant's queue in a [`Drr`]: a list in the node arena, and its
/// DRR state.
#[derive(Debug, Clone, Copy)]
struct DrrSlot {
    /// First node of the FIFO, [`NIL`] when it is empty.
    head: u32,
    /// Last node of the FIFO; meaningless when it is empty.
    tail: u32,
    /// Descriptors queued.
    queued: u32,
    in_ring: bool,
    in_turn: bool,
    /// Bytes of the head descriptor already granted.
    head_sent: u64,
    /// Bytes it may still send in its current turn.
    deficit: i64,
    quantum: i64,
}

/// Weighted deficit round robin across tenants, one class, O(1) per
/// decision: each backlogged tenant sends up to its weight times
/// `quantum_bytes` per round, WRITE and READ split into pieces of at most
/// `chunk_bytes` (a descriptor marked [`whole`](Descriptor::whole) goes in
/// one piece). No caps and no classes: compose with [`Shaped`] and
/// [`Priority`] for those.
#[derive(Debug)]
pub struct Drr<H> {
    chunks: ChunkPolicy,
    quantum_bytes: u64,
    max_queued: usize,
    index: TenantIndex,
    slots: Vec<DrrSlot>,
    /// Per slot, the tenant's policy (read only by `policy`).
    policies: Vec<TenantPolicy>,
    nodes: Nodes<H>,
    ring: Ring,
    len: usize,
}

impl<H: Clone> Drr<H> {
    /// An empty scheduler with `config`'s chunk size, quantum and queue
    /// bound (its `bulk_min_share_ppm` is [`Priority`]'s).
    ///
    /// # Errors
    /// Whatever [`SchedulerConfig::validate`] finds.
    pub fn new(config: &SchedulerConfig) -> Result<Drr<H>, ConfigError> {
        config.validate()?;
        Ok(Drr {
            chunks: ChunkPolicy::new(config.chunk_bytes)?,
            quantum_bytes: config.quantum_bytes,
            max_queued: config.max_queued_per_tenant,
            index: TenantIndex::default(),
            slots: Vec::new(),
            policies: Vec::new(),
            nodes: Nodes::new(),
            ring: Ring::new(),
            len: 0,
        })
    }

    fn quantum(&self, weight: u32) -> i64 {
        // Both factors are validated (<= 2^32 and <= 2^20), so this fits.
        i64::try_from(self.quantum_bytes.saturating_mul(u64::from(weight))).unwrap_or(i64::MAX)
    }

    /// When every tenant in the ring is in debt (paying for pieces larger
    /// than their quanta), gives each the quanta of the rounds that would
    /// pass before the first of them can send again.
    #[cold]
    #[inline(never)]
    fn fast_forward(&mut self) {
        let rounds = self
            .ring
            .iter()
            .map(|s| {
                let slot = &self.slots[s as usize];
                (-slot.deficit).max(0) / slot.quantum + 1
            })
            .min()
            .unwrap_or(1);
        for s in self.ring.iter() {
            let slot = &mut self.slots[s as usize];
            slot.deficit += (rounds - 1) * slot.quantum;
        }
    }
}

impl<H: Clone> Scheduler<H> for Drr<H> {
    #[inline(always)]
    fn enqueue(&mut self, d: Descriptor<H>, _now: Nanos) -> Result<(), Rejected<H>> {
        let Some(s) = self.index.get(d.tenant) else {
            let reason = RejectReason::UnknownTenant(d.tenant);
            return Err(Rejected {
                reason,
                descriptor: d,
            });
        };
        let slot = &mut self.slots[s as usize];
        if slot.queued as usize >= self.max_queued {
            let reason = RejectReason::QueueFull {
                tenant: d.tenant,
                limit: self.max_queued,
            };
            return Err(Rejected {
                reason,
                descriptor: d,
            });
        }
        let n = self.nodes.alloc(d);
        if slot.head == NIL {
            slot.head = n;
        } else {
            self.nodes.link(slot.tail, n);
        }
        slot.tail = n;
        slot.queued += 1;
        if !slot.in_ring {
            slot.in_ring = true;
            self.ring.push_back(s);
        }
        self.len += 1;
        Ok(())
    }

    #[inline(always)]
    fn dequeue(&mut self, _now: Nanos) -> Dequeue<H> {
        let mut misses = 0usize;
        loop {
            if misses > 0 && misses >= self.ring.len() {
                self.fast_forward();
                misses = 0;
            }
            let Some(s) = self.ring.front() else {
                return Dequeue::Empty;
            };
            let slot = &mut self.slots[s as usize];
            let Some(head) = self.nodes.get(slot.head) else {
                // Idle: leave the ring.
                slot.in_ring = false;
                slot.in_turn = false;
                self.ring.pop_front();
                continue;
            };
            if !slot.in_turn {
                slot.in_turn = true;
                slot.deficit += slot.quantum;
            }
            if slot.deficit <= 0 {
                slot.in_turn = false;
                self.ring.rotate();
                misses += 1;
                continue;
            }
            let remaining = head.bytes - slot.head_sent;
            let len = if head.whole {
                remaining
            } else {
                self.chunks.next_len(head.op, remaining)
            };
            slot.deficit -= cost(len);
            let Some(grant) = self
                .nodes
                .grant_piece(&mut slot.head, &mut slot.head_sent, len)
            else {
                return Dequeue::Empty;
            };
            if grant.is_last {
                slot.queued -= 1;
                self.len -= 1;
            }
            if slot.head == NIL {
                // Unspent credit is not banked; debt is.
                slot.deficit = slot.deficit.min(0);
                slot.in_turn = false;
                slot.in_ring = false;
                self.ring.pop_front();
            } else if slot.deficit <= 0 {
                slot.in_turn = false;
                self.ring.rotate();
            }
            return Dequeue::Ready(grant);
        }
    }

    #[inline]
    fn len(&self) -> usize {
        self.len
    }

    /// Adds `tenant` or changes its weight (from its next turn); caps in
    /// `policy` are kept for [`policy`](Scheduler::policy) but not
    /// applied here (that is [`Shaped`]'s part).
    fn set_policy(&mut self, tenant: TenantId, policy: TenantPolicy) -> Result<(), ConfigError> {
        policy.validate(tenant)?;
        let quantum = self.quantum(policy.weight);
        match self.index.get(tenant) {
            Some(s) => {
                let slot = &mut self.slots[s as usize];
                slot.quantum = quantum;
                slot.deficit = slot.deficit.min(quantum);
                self.policies[s as usize] = policy;
            }
            None => {
                // Slots are `u32`s: four billion tenants is beyond any NIC.
                let s = u32::try_from(self.slots.len()).unwrap_or(u32::MAX);
                self.slots.push(DrrSlot {
                    head: NIL,
                    tail: NIL,
                    queued: 0,
                    in_ring: false,
                    in_turn: false,
                    head_sent: 0,
                    deficit: 0,
                    quantum,
                });
                self.policies.push(policy);
                self.index.insert(tenant, s);
            }
        }
        Ok(())
    }

    fn policy(&self, tenant: TenantId) -> Option<TenantPolicy> {
        self.index.get(tenant).map(|s| self.policies[s as usize])
    }
}

/// Strict priority of the latency class over bulk, with a starvation
/// guard: latency-class descriptors go to `Hi` and are served first;
/// bulk ones go to `Lo`, which keeps `bulk_min_share_ppm` of the bytes
/// while the latency class is saturated (the guard's credit is bounded by
/// one quantum, so neither class banks an advantage while the other is
/// idle).
#[derive(Debug)]
pub struct Priority<Hi, Lo> {
    hi: Hi,
    lo: Lo,
    guard: StarvationGuard,
}

impl<Hi, Lo> Priority<Hi, Lo> {
    /// `hi` for the latency class, `lo` for bulk; bulk keeps
    /// `bulk_min_share_ppm` (parts per million) of the bytes under a
    /// saturated latency class, its credit bounded by `quantum_bytes`.
    ///
    /// # Errors
    /// [`ConfigError::BulkShareTooLarge`] for a share of 1,000,000 or more.
    pub fn new(
        hi: Hi,
        lo: Lo,
        bulk_min_share_ppm: u32,
        quantum_bytes: u64,
    ) -> Result<Priority<Hi, Lo>, ConfigError> {
        if bulk_min_share_ppm >= 1_000_000 {
            return Err(ConfigError::BulkShareTooLarge {
                ppm: bulk_min_share_ppm,
            });
        }
        Ok(Priority {
            hi,
            lo,
            guard: StarvationGuard::new(bulk_min_share_ppm, quantum_bytes),
        })
    }

    /// The latency class's scheduler.
    pub fn hi(&self) -> &Hi {
        &self.hi
    }

    /// The bulk class's scheduler.
    pub fn lo(&self) -> &Lo {
        &self.lo
    }
}

impl<H, Hi: Scheduler<H>, Lo: Scheduler<H>> Scheduler<H> for Priority<Hi, Lo> {
    #[inline(always)]
    fn enqueue(&mut self, d: Descriptor<H>, now: Nanos) -> Result<(), Rejected<H>> {
        match d.class {
            TrafficClass::Latency => self.hi.enqueue(d, now),
            TrafficClass::Bulk => self.lo.enqueue(d, now),
        }
    }

    #[inline(always)]
    fn dequeue(&mut self, now: Nanos) -> Dequeue<H> {
        let bulk_first = self.guard.bulk_first() && !self.lo.is_empty();
        let (first, second) = if bulk_first || self.hi.is_empty() {
            (self.lo.dequeue(now), None)
        } else {
            (self.hi.dequeue(now), Some(()))
        };
        let latency_first = second.is_some();
        let (answer, from_hi) = match first {
            Dequeue::Ready(g) => (Dequeue::Ready(g), latency_first),
            other => {
                let then = if latency_first {
                    self.lo.dequeue(now)
                } else {
                    self.hi.dequeue(now)
                };
                match (other, then) {
                    (_, Dequeue::Ready(g)) => (Dequeue::Ready(g), !latency_first),
                    (Dequeue::Wait(a), Dequeue::Wait(b)) => (Dequeue::Wait(a.min(b)), false),
                    (Dequeue::Wait(a), _) | (_, Dequeue::Wait(a)) => (Dequeue::Wait(a), false),
                    _ => (Dequeue::Empty, false),
                }
            }
        };
        if let Dequeue::Ready(g) = &answer {
            if from_hi {
                let bulk_waiting = !self.lo.is_empty();
                self.guard.on_latency(g.len, bulk_waiting);
            } else {
                self.guard.on_bulk(g.len);
            }
        }
        answer
    }

    #[inline]
    fn len(&self) -> usize {
        self.hi.len() + self.lo.len()
    }

    fn set_policy(&mut self, tenant: TenantId, policy: TenantPolicy) -> Result<(), ConfigError> {
        self.hi.set_policy(tenant, policy)?;
        self.lo.set_policy(tenant, policy)
    }

    fn policy(&self, tenant: TenantId) -> Option<TenantPolicy> {
        self.lo.policy(tenant).or_else(|| self.hi.policy(tenant))
    }

    fn admit_now(&mut self, tenant: TenantId, len: u64, now: Nanos) -> Result<(), Nanos> {
        self.hi.admit_now(tenant, len, now)?;
        self.lo.admit_now(tenant, len, now)
    }
}

/// A piece of a descriptor that [`Shaped`] let through to its inner
/// scheduler: the caller's handle, where the piece starts in the
/// descriptor, and whether it ends it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Part<H> {
    /// The caller's handle.
    pub handle: H,
    /// Offset of the piece in its descriptor.
    pub base: u64,
    /// Whether the piece is the descriptor's last.
    pub last: bool,
}

/// One tenant's caps and the descriptors they hold back.
#[derive(Debug)]
struct ShapeSlot<H> {
    policy: TenantPolicy,
    bytes: Option<Gcra>,
    wrs: Option<Gcra>,
    /// Descriptors waiting for the caps, with the bytes of the first
    /// already let through.
    held: VecDeque<Descriptor<H>>,
    head_released: u64,
    /// The timer entry (time, generation) that wakes it, if waiting.
    wake: Option<(u64, u64)>,
}

impl<H> ShapeSlot<H> {
    fn capped(&self) -> bool {
        self.bytes.is_some() || self.wrs.is_some()
    }

    /// Charges both caps for a piece of `len` bytes if both allow it now;
    /// otherwise says when they would.
    fn admit(&mut self, now: Nanos, len: u64) -> Result<(), Nanos> {
        crate::gcra::admit_both(&mut self.bytes, &mut self.wrs, now, len)
    }
}

/// GCRA caps per tenant (bytes per second and work requests per second,
/// each with a burst) in front of any scheduler `S`: a capped tenant's
/// descriptors are let through to `S` one piece at a time (pieces of at
/// most `chunk_bytes`, as the scheduler would grant them), each when its
/// caps allow, so `S` only ever sees work that conforms. Uncapped tenants
/// pass straight through. A changed cap keeps its GCRA state, so a policy
/// change neither forgives debt nor grants a fresh burst.
#[derive(Debug)]
pub struct Shaped<H, S> {
    inner: S,
    chunks: ChunkPolicy,
    tenants: IdMap<ShapeSlot<H>>,
    timers: BinaryHeap<Reverse<(u64, TenantId, u64)>>,
    timer_gen: u64,
    /// Descriptors accepted and not yet granted whole.
    queued: usize,
    /// Tenants with caps: with none, descriptors pass without a lookup.
    capped: usize,
}

impl<H: Clone, S: Scheduler<Part<H>>> Shaped<H, S> {
    /// Caps in front of `inner`, letting pieces of at most `chunk_bytes`
    /// through.
    ///
    /// # Errors
    /// [`ConfigError`] for a chunk size of 0.
    pub fn new(inner: S, chunk_bytes: u64) -> Result<Shaped<H, S>, ConfigError> {
        Ok(Shaped {
            inner,
            chunks: ChunkPolicy::new(chunk_bytes)?,
            tenants: IdMap::default(),
            timers: BinaryHeap::new(),
            timer_gen: 0,
            queued: 0,
            capped: 0,
        })
    }

    /// The scheduler behind the caps.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    /// Lets `tenant`'s held descriptors through while its caps allow;
    /// sets a timer for the rest.
    fn release(&mut self, tenant: TenantId, now: Nanos) {
        let Some(slot) = self.tenants.get_mut(&tenant) else {
            return;
        };
        slot.wake = None;
        while let Some(head) = slot.held.front() {
            let (bytes, whole, op) = (head.bytes, head.whole, head.op);
            let remaining = bytes - slot.head_released;
            let len = if whole || !slot.capped() {
                remaining
            } else {
                self.chunks.next_len(op, remaining)
            };
            if let Err(at) = slot.admit(now, len) {
                self.timer_gen += 1;
                slot.wake = Some((at.0, self.timer_gen));
                self.timers.push(Reverse((at.0, tenant, self.timer_gen)));
                return;
            }
            let head = slot.held.front().expect("looked at above");
            let base = slot.head_released;
            let last = len == remaining;
            let part = Part {
                handle: head.handle.clone(),
                base,
                last,
            };
            let piece = Descriptor::new(head.tenant, head.class, op, len, part).whole();
            if last {
                slot.held.pop_front();
                slot.head_released = 0;
            } else {
                slot.head_released += len;
            }
            // Accepted before (the tenant is known to `inner`, and its
            // queue bound counts pieces): a refusal now drops the piece,
            // which would lose bytes, so say so loudly.
            if let Err(r) = self.inner.enqueue(piece, now) {
                debug_assert!(false, "a shaped piece was refused: {}", r.reason);
            }
        }
    }

    /// Releases every tenant whose timer has come.
    fn wake(&mut self, now: Nanos) {
        while let Some(&Reverse((at, tenant, gen))) = self.timers.peek() {
            let current = self
                .tenants
                .get(&tenant)
                .is_some_and(|s| s.wake == Some((at, gen)));
            if current && at > now.0 {
                break;
            }
            self.timers.pop();
            if current {
                self.release(tenant, now);
            }
        }
    }

    /// The earliest time a held tenant may go, dropping stale timers.
    fn next_wake(&mut self) -> Option<Nanos> {
        while let Some(&Reverse((at, tenant, gen))) = self.timers.peek() {
            if self
                .tenants
                .get(&tenant)
                .is_some_and(|s| s.wake == Some((at, gen)))
            {
                return Some(Nanos(at));
            }
            self.timers.pop();
        }
        None
    }
}

impl<H: Clone, S: Scheduler<Part<H>>> Scheduler<H> for Shaped<H, S> {
    #[inline(always)]
    fn enqueue(&mut self, d: Descriptor<H>, now: Nanos) -> Result<(), Rejected<H>> {
        let held = self.capped > 0 && self.tenants.get(&d.tenant).is_some_and(ShapeSlot::capped);
        if !held {
            let Descriptor {
                tenant,
                class,
                op,
                bytes,
                handle,
                whole,
            } = d;
            let part = Part {
                handle,
                base: 0,
                last: true,
            };
            let mut piece = Descriptor::new(tenant, class, op, bytes, part);
            piece.whole = whole;
            return match self.inner.enqueue(piece, now) {
                Ok(()) => {
                    self.queued += 1;
                    Ok(())
                }
                Err(r) => {
                    let p = r.descriptor;
                    let mut descriptor =
                        Descriptor::new(p.tenant, p.class, p.op, p.bytes, p.handle.handle);
                    descriptor.whole = p.whole;
                    Err(Rejected {
                        reason: r.reason,
                        descriptor,
                    })
                }
            };
        }
        let tenant = d.tenant;
        let slot = self.tenants.get_mut(&tenant).expect("looked up above");
        slot.held.push_back(d);
        self.queued += 1;
        if slot.wake.is_none() {
            self.release(tenant, now);
        }
        Ok(())
    }

    #[inline(always)]
    fn dequeue(&mut self, now: Nanos) -> Dequeue<H> {
        if self.queued == 0 {
            return Dequeue::Empty;
        }
        if !self.timers.is_empty() {
            self.wake(now);
        }
        match self.inner.dequeue(now) {
            Dequeue::Ready(g) => {
                let is_last = g.handle.last && g.is_last;
                if is_last {
                    self.queued -= 1;
                }
                Dequeue::Ready(Grant {
                    tenant: g.tenant,
                    class: g.class,
                    op: g.op,
                    handle: g.handle.handle,
                    offset: g.handle.base + g.offset,
                    len: g.len,
                    is_last,
                })
            }
            Dequeue::Wait(at) => Dequeue::Wait(self.next_wake().map_or(at, |w| w.min(at))),
            Dequeue::Empty => self.next_wake().map_or(Dequeue::Empty, Dequeue::Wait),
        }
    }

    #[inline]
    fn len(&self) -> usize {
        self.queued
    }

    /// Sets `tenant`'s caps here and its weight in the inner scheduler
    /// (which gets the policy without caps, so that nothing is capped
    /// twice).
    fn set_policy(&mut self, tenant: TenantId, policy: TenantPolicy) -> Result<(), ConfigError> {
        policy.validate(tenant)?;
        let uncapped = TenantPolicy {
            byte_cap: None,
            wr_cap: None,
            ..policy
        };
        self.inner.set_policy(tenant, uncapped)?;
        let slot = self.tenants.entry(tenant).or_insert_with(|| ShapeSlot {
            policy,
            bytes: None,
            wrs: None,
            held: VecDeque::new(),
            head_released: 0,
            wake: None,
        });
        let was_capped = slot.capped();
        let bytes = update_cap(slot.bytes.clone(), policy.byte_cap)?;
        let wrs = update_cap(slot.wrs.clone(), policy.wr_cap)?;
        slot.bytes = bytes;
        slot.wrs = wrs;
        match (was_capped, slot.capped()) {
            (false, true) => self.capped += 1,
            (true, false) => self.capped -= 1,
            _ => {}
        }
        slot.policy = policy;
        if !slot.held.is_empty() {
            // New caps may let it go now: it is looked at again at the
            // next `dequeue` (if not, a new timer is set then).
            self.release_at_next_wake(tenant);
        }
        Ok(())
    }

    fn policy(&self, tenant: TenantId) -> Option<TenantPolicy> {
        self.tenants.get(&tenant).map(|s| s.policy)
    }

    fn admit_now(&mut self, tenant: TenantId, len: u64, now: Nanos) -> Result<(), Nanos> {
        if let Some(slot) = self.tenants.get_mut(&tenant) {
            if slot.capped() {
                if !slot.held.is_empty() {
                    // Pieces held before it go first.
                    return Err(slot.wake.map_or(now, |(at, _)| Nanos(at)));
                }
                slot.admit(now, len)?;
            }
        }
        self.inner.admit_now(tenant, len, now)
    }
}

impl<H: Clone, S: Scheduler<Part<H>>> Shaped<H, S> {
    /// Re-arms `tenant`'s timer at once, so that its held descriptors are
    /// looked at under its new caps at the next `dequeue`.
    fn release_at_next_wake(&mut self, tenant: TenantId) {
        self.timer_gen += 1;
        if let Some(slot) = self.tenants.get_mut(&tenant) {
            slot.wake = Some((0, self.timer_gen));
            self.timers.push(Reverse((0, tenant, self.timer_gen)));
        }
    }
}

/// The built-in scheduler as composed pieces:
/// `Shaped<H, Priority<Drr<Part<H>>, Drr<Part<H>>>>`.
pub type Composed<H> = Shaped<H, Priority<Drr<Part<H>>, Drr<Part<H>>>>;

/// The built-in policy from pieces ([`Composed`]): caps (pieces of
/// `config.chunk_bytes`), latency first with bulk keeping
/// `config.bulk_min_share_ppm`, DRR with `config.quantum_bytes` in each
/// class.
///
/// # Errors
/// Whatever [`SchedulerConfig::validate`] finds.
pub fn composed<H: Clone>(config: &SchedulerConfig) -> Result<Composed<H>, ConfigError> {
    let priority = Priority::new(
        Drr::new(config)?,
        Drr::new(config)?,
        config.bulk_min_share_ppm,
        config.quantum_bytes,
    )?;
    Shaped::new(priority, config.chunk_bytes)
}

#[cfg(test)]
mod tests;
