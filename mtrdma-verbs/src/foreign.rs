//! Queue pairs someone else created: the scheduled engine in front of an
//! unmodified verbs program (`mtrdma-preload`).
//!
//! A [`ForeignQueuePair`] schedules the sends of a queue pair the program
//! created with libibverbs, on memory it registered itself, with the same
//! engine as [`ScheduledQueuePair`](crate::ScheduledQueuePair): latency
//! class, weighted round robin, caps, the tenant's shared rate limits, the
//! delay window, and WRITEs and READs longer than a piece split into
//! pieces. What the program posted ([`ForeignSend`]) is copied (inline
//! data included, so the program may reuse its buffer as soon as the post
//! returns); the program's memory is its own and must stay registered
//! until the request completes, as with plain verbs.
//!
//! Pieces go to the NIC through the provider's own `post_send` (the
//! function the context held before the shim replaced it), with `wr_id`s
//! that say they are mtrdma's ([`is_piece`]). Whoever polls the program's
//! completion queue hands the completions of pieces to their queue pair
//! ([`ForeignQueuePair::deliver`]) and keeps the rest for the program;
//! [`ForeignQueuePair::poll`] then gives back each finished request once,
//! with the program's `wr_id`, after all its pieces, in the order they
//! were posted.
//!
//! A latency-class request (or, without a delay window, a request of one
//! piece) that finds nothing of its queue pair waiting in the engine, room
//! in the send queue and its tenant's rates willing goes to the NIC at
//! once, as the engine's own fast path sends it, but without its books ([`ForeignQueuePair::post_direct`]): the program's work
//! request is posted as it is, only its `wr_id` marked.
//!
//! The program's own unsignaled requests, sent whole, go unsignaled too
//! (a few in a row at most: a quarter of the pieces the queue pair may
//! have in the device): on RC a later completion reports every request
//! posted before it, so the device writes one completion where the
//! program asked for one, not one per request.

use std::ffi::c_int;
use std::ops::Range;
use std::time::Instant;

use ibverbs_sys as ffi;
use mtrdma_core::TenantHandle;

use crate::completion::WcStatus;
use crate::events::Armed;
use crate::qp::{Books, Extra, Finished, RawCompletion, Region, Sink, UdDest, Wc};
use crate::scheduled::{solo_parts, DefaultScheduler, EngineClock, Scheduled};
use crate::{Error, ScheduleConfig, SendOp};

/// The provider's `post_send` (`struct ibv_context_ops`).
pub type PostSendFn = unsafe extern "C" fn(
    *mut ffi::ibv_qp,
    *mut ffi::ibv_send_wr,
    *mut *mut ffi::ibv_send_wr,
) -> c_int;

/// Bits 32 to 61 of every piece's `wr_id` (the engine's own `wr_id`s
/// leave them clear): what tells a piece's completion from the program's
/// own on a shared completion queue, even for a failed completion, whose
/// opcode the device leaves undefined.
const PIECE_TAG: u64 = 0x2d74_7264 << 32;
const TAG_MASK: u64 = 0x3fff_ffff << 32;

/// Whether a completion's `wr_id` is one of mtrdma's pieces (rather than
/// one of the program's own requests).
#[inline]
pub fn is_piece(wr_id: u64) -> bool {
    wr_id & TAG_MASK == PIECE_TAG
}

/// The engine's own `wr_id`s set one of these bits; a piece with neither
/// is a request posted directly ([`ForeignQueuePair::post_direct`]).
#[cfg(test)]
const ENGINE_BITS: u64 = 0b11 << 62;

/// What [`ForeignQueuePair::post_direct`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direct {
    /// Posted: its completion comes back from [`ForeignQueuePair::poll`].
    Posted,
    /// Not a request for the direct path now (another class, something
    /// of the queue pair waits, no room, a rate limit): give it to
    /// [`ForeignQueuePair::post`].
    Engine,
    /// The provider refused it with this `errno`; nothing was posted.
    Refused(c_int),
}

