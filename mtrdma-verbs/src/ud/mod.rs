//! Unreliable-datagram (UD) queue pairs and address handles: one queue
//! pair talks to many peers, one message per packet (the HERD / rdma-dpdk
//! pattern of many clients and one server queue pair).
//!
//! Every UD receive starts with 40 bytes reserved for the Global Routing
//! Header (GRH). mtrdma hides them: each receive is posted with two
//! scatter/gather entries, the first pointing at a 40-byte cell of a small
//! buffer the queue pair registers once (one cell per receive slot), the
//! second at the caller's range. The payload therefore lands at the start
//! of the caller's range, and [`UdCompletion::byte_len`] counts the
//! payload only.

use std::fmt;
use std::io;
use std::net::Ipv4Addr;
use std::ops::Range;
use std::ptr::NonNull;
use std::sync::Arc;

use ibverbs_sys as ffi;
use mtrdma_core::table::OwnedQpPermit;
use mtrdma_core::TenantHandle;

use crate::completion::{Opcode, WcStatus};
use crate::events::Armed;
use crate::qp::{
    check_gather, check_recv, check_srq, completion_of, cq_entries, create_qp, global_ah_attr,
    modify_qp, modify_to_init, post_recv_wr, post_send_list, qp_init_attr, qp_settings_setters,
    random_psn, recv_depths, sink_books, Books, Cq, Finished, PostError, QpSettings, RawCompletion,
    Region, SendOp, Sink, Slot, UdDest, Wc,
};
use crate::{
    Access, Error, GatherError, Gid, GidSelection, MemoryRegion, ProtectionDomain,
    SharedReceiveQueue,
};

/// Bytes at the start of every UD receive reserved for the Global Routing
/// Header. mtrdma puts them in an internal buffer, never in the caller's.
pub const GRH_BYTES: usize = 40;

/// The Q_Key a UD queue pair uses unless told otherwise.
pub const DEFAULT_QKEY: u32 = 0x1111_1111;

mod address;
mod batch;
mod builder;
mod completion;
mod sink;

use address::create_ah;
pub use address::{AddressHandle, UdEndpoint};
pub use batch::UdBatch;
pub use builder::UdQueuePairBuilder;
pub(crate) use completion::*;
pub use completion::{UdCompletion, UdSource};

/// An unreliable-datagram queue pair, ready to send and receive.
///
/// Posting moves the region into the queue pair; [`poll`](crate::PollCompletions::poll)
/// returns it in the completion. Sends go to any peer through an
/// [`AddressHandle`] (kept alive by the queue pair until the send
/// completes); each message must fit the port's active MTU
/// ([`mtu`](Self::mtu)). Receives get the payload at the start of the
/// posted range: each receive is posted with two scatter/gather entries,
/// the first a 40-byte cell (one per receive slot) of a buffer the queue
/// pair registers once, which takes the GRH, the second the caller's range.
/// Dropping the queue pair with work in
/// flight moves it to the error state, waits for every request to be
/// flushed (or, what the device never flushes, for the queue pair to be
/// destroyed), and only then frees the regions.
///
/// ```no_run
/// use mtrdma_verbs::{Access, Context, PollCompletions, UdCompletion};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let ctx = Context::open("rxe0")?;
/// let pd = ctx.alloc_pd()?;
/// let mut server = pd.ud_queue_pair().build()?;
/// let mut client = pd.ud_queue_pair().build()?;
/// // The server posts a receive; the client learns the server's endpoint
/// // (it is serialisable) and sends to it through an address handle.
/// server.post_recv(pd.allocate(server.mtu() as usize, Access::LOCAL)?, 0..64, 1)?;
/// let to_server = client.address_handle(&server.endpoint())?;
/// let mut msg = pd.allocate(5, Access::LOCAL)?;
/// msg.write_at(0, b"hello")?;
/// let ep = server.endpoint();
/// client.post_send(&to_server, ep.qpn, ep.qkey, msg, 0..5, 2)?;
/// let mut done: Vec<UdCompletion> = Vec::new();
/// while done.is_empty() {
///     server.poll(&mut done)?;
/// }
/// let c = &done[0];
/// assert_eq!(&c.region.read()[..c.byte_len as usize], b"hello");
/// println!("from QP {}", c.source.unwrap().qpn);
/// # Ok(())
/// # }
/// ```
pub struct UdQueuePair {
    qp: NonNull<ffi::ibv_qp>,
    // Field order is drop order: the QP is destroyed in `drop`, then its
    // CQ, then the GRH buffer and the parked regions.
    cq: Cq,
    grh: Option<MemoryRegion>,
    grh_addr: u64,
    grh_lkey: u32,
    free_cells: Vec<usize>,
    books: Books<UdRegion>,
    port: u8,
    gid_index: u32,
    gid: Gid,
    lid: u16,
    qkey: u32,
    mtu: u32,
    destroyed: bool,
    pd: ProtectionDomain,
    _permit: Option<OwnedQpPermit>,
    /// The shared receive queue it receives from, if any; dropped after
    /// the queue pair is destroyed.
    srq: Option<SharedReceiveQueue>,
}

