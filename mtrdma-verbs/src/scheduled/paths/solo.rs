//! A queue pair on an engine of its own: no lock, and a request it may
//! send at once posted as the direct path posts it.

use super::*;

/// A queue pair with an engine of its own. Everything the shared engine
/// leaves in a side's book for its owner goes straight to the owner here
/// (`own_pieces`, `own_done`), and the owner posts and polls its queue
/// pair itself.
pub(in crate::scheduled) struct Solo<S: Sink, Q: PieceScheduler> {
    pub(in crate::scheduled) engine: Engine<S, Q>,
    pub(in crate::scheduled) sink: S,
    pub(in crate::scheduled) member: usize,
    /// Piece completions to match: polled, or of pieces the NIC refused.
    pub(in crate::scheduled) raw: Vec<RawCompletion>,
    /// The last poll took piece completions (see `Waitable::took`).
    pub(in crate::scheduled) took: bool,
    /// The lists a batch is posted from, kept between batches so that a
    /// batch allocates none.
    pub(in crate::scheduled) batch: BatchScratch,
}

/// Room kept between batches: what each request a batch parked asked
/// for (see [`Batched`]). Empty between batches.
#[derive(Default)]
pub(in crate::scheduled) struct BatchScratch {
    asked: Vec<Asked>,
}

impl<S: Sink, Q: PieceScheduler> Solo<S, Q> {
    #[inline]
    pub(in crate::scheduled) fn post_send(
        &mut self,
        op: SendOp,
        whole: bool,
        region: S::Region,
        range: Range<usize>,
        sge: ffi::ibv_sge,
        context: u64,
    ) -> Result<(), (Error, S::Region)> {
        // A request sent whole (rare) always goes through the engine.
        let region = if !whole && self.engine.may_park(self.member, op, u64::from(sge.length)) {
            // Posted as the direct path posts, its region parked in the
            // queue pair's books; the engine only counts it.
            match self.sink.park_and_post(op, region, sge, context, SCHED_WR) {
                Ok(()) => {
                    self.engine.parked(self.member, sge.length);
                    return Ok(());
                }
                // Refused by the queue pair: through the engine, whose
                // refused pieces complete as failed at the next poll (as
                // every accepted request ends, with one completion).
                Err((_, region)) => region,
            }
        } else {
            region
        };
        let result =
            self.engine
                .post_send(self.member, Op { op, whole }, region, range, sge, context);
        self.post_accepted(result)
    }

    /// Posts what the engine decided on accepting a request (`result`):
    /// the one piece it returned, or the pieces it left in `own_pieces`.
    #[inline]
    fn post_accepted<E>(&mut self, result: Result<Option<RawSend>, E>) -> Result<(), E> {
        if let Ok(Some(piece)) = result {
            // The fast path: nothing else was decided.
            if let Some(failed) = post_piece(&mut self.sink, piece) {
                self.raw.push(failed);
            }
            return Ok(());
        }
        self.post_decided();
        result.map(|_| ())
    }

    /// [`Scheduled::post_gather`] on a queue pair of its own: always
    /// through the engine (a request sent whole).
    pub(in crate::scheduled) fn post_request(
        &mut self,
        request: Request<S::Region>,
    ) -> Result<(), (Error, Vec<S::Region>)> {
        let result = request.accept(&mut self.engine, self.member);
        self.post_accepted(result)
    }

    /// Adds a request of a batch to its `parked` list if the engine lets
    /// it go at once (`may_park`, with the batch's requests parked so far
    /// counted) and the send queue has room for the list with it; counts
    /// it then. Otherwise hands the region back: the request goes through
    /// the engine at submit.
    #[inline]
    pub(in crate::scheduled) fn park_in(
        &mut self,
        parked: &mut Option<(List<S::Region>, Vec<Asked>)>,
        op: SendOp,
        region: S::Region,
        range: &Range<usize>,
        sge: ffi::ibv_sge,
        context: u64,
    ) -> Result<(), S::Region> {
        if !self.engine.may_park(self.member, op, u64::from(sge.length)) {
            return Err(region);
        }
        let (list, asked) = parked.get_or_insert_with(|| {
            (
                List::new(self.sink.books_mut(), true),
                std::mem::take(&mut self.batch.asked),
            )
        });
        match list.push_checked(self.sink.books(), op, region, sge, context) {
            Ok(()) => {
                self.engine.parked(self.member, sge.length);
                push_in_place(asked, (op, range.clone(), sge));
                Ok(())
            }
            // No room in the send queue: through the engine.
            Err((_, region)) => Err(region),
        }
    }

