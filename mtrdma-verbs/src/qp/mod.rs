//! Reliable-connected queue pairs: creation, connection, posting, polling
//! and safe teardown.
//!
//! Along its seams: `builder` (settings, creation and connection), `cq`
//! (the completion queue), `books` (the work requests in flight and the
//! buffers they own), `sink` (where send-side work requests go: the
//! device, or the null sink of benches and tests), and here the queue
//! pair itself and what posting takes (endpoints, operations, errors).

use std::fmt;
use std::io;
use std::mem::MaybeUninit;
use std::ops::Range;
use std::ptr::NonNull;
use std::time::{Duration, Instant};

use ibverbs_sys as ffi;
use mtrdma_core::table::OwnedQpPermit;
use mtrdma_core::TenantHandle;

use crate::completion::{Completion, Opcode, WcStatus};
use crate::events::{Armed, CompChannel};
use crate::mr::{Access, RemoteRegion};
use crate::slab::Slab;
use crate::{
    Error, GidEntry, GidSelection, MemoryRegion, PortInfo, ProtectionDomain, SharedReceiveQueue,
};

mod batch;
mod books;
mod builder;
mod cq;
mod refusal;
mod shared_cq;
mod sink;
mod wc;
mod window;
mod wr;

pub(crate) use batch::{batch_of, Batch, List, Refusal};
pub use batch::{BatchError, PostBatch};
pub(crate) use books::*;
pub use builder::*;
pub(crate) use cq::*;
use refusal::refusal_error;
pub(crate) use refusal::unsupported_op;
pub use shared_cq::*;
pub(crate) use sink::*;
pub(crate) use wc::RawWc;
pub(crate) use wr::*;

/// What a peer needs to connect to a queue pair. Serialisable, to send it
/// over any channel (see [`crate::exchange`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Endpoint {
    /// Queue pair number.
    pub qpn: u32,
    /// First packet sequence number.
    pub psn: u32,
    /// The GID the queue pair is addressed by.
    pub gid: [u8; 16],
    /// The port's LID (InfiniBand; 0 on RoCE).
    pub lid: u16,
    /// The port's active MTU in bytes.
    pub mtu: u32,
}

/// One send-side operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendOp {
    /// SEND: consumes a receive the peer posted.
    Send,
    /// SEND with 32 bits of immediate data.
    SendWithImm(u32),
    /// RDMA WRITE into `remote`, which must be at least as long as the local range.
    Write(RemoteRegion),
    /// RDMA WRITE that also consumes a peer receive and delivers `imm`.
    WriteWithImm(RemoteRegion, u32),
    /// RDMA READ from `remote` into the local range.
    Read(RemoteRegion),
    /// Atomic fetch-and-add: adds the value to the 8-byte word at the
    /// start of `remote` (8-byte aligned) and returns the word it held in
    /// the local range (exactly 8 bytes). The peer's region and queue pair
    /// must grant remote atomics ([`Access::REMOTE_ALL`](crate::Access::REMOTE_ALL)).
    FetchAdd(RemoteRegion, u64),
    /// Atomic compare-and-swap: if the 8-byte word at the start of
    /// `remote` equals `compare`, writes `swap` there; either way returns
    /// the word it held in the local range (exactly 8 bytes).
    CompareSwap {
        /// The word written to.
        remote: RemoteRegion,
        /// The value it must hold.
        compare: u64,
        /// The value written if it does.
        swap: u64,
    },
}

/// The bytes of an atomic operation's word.
pub const ATOMIC_BYTES: u32 = 8;

