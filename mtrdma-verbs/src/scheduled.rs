//! The scheduled data path: every send goes through a per-tenant scheduler
//! before it reaches the NIC.
//!
//! [`ScheduledQueuePair`] wraps a connected [`QueuePair`]. A send is handed
//! to mtrdma's [`TenantScheduler`]; large WRITE and READ are split into
//! chunks (so a latency-sensitive tenant waits behind at most one chunk of
//! anyone's), the number of pieces in the NIC at once is bounded, and the
//! tenant's rate limits (its caps, and the coordinator's fair rate, shared
//! by all its processes through the quota table) are applied to every
//! piece. Only the last piece's completion is shown to the application, as
//! one completion for the whole request with its region handed back.
//!
//! Progress is made when the application polls: [`ScheduledQueuePair::poll`]
//! reaps completions and posts whatever the scheduler lets go next. There is
//! no background thread.

use std::ops::Range;

use mtrdma_core::{TenantHandle, TenantId, TrafficClass};
use mtrdma_sched::{
    Clock, Dequeue, Descriptor, Grant, Nanos, Opcode as SchedOpcode, QuantaClock, Scheduler,
    SchedulerConfig, TenantPolicy, TenantScheduler,
};

use crate::completion::{Completion, Opcode, WcStatus};
use crate::qp::{check_send, PostError, QueuePair, RawCompletion, RawSend, SendOp, RAW_WR};
use crate::slab::Slab;
use crate::{Error, MemoryRegion};

/// How a queue pair's sends are scheduled.
#[derive(Debug, Clone)]
pub struct ScheduleConfig {
    /// WRITE and READ longer than this are split into pieces of at most
    /// this many bytes (default 64 KiB).
    pub chunk_bytes: u64,
    /// Pieces of this queue pair in the NIC at once (default 4): what a
    /// latency-sensitive neighbour may find ahead of it.
    pub max_pieces_in_flight: u32,
    /// The traffic class when no tenant handle gives one (default bulk).
    pub class: TrafficClass,
    /// The tenant whose quota table rates and accounting apply (none: the
    /// queue pair is scheduled on its own, without shared limits).
    pub tenant: Option<TenantHandle>,
}

impl Default for ScheduleConfig {
    fn default() -> Self {
        ScheduleConfig {
            chunk_bytes: 64 << 10,
            max_pieces_in_flight: 4,
            class: TrafficClass::Bulk,
            tenant: None,
        }
    }
}

/// One send request and the pieces of it still in the NIC.
struct Message {
    op: SendOp,
    region: MemoryRegion,
    start: usize,
    len: u64,
    context: u64,
    pieces_out: u32,
    last_granted: bool,
    status: WcStatus,
}

/// A queue pair whose sends are scheduled (see the module docs).
pub struct ScheduledQueuePair {
    qp: QueuePair,
    sched: TenantScheduler<usize>,
    tenant: TenantId,
    class: TrafficClass,
    quota: Option<TenantHandle>,
    clock: QuantaClock,
    messages: Slab<Message>,
    /// A piece the shared rate limit held back, and when it may go.
    held: Option<(Grant<usize>, u64)>,
    max_pieces: u32,
    chunk_bytes: u64,
    /// Bytes accepted and not yet posted (this queue pair's share of the
    /// tenant's demand in the quota table).
    backlog: u64,
    pieces_in_flight: u32,
    done: Vec<Completion>,
    raw: Vec<RawCompletion>,
}

impl std::fmt::Debug for ScheduledQueuePair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScheduledQueuePair")
            .field("qp", &self.qp)
            .field("tenant", &self.tenant)
            .field("class", &self.class)
            .field("queued", &self.queued())
            .field("pieces_in_flight", &self.pieces_in_flight)
            .finish()
    }
}

impl QueuePair {
    /// Routes this queue pair's sends through a scheduler.
    pub fn scheduled(self, config: ScheduleConfig) -> Result<ScheduledQueuePair, Error> {
        let sched_config = SchedulerConfig {
            chunk_bytes: config.chunk_bytes,
            quantum_bytes: config.chunk_bytes,
            ..SchedulerConfig::default()
        };
        let mut sched =
            TenantScheduler::new(sched_config).map_err(|e| Error::Schedule(e.to_string()))?;
        let (tenant, class, weight) = match &config.tenant {
            Some(t) => {
                let weight = t.policy().map_or(1, |p| p.weight);
                (t.tenant(), t.class(), weight)
            }
            None => (TenantId(0), config.class, 1),
        };
        sched
            .set_policy(tenant, TenantPolicy::weight(weight))
            .map_err(|e| Error::Schedule(e.to_string()))?;
        Ok(ScheduledQueuePair {
            qp: self,
            sched,
            tenant,
            class,
            quota: config.tenant,
            clock: QuantaClock::new(),
            messages: Slab::default(),
            held: None,
            max_pieces: config.max_pieces_in_flight.max(1),
            chunk_bytes: config.chunk_bytes,
            backlog: 0,
            pieces_in_flight: 0,
            done: Vec::new(),
            raw: Vec::new(),
        })
    }
}