    /// Keeps the room of a batch's `asked` for the next.
    pub(in crate::scheduled) fn keep_asked(&mut self, mut asked: Vec<Asked>) {
        asked.clear();
        self.batch.asked = asked;
    }

    /// [`Batched::submit`] on a queue pair of its own: the leading
    /// requests parked as they were added go to the NIC as one list, as a
    /// direct batch; the rest go through the engine, whose pieces follow
    /// as lists of their own.
    pub(in crate::scheduled) fn post_batch(
        &mut self,
        parked: Option<(List<S::Region>, Vec<Asked>)>,
        mut requests: Vec<Request<S::Region>>,
    ) -> Result<(), Refusal<S::Region>> {
        let mut posted = 0;
        if let Some((list, mut asked)) = parked {
            posted = list.len();
            if let Err((taken, _, unposted)) = list.post(&mut self.sink) {
                // Refused by the queue pair: uncounted, and through the
                // engine ahead of the rest (whose refused pieces complete
                // as failed at the next poll), as a refused single post.
                posted = taken;
                self.engine.parked_done(self.member, unposted.len());
                let back: Vec<_> = unposted
                    .into_iter()
                    .zip(asked.drain(taken..))
                    .map(|(piece, (op, range, sge))| {
                        Request::single(op, piece.region, range, sge, piece.context)
                    })
                    .collect();
                requests.splice(0..0, back);
            }
            self.keep_asked(asked);
        }
        if requests.is_empty() {
            return Ok(());
        }
        let result = accept_all(&mut self.engine, self.member, requests).map_err(|mut refusal| {
            refusal.posted += posted;
            refusal
        });
        self.post_decided();
        result
    }

    #[inline]
    pub(in crate::scheduled) fn poll(&mut self, out: &mut Vec<Done<S>>) -> Result<usize, Error> {
        let before = out.len();
        let polled = self.sink.poll(out, &mut self.raw);
        let due = self.engine.wake_due();
        self.took = !self.raw.is_empty();
        if self.took || due {
            self.engine.completed_into(self.member, &self.raw, due, out);
            self.raw.clear();
            self.post_decided();
        }
        polled.map(|_| out.len() - before)
    }

    /// Posts the pieces the engine decided, in order; a piece the NIC
    /// refuses completes as failed at the next poll.
    #[inline]
    pub(in crate::scheduled) fn post_decided(&mut self) {
        if !self.engine.own_pieces_mut().is_empty() {
            self.post_pieces();
        }
    }

    #[inline(never)]
    pub(in crate::scheduled) fn post_pieces(&mut self) {
        // Refusals wait in `raw` for the next poll to fail their requests:
        // until then, no later piece of one is posted.
        let mut failed = Vec::new();
        let raw = &self.raw;
        let pieces = self.engine.own_pieces_mut();
        post_pieces(
            &mut self.sink,
            pieces,
            |wr_id| raw.iter().any(|c| c.wr_id == wr_id),
            &mut failed,
        );
        pieces.clear();
        self.raw.append(&mut failed);
    }
}

impl<S: Sink, Q: PieceScheduler> Waitable for Solo<S, Q> {
    type Item = Done<S>;

    fn poll(&mut self, out: &mut Vec<Done<S>>) -> Result<usize, Error> {
        Solo::poll(self, out)
    }

    fn check_events(&mut self) -> Result<(), Error> {
        self.sink.check_events()
    }

    fn arm(&mut self) -> Result<Armed, Error> {
        self.sink.arm_events()
    }

    fn take_events(&mut self) -> Result<(), Error> {
        self.sink.take_events()
    }

    fn poll_by(&self) -> Option<Instant> {
        self.engine.wake_instant()
    }

    fn took(&self) -> bool {
        self.took
    }

    fn woke_late(&mut self, late: Duration) {
        self.engine.woke_late(late);
    }

    fn wants_lateness(&self) -> bool {
        true
    }
}

impl<S: Sink, Q: PieceScheduler> Drop for Solo<S, Q> {
    fn drop(&mut self) {
        if let Some(leaving) = self.engine.detach(self.member, Some(&mut self.sink)) {
            // A queue pair of its own has no side; were there one, drain it.
            leaving.drain();
        }
    }
}
