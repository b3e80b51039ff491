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
/// [`Completion`] of its own from [`poll`](crate::PollCompletions::poll).
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
/// use mtrdma_verbs::{Access, Context, PollCompletions, SendOp};
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
    crate::macros::batch_methods! {
        /// Adds a send-side operation on `range` of `region`, checked as
        /// [`QueuePair::post_send`] checks it (the range, the remote region,
        /// room in the send queue for the batch so far); on refusal the region
        /// comes back in the [`PostError`] and the batch is unchanged.
        post_send;
        /// Adds a gather request (several regions, one work request), checked
        /// as [`QueuePair::post_send_gather`] checks it (and for room in the
        /// send queue for the batch so far); on refusal every region comes
        /// back in the [`GatherError`], in order, and the batch is unchanged.
        /// Once added, its regions are the batch's: they come back in its
        /// completion ([`Completion::gathered`]), or, if it is not posted, as
        /// consecutive entries of [`BatchError::refused`] (or of
        /// [`cancel`](Self::cancel)'s answer) that share its context.
        post_send_gather;
        /// Posts the batch: one call to the device. If the device refuses a
        /// request, those before it were posted and complete as usual; it and
        /// those after it come back in the [`BatchError`], regions and all.
        submit;
        /// Posts nothing and hands back the batch's requests, in order, as
        /// (context, region); a gather request's regions as consecutive
        /// entries with its context, in order.
        cancel;
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

/// A batch on any [`Sink`]: what [`PostBatch`] is. Its requests are
/// parked in the sink's books together, as one group ([`Books::park_group`]),
/// when it is submitted; their work requests are built as they are added.
pub(crate) struct Batch<'a, S: Sink> {
    sink: &'a mut S,
    /// Its requests, in order, with their regions.
    pieces: Vec<Grouped<S::Region>>,
    /// Their work requests and scatter entries (the books' [`ListScratch`],
    /// handed back when the batch is done).
    scratch: ListScratch,
    /// The scatter lists of its gather requests of several entries, which
    /// their work requests point at until submitted.
    lists: Vec<Vec<ffi::ibv_sge>>,
    /// One of its requests is a datagram: every request asks for its
    /// completion (a UD queue pair cannot post the zero-length WRITE that
    /// closes a list cut short).
    all_signaled: bool,
    /// Posted for a scheduled queue pair ([`Batch::scheduled`]).
    sched: bool,
}

/// What a batch the device refused part of leaves: how many of its
/// requests were posted (its first ones), why the next was not, and the
/// requests not posted, in order.
pub(crate) type Unposted<R> = (usize, Error, Vec<Grouped<R>>);

impl<'a, S: Sink> Batch<'a, S> {
    pub(crate) fn new(sink: &'a mut S) -> Self {
        let books = sink.books_mut();
        let pieces = books.group_queue();
        let scratch = books.take_list_scratch();
        Batch {
            sink,
            pieces,
            scratch,
            lists: Vec::new(),
            all_signaled: false,
            sched: false,
        }
    }

    /// A batch a scheduled queue pair posts for requests its engine lets
    /// go at once: each completion also reports a raw completion
    /// [`PARKED_DONE`], as for a request parked alone with [`SCHED_WR`].
    pub(crate) fn scheduled(sink: &'a mut S) -> Self {
        let mut batch = Batch::new(sink);
        batch.sched = true;
        batch
    }

    pub(crate) fn len(&self) -> usize {
        self.pieces.len()
    }

    /// Refuses one more request if the send queue has no room for the
    /// batch with it.
    #[inline]
    fn check_room(&self) -> Result<(), Error> {
        let books = self.sink.books();
        let room = (books.max_send_wr as usize).min(GROUP_MAX);
        if books.sends_in_flight as usize + self.pieces.len() >= room {
            return Err(Error::SendQueueFull {
                depth: books.max_send_wr,
            });
        }
        Ok(())
    }

    crate::macros::posting_fn! {
        /// Adds a request (see [`PostBatch::post_send`]).
        pub(crate) fn push(&mut self, op: SendOp)
            posts (region, range, context) for S::Region {
            match check_send(op, &region, &range) {
                Ok(sge) => self.push_checked(op, region, sge, context),
                Err(error) => Err((error, region)),
            }
        }
    }

    /// Adds a request `check_send` found to be `sge` (see
    /// [`PostBatch::post_send`]).
    #[inline]
    pub(crate) fn push_checked(
        &mut self,
        op: SendOp,
        region: S::Region,
        sge: ffi::ibv_sge,
        context: u64,
    ) -> Result<(), (Error, S::Region)> {
        if let Err(error) = self.check_room() {
            return Err((error, region));
        }
        let extra = region.extra(true, true);
        self.add(op, region, Vec::new(), sge, extra, sge.length, context);
        Ok(())
    }

    /// Adds a request the batch has room for: its work request, on `sge`
    /// (its first scatter entry) with what its first region adds
    /// (`extra`), and its regions, `len` bytes in all.
    #[inline]
    #[allow(clippy::too_many_arguments)]
    fn add(
        &mut self,
        op: SendOp,
        region: S::Region,
        rest: Vec<S::Region>,
        sge: ffi::ibv_sge,
        extra: Extra,
        len: u32,
        context: u64,
    ) {
        let ud = region.datagram();
        self.all_signaled |= ud.is_some();
        let raw = RawSend::new(0, op, true, sge, ud, extra, false);
        let mut entry = sge;
        push_in_place(&mut self.scratch.wrs, send_wr(&raw, &mut entry, true));
        push_in_place(&mut self.scratch.sges, sge);
        push_in_place(
            &mut self.pieces,
            Grouped {
                context,
                region,
                rest,
                len,
                opcode: wc_opcode_of(raw.opcode),
            },
        );
    }

