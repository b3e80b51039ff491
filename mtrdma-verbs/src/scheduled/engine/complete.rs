//! Completions in: reaping, each piece done, and a request finished
//! once its last piece has completed.

use super::*;

impl<S: Sink, Q: PieceScheduler> Engine<S, Q> {
    pub(in crate::scheduled) fn reap_others(&mut self) {
        let holders: Vec<usize> = self
            .members
            .iter()
            .filter(|(_, m)| m.side.is_some() && m.lane.bulk_bytes_out() > 0)
            .map(|(k, _)| k)
            .collect();
        for member in holders {
            if let Err(e) = self.reap(member) {
                tracing::warn!(error = %e, "polling a scheduled queue pair failed");
            }
        }
    }

    /// Polls `member`'s completion queue: receives go to its `done`, pieces
    /// are matched to their requests, and finished requests go to `done`.
    pub(in crate::scheduled) fn reap(&mut self, member: usize) -> Result<(), Error> {
        let Some(side) = self.member(member).side.clone() else {
            return Ok(());
        };
        let result = side.try_reap();
        let mut raw = std::mem::take(&mut self.scratch);
        if side.mail.load(Ordering::Acquire) {
            std::mem::swap(&mut raw, &mut lock(&side.book).raw);
        }
        self.process(member, &raw);
        raw.clear();
        self.scratch = raw;
        result
    }

    /// Matches the piece completions `member`'s side has collected to
    /// their requests.
    #[inline]
    pub(in crate::scheduled) fn process(&mut self, member: usize, raw: &[RawCompletion]) {
        let mut at = 0;
        while let Some(c) = raw.get(at) {
            if c.wr_id == PARKED_DONE {
                // A batch's requests report together: one look-up of the
                // member for the run.
                let run = raw[at..]
                    .iter()
                    .take_while(|c| c.wr_id == PARKED_DONE)
                    .count();
                self.parked_done(member, run);
                at += run;
            } else {
                let message = (c.wr_id & !RAW_WR) as usize;
                self.piece_done(member, message, c.status, c.sampled);
                at += 1;
            }
        }
    }

    /// Accounts one finished piece.
    #[inline]
    pub(in crate::scheduled) fn piece_done(
        &mut self,
        member: usize,
        message: usize,
        status: WcStatus,
        sampled: bool,
    ) {
        let (clock, offset, host) = (&self.clock, self.shared_offset, self.host_delay);
        let m = self
            .members
            .get_mut(member)
            .expect("a queue pair's member entry lives as long as it does");
        if let (Some(w), Some(q)) = (m.lane.window_mut(), &m.quota) {
            // The queue allowance in bytes at the link's measured rate, the
            // coordinator's gain that brings the tenants' shares to their
            // weights, the weights the link's windows share their growth
            // with, and whether they may keep one piece whatever the delay.
            let now = Self::window_now(clock, offset).0;
            w.signals(&q.window_signals(now));
        } else if let (Some(q), true) = (&m.quota, m.lane.keeps_delay_shift()) {
            // A latency queue pair judging the floor: its delays are the
            // trial's while any tenant has it.
            let now = Self::window_now(clock, offset).0;
            m.lane.set_permit(q.floor_permit(now));
        }
        let now = || Self::window_now(clock, offset);
        let done = if sampled {
            self.gate.completed(&mut m.lane, message, now, host)
        } else {
            self.gate.completed_unsampled(&mut m.lane, message, now)
        };
        if done.is_none() {
            tracing::error!(message, "completion for a piece that is not in flight");
            return;
        }
        if let (Some(w), Some(q)) = (m.lane.window_mut(), &m.quota) {
            // What the window saw, for the coordinator's capacity.
            let v = w.take_verdicts();
            if v.judged > 0 {
                q.record_verdicts(v.judged, v.over_target);
            }
        } else if let (Some(q), Some(shift)) = (&m.quota, m.lane.take_shift_report()) {
            q.report_delay_shift(shift);
        }
        m.raw_out -= 1;
        let Some(msg) = self.messages.get_mut(message) else {
            return;
        };
        if !status.is_success() && msg.status.is_success() {
            msg.status = status;
        }
        if !msg.status.is_success() && !msg.last_granted {
            // Failed with pieces not yet granted: it reports as soon as
            // its pieces in the NIC are back, not after the scheduler has
            // paced out the rest (which is dropped as it comes: its bytes
            // leave the tenant's backlog now).
            msg.last_granted = true;
            msg.abandoned = true;
            let left = msg.len.saturating_sub(msg.granted);
            if let Some(q) = &m.quota {
                m.backlog = m.backlog.saturating_sub(left);
                q.add_backlog(-i64::try_from(left).unwrap_or(i64::MAX));
            }
        }
        if msg.pieces_out == 1 && msg.last_granted {
            // Its last piece: finished (the count is not written first, so
            // the move out of the slab does not wait for that store).
            self.finish(message);
        } else {
            msg.pieces_out -= 1;
        }
    }

    /// Completes a request once all its pieces are granted and done.
    pub(in crate::scheduled) fn finish_if_done(&mut self, message: usize) {
        let ready = matches!(
            self.messages.get(message),
            Some(m) if m.pieces_out == 0 && m.last_granted
        );
        if ready {
            self.finish(message);
        }
    }

    /// Completes request `message` (all its pieces are done or dropped).
    #[inline]
    pub(in crate::scheduled) fn finish(&mut self, message: usize) {
        let Some(m) = self.messages.remove(message) else {
            return;
        };
        let Some(owner) = self.members.get_mut(m.member) else {
            // Its queue pair was detached: the region is dropped.
            return;
        };
        owner.accepted -= 1;
        if let (Some(side), false) = (&owner.side, m.status.is_success()) {
            side.forget_refused(RAW_WR | message as u64);
        }
        match &owner.side {
            Some(side) if m.member != self.caller => side.deliver_done(m.complete()),
            _ => push_in_place(&mut self.own_done, m.complete()),
        }
    }
}
