//! Reliable-connected queue pairs: creation, connection, posting, polling
//! and safe teardown.

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
use crate::events::{Armed, CompChannel, Waitable};
use crate::mr::{Access, RemoteRegion};
use crate::slab::Slab;
use crate::{Error, GidEntry, GidSelection, MemoryRegion, PortInfo, ProtectionDomain};

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
}

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
        }
    }

    /// Its kind as the scheduler sees it (whether it may be split).
    #[inline]
    pub(crate) fn kind(self) -> mtrdma_sched::Opcode {
        match self {
            SendOp::Send | SendOp::SendWithImm(_) => mtrdma_sched::Opcode::Send,
            SendOp::Write(_) | SendOp::WriteWithImm(..) => mtrdma_sched::Opcode::Write,
            SendOp::Read(_) => mtrdma_sched::Opcode::Read,
        }
    }

    /// The completion opcode a whole operation reports.
    pub(crate) fn completion_opcode(self) -> Opcode {
        match self {
            SendOp::Send | SendOp::SendWithImm(_) => Opcode::Send,
            SendOp::Write(_) | SendOp::WriteWithImm(..) => Opcode::Write,
            SendOp::Read(_) => Opcode::Read,
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
    if let (_, Some(r), _) = op.lower(true) {
        let len = u64::from(sge.length);
        if len > r.len {
            return Err(Error::RemoteOutOfBounds { remote: r, len });
        }
    }
    Ok(sge)
}

/// A refused post: the error, and the region handed back.
#[derive(Debug)]
pub struct PostError {
    /// Why it was refused.
    pub error: Box<Error>,
    /// The region, untouched.
    pub region: MemoryRegion,
}

impl PostError {
    /// A refusal of `region` for `error`.
    pub(crate) fn new((error, region): (Error, MemoryRegion)) -> PostError {
        PostError {
            error: Box::new(error),
            region,
        }
    }
}

impl fmt::Display for PostError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.error.fmt(f)
    }
}

impl std::error::Error for PostError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

/// How to build a queue pair (see [`ProtectionDomain::queue_pair`]).
#[derive(Debug)]
pub struct QueuePairBuilder<'a> {
    pd: &'a ProtectionDomain,
    settings: QpSettings,
    access: Access,
    max_inline: u32,
    ack_timeout: u8,
}

/// The default local ACK timeout exponent: 4.096 us x 2^14, about 67 ms.
const DEFAULT_ACK_TIMEOUT: u8 = 14;

/// What the RC and UD queue pair builders share.
#[derive(Debug)]
pub(crate) struct QpSettings {
    pub(crate) max_send_wr: u32,
    pub(crate) max_recv_wr: u32,
    pub(crate) port: u8,
    pub(crate) gid: GidSelection,
    pub(crate) tenant: Option<TenantHandle>,
    /// Whether the completion queue gets a completion channel.
    pub(crate) events: bool,
}

impl Default for QpSettings {
    fn default() -> Self {
        QpSettings {
            max_send_wr: 128,
            max_recv_wr: 128,
            port: 1,
            gid: GidSelection::Auto,
            tenant: None,
            events: false,
        }
    }
}

/// What creating a queue pair begins with (see [`QpSettings::begin`]).
pub(crate) struct QpStart {
    /// The tenant's admission of the queue pair, given back on drop.
    pub(crate) permit: Option<OwnedQpPermit>,
    pub(crate) device: String,
    pub(crate) port_num: u8,
    pub(crate) port: PortInfo,
    pub(crate) gid: GidEntry,
    pub(crate) max_send_wr: u32,
    pub(crate) max_recv_wr: u32,
    pub(crate) events: bool,
}

impl QpSettings {
    /// Admits a new queue pair against its tenant's quota (count and
    /// creation rate), then finds its port and GID on `pd`'s device.
    pub(crate) fn begin(&self, pd: &ProtectionDomain) -> Result<QpStart, Error> {
        let permit = match &self.tenant {
            Some(t) => Some(t.acquire_qp()?.into_owned()),
            None => None,
        };
        let ctx = pd.context();
        Ok(QpStart {
            permit,
            device: ctx.name().to_string(),
            port_num: self.port,
            port: ctx.port(self.port)?,
            gid: ctx.select_gid(self.port, self.gid)?,
            max_send_wr: self.max_send_wr,
            max_recv_wr: self.max_recv_wr,
            events: self.events,
        })
    }
}

/// The setters both queue pair builders have, on their `settings`.
macro_rules! qp_settings_setters {
    () => {
        /// Send queue depth (default 128).
        pub fn max_send_wr(mut self, n: u32) -> Self {
            self.settings.max_send_wr = n.max(1);
            self
        }

        /// The port (default 1).
        pub fn port(mut self, port: u8) -> Self {
            self.settings.port = port;
            self
        }

        /// How to choose the local GID (default [`GidSelection::Auto`]).
        pub fn gid(mut self, gid: GidSelection) -> Self {
            self.settings.gid = gid;
            self
        }

        /// Gives the queue pair a completion channel, so that `poll_wait`
        /// can sleep until a completion arrives (or a timeout runs out)
        /// rather than spin on `poll` (default off). Tenants that share a
        /// few CPUs should wait this way.
        ///
        /// Off by default because each channel is one file descriptor per
        /// queue pair: a tenant with thousands of queue pairs would run
        /// into its open-file limit (`ulimit -n`). Turn it on for the
        /// queue pairs a thread actually waits on.
        pub fn completion_events(mut self, on: bool) -> Self {
            self.settings.events = on;
            self
        }
    };
}
pub(crate) use qp_settings_setters;

