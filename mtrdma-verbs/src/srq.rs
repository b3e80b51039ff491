//! Shared receive queues: one pool of posted receives that many queue
//! pairs take from, instead of a receive queue of their own each.
//!
//! A server with N connections and a receive depth of D needs N x D
//! receive buffers with a receive queue per queue pair; with one shared
//! receive queue (SRQ) it needs what its busiest moment takes. The
//! queue's receives are [`MemoryRegion`]s moved into it, each parked under
//! its work request's `wr_id` until its completion is polled, which hands
//! it back (a [`Completion`] or a [`UdCompletion`], from the poll of
//! whatever polls the queue pair that took it: its own completion queue,
//! or a [`SharedCompletionQueue`](crate::SharedCompletionQueue)).
//!
//! Refilling on the limit event: a receive given back with
//! [`stock`](SharedReceiveQueue::stock) is kept in the queue's reserve,
//! without a doorbell, while the device holds more than the queue's
//! limit. When the device finds fewer posted receives than the limit it
//! raises `IBV_EVENT_SRQ_LIMIT_REACHED` on the context's asynchronous
//! event descriptor (the limit is armed with `ibv_modify_srq(IBV_SRQ_LIMIT)`,
//! and each arming raises one event). Reading that event posts the whole
//! reserve as one list of work requests (one doorbell) and arms the limit
//! again. The event is read by the `poll_wait` of the queue pairs and
//! shared completion queues that use the queue (they sleep on the
//! descriptor too), and by their polls once the receives polled show the
//! queue below its limit (the device then surely raised it); should the
//! event not be there yet, that poll refills the queue at once. Receives
//! given with [`post_recv`](SharedReceiveQueue::post_recv) are posted at
//! once.
//!
//! Teardown: the queue is destroyed when its last handle and the last
//! queue pair built on it are gone (each holds it), so no queue pair can
//! take a receive from it any more; only then are the receives still
//! posted in it freed. If `ibv_destroy_srq` fails they are leaked, never
//! freed while the NIC may write them.
//!
//! ```no_run
//! use mtrdma_verbs::{Access, Context};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let ctx = Context::open("rxe0")?;
//! let pd = ctx.alloc_pd()?;
//! let srq = pd.shared_receive_queue().max_wr(256).limit(64).build()?;
//! for i in 0..256 {
//!     srq.post_recv(pd.allocate(4096, Access::LOCAL)?, 0..4096, i)?;
//! }
//! // Every queue pair built with `.srq(&srq)` receives from it.
//! let qp = pd.queue_pair().srq(&srq).build()?;
//! # let _ = qp;
//! # Ok(())
//! # }
//! ```

use std::collections::VecDeque;
use std::fmt;
use std::ops::Range;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use ibverbs_sys as ffi;

use crate::completion::{Completion, Opcode};
use crate::qp::{device_attrs, libc_enosys, PostError, RawWc};
use crate::slab::Slab;
use crate::ud::{copy_grh, grh_source_gid, UdCompletion, UdSource, GRH_BYTES};
use crate::{Access, Error, MemoryRegion, ProtectionDomain};

/// `wr_id`s with this bit are a shared receive queue's receives: the rest
/// is the key of the receive's slot in the queue.
pub(crate) const SRQ_WR: u64 = 1 << 61;

/// The shared receive queues alive in this process, by the address of
/// their verbs object: where an asynchronous event finds its queue.
static LIVE: Mutex<Vec<(usize, Weak<SrqInner>)>> = Mutex::new(Vec::new());

/// The live queue whose verbs object is at `raw`, if any.
pub(crate) fn live(raw: usize) -> Option<SharedReceiveQueue> {
    let live = LIVE.lock().unwrap_or_else(|e| e.into_inner());
    live.iter()
        .find(|(at, _)| *at == raw)
        .and_then(|(_, weak)| weak.upgrade())
        .map(|inner| SharedReceiveQueue { inner })
}

