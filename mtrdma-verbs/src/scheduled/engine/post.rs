//! Pieces out: a granted piece built and launched to the device.

use super::*;

impl<S: Sink, Q: PieceScheduler> Engine<S, Q> {
    pub(in crate::scheduled) fn post_piece(&mut self, member: usize, grant: Grant<PieceRef>) {
        let PieceRef { message, seq } = grant.handle;
        let Some(msg) = self.messages.get_mut(message).filter(|m| m.seq == seq) else {
            return;
        };
        if msg.abandoned {
            // The rest of a request that failed: its bytes left the
            // backlog when it did.
            return;
        }
        if grant.is_last {
            msg.last_granted = true;
        }
        msg.granted = msg.granted.saturating_add(grant.len);
        let m = self
            .members
            .get_mut(member)
            .expect("pending pieces belong to attached queue pairs");
        if let Some(q) = &m.quota {
            m.backlog = m.backlog.saturating_sub(grant.len);
            q.add_backlog(-i64::try_from(grant.len).unwrap_or(i64::MAX));
        }
        if !msg.status.is_success() {
            // The request already failed: its remaining pieces are dropped.
            self.finish_if_done(message);
            return;
        }
        let wr_id = RAW_WR | message as u64;
        if let Some(gather) = &msg.gather {
            if grant.offset != 0 || !grant.is_last {
                // A gather request goes whole (its descriptor says so);
                // should a scheduler split it, fail it rather than send
                // part of its list.
                msg.status = WcStatus::LocalLength;
                self.finish_if_done(message);
                return;
            }
            let mut extra = msg.region.extra(true, true);
            let sge = gather.lower(&mut extra);
            let ud = msg.region.datagram();
            let raw = RawSend::new(wr_id, msg.op, true, sge, ud, extra, false);
            msg.pieces_out += 1;
            self.launch_decided(member, raw, grant.len);
            return;
        }
        let Some(mut sge) = msg.region.sge(&(msg.start..msg.start + msg.len as usize)) else {
            // Checked at `post_send`; should it ever fail, fail the request
            // rather than leave it waiting forever.
            msg.status = WcStatus::LocalLength;
            self.finish_if_done(message);
            return;
        };
        sge.addr += grant.offset;
        sge.length = u32::try_from(grant.len).unwrap_or(u32::MAX);
        let (ud, extra) = (
            msg.region.datagram(),
            msg.region.extra(grant.offset == 0, grant.is_last),
        );
        // Its request's last piece reports at once; the others may report
        // with a later piece of their list.
        let mut raw = RawSend::new(wr_id, msg.op, grant.is_last, sge, ud, extra, !grant.is_last);
        if let Some((addr, _)) = &mut raw.remote {
            *addr += grant.offset;
        }
        msg.pieces_out += 1;
        self.launch_decided(member, raw, grant.len);
    }

    /// [`launch`](Self::launch) of a piece the engine decided: if the
    /// caller posts it, it joins `own_pieces` (moved once: a piece is
    /// large enough that each copy is a call to `memcpy`).
    #[inline(always)]
    fn launch_decided(&mut self, member: usize, raw: RawSend, len: u64) {
        if self.sent(member, raw.wr_id, len) {
            push_in_place(&mut self.own_pieces, raw);
        } else {
            self.deliver(member, raw);
        }
    }

    /// Counts `raw`, a piece of `len` bytes, as in flight on `member`'s
    /// queue pair and hands it to whoever posts it: back to the caller if
    /// the owner does (it holds the engine, or has no side), else to its
    /// side's book.
    #[inline]
    #[must_use]
    pub(in crate::scheduled) fn launch(
        &mut self,
        member: usize,
        raw: RawSend,
        len: u64,
    ) -> Option<RawSend> {
        if self.sent(member, raw.wr_id, len) {
            return Some(raw);
        }
        self.deliver(member, raw);
        None
    }

    /// Counts piece `wr_id` of `len` bytes as in flight on `member`'s
    /// queue pair; whether the caller posts it (its queue pair's owner
    /// holds the engine, or has no side), else [`deliver`](Self::deliver)
    /// hands it to the side.
    #[inline]
    fn sent(&mut self, member: usize, wr_id: u64, len: u64) -> bool {
        let message = (wr_id & !RAW_WR) as usize;
        let (clock, offset) = (&self.clock, self.shared_offset);
        let m = self
            .members
            .get_mut(member)
            .expect("pieces belong to attached queue pairs");
        self.gate.sent(&mut m.lane, message, len, || {
            Self::window_now(clock, offset)
        });
        m.raw_out += 1;
        if let Some(q) = &m.quota {
            q.record_posted(len, 1);
        }
        match &m.side {
            // Its owner holds the engine and posts it on the way out; no
            // piece of it waits in the book (that would set the mail).
            Some(side) => member == self.caller && !side.mail.load(Ordering::Acquire),
            None => true,
        }
    }

    /// Leaves `raw`, counted by [`sent`](Self::sent), in `member`'s side's
    /// book for its owner to post.
    fn deliver(&mut self, member: usize, raw: RawSend) {
        let Some(side) = self.members.get(member).and_then(|m| m.side.as_ref()) else {
            return;
        };
        let now = self.clock.now().0;
        side.deliver(|book| {
            if book.to_post.is_empty() {
                book.decided_at = now;
            }
            book.to_post.push_back(raw);
        });
        if !self.flush.iter().any(|s| Arc::ptr_eq(s, side)) {
            self.flush.push(Arc::clone(side));
        }
    }
}
