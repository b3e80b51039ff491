//! UD queue pairs through the same engine: their sends are scheduled as
//! an RC queue pair's are (the tenant's class, weight and caps, its shared
//! rate limit and delay window, pieces in the NIC bounded), each datagram
//! one piece (a UD send is never split: it fits one MTU).

use super::*;
use crate::ud::{refused_parts, UdRegion};
use crate::{AddressHandle, UdCompletion, UdEndpoint, UdQueuePair};

impl UdQueuePair {
    solo_scheduled! {
        /// Routes this queue pair's sends through a scheduler of its own, the
        /// built-in [`TenantScheduler`]: a UD service's datagrams then keep to
        /// its tenant's policy (with [`Tenancy::OfQueuePair`], the default:
        /// its class, its caps and the coordinator's fair rate shared with its
        /// other processes through the quota table, and a delay window with
        /// [`ScheduleConfig::window`]). Receives are not scheduled.
        ///
        /// ```no_run
        /// use mtrdma_core::{TenantId, TrafficClass};
        /// use mtrdma_verbs::{Access, Context, PollCompletions, ScheduleConfig, UdCompletion};
        ///
        /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
        /// let ctx = Context::open("rxe0")?;
        /// let pd = ctx.alloc_pd()?;
        /// let mut server = pd.ud_queue_pair().build()?;
        /// let config = ScheduleConfig::local(TenantId(1), TrafficClass::Latency);
        /// let mut client = pd.ud_queue_pair().build()?.scheduled(config)?;
        /// server.post_recv(pd.allocate(server.mtu() as usize, Access::LOCAL)?, 0..64, 1)?;
        /// let to_server = client.address_handle(&server.endpoint())?;
        /// let mut msg = pd.allocate(5, Access::LOCAL)?;
        /// msg.write_at(0, b"hello")?;
        /// let ep = server.endpoint();
        /// client.post_send(&to_server, ep.qpn, ep.qkey, msg, 0..5, 2)?;
        /// let mut done: Vec<UdCompletion> = Vec::new();
        /// while done.is_empty() {
        ///     server.poll(&mut done)?;
        ///     client.poll(&mut Vec::new())?;
        /// }
        /// # Ok(())
        /// # }
        /// ```
        ScheduledUdQueuePair, |qp, config, sched| {
            let endpoint = qp.endpoint();
            let mtu = qp.mtu();
            let inner = Scheduled::solo(qp, config, sched, EngineClock::real())?;
            Ok(ScheduledUdQueuePair {
                inner,
                endpoint,
                mtu,
            })
        }
    }
}

/// A UD queue pair whose sends are scheduled
/// ([`UdQueuePair::scheduled`]). Sends are handed back in
/// [`UdCompletion`]s, one per datagram, as the queue pair's own are;
/// receives come out of the same [`poll`](crate::PollCompletions::poll) with their source.
pub struct ScheduledUdQueuePair<Q: PieceScheduler = DefaultScheduler> {
    inner: Scheduled<UdQueuePair, Q>,
    endpoint: UdEndpoint,
    mtu: u32,
}

impl<Q: PieceScheduler> std::fmt::Debug for ScheduledUdQueuePair<Q> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.inner.debug("ScheduledUdQueuePair", f)
    }
}

impl<Q: PieceScheduler> ScheduledUdQueuePair<Q> {
    /// It, as something whose completions can be waited for.
    #[cfg_attr(not(feature = "tokio"), allow(dead_code))]
    pub(crate) fn waitable(&mut self) -> &mut dyn Waitable<Item = UdCompletion> {
        self.inner.waitable()
    }
}

impl<Q: PieceScheduler> ScheduledUdQueuePair<Q> {
    /// The queue pair number.
    pub fn qpn(&self) -> u32 {
        self.inner.qpn
    }

    /// What peers need to send to this queue pair.
    pub fn endpoint(&self) -> UdEndpoint {
        self.endpoint
    }