/// How to build a shared receive queue (see
/// [`ProtectionDomain::shared_receive_queue`]).
#[derive(Debug)]
pub struct SharedReceiveQueueBuilder<'a> {
    pd: &'a ProtectionDomain,
    max_wr: u32,
    limit: Option<u32>,
    datagrams: bool,
}

impl ProtectionDomain {
    /// Starts building a shared receive queue: receives posted once, taken
    /// by whichever of its queue pairs a message arrives on.
    pub fn shared_receive_queue(&self) -> SharedReceiveQueueBuilder<'_> {
        SharedReceiveQueueBuilder {
            pd: self,
            max_wr: 512,
            limit: None,
            datagrams: false,
        }
    }
}

impl SharedReceiveQueueBuilder<'_> {
    /// How many receives it holds posted at most (default 512; at most
    /// the device's `max_srq_wr`).
    pub fn max_wr(mut self, n: u32) -> Self {
        self.max_wr = n.max(1);
        self
    }

    /// Below how many posted receives the device raises the limit event
    /// that refills the queue from its reserve (default a quarter of
    /// [`max_wr`](Self::max_wr); below it; 0: no limit event, and
    /// [`stock`](SharedReceiveQueue::stock) posts at once).
    pub fn limit(mut self, n: u32) -> Self {
        self.limit = Some(n);
        self
    }

    /// Builds it for UD queue pairs (default: for RC ones). Each UD
    /// receive starts with the 40-byte GRH: the queue registers one
    /// 40-byte cell per receive for it, so the payload lands at the start
    /// of the posted range, as on a [`UdQueuePair`](crate::UdQueuePair)'s
    /// own receive queue.
    pub fn datagrams(mut self, on: bool) -> Self {
        self.datagrams = on;
        self
    }

    /// Creates the queue on the device.
    pub fn build(self) -> Result<SharedReceiveQueue, Error> {
        let ctx = self.pd.context();
        let device = || ctx.name().to_string();
        let attrs = device_attrs(ctx)?;
        if attrs.max_srq <= 0 {
            return Err(Error::SrqUnsupported { device: device() });
        }
        let max = u64::try_from(attrs.max_srq_wr).unwrap_or(0);
        if u64::from(self.max_wr) > max {
            return Err(Error::QueueTooDeep {
                device: device(),
                what: "the shared receive queue's max_wr",
                asked: u64::from(self.max_wr),
                max,
            });
        }
        let limit = self.limit.unwrap_or(self.max_wr / 4);
        if limit >= self.max_wr {
            return Err(Error::SrqLimit {
                limit,
                max_wr: self.max_wr,
            });
        }
        let sges: u32 = if self.datagrams { 2 } else { 1 };
        if attrs.max_srq_sge < sges as i32 {
            return Err(Error::TooFewSges {
                device: device(),
                max_sge: attrs.max_srq_sge,
            });
        }
        crate::async_event::make_nonblocking(ctx)?;
        let grh = if self.datagrams {
            Some(
                self.pd
                    .allocate(GRH_BYTES * self.max_wr as usize, Access::LOCAL)?,
            )
        } else {
            None
        };
        let mut init = ffi::ibv_srq_init_attr {
            srq_context: std::ptr::null_mut(),
            attr: ffi::ibv_srq_attr {
                max_wr: self.max_wr,
                max_sge: sges,
                // Armed once the queue holds more than its limit.
                srq_limit: 0,
            },
        };
        // SAFETY: the PD is alive; `init` is a complete attribute set.
        let srq = unsafe { ffi::ibv_create_srq(self.pd.raw(), &mut init) };
        let Some(srq) = NonNull::new(srq) else {
            return Err(Error::Verbs {
                call: "ibv_create_srq",
                device: device(),
                source: crate::error::verbs_errno(),
            });
        };
        let inner = Arc::new(SrqInner {
            srq,
            pd: self.pd.clone(),
            datagrams: self.datagrams,
            grh_addr: grh.as_ref().map_or(0, MemoryRegion::addr),
            grh_lkey: grh.as_ref().map_or(0, MemoryRegion::lkey),
            grh,
            state: Mutex::new(State {
                slots: Slab::default(),
                reserve: VecDeque::new(),
                level: Level {
                    max_wr: self.max_wr,
                    limit,
                    posted: 0,
                    armed: false,
                },
            }),
            limit_events: AtomicU64::new(0),
            refills: AtomicU64::new(0),
        });
        {
            let mut live = LIVE.lock().unwrap_or_else(|e| e.into_inner());
            live.retain(|(_, weak)| weak.strong_count() > 0);
            live.push((srq.as_ptr() as usize, Arc::downgrade(&inner)));
        }
        tracing::debug!(
            device = %ctx.name(),
            max_wr = self.max_wr,
            limit,
            datagrams = self.datagrams,
            "created shared receive queue"
        );
        Ok(SharedReceiveQueue { inner })
    }
}