impl SendOp {
    /// The verbs opcode, remote region and immediate of this operation, or
    /// of one of its pieces (`last`: only the last piece of a WRITE with
    /// immediate carries the immediate; RC delivers pieces in order, so
    /// the peer sees it after all the data).
    pub(crate) fn lower(
        self,
        last: bool,
    ) -> (ffi::ibv_wr_opcode::Type, Option<RemoteRegion>, Option<u32>) {
        use ffi::ibv_wr_opcode as o;
        match self {
            SendOp::Send => (o::IBV_WR_SEND, None, None),
            SendOp::SendWithImm(imm) => (o::IBV_WR_SEND_WITH_IMM, None, Some(imm)),
            SendOp::Write(r) => (o::IBV_WR_RDMA_WRITE, Some(r), None),
            SendOp::WriteWithImm(r, imm) if last => {
                (o::IBV_WR_RDMA_WRITE_WITH_IMM, Some(r), Some(imm))
            }
            SendOp::WriteWithImm(r, _) => (o::IBV_WR_RDMA_WRITE, Some(r), None),
            SendOp::Read(r) => (o::IBV_WR_RDMA_READ, Some(r), None),
            SendOp::FetchAdd(r, _) => (o::IBV_WR_ATOMIC_FETCH_AND_ADD, Some(r), None),
            SendOp::CompareSwap { remote, .. } => {
                (o::IBV_WR_ATOMIC_CMP_AND_SWP, Some(remote), None)
            }
        }
    }

    /// An atomic operation's operands (compare or add, swap).
    #[inline]
    pub(crate) fn atomic(self) -> Option<(u64, u64)> {
        match self {
            SendOp::FetchAdd(_, add) => Some((add, 0)),
            SendOp::CompareSwap { compare, swap, .. } => Some((compare, swap)),
            _ => None,
        }
    }

    /// Its kind as the scheduler sees it (whether it may be split).
    #[inline]
    pub(crate) fn kind(self) -> mtrdma_sched::Opcode {
        match self {
            SendOp::Send | SendOp::SendWithImm(_) => mtrdma_sched::Opcode::Send,
            SendOp::Write(_) | SendOp::WriteWithImm(..) => mtrdma_sched::Opcode::Write,
            SendOp::Read(_) => mtrdma_sched::Opcode::Read,
            SendOp::FetchAdd(..) | SendOp::CompareSwap { .. } => mtrdma_sched::Opcode::Atomic,
        }
    }

    /// The completion opcode a whole operation reports.
    pub(crate) fn completion_opcode(self) -> Opcode {
        match self {
            SendOp::Send | SendOp::SendWithImm(_) => Opcode::Send,
            SendOp::Write(_) | SendOp::WriteWithImm(..) => Opcode::Write,
            SendOp::Read(_) => Opcode::Read,
            SendOp::FetchAdd(..) | SendOp::CompareSwap { .. } => Opcode::Atomic,
        }
    }
}

/// Checks a send-side request before anything is posted: the local range
/// lies in the region, and a WRITE or READ fits the remote region.
pub(crate) fn check_send<R: Region>(
    op: SendOp,
    region: &R,
    range: &Range<usize>,
) -> Result<ffi::ibv_sge, Error> {
    let Some(sge) = region.sge(range) else {
        return Err(Error::LocalRangeOutOfBounds {
            range: range.clone(),
            len: region.len(),
        });
    };
    let (_, Some(r), _) = op.lower(true) else {
        return Ok(sge);
    };
    if op.atomic().is_some() {
        // One aligned word at the start of the remote range, its old value
        // into exactly 8 local bytes.
        if sge.length != ATOMIC_BYTES || r.len < u64::from(ATOMIC_BYTES) || r.addr % 8 != 0 {
            return Err(Error::AtomicLayout {
                local_len: sge.length,
                remote: r,
            });
        }
    } else {
        let len = u64::from(sge.length);
        // A peer names the remote region: its end must lie in the address
        // space too, so that no piece's address overflows.
        if len > r.len || r.addr.checked_add(r.len).is_none() {
            return Err(Error::RemoteOutOfBounds { remote: r, len });
        }
    }
    Ok(sge)
}

/// The scatter list of a gather request, as [`check_gather`] found it:
/// the entries of its non-empty ranges, in order, and their bytes.
pub(crate) struct Gather {
    pub(crate) sges: Vec<ffi::ibv_sge>,
    pub(crate) len: u32,
}

