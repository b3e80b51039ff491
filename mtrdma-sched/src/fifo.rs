//! The simplest [`Scheduler`]: one FIFO for everyone, no chunking, no caps.

use std::collections::VecDeque;

use crate::descriptor::{Dequeue, Descriptor};
use crate::time::Nanos;
use crate::{Rejected, Scheduler};

/// First come, first served across all tenants and classes, whole
/// descriptors: what a NIC send queue does without mtrdma. It is the
/// baseline of the simulator, and a template for plugging in a scheduler
/// of your own.
///
/// ```
/// use mtrdma_sched::{TenantId, TrafficClass};
/// use mtrdma_sched::{Descriptor, Dequeue, FifoScheduler, Nanos, Opcode, Scheduler};
/// let mut fifo = FifoScheduler::new();
/// let d = |t, h| Descriptor::new(TenantId(t), TrafficClass::Bulk, Opcode::Write, 100, h);
/// fifo.enqueue(d(1, 'a'), Nanos(0)).unwrap();
/// fifo.enqueue(d(2, 'b'), Nanos(0)).unwrap();
/// assert_eq!(fifo.dequeue(Nanos(0)).ready().unwrap().handle, 'a');
/// assert_eq!(fifo.dequeue(Nanos(0)).ready().unwrap().handle, 'b');
/// assert_eq!(fifo.dequeue(Nanos(0)), Dequeue::Empty);
/// ```
#[derive(Debug, Clone)]
pub struct FifoScheduler<H> {
    queue: VecDeque<Descriptor<H>>,
}

impl<H> FifoScheduler<H> {
    /// An empty FIFO.
    pub fn new() -> Self {
        FifoScheduler {
            queue: VecDeque::new(),
        }
    }
}

impl<H> Default for FifoScheduler<H> {
    fn default() -> Self {
        FifoScheduler::new()
    }
}

impl<H> Scheduler<H> for FifoScheduler<H> {
    fn enqueue(&mut self, d: Descriptor<H>, _now: Nanos) -> Result<(), Rejected<H>> {
        self.queue.push_back(d);
        Ok(())
    }

    fn dequeue(&mut self, _now: Nanos) -> Dequeue<H> {
        match self.queue.pop_front() {
            Some(d) => Dequeue::Ready(d.grant_whole()),
            None => Dequeue::Empty,
        }
    }

    fn len(&self) -> usize {
        self.queue.len()
    }
}