impl ProtectionDomain {
    /// Starts building a reliable-connected queue pair (with its own
    /// completion queue).
    pub fn queue_pair(&self) -> QueuePairBuilder<'_> {
        QueuePairBuilder {
            pd: self,
            settings: QpSettings::default(),
            access: Access::REMOTE_READ_WRITE,
            max_inline: 0,
            ack_timeout: DEFAULT_ACK_TIMEOUT,
        }
    }
}

impl QueuePairBuilder<'_> {
    qp_settings_setters!();

    /// Receive queue depth (default 128).
    pub fn max_recv_wr(mut self, n: u32) -> Self {
        self.settings.max_recv_wr = n.max(1);
        self
    }

    /// What peers may do through this queue pair (default READ and WRITE;
    /// each region grants its own rights too).
    pub fn access(mut self, access: Access) -> Self {
        self.access = access;
        self
    }

    /// Sends of at most this many bytes are copied into the work request
    /// at post time (inline) rather than read by the NIC from the region,
    /// which shortens their latency (default 0: never). READs are never
    /// inline. Creation fails if the device supports less.
    pub fn max_inline_data(mut self, bytes: u32) -> Self {
        self.max_inline = bytes;
        self
    }

    /// The tenant the queue pair belongs to: creation is admitted against
    /// its quota (count and creation rate) and the queue pair gives its
    /// place back when dropped.
    pub fn tenant(mut self, tenant: &TenantHandle) -> Self {
        self.settings.tenant = Some(tenant.clone());
        self
    }

    /// How long a sent packet waits for its acknowledgement before it is
    /// sent again: 4.096 us x 2^`exp` (default 14, about 67 ms; at most
    /// 31, larger values are taken as 31; 0 waits forever). A queue pair
    /// that keeps megabytes queued in front of a slow link (a bulk sender
    /// without a window) needs more than its queue's delay, or it resends
    /// what is still queued and its throughput collapses.
    pub fn ack_timeout(mut self, exp: u8) -> Self {
        self.ack_timeout = exp.min(31);
        self
    }

    /// Creates the queue pair and moves it to INIT. Connect it with
    /// [`PreparedQueuePair::connect`] once the peer's [`Endpoint`] is known.
    pub fn build(self) -> Result<PreparedQueuePair, Error> {
        let QpStart {
            permit,
            device,
            port_num,
            port,
            gid,
            max_send_wr,
            max_recv_wr,
            events,
        } = self.settings.begin(self.pd)?;
        let cq = Cq::new(self.pd.context(), max_send_wr + max_recv_wr, events)?;
        let mut init = ffi::ibv_qp_init_attr {
            send_cq: cq.cq.as_ptr(),
            recv_cq: cq.cq.as_ptr(),
            qp_type: ffi::ibv_qp_type::IBV_QPT_RC,
            sq_sig_all: 1,
            cap: ffi::ibv_qp_cap {
                max_send_wr,
                max_recv_wr,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: self.max_inline,
            },
            ..Default::default()
        };
        let qp = create_qp(self.pd, &mut init)?;
        // The provider writes back what it granted (at least what was asked).
        let max_inline = init.cap.max_inline_data.max(self.max_inline);
        let psn = random_psn();
        let qp = QueuePair {
            qp,
            cq,
            pd: self.pd.clone(),
            // The requested depths, not the provider's (possibly rounded
            // up) ones: the completion queue was sized for these.
            books: Books::new(max_send_wr, max_recv_wr),
            port: port_num,
            gid_index: gid.index,
            max_inline: if self.max_inline == 0 { 0 } else { max_inline },
            destroyed: false,
            _permit: permit,
        };
        let mut attr = ffi::ibv_qp_attr {
            qp_state: ffi::ibv_qp_state::IBV_QPS_INIT,
            pkey_index: 0,
            port_num,
            qp_access_flags: self.access.qp_flags(),
            ..Default::default()
        };
        use ffi::ibv_qp_attr_mask as m;
        qp.modify(
            &mut attr,
            m::IBV_QP_STATE | m::IBV_QP_PKEY_INDEX | m::IBV_QP_PORT | m::IBV_QP_ACCESS_FLAGS,
            "INIT",
            "port, P_Key index 0, access flags",
        )?;
        let endpoint = Endpoint {
            // SAFETY: `qp` is a live queue pair.
            qpn: unsafe { qp.qp.as_ref().qp_num },
            psn,
            gid: gid.gid.0,
            lid: port.lid,
            mtu: port.active_mtu.map_or(1024, |mtu| mtu.bytes()),
        };
        tracing::debug!(%device, qpn = endpoint.qpn, gid = %gid.gid, "created RC queue pair");
        Ok(PreparedQueuePair {
            qp,
            endpoint,
            ack_timeout: self.ack_timeout,
        })
    }
}

/// A 24-bit packet sequence number that differs between queue pairs.
pub(crate) fn random_psn() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(mtrdma_core::clock::monotonic_ns());
    (h.finish() as u32) & 0x00ff_ffff
}

/// A queue pair in INIT, waiting for its peer's endpoint.
#[derive(Debug)]
pub struct PreparedQueuePair {
    qp: QueuePair,
    endpoint: Endpoint,
    ack_timeout: u8,
}

impl PreparedQueuePair {
    /// What the peer needs to connect to this queue pair.
    pub fn endpoint(&self) -> Endpoint {
        self.endpoint
    }