impl Gather {
    /// The scatter entry its work request carries itself (all zero if
    /// it has none); with several, `extra` is pointed at the whole list,
    /// `sges`, which the request is built from ([`send_wr`]) and which
    /// must stay where it is until the request is handed to the device.
    pub(crate) fn first_entry(&self, extra: &mut Extra) -> ffi::ibv_sge {
        match self.sges.as_slice() {
            [] => ffi::ibv_sge::default(),
            [one] => *one,
            [first, ..] => {
                extra.sg_list = self.sges.as_ptr() as usize;
                extra.num_sge = i32::try_from(self.sges.len()).unwrap_or(i32::MAX);
                *first
            }
        }
    }
}

/// Checks a gather request before anything is posted: it names at least
/// one region and at most `max_sge` (1 for region kinds that do not
/// gather, [`Region::GATHERS`]), every range lies in its region, the
/// bytes fit one work request, and a WRITE or READ fits the remote region;
/// an atomic operation takes one region, checked as [`check_send`] checks
/// it. Empty ranges name no scatter entry (their regions are still the
/// request's).
pub(crate) fn check_gather<R: Region>(
    op: SendOp,
    parts: &[(R, Range<usize>)],
    max_sge: u32,
) -> Result<Gather, Error> {
    let max = if R::GATHERS { max_sge } else { 1 };
    match parts {
        [] => return Err(Error::EmptyGather),
        _ if parts.len() > max as usize => {
            return Err(Error::TooManyParts {
                parts: parts.len(),
                max,
            })
        }
        [(region, range)] if op.atomic().is_some() => {
            let sge = check_send(op, region, range)?;
            return Ok(Gather {
                sges: vec![sge],
                len: sge.length,
            });
        }
        _ if op.atomic().is_some() => {
            return Err(Error::AtomicGather { parts: parts.len() });
        }
        _ => {}
    }
    let mut sges = Vec::with_capacity(parts.len());
    let mut len = 0u64;
    for (region, range) in parts {
        let Some(sge) = region.sge(range) else {
            return Err(Error::LocalRangeOutOfBounds {
                range: range.clone(),
                len: region.len(),
            });
        };
        len += u64::from(sge.length);
        if sge.length > 0 {
            sges.push(sge);
        }
    }
    let Ok(total) = u32::try_from(len) else {
        return Err(Error::GatherTooLong { len });
    };
    if let (_, Some(r), _) = op.lower(true) {
        if len > r.len || r.addr.checked_add(r.len).is_none() {
            return Err(Error::RemoteOutOfBounds { remote: r, len });
        }
    }
    Ok(Gather { sges, len: total })
}

/// Writes a refusal: a public error type holding why a request was
/// refused and what it named, handed back untouched (`$field`), with its
/// constructor from the sink's `(Error, $field)` and its `Display` and
/// `Error` impls (both those of the error).
macro_rules! refusal {
    ($(#[$attr:meta])* $name:ident { $(#[$field_attr:meta])* $field:ident: $ty:ty }) => {
        $(#[$attr])*
        #[derive(Debug)]
        pub struct $name {
            /// Why it was refused.
            pub error: Box<Error>,
            $(#[$field_attr])*
            pub $field: $ty,
        }

        impl $name {
            #[doc = concat!("A refusal of `", stringify!($field), "` for `error`.")]
            pub(crate) fn new((error, $field): (Error, $ty)) -> $name {
                $name {
                    error: Box::new(error),
                    $field,
                }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.error.fmt(f)
            }
        }

        impl std::error::Error for $name {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.error)
            }
        }
    };
}

refusal! {
    /// A refused gather request ([`QueuePair::post_send_gather`]): the error,
    /// and every region handed back untouched, in the order given, each with
    /// its range.
    GatherError {
        /// The regions and ranges, as given.
        parts: Vec<(MemoryRegion, Range<usize>)>
    }
}

refusal! {
    /// A refused post: the error, and the region handed back.
    PostError {
        /// The region, untouched.
        region: MemoryRegion
    }
}

/// A connected reliable queue pair.
///
/// Posting moves the region into the queue pair; [`poll`](crate::PollCompletions::poll)
/// returns it in the completion. Dropping the queue pair with work in flight
/// moves it to the error state, waits for every request to be flushed (or,
/// what the device never flushes, for the queue pair to be destroyed), and
/// only then frees the regions, so the NIC never touches freed memory.
pub struct QueuePair {
    qp: NonNull<ffi::ibv_qp>,
    cq: Cq,
    pd: ProtectionDomain,
    books: Books<MemoryRegion>,
    port: u8,
    gid_index: u32,
    /// Sends up to this many bytes go inline.
    max_inline: u32,
    destroyed: bool,
    _permit: Option<OwnedQpPermit>,
    /// The shared receive queue it receives from, if any; dropped after
    /// the queue pair is destroyed.
    srq: Option<SharedReceiveQueue>,
    /// The pieces it lent to the peer, and their memory windows (made at
    /// the first loan).
    windows: Option<Box<window::Windows>>,
}

// SAFETY: the queue pair owns its verbs objects and in-flight regions;
// moving it to another thread moves all of it. It is not Sync: posting and
// polling take `&mut self`.
unsafe impl Send for QueuePair {}

impl fmt::Debug for QueuePair {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut f = f.debug_struct("QueuePair");
        self.books.debug_in_flight(f.field("qpn", &self.qpn()))
    }
}

