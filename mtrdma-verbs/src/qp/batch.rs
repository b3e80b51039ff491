//! Batches of send-side requests: several work requests handed to the
//! device in one call (one doorbell), most of them without a completion of
//! their own.

use super::*;

/// Several send-side requests that go to the NIC together
/// ([`QueuePair::batch`]): one `ibv_post_send` call with a linked list of
/// work requests (one doorbell), and two completions for the batch (its
/// last request and the one halfway ask for one, and at least one in 16;
/// a completion also reports the requests posted before it, since the
/// send queue completes in order). Each request still hands its region back in a
/// [`Completion`] of its own from [`QueuePair::poll`].
///
/// The ownership rules are those of [`QueuePair::post_send`]: a request's
/// region moves into the batch when it is added, and comes back in its
/// completion (or in the [`BatchError`] if it was not posted). The batch
/// borrows the queue pair, so nothing else is posted on it until the batch
/// is submitted or dropped. Dropping a batch without submitting it posts
/// nothing and frees its regions; take them back with
/// [`cancel`](Self::cancel).
///
/// ```no_run
/// use mtrdma_verbs::{Access, Context, SendOp};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let ctx = Context::open_first_active()?;
/// let pd = ctx.alloc_pd()?;
/// let (a, b) = (pd.queue_pair().build()?, pd.queue_pair().build()?);
/// let (ea, eb) = (a.endpoint(), b.endpoint());
/// let (mut a, _b) = (a.connect(&eb)?, b.connect(&ea)?);
/// let target = pd.allocate(16 * 4096, Access::REMOTE_READ_WRITE)?;
/// let remote = target.remote().unwrap();
///
/// let mut batch = a.batch();
/// for i in 0..16 {
///     let src = pd.allocate(4096, Access::LOCAL)?;
///     let to = remote.slice(i * 4096, 4096).unwrap();
///     batch.post_send(SendOp::Write(to), src, 0..4096, i)?;
/// }
/// batch.submit()?;
/// let mut done = Vec::new();
/// while done.len() < 16 {
///     a.poll(&mut done)?;
/// }
/// # Ok(())
/// # }
/// ```
#[must_use = "a batch posts nothing until it is submitted"]
pub struct PostBatch<'qp> {
    inner: Batch<'qp, QueuePair>,
}

impl fmt::Debug for PostBatch<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostBatch")
            .field("requests", &self.inner.len())
            .finish()
    }
}

impl QueuePair {
    /// Starts a batch of send-side requests posted together (see
    /// [`PostBatch`]).
    pub fn batch(&mut self) -> PostBatch<'_> {
        PostBatch {
            inner: Batch::new(self),
        }
    }
}

impl PostBatch<'_> {
    /// Adds a send-side operation on `range` of `region`, checked as
    /// [`QueuePair::post_send`] checks it (the range, the remote region,
    /// room in the send queue for the batch so far); on refusal the region
    /// comes back in the [`PostError`] and the batch is unchanged.
    pub fn post_send(
        &mut self,
        op: SendOp,
        region: MemoryRegion,
        range: Range<usize>,
        context: u64,
    ) -> Result<(), PostError> {
        self.inner
            .push(op, region, range, context)
            .map_err(PostError::new)
    }

    /// Adds a gather request (several regions, one work request), checked
    /// as [`QueuePair::post_send_gather`] checks it (and for room in the
    /// send queue for the batch so far); on refusal every region comes
    /// back in the [`GatherError`], in order, and the batch is unchanged.
    /// Once added, its regions are the batch's: they come back in its
    /// completion ([`Completion::gathered`]), or, if it is not posted, as
    /// consecutive entries of [`BatchError::refused`] (or of
    /// [`cancel`](Self::cancel)'s answer) that share its context.
    pub fn post_send_gather(
        &mut self,
        op: SendOp,
        parts: Vec<(MemoryRegion, Range<usize>)>,
        context: u64,
    ) -> Result<(), GatherError> {
        self.inner
            .push_gather(op, parts, context)
            .map_err(GatherError::new)
    }

    /// Requests in the batch.
    pub fn len(&self) -> usize {
        self.inner.len()
    }

    /// Whether the batch has no request.
    pub fn is_empty(&self) -> bool {
        self.inner.len() == 0
    }

    /// Posts the batch: one call to the device. If the device refuses a
    /// request, those before it were posted and complete as usual; it and
    /// those after it come back in the [`BatchError`], regions and all.
    pub fn submit(self) -> Result<(), BatchError> {
        self.inner.submit().map_err(BatchError::new)
    }

    /// Posts nothing and hands back the batch's requests, in order, as
    /// (context, region); a gather request's regions as consecutive
    /// entries with its context, in order.
    pub fn cancel(self) -> Vec<(u64, MemoryRegion)> {
        self.inner.cancel()
    }
}

/// A batch the device refused part of ([`PostBatch::submit`]).
#[derive(Debug)]
pub struct BatchError {
    /// How many of the batch's requests were posted (its first ones).
    pub posted: usize,
    /// How many were not (it and those after it).
    pub not_posted: usize,
    /// Why the next one was refused.
    pub error: Box<Error>,
    /// The regions of the requests not posted, in order, as (context,
    /// region): one entry for each request, and for a gather request
    /// ([`PostBatch::post_send_gather`]) one for each of its regions, in
    /// order, all with its context.
    pub refused: Vec<(u64, MemoryRegion)>,
}