    /// Posts a receive before connecting (so the first SEND finds it).
    pub fn post_recv(
        &mut self,
        region: MemoryRegion,
        range: Range<usize>,
        context: u64,
    ) -> Result<(), PostError> {
        self.qp.post_recv(region, range, context)
    }

    /// Connects to `remote`: INIT to RTR (path MTU, remote QPN and PSN,
    /// address vector with the remote GID) and RTR to RTS.
    pub fn connect(self, remote: &Endpoint) -> Result<QueuePair, Error> {
        let qp = self.qp;
        let local = self.endpoint;
        let ctx = qp.pd.context();
        let attrs = device_attrs(ctx)?;
        let rd_atomic = u8::try_from(attrs.max_qp_rd_atom.clamp(1, 16)).unwrap_or(1);
        let mtu = local.mtu.min(remote.mtu);
        use ffi::ibv_qp_attr_mask as m;
        let mut attr = ffi::ibv_qp_attr {
            qp_state: ffi::ibv_qp_state::IBV_QPS_RTR,
            path_mtu: mtu_enum(mtu),
            dest_qp_num: remote.qpn,
            rq_psn: remote.psn,
            max_dest_rd_atomic: rd_atomic,
            min_rnr_timer: 12,
            ah_attr: global_ah_attr(remote.gid, remote.lid, qp.port, qp.gid_index),
            ..Default::default()
        };
        qp.modify(
            &mut attr,
            m::IBV_QP_STATE
                | m::IBV_QP_AV
                | m::IBV_QP_PATH_MTU
                | m::IBV_QP_DEST_QPN
                | m::IBV_QP_RQ_PSN
                | m::IBV_QP_MAX_DEST_RD_ATOMIC
                | m::IBV_QP_MIN_RNR_TIMER,
            "RTR",
            "path MTU, remote QPN/PSN, address vector (remote GID, local GID index)",
        )?;
        let mut attr = ffi::ibv_qp_attr {
            qp_state: ffi::ibv_qp_state::IBV_QPS_RTS,
            timeout: self.ack_timeout,
            retry_cnt: 7,
            rnr_retry: 7,
            sq_psn: local.psn,
            max_rd_atomic: rd_atomic,
            ..Default::default()
        };
        qp.modify(
            &mut attr,
            m::IBV_QP_STATE
                | m::IBV_QP_TIMEOUT
                | m::IBV_QP_RETRY_CNT
                | m::IBV_QP_RNR_RETRY
                | m::IBV_QP_SQ_PSN
                | m::IBV_QP_MAX_QP_RD_ATOMIC,
            "RTS",
            "timeout, retry counts, local PSN, outstanding READs",
        )?;
        tracing::debug!(
            qpn = local.qpn,
            remote_qpn = remote.qpn,
            mtu,
            "queue pair connected"
        );
        Ok(qp)
    }
}

pub(crate) fn device_attrs(ctx: &crate::Context) -> Result<ffi::ibv_device_attr, Error> {
    let mut attr = ffi::ibv_device_attr::default();
    // SAFETY: the context is open; `attr` is writable.
    let rc = unsafe { ffi::ibv_query_device(ctx.raw(), &mut attr) };
    if rc != 0 {
        return Err(Error::Verbs {
            call: "ibv_query_device",
            device: ctx.name().to_string(),
            source: io::Error::from_raw_os_error(rc),
        });
    }
    Ok(attr)
}

pub(crate) fn mtu_enum(bytes: u32) -> ffi::ibv_mtu {
    match bytes {
        0..=256 => ffi::IBV_MTU_256,
        257..=512 => ffi::IBV_MTU_512,
        513..=1024 => ffi::IBV_MTU_1024,
        1025..=2048 => ffi::IBV_MTU_2048,
        _ => ffi::IBV_MTU_4096,
    }
}

/// Creates a queue pair on `pd` with `init`.
pub(crate) fn create_qp(
    pd: &ProtectionDomain,
    init: &mut ffi::ibv_qp_init_attr,
) -> Result<NonNull<ffi::ibv_qp>, Error> {
    // SAFETY: the PD (and the CQs `init` names) are alive; `init` is a
    // valid attribute set, and the call writes the granted caps back.
    let qp = unsafe { ffi::ibv_create_qp(pd.raw(), init) };
    NonNull::new(qp).ok_or_else(|| Error::Verbs {
        call: "ibv_create_qp",
        device: pd.context().name().to_string(),
        source: io::Error::last_os_error(),
    })
}

/// Moves `qp` to another state; a failure names the transition, the
/// attributes it set, and the likely cause where one is known.
pub(crate) fn modify_qp(
    qp: NonNull<ffi::ibv_qp>,
    attr: &mut ffi::ibv_qp_attr,
    mask: ffi::ibv_qp_attr_mask,
    to: &'static str,
    attrs: &'static str,
) -> Result<(), Error> {
    // SAFETY: the caller's queue pair is live; `attr` holds the fields
    // `mask` names.
    let rc = unsafe { ffi::ibv_modify_qp(qp.as_ptr(), attr, mask.0 as i32) };
    if rc == 0 {
        return Ok(());
    }
    let hint = match (to, rc) {
        ("INIT", 22) => "; EINVAL at INIT usually means a wrong port number",
        ("RTR", 22) => "; EINVAL at RTR usually means a wrong GID index or MTU for this port (RoCE needs a RoCE v2 GID, not index 0)",
        ("RTR", 110) | ("RTS", 110) => "; a timeout usually means the peer's GID is unreachable from this port",
        _ => "",
    };
    Err(Error::Transition {
        to,
        attrs,
        source: io::Error::from_raw_os_error(rc),
        hint,
    })
}