/// The inherent methods of both device queue pairs ([`QueuePair`],
/// [`UdQueuePair`](crate::UdQueuePair)) on their `qp` and `books`: the
/// queue pair number, the requests in flight, the state changes, and the
/// errors of its device's verbs calls.
macro_rules! queue_pair_basics {
    () => {
        /// The queue pair number.
        pub fn qpn(&self) -> u32 {
            // SAFETY: `qp` is live while `self` is.
            unsafe { self.qp.as_ref().qp_num }
        }

        /// Work requests posted and not yet polled (send, receive).
        pub fn in_flight(&self) -> (u32, u32) {
            (self.books.sends_in_flight, self.books.recvs_in_flight)
        }

        pub(crate) fn modify(
            &self,
            attr: &mut ffi::ibv_qp_attr,
            mask: ffi::ibv_qp_attr_mask,
            to: &'static str,
            attrs: &'static str,
        ) -> Result<(), Error> {
            modify_qp(self.qp, attr, mask, to, attrs)
        }

        /// A failed verbs call on this queue pair's device.
        fn verbs_error(&self, (call, source): (&'static str, io::Error)) -> Error {
            Error::Verbs {
                call,
                device: self.pd.context().name().to_string(),
                source,
            }
        }

        /// Moves the queue pair to the error state: every outstanding request
        /// completes with [`WcStatus::Flushed`](crate::WcStatus::Flushed) (or its real error).
        pub fn set_error(&self) -> Result<(), Error> {
            let mut attr = ffi::ibv_qp_attr {
                qp_state: ffi::ibv_qp_state::IBV_QPS_ERR,
                ..Default::default()
            };
            self.modify(
                &mut attr,
                ffi::ibv_qp_attr_mask::IBV_QP_STATE,
                "ERR",
                "state",
            )
        }
    };
}
pub(crate) use queue_pair_basics;

impl QueuePair {
    queue_pair_basics!();

    crate::macros::posting_fn! {
        /// Posts a send-side operation on `range` of `region`. The region is
        /// the queue pair's until its completion is polled; on refusal it comes
        /// back in the [`PostError`].
        pub fn post_send(&mut self, op: SendOp) posts (region, range, context) {
            self.post_parked(op, region, range, context)
                .map_err(PostError::new)
        }
    }

    crate::macros::posting_fn! {
        /// Posts one send-side operation on several regions (a gather list):
        /// the ranges of `parts`, in order, go out as one message, as if they
        /// were one contiguous range, in one work request whose scatter list
        /// names each of them. A SEND sends their concatenation, a WRITE
        /// writes it to the remote region, a READ fills them in order from it.
        ///
        /// It names at least one region and at most the queue pair's
        /// [`max_send_sge`](Self::max_send_sge) (set with
        /// [`QueuePairBuilder::max_send_sge`]); each range must lie in its
        /// region and the bytes of all of them must fit a WRITE's or READ's
        /// remote region, as for [`post_send`](Self::post_send). An atomic
        /// operation takes exactly one region. Empty ranges are allowed: their
        /// regions take no part in the transfer.
        ///
        /// Every region is the queue pair's until the request's completion is
        /// polled: the [`Completion`] hands them all back, the first in
        /// [`region`](Completion::region) and the others in
        /// [`gathered`](Completion::gathered), in order, whether the request
        /// succeeded, failed or was flushed. On refusal nothing is posted and
        /// every region comes back untouched in the [`GatherError`], in order,
        /// with its range.
        ///
        /// ```no_run
        /// use mtrdma_verbs::{Access, Context, PollCompletions, SendOp};
        ///
        /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
        /// let ctx = Context::open_first_active()?;
        /// let pd = ctx.alloc_pd()?;
        /// let a = pd.queue_pair().max_send_sge(3).build()?;
        /// let b = pd.queue_pair().build()?;
        /// let (ea, eb) = (a.endpoint(), b.endpoint());
        /// let (mut a, _b) = (a.connect(&eb)?, b.connect(&ea)?);
        /// let target = pd.allocate(96, Access::REMOTE_READ_WRITE)?;
        ///
        /// // A header, a body and a trailer, written back to back.
        /// let header = pd.allocate(16, Access::LOCAL)?;
        /// let body = pd.allocate(4096, Access::LOCAL)?;
        /// let trailer = pd.allocate(16, Access::LOCAL)?;
        /// let parts = vec![(header, 0..16), (body, 0..64), (trailer, 0..16)];
        /// a.post_send_gather(SendOp::Write(target.remote().unwrap()), parts, 7)?;
        ///
        /// let mut done = Vec::new();
        /// while done.is_empty() {
        ///     a.poll(&mut done)?;
        /// }
        /// let c = done.pop().unwrap();
        /// assert!(c.status.is_success() && c.byte_len == 96);
        /// let [header, body, trailer]: [_; 3] = c.into_regions().try_into().unwrap();
        /// # let _ = (header, body, trailer);
        /// # Ok(())
        /// # }
        /// ```
        pub fn post_send_gather(&mut self, op: SendOp) posts gather (parts, context) {
            self.post_gather(op, parts, context)
                .map_err(GatherError::new)
        }
    }

    /// The most regions one gather request may name
    /// ([`post_send_gather`](Self::post_send_gather)): the scatter entries
    /// of its send work requests, as built
    /// ([`QueuePairBuilder::max_send_sge`]).
    pub fn max_send_sge(&self) -> u32 {
        self.books.max_send_sge
    }

    crate::macros::posting_fn! {
        /// Posts a receive into `range` of `region`. A queue pair built with
        /// an SRQ has no receive queue of its own and refuses
        /// ([`Error::ReceivesFromSrq`]).
        pub fn post_recv(&mut self) posts (region, range, context) {
            let refuse = |error, region| Err(PostError::new((error, region)));
            let mut sge = match check_recv(&self.books, self.srq.is_some(), &region, range) {
                Ok(sge) => sge,
                Err(error) => return refuse(error, region),
            };
            let slot = self.books.park(Slot::recv(context, region));
            let num_sge = i32::from(sge.length > 0);
            // SAFETY: as for `post_send`: the buffer stays parked until polled.
            let rc = unsafe { post_recv_wr(self.qp, slot as u64, &mut sge, num_sge) };
            if rc != 0 {
                let slot = self.books.unpark(slot).expect("just parked");
                let error = self.verbs_error(("ibv_post_recv", crate::error::errno(rc)));
                return refuse(error, slot.region);
            }
            self.books.recvs_in_flight += 1;
            Ok(())
        }
    }
}

pub(crate) fn libc_enosys() -> i32 {
    38
}

/// Checks a receive into `range` of `region` for a queue pair whose books
/// are `books` (`has_srq`: one that receives from an SRQ, and so refuses
/// it): its range in the region, and room in the receive queue. Returns
/// the range's scatter entry.
pub(crate) fn check_recv<R: Region>(
    books: &Books<R>,
    has_srq: bool,
    region: &MemoryRegion,
    range: Range<usize>,
) -> Result<ffi::ibv_sge, Error> {
    if has_srq {
        return Err(Error::ReceivesFromSrq);
    }
    let Some(sge) = region.sge(&range) else {
        let len = region.len();
        return Err(Error::LocalRangeOutOfBounds { range, len });
    };
    if books.recvs_in_flight >= books.max_recv_wr {
        let depth = books.max_recv_wr;
        return Err(Error::RecvQueueFull { depth });
    }
    Ok(sge)
}

/// `ibv_post_recv` of one receive on `qp`, numbered `wr_id`, into the
/// `num_sge` scatter entries at `sg_list`: 0, or the errno.
///
/// # Safety
/// `qp` must be live; `sg_list` must point at `num_sge` valid entries for
/// the call, and the memory they name must stay valid and untouched by
/// safe code until the receive completes.
pub(crate) unsafe fn post_recv_wr(
    qp: NonNull<ffi::ibv_qp>,
    wr_id: u64,
    sg_list: *mut ffi::ibv_sge,
    num_sge: i32,
) -> i32 {
    let mut wr = ffi::ibv_recv_wr {
        wr_id,
        next: std::ptr::null_mut(),
        sg_list,
        num_sge,
    };
    let mut bad = std::ptr::null_mut();
    // SAFETY: `qp` is live and the scatter list valid (the caller's
    // promise); `wr` outlives the call.
    unsafe {
        let ctx = qp.as_ref().context;
        match (*ctx).ops.post_recv {
            Some(post) => post(qp.as_ptr(), &mut wr, &mut bad),
            None => libc_enosys(),
        }
    }
}

/// `ibv_post_send` of the linked list of work requests at `wr` on `qp`
/// (one call, one doorbell), each first given to `prepare` and numbered
/// in `books`' send ring ([`Books::tag_send`]). On refusal, the requests
/// before the refused one were taken (their number comes with the error,
/// an [`Error::Verbs`] naming `pd`'s device) and the rest are forgotten
/// again.
///
/// # Safety
/// `qp` must be live; every `next` in the list is null or valid; the
/// memory the requests name must stay valid and untouched by safe code
/// until they complete.
#[inline]
pub(crate) unsafe fn post_send_list<R: Region>(
    qp: NonNull<ffi::ibv_qp>,
    wr: &mut ffi::ibv_send_wr,
    books: &mut Books<R>,
    pd: &ProtectionDomain,
    mut prepare: impl FnMut(&mut ffi::ibv_send_wr),
) -> Result<(), (usize, Error)> {
    let first: *mut ffi::ibv_send_wr = wr;
    let mut at = first;
    // SAFETY: the caller's promise: every `next` is null or valid.
    while let Some(this) = unsafe { at.as_mut() } {
        prepare(this);
        let signaled = this.send_flags & ffi::ibv_send_flags::IBV_SEND_SIGNALED.0 != 0;
        this.wr_id = books.tag_send(this.wr_id, this.opcode, signaled);
        at = this.next;
    }
    let mut bad = std::ptr::null_mut();
    // SAFETY: `qp` is live (the caller's promise); the requests and their
    // scatter lists outlive the call (the provider copies them into the
    // send queue).
    let rc = unsafe {
        let ctx = qp.as_ref().context;
        match (*ctx).ops.post_send {
            Some(post) => post(qp.as_ptr(), first, &mut bad),
            None => libc_enosys(),
        }
    };
    if rc == 0 && bad.is_null() {
        return Ok(());
    }
    // The provider points `bad` at the refused request (`ibv_post_send(3)`);
    // those before it were taken. (SoftiWARP's provider can return 0 with
    // `bad` set, when ringing the doorbell for the requests it took
    // overwrote the refusal: that is a refusal too.)
    let mut taken = 0;
    let mut at = first;
    while !bad.is_null() && !at.is_null() && at != bad {
        taken += 1;
        // SAFETY: `at` is one of the list's requests.
        at = unsafe { (*at).next };
    }
    if at.is_null() {
        // `bad` named none of them: count none as taken.
        taken = 0;
        at = first;
    }
    // SAFETY: `at` is null or one of the list's requests.
    let refused = unsafe { at.as_ref() }.map(|wr| (wr.opcode, wr.num_sge));
    // The numbered ones (a group's pieces are not, [`Books::tag_send`])
    // of those not taken are forgotten.
    let mut untaken = 0;
    // SAFETY: `at` is null or one of the list's requests.
    while let Some(this) = unsafe { at.as_ref() } {
        untaken += usize::from(this.wr_id & SENT_WR != 0);
        at = this.next;
    }
    books.untag_sends(untaken);
    Err((taken, refusal_error(pd.context(), rc, refused)))
}

impl Sink for QueuePair {
    sink_books!(queue pair of MemoryRegion);

    fn device(&self) -> Option<&crate::Context> {
        Some(self.pd.context())
    }

    unsafe fn post_wr_list(&mut self, wr: &mut ffi::ibv_send_wr) -> Result<(), (usize, Error)> {
        let max_inline = self.max_inline;
        let inline = |wr: &mut ffi::ibv_send_wr| {
            if wr.num_sge == 1 && wr.opcode != ffi::ibv_wr_opcode::IBV_WR_RDMA_READ {
                // SAFETY: `num_sge` is 1, so `sg_list` points at one valid
                // sge.
                let len = unsafe { (*wr.sg_list).length };
                if len <= max_inline {
                    // Copied into the request now; the region is not read
                    // later.
                    wr.send_flags |= ffi::ibv_send_flags::IBV_SEND_INLINE.0;
                }
            }
        };
        // SAFETY: the QP is live while `self` is; the caller keeps the
        // buffers alive until the completions.
        unsafe { post_send_list(self.qp, wr, &mut self.books, &self.pd, inline) }
    }

    fn poll(
        &mut self,
        out: &mut Vec<Completion>,
        raw: &mut Vec<RawCompletion>,
    ) -> Result<usize, Error> {
        self.cq
            .poll_each(|wc| {
                if let Some(c) = self.srq.as_ref().and_then(|srq| srq.complete_rc(&wc)) {
                    out.push(c);
                    return;
                }
                if let Some(windows) = &mut self.windows {
                    windows.settle(wc.wr_id, wc.status.is_success());
                }
                self.books
                    .complete_device(Wc::from_raw(&wc, None), out, raw);
            })
            .map_err(|source| self.verbs_error(("ibv_poll_cq", source)))
    }

    fn shutdown(&mut self) -> bool {
        if self.destroyed {
            return self.books.outstanding() == 0;
        }
        self.drain_and_destroy("queue pair", QueuePair::set_error, |qp| {
            qp.destroyed = true;
            // Its windows go first: a bound one holds the queue pair.
            if let Some(windows) = &mut qp.windows {
                windows.free();
            }
            // SAFETY: the QP is ours and destroyed once (guarded by
            // `destroyed`), before its CQ.
            unsafe { ffi::ibv_destroy_qp(qp.qp.as_ptr()) }
        })
    }
}

crate::events::waitable_queue_pair!(QueuePair, Completion);

impl QueuePair {
    /// It, as something whose completions can be waited for.
    #[cfg_attr(not(feature = "tokio"), allow(dead_code))]
    pub(crate) fn waitable(&mut self) -> &mut dyn crate::events::Waitable<Item = Completion> {
        self
    }
}

impl QueuePair {
    /// The protection domain it was built on.
    pub fn pd(&self) -> &ProtectionDomain {
        &self.pd
    }
}

impl Drop for QueuePair {
    fn drop(&mut self) {
        Sink::shutdown(self);
        // Its windows were freed before it was destroyed: the pieces lent
        // through them go now.
        if let Some(windows) = &mut self.windows {
            windows.close(self.destroyed);
        }
    }
}