// SAFETY: the queue pair owns its verbs objects, GRH buffer and in-flight
// regions; moving it to another thread moves all of it. It is not Sync:
// posting and polling take `&mut self`.
unsafe impl Send for UdQueuePair {}

/// A copy of cell `cell` of the GRH buffer at `grh_addr`, which holds
/// `cells` cells (a cell past them panics).
///
/// # Safety
/// The buffer must be live; the cell's receive must have completed (so the
/// NIC is done writing it) and the cell not be posted again before this
/// copy.
pub(crate) unsafe fn copy_grh(grh_addr: u64, cells: usize, cell: usize) -> [u8; GRH_BYTES] {
    assert!(cell < cells);
    let mut grh = [0u8; GRH_BYTES];
    // SAFETY: the cell lies inside the buffer (checked above), which is
    // live and done with by the NIC (the caller's promise). Only this cell
    // is read (other cells may be written by the NIC).
    unsafe {
        std::ptr::copy_nonoverlapping(
            (grh_addr as usize + cell * GRH_BYTES) as *const u8,
            grh.as_mut_ptr(),
            GRH_BYTES,
        );
    }
    grh
}

fn refuse<T>(error: Error, region: MemoryRegion) -> Result<T, PostError> {
    Err(PostError::new((error, region)))
}

impl fmt::Debug for UdQueuePair {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut f = f.debug_struct("UdQueuePair");
        f.field("qpn", &self.qpn())
            .field("gid", &self.gid)
            .field("mtu", &self.mtu);
        self.books.debug_in_flight(&mut f)
    }
}

/// A refused gather datagram, its regions the caller's again.
pub(crate) fn refused_parts((error, parts): (Error, Vec<(UdRegion, Range<usize>)>)) -> GatherError {
    let parts = parts
        .into_iter()
        .map(|(region, range)| (region.into_region(), range))
        .collect();
    GatherError::new((error, parts))
}

impl UdQueuePair {
    crate::qp::queue_pair_basics!();

    /// What peers need to send to this queue pair.
    pub fn endpoint(&self) -> UdEndpoint {
        UdEndpoint {
            qpn: self.qpn(),
            qkey: self.qkey,
            gid: self.gid.0,
            lid: self.lid,
        }
    }

    /// The largest message it sends: the port's active MTU in bytes.
    pub fn mtu(&self) -> u32 {
        self.mtu
    }

    /// The most regions one gather datagram may name
    /// ([`post_send_gather`](Self::post_send_gather)): the scatter entries
    /// of its send work requests, as built
    /// ([`UdQueuePairBuilder::max_send_sge`]).
    pub fn max_send_sge(&self) -> u32 {
        self.books.max_send_sge
    }

    /// An address handle for sending from this queue pair's port and GID
    /// to `remote`.
    pub fn address_handle(&self, remote: &UdEndpoint) -> Result<AddressHandle, Error> {
        create_ah(&self.pd, remote, self.port, self.gid_index)
    }

    crate::macros::posting_fn! {
        /// Sends `range` of `region` as one datagram to the queue pair
        /// `remote_qpn` (with Q_Key `remote_qkey`) behind `dest`. The region is
        /// the queue pair's until the completion is polled; on refusal (range
        /// outside the region, message above the MTU, address handle of another
        /// protection domain, full send queue) it comes back in the
        /// [`PostError`] and nothing is posted.
        pub fn post_send(&mut self, dest: &AddressHandle, remote_qpn: u32, remote_qkey: u32)
            posts (region, range, context) {
            let (region, sge) = self.datagram(dest, remote_qpn, remote_qkey, region, &range)?;
            self.park_and_post(SendOp::Send, region, sge, context, 0)
                .map_err(|(error, region)| PostError::new((error, region.region)))
        }
    }

