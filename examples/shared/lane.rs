//! Either way of posting a queue pair's sends (straight on the plain queue
//! pair, or through mtrdma's scheduler), driven the same way: what
//! `postrate` compares and the isolation demo's tenants post through.

// Its items are `pub` for mtrdma-demo's library, which includes it too;
// in an example they are the crate's own.
#![allow(unreachable_pub)]

use mtrdma::verbs::PollCompletions;
use mtrdma::verbs::{Completion, MemoryRegion, QueuePair, ScheduledQueuePair, SendOp};

/// Either way of posting, driven the same way.
pub trait Lane: Send {
    /// Posts `op` of the first `len` bytes of `region`.
    fn post(&mut self, op: SendOp, region: MemoryRegion, len: usize) -> Result<(), String>;
    /// Appends the completions ready to `out`.
    fn reap(&mut self, out: &mut Vec<Completion>) -> Result<(), String>;
}

/// [`Lane`] for queue pairs whose `post_send` and `poll` read the same
/// (the plain and the scheduled one).
macro_rules! lane {
    ($($qp:ty),*) => {$(
        impl Lane for $qp {
            fn post(&mut self, op: SendOp, region: MemoryRegion, len: usize) -> Result<(), String> {
                self.post_send(op, region, 0..len, 0)
                    .map_err(|e| e.to_string())
            }
            fn reap(&mut self, out: &mut Vec<Completion>) -> Result<(), String> {
                self.poll(out).map(|_| ()).map_err(|e| e.to_string())
            }
        }
    )*};
}
lane!(QueuePair, ScheduledQueuePair);