/// An address vector to `dgid` (RoCE needs the global route, and it works
/// on InfiniBand too) from local GID `sgid_index` of `port`.
pub(crate) fn global_ah_attr(
    dgid: [u8; 16],
    dlid: u16,
    port: u8,
    sgid_index: u32,
) -> ffi::ibv_ah_attr {
    ffi::ibv_ah_attr {
        dlid,
        sl: 0,
        src_path_bits: 0,
        is_global: 1,
        port_num: port,
        grh: ffi::ibv_global_route {
            dgid: ffi::ibv_gid { raw: dgid },
            flow_label: 0,
            sgid_index: u8::try_from(sgid_index).unwrap_or(0),
            hop_limit: 64,
            traffic_class: 0,
        },
        ..Default::default()
    }
}

pub(crate) struct Cq {
    pub(crate) cq: NonNull<ffi::ibv_cq>,
    /// Its completion channel, if it has one (see [`crate::events`]).
    /// Dropped after `Drop::drop` destroyed the CQ: the channel goes last.
    pub(crate) events: Option<CompChannel>,
}

impl Cq {
    /// A completion queue of at least `entries` entries, with a completion
    /// channel of its own if `events`.
    pub(crate) fn new(ctx: &crate::Context, entries: u32, events: bool) -> Result<Cq, Error> {
        let cqe = i32::try_from(entries).unwrap_or(i32::MAX);
        let events = if events {
            Some(CompChannel::new(ctx)?)
        } else {
            None
        };
        let channel = events
            .as_ref()
            .map_or(std::ptr::null_mut(), CompChannel::raw);
        // SAFETY: the context is open; the channel, if any, is live and
        // outlives the CQ (see `events`); no context pointer.
        let cq = unsafe { ffi::ibv_create_cq(ctx.raw(), cqe, std::ptr::null_mut(), channel, 0) };
        match NonNull::new(cq) {
            Some(cq) => Ok(Cq { cq, events }),
            None => Err(Error::Verbs {
                call: "ibv_create_cq",
                device: ctx.name().to_string(),
                source: io::Error::last_os_error(),
            }),
        }
    }

    /// Polls up to `wcs.len()` completions into `wcs`; returns how many
    /// (the first that many entries are written), or the provider's error.
    pub(crate) fn poll(&self, wcs: &mut [MaybeUninit<ffi::ibv_wc>]) -> Result<usize, io::Error> {
        let room = i32::try_from(wcs.len()).unwrap_or(i32::MAX);
        // SAFETY: the CQ is live while `self` is (and so is its context,
        // kept open by the owner's PD); `wcs` has room for `room` entries.
        let n = unsafe {
            let ctx = self.cq.as_ref().context;
            match (*ctx).ops.poll_cq {
                Some(poll) => poll(self.cq.as_ptr(), room, wcs.as_mut_ptr().cast()),
                None => -libc_enosys(),
            }
        };
        usize::try_from(n)
            .map(|n| n.min(wcs.len()))
            .map_err(|_| io::Error::from_raw_os_error(-n))
    }
}

impl Drop for Cq {
    fn drop(&mut self) {
        // SAFETY: the CQ is ours; its QP was destroyed first (field order
        // and `QueuePair::drop`). Every event taken from its channel was
        // acknowledged at once (`Cq::take_events`), so this does not wait.
        let rc = unsafe { ffi::ibv_destroy_cq(self.cq.as_ptr()) };
        if rc != 0 {
            tracing::warn!(rc, "ibv_destroy_cq failed");
        }
    }
}

/// `wr_id`s with this bit set belong to a layer above (the scheduled
/// queue pair), which owns their buffers; [`Sink::poll`] hands their
/// completions back as they are.
pub(crate) const RAW_WR: u64 = 1 << 63;

/// `wr_id`s with this bit (and not [`RAW_WR`]) are the queue pair's own,
/// parked like the direct path's, but posted by a scheduled queue pair:
/// their completion goes to `out` with the request's length, and [`Sink::poll`]
/// also reports a raw completion with `wr_id` [`PARKED_DONE`] so the
/// scheduler counts the piece as finished.
pub(crate) const SCHED_WR: u64 = 1 << 62;

/// The raw completion that says one of the [`SCHED_WR`] requests finished.
pub(crate) const PARKED_DONE: u64 = RAW_WR | SCHED_WR;

/// A completion of a raw work request.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RawCompletion {
    pub(crate) wr_id: u64,
    pub(crate) status: WcStatus,
}

/// Where a raw send's data lives and goes.
pub(crate) struct RawSend {
    pub(crate) wr_id: u64,
    pub(crate) opcode: ffi::ibv_wr_opcode::Type,
    pub(crate) sge: ffi::ibv_sge,
    pub(crate) remote: Option<(u64, u32)>,
    pub(crate) imm: Option<u32>,
}

/// A buffer a work request may use: a [`MemoryRegion`] on a device, a
/// plain heap buffer on the host (benches and tests, see
/// [`crate::bench`]). It is moved into the queue pair while the NIC may
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
    fn complete(
        self,
        context: u64,
        status: WcStatus,
        opcode: Opcode,
        byte_len: u32,
        imm: Option<u32>,
    ) -> Self::Completion;
}

impl Region for MemoryRegion {
    type Completion = Completion;

    fn len(&self) -> usize {
        MemoryRegion::len(self)
    }