impl ScheduledQueuePair {
    /// The underlying queue pair.
    pub fn queue_pair(&self) -> &QueuePair {
        &self.qp
    }

    /// Send requests accepted and not yet completed.
    pub fn queued(&self) -> usize {
        self.messages.len()
    }

    /// The time base: the quota table's shared clock when there is a
    /// tenant handle (its rate limits live on it), the TSC otherwise.
    fn now(&self) -> u64 {
        match &self.quota {
            Some(q) => q.now_ns(),
            None => self.clock.now().0,
        }
    }

    /// Accepts a send-side request. It is posted now if the scheduler lets
    /// it go, or kept in the software backlog and posted by a later
    /// [`poll`](Self::poll). Bounds are checked first; a refused request
    /// hands its region back.
    pub fn post_send(
        &mut self,
        op: SendOp,
        region: MemoryRegion,
        range: Range<usize>,
        context: u64,
    ) -> Result<(), PostError> {
        if let Err(error) = check_send(op, &region, &range) {
            return Err(PostError {
                error: Box::new(error),
                region,
            });
        }
        let len = (range.end - range.start) as u64;
        let message = Message {
            op,
            region,
            start: range.start,
            len,
            context,
            pieces_out: 0,
            last_granted: false,
            status: WcStatus::Success,
        };
        let index = self.messages.insert(message);
        // Fast path: nothing of this queue pair is waiting, the request is
        // one piece, and there is room in the NIC: post it now, without a
        // trip through the scheduler's queues.
        let one_piece =
            len <= self.chunk_bytes || matches!(op, SendOp::Send | SendOp::SendWithImm(_));
        if one_piece
            && self.held.is_none()
            && self.sched.is_empty()
            && self.pieces_in_flight < self.max_pieces
            && self.qp.send_room() > 0
        {
            let grant = Grant {
                tenant: self.tenant,
                class: self.class,
                op: SchedOpcode::Send,
                handle: index,
                offset: 0,
                len,
                is_last: true,
            };
            match &self.quota {
                Some(q) => {
                    // Demand until posted (posting takes it off again).
                    self.backlog += len;
                    q.add_backlog(i64::try_from(len).unwrap_or(i64::MAX));
                    match q.check_rate(q.now_ns(), len, 1) {
                        Ok(()) => self.post_piece(grant),
                        Err(retry_at) => self.held = Some((grant, retry_at)),
                    }
                }
                None => self.post_piece(grant),
            }
            return Ok(());
        }
        let kind = match op {
            SendOp::Send | SendOp::SendWithImm(_) => SchedOpcode::Send,
            SendOp::Write(_) | SendOp::WriteWithImm(..) => SchedOpcode::Write,
            SendOp::Read(_) => SchedOpcode::Read,
        };
        let descriptor = Descriptor::new(self.tenant, self.class, kind, len, index);
        let now = self.now();
        if let Err(rejected) = self.sched.enqueue(descriptor, Nanos(now)) {
            let message = self.messages.remove(index).expect("just stored");
            return Err(PostError {
                error: Box::new(Error::Schedule(rejected.reason.to_string())),
                region: message.region,
            });
        }
        if let Some(q) = &self.quota {
            self.backlog += len;
            q.add_backlog(i64::try_from(len).unwrap_or(i64::MAX));
        }
        self.pump();
        Ok(())
    }

    /// Posts a receive (receives are not scheduled).
    pub fn post_recv(
        &mut self,
        region: MemoryRegion,
        range: Range<usize>,
        context: u64,
    ) -> Result<(), PostError> {
        self.qp.post_recv(region, range, context)
    }

