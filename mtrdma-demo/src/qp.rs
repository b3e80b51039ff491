//! A queue pair a harness posts on either way it compares: straight on
//! the plain queue pair, or through mtrdma's scheduler (`--path raw` or
//! `mtrdma` of `perf` and `remote_memory`), driven the same way.

use std::time::Duration;

use mtrdma::verbs::{
    Completion, MemoryRegion, PollCompletions, PostError, QueuePair, ScheduleConfig,
    ScheduledQueuePair, SendOp,
};

/// Which way a harness's requests go (its `--path`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PathKind {
    /// Straight on the queue pair (`raw`).
    Raw,
    /// Through mtrdma's scheduler (`mtrdma`, also read as `scheduled`).
    Mtrdma,
}

impl PathKind {
    /// The name command lines and reports use.
    pub fn name(self) -> &'static str {
        match self {
            PathKind::Raw => "raw",
            PathKind::Mtrdma => "mtrdma",
        }
    }

    /// The path `s` names, if it names one.
    pub fn from_name(s: &str) -> Option<PathKind> {
        match s {
            "raw" => Some(PathKind::Raw),
            "mtrdma" | "scheduled" => Some(PathKind::Mtrdma),
            _ => None,
        }
    }
}

/// A connected queue pair: straight, or through the scheduler.
#[derive(Debug)]
pub enum Qp {
    /// Requests go to the queue pair as posted.
    Raw(QueuePair),
    /// Requests go through mtrdma's scheduled path.
    Sched(Box<ScheduledQueuePair>),
}

impl Qp {
    /// `qp` for requests on `path`: as it is, or through the scheduler as
    /// `config` (asked for only on the scheduled path) sets it up.
    pub fn on_path(
        qp: QueuePair,
        path: PathKind,
        config: impl FnOnce() -> ScheduleConfig,
    ) -> Result<Qp, mtrdma::verbs::Error> {
        Ok(match path {
            PathKind::Raw => Qp::Raw(qp),
            PathKind::Mtrdma => Qp::Sched(Box::new(qp.scheduled(config())?)),
        })
    }

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

    fn poll(&mut self, out: &mut Vec<Completion>) -> Result<usize, mtrdma::verbs::Error> {
        match self {
            Qp::Raw(q) => q.poll(out),
            Qp::Sched(q) => q.poll(out),
        }
    }

    fn poll_wait(
        &mut self,
        out: &mut Vec<Completion>,
        timeout: Duration,
    ) -> Result<usize, mtrdma::verbs::Error> {
        match self {
            Qp::Raw(q) => q.poll_wait(out, timeout),
            Qp::Sched(q) => q.poll_wait(out, timeout),
        }
    }
}