    fn sge(&self, range: &Range<usize>) -> Option<ffi::ibv_sge> {
        MemoryRegion::sge(self, range)
    }

    fn complete(
        self,
        context: u64,
        status: WcStatus,
        opcode: Opcode,
        byte_len: u32,
        imm: Option<u32>,
    ) -> Completion {
        Completion {
            context,
            status,
            opcode,
            byte_len,
            imm,
            region: self,
        }
    }
}

/// A work request in flight: its region stays here until it completes.
pub(crate) struct Slot<R> {
    context: u64,
    region: R,
    send: bool,
    /// Bytes of a send (reported for [`SCHED_WR`] requests).
    len: u32,
}

/// A queue pair's own bookkeeping, apart from the device: the regions of
/// its work requests in flight, parked under their `wr_id`s, and the
/// number of requests in each queue.
pub(crate) struct Books<R> {
    slots: Slab<Slot<R>>,
    pub(crate) sends_in_flight: u32,
    pub(crate) recvs_in_flight: u32,
    pub(crate) max_send_wr: u32,
    pub(crate) max_recv_wr: u32,
}

/// One work completion as the device reported it.
pub(crate) struct Wc {
    pub(crate) wr_id: u64,
    pub(crate) status: WcStatus,
    pub(crate) opcode: ffi::ibv_wc_opcode::Type,
    pub(crate) byte_len: u32,
    /// Immediate data, in network order.
    pub(crate) imm: Option<u32>,
}

impl<R: Region> Books<R> {
    pub(crate) fn new(max_send_wr: u32, max_recv_wr: u32) -> Self {
        Books {
            slots: Slab::default(),
            sends_in_flight: 0,
            recvs_in_flight: 0,
            max_send_wr,
            max_recv_wr,
        }
    }

    fn park(&mut self, slot: Slot<R>) -> usize {
        self.slots.insert(slot)
    }

    fn unpark(&mut self, i: usize) -> Option<Slot<R>> {
        self.slots.remove(i)
    }

    /// Work requests in flight, both queues.
    pub(crate) fn outstanding(&self) -> u32 {
        self.sends_in_flight + self.recvs_in_flight
    }

    /// Takes every parked region out (teardown).
    pub(crate) fn drain_regions(&mut self) -> impl Iterator<Item = R> + '_ {
        self.slots.drain().map(|slot| slot.region)
    }

    /// Matches one completion to its work request: a raw one goes to
    /// `raw` as it is; one of the queue pair's own hands its parked
    /// region back in `out`.
    pub(crate) fn complete(
        &mut self,
        wc: Wc,
        out: &mut Vec<R::Completion>,
        raw: &mut Vec<RawCompletion>,
    ) {
        if wc.wr_id & RAW_WR != 0 {
            self.sends_in_flight -= 1;
            raw.push(RawCompletion {
                wr_id: wc.wr_id,
                status: wc.status,
            });
            return;
        }
        let sched = wc.wr_id & SCHED_WR != 0;
        let Some(slot) = usize::try_from(wc.wr_id & !SCHED_WR)
            .ok()
            .and_then(|i| self.unpark(i))
        else {
            tracing::error!(wr_id = wc.wr_id, "completion for an unknown work request");
            return;
        };
        if slot.send {
            self.sends_in_flight -= 1;
        } else {
            self.recvs_in_flight -= 1;
        }
        let opcode = if !wc.status.is_success() {
            Opcode::Unknown
        } else {
            use ffi::ibv_wc_opcode as o;
            match wc.opcode {
                o::IBV_WC_SEND => Opcode::Send,
                o::IBV_WC_RDMA_WRITE => Opcode::Write,
                o::IBV_WC_RDMA_READ => Opcode::Read,
                o::IBV_WC_RECV => Opcode::Recv,
                o::IBV_WC_RECV_RDMA_WITH_IMM => Opcode::RecvWithImm,
                _ => Opcode::Unknown,
            }
        };
        // A scheduled request reports its own length, as the scheduler
        // does for the requests it splits.
        let byte_len = if sched { slot.len } else { wc.byte_len };
        out.push(slot.region.complete(
            slot.context,
            wc.status,
            opcode,
            byte_len,
            wc.imm.map(u32::from_be),
        ));
        if sched {
            raw.push(RawCompletion {
                wr_id: PARKED_DONE,
                status: wc.status,
            });
        }
    }
}

/// The verbs work request for `raw`, its scatter list in `sge`.
pub(crate) fn send_wr(raw: &RawSend, sge: &mut ffi::ibv_sge) -> ffi::ibv_send_wr {
    let mut wr = ffi::ibv_send_wr {
        wr_id: raw.wr_id,
        next: std::ptr::null_mut(),
        sg_list: sge,
        num_sge: i32::from(sge.length > 0),
        opcode: raw.opcode,
        send_flags: ffi::ibv_send_flags::IBV_SEND_SIGNALED.0,
        // SAFETY: all-zero is a valid value of this plain C struct.
        ..unsafe { MaybeUninit::zeroed().assume_init() }
    };
    if let Some(imm) = raw.imm {
        wr.__bindgen_anon_1.imm_data = imm.to_be();
    }
    if let Some((remote_addr, rkey)) = raw.remote {
        wr.wr.rdma = ffi::ibv_send_wr__bindgen_ty_2__bindgen_ty_1 { remote_addr, rkey };
    }
    wr
}