/// A request posted directly, until its completion.
#[derive(Debug, Clone, Copy)]
struct Sent {
    wr_id: u64,
    signaled: bool,
    opcode: u32,
    len: u32,
}

/// A work request in the device, oldest first: a piece of the engine
/// (its tagged `wr_id`), or a request posted directly.
#[derive(Debug, Clone, Copy)]
struct Posted {
    wr_id: u64,
    direct: Option<Sent>,
}

/// The `ibv_wc_opcode` of a send opcode the engine serves, if it is one.
fn wc_opcode_of(opcode: u32) -> Option<u32> {
    use ffi::ibv_wc_opcode as c;
    use ffi::ibv_wr_opcode as o;
    Some(match opcode {
        o::IBV_WR_RDMA_WRITE | o::IBV_WR_RDMA_WRITE_WITH_IMM => c::IBV_WC_RDMA_WRITE,
        o::IBV_WR_SEND | o::IBV_WR_SEND_WITH_IMM => c::IBV_WC_SEND,
        o::IBV_WR_RDMA_READ => c::IBV_WC_RDMA_READ,
        o::IBV_WR_ATOMIC_FETCH_AND_ADD => c::IBV_WC_FETCH_ADD,
        o::IBV_WR_ATOMIC_CMP_AND_SWP => c::IBV_WC_COMP_SWAP,
        _ => return None,
    })
}

/// Where a foreign request's local bytes are.
#[derive(Debug, Clone)]
pub enum Local {
    /// None: a request of no bytes.
    Empty,
    /// One scatter entry of the program's registered memory.
    Sge(ffi::ibv_sge),
    /// Several entries; such a request is sent whole, never split.
    List(Box<[ffi::ibv_sge]>),
    /// Inline data (`IBV_SEND_INLINE`), copied at the post: the program may
    /// reuse its buffer as soon as the post returns. The buffer comes back
    /// in the request's completion ([`ForeignDone::inline`]) to be used
    /// again.
    Inline(Vec<u8>),
}

impl Local {
    /// Its length in bytes (saturating).
    pub fn len(&self) -> u64 {
        match self {
            Local::Empty => 0,
            Local::Sge(s) => u64::from(s.length),
            Local::List(list) => list.iter().map(|s| u64::from(s.length)).sum(),
            Local::Inline(data) => data.len() as u64,
        }
    }

    /// Whether it has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A UD request's destination, as the program gave it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ForeignUd {
    /// The program's address handle (it must outlive the request).
    pub ah: *mut ffi::ibv_ah,
    /// The remote queue pair.
    pub qpn: u32,
    /// Its Q_Key.
    pub qkey: u32,
}

// SAFETY: the address handle is only handed back to the provider in a work
// request, from whichever thread posts; the program keeps it alive.
unsafe impl Send for ForeignUd {}
// SAFETY: as above: nothing reads through the pointer.
unsafe impl Sync for ForeignUd {}

/// One send-side request as the program posted it.
#[derive(Debug, Clone)]
pub struct ForeignSend {
    /// The program's `wr_id`, given back in its completion.
    pub wr_id: u64,
    /// The operation (a remote region's `len` is the request's length).
    pub op: SendOp,
    /// Its local bytes.
    pub local: Local,
    /// `IBV_SEND_FENCE` (on its first piece).
    pub fence: bool,
    /// `IBV_SEND_SOLICITED` (on its last piece).
    pub solicited: bool,
    /// Whether the program asked for its completion (`IBV_SEND_SIGNALED`,
    /// or a queue pair that signals every request). Every request's
    /// completion is given back with this flag: a shim shows the program
    /// the signaled ones and the failed ones, as the device would.
    pub signaled: bool,
    /// A UD request's destination.
    pub ud: Option<ForeignUd>,
}