/// A shared receive queue (see the [module docs](self)). Cheap to clone:
/// every clone and every queue pair built on it share one queue, which
/// any thread may post to (posting takes a lock).
#[derive(Clone)]
pub struct SharedReceiveQueue {
    inner: Arc<SrqInner>,
}

impl fmt::Debug for SharedReceiveQueue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.inner.lock();
        f.debug_struct("SharedReceiveQueue")
            .field("max_wr", &state.level.max_wr)
            .field("limit", &state.level.limit)
            .field("posted", &state.level.posted)
            .field("reserved", &state.reserve.len())
            .field("datagrams", &self.inner.datagrams)
            .finish()
    }
}

/// A receive the queue holds: its region and the caller's value.
struct Posted {
    region: MemoryRegion,
    context: u64,
}

/// A receive kept in the reserve, posted at the next refill.
struct Stocked {
    region: MemoryRegion,
    range: Range<usize>,
    context: u64,
}

struct State {
    /// The posted receives, under the keys their `wr_id`s carry.
    slots: Slab<Posted>,
    reserve: VecDeque<Stocked>,
    level: Level,
}

struct SrqInner {
    srq: NonNull<ffi::ibv_srq>,
    pd: ProtectionDomain,
    datagrams: bool,
    /// The UD queue's GRH cells, one per slot key (slot keys stay below
    /// `max_wr`: a slab reuses freed keys before it grows, and at most
    /// `max_wr` receives are posted).
    grh: Option<MemoryRegion>,
    grh_addr: u64,
    grh_lkey: u32,
    state: Mutex<State>,
    limit_events: AtomicU64,
    refills: AtomicU64,
}

// SAFETY: the verbs object is only posted to and modified under `state`'s
// lock (libibverbs allows any thread to do so), and destroyed once, when
// the last handle is dropped; the regions it holds are owned values.
unsafe impl Send for SrqInner {}
// SAFETY: as above: `&self` methods take the lock before they touch the
// queue or its regions.
unsafe impl Sync for SrqInner {}

/// The queue's fill level and its limit, apart from the device: when to
/// keep a receive in the reserve, when to look for the limit event, and
/// when to arm it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Level {
    max_wr: u32,
    limit: u32,
    /// Receives posted and not yet polled (the device may have taken
    /// some of them already: it holds at most this many).
    posted: u32,
    /// The limit is armed on the device and its event not yet taken.
    armed: bool,
}

impl Level {
    /// How many more receives fit.
    fn room(self) -> u32 {
        self.max_wr - self.posted
    }

    /// A stocked receive waits in the reserve for the limit event (rather
    /// than being posted at once): the limit is armed, so its event will
    /// come before the queue runs dry.
    fn keeps(self) -> bool {
        self.limit > 0 && self.armed
    }

    /// The limit should be armed: it is not, and the queue holds more than
    /// it (arming below the limit would raise the event at once).
    fn should_arm(self) -> bool {
        self.limit > 0 && !self.armed && self.posted > self.limit
    }

