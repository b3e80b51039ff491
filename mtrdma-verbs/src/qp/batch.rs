//! Batches of send-side requests: several work requests handed to the
//! device in one call (one doorbell), most of them without a completion of
//! their own.

use super::*;

/// The `Debug` output of a batch type `$name` over a [`Batch`] on `$qp`,
/// and `$qp`'s `batch` method, documented by the attributes given.
macro_rules! batch_of {
    ($name:ident for $qp:ty; $(#[$doc:meta])*) => {
        impl ::std::fmt::Debug for $name<'_> {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.debug_struct(stringify!($name))
                    .field("requests", &self.inner.len())
                    .finish()
            }
        }

        impl $qp {
            $(#[$doc])*
            pub fn batch(&mut self) -> $name<'_> {
                $name {
                    inner: $crate::qp::Batch::new(self),
                }
            }
        }
    };
}
pub(crate) use batch_of;

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

batch_of! {
    PostBatch for QueuePair;
    /// Starts a batch of send-side requests posted together (see
    /// [`PostBatch`]).
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
        BatchError::of(refusal, std::convert::identity)
    }

    /// The error of a refused batch of regions of another kind, each
    /// handed back as the caller's [`MemoryRegion`] (`region`).
    pub(crate) fn of<R>(refusal: Refusal<R>, region: impl Fn(R) -> MemoryRegion) -> BatchError {
        BatchError {
            posted: refusal.posted,
            not_posted: refusal.not_posted,
            error: refusal.error,
            refused: refusal
                .refused
                .into_iter()
                .map(|(context, r)| (context, region(r)))
                .collect(),
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
    list: List<S::Region>,
}

/// What a batch the device refused part of leaves: how many of its
/// requests were posted (its first ones), why the next was not, and the
/// requests not posted, in order.
pub(crate) type Unposted<R> = (usize, Error, Vec<Grouped<R>>);

impl<'a, S: Sink> Batch<'a, S> {
    pub(crate) fn new(sink: &'a mut S) -> Self {
        let list = List::new(sink.books_mut(), false);
        Batch { sink, list }
    }

    pub(crate) fn len(&self) -> usize {
        self.list.len()
    }

    crate::macros::posting_fn! {
        /// Adds a request (see [`PostBatch::post_send`]).
        pub(crate) fn push(&mut self, op: SendOp)
            posts (region, range, context) for S::Region {
            match check_send(op, &region, &range) {
                Ok(sge) => self.list.push_checked(self.sink.books(), op, region, sge, context),
                Err(error) => Err((error, region)),
            }
        }
    }

    crate::macros::posting_fn! {
        /// Adds a gather request (see [`PostBatch::post_send_gather`]).
        pub(crate) fn push_gather(&mut self, op: SendOp)
            posts gather (parts, context) for S::Region {
            self.list.push_gather(&*self.sink, op, parts, context)
        }
    }

    /// The queue pair the batch goes to (to check a request against it).
    pub(crate) fn sink(&self) -> &S {
        self.sink
    }

    /// Adds a request the caller checked, whose scatter entry is `sge`.
    pub(crate) fn push_checked(
        &mut self,
        op: SendOp,
        region: S::Region,
        sge: ffi::ibv_sge,
        context: u64,
    ) -> Result<(), (Error, S::Region)> {
        self.list
            .push_checked(self.sink.books(), op, region, sge, context)
    }

    /// Posts the batch as lists of up to [`LIST_MAX`] work requests (see
    /// [`PostBatch::submit`] and, for which of them ask for a completion,
    /// [`Sink::post_list`]).
    pub(crate) fn submit(self) -> Result<(), Refusal<S::Region>> {
        let Batch { sink, list } = self;
        list.post(sink).map_err(|(posted, error, refused)| Refusal {
            posted,
            not_posted: refused.len(),
            error: Box::new(error),
            refused: refused
                .into_iter()
                .flat_map(Grouped::into_entries)
                .collect(),
        })
    }

    /// Posts nothing; hands the requests back (see [`PostBatch::cancel`]).
    pub(crate) fn cancel(self) -> Vec<(u64, S::Region)> {
        let Batch { sink, list } = self;
        list.cancel(sink.books_mut())
    }
}

/// A batch's requests, apart from the queue pair it goes to (which each
/// call names): what a [`Batch`] builds, and what a scheduled queue pair's
/// batch builds for the requests its engine lets go at once. Dropped
/// without [`post`](Self::post) or [`cancel`](Self::cancel), it posts
/// nothing and frees its regions (its room is not kept for the next).
pub(crate) struct List<R> {
    /// Its requests, in order, with their regions.
    pieces: Vec<Grouped<R>>,
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
    /// Posted for a scheduled queue pair: each completion also reports a
    /// raw completion [`PARKED_DONE`], as for a request parked alone with
    /// [`SCHED_WR`].
    sched: bool,
}

impl<R: Region> List<R> {
    /// An empty list, with the room `books` kept from the last one;
    /// `sched`: see [`List::sched`].
    #[inline]
    pub(crate) fn new(books: &mut Books<R>, sched: bool) -> Self {
        List {
            pieces: books.group_queue(),
            scratch: books.take_list_scratch(),
            lists: Vec::new(),
            all_signaled: false,
            sched,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.pieces.len()
    }

    /// Refuses one more request if the send queue `books` keeps has no
    /// room for the list with it.
    #[inline]
    fn check_room(&self, books: &Books<R>) -> Result<(), Error> {
        let room = (books.max_send_wr as usize).min(GROUP_MAX);
        if books.sends_in_flight as usize + self.pieces.len() >= room {
            return Err(Error::SendQueueFull {
                depth: books.max_send_wr,
            });
        }
        Ok(())
    }

    /// Adds a request `check_send` found to be `sge`, for the queue pair
    /// whose books are `books` (see [`PostBatch::post_send`]).
    #[inline]
    pub(crate) fn push_checked(
        &mut self,
        books: &Books<R>,
        op: SendOp,
        region: R,
        sge: ffi::ibv_sge,
        context: u64,
    ) -> Result<(), (Error, R)> {
        if let Err(error) = self.check_room(books) {
            return Err((error, region));
        }
        let extra = region.extra(true, true);
        self.add(op, region, Vec::new(), sge, extra, sge.length, context);
        Ok(())
    }

    /// Adds a request the list has room for: its work request, on `sge`
    /// (its first scatter entry) with what its first region adds
    /// (`extra`), and its regions, `len` bytes in all.
    #[inline]
    #[allow(clippy::too_many_arguments)]
    fn add(
        &mut self,
        op: SendOp,
        region: R,
        rest: Vec<R>,
        sge: ffi::ibv_sge,
        extra: Extra,
        len: u32,
        context: u64,
    ) {
        let ud = region.datagram();
        self.all_signaled |= ud.is_some();
        let raw = RawSend::new(0, op, true, sge, ud, extra, false);
        let mut entry = sge;
        push_send_wr(&mut self.scratch.wrs, &raw, &mut entry, true);
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

    /// Adds a gather request for `sink` (see [`PostBatch::post_send_gather`]).
    #[allow(clippy::type_complexity)]
    pub(crate) fn push_gather<S: Sink<Region = R>>(
        &mut self,
        sink: &S,
        op: SendOp,
        parts: Vec<(R, Range<usize>)>,
        context: u64,
    ) -> Result<(), (Error, Vec<(R, Range<usize>)>)> {
        let gather = match check_gather(op, &parts, sink.books().max_send_sge) {
            Ok(gather) => gather,
            Err(error) => return Err((error, parts)),
        };
        if let Some(error) = sink.unsupported(op, gather.sges.len()) {
            return Err((error, parts));
        }
        if let Err(error) = self.check_room(sink.books()) {
            return Err((error, parts));
        }
        let mut regions = parts.into_iter().map(|(region, _)| region);
        let Some(region) = regions.next() else {
            return Err((Error::EmptyGather, Vec::new()));
        };
        let rest: Vec<R> = regions.collect();
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

    /// Posts the list on `sink` as lists of up to [`LIST_MAX`] work
    /// requests (see [`PostBatch::submit`] and, for which of them ask for a
    /// completion, [`Sink::post_list`]), handing back the requests not
    /// posted as they were added.
    pub(crate) fn post<S: Sink<Region = R>>(mut self, sink: &mut S) -> Result<(), Unposted<R>> {
        let result = self.post_on(sink);
        sink.books_mut().keep_list_scratch(self.scratch);
        result
    }

    fn post_on<S: Sink<Region = R>>(&mut self, sink: &mut S) -> Result<(), Unposted<R>> {
        let n = self.scratch.wrs.len();
        if n == 0 {
            return Ok(());
        }
        let pieces = std::mem::take(&mut self.pieces);
        let key = sink.books_mut().park_group(pieces, self.sched);
        let quiet_ok = !self.all_signaled && sink.quiet_lists();
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
            // Pieces left before the next that asks for its completion.
            let mut to_signal = every;
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
                to_signal -= 1;
                if !quiet_ok || i + 1 == len || to_signal == 0 {
                    wr.send_flags |= signaled;
                    to_signal = every;
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
            let result = unsafe { sink.post_wr_list(&mut *wrs.add(done)) };
            let taken = match &result {
                Ok(()) => len,
                Err((taken, _)) => *taken,
            };
            sink.books_mut().sends_in_flight += taken as u32;
            if let Err((_, error)) = result {
                let posted = done + taken;
                // SAFETY: `posted - 1 < n`, as above.
                if taken > 0 && unsafe { (*wrs.add(posted - 1)).send_flags } & signaled == 0 {
                    sink.report_quiet(group_wr_id(key, posted - 1) | GROUP_NOP);
                }
                let refused = sink.books_mut().unpark_group_from(key, posted);
                return Err((posted, error, refused));
            }
            done += len;
        }
        Ok(())
    }

    /// Posts nothing; hands the requests back, in order (see
    /// [`PostBatch::cancel`]), keeping the list's room in `books`.
    pub(crate) fn cancel(mut self, books: &mut Books<R>) -> Vec<(u64, R)> {
        let back = self
            .pieces
            .drain(..)
            .flat_map(Grouped::into_entries)
            .collect();
        self.release(books);
        back
    }

    /// Drops the requests (never posted: the regions may be freed), keeping
    /// the list's room in `books` for the next.
    pub(crate) fn release(self, books: &mut Books<R>) {
        let List {
            pieces, scratch, ..
        } = self;
        books.keep_list_scratch(scratch);
        if pieces.capacity() > 0 {
            books.recycle(pieces);
        }
    }
}
