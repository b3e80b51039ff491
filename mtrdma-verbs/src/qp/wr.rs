//! What a work request is made of before it reaches the device: a send
//! as the layers above describe it ([`RawSend`]), what a UD send adds,
//! the regions a work request may own ([`Region`]), and building the
//! `ibv_send_wr`.

use super::*;

/// A completion of a raw work request.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RawCompletion {
    pub(crate) wr_id: u64,
    pub(crate) status: WcStatus,
    /// Whether the device reported it itself, at the time it finished: a
    /// delay sample. An unsignaled piece completes with the signaled one
    /// after it, later than it finished, and is no sample.
    pub(crate) sampled: bool,
}

/// Where a raw send's data lives and goes.
pub(crate) struct RawSend {
    pub(crate) wr_id: u64,
    pub(crate) opcode: ffi::ibv_wr_opcode::Type,
    pub(crate) sge: ffi::ibv_sge,
    pub(crate) remote: Option<(u64, u32)>,
    pub(crate) imm: Option<u32>,
    /// An atomic operation's operands (compare or add, swap).
    pub(crate) atomic: Option<(u64, u64)>,
    /// A datagram's destination (UD queue pairs).
    pub(crate) ud: Option<UdDest>,
    /// What the request's region adds ([`Region::extra`]).
    pub(crate) extra: Extra,
    /// It may go unsignaled when a later request of the same list is
    /// signaled ([`Sink::post_list`]): a piece that is not its request's
    /// last.
    pub(crate) quiet_ok: bool,
}

impl RawSend {
    /// The work request `wr_id` of `op` on `sge` (the request's `last`
    /// piece or not: only the last carries immediate data), to a datagram
    /// destination `ud` if any, with what its region adds (`extra`);
    /// `quiet_ok`: see [`RawSend::quiet_ok`].
    #[inline]
    pub(crate) fn new(
        wr_id: u64,
        op: SendOp,
        last: bool,
        sge: ffi::ibv_sge,
        ud: Option<UdDest>,
        extra: Extra,
        quiet_ok: bool,
    ) -> RawSend {
        let (opcode, remote, imm) = op.lower(last);
        RawSend {
            wr_id,
            opcode,
            sge,
            remote: remote.map(|r| (r.addr, r.rkey)),
            imm,
            atomic: op.atomic(),
            ud,
            extra,
            quiet_ok,
        }
    }
}

/// What a region adds to the work requests of its pieces beyond one
/// scatter entry: a foreign program's own send flags, and its scatter
/// list when it has several entries (see [`crate::foreign`]).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Extra {
    /// `ibv_send_flags` to add (fence, solicited, inline).
    pub(crate) flags: u32,
    /// The scatter list's address, used in place of the piece's one entry
    /// when `num_sge` is above 1 (such a request is never split).
    pub(crate) sg_list: usize,
    /// Its entries.
    pub(crate) num_sge: i32,
    /// The piece may go without asking for its completion: the sink
    /// decides (a foreign program's unsignaled request sent whole; a later
    /// signaled one reports it, RC completing in order).
    pub(crate) quiet: bool,
}

/// Where a UD send goes: the address handle (its address; the request's
/// region keeps the handle alive until the completion), the remote queue
/// pair and its Q_Key. (The address is never null, which keeps an
/// `Option<UdDest>`, and so a [`RawSend`], within 128 bytes: copied
/// without a call to `memcpy`.)
#[derive(Debug, Clone, Copy)]
pub(crate) struct UdDest {
    pub(crate) ah: std::num::NonZeroUsize,
    pub(crate) qpn: u32,
    pub(crate) qkey: u32,
}

/// What a finished work request reports besides its region, the fields
/// every completion type opens with: the caller's context, how it ended,
/// what it was, the bytes received or transferred, and the immediate
/// data.
pub(crate) type Finished = (u64, WcStatus, Opcode, u32, Option<u32>);

/// Builds the completion type `$ty` from a [`Finished`] and the fields it
/// has after the five every completion opens with.
macro_rules! completion_of {
    ($finished:expr, $ty:ident { $($field:ident $(: $value:expr)?),* $(,)? }) => {{
        let (context, status, opcode, byte_len, imm): $crate::qp::Finished = $finished;
        $ty {
            context,
            status,
            opcode,
            byte_len,
            imm,
            $($field $(: $value)?),*
        }
    }};
}
pub(crate) use completion_of;