    /// The receives polled already show the queue below its limit (the
    /// device holds at most `posted`): the event was raised, or is on its
    /// way.
    fn below(self) -> bool {
        self.armed && self.posted < self.limit
    }
}

fn refuse<T>(error: Error, region: MemoryRegion) -> Result<T, PostError> {
    Err(PostError::new((error, region)))
}

impl SharedReceiveQueue {
    /// Its protection domain (receive regions must be of it).
    pub fn pd(&self) -> &ProtectionDomain {
        &self.inner.pd
    }

    /// How many receives it holds posted at most.
    pub fn max_wr(&self) -> u32 {
        self.inner.lock().level.max_wr
    }

    /// Below how many posted receives its limit event comes (0: none).
    pub fn limit(&self) -> u32 {
        self.inner.lock().level.limit
    }

    /// Receives posted and not yet polled.
    pub fn posted(&self) -> u32 {
        self.inner.lock().level.posted
    }

    /// Receives kept in the reserve for the next refill.
    pub fn reserved(&self) -> usize {
        self.inner.lock().reserve.len()
    }

    /// Whether it is for UD queue pairs.
    pub fn datagrams(&self) -> bool {
        self.inner.datagrams
    }

    /// How many limit events the device raised for it so far.
    pub fn limit_events(&self) -> u64 {
        self.inner.limit_events.load(Ordering::Relaxed)
    }

    /// How many times its reserve was posted (each one list, one
    /// doorbell): on the limit event, or when the receives polled showed
    /// the queue below its limit first.
    pub fn refills(&self) -> u64 {
        self.inner.refills.load(Ordering::Relaxed)
    }

    /// Whether `other` is a handle of the same queue.
    pub fn same_queue(&self, other: &SharedReceiveQueue) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    pub(crate) fn raw(&self) -> *mut ffi::ibv_srq {
        self.inner.srq.as_ptr()
    }

    /// Checks a receive into `range` of `region` before it is kept.
    fn check(&self, region: MemoryRegion, range: &Range<usize>) -> Result<MemoryRegion, PostError> {
        if region.sge(range).is_none() {
            let len = region.len();
            let range = range.clone();
            return refuse(Error::LocalRangeOutOfBounds { range, len }, region);
        }
        if region.pd().raw() != self.inner.pd.raw() {
            let error = Error::ForeignObject {
                what: "memory region",
                with: "shared receive queue",
                scope: "protection domain",
            };
            return refuse(error, region);
        }
        Ok(region)
    }

    crate::macros::posting_fn! {
        /// Posts a receive into `range` of `region` now (one doorbell). The
        /// region is the queue's until the receive's completion is polled; on
        /// refusal (range outside the region, a region of another protection
        /// domain, the queue full) it comes back in the [`PostError`].
        pub fn post_recv(&self) posts (region, range, context) {
            let region = self.check(region, &range)?;
            let mut state = self.inner.lock();
            if state.level.room() == 0 {
                let depth = state.level.max_wr;
                return refuse(Error::RecvQueueFull { depth }, region);
            }
            let one = Stocked {
                region,
                range,
                context,
            };
            if let Err((error, mut back)) = self.inner.post(&mut state, vec![one]) {
                let region = back.pop().expect("the one receive comes back").region;
                return refuse(error, region);
            }
            if let Err(e) = self.inner.arm_if_due(&mut state) {
                // The receive is posted; only its limit event is missing (the
                // polls refill the queue when it is seen below its limit).
                tracing::warn!(error = %e, "arming the shared receive queue's limit failed");
            }
            Ok(())
        }
    }

