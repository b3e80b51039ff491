//! Host stand-ins for the device, to measure and test the data path
//! without an RDMA device. Built only with the `null-sink` feature (and
//! in this crate's own tests): for mtrdma's benches and tests, not a
//! stable API, and not compiled into an application's build.
//!
//! A [`NullSink`] takes the place of a connected queue pair. The code that
//! runs is the library's own, through the same seam a [`QueuePair`] uses,
//! up to the provider's `post_send` and from its `poll_cq`: on the direct
//! path ([`NullSink::post_send`], what [`QueuePair::post_send`] does) the
//! region is parked under its `wr_id` and the `ibv_send_wr` is built; on
//! the scheduled path ([`NullScheduled`], what a [`ScheduledQueuePair`]
//! does) the request goes through the scheduler engine, its pieces are
//! built and posted the same way. Where the provider would take the work
//! request, the null sink copies it into a ring (no allocation per work
//! request); its poll completes, in order, what was posted.
//!
//! [`QueuePair`]: crate::QueuePair
//! [`QueuePair::post_send`]: crate::QueuePair::post_send
//! [`ScheduledQueuePair`]: crate::ScheduledQueuePair

use std::io;
use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use ibverbs_sys as ffi;
use mtrdma_core::{TenantHandle, TenantId};
use mtrdma_sched::{ManualClock, TenantPolicy};

use crate::completion::{Opcode, WcStatus};
use crate::events::Armed;
use crate::qp::{Batch, Books, RawCompletion, Region, SendOp, Sink, Wc};
use crate::scheduled::{
    default_scheduler, solo_parts, Batched, EngineClock, Request, Scheduled, Shared,
};
use crate::{DefaultScheduler, PieceScheduler};
use crate::{Error, ScheduleConfig, SharedConfig};

/// A refused batch on the host: the error, and the requests not posted as
/// (context, region).
pub type BatchRefused = (Error, Vec<(u64, HeapRegion)>);

/// A plain heap buffer standing in for a [`MemoryRegion`](crate::MemoryRegion).
#[derive(Debug)]
pub struct HeapRegion {
    buf: Box<[u8]>,
    lkey: u32,
}

impl HeapRegion {
    /// `len` zeroed bytes, with a made-up local key.
    pub fn new(len: usize) -> HeapRegion {
        HeapRegion {
            buf: vec![0; len].into_boxed_slice(),
            lkey: 0x1234,
        }
    }

    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.buf.len()
    }

    /// Whether it has no bytes.
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        &self.buf
    }

    /// The bytes, to change.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.buf
    }

    /// The address of its first byte.
    pub fn addr(&self) -> u64 {
        self.buf.as_ptr() as u64
    }
}

impl Region for HeapRegion {
    type Completion = HostCompletion;

    fn len(&self) -> usize {
        self.buf.len()
    }

    fn sge(&self, range: &Range<usize>) -> Option<ffi::ibv_sge> {
        if range.start > range.end || range.end > self.buf.len() {
            return None;
        }
        Some(ffi::ibv_sge {
            addr: self.addr() + range.start as u64,
            length: u32::try_from(range.end - range.start).ok()?,
            lkey: self.lkey,
        })
    }

    fn complete(
        self,
        context: u64,
        status: WcStatus,
        opcode: Opcode,
        byte_len: u32,
        imm: Option<u32>,
    ) -> HostCompletion {
        HostCompletion {
            context,
            status,
            opcode,
            byte_len,
            imm,
            region: self,
            gathered: Vec::new(),
        }
    }

    const GATHERS: bool = true;

    fn attach_rest(done: &mut HostCompletion, rest: Vec<HeapRegion>) {
        done.gathered = rest;
    }
}

/// A finished request on the host: [`Completion`](crate::Completion)
/// with a [`HeapRegion`].
#[derive(Debug)]
pub struct HostCompletion {
    /// The caller's value given when posting.
    pub context: u64,
    /// How it ended.
    pub status: WcStatus,
    /// What it was.
    pub opcode: Opcode,
    /// Bytes transferred.
    pub byte_len: u32,
    /// Immediate data.
    pub imm: Option<u32>,
    /// The region, handed back (a gather request's first).
    pub region: HeapRegion,
    /// A gather request's regions after the first, in order; empty for
    /// every other request.
    pub gathered: Vec<HeapRegion>,
}

/// One scatter entry of a work request the null sink took.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PostedSge {
    /// Local address.
    pub addr: u64,
    /// Bytes.
    pub length: u32,
    /// Local key.
    pub lkey: u32,
}

/// A work request as the null sink took it from the `ibv_send_wr`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Posted {
    /// Its `wr_id`.
    pub wr_id: u64,
    /// The verbs opcode (`ibv_wr_opcode`).
    pub opcode: u32,
    /// Local address of the data (its first scatter entry's).
    pub addr: u64,
    /// Bytes (of its first scatter entry).
    pub length: u32,
    /// Local key (of its first scatter entry).
    pub lkey: u32,
    /// Its whole scatter list, in order (`num_sge` entries).
    pub sg_list: Vec<PostedSge>,
    /// Remote address (WRITE, READ).
    pub remote_addr: u64,
    /// Remote key (WRITE, READ).
    pub rkey: u32,
    /// Immediate data (host order), for the opcodes that carry it.
    pub imm: Option<u32>,
    /// Whether it asked for its completion (`IBV_SEND_SIGNALED`).
    pub signaled: bool,
}

/// What a watched null sink reports as it happens ([`NullSink::watch`]):
/// every work request offered to it and every one that leaves its ring,
/// so that a test sees what is in the "NIC" (posted, not yet completed)
/// at any moment, whoever posts or polls.
#[derive(Debug)]
pub enum SinkEvent<'a> {
    /// It took this work request: in the NIC until it completes.
    Posted(&'a Posted),
    /// It refused this work request, which never reached the NIC.
    Refused(&'a Posted),
    /// The oldest work request in its ring left it with this status: its
    /// completion was polled (an unsignaled one's, with the signaled one
    /// after it), or it was flushed when the queue pair was drained.
    Completed(WcStatus),
}

/// What [`NullSink::watch`] calls.
type Watcher = Box<dyn FnMut(SinkEvent<'_>) + Send>;

/// A drain held until released ([`NullSink::hold_shutdown`]).
#[derive(Debug, Default)]
pub struct ShutdownHold {
    /// (the drain began, it may end)
    state: std::sync::Mutex<(bool, bool)>,
    changed: std::sync::Condvar,
}

impl ShutdownHold {
    /// Waits up to `timeout` for the drain to begin; whether it did.
    pub fn wait_started(&self, timeout: Duration) -> bool {
        let state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let (state, _) = self
            .changed
            .wait_timeout_while(state, timeout, |s| !s.0)
            .unwrap_or_else(|p| p.into_inner());
        state.0
    }

    /// Lets the drain end.
    pub fn release(&self) {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).1 = true;
        self.changed.notify_all();
    }

    fn hold(&self) {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        state.0 = true;
        self.changed.notify_all();
        while !state.1 {
            state = self.changed.wait(state).unwrap_or_else(|p| p.into_inner());
        }
    }
}

/// A send queue that goes nowhere (see the module docs).
pub struct NullSink {
    books: Books<HeapRegion>,
    /// Posted and not yet completed, oldest at `head`, each with the
    /// `wr_id` the device was given; as many slots as the send queue is
    /// deep.
    ring: Box<[Entry]>,
    head: usize,
    queued: usize,
    fail: bool,
    /// Requests taken out of the ring so far.
    done: u64,
    /// The request (counted as `done` counts) that fails, if any.
    fail_at: Option<u64>,
    /// A request failed: every later one is flushed.
    broken: bool,
    /// Posts still to take before refusing one (`None`: none refused).
    refuse_after: Option<usize>,
    /// Holds `shutdown` until released.
    hold: Option<std::sync::Arc<ShutdownHold>>,
    log: Option<Vec<Posted>>,
    /// Told of every post and completion ([`NullSink::watch`]).
    watch: Option<Watcher>,
    qpn: u32,
    tenant: Option<TenantHandle>,
}

impl std::fmt::Debug for NullSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NullSink")
            .field("qpn", &self.qpn)
            .field("sends_in_flight", &self.books.sends_in_flight)
            .field("queued", &self.queued)
            .field("fail", &self.fail)
            .finish()
    }
}

impl NullSink {
    /// A null send queue `depth` requests deep, numbered `qpn`.
    pub fn new(qpn: u32, depth: u32) -> NullSink {
        let depth = depth.max(1);
        NullSink {
            books: Books::new(depth, 0),
            ring: vec![Entry::default(); depth as usize].into_boxed_slice(),
            head: 0,
            queued: 0,
            fail: false,
            done: 0,
            fail_at: None,
            broken: false,
            refuse_after: None,
            hold: None,
            log: None,
            watch: None,
            qpn,
            tenant: None,
        }
    }

    /// The same sink, created for `tenant` (as a queue pair built with
    /// [`QueuePairBuilder::tenant`](crate::QueuePairBuilder::tenant)): a
    /// [`ScheduleConfig`] of the default [`Tenancy`](crate::Tenancy)
    /// schedules it as that tenant.
    pub fn with_tenant(mut self, tenant: TenantHandle) -> NullSink {
        self.tenant = Some(tenant);
        self
    }

    /// Makes its `shutdown` (the drain of a
    /// queue pair being dropped) wait until the returned hold is
    /// released: a NIC that takes long to flush.
    pub fn hold_shutdown(&mut self) -> std::sync::Arc<ShutdownHold> {
        let hold = std::sync::Arc::new(ShutdownHold::default());
        self.hold = Some(std::sync::Arc::clone(&hold));
        hold
    }

    /// The request `ok` places behind the oldest one in the ring (0: the
    /// oldest) completes with [`WcStatus::RemoteAccess`], whether it asked
    /// for a completion or not, and every request after it is flushed
    /// (the queue pair is in the error state from then on).
    pub fn fail_completion_after(&mut self, ok: usize) {
        self.fail_at = Some(self.done + ok as u64);
    }

    /// Takes the next `taken` posts and refuses the one after them (once).
    pub fn refuse_after(&mut self, taken: usize) {
        self.refuse_after = Some(taken);
    }

    /// Also keeps every work request posted, for [`take_log`](Self::take_log).
    pub fn recording(mut self) -> NullSink {
        self.log = Some(Vec::new());
        self
    }

