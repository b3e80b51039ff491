//! Batches of datagrams: several sends handed to the device in one call
//! (one doorbell), as [`PostBatch`](crate::PostBatch) posts an RC queue
//! pair's.

use super::*;
use crate::qp::Batch;
use crate::BatchError;

/// Several datagrams that go to the NIC together
/// ([`UdQueuePair::batch`]): one `ibv_post_send` call with a linked list
/// of work requests (one doorbell), each to its own destination. A server
/// answering many clients posts the answers of one poll so. Every
/// datagram asks for its completion (a UD send queue has no zero-length
/// WRITE to close a list the device cut short), and each hands its region
/// back in a [`UdCompletion`] of its own.
///
/// The ownership rules are those of [`UdQueuePair::post_send`]: a region
/// moves into the batch when its datagram is added, and comes back in its
/// completion (or in the [`BatchError`] if it was not posted). The batch
/// borrows the queue pair, so nothing else is posted on it until the
/// batch is submitted or dropped. Dropping a batch without submitting it
/// posts nothing and frees its regions; take them back with
/// [`cancel`](Self::cancel).
///
/// ```no_run
/// use mtrdma_verbs::{Access, Context, PollCompletions};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let ctx = Context::open_first_active()?;
/// let pd = ctx.alloc_pd()?;
/// let mut server = pd.ud_queue_pair().build()?;
/// let clients: Vec<_> = (0..4).map(|_| pd.ud_queue_pair().build()).collect::<Result<_, _>>()?;
/// let mut batch = server.batch();
/// for (i, client) in clients.iter().enumerate() {
///     let to = client.endpoint();
///     let ah = batch.address_handle(&to)?;
///     let answer = pd.allocate(64, Access::LOCAL)?;
///     batch.post_send(&ah, to.qpn, to.qkey, answer, 0..64, i as u64)?;
/// }
/// batch.submit()?;
/// let mut sent = Vec::new();
/// while sent.len() < 4 {
///     server.poll(&mut sent)?;
/// }
/// # Ok(())
/// # }
/// ```
#[must_use = "a batch posts nothing until it is submitted"]
pub struct UdBatch<'qp> {
    inner: Batch<'qp, UdQueuePair>,
}

crate::qp::batch_of! {
    UdBatch for UdQueuePair;
    /// Starts a batch of datagrams posted together (see [`UdBatch`]).
}

impl UdBatch<'_> {
    /// An address handle to `to`, made on the batch's queue pair (as
    /// [`UdQueuePair::address_handle`]), while the batch holds it.
    pub fn address_handle(&self, to: &UdEndpoint) -> Result<AddressHandle, Error> {
        self.inner.sink().address_handle(to)
    }

    crate::macros::posting_fn! {
        /// Adds a datagram of `range` of `region` to `dest`, checked as
        /// [`UdQueuePair::post_send`] checks it (the range, the MTU, the
        /// address handle's protection domain) and for room in the send
        /// queue for the batch so far; on refusal the region comes back in
        /// the [`PostError`] and the batch is unchanged.
        pub fn post_send(&mut self, dest: &AddressHandle, remote_qpn: u32, remote_qkey: u32)
            posts (region, range, context) {
            let (region, sge) =
                self.inner
                    .sink()
                    .datagram(dest, remote_qpn, remote_qkey, region, &range)?;
            self.inner
                .push_checked(SendOp::Send, region, sge, context)
                .map_err(|(error, region)| PostError::new((error, region.into_region())))
        }
    }

    /// Datagrams in the batch.
    pub fn len(&self) -> usize {
        self.inner.len()
    }

    /// Whether the batch has no datagram.
    pub fn is_empty(&self) -> bool {
        self.inner.len() == 0
    }

    /// Posts the batch: one call to the device. If the device refuses a
    /// datagram, those before it were posted and complete as usual; it and
    /// those after it come back in the [`BatchError`], regions and all.
    pub fn submit(self) -> Result<(), BatchError> {
        self.inner
            .submit()
            .map_err(|refusal| BatchError::of(refusal, UdRegion::into_region))
    }

    /// Posts nothing and hands back the batch's datagrams, in order, as
    /// (context, region).
    pub fn cancel(self) -> Vec<(u64, MemoryRegion)> {
        self.inner
            .cancel()
            .into_iter()
            .map(|(context, region)| (context, region.into_region()))
            .collect()
    }
}