/// Where a queue pair's send-side work requests go: the device's send
/// queue ([`QueuePair`]), or a null sink on the host (benches and tests,
/// see [`crate::bench`]). Everything up to the device's `post_send` and
/// after its `poll_cq` is the same code for both.
pub(crate) trait Sink: Send + 'static {
    /// The buffers its work requests use.
    type Region: Region;

    /// The queue pair number.
    fn qpn(&self) -> u32;

    /// Its bookkeeping.
    fn books(&self) -> &Books<Self::Region>;

    /// Its bookkeeping, to change.
    fn books_mut(&mut self) -> &mut Books<Self::Region>;

    /// Hands one work request to the device (`ibv_post_send`).
    ///
    /// # Safety
    /// The memory `wr`'s scatter list names must stay valid and untouched
    /// by safe code until the request's completion is polled (or the queue
    /// pair is destroyed after being drained).
    unsafe fn post_wr(&mut self, wr: &mut ffi::ibv_send_wr) -> Result<(), Error>;

    /// Polls up to 32 completions: those of its own work requests into
    /// `out`, raw ones (see [`RAW_WR`]) into `raw`.
    fn poll(
        &mut self,
        out: &mut Vec<<Self::Region as Region>::Completion>,
        raw: &mut Vec<RawCompletion>,
    ) -> Result<usize, Error>;

    /// Flushes every outstanding request, waits for them, and destroys the
    /// queue pair. Returns whether everything was drained: only then may
    /// the buffers of raw requests be freed. Runs once; later calls return
    /// the first answer.
    fn shutdown(&mut self) -> bool;

    /// [`Error::NoCompletionEvents`] unless it can be waited for (see
    /// [`crate::events`]).
    fn check_events(&self) -> Result<(), Error>;

    /// Asks for an event at its next completion; says what to sleep on
    /// until then.
    fn arm_events(&mut self) -> Result<Armed, Error>;

    /// Takes and acknowledges the completion events that arrived.
    fn take_events(&mut self) -> Result<(), Error>;

    /// Polls completions of its own (not raw) work requests into `out`:
    /// the direct path's poll.
    fn poll_own(
        &mut self,
        out: &mut Vec<<Self::Region as Region>::Completion>,
    ) -> Result<usize, Error> {
        let mut raw = Vec::new();
        let n = self.poll(out, &mut raw)?;
        debug_assert!(
            raw.is_empty(),
            "raw work requests are polled by their owner"
        );
        Ok(n)
    }

    /// The tenant it was created for, if any.
    fn tenant(&self) -> Option<&TenantHandle>;

    /// Whether the send queue has room for another request.
    fn send_room(&self) -> u32 {
        let books = self.books();
        books.max_send_wr.saturating_sub(books.sends_in_flight)
    }

    /// Posts one send-side work request.
    ///
    /// # Safety
    /// The memory `raw.sge` names must stay valid and untouched by safe
    /// code until the request's completion is polled (or the queue pair is
    /// destroyed after being drained).
    #[inline]
    unsafe fn post(&mut self, raw: RawSend) -> Result<(), Error> {
        let books = self.books();
        if books.sends_in_flight >= books.max_send_wr {
            return Err(Error::SendQueueFull {
                depth: books.max_send_wr,
            });
        }
        let mut sge = raw.sge;
        let mut wr = send_wr(&raw, &mut sge);
        // SAFETY: `wr` and `sge` outlive the call (the device copies them
        // into its send queue); the caller keeps the buffer alive until
        // the completion.
        unsafe { self.post_wr(&mut wr) }?;
        self.books_mut().sends_in_flight += 1;
        Ok(())
    }

    /// Posts a send-side operation on `range` of `region`, parking the
    /// region under the request's `wr_id` until its completion is polled;
    /// on refusal the region comes back with the error.
    fn post_parked(
        &mut self,
        op: SendOp,
        region: Self::Region,
        range: Range<usize>,
        context: u64,
    ) -> Result<(), (Error, Self::Region)> {
        let sge = match check_send(op, &region, &range) {
            Ok(sge) => sge,
            Err(error) => return Err((error, region)),
        };
        self.park_and_post(op, region, sge, context, 0)
    }

    /// [`post_parked`](Self::post_parked) of a request `check_send` found
    /// to be `sge`, its `wr_id` marked with `flag` (0 or [`SCHED_WR`]).
    #[inline]
    fn park_and_post(
        &mut self,
        op: SendOp,
        region: Self::Region,
        sge: ffi::ibv_sge,
        context: u64,
        flag: u64,
    ) -> Result<(), (Error, Self::Region)> {
        let books = self.books_mut();
        if books.sends_in_flight >= books.max_send_wr {
            let depth = books.max_send_wr;
            return Err((Error::SendQueueFull { depth }, region));
        }
        let (opcode, remote, imm) = op.lower(true);
        let slot = books.park(Slot {
            context,
            region,
            send: true,
            len: sge.length,
        });
        let raw = RawSend {
            wr_id: slot as u64 | flag,
            opcode,
            sge,
            remote: remote.map(|r| (r.addr, r.rkey)),
            imm,
        };
        // SAFETY: the buffer `sge` points at is owned by the slot just
        // parked and stays there until the completion is polled.
        if let Err(error) = unsafe { self.post(raw) } {
            let slot = self.books_mut().unpark(slot).expect("just parked");
            return Err((error, slot.region));
        }
        Ok(())
    }
}

/// A connected reliable queue pair.
///
/// Posting moves the region into the queue pair; [`poll`](Self::poll)
/// returns it in the completion. Dropping the queue pair with work in flight
/// moves it to the error state, waits for every request to be flushed, and
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
}

