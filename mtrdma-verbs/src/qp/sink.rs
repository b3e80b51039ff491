//! Where a queue pair's send-side work requests go.

use super::*;

/// Where a queue pair's send-side work requests go: the device's send
/// queue ([`QueuePair`]), or a null sink on the host (benches and tests,
/// see [`crate::bench`]). Everything up to the device's `post_send` and
/// after its `poll_cq` is the same code for both.
pub(crate) trait Sink: Send + 'static {
    /// The buffers its work requests use.
    type Region: Region;

    /// The queue pair number.
    fn qpn(&self) -> u32;

    /// Its bookkeeping.
    fn books(&self) -> &Books<Self::Region>;

    /// Its bookkeeping, to change.
    fn books_mut(&mut self) -> &mut Books<Self::Region>;

    /// Hands one work request to the device (`ibv_post_send`).
    ///
    /// # Safety
    /// The memory `wr`'s scatter list names must stay valid and untouched
    /// by safe code until the request's completion is polled (or the queue
    /// pair is destroyed after being drained).
    unsafe fn post_wr(&mut self, wr: &mut ffi::ibv_send_wr) -> Result<(), Error>;

    /// Polls up to 32 completions: those of its own work requests into
    /// `out`, raw ones (see [`RAW_WR`]) into `raw`.
    fn poll(
        &mut self,
        out: &mut Vec<<Self::Region as Region>::Completion>,
        raw: &mut Vec<RawCompletion>,
    ) -> Result<usize, Error>;

    /// Flushes every outstanding request, waits for them, and destroys the
    /// queue pair. Returns whether everything was drained: only then may
    /// the buffers of raw requests be freed. Runs once; later calls return
    /// the first answer.
    fn shutdown(&mut self) -> bool;

    /// [`Error::NoCompletionEvents`] unless it can be waited for (see
    /// [`crate::events`]).
    fn check_events(&self) -> Result<(), Error>;

    /// Asks for an event at its next completion; says what to sleep on
    /// until then.
    fn arm_events(&mut self) -> Result<Armed, Error>;

    /// Takes and acknowledges the completion events that arrived.
    fn take_events(&mut self) -> Result<(), Error>;

    /// A device queue pair's teardown: moves it to the error state with
    /// `set_error` if requests are outstanding, waits (5 s at most) for
    /// every one of them to complete, and destroys it with `destroy` (which
    /// returns `ibv_destroy_qp`'s code). Returns whether everything was
    /// drained; if not, or if the destroy failed, every parked region is
    /// leaked, never freed while the NIC may still reach it.
    fn drain_and_destroy(
        &mut self,
        what: &'static str,
        set_error: impl FnOnce(&Self) -> Result<(), Error>,
        destroy: impl FnOnce(&mut Self) -> i32,
    ) -> bool
    where
        Self: Sized,
    {
        let outstanding = self.books().outstanding();
        if outstanding > 0 {
            let _ = set_error(self);
            let deadline = Instant::now() + Duration::from_secs(5);
            let (mut sink, mut raw) = (Vec::new(), Vec::new());
            while self.books().outstanding() > 0 && Instant::now() < deadline {
                if self.poll(&mut sink, &mut raw).is_err() {
                    break;
                }
                sink.clear();
                raw.clear();
            }
        }
        let drained = self.books().outstanding() == 0;
        tracing::debug!(outstanding, drained, "destroying {what}");
        let rc = destroy(self);
        if rc != 0 || !drained {
            tracing::error!(
                rc,
                drained,
                "{what} teardown incomplete; leaking in-flight buffers"
            );
            for region in self.books_mut().drain_regions() {
                std::mem::forget(region);
            }
            return false;
        }
        true
    }

    /// Polls completions of its own (not raw) work requests into `out`:
    /// the direct path's poll.
    fn poll_own(
        &mut self,
        out: &mut Vec<<Self::Region as Region>::Completion>,
    ) -> Result<usize, Error> {
        let mut raw = Vec::new();
        let n = self.poll(out, &mut raw)?;
        debug_assert!(
            raw.is_empty(),
            "raw work requests are polled by their owner"
        );
        Ok(n)
    }

    /// The tenant it was created for, if any.
    fn tenant(&self) -> Option<&TenantHandle>;

    /// Whether the send queue has room for another request.
    fn send_room(&self) -> u32 {
        let books = self.books();
        books.max_send_wr.saturating_sub(books.sends_in_flight)
    }

    /// Posts one send-side work request.
    ///
    /// # Safety
    /// The memory `raw.sge` names must stay valid and untouched by safe
    /// code until the request's completion is polled (or the queue pair is
    /// destroyed after being drained).
    #[inline]
    unsafe fn post(&mut self, raw: RawSend) -> Result<(), Error> {
        let books = self.books();
        if books.sends_in_flight >= books.max_send_wr {
            return Err(Error::SendQueueFull {
                depth: books.max_send_wr,
            });
        }
        let mut sge = raw.sge;
        let mut wr = send_wr(&raw, &mut sge);
        // SAFETY: `wr` and `sge` outlive the call (the device copies them
        // into its send queue); the caller keeps the buffer alive until
        // the completion.
        unsafe { self.post_wr(&mut wr) }?;
        self.books_mut().sends_in_flight += 1;
        Ok(())
    }

    /// Posts a send-side operation on `range` of `region`, parking the
    /// region under the request's `wr_id` until its completion is polled;
    /// on refusal the region comes back with the error.
    fn post_parked(
        &mut self,
        op: SendOp,
        region: Self::Region,
        range: Range<usize>,
        context: u64,
    ) -> Result<(), (Error, Self::Region)> {
        let sge = match check_send(op, &region, &range) {
            Ok(sge) => sge,
            Err(error) => return Err((error, region)),
        };
        self.park_and_post(op, region, sge, context, 0)
    }

    /// [`post_parked`](Self::post_parked) of a request `check_send` found
    /// to be `sge`, its `wr_id` marked with `flag` (0 or [`SCHED_WR`]).
    #[inline]
    fn park_and_post(
        &mut self,
        op: SendOp,
        region: Self::Region,
        sge: ffi::ibv_sge,
        context: u64,
        flag: u64,
    ) -> Result<(), (Error, Self::Region)> {
        let books = self.books_mut();
        if books.sends_in_flight >= books.max_send_wr {
            let depth = books.max_send_wr;
            return Err((Error::SendQueueFull { depth }, region));
        }
        let (opcode, remote, imm) = op.lower(true);
        let ud = region.datagram();
        let extra = region.extra(true, true);
        let slot = books.park(Slot {
            context,
            region,
            send: true,
            len: sge.length,
        });
        let raw = RawSend {
            wr_id: slot as u64 | flag,
            opcode,
            sge,
            remote: remote.map(|r| (r.addr, r.rkey)),
            imm,
            atomic: op.atomic(),
            ud,
            extra,
        };
        // SAFETY: the buffer `sge` points at is owned by the slot just
        // parked and stays there until the completion is polled.
        if let Err(error) = unsafe { self.post(raw) } {
            let slot = self.books_mut().unpark(slot).expect("just parked");
            return Err((error, slot.region));
        }
        Ok(())
    }
}