    crate::macros::posting_fn! {
        /// Gives a receive back to the queue without a doorbell: it is kept
        /// in the reserve while the queue's limit is armed, and posted with
        /// the rest of the reserve when the limit event comes; with no limit
        /// armed (or none set) it is posted at once. Refused as
        /// [`post_recv`](Self::post_recv) refuses.
        pub fn stock(&self) posts (region, range, context) {
            let region = self.check(region, &range)?;
            let mut state = self.inner.lock();
            state.reserve.push_back(Stocked {
                region,
                range,
                context,
            });
            if state.level.keeps() {
                return Ok(());
            }
            if let Err(e) = self.inner.refill(&mut state) {
                // The receive stays in the reserve for the next refill.
                tracing::warn!(error = %e, "posting the shared receive queue's reserve failed");
            }
            Ok(())
        }
    }

    /// Posts the reserve now, as much of it as fits, as one list (one
    /// doorbell), and arms the limit if the queue is above it; returns
    /// how many receives it posted.
    pub fn refill(&self) -> Result<u32, Error> {
        let mut state = self.inner.lock();
        self.inner.refill(&mut state)
    }

    /// Reads the device context's asynchronous events now (without
    /// blocking): a limit event of this queue (or of another of the
    /// context's) refills it. Polls and `poll_wait`s of its queue pairs do
    /// this on their own.
    pub fn check_events(&self) -> Result<(), Error> {
        crate::async_event::service(self.inner.pd.context()).map(drop)
    }

    /// The limit event came: posts the reserve, arms the limit again.
    pub(crate) fn on_limit_event(&self) {
        self.inner.limit_events.fetch_add(1, Ordering::Relaxed);
        let mut state = self.inner.lock();
        state.level.armed = false;
        if let Err(e) = self.inner.refill(&mut state) {
            tracing::warn!(error = %e, "refilling the shared receive queue on its limit event failed");
        }
    }

    /// After a receive was polled: if the queue is below its limit, reads
    /// the asynchronous events (its limit event refills it), and refills it
    /// at once if the event was not there yet.
    fn after_receive(&self, level: Level) {
        if !level.below() {
            return;
        }
        if let Err(e) = self.check_events() {
            tracing::warn!(error = %e, "reading asynchronous events failed");
        }
        let mut state = self.inner.lock();
        if state.level.below() {
            state.level.armed = false;
            if let Err(e) = self.inner.refill(&mut state) {
                tracing::warn!(error = %e, "refilling the shared receive queue failed");
            }
        }
    }

    /// Takes the receive a completion names out of the queue: its region
    /// and value, the receive's opcode, and (UD) its GRH cell's source.
    fn take(&self, wc: &RawWc) -> Option<(Posted, Opcode, Option<GrhCopy>)> {
        if wc.wr_id & SRQ_WR == 0 {
            return None;
        }
        let key = usize::try_from(wc.wr_id & !SRQ_WR).ok()?;
        let mut state = self.inner.lock();
        // The GRH cell is read before the slot (and so the cell) is free
        // for another receive.
        let grh = (self.inner.datagrams && wc.grh && state.slots.get(key).is_some())
            .then(|| GrhCopy(self.inner.read_grh(key)));
        let Some(posted) = state.slots.remove(key) else {
            tracing::error!(wr_id = wc.wr_id, "completion for an unknown shared receive");
            return None;
        };
        state.level.posted -= 1;
        let level = state.level;
        drop(state);
        self.after_receive(level);
        Some((posted, receive_opcode(wc), grh))
    }

    /// The completion of an RC receive this queue gave, if `wc` is one.
    pub(crate) fn complete_rc(&self, wc: &RawWc) -> Option<Completion> {
        let (posted, opcode, _) = self.take(wc)?;
        Some(Completion {
            context: posted.context,
            status: wc.status,
            opcode,
            byte_len: wc.byte_len.unwrap_or(0),
            imm: wc.imm.map(u32::from_be),
            region: posted.region,
            gathered: Vec::new(),
        })
    }

