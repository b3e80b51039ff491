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

/// What each request [`Solo::post_batch`] parked asked for (to hand a
/// request the queue pair refuses to the engine after all). Empty between
/// batches; only its room is kept.
#[derive(Default)]
pub(in crate::scheduled) struct BatchScratch {
    asked: Vec<(SendOp, Range<usize>, ffi::ibv_sge)>,
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

    /// [`Scheduled::post_batch`] on a queue pair of its own: the leading
    /// requests the engine lets go at once (`may_park`, judged after each
    /// one is counted, as for as many single posts) are parked in the
    /// queue pair's books and posted as one list, as a direct batch; the
    /// rest go through the engine, whose pieces follow as lists of their
    /// own.
    pub(in crate::scheduled) fn post_batch(
        &mut self,
        requests: Vec<Request<S::Region>>,
    ) -> Result<(), Refusal<S::Region>> {
        let mut requests = requests.into_iter();
        let mut asked = std::mem::take(&mut self.batch.asked);
        debug_assert!(asked.is_empty());
        let mut batch = Batch::scheduled(&mut self.sink);
        let mut next = None;
        for r in requests.by_ref() {
            let len = r.sge.length;
            // A gather request goes through the engine, whole, as its
            // single post does; so do those after it, to keep their order.
            if r.gather.is_some() || !self.engine.may_park(self.member, r.op, u64::from(len)) {
                next = Some(r);
                break;
            }
            let (op, sge, context) = (r.op, r.sge, r.context);
            match batch.push_checked(op, r.region, sge, context) {
                Ok(()) => {
                    self.engine.parked(self.member, len);
                    push_in_place(&mut asked, (op, r.range, sge));
                }
                Err((_, region)) => {
                    // No room in the send queue: through the engine.
                    next = Some(Request::single(op, region, r.range, sge, context));
                    break;
                }
            }
        }
        let mut back = Vec::new();
        let mut posted = batch.len();
        if let Err((taken, _, unposted)) = batch.post() {
            // Refused by the queue pair: uncounted, and through the engine
            // (whose refused pieces complete as failed at the next poll),
            // as a refused single post.
            posted = taken;
            for (piece, (op, range, sge)) in unposted.into_iter().zip(asked.drain(taken..)) {
                self.engine.parked_done(self.member);
                back.push(Request::single(op, piece.region, range, sge, piece.context));
            }
        }
        asked.clear();
        self.batch = BatchScratch { asked };
        back.extend(next);
        back.extend(requests);
        let result = accept_all(&mut self.engine, self.member, back).map_err(|mut refusal| {
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
}

impl<S: Sink, Q: PieceScheduler> Drop for Solo<S, Q> {
    fn drop(&mut self) {
        if let Some(leaving) = self.engine.detach(self.member, Some(&mut self.sink)) {
            // A queue pair of its own has no side; were there one, drain it.
            leaving.drain();
        }
    }
}