impl BatchError {
    pub(crate) fn new(refusal: Refusal<MemoryRegion>) -> BatchError {
        BatchError {
            posted: refusal.posted,
            not_posted: refusal.not_posted,
            error: refusal.error,
            refused: refusal.refused,
        }
    }
}

impl fmt::Display for BatchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} request(s) of the batch posted, {} not: {}",
            self.posted, self.not_posted, self.error
        )
    }
}

impl std::error::Error for BatchError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

/// What a refused batch hands back: how many of its requests were posted,
/// why the next was not, and the requests not posted as (context,
/// region).
pub(crate) struct Refusal<R> {
    pub(crate) posted: usize,
    /// Requests not posted (a gather request's regions each have an
    /// entry in `refused`).
    pub(crate) not_posted: usize,
    /// Boxed, as [`BatchError::error`]: it keeps the refusal small.
    pub(crate) error: Box<Error>,
    pub(crate) refused: Vec<(u64, R)>,
}

/// A batch on any [`Sink`]: what [`PostBatch`] is. Each request's region
/// is parked in the sink's books when it is added, under the `wr_id` its
/// work request carries.
pub(crate) struct Batch<'a, S: Sink> {
    sink: &'a mut S,
    pieces: Vec<RawSend>,
    /// The scatter lists of its gather requests of several entries, which
    /// their work requests point at ([`Extra::sg_list`]) until submitted.
    lists: Vec<Vec<ffi::ibv_sge>>,
}

impl<'a, S: Sink> Batch<'a, S> {
    pub(crate) fn new(sink: &'a mut S) -> Self {
        Batch {
            sink,
            pieces: Vec::with_capacity(LIST_MAX / 2),
            lists: Vec::new(),
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.pieces.len()
    }

    /// Adds a request (see [`PostBatch::post_send`]).
    pub(crate) fn push(
        &mut self,
        op: SendOp,
        region: S::Region,
        range: Range<usize>,
        context: u64,
    ) -> Result<(), (Error, S::Region)> {
        let sge = match check_send(op, &region, &range) {
            Ok(sge) => sge,
            Err(error) => return Err((error, region)),
        };
        let pending = self.pieces.len();
        let raw = self
            .sink
            .books_mut()
            .park_send(op, region, sge, context, pending)?;
        push_in_place(&mut self.pieces, raw);
        Ok(())
    }

    /// Adds a gather request (see [`PostBatch::post_send_gather`]).
    #[allow(clippy::type_complexity)]
    pub(crate) fn push_gather(
        &mut self,
        op: SendOp,
        parts: Vec<(S::Region, Range<usize>)>,
        context: u64,
    ) -> Result<(), (Error, Vec<(S::Region, Range<usize>)>)> {
        let gather = match check_gather(op, &parts, self.sink.books().max_send_sge) {
            Ok(gather) => gather,
            Err(error) => return Err((error, parts)),
        };
        let (regions, ranges): (Vec<_>, Vec<_>) = parts.into_iter().unzip();
        let pending = self.pieces.len();
        match self
            .sink
            .books_mut()
            .park_gather(op, regions, &gather, context, pending)
        {
            Ok(raw) => {
                push_in_place(&mut self.pieces, raw);
                if gather.sges.len() > 1 {
                    // Moving the list keeps its entries where they are,
                    // where the work request points.
                    self.lists.push(gather.sges);
                }
                Ok(())
            }
            Err((error, regions)) => Err((error, regions.into_iter().zip(ranges).collect())),
        }
    }

    /// Posts the batch as one list (see [`PostBatch::submit`]).
    pub(crate) fn submit(mut self) -> Result<(), Refusal<S::Region>> {
        let pieces = std::mem::take(&mut self.pieces);
        // SAFETY: every request's buffers are its regions, parked in the
        // books under its `wr_id` until its completion is polled; the
        // scatter lists of its gather requests are in `self.lists` until
        // the batch is dropped, after the call (the device copies them).
        match unsafe { self.sink.post_list(&pieces) } {
            Ok(()) => Ok(()),
            Err((posted, error)) => Err(Refusal {
                posted,
                not_posted: pieces.len() - posted,
                error: Box::new(error),
                refused: self.unpark(&pieces[posted..]),
            }),
        }
    }

    /// Posts nothing; hands the requests back (see [`PostBatch::cancel`]).
    pub(crate) fn cancel(mut self) -> Vec<(u64, S::Region)> {
        let pieces = std::mem::take(&mut self.pieces);
        self.unpark(&pieces)
    }

    /// Takes the regions of `pieces`, not posted, out of the books, in
    /// order (a gather request's each with its context).
    fn unpark(&mut self, pieces: &[RawSend]) -> Vec<(u64, S::Region)> {
        let books = self.sink.books_mut();
        pieces
            .iter()
            .filter_map(|p| books.unpark(p.wr_id as usize))
            .flat_map(|slot| {
                let context = slot.context;
                slot.into_regions().map(move |region| (context, region))
            })
            .collect()
    }
}

impl<S: Sink> Drop for Batch<'_, S> {
    fn drop(&mut self) {
        // Never posted: the regions may be freed.
        let pieces = std::mem::take(&mut self.pieces);
        drop(self.unpark(&pieces));
    }
}
