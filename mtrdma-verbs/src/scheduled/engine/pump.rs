//! Deciding what goes next: pending grants, the rate limits, and pumping
//! the scheduler until nothing more may go.

use super::*;

/// The longest a piece held by its tenant's shared rate limit waits before
/// the limit is looked at again: a rate raised meanwhile lets it go within
/// this, not when the rate it was refused at would have.
pub(in crate::scheduled) const RATE_RECHECK_NS: u64 = 10_000_000;

impl<S: Sink, Q: PieceScheduler> Engine<S, Q> {
    /// Queues a granted piece behind its queue pair's other pending ones;
    /// returns its member, unless its queue pair was detached.
    pub(in crate::scheduled) fn make_pending(
        &mut self,
        grant: Grant<PieceRef>,
    ) -> Option<(usize, usize)> {
        let Some(msg) = self
            .messages
            .get(grant.handle.message)
            .filter(|m| m.seq == grant.handle.seq)
        else {
            // The queue pair it belonged to was detached.
            return None;
        };
        let member = msg.member;
        let m = self.member_mut(member);
        let class = m.class();
        // A grant larger than the queue pair's pieces may be (a scheduler
        // that chunks more coarsely than the latency bound) goes as
        // several.
        let pieces = m.lane.push_granted(grant);
        for _ in 0..pieces {
            self.order.push(class, member);
        }
        Some((member, pieces))
    }

    /// Posts `member`'s first pending piece if its queue pair, the bulk
    /// budget, its window and its shared rate limit let it go now, noting
    /// when to look again if pacing or the rate limit names a time.
    pub(in crate::scheduled) fn post_head(&mut self, member: usize) -> Post {
        let m = self.member(member);
        let Some(len) = m.lane.pending().front().map(|g| g.len) else {
            return Post::Held;
        };
        let limited = m.quota.is_some();
        if self.gate.budget_holds(&m.lane, len) {
            return Post::Budget;
        }
        let (clock, offset) = (&self.clock, self.shared_offset);
        match self
            .gate
            .admits(&m.lane, len, || Self::window_now(clock, offset))
        {
            Admit::Now => {}
            Admit::At(at) => {
                // Window pacing: the window's clock is the engine's plus
                // `offset`.
                let at = at.0.saturating_sub(offset);
                self.timed_wake = self.timed_wake.min(at);
                return Post::Held;
            }
            Admit::AfterCompletion => return Post::Held,
        }
        // (Only a tenant's queue pair has a shared rate limit.)
        if limited && !self.rate_allows(member, len) {
            let m = self.member(member);
            if let Some(q) = &m.quota {
                let wait = m.retry_at.saturating_sub(q.now_ns());
                self.timed_wake = self.timed_wake.min(self.clock.now().0 + wait);
            }
            return Post::Held;
        }
        let m = self.member_mut(member);
        let grant = m.lane.pop_pending().expect("checked above");
        self.post_piece(member, grant);
        Post::Posted
    }

    /// Whether `member`'s tenant may post `len` bytes now by its shared rate
    /// limit (charging it if so; otherwise noting when to try again).
    #[inline]
    pub(in crate::scheduled) fn rate_allows(&mut self, member: usize, len: u64) -> bool {
        let m = self.member_mut(member);
        let Some(q) = &m.quota else {
            return true;
        };
        let now = q.now_ns();
        if now < m.retry_at {
            return false;
        }
        match q.check_rate(now, len, 1) {
            Ok(()) => true,
            Err(at) => {
                // Looked at again within RATE_RECHECK_NS however far off
                // the rate puts it: the coordinator may raise the rate
                // meanwhile (a fair rate that was tiny while the tenant
                // was idle, a host's share of a cluster-wide cap).
                m.retry_at = at.min(now.saturating_add(RATE_RECHECK_NS));
                false
            }
        }
    }

    /// Posts pending pieces, then new ones from the scheduler, while the
    /// queue pairs, the bulk budget and the rate limits allow.
    pub(in crate::scheduled) fn pump(&mut self) {
        self.timed_wake = u64::MAX;
        let wake = self.pump_until();
        self.wake_at.store(wake, Ordering::Release);
    }

    /// [`pump`](Self::pump); returns when the engine next wants to be
    /// pumped if no piece completes and nothing is posted before then.
    pub(in crate::scheduled) fn pump_until(&mut self) -> u64 {
        let mut order = std::mem::take(&mut self.order);
        order.drain(|member| self.post_head(member));
        self.order = order;
        let mut reaped = false;
        // Grants waiting for their queue pair do not hold up the others,
        // but their number is bounded so the scheduler keeps the order.
        let pending_cap = Gate::pending_bound(self.members.len(), self.solo);
        let reap_soon = self.clock.now().0.saturating_add(REAP_INTERVAL_NS);
        while self.order.len() < pending_cap {
            if !self.gate.may_grant() {
                // Nothing may go until a bulk piece completes; queue pairs
                // whose owners have not polled may hold finished ones.
                if reaped {
                    return self.soon(reap_soon);
                }
                reaped = true;
                self.reap_others();
                self.release_stalled();
                continue;
            }
            let grant = match self.sched.dequeue(self.now()) {
                Dequeue::Ready(grant) => grant,
                Dequeue::Wait(at) if self.order.is_empty() => return at.0,
                Dequeue::Wait(at) => return at.0.min(self.soon(reap_soon)),
                Dequeue::Empty if self.order.is_empty() => return u64::MAX,
                Dequeue::Empty => return self.soon(reap_soon),
            };
            self.gate.granted(&grant);
            let class = grant.class;
            match self.make_pending(grant) {
                Some((member, 1)) => {
                    let mut order = std::mem::take(&mut self.order);
                    order.drain_newest(class, member, |member| self.post_head(member));
                    self.order = order;
                }
                // Split: as many of its pieces go as its lane lets.
                Some(_) => {
                    let mut order = std::mem::take(&mut self.order);
                    order.drain(|member| self.post_head(member));
                    self.order = order;
                }
                None => {}
            }
        }
        self.soon(reap_soon)
    }

    /// When to look again at pieces that wait: a queue pair with an engine
    /// of its own waits only for its completions or for `timed_wake` (what
    /// its rate limit or window pacing named, as found so far in this
    /// pump); a shared engine also looks again at `reap_soon` for the
    /// other queue pairs' sake.
    #[inline]
    pub(in crate::scheduled) fn soon(&self, reap_soon: u64) -> u64 {
        if self.solo {
            self.timed_wake
        } else {
            reap_soon
        }
    }

    /// Polls the queue pairs that hold bulk pieces in the NIC (their
    /// finished requests wait in `done` for their owners).
    /// Takes the queue pairs whose oldest bulk piece has been in the NIC
    /// too long off the bulk budget ([`Gate::release_if_stalled`]).
    pub(in crate::scheduled) fn release_stalled(&mut self) {
        let now = Self::window_now(&self.clock, self.shared_offset);
        for m in self.members.values_mut() {
            if self.gate.release_if_stalled(&mut m.lane, now) {
                tracing::warn!(
                    tenant = m.tenant.0,
                    stalled_ms = self.gate.stall_after().0 / 1_000_000,
                    "a scheduled queue pair's oldest piece has been in the NIC too long (its peer posts no receives, or is gone): its bytes no longer hold the other queue pairs' bulk traffic, and it posts nothing more until they complete"
                );
            }
        }
    }
}
