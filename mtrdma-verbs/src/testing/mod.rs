//! Host stand-ins for the device, to measure and test the data path
//! without an RDMA device. Built only with the `test-util` feature (and
//! in this crate's own tests): for mtrdma's benches, tests and fuzz
//! targets, hidden from the docs, not a stable API, and not compiled into
//! an application's build. The engine's tests on it are in
//! `scheduled/tests/`.
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
use crate::qp::{
    own_region_completion, Batch, Books, RawCompletion, Refusal, Region, SendOp, Sink, Wc,
};
use crate::scheduled::{default_scheduler, solo_parts, Batched, EngineClock, Scheduled, Shared};
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

    own_region_completion!(HostCompletion);
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
    pub(crate) books: Books<HeapRegion>,
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

    crate::macros::posting_fn! {
        /// What [`QueuePair::post_send_gather`](crate::QueuePair::post_send_gather)
        /// does: one work request whose scatter list names the ranges of
        /// `parts` in order, every region parked until its completion is
        /// polled. On refusal, the error and the parts, untouched, in order.
        /// The sink takes as many scatter entries per request as
        /// [`with_max_send_sge`](Self::with_max_send_sge) says (default 1).
        pub fn post_send_gather(&mut self, op: SendOp)
            posts gather (parts, context) for HeapRegion {
            self.post_gather(op, parts, context)
        }
    }

    /// The same sink, taking up to `n` scatter entries per work request
    /// (as a queue pair built with
    /// [`QueuePairBuilder::max_send_sge`](crate::QueuePairBuilder::max_send_sge)).
    pub fn with_max_send_sge(mut self, n: u32) -> NullSink {
        self.books.max_send_sge = n.max(1);
        self
    }

    crate::macros::posting_fn! {
        /// The direct path: what [`QueuePair::post_send`](crate::QueuePair::post_send)
        /// does, the region parked until its completion is polled.
        pub fn post_send(&mut self, op: SendOp)
            posts (region, range, context) for HeapRegion {
            self.post_parked(op, region, range, context)
        }
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
        post_all(Batch::new(self), requests)
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

    /// Refuses `wr` as a provider's `post_send` does, with the errno
    /// `code` (telling the watcher, if any).
    fn refuse(&mut self, wr: &ffi::ibv_send_wr, code: i32) -> Error {
        if self.watch.is_some() {
            self.tell_offered(wr, false);
        }
        Error::Verbs {
            call: "ibv_post_send",
            device: "null".to_string(),
            source: io::Error::from_raw_os_error(code),
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
            return Err(self.refuse(wr, 12));
        }
        if u32::try_from(wr.num_sge).map_or(true, |n| n > self.books.max_send_sge) {
            // A provider refuses a scatter list longer than the queue
            // pair was built for (EINVAL).
            return Err(self.refuse(wr, 22));
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

/// A request of a batch on the host: (operation, region, range, context).
type HostRequest = (SendOp, HeapRegion, Range<usize>, u64);

/// A batch on the host: what [`NullSink::post_batch`] and
/// [`NullScheduled::post_batch`] fill and submit.
trait HostBatch: Sized {
    fn push(&mut self, request: HostRequest) -> Result<(), (Error, HeapRegion)>;
    fn cancel(self) -> Vec<(u64, HeapRegion)>;
    fn submit(self) -> Result<(), Refusal<HeapRegion>>;
}

/// Writes [`HostBatch`] for a batch type whose own methods are named so.
macro_rules! host_batch {
    ($ty:ty $(, $q:ident)?) => {
        impl<$($q: crate::PieceScheduler)?> HostBatch for $ty {
            fn push(&mut self, (op, region, range, context): HostRequest) -> Result<(), (Error, HeapRegion)> {
                <$ty>::push(self, op, region, range, context)
            }

            fn cancel(self) -> Vec<(u64, HeapRegion)> {
                <$ty>::cancel(self)
            }

            fn submit(self) -> Result<(), Refusal<HeapRegion>> {
                <$ty>::submit(self)
            }
        }
    };
}

host_batch!(Batch<'_, NullSink>);
host_batch!(Batched<'_, NullSink, Q>, Q);

/// Adds `requests` (operation, region, range, context) to `batch` in
/// order and submits it. On refusal (of one request, when it is added;
/// or by the device), the error and the requests not posted, as (context,
/// region).
fn post_all(
    mut batch: impl HostBatch,
    requests: impl IntoIterator<Item = HostRequest>,
) -> Result<(), BatchRefused> {
    let mut requests = requests.into_iter();
    while let Some(request) = requests.next() {
        let context = request.3;
        if let Err((error, region)) = batch.push(request) {
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

    crate::qp::sink_books!(quiet);

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

mod scheduled;

pub use scheduled::*;

/// The IPv4 address of `device`'s port 1, to connect to it through
/// rdma_cm in a device test: its IPv4-mapped GID (RoCE), or else the
/// address of the network device it is bound to (iWARP, whose GIDs are
/// built from its MAC address; found with iproute2's `rdma link` and
/// `ip`). `None` if it has neither.
pub fn device_ipv4(device: &str) -> Option<std::net::Ipv4Addr> {
    let port = format!("/sys/class/infiniband/{device}/ports/1");
    let mapped = (0..16)
        .filter_map(|i| std::fs::read_to_string(format!("{port}/gids/{i}")).ok())
        .find_map(|gid| {
            let words: Vec<u16> = gid
                .trim()
                .split(':')
                .map(|w| u16::from_str_radix(w, 16).unwrap_or(0))
                .collect();
            let v4 = words.len() == 8 && words[..5].iter().all(|&w| w == 0) && words[5] == 0xffff;
            v4.then(|| {
                let [a, b] = words[6].to_be_bytes();
                let [c, d] = words[7].to_be_bytes();
                std::net::Ipv4Addr::new(a, b, c, d)
            })
        });
    mapped.or_else(|| {
        let run = |program: &str, args: &[&str]| -> Option<String> {
            let out = std::process::Command::new(program)
                .args(args)
                .output()
                .ok()?;
            Some(String::from_utf8_lossy(&out.stdout).into_owned())
        };
        // "link DEV/1 state ACTIVE ... netdev NAME"
        let link = run("rdma", &["link", "show", &format!("{device}/1")])?;
        let netdev = link
            .split_whitespace()
            .skip_while(|w| *w != "netdev")
            .nth(1)?;
        // "N: NAME    inet A.B.C.D/NN ..."
        let addr = run("ip", &["-o", "-4", "addr", "show", "dev", netdev])?;
        let word = addr
            .split_whitespace()
            .skip_while(|w| *w != "inet")
            .nth(1)?;
        word.split('/').next()?.parse().ok()
    })
}