    /// The same sink, calling `f` as it takes or refuses each work
    /// request and as each leaves its ring ([`SinkEvent`]), in the order
    /// they happen; `f` runs inside the post or poll, with the queue
    /// pair's lock held (it must not call back into the queue pair or its
    /// engine).
    pub fn watch(mut self, f: impl FnMut(SinkEvent<'_>) + Send + 'static) -> NullSink {
        self.watch = Some(Box::new(f));
        self
    }

    /// Tells the watcher, if any, that the sink took (`taken`) or refused
    /// `wr`.
    #[cold]
    fn tell_offered(&mut self, wr: &ffi::ibv_send_wr, taken: bool) {
        if let Some(watch) = &mut self.watch {
            let signaled = wr.send_flags & ffi::ibv_send_flags::IBV_SEND_SIGNALED.0 != 0;
            let posted = Self::posted(wr, Self::first_sge(wr), signaled);
            watch(if taken {
                SinkEvent::Posted(&posted)
            } else {
                SinkEvent::Refused(&posted)
            });
        }
    }

    /// Tells the watcher, if any, that the oldest request in the ring
    /// left it with `status`.
    #[inline]
    fn tell_completed(&mut self, status: WcStatus) {
        if let Some(watch) = &mut self.watch {
            watch(SinkEvent::Completed(status));
        }
    }

    /// From now on, refuses (`fail`) or takes every post.
    pub fn set_fail(&mut self, fail: bool) {
        self.fail = fail;
    }

    /// The work requests posted since the last call, in order (if
    /// [`recording`](Self::recording)).
    pub fn take_log(&mut self) -> Vec<Posted> {
        self.log.as_mut().map(std::mem::take).unwrap_or_default()
    }

    /// Send requests posted and not yet polled.
    pub fn sends_in_flight(&self) -> u32 {
        self.books.sends_in_flight
    }

    /// What [`QueuePair::post_send_gather`](crate::QueuePair::post_send_gather)
    /// does: one work request whose scatter list names the ranges of
    /// `parts` in order, every region parked until its completion is
    /// polled. On refusal, the error and the parts, untouched, in order.
    /// The sink takes as many scatter entries per request as
    /// [`with_max_send_sge`](Self::with_max_send_sge) says (default 1).
    #[allow(clippy::type_complexity)]
    pub fn post_send_gather(
        &mut self,
        op: SendOp,
        parts: Vec<(HeapRegion, Range<usize>)>,
        context: u64,
    ) -> Result<(), (Error, Vec<(HeapRegion, Range<usize>)>)> {
        self.post_gather(op, parts, context)
    }

    /// The same sink, taking up to `n` scatter entries per work request
    /// (as a queue pair built with
    /// [`QueuePairBuilder::max_send_sge`](crate::QueuePairBuilder::max_send_sge)).
    pub fn with_max_send_sge(mut self, n: u32) -> NullSink {
        self.books.max_send_sge = n.max(1);
        self
    }

    /// The direct path: what [`QueuePair::post_send`](crate::QueuePair::post_send)
    /// does, the region parked until its completion is polled.
    pub fn post_send(
        &mut self,
        op: SendOp,
        region: HeapRegion,
        range: Range<usize>,
        context: u64,
    ) -> Result<(), (Error, HeapRegion)> {
        self.post_parked(op, region, range, context)
    }

    /// What [`QueuePair::batch`](crate::QueuePair::batch) and
    /// [`PostBatch::submit`](crate::PostBatch::submit) do with `requests`
    /// (operation, region, range, context): one list, most of it
    /// unsignaled. On refusal, the error and the requests not posted, as
    /// (context, region).
    pub fn post_batch(
        &mut self,
        requests: impl IntoIterator<Item = (SendOp, HeapRegion, Range<usize>, u64)>,
    ) -> Result<(), BatchRefused> {
        let mut batch = Batch::new(self);
        let mut requests = requests.into_iter();
        while let Some((op, region, range, context)) = requests.next() {
            if let Err((error, region)) = batch.push(op, region, range, context) {
                let mut refused = batch.cancel();
                refused.push((context, region));
                refused.extend(requests.map(|(_, region, _, context)| (context, region)));
                return Err((error, refused));
            }
        }
        batch
            .submit()
            .map_err(|refusal| (*refusal.error, refusal.refused))
    }

    /// What [`QueuePair::poll`](crate::QueuePair::poll) does: up to 32
    /// completions of what was posted, regions handed back.
    pub fn poll(&mut self, out: &mut Vec<HostCompletion>) -> Result<usize, Error> {
        self.poll_own(out)
    }

    /// The completion of the request in ring entry `entry`.
    fn completion(entry: &Entry, status: WcStatus) -> Wc {
        Wc {
            wr_id: entry.wr_id,
            status,
            opcode: crate::qp::wc_opcode_of(entry.opcode),
            byte_len: entry.length,
            imm: None,
            source: None,
        }
    }

    /// How the request `offset` places behind the oldest in the ring ends
    /// once a failure was asked for ([`fail_completion_after`](Self::fail_completion_after)).
    #[cold]
    fn failing_status(&self, offset: usize) -> WcStatus {
        if self.broken {
            WcStatus::Flushed
        } else if self.fail_at == Some(self.done + offset as u64) {
            WcStatus::RemoteAccess
        } else {
            WcStatus::Success
        }
    }

    /// Takes one work request, as a provider's `post_send` takes each of
    /// a list's.
    fn take(&mut self, wr: &mut ffi::ibv_send_wr) -> Result<(), Error> {
        let refuse = match &mut self.refuse_after {
            Some(0) => {
                self.refuse_after = None;
                true
            }
            Some(n) => {
                *n -= 1;
                false
            }
            None => false,
        };
        if refuse || self.fail || self.queued == self.ring.len() {
            if self.watch.is_some() {
                self.tell_offered(wr, false);
            }
            return Err(Error::Verbs {
                call: "ibv_post_send",
                device: "null".to_string(),
                source: io::Error::from_raw_os_error(12),
            });
        }
        if u32::try_from(wr.num_sge).map_or(true, |n| n > self.books.max_send_sge) {
            // A provider refuses a scatter list longer than the queue
            // pair was built for (EINVAL).
            if self.watch.is_some() {
                self.tell_offered(wr, false);
            }
            return Err(Error::Verbs {
                call: "ibv_post_send",
                device: "null".to_string(),
                source: io::Error::from_raw_os_error(22),
            });
        }
        let sge = Self::first_sge(wr);
        let signaled = wr.send_flags & ffi::ibv_send_flags::IBV_SEND_SIGNALED.0 != 0;
        let at = (self.head + self.queued) % self.ring.len();
        self.ring[at] = Entry {
            wr_id: self.books.tag_send(wr.wr_id, wr.opcode, signaled),
            opcode: wr.opcode,
            length: sge.length,
            signaled,
        };
        self.queued += 1;
        if let Some(log) = &mut self.log {
            log.push(Self::posted(wr, sge, signaled));
        }
        if self.watch.is_some() {
            self.tell_offered(wr, true);
        }
        Ok(())
    }

    /// The first scatter entry of `wr` (all zero if it has none).
    #[inline]
    fn first_sge(wr: &ffi::ibv_send_wr) -> ffi::ibv_sge {
        if wr.num_sge > 0 {
            // SAFETY: the caller's `wr` names at least one valid scatter
            // entry.
            unsafe { *wr.sg_list }
        } else {
            ffi::ibv_sge::default()
        }
    }

    /// What [`recording`](Self::recording) keeps of a work request.
    #[cold]
    fn posted(wr: &ffi::ibv_send_wr, sge: ffi::ibv_sge, signaled: bool) -> Posted {
        // SAFETY: the request was built from an all-zero value, so both
        // union members are initialised plain integers.
        let (rdma, imm) = unsafe { (wr.wr.rdma, wr.__bindgen_anon_1.imm_data) };
        let n = usize::try_from(wr.num_sge).unwrap_or(0);
        let sg_list = if n == 0 {
            Vec::new()
        } else {
            // SAFETY: the caller's `wr` names `num_sge` valid scatter
            // entries at `sg_list`.
            unsafe { std::slice::from_raw_parts(wr.sg_list, n) }
                .iter()
                .map(|e| PostedSge {
                    addr: e.addr,
                    length: e.length,
                    lkey: e.lkey,
                })
                .collect()
        };
        use ffi::ibv_wr_opcode as o;
        let with_imm = matches!(
            wr.opcode,
            o::IBV_WR_SEND_WITH_IMM | o::IBV_WR_RDMA_WRITE_WITH_IMM
        );
        Posted {
            wr_id: wr.wr_id,
            opcode: wr.opcode,
            addr: sge.addr,
            length: sge.length,
            lkey: sge.lkey,
            sg_list,
            remote_addr: rdma.remote_addr,
            rkey: rdma.rkey,
            imm: with_imm.then(|| u32::from_be(imm)),
            signaled,
        }
    }
}

/// A request in the null sink's ring: what its completion reports.
#[derive(Debug, Clone, Copy, Default)]
struct Entry {
    /// The `wr_id` the device was given ([`Books::tag_send`]).
    wr_id: u64,
    /// The verbs opcode.
    opcode: u32,
    length: u32,
    signaled: bool,
}

impl Sink for NullSink {
    type Region = HeapRegion;

    fn qpn(&self) -> u32 {
        self.qpn
    }

    fn tenant(&self) -> Option<&TenantHandle> {
        self.tenant.as_ref()
    }

    fn books(&self) -> &Books<HeapRegion> {
        &self.books
    }

    fn books_mut(&mut self) -> &mut Books<HeapRegion> {
        &mut self.books
    }

    fn quiet_lists(&self) -> bool {
        true
    }

    unsafe fn post_wr(&mut self, wr: &mut ffi::ibv_send_wr) -> Result<(), Error> {
        self.take(wr)
    }

    fn poll(
        &mut self,
        out: &mut Vec<HostCompletion>,
        raw: &mut Vec<RawCompletion>,
    ) -> Result<usize, Error> {
        // Up to 32 completions, as a device reports them: one per
        // signaled request, which also reports the unsignaled ones before
        // it (those after the last signaled one wait for a later one).
        // A request that fails reports itself, signaled or not, and the
        // queue pair is then in the error state: every later request is
        // reported, flushed.
        let mut n = 0;
        let mut unsignaled = 0;
        while n < 32 && unsignaled < self.queued {
            let at = (self.head + unsignaled) % self.ring.len();
            let status = if !self.broken && self.fail_at.is_none() {
                WcStatus::Success
            } else {
                self.failing_status(unsignaled)
            };
            if status == WcStatus::Success && !self.ring[at].signaled {
                unsignaled += 1;
                continue;
            }
            let wc = Self::completion(&self.ring[at], status);
            if status == WcStatus::RemoteAccess {
                self.fail_at = None;
                self.broken = true;
            }
            self.head = (at + 1) % self.ring.len();
            self.queued -= unsignaled + 1;
            self.done += unsignaled as u64 + 1;
            if self.watch.is_some() {
                for _ in 0..unsignaled {
                    self.tell_completed(WcStatus::Success);
                }
                self.tell_completed(status);
            }
            unsignaled = 0;
            n += 1;
            self.books.complete_device(wc, out, raw);
        }
        Ok(n)
    }

    fn shutdown(&mut self) -> bool {
        if let Some(hold) = &self.hold {
            hold.hold();
        }
        // Everything still queued is flushed, as on a queue pair moved to
        // the error state.
        let (mut out, mut raw) = (Vec::new(), Vec::new());
        // (A queue pair in the error state reports every request, signaled
        // or not.)
        while self.queued > 0 {
            let wc = Self::completion(&self.ring[self.head], WcStatus::Flushed);
            self.head = (self.head + 1) % self.ring.len();
            self.queued -= 1;
            self.done += 1;
            self.tell_completed(WcStatus::Flushed);
            self.books.complete_device(wc, &mut out, &mut raw);
        }
        true
    }

    fn check_events(&self) -> Result<(), Error> {
        Ok(())
    }

    fn arm_events(&mut self) -> Result<Armed, Error> {
        // Whatever was posted completes at the next poll: nothing to
        // sleep on, so a wait ends at once.
        Ok(Armed::Ready)
    }

    fn take_events(&mut self) -> Result<(), Error> {
        Ok(())
    }
}

/// A [`SharedScheduler`](crate::SharedScheduler) for null sinks.
#[derive(Clone)]
pub struct NullScheduler {
    shared: Shared<NullSink, DefaultScheduler>,
}

impl std::fmt::Debug for NullScheduler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.shared.debug("NullScheduler", f)
    }
}

impl NullScheduler {
    /// See [`SharedScheduler::new`](crate::SharedScheduler::new).
    pub fn new(config: SharedConfig) -> Result<NullScheduler, Error> {
        Self::on(config, EngineClock::real())
    }

    /// The same on `clock`, which moves only when told to: the engine
    /// (its windows, pacing, the release of stalled budget, its wake-ups)
    /// then runs in virtual time.
    pub fn with_clock(
        config: SharedConfig,
        clock: Arc<ManualClock>,
    ) -> Result<NullScheduler, Error> {
        Self::on(config, EngineClock::Manual(clock))
    }

    fn on(config: SharedConfig, clock: EngineClock) -> Result<NullScheduler, Error> {
        let sched = default_scheduler(&config)?;
        Ok(NullScheduler {
            shared: Shared::new(config, sched, clock)?,
        })
    }

    /// See [`SharedScheduler::set_policy`](crate::SharedScheduler::set_policy).
    pub fn set_policy(&self, tenant: TenantId, policy: TenantPolicy) -> Result<(), Error> {
        self.shared.set_policy(tenant, policy)
    }

    /// See [`SharedScheduler::bulk_bytes_in_flight`](crate::SharedScheduler::bulk_bytes_in_flight).
    pub fn bulk_bytes_in_flight(&self) -> u64 {
        self.shared.bulk_bytes_in_flight()
    }

    /// See [`SharedScheduler::queue_pairs`](crate::SharedScheduler::queue_pairs).
    pub fn queue_pairs(&self) -> usize {
        self.shared.queue_pairs()
    }

    /// See [`QueuePair::scheduled_on`](crate::QueuePair::scheduled_on).
    pub fn attach(&self, sink: NullSink, config: ScheduleConfig) -> Result<NullScheduled, Error> {
        Ok(NullScheduled {
            inner: self.shared.attach(sink, config)?,
        })
    }
}

/// See [`QueuePair::scheduled`](crate::QueuePair::scheduled): a null sink
/// on a scheduler of its own.
pub fn scheduled(sink: NullSink, config: ScheduleConfig) -> Result<NullScheduled, Error> {
    let (config, sched) = solo_parts(config, sink.tenant.as_ref())?;
    scheduled_with(sink, config, sched)
}

/// [`scheduled`] on `clock`, which moves only when told to: the engine
/// (its window, pacing, its wake-ups) runs in virtual time, and a test
/// decides how long each piece took by moving the clock between the post
/// and the poll that completes it.
pub fn scheduled_with_clock(
    sink: NullSink,
    config: ScheduleConfig,
    clock: Arc<ManualClock>,
) -> Result<NullScheduled, Error> {
    let (config, sched) = solo_parts(config, sink.tenant.as_ref())?;
    scheduled_with_on_clock(sink, config, sched, clock)
}

/// See [`QueuePair::scheduled_with`](crate::QueuePair::scheduled_with): a
/// null sink on a scheduler of its own, `sched`.
pub fn scheduled_with<Q: PieceScheduler>(
    sink: NullSink,
    config: ScheduleConfig,
    sched: Q,
) -> Result<NullScheduled<Q>, Error> {
    Ok(NullScheduled {
        inner: Scheduled::solo(sink, config, sched, EngineClock::real())?,
    })
}