/// A request [`ForeignQueuePair::post`] refused: why, and the request
/// (nothing of it was posted).
#[derive(Debug)]
pub struct Refused {
    /// Why.
    pub error: Error,
    /// The request, as given.
    pub request: ForeignSend,
}

/// A finished foreign request, as the device would have reported it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForeignDone {
    /// The program's `wr_id`.
    pub wr_id: u64,
    /// `ibv_wc_status` (the first failure among its pieces, if any).
    pub status: u32,
    /// `ibv_wc_opcode`.
    pub opcode: u32,
    /// Its length in bytes.
    pub byte_len: u32,
    /// Whether the program asked for it ([`ForeignSend::signaled`]).
    pub signaled: bool,
    /// An inline request's buffer, handed back for the next one.
    pub inline: Option<Vec<u8>>,
}

/// A foreign request's bytes while it is in the engine.
struct ForeignBuf {
    local: Local,
    len: usize,
    flags: u32,
    ud: Option<ForeignUd>,
    signaled: bool,
    wc_opcode: u32,
}

impl Region for ForeignBuf {
    type Completion = ForeignDone;

    fn len(&self) -> usize {
        self.len
    }

    fn sge(&self, range: &Range<usize>) -> Option<ffi::ibv_sge> {
        if range.start > range.end || range.end > self.len {
            return None;
        }
        let length = u32::try_from(range.end - range.start).ok()?;
        match &self.local {
            Local::Empty => Some(ffi::ibv_sge {
                addr: 0,
                length: 0,
                lkey: 0,
            }),
            Local::Sge(s) => Some(ffi::ibv_sge {
                addr: s.addr + range.start as u64,
                length,
                lkey: s.lkey,
            }),
            // Whole only (see `extra`: the list goes in its place).
            Local::List(list) => {
                (range.start == 0 && range.end == self.len).then(|| ffi::ibv_sge {
                    addr: list[0].addr,
                    length,
                    lkey: list[0].lkey,
                })
            }
            Local::Inline(data) => Some(ffi::ibv_sge {
                addr: data.as_ptr() as u64 + range.start as u64,
                length,
                lkey: 0,
            }),
        }
    }

    fn complete(self, (context, status, _, byte_len, _): Finished) -> ForeignDone {
        ForeignDone {
            wr_id: context,
            status: status.to_raw(),
            opcode: self.wc_opcode,
            byte_len,
            signaled: self.signaled,
            inline: match self.local {
                Local::Inline(data) => Some(data),
                _ => None,
            },
        }
    }

    #[inline]
    fn datagram(&self) -> Option<UdDest> {
        // A null address handle names no destination: the work request
        // then carries none, as the program gave it.
        let d = self.ud?;
        Some(UdDest {
            ah: std::num::NonZeroUsize::new(d.ah as usize)?,
            qpn: d.qpn,
            qkey: d.qkey,
        })
    }

    #[inline]
    fn extra(&self, first: bool, last: bool) -> Extra {
        use ffi::ibv_send_flags as f;
        let mut flags = self.flags & f::IBV_SEND_INLINE.0;
        if first {
            flags |= self.flags & f::IBV_SEND_FENCE.0;
        }
        if last {
            flags |= self.flags & f::IBV_SEND_SOLICITED.0;
        }
        let quiet = !self.signaled && first && last;
        match &self.local {
            Local::List(list) if list.len() > 1 => Extra {
                flags,
                sg_list: list.as_ptr() as usize,
                num_sge: i32::try_from(list.len()).unwrap_or(i32::MAX),
                quiet,
            },
            _ => Extra {
                flags,
                quiet,
                ..Extra::default()
            },
        }
    }
}