// SAFETY: the queue pair owns its verbs objects and in-flight regions;
// moving it to another thread moves all of it. It is not Sync: posting and
// polling take `&mut self`.
unsafe impl Send for QueuePair {}

impl fmt::Debug for QueuePair {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QueuePair")
            .field("qpn", &self.qpn())
            .field("sends_in_flight", &self.books.sends_in_flight)
            .field("recvs_in_flight", &self.books.recvs_in_flight)
            .finish()
    }
}

impl QueuePair {
    /// The queue pair number.
    pub fn qpn(&self) -> u32 {
        // SAFETY: `qp` is live while `self` is.
        unsafe { self.qp.as_ref().qp_num }
    }

    /// Work requests posted and not yet polled (send, receive).
    pub fn in_flight(&self) -> (u32, u32) {
        (self.books.sends_in_flight, self.books.recvs_in_flight)
    }

    fn modify(
        &self,
        attr: &mut ffi::ibv_qp_attr,
        mask: ffi::ibv_qp_attr_mask,
        to: &'static str,
        attrs: &'static str,
    ) -> Result<(), Error> {
        modify_qp(self.qp, attr, mask, to, attrs)
    }

    /// Posts a send-side operation on `range` of `region`. The region is
    /// the queue pair's until its completion is polled; on refusal it comes
    /// back in the [`PostError`].
    pub fn post_send(
        &mut self,
        op: SendOp,
        region: MemoryRegion,
        range: Range<usize>,
        context: u64,
    ) -> Result<(), PostError> {
        self.post_parked(op, region, range, context)
            .map_err(PostError::new)
    }

    /// Posts a receive into `range` of `region`.
    pub fn post_recv(
        &mut self,
        region: MemoryRegion,
        range: Range<usize>,
        context: u64,
    ) -> Result<(), PostError> {
        let refuse = |error, region| Err(PostError::new((error, region)));
        let Some(mut sge) = region.sge(&range) else {
            let len = region.len();
            return refuse(Error::LocalRangeOutOfBounds { range, len }, region);
        };
        if self.books.recvs_in_flight >= self.books.max_recv_wr {
            return refuse(
                Error::RecvQueueFull {
                    depth: self.books.max_recv_wr,
                },
                region,
            );
        }
        let slot = self.books.park(Slot {
            context,
            region,
            send: false,
            len: 0,
        });
        let mut wr = ffi::ibv_recv_wr {
            wr_id: slot as u64,
            next: std::ptr::null_mut(),
            sg_list: &mut sge,
            num_sge: i32::from(sge.length > 0),
        };
        let mut bad = std::ptr::null_mut();
        // SAFETY: as for `post_send`: the buffer stays parked until polled.
        let rc = unsafe {
            let ctx = self.qp.as_ref().context;
            match (*ctx).ops.post_recv {
                Some(post) => post(self.qp.as_ptr(), &mut wr, &mut bad),
                None => libc_enosys(),
            }
        };
        if rc != 0 {
            let slot = self.books.unpark(slot).expect("just parked");
            return refuse(
                Error::Verbs {
                    call: "ibv_post_recv",
                    device: self.pd.context().name().to_string(),
                    source: io::Error::from_raw_os_error(rc),
                },
                slot.region,
            );
        }
        self.books.recvs_in_flight += 1;
        Ok(())
    }

    /// Polls up to 32 completions into `out`; returns how many.
    pub fn poll(&mut self, out: &mut Vec<Completion>) -> Result<usize, Error> {
        self.poll_own(out)
    }

    /// Polls; if nothing has completed, sleeps until something does or
    /// `timeout` runs out, without spinning. Returns how many completions
    /// it added to `out` (0: the timeout ran out). An interrupted sleep
    /// goes on for the time that remains.
    ///
    /// The queue pair must be built with
    /// [`completion_events(true)`](QueuePairBuilder::completion_events);
    /// otherwise this returns [`Error::NoCompletionEvents`]. While one
    /// thread sleeps here, the CPU is free for others: a machine with a
    /// few cores can host many tenants that wait rather than spin.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use mtrdma_verbs::{Access, Context, SendOp};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let ctx = Context::open_first_active()?;
    /// let pd = ctx.alloc_pd()?;
    /// let a = pd.queue_pair().completion_events(true).build()?;
    /// let b = pd.queue_pair().build()?;
    /// let (ea, eb) = (a.endpoint(), b.endpoint());
    /// let (mut a, _b) = (a.connect(&eb)?, b.connect(&ea)?);
    ///
    /// let target = pd.allocate(4096, Access::REMOTE_READ_WRITE)?;
    /// let src = pd.allocate(4096, Access::LOCAL)?;
    /// a.post_send(SendOp::Write(target.remote().unwrap()), src, 0..4096, 1)?;
    /// let mut done = Vec::new();
    /// while done.is_empty() {
    ///     // Sleeps until the WRITE completes (checking every second).
    ///     a.poll_wait(&mut done, Duration::from_secs(1))?;
    /// }
    /// assert!(done[0].status.is_success());
    /// # Ok(())
    /// # }
    /// ```
    pub fn poll_wait(
        &mut self,
        out: &mut Vec<Completion>,
        timeout: Duration,
    ) -> Result<usize, Error> {
        crate::events::poll_wait(self, out, timeout)
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
    /// completes with [`WcStatus::Flushed`] (or its real error).
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
}

pub(crate) fn libc_enosys() -> i32 {
    38
}

impl Sink for QueuePair {
    type Region = MemoryRegion;

