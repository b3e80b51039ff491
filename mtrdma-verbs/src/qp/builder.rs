//! Building a queue pair: its settings, its creation on the device and its
//! connection to a peer.

use super::*;

/// How to build a queue pair (see [`ProtectionDomain::queue_pair`]).
#[derive(Debug)]
pub struct QueuePairBuilder<'a> {
    pd: &'a ProtectionDomain,
    settings: QpSettings,
    access: Access,
    max_inline: u32,
    retries: Retries,
    srq: Option<SharedReceiveQueue>,
}

/// How a connected queue pair retries, set by the builder
/// ([`QueuePairBuilder::ack_timeout`], [`QueuePairBuilder::retry_count`],
/// [`QueuePairBuilder::rnr_retry`], [`QueuePairBuilder::min_rnr_timer`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Retries {
    /// Local ACK timeout exponent: 4.096 us x 2^`ack_timeout`.
    ack_timeout: u8,
    /// Transport retries after an ACK timeout (0 to 7).
    retry_count: u8,
    /// Retries after the peer answered "receiver not ready" (0 to 6; 7,
    /// which retries for ever, is never set).
    rnr_retry: u8,
    /// What this queue pair asks a sender to wait before retrying a SEND
    /// it had no receive for (the IB code, 0 to 31).
    min_rnr_timer: u8,
}

impl Default for Retries {
    fn default() -> Retries {
        Retries {
            // 4.096 us x 2^14, about 67 ms.
            ack_timeout: 14,
            retry_count: 7,
            rnr_retry: 6,
            // 0.64 ms.
            min_rnr_timer: 12,
        }
    }
}

/// The most RNR retries a queue pair makes: the verbs' 7 means for ever,
/// and a peer that never posts a receive would then keep the queue pair's
/// SENDs, and everything queued behind them, in the NIC for good.
pub const MAX_RNR_RETRY: u8 = 6;

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
    /// Scatter entries per send work request: the most regions a gather
    /// request may name.
    pub(crate) max_send_sge: u32,
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
            max_send_sge: 1,
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
    pub(crate) max_send_sge: u32,
    /// The device's attributes, read once for the checks here and the
    /// builder's own.
    pub(crate) attrs: ffi::ibv_device_attr,
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
        // Depths the device cannot take are refused here, with their
        // names, rather than by the provider (or by an overflow adding
        // them up for the completion queue).
        let attrs = device_attrs(ctx)?;
        let too_deep = |what, asked: u64, max: i32| {
            let max = u64::try_from(max).unwrap_or(0);
            (asked > max).then(|| Error::QueueTooDeep {
                device: ctx.name().to_string(),
                what,
                asked,
                max,
            })
        };
        let (send, recv) = (u64::from(self.max_send_wr), u64::from(self.max_recv_wr));
        for (what, asked, max) in [
            ("max_send_wr", send, attrs.max_qp_wr),
            ("max_recv_wr", recv, attrs.max_qp_wr),
            ("the completion queue's entries", send + recv, attrs.max_cqe),
        ] {
            if let Some(e) = too_deep(what, asked, max) {
                return Err(e);
            }
        }
        let max_sge = u32::try_from(attrs.max_sge).unwrap_or(0);
        if self.max_send_sge > max_sge {
            return Err(Error::TooManySges {
                device: ctx.name().to_string(),
                asked: self.max_send_sge,
                max: max_sge,
            });
        }
        Ok(QpStart {
            permit,
            device: ctx.name().to_string(),
            port_num: self.port,
            port: ctx.port(self.port)?,
            gid: ctx.select_gid(self.port, self.gid)?,
            max_send_wr: self.max_send_wr,
            max_recv_wr: self.max_recv_wr,
            events: self.events,
            max_send_sge: self.max_send_sge,
            attrs,
        })
    }
}

/// Checks that `srq`, if any, may serve a queue pair on `pd`: of the same
/// protection domain, and built for its transport (`datagrams` for UD).
pub(crate) fn check_srq(
    srq: Option<&SharedReceiveQueue>,
    pd: &ProtectionDomain,
    datagrams: bool,
) -> Result<(), Error> {
    let Some(srq) = srq else {
        return Ok(());
    };
    if srq.pd().raw() != pd.raw() {
        return Err(Error::ForeignObject {
            what: "shared receive queue",
            with: "queue pair",
            scope: "protection domain",
        });
    }
    if srq.datagrams() != datagrams {
        let (srq, qp) = if datagrams {
            ("RC", "UD")
        } else {
            ("UD", "RC")
        };
        return Err(Error::SrqTransport { srq, qp });
    }
    Ok(())
}