/// The provider's queue pair, as the engine's sink.
struct ForeignSink {
    qp: *mut ffi::ibv_qp,
    qpn: u32,
    post_send: PostSendFn,
    books: Books<ForeignBuf>,
    handle: Option<TenantHandle>,
    /// Completions of pieces handed over by whoever polled the program's
    /// completion queue, not yet matched.
    inbox: Vec<(u64, u32, bool)>,
    /// Work requests posted.
    posted: u64,
    /// Every work request in the device, oldest first: a completion
    /// reports the unsignaled ones before it too.
    fifo: std::collections::VecDeque<Posted>,
    /// Unsignaled work requests posted since the last signaled one.
    run: u32,
    /// The most in a row.
    quiet_limit: u32,
    /// Requests posted directly, in the device.
    direct_out: usize,
    /// Direct requests finished, to give back at the next poll.
    direct_done: Vec<ForeignDone>,
    /// Numbers the direct requests (their `wr_id`s' low bits).
    direct_seq: u64,
    /// For a queue pair without a window: its piece size and the pieces
    /// it may have in the device (a bulk request of one piece may then go
    /// direct).
    bulk_direct: Option<(u64, usize)>,
}

impl ForeignSink {
    /// [`ForeignQueuePair::post_direct`], once nothing waits in the
    /// engine.
    ///
    /// # Safety
    /// As [`ForeignQueuePair::post_direct`].
    unsafe fn post_direct(&mut self, wr: &ffi::ibv_send_wr, signaled: bool) -> Direct {
        let Some(tenant) = &self.handle else {
            return Direct::Engine;
        };
        let Some(opcode) = wc_opcode_of(wr.opcode) else {
            return Direct::Engine;
        };
        if self.send_room() == 0 || wr.num_sge < 0 {
            return Direct::Engine;
        }
        let n = wr.num_sge as usize;
        let sges: &[ffi::ibv_sge] = if n == 0 {
            &[]
        } else {
            // SAFETY: the caller's promise: `num_sge` valid entries.
            unsafe { std::slice::from_raw_parts(wr.sg_list, n) }
        };
        let len: u64 = sges.iter().map(|s| u64::from(s.length)).sum();
        let Ok(len32) = u32::try_from(len) else {
            return Direct::Engine;
        };
        // A latency request goes whatever its size; a bulk one only as one
        // piece, without a window, within the pieces the queue pair may
        // have in the device.
        let in_device = self.fifo.len();
        let whole_bulk = self
            .bulk_direct
            .is_some_and(|(chunk, pieces)| len <= chunk && in_device < pieces);
        if tenant.class() != mtrdma_core::TrafficClass::Latency && !whole_bulk {
            return Direct::Engine;
        }
        if tenant.check_rate(tenant.now_ns(), len, 1).is_err() {
            return Direct::Engine;
        }
        let seq = self.direct_seq;
        let mut one = *wr;
        one.next = std::ptr::null_mut();
        one.wr_id = PIECE_TAG | (seq & 0xffff_ffff);
        if signaled {
            one.send_flags |= ffi::ibv_send_flags::IBV_SEND_SIGNALED.0;
        } else {
            one.send_flags &= !ffi::ibv_send_flags::IBV_SEND_SIGNALED.0;
        }
        let sent = Sent {
            wr_id: wr.wr_id,
            signaled,
            opcode,
            len: len32,
        };
        let rc = self.post_marked(&mut one, Some(sent));
        if rc != 0 {
            return Direct::Refused(rc);
        }
        self.books.sends_in_flight += 1;
        self.direct_seq = seq.wrapping_add(1);
        if let Some(tenant) = &self.handle {
            tenant.record_posted(len, 1);
        }
        Direct::Posted
    }