    crate::macros::posting_fn! {
        /// Adds a gather request (see [`PostBatch::post_send_gather`]).
        pub(crate) fn push_gather(&mut self, op: SendOp)
            posts gather (parts, context) for S::Region {
            let gather = match check_gather(op, &parts, self.sink.books().max_send_sge) {
                Ok(gather) => gather,
                Err(error) => return Err((error, parts)),
            };
            if let Some(error) = self.sink.unsupported(op, gather.sges.len()) {
                return Err((error, parts));
            }
            if let Err(error) = self.check_room() {
                return Err((error, parts));
            }
            let mut regions = parts.into_iter().map(|(region, _)| region);
            let Some(region) = regions.next() else {
                return Err((Error::EmptyGather, Vec::new()));
            };
            let rest: Vec<S::Region> = regions.collect();
            let mut extra = region.extra(true, true);
            let sge = gather.first_entry(&mut extra);
            self.add(op, region, rest, sge, extra, gather.len, context);
            if gather.sges.len() > 1 {
                // Moving the list keeps its entries where they are, where the
                // work request points.
                self.lists.push(gather.sges);
            }
            Ok(())
        }
    }

    /// Posts the batch as lists of up to [`LIST_MAX`] work requests (see
    /// [`PostBatch::submit`] and, for which of them ask for a completion,
    /// [`Sink::post_list`]).
    pub(crate) fn submit(self) -> Result<(), Refusal<S::Region>> {
        self.post().map_err(|(posted, error, refused)| Refusal {
            posted,
            not_posted: refused.len(),
            error: Box::new(error),
            refused: refused
                .into_iter()
                .flat_map(Grouped::into_entries)
                .collect(),
        })
    }

    /// [`submit`](Self::submit), handing back the requests not posted as
    /// they were added.
    pub(crate) fn post(mut self) -> Result<(), Unposted<S::Region>> {
        let n = self.scratch.wrs.len();
        if n == 0 {
            return Ok(());
        }
        let pieces = std::mem::take(&mut self.pieces);
        let key = self.sink.books_mut().park_group(pieces, self.sched);
        let quiet_ok = !self.all_signaled && self.sink.quiet_lists();
        let signaled = ffi::ibv_send_flags::IBV_SEND_SIGNALED.0;
        // The links and scatter pointers all come from one pointer to
        // each vector: a reference taken to the vector after a pointer
        // into it was stored would invalidate that pointer (Stacked
        // Borrows).
        let wrs = self.scratch.wrs.as_mut_ptr();
        let sges = self.scratch.sges.as_mut_ptr();
        let mut done = 0;
        while done < n {
            let len = (n - done).min(LIST_MAX);
            let every = len.div_ceil(2).clamp(1, SIGNAL_EVERY);
            for i in 0..len {
                let at = done + i;
                // SAFETY: `at < n`, the length of `self.scratch.wrs`, which does
                // not change while `wrs` is used.
                let wr = unsafe { &mut *wrs.add(at) };
                wr.wr_id = group_wr_id(key, at);
                if wr.num_sge <= 1 {
                    // SAFETY: `sges` has an entry for every request (`at <
                    // n`), and does not change while the list is used.
                    wr.sg_list = unsafe { sges.add(at) };
                }
                if !quiet_ok || i + 1 == len || (i + 1) % every == 0 {
                    wr.send_flags |= signaled;
                }
                wr.next = if i + 1 < len {
                    // SAFETY: `at + 1 < n`, as above.
                    unsafe { wrs.add(at + 1) }
                } else {
                    std::ptr::null_mut()
                };
            }
            // SAFETY: requests `done..done + len` are built and linked
            // (the last one's `next` is null); their scatter entries are
            // in `self.scratch.sges` or `self.lists`, which outlive the call (the
            // device copies them); their buffers are the group's regions,
            // parked in the books until their completions are polled.
            let result = unsafe { self.sink.post_wr_list(&mut *wrs.add(done)) };
            let taken = match &result {
                Ok(()) => len,
                Err((taken, _)) => *taken,
            };
            self.sink.books_mut().sends_in_flight += taken as u32;
            if let Err((_, error)) = result {
                let posted = done + taken;
                // SAFETY: `posted - 1 < n`, as above.
                if taken > 0 && unsafe { (*wrs.add(posted - 1)).send_flags } & signaled == 0 {
                    self.sink
                        .report_quiet(group_wr_id(key, posted - 1) | GROUP_NOP);
                }
                let refused = self.sink.books_mut().unpark_group_from(key, posted);
                return Err((posted, error, refused));
            }
            done += len;
        }
        Ok(())
    }

    /// Posts nothing; hands the requests back (see [`PostBatch::cancel`]).
    pub(crate) fn cancel(mut self) -> Vec<(u64, S::Region)> {
        self.pieces
            .drain(..)
            .flat_map(Grouped::into_entries)
            .collect()
    }
}

impl<S: Sink> Drop for Batch<'_, S> {
    fn drop(&mut self) {
        // Never posted: the regions may be freed.
        let pieces = std::mem::take(&mut self.pieces);
        let scratch = std::mem::take(&mut self.scratch);
        let books = self.sink.books_mut();
        books.keep_list_scratch(scratch);
        if pieces.capacity() > 0 {
            books.recycle(pieces);
        }
    }
}