    /// The largest datagram it sends: the port's active MTU in bytes.
    pub fn mtu(&self) -> u32 {
        self.mtu
    }

    super::scheduled_accessors!();

    /// An address handle for sending from this queue pair's port and GID
    /// to `remote`.
    pub fn address_handle(&mut self, remote: &UdEndpoint) -> Result<AddressHandle, Error> {
        self.inner.with_sink(|qp| qp.address_handle(remote))
    }

    crate::macros::posting_fn! {
        /// Accepts a datagram of `range` of `region` for the queue pair
        /// `remote_qpn` (Q_Key `remote_qkey`) behind `dest`, as
        /// [`UdQueuePair::post_send`] does, and lets it go when its tenant's
        /// scheduler does: now, or at a later [`poll`](crate::PollCompletions::poll). Checked
        /// first (range, MTU, address handle); a refused datagram hands its
        /// region back. The address handle is kept until the send completes.
        pub fn post_send(&mut self, dest: &AddressHandle, remote_qpn: u32, remote_qkey: u32)
            posts (region, range, context) {
            let (region, _) = self
                .inner
                .with_sink(|qp| qp.datagram(dest, remote_qpn, remote_qkey, region, &range))?;
            self.inner
                .post_send(SendOp::Send, region, range, context, true)
                .map_err(|(error, region): (Error, UdRegion)| {
                    PostError::new((error, region.into_region()))
                })
        }
    }

    crate::macros::posting_fn! {
        /// Accepts one datagram gathered from the ranges of several regions,
        /// in order, as [`UdQueuePair::post_send_gather`] sends one and
        /// checked as it checks (up to the queue pair's `max_send_sge`
        /// regions, their bytes together within the MTU, an address handle of
        /// its protection domain). It is scheduled and charged to its tenant
        /// as one piece, as [`post_send`](Self::post_send) schedules a
        /// datagram, and goes to the NIC as one work request. Its completion
        /// hands every region back in order ([`UdCompletion::region`], then
        /// [`UdCompletion::gathered`]); on refusal (by the checks, or by the
        /// scheduler) every region comes back untouched in the
        /// [`GatherError`], in order, with its range.
        ///
        /// ```no_run
        /// use mtrdma_core::{TenantId, TrafficClass};
        /// use mtrdma_verbs::{Access, Context, PollCompletions, ScheduleConfig, UdCompletion};
        ///
        /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
        /// let ctx = Context::open("rxe0")?;
        /// let pd = ctx.alloc_pd()?;
        /// let mut server = pd.ud_queue_pair().build()?;
        /// let config = ScheduleConfig::local(TenantId(1), TrafficClass::Latency);
        /// let client = pd.ud_queue_pair().max_send_sge(2).build()?;
        /// let mut client = client.scheduled(config)?;
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
        ///     client.poll(&mut Vec::new())?;
        /// }
        /// assert_eq!(done[0].byte_len, 13);
        /// # Ok(())
        /// # }
        /// ```
        pub fn post_send_gather(&mut self, dest: &AddressHandle, remote_qpn: u32, remote_qkey: u32)
            posts gather (parts, context) {
            let parts = self
                .inner
                .with_sink_ref(|qp| qp.datagram_gather(dest, remote_qpn, remote_qkey, parts))?;
            self.inner
                .post_gather(SendOp::Send, parts, context)
                .map_err(refused_parts)
        }
    }

    crate::macros::posting_fn! {
        /// Posts a receive (receives are not scheduled): see
        /// [`UdQueuePair::post_recv`].
        pub fn post_recv(&mut self) posts (region, range, context) {
            self.inner
                .with_sink(|qp| qp.post_recv(region, range, context))
        }
    }
}

scheduled_poll! {
    /// As [`ScheduledQueuePair`](crate::ScheduledQueuePair)'s.
    ScheduledUdQueuePair,
    UdCompletion
}