    /// Posts `wr` (its `wr_id` already marked), unsignaled if it asks to
    /// be and the run of unsignaled ones allows; remembers it in the FIFO.
    /// The provider's `errno` if it refuses.
    fn post_marked(&mut self, wr: &mut ffi::ibv_send_wr, direct: Option<Sent>) -> c_int {
        let signaled = ffi::ibv_send_flags::IBV_SEND_SIGNALED.0;
        let quiet = wr.send_flags & signaled == 0 && self.run < self.quiet_limit;
        if !quiet {
            wr.send_flags |= signaled;
        }
        let mut bad = std::ptr::null_mut();
        // SAFETY: the queue pair is live while the program has not
        // destroyed it (the shim drops this first); `wr` and its scatter
        // list outlive the call; the caller keeps the memory valid.
        let rc = unsafe { (self.post_send)(self.qp, wr, &mut bad) };
        if rc == 0 {
            self.run = if quiet { self.run + 1 } else { 0 };
            self.posted += 1;
            self.direct_out += usize::from(direct.is_some());
            self.fifo.push_back(Posted {
                wr_id: wr.wr_id,
                direct,
            });
        }
        rc
    }

    /// The completion of the work request marked `wr_id`, with `status`:
    /// it and every unsignaled one before it are done (those before it
    /// succeeded: RC completes in order, and a failure reports itself).
    fn deliver(&mut self, wr_id: u64, status: u32) {
        let Some(at) = self.fifo.iter().position(|p| p.wr_id == wr_id) else {
            tracing::error!(wr_id, "a completion for no work request in the device");
            return;
        };
        for (i, p) in self.fifo.drain(..=at).enumerate() {
            let st = if i == at {
                status
            } else {
                ffi::ibv_wc_status::IBV_WC_SUCCESS
            };
            match p.direct {
                // Only the request the completion named is a delay
                // sample; the unsignaled ones before it finished earlier.
                None => self.inbox.push((p.wr_id, st, i == at)),
                Some(sent) => {
                    self.direct_out -= 1;
                    self.books.sends_in_flight = self.books.sends_in_flight.saturating_sub(1);
                    self.direct_done.push(ForeignDone {
                        wr_id: sent.wr_id,
                        status: st,
                        opcode: sent.opcode,
                        byte_len: sent.len,
                        signaled: sent.signaled,
                        inline: None,
                    });
                }
            }
        }
    }
}

// SAFETY: the queue pair is the provider's; libibverbs allows posting to
// it from any thread, and the sink is used by one thread at a time (its
// owner holds it behind `&mut`).
unsafe impl Send for ForeignSink {}

impl Sink for ForeignSink {
    type Region = ForeignBuf;

    fn qpn(&self) -> u32 {
        self.qpn
    }

    crate::qp::sink_books!();

    unsafe fn post_wr(&mut self, wr: &mut ffi::ibv_send_wr) -> Result<(), Error> {
        let engine_id = wr.wr_id;
        wr.wr_id |= PIECE_TAG;
        let rc = self.post_marked(wr, None);
        wr.wr_id = engine_id;
        if rc != 0 {
            return Err(Error::Verbs {
                call: "ibv_post_send",
                device: format!("queue pair {}", self.qpn),
                source: crate::error::errno(rc),
            });
        }
        Ok(())
    }

    fn poll(
        &mut self,
        out: &mut Vec<ForeignDone>,
        raw: &mut Vec<RawCompletion>,
    ) -> Result<usize, Error> {
        let n = self.inbox.len();
        for (wr_id, status, sampled) in self.inbox.drain(..) {
            let wc = Wc {
                wr_id: wr_id & !TAG_MASK,
                status: WcStatus::from_raw(status),
                opcode: u32::MAX,
                byte_len: 0,
                imm: None,
                source: None,
            };
            self.books.complete_as(wc, sampled, out, raw);
        }
        Ok(n)
    }

    fn shutdown(&mut self) -> bool {
        // The program destroys its queue pair itself; what is still in the
        // NIC refers to the program's memory or to copies the device made.
        self.books.outstanding() == 0
    }

    fn check_events(&self) -> Result<(), Error> {
        Err(Error::NoCompletionEvents)
    }

    fn arm_events(&mut self) -> Result<Armed, Error> {
        Err(Error::NoCompletionEvents)
    }

    fn take_events(&mut self) -> Result<(), Error> {
        Err(Error::NoCompletionEvents)
    }

    fn tenant(&self) -> Option<&TenantHandle> {
        self.handle.as_ref()
    }
}

