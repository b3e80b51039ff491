//! A queue pair a harness posts on either way it compares: straight on
//! the plain queue pair, or through mtrdma's scheduler (`--path raw` or
//! `mtrdma` of `perf` and `remote_memory`), driven the same way.

use std::time::Duration;

use mtrdma::verbs::{
    Completion, MemoryRegion, PollCompletions, PostError, QueuePair, ScheduledQueuePair, SendOp,
};

/// A connected queue pair: straight, or through the scheduler.
#[derive(Debug)]
pub enum Qp {
    /// Requests go to the queue pair as posted.
    Raw(QueuePair),
    /// Requests go through mtrdma's scheduled path.
    Sched(Box<ScheduledQueuePair>),
}

impl Qp {
    /// Posts `op` of the first `len` bytes of `region`, tagged `context`.
    pub fn post_send(
        &mut self,
        op: SendOp,
        region: MemoryRegion,
        len: usize,
        context: u64,
    ) -> Result<(), PostError> {
        match self {
            Qp::Raw(q) => q.post_send(op, region, 0..len, context),
            Qp::Sched(q) => q.post_send(op, region, 0..len, context),
        }
    }

    /// Posts a receive into the first `len` bytes of `region`, tagged
    /// `context`.
    pub fn post_recv(
        &mut self,
        region: MemoryRegion,
        len: usize,
        context: u64,
    ) -> Result<(), PostError> {
        match self {
            Qp::Raw(q) => q.post_recv(region, 0..len, context),
            Qp::Sched(q) => q.post_recv(region, 0..len, context),
        }
    }
}

impl PollCompletions for Qp {
    type Completion = Completion;

    fn poll(&mut self, out: &mut Vec<Completion>) -> Result<usize, mtrdma::Error> {
        match self {
            Qp::Raw(q) => q.poll(out),
            Qp::Sched(q) => q.poll(out),
        }
    }

    fn poll_wait(
        &mut self,
        out: &mut Vec<Completion>,
        timeout: Duration,
    ) -> Result<usize, mtrdma::Error> {
        match self {
            Qp::Raw(q) => q.poll_wait(out, timeout),
            Qp::Sched(q) => q.poll_wait(out, timeout),
        }
    }
}