    /// The completion of a UD receive this queue gave, if `wc` is one: the
    /// payload's length (the GRH not counted) and its source.
    pub(crate) fn complete_ud(&self, wc: &RawWc) -> Option<UdCompletion> {
        let (posted, opcode, grh) = self.take(wc)?;
        let source = wc.src_qp.map(|qpn| UdSource {
            qpn,
            gid: grh.and_then(|g| grh_source_gid(&g.0)),
        });
        Some(UdCompletion {
            context: posted.context,
            status: wc.status,
            opcode,
            byte_len: wc.byte_len.unwrap_or(0).saturating_sub(GRH_BYTES as u32),
            imm: wc.imm.map(u32::from_be),
            source,
            region: posted.region,
            gathered: Vec::new(),
        })
    }
}

/// A copy of a UD receive's GRH cell.
struct GrhCopy([u8; GRH_BYTES]);

/// What a receive's completion says it got.
fn receive_opcode(wc: &RawWc) -> Opcode {
    use ffi::ibv_wc_opcode as o;
    match wc.opcode {
        Some(o::IBV_WC_RECV) => Opcode::Recv,
        Some(o::IBV_WC_RECV_RDMA_WITH_IMM) => Opcode::RecvWithImm,
        _ => Opcode::Unknown,
    }
}

impl SrqInner {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Posts `list` as one chain of work requests. On failure the
    /// receives that were not posted come back with the error (the
    /// provider posts a chain's requests before the one it refuses).
    fn post(&self, state: &mut State, list: Vec<Stocked>) -> Result<(), (Error, Vec<Stocked>)> {
        if list.is_empty() {
            return Ok(());
        }
        let n = list.len();
        debug_assert!(n <= state.level.room() as usize);
        let mut keys = Vec::with_capacity(n);
        let mut sges = Vec::with_capacity(n);
        for item in list {
            let payload = item
                .region
                .sge(&item.range)
                .expect("checked when it was given");
            let key = state.slots.insert(Posted {
                region: item.region,
                context: item.context,
            });
            let grh = self.datagrams.then(|| {
                assert!(key < state.level.max_wr as usize, "a slot key per GRH cell");
                ffi::ibv_sge {
                    addr: self.grh_addr + (key * GRH_BYTES) as u64,
                    length: GRH_BYTES as u32,
                    lkey: self.grh_lkey,
                }
            });
            keys.push((key, item.range));
            sges.push(match grh {
                Some(grh) => [grh, payload],
                None => [payload, payload],
            });
        }
        let sge_count = |payload_len: u32| match (self.datagrams, payload_len > 0) {
            (true, true) => 2,
            (true, false) | (false, true) => 1,
            (false, false) => 0,
        };
        // The chain: built in place, its links and scatter lists pointing
        // into `wrs` and `sges`, neither of which moves until the call.
        let mut wrs: Vec<ffi::ibv_recv_wr> = keys
            .iter()
            .zip(sges.iter_mut())
            .map(|((key, _), sge)| {
                let payload_len = if self.datagrams {
                    sge[1].length
                } else {
                    sge[0].length
                };
                ffi::ibv_recv_wr {
                    wr_id: *key as u64 | SRQ_WR,
                    next: std::ptr::null_mut(),
                    sg_list: sge.as_mut_ptr(),
                    num_sge: sge_count(payload_len),
                }
            })
            .collect();
        for i in 1..n {
            let next: *mut ffi::ibv_recv_wr = &mut wrs[i];
            wrs[i - 1].next = next;
        }
        let mut bad: *mut ffi::ibv_recv_wr = std::ptr::null_mut();
        // SAFETY: the SRQ is live while `self` is; the chain and its
        // scatter lists outlive the call (the provider copies them). The
        // payload buffers are owned by the slots just parked and stay
        // there until their completions are polled (or the queue is
        // destroyed); each GRH cell is its slot's alone.
        let rc = unsafe {
            let srq = self.srq.as_ptr();
            match (*(*srq).context).ops.post_srq_recv {
                Some(post) => post(srq, wrs.as_mut_ptr(), &mut bad),
                None => libc_enosys(),
            }
        };
        if rc == 0 {
            state.level.posted += n as u32;
            return Ok(());
        }
        // The requests before `bad` were posted; `bad` and the rest were
        // not (all of them if the provider did not say).
        let first_bad = if bad.is_null() {
            0
        } else {
            // SAFETY: `bad` points into `wrs`, set by the provider.
            usize::try_from(unsafe { bad.offset_from(wrs.as_ptr()) }).unwrap_or(0)
        }
        .min(n);
        state.level.posted += first_bad as u32;
        let back = keys
            .into_iter()
            .skip(first_bad)
            .map(|(key, range)| {
                let p = state.slots.remove(key).expect("just parked");
                Stocked {
                    region: p.region,
                    range,
                    context: p.context,
                }
            })
            .collect();
        Err((
            Error::Verbs {
                call: "ibv_post_srq_recv",
                device: self.pd.context().name().to_string(),
                source: crate::error::errno(rc),
            },
            back,
        ))
    }

