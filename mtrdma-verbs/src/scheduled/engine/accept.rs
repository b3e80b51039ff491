//! Requests in: what may be parked or posted at once, and what is
//! accepted, split and queued.

use super::*;

impl<S: Sink, Q: PieceScheduler> Engine<S, Q> {
    /// Whether `member`'s request of `len` bytes may be posted now as the
    /// direct path posts it, its region parked in the queue pair's own
    /// books (its completion then comes out of the queue pair's poll in
    /// order, and the engine only counts the piece): a queue pair with an
    /// engine of its own, no shared rate limit or caps to charge, a request
    /// of one piece with nothing queued ahead, room in the NIC, and no raw
    /// piece in flight (whose request would finish after this one's).
    #[inline]
    pub(in crate::scheduled) fn may_park(&self, member: usize, op: SendOp, len: u64) -> bool {
        let m = self.member(member);
        m.side.is_none()
            && m.quota.is_none()
            && m.lane.window().is_none()
            && !self.capped
            && m.raw_out == 0
            && self.unhindered(m, op.kind(), len)
    }

    /// Whether `m`'s request of `len` bytes may skip the scheduler's
    /// queues (before caps and rate limits): [`Gate::unhindered`].
    #[inline]
    pub(in crate::scheduled) fn unhindered(
        &self,
        m: &Member<S>,
        op: SchedOpcode,
        len: u64,
    ) -> bool {
        // A time to try again is found when the request is pumped.
        self.gate
            .unhindered(&m.lane, op, len, self.sched.is_empty(), || {
                Self::window_now(&self.clock, self.shared_offset)
            })
    }

    /// Counts a request of `len` bytes that `may_park` let go, posted.
    #[inline]
    pub(in crate::scheduled) fn parked(&mut self, member: usize, len: u32) {
        let m = self
            .members
            .get_mut(member)
            .expect("a queue pair's member entry lives as long as it does");
        // No window on a parked queue pair (`may_park`): no clock reading.
        self.gate
            .sent(&mut m.lane, PARKED, u64::from(len), || Nanos(0));
        m.accepted += 1;
    }

    /// Counts `n` parked requests as finished (their completions went to
    /// the owner from the queue pair's poll, or the queue pair never took
    /// them).
    #[inline]
    pub(in crate::scheduled) fn parked_done(&mut self, member: usize, n: usize) {
        let m = self
            .members
            .get_mut(member)
            .expect("a queue pair's member entry lives as long as it does");
        for _ in 0..n {
            let done = self
                .gate
                .completed(&mut m.lane, PARKED, || Nanos(0), Nanos::ZERO);
            if done.is_none() {
                tracing::error!("completion for a parked request that is not in flight");
                return;
            }
            m.accepted -= 1;
        }
    }

    /// Accepts a request whose range `check_send` found to be `sge`:
    /// lets it go now if it may (the fast path), or queues it. Returns the
    /// piece when its owner is to post it at once (the caller holding the
    /// engine, or a queue pair with an engine of its own); anything else
    /// decided is in `own_pieces` or the books.
    #[inline]
    pub(in crate::scheduled) fn post_send(
        &mut self,
        member: usize,
        op: Op,
        region: S::Region,
        range: Range<usize>,
        sge: ffi::ibv_sge,
        context: u64,
    ) -> Result<Option<RawSend>, (Error, S::Region)> {
        self.accept(member, op, region, range, sge, context, None)
            .map_err(|(error, region, _)| (error, region))
    }

    /// [`post_send`](Self::post_send) of a gather request (see
    /// [`ScheduledQueuePair::post_send_gather`]): `region` its first,
    /// `gather` the others and its scatter list, `len` its bytes. It goes
    /// whole, never split. On refusal every region comes back.
    #[allow(clippy::type_complexity)]
    pub(in crate::scheduled) fn post_gather(
        &mut self,
        member: usize,
        op: SendOp,
        region: S::Region,
        gather: Box<Gathered<S::Region>>,
        len: u32,
        context: u64,
    ) -> Result<Option<RawSend>, (Error, S::Region, Box<Gathered<S::Region>>)> {
        let op = Op { op, whole: true };
        let sge = gather.sges.first().copied().unwrap_or_default();
        self.accept(
            member,
            op,
            region,
            0..len as usize,
            sge,
            context,
            Some(gather),
        )
        .map_err(|(error, region, gather)| (error, region, gather.expect("given")))
    }

    /// [`post_send`](Self::post_send), for a gather request too.
    #[inline]
    #[allow(clippy::too_many_arguments, clippy::type_complexity)]
    pub(super) fn accept(
        &mut self,
        member: usize,
        Op { op, whole }: Op,
        region: S::Region,
        range: Range<usize>,
        sge: ffi::ibv_sge,
        context: u64,
        gather: Option<Box<Gathered<S::Region>>>,
    ) -> Result<Option<RawSend>, (Error, S::Region, Option<Box<Gathered<S::Region>>>)> {
        self.follow_policy(member);
        let len = (range.end - range.start) as u64;
        let seq = self.next_seq;
        self.next_seq += 1;
        let kind = op.kind();
        let m = self.member(member);
        let (tenant, class) = (m.tenant, m.class());
        // Fast path: nothing in the way and the tenant's caps in this
        // scheduler let it go now: post it without a trip through the
        // scheduler's queues (if its shared rate limit agrees).
        // A request sent whole that is longer than a piece waits for the
        // scheduler, which grants it as one piece.
        let fast = self.unhindered(m, kind, len)
            && (!self.capped || self.sched.admit_now(tenant, len, self.now()).is_ok());
        let go = fast && self.rate_allows(member, len);
        let ud = region.datagram();
        let mut extra = region.extra(true, true);
        let sge = match &gather {
            Some(gather) => gather.lower(&mut extra),
            None => sge,
        };
        let message = self.messages.insert(Message {
            member,
            seq,
            op,
            region,
            start: range.start,
            len,
            context,
            // Sent now: its one piece is out, and the last.
            pieces_out: u32::from(go),
            last_granted: go,
            granted: if go { len } else { 0 },
            abandoned: false,
            status: WcStatus::Success,
            gather,
        });
        self.member_mut(member).accepted += 1;
        if go {
            let raw = RawSend::new(RAW_WR | message as u64, op, true, sge, ud, extra, false);
            return Ok(self.launch(member, raw, len));
        }
        let handle = PieceRef { message, seq };
        if fast {
            // Held back by its shared rate limit only (its caps here have
            // been charged): the wake-up time must say when to try again.
            self.add_backlog(member, len);
            self.make_pending(Grant {
                tenant,
                class,
                op: kind,
                handle,
                offset: 0,
                len,
                is_last: true,
            });
            self.pump();
            return Ok(None);
        }
        let mut descriptor = Descriptor::new(tenant, class, kind, len, handle);
        if whole {
            descriptor = descriptor.whole();
        }
        if let Err(rejected) = self.sched.enqueue(descriptor, self.now()) {
            self.member_mut(member).accepted -= 1;
            let message = self.messages.remove(message).expect("just stored");
            return Err((
                Error::Rejected(rejected.reason),
                message.region,
                message.gather,
            ));
        }
        self.gate.enqueued(class);
        self.add_backlog(member, len);
        self.pump();
        Ok(None)
    }

    /// Counts `len` accepted bytes as the tenant's demand until posted.
    pub(in crate::scheduled) fn add_backlog(&mut self, member: usize, len: u64) {
        let m = self.member_mut(member);
        if let Some(q) = &m.quota {
            m.backlog += len;
            q.add_backlog(i64::try_from(len).unwrap_or(i64::MAX));
        }
    }
}