/// A program's queue pair whose sends mtrdma schedules (see the [module
/// docs](self)).
pub struct ForeignQueuePair {
    inner: Scheduled<ForeignSink, DefaultScheduler>,
}

impl std::fmt::Debug for ForeignQueuePair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.inner.debug("ForeignQueuePair", f)
    }
}

impl ForeignQueuePair {
    /// Schedules the sends of `qp` as `tenant` (or as
    /// [`ScheduleConfig::tenant`] says), posting through `post_send`, with
    /// `max_send_wr` requests at most in its send queue.
    ///
    /// # Safety
    /// `qp` must be a live queue pair of the provider whose `post_send` is
    /// given, and stay live until this value is dropped.
    ///
    /// # Errors
    /// [`Error::ScheduleConfig`] for a bad configuration, [`Error::NoTenant`]
    /// if scheduled as the queue pair's tenant and `tenant` is `None`.
    pub unsafe fn new(
        qp: *mut ffi::ibv_qp,
        post_send: PostSendFn,
        max_send_wr: u32,
        tenant: Option<TenantHandle>,
        config: ScheduleConfig,
    ) -> Result<ForeignQueuePair, Error> {
        // SAFETY: the caller's promise: a live queue pair.
        let qpn = unsafe { (*qp).qp_num };
        // The policy's latency bound holds the program's queue pairs as it
        // holds the Rust API's: a window (so no direct bulk path) and its
        // pieces.
        let (config, sched) = solo_parts(config, tenant.as_ref())?;
        let sink = ForeignSink {
            qp,
            qpn,
            post_send,
            books: Books::new(max_send_wr.max(1), 0),
            handle: tenant,
            inbox: Vec::new(),
            posted: 0,
            fifo: std::collections::VecDeque::new(),
            run: 0,
            quiet_limit: (config.max_pieces_in_flight.min(max_send_wr) / 4).max(1),
            direct_out: 0,
            direct_done: Vec::new(),
            direct_seq: 0,
            bulk_direct: config
                .window
                .is_none()
                .then_some((config.chunk_bytes, config.max_pieces_in_flight as usize)),
        };
        Ok(ForeignQueuePair {
            inner: Scheduled::solo(sink, config, sched, EngineClock::real())?,
        })
    }

    /// The queue pair number.
    pub fn qpn(&self) -> u32 {
        self.inner.qpn
    }

    /// Requests accepted and not yet given back by [`poll`](Self::poll),
    /// those posted directly included.
    pub fn queued(&self) -> usize {
        let direct = self
            .inner
            .with_sink_ref(|s| s.direct_out + s.direct_done.len());
        self.inner.queued() + direct
    }

    /// Whether bytes the program posted are not yet in the device (held by
    /// its window, its rates or the queue pair's room): only those need
    /// someone to poll for them.
    pub fn unposted(&self) -> bool {
        self.inner.unposted()
    }

    /// Posts the program's request `wr` (one; its `next` is not followed)
    /// straight to the provider if it may go now as the engine's fast path
    /// would send it: nothing of this queue pair waits in the engine, the
    /// send queue has room, the request is one the engine serves, the
    /// tenant is of the latency class (or, without a window, the request
    /// is one piece and the queue pair has fewer than its pieces in the
    /// device), and the tenant's shared rates admit it now. The request is
    /// posted as the program wrote it, its `wr_id` marked ([`is_piece`]);
    /// `signaled` says whether the program asked for its completion (an
    /// unsignaled one goes unsignaled, a few in a row at most, a later
    /// completion reporting it). Its bytes count as posted in the
    /// tenant's usage.
    ///
    /// # Safety
    /// As `ibv_post_send` for `wr`: a valid work request whose memory stays
    /// registered until its completion.
    pub unsafe fn post_direct(&mut self, wr: &ffi::ibv_send_wr, signaled: bool) -> Direct {
        if self.inner.queued() > 0 {
            return Direct::Engine;
        }
        // SAFETY: the caller's promise.
        self.inner
            .with_sink(|s| unsafe { s.post_direct(wr, signaled) })
    }

