//! Where a queue pair's send-side work requests go.

use super::*;

/// Work requests handed to the device in one call at most
/// ([`Sink::post_list`]).
pub(crate) const LIST_MAX: usize = 32;

/// In a list, at least one work request in this many asks for its
/// completion, and one in half the list when that is fewer
/// ([`Sink::post_list`]).
pub(crate) const SIGNAL_EVERY: usize = 16;

/// The methods of a [`Sink`] impl whose books are its `books` field:
/// `books` and `books_mut`; with `quiet`, also `quiet_lists` (true: it
/// posts lists as given); with `queue pair of` its region type (a device
/// queue pair, its number from its inherent `qpn`, holding
/// its tenant's permit in `_permit` and completing on its `cq`), those
/// and its `tenant`, a `post_wr` that posts the request as a list of one,
/// and its completion events (those of its `cq`).
macro_rules! sink_books {
    () => {
        fn books(&self) -> &Books<Self::Region> {
            &self.books
        }

        fn books_mut(&mut self) -> &mut Books<Self::Region> {
            &mut self.books
        }
    };
    (quiet) => {
        $crate::qp::sink_books!();

        fn quiet_lists(&self) -> bool {
            true
        }
    };
    (queue pair of $region:ty) => {
        type Region = $region;

        fn qpn(&self) -> u32 {
            Self::qpn(self)
        }

        $crate::qp::sink_books!(quiet);

        fn tenant(&self) -> Option<&TenantHandle> {
            self._permit.as_ref().map(OwnedQpPermit::handle)
        }

        unsafe fn post_wr(&mut self, wr: &mut ffi::ibv_send_wr) -> Result<(), Error> {
            // SAFETY: as the caller promises; `wr` alone is a list of one.
            unsafe { self.post_wr_list(wr) }.map_err(|(_, e)| e)
        }

        fn check_events(&self) -> Result<(), Error> {
            self.cq.check_events()
        }

        fn arm_events(&mut self) -> Result<Armed, Error> {
            self.cq.arm().map_err(|e| self.verbs_error(e))
        }

        fn take_events(&mut self) -> Result<(), Error> {
            self.cq
                .take_events()
                .map(drop)
                .map_err(|e| self.verbs_error(e))
        }
    };
}
pub(crate) use sink_books;

