//! A queue pair on a shared engine ([`SharedScheduler`](crate::SharedScheduler)):
//! the engine's lock is taken to decide, never held while posting.

use super::*;

/// A queue pair attached to a [`Shared`] engine.
pub(in crate::scheduled) struct Attached<S: Sink, Q: PieceScheduler> {
    pub(in crate::scheduled) engine: Arc<Mutex<Engine<S, Q>>>,
    /// Its queue pair and finished requests: polled without the engine's
    /// lock, which is taken only when there is scheduling to do.
    pub(in crate::scheduled) side: Arc<Side<S>>,
    /// When the engine next wants a pump without a completion (the
    /// engine's clock; `u64::MAX`: not before a completion or a post).
    pub(in crate::scheduled) wake_at: Arc<AtomicU64>,
    pub(in crate::scheduled) clock: EngineClock,
    /// Piece completions polled and not yet matched (kept for its capacity).
    pub(in crate::scheduled) raw: Vec<RawCompletion>,
    /// Own pieces the engine decided, to post (kept for its capacity).
    pub(in crate::scheduled) pieces: Vec<RawSend>,
    /// Other queue pairs' sides to post for (kept for its capacity).
    pub(in crate::scheduled) sides: Vec<Arc<Side<S>>>,
    /// The last poll took piece completions (see `Waitable::took`).
    pub(in crate::scheduled) took: bool,
    pub(in crate::scheduled) member: usize,
    pub(in crate::scheduled) class: TrafficClass,
}

impl<S: Sink, Q: PieceScheduler> Attached<S, Q> {
    pub(in crate::scheduled) fn poll(&mut self, out: &mut Vec<Done<S>>) -> Result<usize, Error> {
        let before = out.len();
        let mut raw = std::mem::take(&mut self.raw);
        let polled = lock(&self.side.qp).poll(out, &mut raw);
        // What the engine or other threads left for this queue pair.
        if self.side.mail.load(Ordering::Acquire) {
            let to_post = {
                let mut book = lock(&self.side.book);
                self.side.mail.store(false, Ordering::Relaxed);
                out.append(&mut book.done);
                raw.append(&mut book.raw);
                !book.to_post.is_empty()
            };
            if to_post {
                self.side.flush();
            }
        }
        // Only a finished piece or a due wake-up gives the scheduler
        // something to do; otherwise the engine's lock is left to others.
        let due = wake_due(&self.wake_at, &self.clock);
        self.took = !raw.is_empty();
        if self.took || due {
            let member = self.member;
            self.with_engine(|e| e.completed_into(member, &raw, due, out));
        }
        raw.clear();
        self.raw = raw;
        polled.map(|_| out.len() - before)
    }

    /// Runs `f` on the engine, then posts what it decided outside the
    /// engine's lock: posting can be slow (SoftRoCE moves the data in the
    /// posting thread) and must not hold up the other queue pairs.
    ///
    /// Pieces decided for this queue pair are posted by this thread, which
    /// takes the queue pair's lock before letting go of the engine's, so
    /// they keep their order. Pieces decided for other queue pairs are left
    /// to their owners' next poll, unless they have waited longer than
    /// [`HELP_AFTER_NS`]: then a bulk queue pair posts them (never a
    /// latency one, whose thread must not be held up by other tenants'
    /// work).
    pub(in crate::scheduled) fn with_engine<R>(
        &mut self,
        f: impl FnOnce(&mut Engine<S, Q>) -> R,
    ) -> R {
        let mut e = lock(&self.engine);
        let result = e.as_caller(self.member, f);
        std::mem::swap(&mut self.pieces, e.own_pieces_mut());
        if !e.own_done_mut().is_empty() {
            // Finished while posting (another queue pair's poll reaped
            // them): the next poll hands them over.
            let mut book = lock(&self.side.book);
            book.done.append(e.own_done_mut());
            self.side.mail.store(true, Ordering::Release);
        }
        let helps = self.class == TrafficClass::Bulk;
        e.sides_to_post(&self.side, helps, &mut self.sides);
        let qp = if self.pieces.is_empty() {
            None
        } else {
            match self.side.qp.try_lock() {
                Ok(qp) => Some(qp),
                Err(TryLockError::Poisoned(p)) => Some(p.into_inner()),
                Err(TryLockError::WouldBlock) => {
                    // Another thread is posting for this queue pair: queue
                    // these behind its pieces for it (or the next poll).
                    let mut book = lock(&self.side.book);
                    if book.to_post.is_empty() {
                        book.decided_at = e.now().0;
                    }
                    book.to_post.extend(self.pieces.drain(..));
                    self.side.mail.store(true, Ordering::Release);
                    e.post_later(&self.side);
                    None
                }
            }
        };
        drop(e);
        if let Some(mut qp) = qp {
            self.side.post(&mut qp, &mut self.pieces);
        }
        for side in self.sides.drain(..) {
            side.flush();
        }
        result
    }
}

impl<S: Sink, Q: PieceScheduler> Waitable for Attached<S, Q> {
    type Item = Done<S>;

    fn poll(&mut self, out: &mut Vec<Done<S>>) -> Result<usize, Error> {
        Attached::poll(self, out)
    }

    fn check_events(&mut self) -> Result<(), Error> {
        lock(&self.side.qp).check_events()
    }

    fn arm(&mut self) -> Result<Armed, Error> {
        lock(&self.side.qp).arm_events()
    }

    fn take_events(&mut self) -> Result<(), Error> {
        lock(&self.side.qp).take_events()
    }

    fn poll_by(&self) -> Option<Instant> {
        let slice = Instant::now() + ATTACHED_WAIT;
        Some(wake_instant(&self.wake_at, &self.clock).map_or(slice, |at| at.min(slice)))
    }

    fn took(&self) -> bool {
        self.took
    }
}

impl<S: Sink, Q: PieceScheduler> Drop for Attached<S, Q> {
    fn drop(&mut self) {
        let member = self.member;
        // Out of the engine under its lock; drained after, so that the
        // other queue pairs go on while the NIC flushes this one.
        if let Some(leaving) = self.with_engine(|e| e.detach(member, None)) {
            leaving.drain();
        }
    }
}
