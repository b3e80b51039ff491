//! What a UD completion reports (the sender, read from the GRH), and the
//! regions a UD queue pair holds while the NIC uses them.

use super::*;

/// Where a received datagram came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdSource {
    /// The sender's queue pair number.
    pub qpn: u32,
    /// The sender's GID, decoded from the GRH: the IPv4-mapped GID of the
    /// IPv4 source address for RoCE v2 over IPv4, the GRH's source GID for
    /// InfiniBand and RoCE over IPv6. `None` when the message carried no
    /// GRH (the NIC reports none) or it could not be decoded.
    pub gid: Option<Gid>,
}

/// A completed UD work request, with the buffer it used handed back.
#[derive(Debug)]
pub struct UdCompletion {
    /// The caller's value given when posting.
    pub context: u64,
    /// How it ended.
    pub status: WcStatus,
    /// [`Opcode::Send`] or [`Opcode::Recv`] ([`Opcode::Unknown`] when it failed).
    pub opcode: Opcode,
    /// For a receive: the payload bytes, at the start of the posted range
    /// (the 40 GRH bytes are not counted and not in the region). For a
    /// send: the bytes posted.
    pub byte_len: u32,
    /// Immediate data, when the sender attached some.
    pub imm: Option<u32>,
    /// The sender, for a successful receive.
    pub source: Option<UdSource>,
    /// The region the request used, back in the caller's hands: for a
    /// gather send ([`UdQueuePair::post_send_gather`]), its first region.
    pub region: MemoryRegion,
    /// A gather send's regions after the first, in the order they were
    /// given; empty for every other request.
    pub gathered: Vec<MemoryRegion>,
}

impl UdCompletion {
    /// Every region the request used, in order: [`region`](Self::region),
    /// then [`gathered`](Self::gathered).
    pub fn into_regions(self) -> Vec<MemoryRegion> {
        std::iter::once(self.region).chain(self.gathered).collect()
    }
}

/// The sender's GID from a UD receive's 40-byte GRH area, following
/// rdma-core's `ibv_init_ah_from_wc`: for RoCE v2 over IPv4 the *last* 20
/// bytes hold the IPv4 header (the first 20 are unused) and the source is
/// its source address, IPv4-mapped; otherwise the area is an IPv6-style GRH
/// (version 6, `sgid` at bytes 8..24). A version-6 area whose bytes 20..40
/// also form a valid IPv4 header (IHL 5, correct checksum) is read as IPv4,
/// as rdma-core does.
pub(crate) fn grh_source_gid(grh: &[u8; GRH_BYTES]) -> Option<Gid> {
    let ip6_version = grh[0] >> 4;
    let ip4 = &grh[20..40];
    let ipv4_source = || {
        let src = Ipv4Addr::new(ip4[12], ip4[13], ip4[14], ip4[15]);
        Some(Gid(src.to_ipv6_mapped().octets()))
    };
    if ip6_version != 6 {
        return if ip4[0] >> 4 == 4 {
            ipv4_source()
        } else {
            None
        };
    }
    let ipv6_source = || {
        let mut sgid = [0u8; 16];
        sgid.copy_from_slice(&grh[8..24]);
        Some(Gid(sgid))
    };
    if ip4[0] & 0x0f != 5 {
        return ipv6_source();
    }
    let sum = ip4
        .chunks_exact(2)
        .map(|w| u32::from(u16::from_be_bytes([w[0], w[1]])))
        .sum::<u32>();
    let folded = (sum & 0xffff) + (sum >> 16);
    let folded = (folded & 0xffff) + (folded >> 16);
    if folded == 0xffff {
        ipv4_source()
    } else {
        ipv6_source()
    }
}

/// A send's destination, kept with its region until the completion (the
/// address handle must outlive the request).
pub(crate) struct Datagram {
    pub(super) ah: AddressHandle,
    pub(super) qpn: u32,
    pub(super) qkey: u32,
}

/// What a UD work request in flight keeps besides its region.
pub(crate) enum UdKind {
    /// A send, and where it goes.
    Send(Datagram),
    /// A receive: its GRH goes to this cell of the GRH buffer.
    Recv { cell: usize },
    /// A gather send's region after the first (whose kind says where it
    /// goes).
    Part,
}

/// A UD work request's buffer as the queue pair's books and the scheduling
/// engine keep it: the caller's region, and what the request needs until
/// it completes. Its completion is a [`UdCompletion`].
pub(crate) struct UdRegion {
    pub(super) region: MemoryRegion,
    pub(super) kind: UdKind,
}

impl UdRegion {
    /// The caller's region, back from a refused request.
    pub(crate) fn into_region(self) -> MemoryRegion {
        self.region
    }
}

impl Region for UdRegion {
    type Completion = UdCompletion;

    fn len(&self) -> usize {
        self.region.len()
    }

    fn sge(&self, range: &Range<usize>) -> Option<ffi::ibv_sge> {
        self.region.sge(range)
    }

    fn complete(self, finished: Finished) -> UdCompletion {
        self.complete_from(finished, None)
    }

    fn complete_from(self, finished: Finished, source: Option<UdSource>) -> UdCompletion {
        completion_of!(
            finished,
            UdCompletion {
                source,
                region: self.region,
                gathered: Vec::new(),
            }
        )
    }

    const GATHERS: bool = true;

    fn attach_rest(done: &mut UdCompletion, rest: Vec<UdRegion>) {
        done.gathered = rest.into_iter().map(UdRegion::into_region).collect();
    }

    #[inline]
    fn datagram(&self) -> Option<UdDest> {
        match &self.kind {
            UdKind::Send(d) => Some(UdDest {
                ah: std::num::NonZeroUsize::new(d.ah.raw() as usize)?,
                qpn: d.qpn,
                qkey: d.qkey,
            }),
            UdKind::Recv { .. } | UdKind::Part => None,
        }
    }
}