    /// Checks a datagram of `range` of `region` to `dest` (in the region,
    /// within the MTU, an address handle of this protection domain) and
    /// wraps it for the books; on refusal the region comes back.
    pub(crate) fn datagram(
        &self,
        dest: &AddressHandle,
        remote_qpn: u32,
        remote_qkey: u32,
        region: MemoryRegion,
        range: &Range<usize>,
    ) -> Result<(UdRegion, ffi::ibv_sge), PostError> {
        let Some(sge) = region.sge(range) else {
            let len = region.len();
            let range = range.clone();
            return refuse(Error::LocalRangeOutOfBounds { range, len }, region);
        };
        match self.destination(dest, remote_qpn, remote_qkey, sge.length) {
            Ok(kind) => Ok((UdRegion { region, kind }, sge)),
            Err(error) => refuse(error, region),
        }
    }

    /// Checks a gather datagram of `parts` to `dest` (as [`check_gather`]
    /// checks a gather request, then its total bytes against the MTU and
    /// the address handle's protection domain) and wraps its regions for
    /// the books, the first with where it goes; on refusal every region
    /// comes back, in order, with its range.
    pub(crate) fn datagram_gather(
        &self,
        dest: &AddressHandle,
        remote_qpn: u32,
        remote_qkey: u32,
        parts: Vec<(MemoryRegion, Range<usize>)>,
    ) -> Result<Vec<(UdRegion, Range<usize>)>, GatherError> {
        let kind = check_gather(SendOp::Send, &parts, self.books.max_send_sge)
            .and_then(|g| self.destination(dest, remote_qpn, remote_qkey, g.len));
        let mut kind = match kind {
            Ok(kind) => Some(kind),
            Err(error) => return Err(GatherError::new((error, parts))),
        };
        let wrap = |(region, range)| {
            let kind = kind.take().unwrap_or(UdKind::Part);
            (UdRegion { region, kind }, range)
        };
        Ok(parts.into_iter().map(wrap).collect())
    }

    /// Where a datagram of `len` bytes to `dest` goes, if it fits the MTU
    /// and `dest` is of this queue pair's protection domain.
    fn destination(
        &self,
        dest: &AddressHandle,
        remote_qpn: u32,
        remote_qkey: u32,
        len: u32,
    ) -> Result<UdKind, Error> {
        if len > self.mtu {
            return Err(Error::MessageTooLarge {
                len: len as usize,
                mtu: self.mtu,
            });
        }
        if dest.inner.pd.raw() != self.pd.raw() {
            return Err(Error::ForeignAddressHandle);
        }
        Ok(UdKind::Send(Datagram {
            ah: dest.clone(),
            qpn: remote_qpn,
            qkey: remote_qkey,
        }))
    }

    crate::macros::posting_fn! {
        /// Sends the ranges of several regions, in order, as one datagram (a
        /// gather list: one work request whose scatter list names them all)
        /// to the queue pair `remote_qpn` (with Q_Key `remote_qkey`) behind
        /// `dest`. It may name up to the `max_send_sge` the queue pair was
        /// built with ([`UdQueuePairBuilder::max_send_sge`]), and its bytes
        /// together must fit the MTU ([`mtu`](Self::mtu)). Every region is
        /// the queue pair's until the completion is polled, which hands them
        /// all back in order ([`UdCompletion::region`], then
        /// [`UdCompletion::gathered`]); on refusal (checked before anything is
        /// posted, or refused by the device) they come back untouched in the
        /// [`GatherError`], in order, each with its range.
        ///
        /// ```no_run
        /// use mtrdma_verbs::{Access, Context, PollCompletions, UdCompletion};
        ///
        /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
        /// let ctx = Context::open("rxe0")?;
        /// let pd = ctx.alloc_pd()?;
        /// let mut server = pd.ud_queue_pair().build()?;
        /// let mut client = pd.ud_queue_pair().max_send_sge(2).build()?;
        /// server.post_recv(pd.allocate(server.mtu() as usize, Access::LOCAL)?, 0..64, 1)?;
        /// let to_server = client.address_handle(&server.endpoint())?;
        /// let mut header = pd.allocate(8, Access::LOCAL)?;
        /// header.write_at(0, b"header: ")?;
        /// let mut body = pd.allocate(5, Access::LOCAL)?;
        /// body.write_at(0, b"hello")?;
        /// let ep = server.endpoint();
        /// let parts = vec![(header, 0..8), (body, 0..5)];
        /// client.post_send_gather(&to_server, ep.qpn, ep.qkey, parts, 2)?;
        /// let mut done: Vec<UdCompletion> = Vec::new();
        /// while done.is_empty() {
        ///     server.poll(&mut done)?;
        /// }
        /// let c = &done[0];
        /// assert_eq!(&c.region.read()[..c.byte_len as usize], b"header: hello");
        /// let mut sent: Vec<UdCompletion> = Vec::new();
        /// while sent.is_empty() {
        ///     client.poll(&mut sent)?;
        /// }
        /// assert_eq!(sent[0].gathered.len(), 1);
        /// # Ok(())
        /// # }
        /// ```
        pub fn post_send_gather(&mut self, dest: &AddressHandle, remote_qpn: u32, remote_qkey: u32)
            posts gather (parts, context) {
            let parts = self.datagram_gather(dest, remote_qpn, remote_qkey, parts)?;
            Sink::post_gather(self, SendOp::Send, parts, context).map_err(refused_parts)
        }
    }