/// Where a queue pair's send-side work requests go: the device's send
/// queue ([`QueuePair`]), or a null sink on the host (benches and tests,
/// see [`crate::testing`]). Everything up to the device's `post_send` and
/// after its `poll_cq` is the same code for both.
pub(crate) trait Sink: Send + 'static {
    /// The buffers its work requests use.
    type Region: Region;

    /// The queue pair number.
    fn qpn(&self) -> u32;

    /// The device it is on, if it is a device's (for what the device does
    /// not run, [`unsupported_op`](crate::qp::unsupported_op)).
    fn device(&self) -> Option<&crate::Context> {
        None
    }

    /// `op` on `sges` scatter entries, if the device does not run it
    /// ([`unsupported_op`](crate::qp::unsupported_op)): checked before posting
    /// a gather, since SoftiWARP's provider takes a READ into several
    /// entries and fills only the first.
    fn unsupported(&self, op: SendOp, sges: usize) -> Option<Error> {
        crate::qp::unsupported_op(self.device()?, op, sges)
    }

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

    /// Whether pieces may go unsignaled in a list ([`post_list`](Self::post_list)):
    /// a sink whose books number its sends ([`Books::tag_send`]) reports
    /// the unsignaled ones with the completion after them. The default is
    /// no: every piece asks for its completion (a foreign program's queue
    /// pair, which keeps its own order of what it posted).
    fn quiet_lists(&self) -> bool {
        false
    }

    /// Hands the linked list of work requests that starts at `wr` to the
    /// device. On refusal, the requests before the refused one were taken
    /// (their number comes with the error) and the rest were not. A device
    /// queue pair takes the list in one call (one doorbell); the default
    /// hands the requests over one at a time.
    ///
    /// # Safety
    /// As [`post_wr`](Self::post_wr), for every request of the list; each
    /// `next` is null or points at a valid request.
    unsafe fn post_wr_list(&mut self, wr: &mut ffi::ibv_send_wr) -> Result<(), (usize, Error)> {
        let mut taken = 0;
        let mut at: *mut ffi::ibv_send_wr = wr;
        // SAFETY: the caller's promise: every `next` is null or valid.
        while let Some(this) = unsafe { at.as_mut() } {
            let next = this.next;
            this.next = std::ptr::null_mut();
            // SAFETY: as the caller promises for the list.
            let result = unsafe { self.post_wr(this) };
            this.next = next;
            result.map_err(|e| (taken, e))?;
            taken += 1;
            at = next;
        }
        Ok(())
    }

    /// Polls up to 32 completions: those of its own work requests into
    /// `out`, raw ones (see [`RAW_WR`]) into `raw`.
    fn poll(
        &mut self,
        out: &mut Vec<<Self::Region as Region>::Completion>,
        raw: &mut Vec<RawCompletion>,
    ) -> Result<usize, Error>;

    /// Flushes every outstanding request, waits for them, and destroys the
    /// queue pair. Returns whether the device is done with every request
    /// (drained, or the queue pair destroyed): only then may the buffers
    /// of raw requests be freed. Runs once; later calls return the first
    /// answer.
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
    /// returns `ibv_destroy_qp`'s code). Returns whether the device is done
    /// with every request: drained, or destroyed (a destroyed queue pair's
    /// requests are the device's no more). If the destroy failed, every
    /// parked region is leaked, never freed while the NIC may still reach
    /// it.
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
        if rc != 0 {
            tracing::error!(
                rc,
                drained,
                "{what} teardown failed; leaking in-flight buffers"
            );
            for region in self.books_mut().drain_regions() {
                std::mem::forget(region);
            }
            return false;
        }
        if !drained {
            // Destroyed, the queue pair's requests are the device's no
            // more: what it never reported (SoftiWARP does not flush
            // requests posted once the queue pair is in the error state)
            // is freed now.
            tracing::warn!(
                outstanding = self.books().outstanding(),
                "{what}: requests the device never completed are given back after destroying it"
            );
            let books = self.books_mut();
            books.drain_regions().for_each(drop);
            books.sends_in_flight = 0;
            books.recvs_in_flight = 0;
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
        let mut wr = send_wr(&raw, &mut sge, false);
        // SAFETY: `wr` and `sge` outlive the call (the device copies them
        // into its send queue); the caller keeps the buffer alive until
        // the completion.
        unsafe { self.post_wr(&mut wr) }?;
        self.books_mut().sends_in_flight += 1;
        Ok(())
    }

    /// Posts `pieces` in order, as lists of up to [`LIST_MAX`] work
    /// requests (one call to the device each). A piece that may go
    /// unsignaled ([`RawSend::quiet_ok`]) does unless it is the last of
    /// its list or the `k`-th, `k` half the list (rounded up) and at most
    /// [`SIGNAL_EVERY`]: its completion comes with the signaled one after
    /// it, and every list ends with one, so no piece waits for a
    /// completion that nothing asked for. On refusal, the
    /// pieces before the refused one were posted (their number comes with
    /// the error) and the rest were not.
    ///
    /// # Safety
    /// As [`post`](Self::post), for every piece.
    unsafe fn post_list(&mut self, pieces: &[RawSend]) -> Result<(), (usize, Error)> {
        let mut done = 0;
        while done < pieces.len() {
            let room = self.send_room() as usize;
            if room == 0 {
                let depth = self.books().max_send_wr;
                return Err((done, Error::SendQueueFull { depth }));
            }
            let n = (pieces.len() - done).min(LIST_MAX).min(room);
            // Not zeroed: only the first `n` entries are written and read.
            let mut sges = [const { MaybeUninit::<ffi::ibv_sge>::uninit() }; LIST_MAX];
            let mut wrs = [const { MaybeUninit::<ffi::ibv_send_wr>::uninit() }; LIST_MAX];
            // Half the list (rounded up), at most SIGNAL_EVERY: a window
            // of a few pieces gets half of them back while the rest are
            // on the wire, rather than all of them after the last.
            let every = n.div_ceil(2).clamp(1, SIGNAL_EVERY);
            let lists_quiet = self.quiet_lists();
            for (i, piece) in pieces[done..done + n].iter().enumerate() {
                let sge = sges[i].write(piece.sge);
                let quiet = lists_quiet && piece.quiet_ok && i + 1 < n && (i + 1) % every != 0;
                wrs[i].write(send_wr(piece, sge, quiet));
            }
            // Every link comes from one pointer to the whole array: a
            // reference taken to one entry after a link to it was made
            // would invalidate that link (Stacked Borrows; Miri checks
            // this path).
            let base = wrs.as_mut_ptr().cast::<ffi::ibv_send_wr>();
            for i in 1..n {
                // SAFETY: entries `..n` were written just above, and `i < n
                // <= LIST_MAX`, the array's length.
                unsafe { (*base.add(i - 1)).next = base.add(i) };
            }
            // SAFETY: the first `n` entries are written and linked (the
            // last one's `next` is null, as `send_wr` built it); their
            // scatter entries live in `sges` until the call returns (the
            // device copies them); the caller keeps the buffers alive.
            let result = unsafe { self.post_wr_list(&mut *base) };
            let taken = match &result {
                Ok(()) => n,
                Err((taken, _)) => *taken,
            };
            self.books_mut().sends_in_flight += taken as u32;
            if taken > 0 && taken < n {
                // SAFETY: entry `taken - 1` was written above.
                let last = unsafe { &*wrs[taken - 1].as_ptr() };
                if last.send_flags & ffi::ibv_send_flags::IBV_SEND_SIGNALED.0 == 0 {
                    self.report_quiet(NOP_WR);
                }
            }
            done += taken;
            result.map_err(|(_, e)| (done, e))?;
        }
        Ok(())
    }

    /// After a list was refused part way with an unsignaled request last
    /// among those taken: posts a zero-length RDMA WRITE that asks for its
    /// completion (`wr_id`: [`NOP_WR`], or a group's [`GROUP_NOP`] naming
    /// that request; the responder checks neither address nor
    /// key of a zero-length one, IBA C9-88), so that those requests
    /// complete. If the queue pair refuses that too, it is in the error
    /// state or broken, and moving it there flushes every request,
    /// signaled or not.
    #[cold]
    fn report_quiet(&mut self, wr_id: u64) {
        let nop = RawSend {
            wr_id,
            opcode: ffi::ibv_wr_opcode::IBV_WR_RDMA_WRITE,
            sge: ffi::ibv_sge::default(),
            remote: Some((0, 0)),
            imm: None,
            atomic: None,
            ud: None,
            extra: Extra::default(),
            quiet_ok: false,
        };
        // SAFETY: it names no memory.
        if let Err(e) = unsafe { self.post(nop) } {
            tracing::warn!(error = %e, "a queue pair refused the request that reports its unsignaled ones");
        }
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

    /// Posts a gather request: one send-side operation on the ranges of
    /// several regions, in order, as one work request whose scatter list
    /// names them all ([`check_gather`] checks it first). Every region is
    /// parked under the request's `wr_id` until its completion is polled,
    /// which hands them all back in order; on refusal they come back with
    /// the error, in order, each with its range.
    #[allow(clippy::type_complexity)]
    fn post_gather(
        &mut self,
        op: SendOp,
        parts: Vec<(Self::Region, Range<usize>)>,
        context: u64,
    ) -> Result<(), (Error, Vec<(Self::Region, Range<usize>)>)> {
        let gather = match check_gather(op, &parts, self.books().max_send_sge) {
            Ok(gather) => gather,
            Err(error) => return Err((error, parts)),
        };
        if let Some(error) = self.unsupported(op, gather.sges.len()) {
            return Err((error, parts));
        }
        let (regions, ranges): (Vec<_>, Vec<_>) = parts.into_iter().unzip();
        let raw = match self.books_mut().park_gather(op, regions, &gather, context) {
            Ok(raw) => raw,
            Err((error, regions)) => {
                return Err((error, regions.into_iter().zip(ranges).collect()))
            }
        };
        let slot = raw.wr_id as usize;
        // SAFETY: the buffers the scatter list names are the regions just
        // parked, which stay in the slot until the completion is polled;
        // the list itself, `gather.sges`, lives until the call returns
        // (the device copies it into its send queue).
        let posted = unsafe { self.post(raw) };
        drop(gather);
        if let Err(error) = posted {
            let slot = self.books_mut().unpark(slot).expect("just parked");
            return Err((error, slot.into_regions().zip(ranges).collect()));
        }
        Ok(())
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
        let raw = self.books_mut().park_send(op, region, sge, context)?;
        let slot = raw.wr_id as usize;
        let raw = RawSend {
            wr_id: raw.wr_id | flag,
            ..raw
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