/// The completion methods of a region kind whose completion `$ty` hands
/// the regions themselves back: a request's (first) region in `region`,
/// a gather request's others in `gathered`.
macro_rules! own_region_completion {
    ($ty:ident) => {
        fn complete(self, finished: $crate::qp::Finished) -> $ty {
            $crate::qp::completion_of!(
                finished,
                $ty {
                    region: self,
                    gathered: Vec::new()
                }
            )
        }

        const GATHERS: bool = true;

        fn attach_rest(done: &mut $ty, rest: Vec<Self>) {
            done.gathered = rest;
        }
    };
}
pub(crate) use own_region_completion;

/// A buffer a work request may use: a [`MemoryRegion`] on a device, a
/// plain heap buffer on the host (benches and tests, see
/// [`crate::testing`]). It is moved into the queue pair while the NIC may
/// use it and handed back in its completion.
pub(crate) trait Region: Send + Sync + 'static {
    /// What a finished request hands back to the application.
    type Completion: Send + 'static;

    /// Its length in bytes.
    fn len(&self) -> usize;

    /// Checks that `range` lies in the region and returns its scatter
    /// entry.
    fn sge(&self, range: &Range<usize>) -> Option<ffi::ibv_sge>;

    /// The completion that hands the region back.
    fn complete(self, finished: Finished) -> Self::Completion;

    /// As [`complete`](Self::complete), for a completion the device
    /// reported with the datagram's source (UD receives); the default
    /// drops the source.
    fn complete_from(
        self,
        finished: Finished,
        source: Option<crate::ud::UdSource>,
    ) -> Self::Completion
    where
        Self: Sized,
    {
        let _ = source;
        self.complete(finished)
    }

    /// Where a send on this region goes as a datagram (UD queue pairs);
    /// none for connected queue pairs.
    #[inline]
    fn datagram(&self) -> Option<UdDest> {
        None
    }

    /// What its pieces' work requests carry beyond one scatter entry; the
    /// piece is the request's `first` and/or `last`. None by default.
    #[inline]
    fn extra(&self, first: bool, last: bool) -> Extra {
        let _ = (first, last);
        Extra::default()
    }

    /// Whether one request may name several regions of this kind (a
    /// gather list, [`Sink::post_gather`]): only then can its completion
    /// hand them all back ([`attach_rest`](Self::attach_rest)).
    const GATHERS: bool = false;

    /// Hands the regions after the first of a gather request back in the
    /// completion `done` (which holds the first), in order. Called only
    /// with regions of a kind that [`GATHERS`](Self::GATHERS); for the
    /// others `rest` is always empty.
    fn attach_rest(done: &mut Self::Completion, rest: Vec<Self>)
    where
        Self: Sized,
    {
        let _ = done;
        debug_assert!(rest.is_empty(), "a region kind that does not gather");
        // Never reached with regions in it: `post_gather` refuses kinds
        // that do not gather. Should it be, the request has completed and
        // the NIC no longer reaches them, so they may be freed.
        drop(rest);
    }
}

impl Region for MemoryRegion {
    type Completion = Completion;

    fn len(&self) -> usize {
        MemoryRegion::len(self)
    }

    fn sge(&self, range: &Range<usize>) -> Option<ffi::ibv_sge> {
        MemoryRegion::sge(self, range)
    }

    crate::qp::own_region_completion!(Completion);
}

/// `v.push(x)`, always inlined: `x` (a completion, several words) is
/// written straight into `v`'s buffer rather than built on the stack and
/// copied by an out-of-line `push` (which reads back the narrow stores
/// just made, a stall that cost ~5 ns per request on the null sink).
#[inline(always)]
pub(crate) fn push_in_place<T>(v: &mut Vec<T>, x: T) {
    v.reserve(1);
    let len = v.len();
    // SAFETY: `reserve(1)` left room for at least one more element at
    // index `len`, which is written before the length covers it.
    unsafe {
        v.as_mut_ptr().add(len).write(x);
        v.set_len(len + 1);
    }
}