/// A queue pair's receive queue depth and the completion queue entries
/// its receives take: with an SRQ it has no receive queue, and its
/// completion queue holds the receives it may take from the SRQ.
pub(crate) fn recv_depths(srq: Option<&SharedReceiveQueue>, max_recv_wr: u32) -> (u32, u32) {
    match srq {
        Some(srq) => (0, srq.max_wr()),
        None => (max_recv_wr, max_recv_wr),
    }
}

/// The entries of a queue pair's own completion queue: one per request
/// it lets in flight (`send` and `recv`, its own limits, not the
/// provider's possibly larger caps); refused if the device takes fewer.
pub(crate) fn cq_entries(
    device: &str,
    attrs: &ffi::ibv_device_attr,
    send: u32,
    recv: u32,
) -> Result<u32, Error> {
    let entries = u64::from(send) + u64::from(recv);
    let max = u64::try_from(attrs.max_cqe).unwrap_or(0);
    if entries > max {
        return Err(Error::QueueTooDeep {
            device: device.to_string(),
            what: "the completion queue's entries",
            asked: entries,
            max,
        });
    }
    Ok(entries as u32)
}

/// The creation attributes of a queue pair of `qp_type` with `cap`, both
/// its queues completing on `cq`, receiving from `srq` if any, and each
/// request asking for its completion or not (`Sink::post_list`).
pub(crate) fn qp_init_attr(
    cq: &Cq,
    srq: Option<&SharedReceiveQueue>,
    qp_type: ffi::ibv_qp_type::Type,
    cap: ffi::ibv_qp_cap,
) -> ffi::ibv_qp_init_attr {
    ffi::ibv_qp_init_attr {
        send_cq: cq.cq.as_ptr(),
        recv_cq: cq.cq.as_ptr(),
        srq: srq.map_or(std::ptr::null_mut(), SharedReceiveQueue::raw),
        qp_type,
        sq_sig_all: 0,
        cap,
        ..Default::default()
    }
}