    crate::macros::posting_fn! {
        /// Posts a receive into `range` of `region`: the payload of the next
        /// datagram lands at `range.start` (the GRH goes to an internal
        /// buffer). A datagram longer than the range completes this receive
        /// with an error status ([`WcStatus::LocalLength`], or
        /// [`WcStatus::LocalQpOperation`] on rxe, which also moves the queue
        /// pair to the error state), so post ranges of [`mtu`](Self::mtu)
        /// bytes unless every sender is known. A queue pair built with an SRQ
        /// has no receive queue of its own and refuses
        /// ([`Error::ReceivesFromSrq`]).
        pub fn post_recv(&mut self) posts (region, range, context) {
            let payload = match check_recv(&self.books, self.srq.is_some(), &region, range) {
                Ok(sge) => sge,
                Err(error) => return refuse(error, region),
            };
            let cell = self
                .free_cells
                .pop()
                .expect("one GRH cell per receive slot, and a slot is free");
            let mut sges = [
                ffi::ibv_sge {
                    addr: self.grh_addr + (cell * GRH_BYTES) as u64,
                    length: GRH_BYTES as u32,
                    lkey: self.grh_lkey,
                },
                payload,
            ];
            let kind = UdKind::Recv { cell };
            let slot = self.books.park(Slot::recv(context, UdRegion { region, kind }));
            let num_sge = if payload.length > 0 { 2 } else { 1 };
            // SAFETY: the QP is live; `sges` outlives the call. The GRH cell
            // is reserved for this request (off the free list until its
            // completion is polled) inside the GRH buffer the queue pair owns;
            // the payload buffer is owned by the slot just parked.
            let rc = unsafe { post_recv_wr(self.qp, slot as u64, sges.as_mut_ptr(), num_sge) };
            if rc != 0 {
                self.free_cells.push(cell);
                let slot = self.books.unpark(slot).expect("just parked");
                let error = self.verbs_error(("ibv_post_recv", crate::error::errno(rc)));
                return refuse(error, slot.region.region);
            }
            self.books.recvs_in_flight += 1;
            Ok(())
        }
    }

    /// Flushes every outstanding request, waits (5 s at most) for the NIC
    /// to complete them all, and destroys the queue pair. If the destroy
    /// fails the in-flight regions and the GRH buffer are leaked, never
    /// freed while the NIC may reach them. Runs once; returns whether the
    /// NIC is done with them (later calls give the first answer).
    fn teardown(&mut self) -> bool {
        if self.destroyed {
            return self.books.outstanding() == 0;
        }
        let drained = self.drain_and_destroy("UD queue pair", UdQueuePair::set_error, |qp| {
            qp.destroyed = true;
            // SAFETY: the QP is ours and destroyed once (guarded by
            // `destroyed`), before its CQ (a later field).
            unsafe { ffi::ibv_destroy_qp(qp.qp.as_ptr()) }
        });
        if !drained {
            // The destroy failed: the NIC may still write GRHs into it.
            std::mem::forget(self.grh.take());
        }
        drained
    }
}