    fn qpn(&self) -> u32 {
        QueuePair::qpn(self)
    }

    fn tenant(&self) -> Option<&TenantHandle> {
        self._permit.as_ref().map(OwnedQpPermit::handle)
    }

    fn books(&self) -> &Books<MemoryRegion> {
        &self.books
    }

    fn books_mut(&mut self) -> &mut Books<MemoryRegion> {
        &mut self.books
    }

    unsafe fn post_wr(&mut self, wr: &mut ffi::ibv_send_wr) -> Result<(), Error> {
        if wr.num_sge == 1 && wr.opcode != ffi::ibv_wr_opcode::IBV_WR_RDMA_READ {
            // SAFETY: `num_sge` is 1, so `sg_list` points at one valid sge.
            let len = unsafe { (*wr.sg_list).length };
            if len <= self.max_inline {
                // Copied into the request now; the region is not read later.
                wr.send_flags |= ffi::ibv_send_flags::IBV_SEND_INLINE.0;
            }
        }
        let mut bad = std::ptr::null_mut();
        // SAFETY: the QP is live; `wr` and its scatter list outlive the
        // call (the provider copies them into the send queue); the caller
        // keeps the buffer alive until the completion.
        let rc = unsafe {
            let ctx = self.qp.as_ref().context;
            match (*ctx).ops.post_send {
                Some(post) => post(self.qp.as_ptr(), wr, &mut bad),
                None => libc_enosys(),
            }
        };
        if rc != 0 {
            return Err(Error::Verbs {
                call: "ibv_post_send",
                device: self.pd.context().name().to_string(),
                source: io::Error::from_raw_os_error(rc),
            });
        }
        Ok(())
    }

    fn poll(
        &mut self,
        out: &mut Vec<Completion>,
        raw: &mut Vec<RawCompletion>,
    ) -> Result<usize, Error> {
        // Not zeroed: the provider writes the entries it returns, and a
        // busy poll that finds nothing should cost nothing but the call.
        let mut wcs = [const { MaybeUninit::<ffi::ibv_wc>::uninit() }; 32];
        // SAFETY: the CQ is live; `wcs` has room for 32 entries.
        let n = unsafe {
            let ctx = self.qp.as_ref().context;
            match (*ctx).ops.poll_cq {
                Some(poll) => poll(self.cq.cq.as_ptr(), 32, wcs.as_mut_ptr().cast()),
                None => -libc_enosys(),
            }
        };
        if n < 0 {
            return Err(Error::Verbs {
                call: "ibv_poll_cq",
                device: self.pd.context().name().to_string(),
                source: io::Error::from_raw_os_error(-n),
            });
        }
        let n = (n as usize).min(wcs.len());
        for wc in &wcs[..n] {
            // SAFETY: `ibv_poll_cq` wrote the first `n` entries.
            let wc = unsafe { wc.assume_init_ref() };
            let status = wc
                .error()
                .map_or(WcStatus::Success, |(s, _)| WcStatus::from_raw(s));
            let wc = Wc {
                wr_id: wc.wr_id(),
                status,
                opcode: wc.opcode(),
                byte_len: u32::try_from(wc.len()).unwrap_or(u32::MAX),
                imm: wc.imm_data(),
            };
            self.books.complete(wc, out, raw);
        }
        Ok(n)
    }

    fn shutdown(&mut self) -> bool {
        if self.destroyed {
            return self.books.outstanding() == 0;
        }
        let outstanding = self.books.outstanding();
        if outstanding > 0 {
            let _ = self.set_error();
            let deadline = Instant::now() + Duration::from_secs(5);
            let (mut sink, mut raw) = (Vec::new(), Vec::new());
            while self.books.outstanding() > 0 && Instant::now() < deadline {
                if Sink::poll(self, &mut sink, &mut raw).is_err() {
                    break;
                }
                sink.clear();
                raw.clear();
            }
        }
        let drained = self.books.outstanding() == 0;
        tracing::debug!(outstanding, drained, "destroying queue pair");
        // SAFETY: the QP is ours and destroyed once (guarded by
        // `destroyed`), before its CQ.
        let rc = unsafe { ffi::ibv_destroy_qp(self.qp.as_ptr()) };
        self.destroyed = true;
        if rc != 0 || !drained {
            // The NIC may still reach the buffers: never free them.
            tracing::error!(
                rc,
                drained,
                "queue pair teardown incomplete; leaking in-flight buffers"
            );
            for region in self.books.drain_regions() {
                std::mem::forget(region);
            }
            return false;
        }
        true
    }

    fn check_events(&self) -> Result<(), Error> {
        self.cq.check_events()
    }

    fn arm_events(&mut self) -> Result<Armed, Error> {
        self.cq.arm().map_err(|e| self.verbs_error(e))
    }

    fn take_events(&mut self) -> Result<(), Error> {
        self.cq
            .take_events()
            .map(drop)
            .map_err(|e| self.verbs_error(e))
    }
}

impl Waitable for QueuePair {
    type Item = Completion;

    fn poll(&mut self, out: &mut Vec<Completion>) -> Result<usize, Error> {
        self.poll_own(out)
    }

    fn check_events(&mut self) -> Result<(), Error> {
        Sink::check_events(self)
    }

    fn arm(&mut self) -> Result<Armed, Error> {
        self.arm_events()
    }

    fn take_events(&mut self) -> Result<(), Error> {
        Sink::take_events(self)
    }
}

impl Drop for QueuePair {
    fn drop(&mut self) {
        Sink::shutdown(self);
    }
}