/// The setters both queue pair builders have, on their `settings` and
/// `srq`; those whose meaning differs between them with the documentation
/// given.
macro_rules! qp_settings_setters {
    (
        $(#[$recv:meta])* max_recv_wr;
        $(#[$srq:meta])* srq;
        $(#[$tenant:meta])* tenant;
    ) => {
        $(#[$recv])*
        pub fn max_recv_wr(mut self, n: u32) -> Self {
            self.settings.max_recv_wr = n.max(1);
            self
        }

        $(#[$srq])*
        pub fn srq(mut self, srq: &SharedReceiveQueue) -> Self {
            self.srq = Some(srq.clone());
            self
        }

        $(#[$tenant])*
        pub fn tenant(mut self, tenant: &TenantHandle) -> Self {
            self.settings.tenant = Some(tenant.clone());
            self
        }

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

        /// How many regions one send-side request may name: the
        /// scatter/gather entries of each send work request (default 1; 0
        /// is taken as 1). A gather request (`post_send_gather`) may name
        /// up to this many. Creation fails with
        /// [`Error::TooManySges`](crate::Error::TooManySges) if the device
        /// allows fewer (its `max_sge` attribute).
        pub fn max_send_sge(mut self, n: u32) -> Self {
            self.settings.max_send_sge = n.max(1);
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
            retries: Retries::default(),
            srq: None,
        }
    }
}

impl QueuePairBuilder<'_> {
    qp_settings_setters! {
        /// Receive queue depth (default 128; not used with
        /// [`srq`](Self::srq)).
        max_recv_wr;
        /// Receives from `srq` instead of a receive queue of its own: posting
        /// a receive to the queue pair is then refused
        /// ([`Error::ReceivesFromSrq`]), and the receives it takes from the
        /// shared queue come back through its polls (or its shared completion
        /// queue's). The shared queue must be of the same protection domain,
        /// and built for RC (not [`datagrams`](crate::SharedReceiveQueueBuilder::datagrams)).
        srq;
        /// The tenant the queue pair belongs to: creation is admitted against
        /// its quota (count and creation rate) and the queue pair gives its
        /// place back when dropped.
        tenant;
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

    /// How long a sent packet waits for its acknowledgement before it is
    /// sent again: 4.096 us x 2^`exp` (default 14, about 67 ms; at most
    /// 31, larger values are taken as 31; 0 waits forever). A queue pair
    /// that keeps megabytes queued in front of a slow link (a bulk sender
    /// without a window) needs more than its queue's delay, or it resends
    /// what is still queued and its throughput collapses.
    pub fn ack_timeout(mut self, exp: u8) -> Self {
        self.retries.ack_timeout = exp.min(31);
        self
    }

    /// How many times a packet that timed out is sent again before its
    /// request fails with [`WcStatus::RetryExceeded`] and the queue pair
    /// goes to the error state (default 7, the most; larger values are
    /// taken as 7). With [`ack_timeout`](Self::ack_timeout) it bounds how
    /// long a dead peer holds this queue pair's requests: `(count + 1) x`
    /// the timeout.
    pub fn retry_count(mut self, count: u8) -> Self {
        self.retries.retry_count = count.min(7);
        self
    }

    /// How many times a SEND the peer had no receive for ("receiver not
    /// ready") is sent again before it fails with
    /// [`WcStatus::RnrRetryExceeded`] (default and most
    /// [`MAX_RNR_RETRY`], 6; larger values are taken as 6). The verbs'
    /// "retry for ever" is not offered: a peer that never posts receives
    /// would keep this queue pair's SENDs, and the requests behind them,
    /// in the NIC for good. How long each retry waits is the peer's to say
    /// (its [`min_rnr_timer`](Self::min_rnr_timer)); a queue pair that
    /// sends to a slow receiver should raise the receiver's timer rather
    /// than retry for ever.
    pub fn rnr_retry(mut self, count: u8) -> Self {
        self.retries.rnr_retry = count.min(MAX_RNR_RETRY);
        self
    }

    /// How long a peer whose SEND found no receive here waits before
    /// sending it again, as the verbs' 5-bit code (default 12, 0.64 ms;
    /// 14 is 1.28 ms, 18 is 5.12 ms, 22 is 20.48 ms, 26 is 81.92 ms, 31 is
    /// 491.52 ms, and 0 is 655.36 ms; larger values are taken as 31).
    /// Raise it where receives are posted slowly, so that the peer's
    /// bounded retries ([`rnr_retry`](Self::rnr_retry)) span the wait.
    pub fn min_rnr_timer(mut self, code: u8) -> Self {
        self.retries.min_rnr_timer = code.min(31);
        self
    }

    /// Creates the queue pair and moves it to INIT. Connect it with
    /// [`PreparedQueuePair::connect`] once the peer's [`Endpoint`] is known.
    pub fn build(self) -> Result<PreparedQueuePair, Error> {
        self.build_on(None)
    }

    /// The protection domain it is built on.
    pub(crate) fn pd(&self) -> &ProtectionDomain {
        self.pd
    }

    /// The shared receive queue it receives from, if any.
    pub(crate) fn shared_rq(&self) -> Option<&SharedReceiveQueue> {
        self.srq.as_ref()
    }

    /// The depths of its own queues (send, receive; no receive queue with
    /// an SRQ).
    pub(crate) fn depths(&self) -> (u32, u32) {
        let recv = if self.srq.is_some() {
            0
        } else {
            self.settings.max_recv_wr
        };
        (self.settings.max_send_wr, recv)
    }

    /// [`build`](Self::build), on the completion queue `shared` (a shared
    /// completion queue's, which polls it) or on one of its own.
    pub(crate) fn build_on(self, shared: Option<&Cq>) -> Result<PreparedQueuePair, Error> {
        check_srq(self.srq.as_ref(), self.pd, false)?;
        let QpStart {
            permit,
            device,
            port_num,
            port,
            gid,
            max_send_wr,
            max_recv_wr,
            events,
            max_send_sge,
            attrs,
            ..
        } = self.settings.begin(self.pd)?;
        let (max_recv_wr, recv_cqe) = recv_depths(self.srq.as_ref(), max_recv_wr);
        let cq = match shared {
            Some(cq) => cq.member(),
            None => {
                let entries = cq_entries(&device, &attrs, max_send_wr, recv_cqe)?;
                Cq::new(self.pd.context(), entries, events)?
            }
        };
        let cap = ffi::ibv_qp_cap {
            max_send_wr,
            max_recv_wr,
            max_send_sge,
            max_recv_sge: u32::from(self.srq.is_none()),
            max_inline_data: self.max_inline,
        };
        let mut init = qp_init_attr(&cq, self.srq.as_ref(), ffi::ibv_qp_type::IBV_QPT_RC, cap);
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
            books: Books::new(max_send_wr, max_recv_wr).with_max_send_sge(max_send_sge),
            port: port_num,
            gid_index: gid.index,
            max_inline: if self.max_inline == 0 { 0 } else { max_inline },
            destroyed: false,
            _permit: permit,
            srq: self.srq,
            windows: None,
        };
        let attr = ffi::ibv_qp_attr {
            qp_access_flags: self.access.qp_flags(),
            ..Default::default()
        };
        let flags = ffi::ibv_qp_attr_mask::IBV_QP_ACCESS_FLAGS;
        modify_to_init(
            qp.qp,
            port_num,
            attr,
            flags,
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
            retries: self.retries,
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
    retries: Retries,
}

impl PreparedQueuePair {
    /// What the peer needs to connect to this queue pair.
    pub fn endpoint(&self) -> Endpoint {
        self.endpoint
    }

    crate::macros::posting_fn! {
        /// Posts a receive before connecting (so the first SEND finds it).
        pub fn post_recv(&mut self) posts (region, range, context) {
            self.qp.post_recv(region, range, context)
        }
    }

    /// Connects to `remote`: INIT to RTR (path MTU, remote QPN and PSN,
    /// address vector with the remote GID) and RTR to RTS.
    pub fn connect(self, remote: &Endpoint) -> Result<QueuePair, Error> {
        self.ready(remote)?;
        Ok(self.qp)
    }

    /// The queue pair, to post to and tear down in place (a shared
    /// completion queue's).
    pub(crate) fn qp_mut(&mut self) -> &mut QueuePair {
        &mut self.qp
    }

    /// The queue pair.
    pub(crate) fn qp_ref(&self) -> &QueuePair {
        &self.qp
    }

    /// The queue pair, connected by [`ready`](Self::ready).
    pub(crate) fn into_qp(self) -> QueuePair {
        self.qp
    }

    /// [`connect`](Self::connect) in place: on failure the queue pair
    /// stays here, in whatever state the failed transition left it.
    pub(crate) fn ready(&self, remote: &Endpoint) -> Result<(), Error> {
        let qp = &self.qp;
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
            min_rnr_timer: self.retries.min_rnr_timer,
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
            timeout: self.retries.ack_timeout,
            retry_cnt: self.retries.retry_count,
            rnr_retry: self.retries.rnr_retry,
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
        Ok(())
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
            source: crate::error::errno(rc),
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
    NonNull::new(qp).ok_or_else(|| {
        let source = crate::error::verbs_errno();
        let ctx = pd.context();
        if init.qp_type == ffi::ibv_qp_type::IBV_QPT_UD && ctx.is_iwarp() {
            return Error::OperationUnsupported {
                device: ctx.name().to_string(),
                operation: "unreliable datagram queue pairs",
                why: "iWARP connects reliable queue pairs only",
            };
        }
        Error::Verbs {
            call: "ibv_create_qp",
            device: ctx.name().to_string(),
            source,
        }
    })
}

/// Moves `qp` to another state; a failure names the transition, the
/// attributes it set, and the likely cause where one is known.
/// Moves the new queue pair `qp` to INIT on port `port_num`, P_Key index
/// 0, with what `attr` and `mask` add (named `attrs` in errors).
pub(crate) fn modify_to_init(
    qp: NonNull<ffi::ibv_qp>,
    port_num: u8,
    mut attr: ffi::ibv_qp_attr,
    mask: ffi::ibv_qp_attr_mask,
    attrs: &'static str,
) -> Result<(), Error> {
    use ffi::ibv_qp_attr_mask as m;
    attr.qp_state = ffi::ibv_qp_state::IBV_QPS_INIT;
    attr.pkey_index = 0;
    attr.port_num = port_num;
    let mask = m::IBV_QP_STATE | m::IBV_QP_PKEY_INDEX | m::IBV_QP_PORT | mask;
    modify_qp(qp, &mut attr, mask, "INIT", attrs)
}

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
        source: crate::error::errno(rc),
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
