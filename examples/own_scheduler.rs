//! A scheduler of your own in mtrdma's data path: smallest request first.
//!
//! ```sh
//! cargo run --release --example own_scheduler -- [DEVICE]   # default: the first active one
//! ```
//!
//! `Sjf` below implements `mtrdma::sched::Scheduler` (enqueue, dequeue,
//! len) and is plugged into a queue pair with `QueuePair::scheduled_with`
//! (or into a `SharedScheduler` with `SharedScheduler::with_scheduler`).
//! The engine around it keeps what it always does: at most
//! `max_pieces_in_flight` pieces in the NIC, one completion per request,
//! the tenant's shared rate limit. Here one piece at a time: three 1 MiB
//! WRITEs and then a 4 KiB one are posted at once; the first WRITE goes,
//! the second waits for room, and the scheduler holds the others and picks
//! the small one before the third. The same requests through
//! `mtrdma::sched::FifoScheduler` complete in the order they were posted.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use mtrdma::sched::{Dequeue, Descriptor, FifoScheduler, Nanos, Rejected, Scheduler};
use mtrdma::verbs::PollCompletions;
use mtrdma::verbs::{Access, Context, PieceScheduler, ProtectionDomain, ScheduleConfig, SendOp};
use mtrdma::{TenantId, TrafficClass};

/// Smallest descriptor first (ties in arrival order), each granted whole.
struct Sjf<H> {
    heap: BinaryHeap<Reverse<(u64, u64)>>,
    waiting: Vec<Option<Descriptor<H>>>,
    arrivals: u64,
}

impl<H> Sjf<H> {
    fn new() -> Self {
        Sjf {
            heap: BinaryHeap::new(),
            waiting: Vec::new(),
            arrivals: 0,
        }
    }
}

impl<H> Scheduler<H> for Sjf<H> {
    fn enqueue(&mut self, d: Descriptor<H>, _now: Nanos) -> Result<(), Rejected<H>> {
        let slot = self.waiting.len() as u64;
        self.heap
            .push(Reverse((d.bytes, self.arrivals << 32 | slot)));
        self.arrivals += 1;
        self.waiting.push(Some(d));
        Ok(())
    }

    fn dequeue(&mut self, _now: Nanos) -> Dequeue<H> {
        let Some(Reverse((_, key))) = self.heap.pop() else {
            return Dequeue::Empty;
        };
        let d = self.waiting[(key & 0xffff_ffff) as usize]
            .take()
            .expect("each descriptor is granted once");
        if self.heap.is_empty() {
            self.waiting.clear();
        }
        Dequeue::Ready(d.grant_whole())
    }

    fn len(&self) -> usize {
        self.heap.len()
    }
}

/// Posts 3 x 1 MiB and then 4 KiB through `sched`, one piece in the NIC
/// at a time; returns the order their completions came in.
fn completion_order<Q: PieceScheduler>(
    pd: &ProtectionDomain,
    sched: Q,
) -> Result<Vec<u64>, Box<dyn std::error::Error>> {
    const BIG: usize = 1 << 20;
    let (a, b) = (pd.queue_pair().build()?, pd.queue_pair().build()?);
    let (ea, eb) = (a.endpoint(), b.endpoint());
    let config = ScheduleConfig {
        max_pieces_in_flight: 1,
        ..ScheduleConfig::local(TenantId(1), TrafficClass::Bulk)
    };
    let mut qp = a.connect(&eb)?.scheduled_with(config, sched)?;
    let _peer = b.connect(&ea)?;
    let target = pd.allocate(4 * BIG, Access::REMOTE_READ_WRITE)?;
    let remote = target.remote().ok_or("the target has remote access")?;
    for (i, len) in [BIG, BIG, BIG, 4096].into_iter().enumerate() {
        let to = remote
            .slice((i * BIG) as u64, len as u64)
            .ok_or("inside the target")?;
        qp.post_send(
            SendOp::Write(to),
            pd.allocate(len, Access::LOCAL)?,
            0..len,
            i as u64,
        )?;
    }
    let mut done = Vec::new();
    while done.len() < 4 {
        qp.poll(&mut done)?;
    }
    if let Some(c) = done.iter().find(|c| !c.status.is_success()) {
        return Err(format!("request {} failed: {:?}", c.context, c.status).into());
    }
    Ok(done.iter().map(|c| c.context).collect())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let ctx = match std::env::args().nth(1) {
        Some(name) => Context::open(&name)?,
        None => Context::open_first_active()?,
    };
    let pd = ctx.alloc_pd()?;
    println!("posted: 0, 1, 2 (1 MiB each), then 3 (4 KiB)");
    let show = |order: &[u64]| {
        order
            .iter()
            .map(u64::to_string)
            .collect::<Vec<_>>()
            .join(" ")
    };
    println!(
        "fifo completion order: {}",
        show(&completion_order(&pd, FifoScheduler::new())?)
    );
    println!(
        "sjf completion order: {}",
        show(&completion_order(&pd, Sjf::new())?)
    );
    Ok(())
}