/// The completion opcode a successful send of verbs opcode `opcode`
/// reports.
pub(crate) fn wc_opcode_of(opcode: ffi::ibv_wr_opcode::Type) -> ffi::ibv_wc_opcode::Type {
    use ffi::ibv_wc_opcode as c;
    use ffi::ibv_wr_opcode as o;
    match opcode {
        o::IBV_WR_RDMA_WRITE | o::IBV_WR_RDMA_WRITE_WITH_IMM => c::IBV_WC_RDMA_WRITE,
        o::IBV_WR_RDMA_READ => c::IBV_WC_RDMA_READ,
        o::IBV_WR_ATOMIC_FETCH_AND_ADD => c::IBV_WC_FETCH_ADD,
        o::IBV_WR_ATOMIC_CMP_AND_SWP => c::IBV_WC_COMP_SWAP,
        _ => c::IBV_WC_SEND,
    }
}

/// The verbs work request for `raw`, its scatter list in `sge`; signaled
/// unless `quiet` or its region asks otherwise ([`Extra::quiet`]).
#[inline(always)]
pub(crate) fn send_wr(raw: &RawSend, sge: &mut ffi::ibv_sge, quiet: bool) -> ffi::ibv_send_wr {
    let mut wr = MaybeUninit::uninit();
    write_send_wr(&mut wr, raw, sge, quiet);
    // SAFETY: `write_send_wr` initialised every byte.
    unsafe { wr.assume_init() }
}

/// Appends [`send_wr`]`(raw, sge, quiet)` to `v`, built where it is to
/// stay (a work request is 128 bytes: built elsewhere and copied in, it
/// costs a batch's request as much again).
#[inline(always)]
pub(crate) fn push_send_wr(
    v: &mut Vec<ffi::ibv_send_wr>,
    raw: &RawSend,
    sge: &mut ffi::ibv_sge,
    quiet: bool,
) {
    v.reserve(1);
    let len = v.len();
    write_send_wr(&mut v.spare_capacity_mut()[0], raw, sge, quiet);
    // SAFETY: the element at `len` was just initialised, within the room
    // `reserve(1)` left.
    unsafe { v.set_len(len + 1) };
}

/// Builds [`send_wr`]`(raw, sge, quiet)` in `dst`, every byte of it.
#[inline(always)]
fn write_send_wr(
    dst: &mut MaybeUninit<ffi::ibv_send_wr>,
    raw: &RawSend,
    sge: &mut ffi::ibv_sge,
    quiet: bool,
) {
    let length = sge.length;
    // SAFETY: all-zero is a valid value of this plain C struct; after
    // this every byte is initialised.
    let wr = unsafe {
        dst.as_mut_ptr().write_bytes(0, 1);
        dst.assume_init_mut()
    };
    wr.wr_id = raw.wr_id;
    wr.sg_list = sge;
    wr.num_sge = i32::from(length > 0);
    wr.opcode = raw.opcode;
    wr.send_flags = if raw.extra.quiet || quiet {
        raw.extra.flags
    } else {
        ffi::ibv_send_flags::IBV_SEND_SIGNALED.0 | raw.extra.flags
    };
    if raw.extra.num_sge > 1 {
        wr.sg_list = raw.extra.sg_list as *mut ffi::ibv_sge;
        wr.num_sge = raw.extra.num_sge;
    }
    if let Some(imm) = raw.imm {
        wr.__bindgen_anon_1.imm_data = imm.to_be();
    }
    match (raw.remote, raw.atomic) {
        (Some((remote_addr, rkey)), Some((compare_add, swap))) => {
            wr.wr.atomic = ffi::ibv_send_wr__bindgen_ty_2__bindgen_ty_2 {
                remote_addr,
                compare_add,
                swap,
                rkey,
            };
        }
        (Some((remote_addr, rkey)), None) => {
            wr.wr.rdma = ffi::ibv_send_wr__bindgen_ty_2__bindgen_ty_1 { remote_addr, rkey };
        }
        (None, _) => {}
    }
    if let Some(ud) = raw.ud {
        wr.wr.ud = ffi::ibv_send_wr__bindgen_ty_2__bindgen_ty_3 {
            ah: ud.ah.get() as *mut ffi::ibv_ah,
            remote_qpn: ud.qpn,
            remote_qkey: ud.qkey,
        };
    }
}