/// [`scheduled_with`] on `clock`, as [`scheduled_with_clock`] is for the
/// built-in scheduler: a scheduler of the caller's (say, one composed of
/// `mtrdma_sched::compose` pieces) in virtual time.
pub fn scheduled_with_on_clock<Q: PieceScheduler>(
    sink: NullSink,
    config: ScheduleConfig,
    sched: Q,
    clock: Arc<ManualClock>,
) -> Result<NullScheduled<Q>, Error> {
    Ok(NullScheduled {
        inner: Scheduled::solo(sink, config, sched, EngineClock::Manual(clock))?,
    })
}

/// A [`ScheduledQueuePair`](crate::ScheduledQueuePair) on a null sink.
pub struct NullScheduled<Q: PieceScheduler = DefaultScheduler> {
    inner: Scheduled<NullSink, Q>,
}

impl<Q: PieceScheduler> std::fmt::Debug for NullScheduled<Q> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.inner.debug("NullScheduled", f)
    }
}

impl<Q: PieceScheduler> NullScheduled<Q> {
    /// See [`ScheduledQueuePair::post_send`](crate::ScheduledQueuePair::post_send).
    pub fn post_send(
        &mut self,
        op: SendOp,
        region: HeapRegion,
        range: Range<usize>,
        context: u64,
    ) -> Result<(), (Error, HeapRegion)> {
        self.inner.post_send(op, region, range, context, false)
    }

    /// See [`ScheduledQueuePair::post_send_gather`](crate::ScheduledQueuePair::post_send_gather):
    /// on refusal, the error and the parts, untouched, in order.
    #[allow(clippy::type_complexity)]
    pub fn post_send_gather(
        &mut self,
        op: SendOp,
        parts: Vec<(HeapRegion, Range<usize>)>,
        context: u64,
    ) -> Result<(), (Error, Vec<(HeapRegion, Range<usize>)>)> {
        self.inner.post_gather(op, parts, context)
    }

    /// See [`ScheduledQueuePair::post_send_whole`](crate::ScheduledQueuePair::post_send_whole).
    pub fn post_send_whole(
        &mut self,
        op: SendOp,
        region: HeapRegion,
        range: Range<usize>,
        context: u64,
    ) -> Result<(), (Error, HeapRegion)> {
        self.inner.post_send(op, region, range, context, true)
    }

    /// See [`ScheduledQueuePair::batch`](crate::ScheduledQueuePair::batch)
    /// and [`ScheduledBatch::submit`](crate::ScheduledBatch::submit):
    /// `requests` (operation, region, range, context) accepted together.
    /// On refusal, the error and the requests not accepted, as (context,
    /// region).
    pub fn post_batch(
        &mut self,
        requests: impl IntoIterator<Item = (SendOp, HeapRegion, Range<usize>, u64)>,
    ) -> Result<(), BatchRefused> {
        let mut requests = requests.into_iter();
        let mut checked = Vec::with_capacity(requests.size_hint().0);
        while let Some((op, region, range, context)) = requests.next() {
            match Request::checked(op, region, range, context) {
                Ok(request) => checked.push(request),
                Err((error, region)) => {
                    let mut refused: Vec<_> =
                        checked.into_iter().map(|r| (r.context, r.region)).collect();
                    refused.push((context, region));
                    refused.extend(requests.map(|(_, region, _, context)| (context, region)));
                    return Err((error, refused));
                }
            }
        }
        self.inner
            .post_batch(checked)
            .map_err(|refusal| (*refusal.error, refusal.refused))
    }

    /// See [`ScheduledQueuePair::batch`](crate::ScheduledQueuePair::batch).
    pub fn batch(&mut self) -> NullBatch<'_, Q> {
        NullBatch {
            inner: Batched::new(&mut self.inner),
        }
    }

    /// See [`ScheduledQueuePair::poll`](crate::ScheduledQueuePair::poll).
    pub fn poll(&mut self, out: &mut Vec<HostCompletion>) -> Result<usize, Error> {
        self.inner.poll(out)
    }

    /// See [`ScheduledQueuePair::poll_wait`](crate::ScheduledQueuePair::poll_wait).
    /// A null sink completes what was posted at the next poll, so this
    /// never sleeps: it polls and returns.
    pub fn poll_wait(
        &mut self,
        out: &mut Vec<HostCompletion>,
        timeout: Duration,
    ) -> Result<usize, Error> {
        self.inner.poll_wait(out, timeout)
    }

    /// See [`ScheduledQueuePair::queued`](crate::ScheduledQueuePair::queued).
    pub fn queued(&self) -> usize {
        self.inner.queued()
    }

    /// See [`ScheduledQueuePair::window`](crate::ScheduledQueuePair::window).
    pub fn window(&self) -> Option<crate::WindowState> {
        self.inner.window()
    }

    /// See [`ScheduledQueuePair::tenant`](crate::ScheduledQueuePair::tenant).
    pub fn tenant(&self) -> TenantId {
        self.inner.tenant
    }

    /// See [`ScheduledQueuePair::class`](crate::ScheduledQueuePair::class).
    pub fn class(&self) -> mtrdma_core::TrafficClass {
        self.inner.class
    }

    /// Runs `f` on its null sink.
    pub fn with_sink<R>(&mut self, f: impl FnOnce(&mut NullSink) -> R) -> R {
        self.inner.with_sink(f)
    }
}

/// A [`ScheduledBatch`](crate::ScheduledBatch) on a null sink
/// ([`NullScheduled::batch`]).
#[must_use = "a batch posts nothing until it is submitted"]
pub struct NullBatch<'qp, Q: PieceScheduler = DefaultScheduler> {
    inner: Batched<'qp, NullSink, Q>,
}

impl<Q: PieceScheduler> std::fmt::Debug for NullBatch<'_, Q> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NullBatch")
            .field("requests", &self.inner.len())
            .finish()
    }
}

impl<Q: PieceScheduler> NullBatch<'_, Q> {
    /// See [`ScheduledBatch::post_send`](crate::ScheduledBatch::post_send).
    pub fn post_send(
        &mut self,
        op: SendOp,
        region: HeapRegion,
        range: Range<usize>,
        context: u64,
    ) -> Result<(), (Error, HeapRegion)> {
        self.inner.push(op, region, range, context)
    }

    /// See [`ScheduledBatch::post_send_gather`](crate::ScheduledBatch::post_send_gather):
    /// on refusal, the error and the parts, untouched, in order.
    #[allow(clippy::type_complexity)]
    pub fn post_send_gather(
        &mut self,
        op: SendOp,
        parts: Vec<(HeapRegion, Range<usize>)>,
        context: u64,
    ) -> Result<(), (Error, Vec<(HeapRegion, Range<usize>)>)> {
        self.inner.push_gather(op, parts, context)
    }

    /// Requests in the batch.
    pub fn len(&self) -> usize {
        self.inner.len()
    }

    /// Whether the batch has no request.
    pub fn is_empty(&self) -> bool {
        self.inner.len() == 0
    }

    /// See [`ScheduledBatch::submit`](crate::ScheduledBatch::submit): on
    /// refusal, the error and the regions not accepted, as (context,
    /// region), a gather request's consecutive.
    pub fn submit(self) -> Result<(), BatchRefused> {
        self.inner
            .submit()
            .map_err(|refusal| (*refusal.error, refusal.refused))
    }

    /// See [`ScheduledBatch::cancel`](crate::ScheduledBatch::cancel).
    pub fn cancel(self) -> Vec<(u64, HeapRegion)> {
        self.inner.cancel()
    }
}

