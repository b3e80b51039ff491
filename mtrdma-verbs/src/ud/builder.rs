//! Building a UD queue pair: its settings, admission against the
//! tenant's quota, and the GRH cells of its receives.

use super::*;

impl ProtectionDomain {
    /// Starts building a UD queue pair (with its own completion queue).
    pub fn ud_queue_pair(&self) -> UdQueuePairBuilder<'_> {
        UdQueuePairBuilder {
            pd: self,
            settings: QpSettings::default(),
            qkey: DEFAULT_QKEY,
            srq: None,
        }
    }
}

/// How to build a UD queue pair (see [`ProtectionDomain::ud_queue_pair`]).
#[derive(Debug)]
pub struct UdQueuePairBuilder<'a> {
    pd: &'a ProtectionDomain,
    settings: QpSettings,
    qkey: u32,
    srq: Option<SharedReceiveQueue>,
}

impl UdQueuePairBuilder<'_> {
    qp_settings_setters! {
        /// Receive queue depth (default 128); the queue pair registers
        /// `40 * n` bytes for the GRHs of its receives.
        max_recv_wr;
        /// Receives from `srq` (built with
        /// [`datagrams(true)`](crate::SharedReceiveQueueBuilder::datagrams),
        /// on the same protection domain) instead of a receive queue of its
        /// own: several UD queue pairs (one per server thread, say) then share
        /// one pool of receive buffers. Posting a receive to the queue pair is
        /// refused ([`Error::ReceivesFromSrq`]); the receives it takes from the
        /// shared queue come back through its polls, with their source, as
        /// its own would.
        srq;
        /// The tenant the queue pair belongs to: creation is admitted against
        /// its quota, the internal GRH buffer counts against its memory-region
        /// bytes, and both are given back when the queue pair is dropped.
        tenant;
    }

    /// The Q_Key incoming messages must carry (default [`DEFAULT_QKEY`]).
    /// Keys with the top bit set are reserved for privileged use.
    pub fn qkey(mut self, qkey: u32) -> Self {
        self.qkey = qkey;
        self
    }

    /// Creates the queue pair and moves it to INIT (P_Key index 0, port,
    /// Q_Key), RTR and RTS (a random send PSN): a UD queue pair needs no
    /// peer to be ready.
    pub fn build(self) -> Result<UdQueuePair, Error> {
        let start = self.settings.begin(self.pd)?;
        let (device, max_send_wr, max_send_sge) =
            (start.device, start.max_send_wr, start.max_send_sge);
        let ctx = self.pd.context();
        if start.attrs.max_sge < 2 {
            return Err(Error::TooFewSges {
                device,
                max_sge: start.attrs.max_sge,
            });
        }
        check_srq(self.srq.as_ref(), self.pd, true)?;
        // With an SRQ the queue pair has no GRH cells either: the SRQ has
        // them.
        let (max_recv_wr, recv_cqe) = recv_depths(self.srq.as_ref(), start.max_recv_wr);
        let grh_len = GRH_BYTES * max_recv_wr as usize;
        let grh = match (&self.settings.tenant, grh_len) {
            (_, 0) => None,
            (Some(t), _) => Some(self.pd.register_for(t, vec![0u8; grh_len], Access::LOCAL)?),
            (None, _) => Some(self.pd.allocate(grh_len, Access::LOCAL)?),
        };
        let entries = cq_entries(&device, &start.attrs, max_send_wr, recv_cqe)?;
        let cq = Cq::new(ctx, entries, start.events)?;
        let cap = ffi::ibv_qp_cap {
            max_send_wr,
            max_recv_wr,
            max_send_sge,
            max_recv_sge: if self.srq.is_some() { 0 } else { 2 },
            max_inline_data: 0,
        };
        let mut init = qp_init_attr(&cq, self.srq.as_ref(), ffi::ibv_qp_type::IBV_QPT_UD, cap);
        let qp = create_qp(self.pd, &mut init)?;
        let recv_sges = if self.srq.is_some() {
            2
        } else {
            init.cap.max_recv_sge
        };
        let qp = UdQueuePair {
            qp,
            cq,
            grh_addr: grh.as_ref().map_or(0, MemoryRegion::addr),
            grh_lkey: grh.as_ref().map_or(0, MemoryRegion::lkey),
            grh,
            free_cells: (0..max_recv_wr as usize).rev().collect(),
            books: Books::new(max_send_wr, max_recv_wr).with_max_send_sge(max_send_sge),
            port: start.port_num,
            gid_index: start.gid.index,
            gid: start.gid.gid,
            lid: start.port.lid,
            qkey: self.qkey,
            mtu: start.port.active_mtu.map_or(1024, |mtu| mtu.bytes()),
            destroyed: false,
            pd: self.pd.clone(),
            _permit: start.permit,
            srq: self.srq,
        };
        if recv_sges < 2 {
            // Dropping `qp` destroys the queue pair.
            return Err(Error::TooFewSges {
                device,
                max_sge: i32::try_from(recv_sges).unwrap_or(i32::MAX),
            });
        }
        use ffi::ibv_qp_attr_mask as m;
        let attr = ffi::ibv_qp_attr {
            qkey: self.qkey,
            ..Default::default()
        };
        modify_to_init(
            qp.qp,
            qp.port,
            attr,
            m::IBV_QP_QKEY,
            "port, P_Key index 0, Q_Key",
        )?;
        let mut attr = ffi::ibv_qp_attr {
            qp_state: ffi::ibv_qp_state::IBV_QPS_RTR,
            ..Default::default()
        };
        qp.modify(&mut attr, m::IBV_QP_STATE, "RTR", "state")?;
        let mut attr = ffi::ibv_qp_attr {
            qp_state: ffi::ibv_qp_state::IBV_QPS_RTS,
            sq_psn: random_psn(),
            ..Default::default()
        };
        qp.modify(
            &mut attr,
            m::IBV_QP_STATE | m::IBV_QP_SQ_PSN,
            "RTS",
            "send PSN",
        )?;
        tracing::debug!(%device, qpn = qp.qpn(), gid = %qp.gid, mtu = qp.mtu, "created UD queue pair");
        Ok(qp)
    }
}
