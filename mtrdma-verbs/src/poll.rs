//! [`PollCompletions`]: polling for completions, and sleeping until there
//! are some, the same way on every queue pair and on a shared completion
//! queue.

use std::time::Duration;

use crate::Error;
#[cfg(doc)]
use crate::{
    Completion, QueuePair, ScheduledQueuePair, ScheduledUdQueuePair, SharedCompletion,
    SharedCompletionQueue, UdCompletion, UdQueuePair,
};

/// Completions polled from a queue pair ([`QueuePair`], [`UdQueuePair`],
/// and their scheduled forms [`ScheduledQueuePair`] and
/// [`ScheduledUdQueuePair`]) or from a [`SharedCompletionQueue`]: each
/// finished request hands its region back in its completion.
///
/// Bring it into scope to poll (`use mtrdma_verbs::PollCompletions;`, or
/// `use mtrdma::prelude::*;`).
///
/// ```no_run
/// use std::time::Duration;
/// use mtrdma_verbs::{Access, Context, PollCompletions, SendOp};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let ctx = Context::open_first_active()?;
/// let pd = ctx.alloc_pd()?;
/// let a = pd.queue_pair().completion_events(true).build()?;
/// let b = pd.queue_pair().build()?;
/// let (ea, eb) = (a.endpoint(), b.endpoint());
/// let (mut a, _b) = (a.connect(&eb)?, b.connect(&ea)?);
///
/// let target = pd.allocate(4096, Access::REMOTE_READ_WRITE)?;
/// let src = pd.allocate(4096, Access::LOCAL)?;
/// a.post_send(SendOp::Write(target.remote().unwrap()), src, 0..4096, 1)?;
/// let mut done = Vec::new();
/// while done.is_empty() {
///     // Sleeps until the WRITE completes (checking every second).
///     a.poll_wait(&mut done, Duration::from_secs(1))?;
/// }
/// assert!(done[0].status.is_success());
/// # Ok(())
/// # }
/// ```
pub trait PollCompletions {
    /// What one completion reports ([`Completion`], [`UdCompletion`] with
    /// the sender, or [`SharedCompletion`] with its queue pair's number).
    type Completion;

    /// Polls up to 32 completions into `out` without waiting; returns how
    /// many it added. A scheduled queue pair also posts here what its
    /// scheduler lets go next, and hands back each request once, when its
    /// last piece has completed.
    fn poll(&mut self, out: &mut Vec<Self::Completion>) -> Result<usize, Error>;

    /// [`poll`](Self::poll), sleeping rather than spinning while there is
    /// nothing to hand back: returns once it has added completions to
    /// `out` (how many), or with 0 when `timeout` runs out. An interrupted
    /// sleep goes on for the time that remains.
    ///
    /// The queue pair must be built with completion events
    /// ([`QueuePairBuilder::completion_events`](crate::QueuePairBuilder::completion_events),
    /// [`UdQueuePairBuilder::completion_events`](crate::UdQueuePairBuilder::completion_events);
    /// a shared completion queue has them by default); otherwise this
    /// returns [`Error::NoCompletionEvents`]. While one thread sleeps here,
    /// the CPU is free for others: a machine with a few cores can host many
    /// tenants that wait rather than spin.
    fn poll_wait(
        &mut self,
        out: &mut Vec<Self::Completion>,
        timeout: Duration,
    ) -> Result<usize, Error>;
}