#[cfg(test)]
mod gather_tests;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::RemoteRegion;
    use mtrdma_core::TrafficClass;
    use mtrdma_core::{LinkConfig, Policy, QuotaTable, RateLimit};
    use mtrdma_sched::{DelayWindowConfig, Nanos, WindowFactory};

    /// Scheduled as tenant 0, bulk, by the scheduler alone.
    fn bulk0() -> ScheduleConfig {
        ScheduleConfig::local(TenantId(0), TrafficClass::Bulk)
    }

    const REMOTE: RemoteRegion = RemoteRegion {
        addr: 0x7000_0000,
        len: 1 << 20,
        rkey: 0x42,
    };

    /// A 64 B region whose first bytes say `tag`.
    fn tagged(tag: u64) -> HeapRegion {
        let mut r = HeapRegion::new(64);
        r.as_mut_slice()[..8].copy_from_slice(&tag.to_le_bytes());
        r
    }

    fn tag(r: &HeapRegion) -> u64 {
        u64::from_le_bytes(r.as_slice()[..8].try_into().unwrap())
    }

    fn post(qp: &mut NullScheduled, op: SendOp, region: HeapRegion, len: usize, context: u64) {
        if let Err((e, _)) = qp.post_send(op, region, 0..len, context) {
            panic!("refused: {e}");
        }
    }

    /// A shared engine that cuts requests into 1 KiB pieces.
    fn shared_1k() -> NullScheduler {
        NullScheduler::new(SharedConfig {
            chunk_bytes: 1024,
            ..SharedConfig::default()
        })
        .unwrap()
    }

    /// Polls until `want` completions came (or gives up).
    fn drain<Q: PieceScheduler>(qp: &mut NullScheduled<Q>, want: usize) -> Vec<HostCompletion> {
        let mut out = Vec::new();
        for _ in 0..100_000 {
            if out.len() >= want {
                break;
            }
            qp.poll(&mut out).unwrap();
        }
        out
    }

    /// `n` 64 B WRITEs, contexts `0..n`, each region tagged with its
    /// context.
    fn writes(n: u64) -> Vec<(SendOp, HeapRegion, Range<usize>, u64)> {
        (0..n)
            .map(|i| (SendOp::Write(REMOTE), tagged(i), 0..64, i))
            .collect()
    }

    #[test]
    fn a_watched_sink_reports_what_it_takes_refuses_and_completes() {
        let events = Arc::new(std::sync::Mutex::new(Vec::new()));
        let seen = Arc::clone(&events);
        let mut sink = NullSink::new(1, 4).watch(move |e| {
            let e = match e {
                SinkEvent::Posted(p) => format!("posted {} {}", p.wr_id, p.length),
                SinkEvent::Refused(p) => format!("refused {}", p.wr_id),
                SinkEvent::Completed(s) => format!("completed {s:?}"),
            };
            seen.lock().unwrap().push(e);
        });
        post_direct(&mut sink, 7, 64);
        sink.refuse_after(0);
        assert!(sink
            .post_send(SendOp::Write(REMOTE), tagged(8), 0..16, 8)
            .is_err());
        post_direct(&mut sink, 9, 32);
        sink.fail_completion_after(0);
        let mut out = Vec::new();
        sink.poll(&mut out).unwrap();
        let events = events.lock().unwrap();
        assert_eq!(events.len(), 5, "{events:?}");
        assert!(events[0].starts_with("posted ") && events[0].ends_with(" 64"));
        assert!(events[1].starts_with("refused "));
        assert!(events[2].starts_with("posted ") && events[2].ends_with(" 32"));
        assert_eq!(events[3..], ["completed RemoteAccess", "completed Flushed"]);
    }

    fn post_direct(sink: &mut NullSink, context: u64, len: usize) {
        let r = tagged(context);
        if sink
            .post_send(SendOp::Write(REMOTE), r, 0..len, context)
            .is_err()
        {
            panic!("refused");
        }
    }

    #[test]
    fn a_batch_goes_as_one_list_and_asks_for_two_completions() {
        let mut sink = NullSink::new(1, 64).recording();
        sink.post_batch(writes(20)).unwrap();
        let posted = sink.take_log();
        let signaled: Vec<usize> = (0..posted.len()).filter(|&i| posted[i].signaled).collect();
        assert_eq!(posted.len(), 20);
        assert_eq!(signaled, [9, 19], "the one halfway and the last ask");
        assert_eq!(sink.sends_in_flight(), 20);
        let mut out = Vec::new();
        let reported = sink.poll(&mut out).unwrap();
        assert_eq!(reported, 2, "two completions from the device");
        assert_eq!(
            out.iter()
                .map(|c| (c.context, tag(&c.region)))
                .collect::<Vec<_>>(),
            (0..20).map(|i| (i, i)).collect::<Vec<_>>(),
            "every request hands its own region back, in order"
        );
        assert!(out.iter().all(|c| c.status == WcStatus::Success
            && c.opcode == Opcode::Write
            && c.byte_len == 64));
        assert_eq!(sink.sends_in_flight(), 0);
    }

    #[test]
    fn a_batch_the_send_queue_cannot_hold_is_refused_whole_requests_back() {
        let mut sink = NullSink::new(1, 8);
        let (e, refused) = sink.post_batch(writes(10)).unwrap_err();
        assert!(matches!(e, Error::SendQueueFull { depth: 8 }), "{e}");
        assert_eq!(
            refused
                .iter()
                .map(|(c, r)| (*c, tag(r)))
                .collect::<Vec<_>>(),
            (0..10).map(|i| (i, i)).collect::<Vec<_>>()
        );
        assert_eq!(sink.sends_in_flight(), 0);
        // The device refusing one part way: those before it are posted.
        sink.refuse_after(3);
        let (_, refused) = sink.post_batch(writes(6)).unwrap_err();
        assert_eq!(
            refused.iter().map(|(c, _)| *c).collect::<Vec<_>>(),
            [3, 4, 5]
        );
        let mut out = Vec::new();
        sink.poll(&mut out).unwrap();
        assert_eq!(
            out.iter().map(|c| c.context).collect::<Vec<_>>(),
            [0, 1, 2],
            "the unsignaled ones before the refusal are reported"
        );
        assert_eq!(sink.sends_in_flight(), 0);
    }

    #[test]
    fn a_window_driven_under_a_piece_by_a_sleeping_sender_still_finishes_every_request() {
        // A sender on a shared engine with a delay window polls its first
        // request 380 ms late (its window learns a round trip that long
        // and shrinks to a quarter of a piece), sends a request whole and
        // then 24 pieces: they go slowly, one piece every few round trips,
        // but every request completes, once (found by the data_path fuzz
        // target, whose drain was shorter than this takes).
        let clock = Arc::new(ManualClock::new(Nanos::from_millis(1)));
        let shared = NullScheduler::with_clock(
            SharedConfig {
                chunk_bytes: 1024,
                bulk_bytes_in_flight: 8 << 10,
                stall_after: Duration::from_millis(20),
                ..SharedConfig::default()
            },
            Arc::clone(&clock),
        )
        .unwrap();
        let window: Arc<dyn WindowFactory> = Arc::new(DelayWindowConfig {
            quiet_every: Nanos::from_millis(50),
            ..DelayWindowConfig::for_piece(1024)
        });
        let config = ScheduleConfig {
            chunk_bytes: 1024,
            max_pieces_in_flight: 8,
            window: Some(window),
            ..ScheduleConfig::local(TenantId(3), TrafficClass::Bulk)
        };
        let mut qp = shared.attach(NullSink::new(3, 16), config).unwrap();
        let w = SendOp::Write(REMOTE);
        let region = |id: u64, len: usize| {
            let mut r = HeapRegion::new(len);
            r.as_mut_slice()[..8].copy_from_slice(&id.to_le_bytes());
            (w, r, 0..len, id)
        };
        let (op, r, range, id) = region(0, 584);
        qp.post_send(op, r, range, id).map_err(|e| e.0).unwrap();
        clock.advance(Nanos::from_millis(380));
        let small = [(1, 296), (2, 264), (3, 8)].map(|(id, len)| region(id, len));
        qp.post_batch(small).map_err(|e| e.0).unwrap();
        let (op, r, range, id) = region(4, 3976);
        qp.post_send_whole(op, r, range, id)
            .map_err(|e| e.0)
            .unwrap();
        let large = [5, 6, 7].map(|id| region(id, 8040));
        qp.post_batch(large).map_err(|e| e.0).unwrap();
        let mut done = Vec::new();
        for _ in 0..30_000 {
            qp.poll(&mut done).unwrap();
            if done.len() >= 8 {
                break;
            }
            clock.advance(Nanos::from_millis(10));
        }
        let mut got: Vec<(u64, u64)> = done.iter().map(|c| (c.context, tag(&c.region))).collect();
        got.sort_unstable();
        assert_eq!(got, (0..8).map(|i| (i, i)).collect::<Vec<_>>());
        assert!(done.iter().all(|c| c.status == WcStatus::Success));
        assert_eq!((qp.queued(), qp.with_sink(|s| s.sends_in_flight())), (0, 0));
    }

    /// Contexts `from..from + n` as a batch (each region tagged with its
    /// context).
    fn writes_from(from: u64, n: u64) -> Vec<(SendOp, HeapRegion, Range<usize>, u64)> {
        (from..from + n)
            .map(|i| (SendOp::Write(REMOTE), tagged(i), 0..64, i))
            .collect()
    }

    #[test]
    fn batches_between_single_posts_complete_in_order_and_a_failure_among_them_loses_nothing() {
        // A batch, single posts, a batch longer than one list, a single
        // post: the batches' unsignaled requests are reported by their
        // own lists' completions, the single posts by theirs, in order.
        let mut sink = NullSink::new(1, 128).recording();
        sink.post_batch(writes_from(0, 5)).unwrap();
        post_direct(&mut sink, 5, 64);
        post_direct(&mut sink, 6, 64);
        sink.post_batch(writes_from(7, 40)).unwrap();
        post_direct(&mut sink, 47, 64);
        let posted = sink.take_log();
        let signaled = posted.iter().filter(|p| p.signaled).count();
        assert_eq!(posted.len(), 48);
        assert_eq!(
            signaled,
            2 + 2 + 2 + 2 + 1,
            "lists of 5, 32 and 8, two singles, one single"
        );
        let mut out = Vec::new();
        while sink.sends_in_flight() > 0 {
            sink.poll(&mut out).unwrap();
        }
        let got: Vec<(u64, u64)> = out.iter().map(|c| (c.context, tag(&c.region))).collect();
        assert_eq!(got, (0..48).map(|i| (i, i)).collect::<Vec<_>>());
        assert!(out.iter().all(|c| c.status == WcStatus::Success));

        // The same with the 30th request failing (unsignaled, in the long
        // batch's first list): those before it succeed, it fails, every
        // later one is flushed, each reported once.
        sink.post_batch(writes_from(0, 5)).unwrap();
        post_direct(&mut sink, 5, 64);
        post_direct(&mut sink, 6, 64);
        sink.post_batch(writes_from(7, 40)).unwrap();
        post_direct(&mut sink, 47, 64);
        sink.fail_completion_after(29);
        let mut out = Vec::new();
        while sink.sends_in_flight() > 0 {
            sink.poll(&mut out).unwrap();
        }
        let got: Vec<(u64, u64, WcStatus)> = out
            .iter()
            .map(|c| (c.context, tag(&c.region), c.status))
            .collect();
        let want: Vec<(u64, u64, WcStatus)> = (0..48)
            .map(|i| match i {
                0..=28 => (i, i, WcStatus::Success),
                29 => (i, i, WcStatus::RemoteAccess),
                _ => (i, i, WcStatus::Flushed),
            })
            .collect();
        assert_eq!(got, want);
    }

    #[test]
    fn a_batch_refused_in_its_second_list_hands_back_what_was_not_posted() {
        // 40 requests go as lists of 32 and 8; the device takes the first
        // list and 3 of the second, the 3rd of them unsignaled: a
        // zero-length WRITE reports them, and the other 5 come back.
        let mut sink = NullSink::new(1, 128).recording();
        sink.refuse_after(35);
        let (e, refused) = sink.post_batch(writes(40)).unwrap_err();
        assert!(matches!(e, Error::Verbs { .. }), "{e}");
        assert_eq!(
            refused
                .iter()
                .map(|(c, r)| (*c, tag(r)))
                .collect::<Vec<_>>(),
            (35..40).map(|i| (i, i)).collect::<Vec<_>>()
        );
        let posted = sink.take_log();
        assert_eq!(posted.len(), 36, "35 requests and the zero-length WRITE");
        assert_eq!((posted[35].length, posted[35].signaled), (0, true));
        let mut out = Vec::new();
        while sink.sends_in_flight() > 0 {
            sink.poll(&mut out).unwrap();
        }
        assert_eq!(
            out.iter().map(|c| c.context).collect::<Vec<_>>(),
            (0..35).collect::<Vec<_>>(),
            "every posted request once, the zero-length WRITE none"
        );
        // The books are empty: a batch after it is numbered afresh.
        sink.post_batch(writes(3)).unwrap();
        let mut out = Vec::new();
        sink.poll(&mut out).unwrap();
        assert_eq!(out.iter().map(|c| c.context).collect::<Vec<_>>(), [0, 1, 2]);
        assert_eq!(sink.sends_in_flight(), 0);
    }

    #[test]
    fn a_failed_request_in_a_batch_reports_every_request_once() {
        let mut sink = NullSink::new(1, 64);
        sink.post_batch(writes(20)).unwrap();
        // The 6th fails: unsignaled, it reports itself; the five before it
        // succeeded; all after it are flushed.
        sink.fail_completion_after(5);
        let mut out = Vec::new();
        while sink.sends_in_flight() > 0 {
            sink.poll(&mut out).unwrap();
        }
        let got: Vec<_> = out.iter().map(|c| (c.context, c.status)).collect();
        let want: Vec<_> = (0..20)
            .map(|i| match i {
                0..=4 => (i, WcStatus::Success),
                5 => (i, WcStatus::RemoteAccess),
                _ => (i, WcStatus::Flushed),
            })
            .collect();
        assert_eq!(got, want);
    }

    #[test]
    fn a_split_request_goes_as_one_list_and_a_failed_piece_fails_it_once() {
        for (way, mut qp) in [
            (
                "solo",
                scheduled(
                    NullSink::new(1, 64).recording(),
                    ScheduleConfig {
                        chunk_bytes: 4096,
                        max_pieces_in_flight: 16,
                        ..bulk0()
                    },
                )
                .unwrap(),
            ),
            (
                "shared",
                NullScheduler::new(SharedConfig {
                    chunk_bytes: 4096,
                    bulk_bytes_in_flight: 1 << 20,
                    ..SharedConfig::default()
                })
                .unwrap()
                .attach(
                    NullSink::new(2, 64).recording(),
                    ScheduleConfig {
                        max_pieces_in_flight: 16,
                        ..bulk0()
                    },
                )
                .unwrap(),
            ),
        ] {
            post(
                &mut qp,
                SendOp::Write(REMOTE),
                HeapRegion::new(65536),
                65536,
                7,
            );
            let done = drain(&mut qp, 1);
            let posted = qp.with_sink(|s| s.take_log());
            assert_eq!(posted.len(), 16, "{way}");
            assert_eq!(
                posted.iter().filter(|p| p.signaled).count(),
                2,
                "{way}: the piece halfway and the request's last ask for a completion"
            );
            assert!(posted[7].signaled && posted[15].signaled, "{way}");
            assert_eq!(
                (done.len(), done[0].context, done[0].status),
                (1, 7, WcStatus::Success)
            );

            // The 4th piece of the next one fails: the request fails once,
            // its region back, and nothing is left in flight.
            qp.with_sink(|s| s.fail_completion_after(3));
            post(
                &mut qp,
                SendOp::Write(REMOTE),
                HeapRegion::new(65536),
                65536,
                8,
            );
            let done = drain(&mut qp, 1);
            assert_eq!(done.len(), 1, "{way}");
            assert_eq!(
                (done[0].context, done[0].status, done[0].region.len()),
                (8, WcStatus::RemoteAccess, 65536),
                "{way}"
            );
            let mut more = Vec::new();
            for _ in 0..100 {
                qp.poll(&mut more).unwrap();
            }
            assert!(more.is_empty(), "{way}: reported once");
            assert_eq!(qp.queued(), 0, "{way}");
            assert_eq!(qp.with_sink(|s| s.sends_in_flight()), 0, "{way}");
        }
    }

    #[test]
    fn a_scheduled_batch_is_accepted_together_and_completes_request_by_request() {
        let shared = NullScheduler::new(SharedConfig::default()).unwrap();
        let sixteen = ScheduleConfig {
            max_pieces_in_flight: 16,
            ..bulk0()
        };
        let solo = scheduled(NullSink::new(1, 64).recording(), sixteen.clone()).unwrap();
        let attached = shared
            .attach(NullSink::new(2, 64).recording(), sixteen)
            .unwrap();
        for (way, mut qp) in [("solo", solo), ("shared", attached)] {
            qp.post_batch(writes(16)).unwrap();
            let posted = qp.with_sink(|s| s.take_log());
            assert_eq!(posted.len(), 16, "{way}");
            assert_eq!(
                posted.iter().filter(|p| p.signaled).count(),
                2,
                "{way}: two completions for the batch"
            );
            let done = drain(&mut qp, 16);
            assert_eq!(
                done.iter()
                    .map(|c| (c.context, tag(&c.region)))
                    .collect::<Vec<_>>(),
                (0..16).map(|i| (i, i)).collect::<Vec<_>>(),
                "{way}"
            );
            assert_eq!(qp.queued(), 0, "{way}");
            // A request out of bounds refuses it and those after it, the
            // ones before accepted.
            let mut batch = writes(4);
            batch[2].2 = 0..65;
            let (e, refused) = qp.post_batch(batch).unwrap_err();
            assert!(
                matches!(e, Error::LocalRangeOutOfBounds { .. }),
                "{way}: {e}"
            );
            assert_eq!(refused.len(), 4, "{way}: checked before any is accepted");
            assert_eq!(qp.queued(), 0, "{way}");
        }
    }

    #[test]
    fn a_scheduled_batch_past_what_may_go_at_once_or_cut_by_the_device_loses_nothing() {
        // Four may go at once (the rest wait for the engine); then the
        // device refuses the third of the list, and then everything.
        let four = ScheduleConfig {
            max_pieces_in_flight: 4,
            ..bulk0()
        };
        let mut qp = scheduled(NullSink::new(1, 64).recording(), four).unwrap();
        qp.post_batch(writes(16)).unwrap();
        assert!(qp.queued() > 0, "the engine holds what may not go yet");
        let done = drain(&mut qp, 16);
        let got: Vec<(u64, u64, WcStatus)> = done
            .iter()
            .map(|c| (c.context, tag(&c.region), c.status))
            .collect();
        let want: Vec<(u64, u64, WcStatus)> = (0..16).map(|i| (i, i, WcStatus::Success)).collect();
        assert_eq!(got, want, "every request once, in order");
        assert_eq!(qp.with_sink(|s| s.take_log()).len(), 16);

        qp.with_sink(|s| s.refuse_after(2));
        qp.post_batch(writes(4)).unwrap();
        let mut done = drain(&mut qp, 4);
        done.sort_by_key(|c| c.context);
        assert_eq!(
            done.iter()
                .map(|c| (c.context, tag(&c.region), c.status))
                .collect::<Vec<_>>(),
            (0..4)
                .map(|i| (i, i, WcStatus::Success))
                .collect::<Vec<_>>(),
            "the two the device refused went through the engine"
        );

        qp.with_sink(|s| s.set_fail(true));
        qp.post_batch(writes(4)).unwrap();
        let mut done = drain(&mut qp, 4);
        done.sort_by_key(|c| c.context);
        assert_eq!(
            done.iter()
                .map(|c| (c.context, tag(&c.region)))
                .collect::<Vec<_>>(),
            (0..4).map(|i| (i, i)).collect::<Vec<_>>(),
            "a refused request comes back once, failed"
        );
        assert!(done.iter().all(|c| c.status != WcStatus::Success));
        assert_eq!(qp.queued(), 0);
        assert_eq!(qp.with_sink(|s| s.sends_in_flight()), 0);
    }

    #[test]
    fn direct_path_parks_the_region_and_hands_it_back() {
        let mut sink = NullSink::new(1, 2).recording();
        for i in 0..2 {
            sink.post_send(SendOp::Write(REMOTE), tagged(i), 0..64, i)
                .unwrap();
        }
        let (e, r) = sink
            .post_send(SendOp::Write(REMOTE), tagged(9), 0..64, 9)
            .unwrap_err();
        assert!(matches!(e, Error::SendQueueFull { depth: 2 }), "{e}");
        assert_eq!(tag(&r), 9, "the refused region comes back");
        let (e, r) = sink
            .post_send(SendOp::Write(REMOTE), r, 0..65, 9)
            .unwrap_err();
        assert!(matches!(e, Error::LocalRangeOutOfBounds { .. }), "{e}");
        let mut out = Vec::new();
        assert_eq!(sink.poll(&mut out).unwrap(), 2);
        let got: Vec<_> = out.iter().map(|c| (c.context, tag(&c.region))).collect();
        assert_eq!(got, [(0, 0), (1, 1)]);
        assert!(out
            .iter()
            .all(|c| (c.status, c.opcode, c.byte_len) == (WcStatus::Success, Opcode::Write, 64)));
        let log = sink.take_log();
        assert_eq!(log.len(), 2);
        assert_eq!(
            (log[0].remote_addr, log[0].rkey, log[0].length),
            (REMOTE.addr, 0x42, 64)
        );
        sink.set_fail(true);
        let (_, r) = sink
            .post_send(SendOp::Write(REMOTE), r, 0..64, 9)
            .unwrap_err();
        assert_eq!(tag(&r), 9);
        assert_eq!(sink.sends_in_flight(), 0);
    }

    #[test]
    fn every_request_completes_once_with_its_region_in_order() {
        let config = ScheduleConfig {
            max_pieces_in_flight: 4,
            ..bulk0()
        };
        let mut qp = scheduled(NullSink::new(1, 16), config).unwrap();
        for i in 0..100 {
            post(&mut qp, SendOp::Write(REMOTE), tagged(i), 64, i);
            assert!(qp.with_sink(|s| s.sends_in_flight()) <= 4);
        }
        assert_eq!(qp.queued(), 100);
        let mut out = Vec::new();
        while out.len() < 100 {
            qp.poll(&mut out).unwrap();
            assert!(
                qp.with_sink(|s| s.sends_in_flight()) <= 4,
                "at most max_pieces_in_flight in the NIC"
            );
        }
        assert_eq!(out.len(), 100);
        for (i, c) in out.iter().enumerate() {
            assert_eq!(c.context, i as u64, "one queue pair completes in order");
            assert_eq!(tag(&c.region), i as u64, "its own region back");
            assert_eq!(
                (c.status, c.opcode, c.byte_len),
                (WcStatus::Success, Opcode::Write, 64)
            );
        }
        assert_eq!(qp.queued(), 0);
        let mut more = Vec::new();
        qp.poll(&mut more).unwrap();
        assert!(more.is_empty(), "nothing completes twice");
        assert_eq!(qp.with_sink(|s| s.sends_in_flight()), 0);
    }

    /// Sends `requests` WRITEs of 64 KiB on `qp` one after the other,
    /// moving `clock` by `step` before each poll: every piece takes `step`
    /// from its post to the poll that completes it. Returns the window
    /// after each request.
    fn paced(
        qp: &mut NullScheduled,
        clock: &ManualClock,
        step: mtrdma_sched::Nanos,
        requests: u64,
    ) -> Vec<u64> {
        let mut windows = Vec::new();
        let mut out = Vec::new();
        for i in 0..requests {
            post(
                qp,
                SendOp::Write(REMOTE),
                HeapRegion::new(65_536),
                65_536,
                i,
            );
            out.clear();
            while out.is_empty() {
                clock.advance(step);
                qp.poll(&mut out).unwrap();
            }
            assert_eq!(out[0].status, WcStatus::Success);
            windows.push(qp.window().expect("a bulk window").window_bytes);
        }
        windows
    }

    #[test]
    fn on_a_manual_clock_a_stalled_queue_pair_gives_up_the_bulk_budget_after_stall_after() {
        // Two bulk tenants share 8 KiB in the NIC. The first fills it and
        // is never polled (its pieces never complete, as behind a peer
        // that is gone); the second waits until the first's oldest piece
        // has been out for `stall_after` (the clock moved by hand in steps
        // of 1 ms), and no sooner.
        let clock = Arc::new(ManualClock::new(mtrdma_sched::Nanos::from_millis(1)));
        let stall = Duration::from_millis(100);
        let shared = NullScheduler::with_clock(
            SharedConfig {
                chunk_bytes: 4096,
                bulk_bytes_in_flight: 8192,
                stall_after: stall,
                ..SharedConfig::default()
            },
            Arc::clone(&clock),
        )
        .unwrap();
        let bulk = |t| ScheduleConfig::local(TenantId(t), TrafficClass::Bulk);
        let mut stuck = shared.attach(NullSink::new(1, 16), bulk(1)).unwrap();
        let mut other = shared.attach(NullSink::new(2, 16), bulk(2)).unwrap();
        post(
            &mut stuck,
            SendOp::Write(REMOTE),
            HeapRegion::new(8192),
            8192,
            1,
        );
        assert_eq!(stuck.with_sink(|s| s.sends_in_flight()), 2);
        post(
            &mut other,
            SendOp::Write(REMOTE),
            HeapRegion::new(4096),
            4096,
            2,
        );
        let mut out = Vec::new();
        let step = mtrdma_sched::Nanos::from_millis(1);
        for _ in 0..99 {
            clock.advance(step);
            other.poll(&mut out).unwrap();
            assert_eq!(
                other.with_sink(|s| s.sends_in_flight()),
                0,
                "held while the budget is the first one's"
            );
        }
        clock.advance(step);
        for _ in 0..100 {
            other.poll(&mut out).unwrap();
        }
        assert_eq!(out.len(), 1, "released at 100 ms");
        assert_eq!((out[0].context, out[0].status), (2, WcStatus::Success));
        // The first one's request is still there, and completes once
        // polled.
        let done = drain(&mut stuck, 1);
        assert_eq!((done[0].context, done[0].status), (1, WcStatus::Success));
    }

    #[test]
    fn a_request_sent_whole_that_is_larger_than_the_window_goes_alone() {
        // A window of about one 1 KiB piece. First, requests sent whole of
        // one and three pieces: the second is larger than the window, and
        // with nothing in flight no completion would make room. Then one
        // of 1352 B split in two pieces, and one of 1352 B sent whole,
        // polled every millisecond (later than the round trip that would
        // round the window up to fit it). Each time, the large one goes
        // alone.
        for (split, lens) in [(false, [1032, 3080]), (true, [1352, 1352])] {
            let clock = Arc::new(ManualClock::new(mtrdma_sched::Nanos::from_millis(1)));
            let config = ScheduleConfig {
                chunk_bytes: 1024,
                max_pieces_in_flight: 8,
                window: Some(Arc::new(DelayWindowConfig {
                    quiet_every: mtrdma_sched::Nanos::from_millis(5),
                    ..DelayWindowConfig::for_piece(1024)
                })),
                ..bulk0()
            };
            let mut qp =
                scheduled_with_clock(NullSink::new(1, 16), config, Arc::clone(&clock)).unwrap();
            for (i, len) in lens.into_iter().enumerate() {
                let (r, op) = (HeapRegion::new(len), SendOp::Write(REMOTE));
                let result = if split && i == 0 {
                    qp.post_send(op, r, 0..len, i as u64)
                } else {
                    qp.post_send_whole(op, r, 0..len, i as u64)
                };
                if let Err((e, _)) = result {
                    panic!("refused: {e}");
                }
            }
            let mut out = Vec::new();
            for _ in 0..20 {
                qp.poll(&mut out).unwrap();
                clock.advance(mtrdma_sched::Nanos::from_millis(1));
            }
            assert_eq!(
                out.iter()
                    .map(|c| (c.context, c.byte_len))
                    .collect::<Vec<_>>(),
                [(0, lens[0] as u32), (1, lens[1] as u32)],
                "split first: {split}"
            );
            assert!(qp.window().unwrap().window_bytes < lens[1] as u64);
            assert_eq!(qp.queued(), 0);
        }
    }

    #[test]
    fn on_a_manual_clock_the_engine_and_its_window_run_in_virtual_time() {
        use mtrdma_sched::Nanos;
        let piece = 4096;
        let config = ScheduleConfig {
            chunk_bytes: piece,
            max_pieces_in_flight: 64,
            window: Some(Arc::new(DelayWindowConfig {
                quiet_every: Nanos::ZERO,
                ..DelayWindowConfig::for_piece(piece)
            })),
            ..bulk0()
        };
        let run = || {
            let clock = Arc::new(ManualClock::new(Nanos::from_millis(1)));
            let mut qp =
                scheduled_with_clock(NullSink::new(1, 128), config.clone(), Arc::clone(&clock))
                    .unwrap();
            // Pieces that take 100 us (the path's own delay, no queue):
            // the window grows. Then every piece takes 2 ms, a standing
            // queue far over the target: it shrinks to its least, a
            // quarter of a piece, and stays there (one piece every four
            // round trips) until, a base period later, it takes the 2 ms
            // for the path's own delay.
            let mut windows = paced(&mut qp, &clock, Nanos::from_micros(100), 100);
            windows.extend(paced(&mut qp, &clock, Nanos::from_millis(2), 10));
            assert_eq!(qp.queued(), 0);
            windows
        };
        let windows = run();
        let grown = windows[99];
        assert!(grown >= 4 * piece, "an empty queue lets it grow: {grown}");
        assert_eq!(
            windows[103..],
            [piece / 4; 7],
            "a standing queue shrinks it to its least"
        );
        // Nothing but the manual clock moves the engine's time: the same
        // run gives the same windows, request by request.
        assert_eq!(run(), windows);
    }

    #[test]
    fn a_window_bounds_the_bytes_in_the_nic_and_every_request_completes_in_order() {
        // A window fixed at 3 pieces of 4 KiB (and quiet times off): 16 KiB
        // requests split in 4 pieces, with room for 8 pieces otherwise.
        let piece = 4096;
        let window = DelayWindowConfig {
            initial_window: 3 * piece,
            min_window: 3 * piece,
            max_window: 3 * piece,
            quiet_every: mtrdma_sched::Nanos::ZERO,
            ..DelayWindowConfig::for_piece(piece)
        };
        let config = ScheduleConfig {
            chunk_bytes: piece,
            max_pieces_in_flight: 8,
            window: Some(std::sync::Arc::new(window)),
            ..bulk0()
        };
        let mut qp = scheduled(NullSink::new(1, 16).recording(), config).unwrap();
        let remote = RemoteRegion {
            addr: 0x9000_0000,
            len: 1 << 20,
            rkey: 5,
        };
        for i in 0..20u64 {
            let mut region = HeapRegion::new(16_384);
            region.as_mut_slice()[..8].copy_from_slice(&i.to_le_bytes());
            if let Err((e, _)) = qp.post_send(SendOp::Write(remote), region, 0..16_384, i) {
                panic!("refused: {e}");
            }
            assert!(qp.with_sink(|s| s.sends_in_flight()) <= 3);
        }
        let mut out = Vec::new();
        while out.len() < 20 {
            qp.poll(&mut out).unwrap();
            assert!(
                qp.with_sink(|s| s.sends_in_flight()) <= 3,
                "never more than the window in the NIC"
            );
        }
        for (i, c) in out.iter().enumerate() {
            assert_eq!((c.context, tag(&c.region)), (i as u64, i as u64));
            assert_eq!((c.status, c.byte_len), (WcStatus::Success, 16_384));
        }
        let log = qp.with_sink(NullSink::take_log);
        assert_eq!(log.len(), 80, "every piece posted once");
        assert!(log.iter().all(|p| p.length == 4096));
        assert_eq!(qp.queued(), 0);
    }

    #[test]
    fn a_latency_queue_pair_has_no_window() {
        let window = DelayWindowConfig {
            initial_window: 1,
            min_window: 1,
            max_window: 1,
            ..DelayWindowConfig::for_piece(4096)
        };
        let config = ScheduleConfig {
            max_pieces_in_flight: 4,
            window: Some(std::sync::Arc::new(window)),
            ..ScheduleConfig::local(TenantId(0), TrafficClass::Latency)
        };
        let mut qp = scheduled(NullSink::new(1, 16), config).unwrap();
        for i in 0..4 {
            post(&mut qp, SendOp::Write(REMOTE), tagged(i), 64, i);
        }
        assert_eq!(
            qp.with_sink(|s| s.sends_in_flight()),
            4,
            "latency pieces are not held back by a window"
        );
        assert_eq!(drain(&mut qp, 4).len(), 4);
    }

    #[test]
    fn a_shallow_send_queue_bounds_the_pieces_posted() {
        let mut qp = scheduled(NullSink::new(1, 2), bulk0()).unwrap();
        for i in 0..10 {
            post(&mut qp, SendOp::Send, tagged(i), 64, i);
        }
        assert_eq!(qp.with_sink(|s| s.sends_in_flight()), 2);
        let out = drain(&mut qp, 10);
        let contexts: Vec<u64> = out.iter().map(|c| c.context).collect();
        assert_eq!(contexts, (0..10).collect::<Vec<_>>());
        assert!(out.iter().all(|c| c.opcode == Opcode::Send));
    }

    #[test]
    fn a_whole_write_with_immediate_goes_as_one_work_request() {
        // Queued behind another request (not the fast path) and on it.
        for queued_behind in [true, false] {
            let config = ScheduleConfig {
                chunk_bytes: 4096,
                max_pieces_in_flight: 2,
                ..bulk0()
            };
            let mut qp = scheduled(NullSink::new(1, 16).recording(), config).unwrap();
            let remote = RemoteRegion {
                addr: 0x9000_0000,
                len: 16_384,
                rkey: 5,
            };
            if queued_behind {
                let op = SendOp::Write(remote);
                if let Err((e, _)) = qp.post_send(op, HeapRegion::new(16_384), 0..16_384, 1) {
                    panic!("refused: {e}");
                }
            }
            let region = HeapRegion::new(10_000);
            let op = SendOp::WriteWithImm(remote, 42);
            if let Err((e, _)) = qp.post_send_whole(op, region, 0..10_000, 9) {
                panic!("refused: {e}");
            }
            let done = drain(&mut qp, 1 + usize::from(queued_behind));
            let c = done
                .iter()
                .find(|c| c.context == 9)
                .expect("its completion");
            assert_eq!((c.status, c.byte_len), (WcStatus::Success, 10_000));
            let log = qp.with_sink(NullSink::take_log);
            let mine: Vec<&Posted> = log.iter().filter(|p| p.imm.is_some()).collect();
            assert_eq!(mine.len(), 1, "one work request");
            assert_eq!(
                (mine[0].opcode, mine[0].length, mine[0].imm),
                (
                    ffi::ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM,
                    10_000,
                    Some(42)
                )
            );
            // Every other work request is a piece of the first request.
            assert_eq!(log.len(), 1 + 4 * usize::from(queued_behind));
        }
    }

    #[test]
    fn a_scheduler_of_ones_own_decides_what_reaches_the_nic() {
        // The built-in scheduler splits a 16 KiB WRITE into 4 KiB pieces;
        // a FIFO plugged in its place grants it whole, in arrival order.
        let config = ScheduleConfig {
            chunk_bytes: 4096,
            ..bulk0()
        };
        let remote = RemoteRegion {
            addr: 0x9000_0000,
            len: 1 << 20,
            rkey: 5,
        };
        let mut fifo = scheduled_with(
            NullSink::new(1, 16).recording(),
            config.clone(),
            mtrdma_sched::FifoScheduler::new(),
        )
        .unwrap();
        let mut builtin = scheduled(NullSink::new(2, 16).recording(), config).unwrap();
        for i in 0..3u64 {
            let region = HeapRegion::new(16 << 10);
            if let Err((e, _)) = fifo.post_send(SendOp::Write(remote), region, 0..16 << 10, i) {
                panic!("refused: {e}");
            }
            let region = HeapRegion::new(16 << 10);
            if let Err((e, _)) = builtin.post_send(SendOp::Write(remote), region, 0..16 << 10, i) {
                panic!("refused: {e}");
            }
        }
        let mut out = Vec::new();
        while out.len() < 3 {
            fifo.poll(&mut out).unwrap();
        }
        let order: Vec<u64> = out.iter().map(|c| c.context).collect();
        assert_eq!(order, [0, 1, 2]);
        assert!(out.iter().all(|c| c.byte_len == 16 << 10));
        let lens: Vec<u32> = fifo
            .with_sink(NullSink::take_log)
            .iter()
            .map(|p| p.length)
            .collect();
        assert_eq!(lens, [16 << 10; 3], "one work request each");
        assert_eq!(drain(&mut builtin, 3).len(), 3);
        assert_eq!(
            builtin.with_sink(NullSink::take_log).len(),
            12,
            "4 pieces each"
        );
    }

    #[test]
    fn a_remote_region_reaching_past_the_address_space_is_refused_not_a_panic() {
        // A peer's description: 1 MiB at 100 bytes below the top of the
        // address space. A chunked WRITE's later pieces would overflow.
        let remote = RemoteRegion {
            addr: u64::MAX - 100,
            len: 1 << 20,
            rkey: 9,
        };
        assert_eq!(remote.slice(200, 8), None);
        let config = ScheduleConfig {
            chunk_bytes: 4096,
            ..bulk0()
        };
        let mut qp = scheduled(NullSink::new(1, 16), config).unwrap();
        let region = HeapRegion::new(16_384);
        let base = region.addr();
        match qp.post_send(SendOp::Write(remote), region, 0..16_384, 1) {
            Err((Error::RemoteOutOfBounds { .. }, back)) => {
                assert_eq!(back.addr(), base, "the region comes back");
            }
            Err((e, _)) => panic!("refused for another reason: {e}"),
            Ok(()) => panic!("posted pieces past the end of the address space"),
        }
        // The direct path refuses it too.
        let mut sink = NullSink::new(1, 16);
        assert!(matches!(
            sink.post_send(SendOp::Read(remote), HeapRegion::new(64), 0..64, 2),
            Err((Error::RemoteOutOfBounds { .. }, _))
        ));
    }

    #[test]
    fn chunked_write_pieces_go_in_order_with_their_offsets() {
        let config = ScheduleConfig {
            chunk_bytes: 4096,
            max_pieces_in_flight: 2,
            ..bulk0()
        };
        let mut qp = scheduled(NullSink::new(1, 16).recording(), config).unwrap();
        let region = HeapRegion::new(16_384);
        let base = region.addr();
        let remote = RemoteRegion {
            addr: 0x9000_0000,
            len: 10_000,
            rkey: 5,
        };
        let op = SendOp::WriteWithImm(remote, 42);
        if let Err((e, _)) = qp.post_send(op, region, 100..10_100, 9) {
            panic!("refused: {e}");
        }
        let done = drain(&mut qp, 1);
        assert_eq!(done.len(), 1, "one completion for the whole request");
        let c = &done[0];
        assert_eq!(
            (c.context, c.status, c.opcode, c.byte_len),
            (9, WcStatus::Success, Opcode::Write, 10_000)
        );
        assert_eq!(c.region.addr(), base, "its region back");
        let log = qp.with_sink(NullSink::take_log);
        let lens = [4096, 4096, 1808];
        assert_eq!(log.len(), lens.len());
        use ffi::ibv_wr_opcode as o;
        for (k, (p, len)) in log.iter().zip(lens).enumerate() {
            let offset = 4096 * k as u64;
            assert_eq!(p.addr, base + 100 + offset, "piece {k}: local offset");
            assert_eq!(p.length, len, "piece {k}: length");
            assert_eq!(
                p.remote_addr,
                remote.addr + offset,
                "piece {k}: remote offset"
            );
            assert_eq!((p.rkey, p.lkey), (5, 0x1234));
            let last = k == lens.len() - 1;
            let want = if last {
                (o::IBV_WR_RDMA_WRITE_WITH_IMM, Some(42))
            } else {
                (o::IBV_WR_RDMA_WRITE, None)
            };
            assert_eq!(
                (p.opcode, p.imm),
                want,
                "only the last piece carries the immediate"
            );
        }
        let mut more = Vec::new();
        qp.poll(&mut more).unwrap();
        assert!(more.is_empty());
    }

    #[test]
    fn poll_wait_on_a_null_sink_returns_at_once_and_finishes_chunked_work() {
        let config = ScheduleConfig {
            chunk_bytes: 1024,
            max_pieces_in_flight: 1,
            ..bulk0()
        };
        let shared = NullScheduler::new(SharedConfig::default()).unwrap();
        let solo = scheduled(NullSink::new(1, 16), config.clone()).unwrap();
        let attached = shared.attach(NullSink::new(2, 16), config).unwrap();
        for mut qp in [solo, attached] {
            let long = Duration::from_secs(30);
            let started = std::time::Instant::now();
            let mut out = Vec::new();
            // Nothing posted: nothing to wait for on a null sink.
            assert_eq!(qp.poll_wait(&mut out, long).unwrap(), 0);
            post(
                &mut qp,
                SendOp::Write(REMOTE),
                HeapRegion::new(8192),
                8192,
                5,
            );
            let mut calls = 0;
            while out.is_empty() {
                qp.poll_wait(&mut out, long).unwrap();
                calls += 1;
                assert!(calls < 1000, "eight pieces finish in a few calls");
            }
            assert!(
                started.elapsed() < Duration::from_secs(5),
                "a null sink's wait never sleeps out its timeout"
            );
            assert_eq!((out.len(), out[0].context), (1, 5));
            assert_eq!(qp.queued(), 0);
        }
    }

    /// An atomic goes whole (never split, whatever the piece size), as its
    /// verbs opcode, and completes once as an atomic; one that is not a
    /// single aligned 8-byte word is refused before anything is posted.
    #[test]
    fn an_atomic_goes_whole_and_a_misshapen_one_is_refused() {
        let config = ScheduleConfig {
            chunk_bytes: 4,
            ..bulk0()
        };
        let mut qp = scheduled(NullSink::new(1, 16).recording(), config).unwrap();
        let op = SendOp::CompareSwap {
            remote: REMOTE,
            compare: 1,
            swap: 2,
        };
        if let Err((e, _)) = qp.post_send(op, HeapRegion::new(8), 0..8, 5) {
            panic!("refused: {e}");
        }
        let log = qp.with_sink(|s| s.take_log());
        assert_eq!(log.len(), 1, "never split");
        assert_eq!(
            (log[0].opcode, log[0].length, log[0].remote_addr),
            (
                ffi::ibv_wr_opcode::IBV_WR_ATOMIC_CMP_AND_SWP,
                8,
                REMOTE.addr
            )
        );
        let done = drain(&mut qp, 1);
        assert_eq!(
            (
                done[0].context,
                done[0].status,
                done[0].opcode,
                done[0].byte_len
            ),
            (5, WcStatus::Success, Opcode::Atomic, 8)
        );
        for (region, range, remote) in [
            (HeapRegion::new(16), 0..16, REMOTE),
            (
                HeapRegion::new(8),
                0..8,
                RemoteRegion {
                    addr: REMOTE.addr + 4,
                    ..REMOTE
                },
            ),
            (HeapRegion::new(8), 0..8, RemoteRegion { len: 4, ..REMOTE }),
        ] {
            match qp.post_send(SendOp::FetchAdd(remote, 1), region, range.clone(), 6) {
                Err((Error::AtomicLayout { .. }, back)) => assert_eq!(back.len(), range.len()),
                other => panic!("{range:?} to {remote:?}: {:?}", other.err().map(|e| e.0)),
            }
        }
        assert_eq!(qp.with_sink(|s| s.take_log().len()), 0, "nothing posted");
    }

    #[test]
    fn a_refused_post_comes_back_as_a_failed_completion() {
        let mut qp = scheduled(NullSink::new(1, 16), bulk0()).unwrap();
        qp.with_sink(|s| s.set_fail(true));
        post(&mut qp, SendOp::Write(REMOTE), tagged(7), 64, 7);
        let done = drain(&mut qp, 1);
        assert_eq!(done.len(), 1);
        let c = &done[0];
        assert_eq!(
            (c.context, c.status, c.opcode),
            (7, WcStatus::LocalQpOperation, Opcode::Unknown)
        );
        assert_eq!(tag(&c.region), 7, "its region back");
        assert_eq!(qp.queued(), 0);

        // A chunked request whose second piece is refused: one failed
        // completion, the rest of its pieces dropped.
        qp.with_sink(|s| s.set_fail(false));
        let config = ScheduleConfig {
            chunk_bytes: 1024,
            max_pieces_in_flight: 1,
            ..bulk0()
        };
        let mut qp = scheduled(NullSink::new(1, 16).recording(), config).unwrap();
        if let Err((e, _)) = qp.post_send(SendOp::Write(REMOTE), HeapRegion::new(4096), 0..4096, 3)
        {
            panic!("refused: {e}");
        }
        assert_eq!(
            qp.with_sink(|s| s.take_log().len()),
            1,
            "one piece at a time"
        );
        qp.with_sink(|s| s.set_fail(true));
        let done = drain(&mut qp, 1);
        assert_eq!(done.len(), 1);
        assert_eq!(
            (done[0].context, done[0].status, done[0].region.len()),
            (3, WcStatus::LocalQpOperation, 4096)
        );
        assert_eq!(qp.queued(), 0);
        qp.with_sink(|s| s.set_fail(false));
        post(&mut qp, SendOp::Write(REMOTE), tagged(4), 64, 4);
        let done = drain(&mut qp, 1);
        assert_eq!((done[0].context, done[0].status), (4, WcStatus::Success));
    }

    #[test]
    fn a_refused_piece_stops_the_rest_of_its_request_and_its_immediate() {
        let config = ScheduleConfig {
            chunk_bytes: 1024,
            max_pieces_in_flight: 4,
            ..bulk0()
        };
        let shared = shared_1k();
        let solo = scheduled(NullSink::new(1, 16).recording(), config.clone()).unwrap();
        let attached = shared
            .attach(NullSink::new(2, 16).recording(), config)
            .unwrap();
        for (way, mut qp) in [("solo", solo), ("shared", attached)] {
            // Four pieces decided at once; the second is refused.
            qp.with_sink(|s| s.refuse_after(1));
            post(
                &mut qp,
                SendOp::WriteWithImm(REMOTE, 42),
                HeapRegion::new(4096),
                4096,
                9,
            );
            let done = drain(&mut qp, 1);
            let posted = qp.with_sink(|s| s.take_log());
            // The first piece went unsignaled in a list the refusal cut:
            // a zero-length WRITE that asks for its completion reports it.
            let nop = posted.iter().position(|p| p.wr_id == crate::qp::NOP_WR);
            assert_eq!(nop, Some(1), "{way}: {posted:?}");
            assert!(!posted[0].signaled && posted[1].signaled && posted[1].length == 0);
            let posted: Vec<_> = posted.into_iter().filter(|p| p.length > 0).collect();
            assert_eq!(
                posted.iter().map(|p| p.remote_addr).collect::<Vec<_>>(),
                [REMOTE.addr],
                "{way}: nothing after the refused piece reaches the peer"
            );
            assert!(
                posted.iter().all(|p| p.imm.is_none()),
                "{way}: the peer is not told the request arrived whole"
            );
            assert_eq!(done.len(), 1, "{way}: one completion");
            assert_eq!(
                (done[0].context, done[0].status, done[0].region.len()),
                (9, WcStatus::LocalQpOperation, 4096),
                "{way}: the request fails with its refusal, its region back"
            );
            // The queue pair goes on: the next request is sent whole.
            post(
                &mut qp,
                SendOp::WriteWithImm(REMOTE, 43),
                HeapRegion::new(4096),
                4096,
                10,
            );
            let done = drain(&mut qp, 1);
            assert_eq!(
                (done[0].context, done[0].status),
                (10, WcStatus::Success),
                "{way}"
            );
            let posted = qp.with_sink(|s| s.take_log());
            assert_eq!(posted.len(), 4, "{way}");
            assert_eq!(posted[3].imm, Some(43), "{way}");
            assert_eq!(qp.queued(), 0, "{way}");
        }
    }

    /// Dropping a queue pair of a shared engine waits for the NIC to flush
    /// it (up to seconds); meanwhile the engine's other queue pairs post
    /// and finish their work. (The drain held the engine's lock: every
    /// other queue pair of the engine stopped until it ended.)
    #[test]
    fn a_queue_pair_being_drained_holds_up_no_other() {
        let shared = shared_1k();
        let config = ScheduleConfig {
            chunk_bytes: 1024,
            max_pieces_in_flight: 1,
            ..bulk0()
        };
        let mut slow = NullSink::new(1, 16);
        let hold = slow.hold_shutdown();
        let mut leaving = shared.attach(slow, config.clone()).unwrap();
        post(
            &mut leaving,
            SendOp::Write(REMOTE),
            HeapRegion::new(8192),
            8192,
            1,
        );
        let other_config = ScheduleConfig {
            tenant: crate::Tenancy::Local {
                id: TenantId(1),
                class: TrafficClass::Bulk,
            },
            ..config
        };
        let mut other = shared.attach(NullSink::new(2, 16), other_config).unwrap();
        let dropper = std::thread::spawn(move || drop(leaving));
        assert!(
            hold.wait_started(Duration::from_secs(10)),
            "the drain began"
        );
        let (tx, rx) = crossbeam_channel::bounded(1);
        let worker = std::thread::spawn(move || {
            post(
                &mut other,
                SendOp::Write(REMOTE),
                HeapRegion::new(4096),
                4096,
                2,
            );
            let done = drain(&mut other, 1);
            let _ = tx.send(done.first().map(|c| (c.context, c.status)));
        });
        let finished = rx.recv_timeout(Duration::from_secs(10));
        hold.release();
        dropper.join().unwrap();
        worker.join().unwrap();
        assert_eq!(
            finished,
            Ok(Some((2, WcStatus::Success))),
            "the other queue pair finished its request during the drain"
        );
    }

    #[test]
    fn queue_pairs_of_eight_tenants_each_get_their_own_requests_back() {
        let shared = NullScheduler::new(SharedConfig {
            chunk_bytes: 1024,
            bulk_bytes_in_flight: 4096,
            ..SharedConfig::default()
        })
        .unwrap();
        let mut qps: Vec<NullScheduled> = (0..8u32)
            .map(|i| {
                let config = ScheduleConfig::local(TenantId(i + 1), TrafficClass::Bulk);
                shared.attach(NullSink::new(i, 16), config).unwrap()
            })
            .collect();
        assert_eq!(shared.queue_pairs(), 8);
        for (q, qp) in qps.iter_mut().enumerate() {
            for i in 0..20u64 {
                let context = q as u64 * 1000 + i;
                let region = HeapRegion::new(3000);
                if let Err((e, _)) = qp.post_send(SendOp::Write(REMOTE), region, 0..3000, context) {
                    panic!("refused: {e}");
                }
            }
        }
        assert!(shared.bulk_bytes_in_flight() <= 4096);
        let mut got: Vec<Vec<u64>> = vec![Vec::new(); 8];
        let mut out = Vec::new();
        for _ in 0..100_000 {
            if got.iter().map(Vec::len).sum::<usize>() == 160 {
                break;
            }
            for (q, qp) in qps.iter_mut().enumerate() {
                qp.poll(&mut out).unwrap();
                assert!(
                    shared.bulk_bytes_in_flight() <= 4096,
                    "the bulk budget holds"
                );
                got[q].extend(out.drain(..).map(|c| {
                    assert_eq!((c.status, c.byte_len), (WcStatus::Success, 3000));
                    c.context
                }));
            }
        }
        for (q, contexts) in got.iter().enumerate() {
            let want: Vec<u64> = (0..20).map(|i| q as u64 * 1000 + i).collect();
            assert_eq!(
                contexts, &want,
                "queue pair {q}: its own, once each, in order"
            );
        }
        assert_eq!(shared.bulk_bytes_in_flight(), 0);
        drop(qps);
        assert_eq!(shared.queue_pairs(), 0);
    }

    #[test]
    fn a_tenant_handle_accounts_every_request() {
        let tenant = mtrdma_core::TenantEntry::new(TenantId(1), "host")
            .with_rate(RateLimit::new(1 << 40, 1 << 30));
        let policy = Policy::new(LinkConfig::new(1 << 40), vec![tenant]);
        let table = QuotaTable::embedded(&policy).unwrap();
        let handle = table.attach(TenantId(1)).unwrap();
        let sink = NullSink::new(1, 16).with_tenant(handle);
        let mut qp = scheduled(sink, ScheduleConfig::default()).unwrap();
        for i in 0..50 {
            post(&mut qp, SendOp::Write(REMOTE), tagged(i), 64, i);
        }
        let done = drain(&mut qp, 50);
        assert_eq!(done.len(), 50);
        assert!(done.iter().all(|c| c.status.is_success()));
    }

    #[test]
    fn a_queue_pair_created_without_a_tenant_is_not_scheduled_as_tenant_0_by_accident() {
        // The default schedules a queue pair as the tenant it was created
        // for; without one that is an error, on its own or shared.
        let e = scheduled(NullSink::new(1, 16), ScheduleConfig::default()).unwrap_err();
        assert!(matches!(e, Error::NoTenant), "{e:?}");
        assert!(e.to_string().contains("ScheduleConfig::local"), "{e}");
        let shared = NullScheduler::new(SharedConfig::default()).unwrap();
        let e = shared
            .attach(NullSink::new(2, 16), ScheduleConfig::default())
            .unwrap_err();
        assert!(matches!(e, Error::NoTenant), "{e:?}");
        assert_eq!(shared.queue_pairs(), 0);
        // Chosen explicitly, it is scheduled as the tenant named.
        let qp = scheduled(
            NullSink::new(3, 16),
            ScheduleConfig::local(TenantId(7), TrafficClass::Latency),
        )
        .unwrap();
        assert_eq!(
            (qp.tenant(), qp.class()),
            (TenantId(7), TrafficClass::Latency)
        );
    }

    #[test]
    fn a_window_takes_its_tenants_weight_under_a_scheduler_that_keeps_no_policies() {
        let policy = Policy::new(
            LinkConfig::new(1 << 40),
            vec![mtrdma_core::TenantEntry::new(TenantId(1), "t").with_weight(4)],
        );
        let table = QuotaTable::embedded(&policy).unwrap();
        let sink = NullSink::new(1, 16).with_tenant(table.attach(TenantId(1)).unwrap());
        let config = ScheduleConfig {
            chunk_bytes: 4096,
            window: Some(std::sync::Arc::new(DelayWindowConfig::for_piece(4096))),
            ..ScheduleConfig::default()
        };
        let qp = scheduled_with(sink, config, mtrdma_sched::FifoScheduler::new()).unwrap();
        assert_eq!(qp.window().unwrap().weight, 4);
    }

    /// A policy with a 16 KiB latency bound: tenant 1 bulk (weight 3)
    /// held to it, tenant 2 bulk and exempt by name, tenant 3 latency.
    fn bounded_table() -> QuotaTable {
        let policy = Policy::new(
            LinkConfig::new(1 << 40).with_latency_bound(16 << 10),
            vec![
                mtrdma_core::TenantEntry::new(TenantId(1), "bulk").with_weight(3),
                mtrdma_core::TenantEntry::new(TenantId(2), "backup"),
                mtrdma_core::TenantEntry::new(TenantId(3), "kv").with_class(TrafficClass::Latency),
            ],
        )
        .with_exempt(["backup"]);
        QuotaTable::embedded(&policy).unwrap()
    }

    /// Posts one 256 KiB WRITE on `qp` and returns the lengths of the
    /// pieces its recording sink saw.
    fn pieces_of_one_write<Q: PieceScheduler>(qp: &mut NullScheduled<Q>) -> Vec<u32> {
        let len = 256 << 10;
        if let Err((e, _)) = qp.post_send(SendOp::Write(REMOTE), HeapRegion::new(len), 0..len, 7) {
            panic!("refused: {e}");
        }
        let done = drain(qp, 1);
        assert_eq!(done.len(), 1, "one completion for the whole request");
        let log = qp.with_sink(NullSink::take_log);
        assert_eq!(
            log.iter().map(|p| u64::from(p.length)).sum::<u64>(),
            len as u64
        );
        log.iter().map(|p| p.length).collect()
    }

    /// What a tenant's own code asks for when it wants no protection at
    /// all: no window, 1 MiB pieces, many in flight, and a window weight
    /// of its own for when one is forced on it.
    fn loose() -> ScheduleConfig {
        ScheduleConfig {
            chunk_bytes: 1 << 20,
            max_pieces_in_flight: 64,
            window: Some(std::sync::Arc::new(DelayWindowConfig {
                weight: 1000,
                queue_bytes: 1 << 30,
                ..DelayWindowConfig::for_piece(1 << 20)
            })),
            ..ScheduleConfig::default()
        }
    }

    #[test]
    fn a_tenant_held_to_a_latency_bound_cannot_loosen_it_from_its_own_code() {
        let table = bounded_table();
        let sink = || {
            NullSink::new(1, 64)
                .recording()
                .with_tenant(table.attach(TenantId(1)).unwrap())
        };
        let no_window = ScheduleConfig {
            window: None,
            ..loose()
        };
        let shared = NullScheduler::new(SharedConfig {
            chunk_bytes: 1 << 20,
            ..SharedConfig::default()
        })
        .unwrap();
        // On an engine of its own, with a scheduler that does not chunk at
        // all, on a shared engine that chunks by 1 MiB, and scheduled as a
        // "latency" tenant of the process's own: every way, 4 KiB pieces
        // under a window of the bound's allowance and the tenant's weight.
        let ways: Vec<(&str, NullScheduled)> = vec![
            (
                "default",
                scheduled(sink(), ScheduleConfig::default()).unwrap(),
            ),
            ("no window", scheduled(sink(), no_window.clone()).unwrap()),
            ("loose window", scheduled(sink(), loose()).unwrap()),
            ("shared", shared.attach(sink(), no_window.clone()).unwrap()),
            (
                "local latency",
                scheduled(
                    sink(),
                    ScheduleConfig {
                        tenant: crate::Tenancy::Local {
                            id: TenantId(9),
                            class: TrafficClass::Latency,
                        },
                        ..no_window.clone()
                    },
                )
                .unwrap(),
            ),
        ];
        for (way, mut qp) in ways {
            assert_eq!(qp.class(), TrafficClass::Bulk, "{way}");
            let w = qp.window().unwrap_or_else(|| panic!("{way}: no window"));
            assert_eq!((w.queue_bytes, w.piece_bytes), (10 << 10, 4096), "{way}");
            if way != "local latency" {
                assert_eq!(w.weight, 3, "{way}: the tenant's weight, not its code's");
            }
            let pieces = pieces_of_one_write(&mut qp);
            assert!(pieces.iter().all(|&l| l <= 4096), "{way}: {pieces:?}");
            assert_eq!(pieces.len(), 64, "{way}");
        }
        let mut qp = scheduled_with(sink(), no_window, mtrdma_sched::FifoScheduler::new()).unwrap();
        assert_eq!(qp.window().unwrap().piece_bytes, 4096, "own scheduler");
        let pieces = pieces_of_one_write(&mut qp);
        assert!(
            pieces.iter().all(|&l| l <= 4096),
            "own scheduler: {pieces:?}"
        );
        // Tighter settings of its own are kept.
        let tight = ScheduleConfig {
            chunk_bytes: 2048,
            window: Some(std::sync::Arc::new(DelayWindowConfig {
                queue_bytes: 4096,
                ..DelayWindowConfig::for_piece(2048)
            })),
            ..ScheduleConfig::default()
        };
        let mut qp = scheduled(sink(), tight).unwrap();
        let w = qp.window().unwrap();
        assert_eq!((w.queue_bytes, w.piece_bytes), (4096, 2048));
        assert!(pieces_of_one_write(&mut qp).iter().all(|&l| l <= 2048));
    }

    /// A window of a test's own: a fixed budget that counts the windows
    /// built and keeps the last signals it was given.
    #[derive(Debug, Default)]
    struct Recorder {
        built: std::sync::atomic::AtomicU32,
        signals: std::sync::Arc<std::sync::Mutex<Vec<mtrdma_sched::Signals>>>,
    }

    #[derive(Debug)]
    struct Recorded {
        budget: mtrdma_sched::FixedWindow,
        signals: std::sync::Arc<std::sync::Mutex<Vec<mtrdma_sched::Signals>>>,
    }

    impl mtrdma_sched::Window for Recorded {
        fn admit(
            &self,
            in_flight: u64,
            bytes: u64,
            now: mtrdma_sched::Nanos,
        ) -> mtrdma_sched::Admit {
            self.budget.admit(in_flight, bytes, now)
        }
        fn on_sent(&mut self, _: u64, _: mtrdma_sched::Nanos) {}
        fn on_completed(&mut self, _: u64, _: mtrdma_sched::Nanos, _: mtrdma_sched::Nanos) {}
        fn window(&self) -> u64 {
            self.budget.window()
        }
        fn signals(&mut self, s: &mtrdma_sched::Signals) {
            self.signals.lock().unwrap().push(*s);
        }
    }

    impl mtrdma_sched::WindowFactory for Recorder {
        fn build(
            &self,
            _seed: u64,
            _weight: u32,
        ) -> Result<Box<dyn mtrdma_sched::Window>, mtrdma_sched::ConfigError> {
            self.built
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            Ok(Box::new(Recorded {
                budget: mtrdma_sched::FixedWindow::new(8192),
                signals: std::sync::Arc::clone(&self.signals),
            }))
        }
    }

    #[test]
    fn a_window_of_ones_own_bounds_the_queue_pair_and_hears_the_coordinator() {
        let policy = Policy::new(
            LinkConfig::new(1 << 40),
            vec![mtrdma_core::TenantEntry::new(TenantId(1), "t").with_weight(2)],
        );
        let table = QuotaTable::embedded(&policy).unwrap();
        let recorder = std::sync::Arc::new(Recorder::default());
        let config = ScheduleConfig {
            chunk_bytes: 4096,
            max_pieces_in_flight: 16,
            window: Some(recorder.clone()),
            ..ScheduleConfig::default()
        };
        let sink = NullSink::new(1, 64)
            .recording()
            .with_tenant(table.attach(TenantId(1)).unwrap());
        let mut qp = scheduled(sink, config).unwrap();
        assert_eq!(recorder.built.load(std::sync::atomic::Ordering::Relaxed), 1);
        assert_eq!(qp.window().unwrap().window_bytes, 8192);
        // At most two 4 KiB pieces out at once: the sink saw them posted
        // in pairs, never more than two before a poll took one back.
        let len = 64 << 10;
        let region = HeapRegion::new(len);
        if let Err((e, _)) = qp.post_send(SendOp::Write(REMOTE), region, 0..len, 1) {
            panic!("refused: {e}");
        }
        let mut most = 0;
        let mut done = Vec::new();
        while done.is_empty() {
            most = most.max(qp.window().unwrap().in_flight_bytes);
            qp.poll(&mut done).unwrap();
        }
        assert!(most <= 8192 && most > 0, "{most}");
        // Every completion told it the coordinator's signals (none
        // published here: no link rate, the neutral gain and sharing).
        let heard = recorder.signals.lock().unwrap().clone();
        assert_eq!(heard.len(), 16, "one per piece");
        assert!(heard.iter().all(|s| s.link_rate == Some(0)
            && s.gain_ppm == Some(mtrdma_sched::share::GAIN_ONE)
            && s.weight.is_none()));
    }

    #[test]
    fn a_latency_bound_replaces_a_window_of_the_tenants_own() {
        let table = bounded_table();
        let recorder = std::sync::Arc::new(Recorder::default());
        let config = ScheduleConfig {
            window: Some(recorder.clone()),
            ..ScheduleConfig::default()
        };
        let sink = NullSink::new(1, 64)
            .recording()
            .with_tenant(table.attach(TenantId(1)).unwrap());
        let qp = scheduled(sink, config).unwrap();
        assert_eq!(recorder.built.load(std::sync::atomic::Ordering::Relaxed), 0);
        let w = qp.window().unwrap();
        assert_eq!(
            (w.queue_bytes, w.piece_bytes, w.weight),
            (10 << 10, 4096, 3)
        );
    }

    #[test]
    fn the_exempt_and_the_latency_class_keep_their_own_settings_under_a_bound() {
        let table = bounded_table();
        for tenant in [TenantId(2), TenantId(3)] {
            let sink = NullSink::new(1, 64)
                .recording()
                .with_tenant(table.attach(tenant).unwrap());
            let mut qp = scheduled(sink, ScheduleConfig::default()).unwrap();
            assert!(qp.window().is_none(), "{tenant}");
            let pieces = pieces_of_one_write(&mut qp);
            assert_eq!(pieces, [64 << 10; 4], "{tenant}");
        }
    }

    #[test]
    fn a_policy_reload_reaches_a_running_queue_pair() {
        let policy = |weight| {
            Policy::new(
                LinkConfig::new(1 << 40),
                vec![mtrdma_core::TenantEntry::new(TenantId(1), "t").with_weight(weight)],
            )
        };
        let table = QuotaTable::embedded(&policy(1)).unwrap();
        let sink = NullSink::new(1, 16).with_tenant(table.attach(TenantId(1)).unwrap());
        let config = ScheduleConfig {
            chunk_bytes: 4096,
            window: Some(std::sync::Arc::new(DelayWindowConfig::for_piece(4096))),
            ..ScheduleConfig::default()
        };
        let mut qp = scheduled(sink, config).unwrap();
        assert_eq!(qp.window().unwrap().weight, 1);
        post(&mut qp, SendOp::Write(REMOTE), tagged(0), 64, 0);
        drain(&mut qp, 1);
        // The coordinator (here the table's creator) publishes weight 4:
        // the next request runs under it.
        table.publish(&policy(4)).unwrap();
        post(&mut qp, SendOp::Write(REMOTE), tagged(1), 64, 1);
        drain(&mut qp, 1);
        assert_eq!(qp.window().unwrap().weight, 4);
    }

    #[test]
    fn dropping_a_scheduled_queue_pair_with_work_queued_frees_it() {
        let mut qp = scheduled(NullSink::new(1, 4), bulk0()).unwrap();
        for i in 0..10 {
            post(&mut qp, SendOp::Write(REMOTE), tagged(i), 64, i);
        }
        drop(qp);
    }

    #[test]
    fn a_cap_set_on_the_shared_scheduler_holds_back_requests_sent_one_at_a_time() {
        // 64 KiB/s: the first 64 KiB request goes at once, the second not
        // for a second, though nothing is queued ahead of it when it is
        // posted.
        let shared = NullScheduler::new(SharedConfig::default()).unwrap();
        let cap = RateLimit::per_second(64 << 10);
        shared
            .set_policy(TenantId(5), TenantPolicy::weight(1).with_byte_cap(cap))
            .unwrap();
        let config = ScheduleConfig::local(TenantId(5), TrafficClass::Bulk);
        let mut qp = shared.attach(NullSink::new(1, 16), config).unwrap();
        let remote = RemoteRegion {
            len: 64 << 10,
            ..REMOTE
        };
        post(
            &mut qp,
            SendOp::Write(remote),
            HeapRegion::new(64 << 10),
            64 << 10,
            1,
        );
        assert_eq!(drain(&mut qp, 1).len(), 1, "within the burst");
        post(
            &mut qp,
            SendOp::Write(remote),
            HeapRegion::new(64 << 10),
            64 << 10,
            2,
        );
        assert_eq!(
            qp.with_sink(|s| s.sends_in_flight()),
            0,
            "over the cap: held back, not posted"
        );
        assert_eq!(qp.queued(), 1);
        drop(qp);
    }

    /// A long request paced by its tenant's cap whose second piece fails
    /// reports at once, not after the cap has paced out the rest (8 s
    /// here: 62 more pieces of 1 KiB at 8 KiB/s).
    #[test]
    fn a_paced_request_that_fails_reports_at_once() {
        let shared = shared_1k();
        let cap = RateLimit::new(8 << 10, 1024);
        shared
            .set_policy(TenantId(5), TenantPolicy::weight(1).with_byte_cap(cap))
            .unwrap();
        let config = ScheduleConfig {
            chunk_bytes: 1024,
            max_pieces_in_flight: 1,
            ..ScheduleConfig::local(TenantId(5), TrafficClass::Bulk)
        };
        let mut qp = shared.attach(NullSink::new(1, 16), config).unwrap();
        qp.with_sink(|s| s.refuse_after(1));
        let started = std::time::Instant::now();
        post(
            &mut qp,
            SendOp::Write(REMOTE),
            HeapRegion::new(64 << 10),
            64 << 10,
            7,
        );
        let mut out = Vec::new();
        while out.is_empty() && started.elapsed() < Duration::from_secs(20) {
            qp.poll(&mut out).unwrap();
            std::thread::sleep(Duration::from_millis(1));
        }
        let took = started.elapsed();
        assert_eq!(out.len(), 1);
        assert_eq!(
            (out[0].context, out[0].status),
            (7, WcStatus::LocalQpOperation)
        );
        assert!(
            took < Duration::from_secs(2),
            "reported after {took:?}, the rest paced out first"
        );
        assert_eq!(qp.queued(), 0);
    }

    #[test]
    fn parked_and_chunked_requests_complete_in_the_order_posted() {
        // Small requests go parked (as the direct path posts them) when
        // nothing is ahead; a chunked one goes piece by piece through the
        // engine. Interleaved, they must still complete in order, each
        // with its own length and region.
        let config = ScheduleConfig {
            chunk_bytes: 1024,
            max_pieces_in_flight: 4,
            ..bulk0()
        };
        let mut qp = scheduled(NullSink::new(1, 16), config).unwrap();
        let mut want = Vec::new();
        let mut out = Vec::new();
        for i in 0..60u64 {
            let len = if i % 3 == 1 { 2048 } else { 64 };
            let mut region = HeapRegion::new(len);
            region.as_mut_slice()[..8].copy_from_slice(&i.to_le_bytes());
            let remote = RemoteRegion {
                len: 1 << 20,
                ..REMOTE
            };
            if let Err((e, _)) = qp.post_send(SendOp::Write(remote), region, 0..len, i) {
                panic!("refused: {e}");
            }
            want.push((i, len));
            if i % 4 == 3 {
                qp.poll(&mut out).unwrap();
            }
        }
        out.extend(drain(&mut qp, 60 - out.len()));
        let got: Vec<(u64, usize)> = out
            .iter()
            .map(|c| (c.context, c.byte_len as usize))
            .collect();
        assert_eq!(got, want, "in order, each with its length");
        assert!(out
            .iter()
            .all(|c| tag(&c.region) == c.context && c.status.is_success()));
        assert_eq!(qp.queued(), 0);
        assert_eq!(qp.with_sink(|s| s.sends_in_flight()), 0);
    }
}