crate::events::waitable_queue_pair!(UdQueuePair, UdCompletion);

impl UdQueuePair {
    /// It, as something whose completions can be waited for.
    #[cfg_attr(not(feature = "tokio"), allow(dead_code))]
    pub(crate) fn waitable(&mut self) -> &mut dyn crate::events::Waitable<Item = UdCompletion> {
        self
    }
}

impl Drop for UdQueuePair {
    fn drop(&mut self) {
        self.teardown();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ipv4_grh(src: [u8; 4], dst: [u8; 4]) -> [u8; GRH_BYTES] {
        // What rxe writes for RoCE v2 over IPv4: 20 unused bytes, then the
        // IPv4 header.
        let mut grh = [0u8; GRH_BYTES];
        let ip = &mut grh[20..];
        ip[0] = 0x45; // version 4, IHL 5
        ip[2..4].copy_from_slice(&60u16.to_be_bytes());
        ip[8] = 64; // TTL
        ip[9] = 17; // UDP
        ip[12..16].copy_from_slice(&src);
        ip[16..20].copy_from_slice(&dst);
        let sum: u32 = ip
            .chunks_exact(2)
            .map(|w| u32::from(u16::from_be_bytes([w[0], w[1]])))
            .sum();
        let folded = (sum & 0xffff) + (sum >> 16);
        let check = !((folded & 0xffff) + (folded >> 16)) as u16;
        ip[10..12].copy_from_slice(&check.to_be_bytes());
        grh
    }

    fn ipv6_grh(sgid: [u8; 16], dgid: [u8; 16]) -> [u8; GRH_BYTES] {
        let mut grh = [0u8; GRH_BYTES];
        grh[0] = 0x60; // version 6
        grh[4..6].copy_from_slice(&100u16.to_be_bytes());
        grh[6] = 0x1b; // next header: IB BTH
        grh[7] = 64;
        grh[8..24].copy_from_slice(&sgid);
        grh[24..40].copy_from_slice(&dgid);
        grh
    }

    #[test]
    fn decodes_the_ipv4_source_of_a_roce_v2_ipv4_grh() {
        let grh = ipv4_grh([10, 0, 2, 15], [10, 0, 2, 16]);
        let gid = grh_source_gid(&grh).unwrap();
        assert_eq!(gid.ipv4_mapped(), Some(Ipv4Addr::new(10, 0, 2, 15)));
        assert_eq!(gid.to_string(), "::ffff:10.0.2.15");
    }

    #[test]
    fn decodes_the_sgid_of_an_ipv6_or_ib_grh() {
        let sgid = "fe80::5054:ff:fe12:3456"
            .parse::<std::net::Ipv6Addr>()
            .unwrap()
            .octets();
        let dgid = [0xab; 16];
        assert_eq!(grh_source_gid(&ipv6_grh(sgid, dgid)), Some(Gid(sgid)));
    }

    #[test]
    fn a_version_6_grh_whose_tail_is_not_a_valid_ipv4_header_is_ipv6() {
        // Bytes 20..40 are the last 4 bytes of the sgid and the dgid. An
        // sgid whose byte 12 is 0x45 looks like IHL 5, but the checksum
        // does not hold, so the GRH stays IPv6.
        let sgid = [
            0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0x45, 0, 0, 1,
        ];
        let grh = ipv6_grh(sgid, [0x11; 16]);
        assert_eq!(grh[20], 0x45);
        assert_eq!(grh_source_gid(&grh), Some(Gid(sgid)));
        // With a valid IPv4 header there, rdma-core (and mtrdma) read it
        // as IPv4 even though the version nibble says 6.
        let mut grh = ipv4_grh([192, 0, 2, 1], [192, 0, 2, 2]);
        grh[0] = 0x60;
        assert_eq!(
            grh_source_gid(&grh).and_then(|g| g.ipv4_mapped()),
            Some(Ipv4Addr::new(192, 0, 2, 1))
        );
    }

    #[test]
    fn an_undecodable_grh_gives_no_source() {
        assert_eq!(grh_source_gid(&[0u8; GRH_BYTES]), None);
        let mut grh = ipv4_grh([1, 2, 3, 4], [5, 6, 7, 8]);
        grh[20] = 0x55; // neither IPv4 nor an IPv6 GRH
        assert_eq!(grh_source_gid(&grh), None);
    }
}