    /// Work requests posted to the device so far (a request split in
    /// pieces counts each).
    pub fn posted(&self) -> u64 {
        self.inner.with_sink_ref(|s| s.posted)
    }

    /// Takes a request. Refused requests come back with the error
    /// (nothing of them was posted): a request whose local and remote
    /// lengths disagree, a misshapen atomic, one the scheduler refuses.
    ///
    /// # Safety
    /// The memory the request names must stay registered and valid until
    /// its completion is given back by [`poll`](Self::poll) (as for
    /// `ibv_post_send`), and a UD request's address handle alive.
    pub unsafe fn post(&mut self, mut req: ForeignSend) -> Result<(), Box<Refused>> {
        // A list of one entry is that entry (and may be split); of none,
        // nothing.
        if let Local::List(list) = &req.local {
            match **list {
                [] => req.local = Local::Empty,
                [one] => req.local = Local::Sge(one),
                _ => {}
            }
        }
        let len = match usize::try_from(req.local.len()) {
            Ok(len) if u32::try_from(len).is_ok() => len,
            _ => {
                let error = Error::LocalRangeOutOfBounds {
                    range: 0..usize::MAX,
                    len: u32::MAX as usize,
                };
                return Err(Box::new(Refused {
                    error,
                    request: req,
                }));
            }
        };
        let whole = matches!(&req.local, Local::List(l) if l.len() > 1);
        let ForeignSend {
            wr_id,
            op,
            local,
            fence,
            solicited,
            signaled,
            ud,
        } = req;
        let mut flags = 0;
        if fence {
            flags |= ffi::ibv_send_flags::IBV_SEND_FENCE.0;
        }
        if solicited {
            flags |= ffi::ibv_send_flags::IBV_SEND_SOLICITED.0;
        }
        if matches!(local, Local::Inline(_)) {
            flags |= ffi::ibv_send_flags::IBV_SEND_INLINE.0;
        }
        let buf = ForeignBuf {
            wc_opcode: wc_opcode_of(op.lower(true).0)
                .expect("every send operation lowers to an opcode the engine serves"),
            local,
            len,
            flags,
            ud,
            signaled,
        };
        self.inner
            .post_send(op, buf, 0..len, wr_id, whole)
            .map_err(|(error, buf)| {
                Box::new(Refused {
                    error,
                    request: ForeignSend {
                        wr_id,
                        op,
                        local: buf.local,
                        fence,
                        solicited,
                        signaled,
                        ud,
                    },
                })
            })
    }

    /// Hands over the completion of one of this queue pair's pieces
    /// (`wr_id` and `ibv_wc_status` as polled; see [`is_piece`]).
    pub fn deliver(&mut self, wr_id: u64, status: u32) {
        self.inner.with_sink(|s| s.deliver(wr_id, status));
    }

    /// Matches the completions handed over, lets the engine post what it
    /// may now, and gives back the requests that finished, in order.
    ///
    /// # Errors
    /// None today (the sink's poll cannot fail); kept for the engine's
    /// signature.
    pub fn poll(&mut self, out: &mut Vec<ForeignDone>) -> Result<usize, Error> {
        // Direct requests were posted while nothing waited in the engine:
        // they finish before anything the engine holds now.
        let direct = self.inner.with_sink(|s| {
            let n = s.direct_done.len();
            out.append(&mut s.direct_done);
            n
        });
        Ok(direct + self.inner.poll(out)?)
    }

    /// When the engine wants to be polled again although no completion
    /// arrives (a rate limit or the window's pacing holds a piece back);
    /// `None`: not before a completion or a post.
    pub fn poll_by(&self) -> Option<Instant> {
        self.inner.poll_by()
    }
}

#[cfg(test)]
mod tests;