    /// Posts as much of the reserve as fits, then arms the limit if due;
    /// returns how many receives it posted. Receives the device refused
    /// go back to the front of the reserve.
    fn refill(&self, state: &mut State) -> Result<u32, Error> {
        let n = state.level.room().min(state.reserve.len() as u32);
        let list: Vec<Stocked> = state.reserve.drain(..n as usize).collect();
        if let Err((error, back)) = self.post(state, list) {
            for item in back.into_iter().rev() {
                state.reserve.push_front(item);
            }
            return Err(error);
        }
        if n > 0 {
            self.refills.fetch_add(1, Ordering::Relaxed);
        }
        self.arm_if_due(state)?;
        Ok(n)
    }

    /// Arms the limit on the device if the queue holds more than it.
    fn arm_if_due(&self, state: &mut State) -> Result<(), Error> {
        if !state.level.should_arm() {
            return Ok(());
        }
        let mut attr = ffi::ibv_srq_attr {
            max_wr: 0,
            max_sge: 0,
            srq_limit: state.level.limit,
        };
        // SAFETY: the SRQ is live; `attr` holds the field the mask names.
        let rc =
            unsafe { ffi::ibv_modify_srq(self.srq.as_ptr(), &mut attr, ffi::IBV_SRQ_LIMIT as i32) };
        if rc != 0 {
            return Err(Error::Verbs {
                call: "ibv_modify_srq (IBV_SRQ_LIMIT)",
                device: self.pd.context().name().to_string(),
                source: crate::error::errno(rc),
            });
        }
        state.level.armed = true;
        Ok(())
    }

    /// A copy of GRH cell `cell`, whose receive has completed.
    fn read_grh(&self, cell: usize) -> [u8; GRH_BYTES] {
        let grh = self.grh.as_ref().expect("a UD queue has GRH cells");
        // SAFETY: the GRH buffer lives as long as `self` (the cell is
        // checked to lie inside it); the cell's receive has completed, so
        // the NIC is done writing it, and it is not posted again before
        // this copy (the caller holds the lock).
        unsafe { copy_grh(self.grh_addr, grh.len() / GRH_BYTES, cell) }
    }
}

impl Drop for SrqInner {
    fn drop(&mut self) {
        {
            let mut live = LIVE.lock().unwrap_or_else(|e| e.into_inner());
            let me = self.srq.as_ptr() as usize;
            live.retain(|(at, weak)| *at != me && weak.strong_count() > 0);
        }
        // SAFETY: the SRQ is ours and destroyed once. Every queue pair
        // built on it held a handle, so all of them are destroyed; every
        // asynchronous event taken was acknowledged at once.
        let rc = unsafe { ffi::ibv_destroy_srq(self.srq.as_ptr()) };
        if rc != 0 {
            tracing::error!(
                rc,
                "ibv_destroy_srq failed; leaking its posted receive buffers"
            );
            let state = self.state.get_mut().unwrap_or_else(|e| e.into_inner());
            for posted in state.slots.drain() {
                std::mem::forget(posted.region);
            }
            std::mem::forget(self.grh.take());
        }
    }
}

#[cfg(test)]
mod tests;