    /// Reaps completions, posts what the scheduler lets go next, and moves
    /// finished requests (one completion each, region handed back) and
    /// receives into `out`. Returns how many it added.
    pub fn poll(&mut self, out: &mut Vec<Completion>) -> Result<usize, Error> {
        let before = out.len();
        let mut raw = std::mem::take(&mut self.raw);
        self.qp.poll_inner(out, &mut raw)?;
        for c in raw.drain(..) {
            let index = (c.wr_id & !RAW_WR) as usize;
            self.pieces_in_flight -= 1;
            if let Some(m) = self.messages.get_mut(index) {
                m.pieces_out -= 1;
                if !c.status.is_success() && m.status.is_success() {
                    m.status = c.status;
                }
            }
            self.finish_if_done(index);
        }
        self.raw = raw;
        self.pump();
        out.append(&mut self.done);
        Ok(out.len() - before)
    }

    /// Posts pieces while the scheduler, the rate limits and the
    /// in-flight bound allow.
    fn pump(&mut self) {
        let now = self.now();
        while self.pieces_in_flight < self.max_pieces && self.qp.send_room() > 0 {
            let grant = match self.held.take() {
                Some((grant, at)) if now < at => {
                    self.held = Some((grant, at));
                    return;
                }
                Some((grant, _)) => grant,
                None => match self.sched.dequeue(Nanos(now)) {
                    Dequeue::Ready(grant) => grant,
                    Dequeue::Wait(_) | Dequeue::Empty => return,
                },
            };
            if let Some(q) = &self.quota {
                if let Err(retry_at) = q.check_rate(now, grant.len, 1) {
                    self.held = Some((grant, retry_at));
                    return;
                }
            }
            self.post_piece(grant);
        }
    }

    fn post_piece(&mut self, grant: Grant<usize>) {
        let index = grant.handle;
        let Some(m) = self.messages.get_mut(index) else {
            return;
        };
        if grant.is_last {
            m.last_granted = true;
        }
        if !m.status.is_success() {
            // The request already failed: its remaining pieces are dropped.
            self.finish_if_done(index);
            return;
        }
        let (opcode, remote, imm) = m.op.lower(grant.is_last);
        let Some(mut sge) = m.region.sge(&(m.start..m.start + m.len as usize)) else {
            // Checked at `post_send`; should it ever fail, fail the request
            // rather than leave it waiting forever.
            m.status = WcStatus::LocalLength;
            self.finish_if_done(index);
            return;
        };
        sge.addr += grant.offset;
        sge.length = u32::try_from(grant.len).unwrap_or(u32::MAX);
        let raw = RawSend {
            wr_id: RAW_WR | index as u64,
            opcode,
            sge,
            remote: remote.map(|r| (r.addr + grant.offset, r.rkey)),
            imm,
        };
        // SAFETY: the piece lies inside the message's region (checked at
        // `post_send`), and the message keeps the region until every piece
        // has completed (`finish_if_done`), or forever if the queue pair
        // cannot be drained (`Drop`).
        match unsafe { self.qp.post_send_raw(raw) } {
            Ok(()) => {
                m.pieces_out += 1;
                self.pieces_in_flight += 1;
                if let Some(q) = &self.quota {
                    q.record_posted(grant.len, 1);
                    self.backlog = self.backlog.saturating_sub(grant.len);
                    q.add_backlog(-i64::try_from(grant.len).unwrap_or(i64::MAX));
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "posting a scheduled piece failed");
                m.status = WcStatus::LocalQpOperation;
                self.finish_if_done(index);
            }
        }
    }

    /// Completes a request once all its pieces are granted and done.
    fn finish_if_done(&mut self, index: usize) {
        let ready = matches!(
            self.messages.get(index),
            Some(m) if m.pieces_out == 0 && m.last_granted
        );
        if !ready {
            return;
        }
        let m = self.messages.remove(index).expect("checked above");
        let ok = m.status.is_success();
        self.done.push(Completion {
            context: m.context,
            status: m.status,
            opcode: if ok {
                m.op.completion_opcode()
            } else {
                Opcode::Unknown
            },
            byte_len: u32::try_from(m.len).unwrap_or(u32::MAX),
            imm: None,
            region: m.region,
        });
    }
}

impl Drop for ScheduledQueuePair {
    fn drop(&mut self) {
        if let Some(q) = &self.quota {
            // What is still waiting here is no longer demand.
            q.add_backlog(-i64::try_from(self.backlog).unwrap_or(i64::MAX));
        }
        if !self.qp.shutdown() {
            // The NIC may still reach these regions: never free them.
            for m in self.messages.drain() {
                std::mem::forget(m.region);
            }
        }
    }
}
