//! Pure per-tenant schedulers for RDMA work requests: no I/O, no RDMA, no
//! threads, no clock of their own.
//!
//! Like `quinn-proto`, everything here is a state machine: it is fed
//! [`Descriptor`]s (tenant, traffic class, bytes, an opaque handle) and
//! clock readings ([`Nanos`]), and it answers which piece of work goes next
//! ([`Dequeue::Ready`]), when to ask again ([`Dequeue::Wait`]), or that
//! nothing is queued ([`Dequeue::Empty`]). So it runs in virtual time in
//! tests and in the [`sim`] simulator, and on a real [`QuantaClock`] in
//! `mtrdma-verbs`.
//!
//! * [`Scheduler`]: the trait the verbs layer's engine is generic over;
//!   implement it to plug in a scheduler of your own
//!   (`mtrdma_verbs::QueuePair::scheduled_with`,
//!   `SharedScheduler::with_scheduler`; [`FifoScheduler`] is the smallest
//!   example, `examples/own_scheduler.rs` another).
//! * The types every mtrdma crate speaks in: [`TenantId`], [`TrafficClass`],
//!   [`RateLimit`], [`TenantPolicy`] (a tenant's weight and caps), and
//!   [`stats`] (percentiles, Jain's index). This crate depends on no other
//!   mtrdma crate.
//! * [`TenantScheduler`]: the default. Latency class first with a
//!   starvation guard for bulk, weighted deficit round robin across
//!   tenants (O(1) per decision), GCRA caps per tenant, chunking of large
//!   WRITE/READ descriptors.
//! * [`compose`]: the default's three ideas as separate pieces that
//!   compose through [`Scheduler`]: weighted DRR ([`compose::Drr`]),
//!   latency priority with the starvation guard ([`compose::Priority`])
//!   and GCRA caps in front of any scheduler ([`compose::Shaped`]).
//!   [`compose::composed`] puts them together as the default behaves (it
//!   grants exactly what [`TenantScheduler`] grants, tested); take them
//!   apart for other schedulers.
//! * [`gcra_decide`] / [`Gcra`]: rate shaping whose whole state is one
//!   `u64`, so it also runs on an atomic in shared memory.
//! * [`gate`]: what reaches the NIC and when around a scheduler (the bulk
//!   budget, each queue pair's pieces in flight and delay window, the fast
//!   path, grant order): the rules `mtrdma-verbs`' engine runs, and the
//!   simulator with it.
//! * [`protection`]: what the operator's latency bound asks of every bulk
//!   sender (its piece size and queue allowance), and how a sender's own
//!   settings are held to it.
//! * [`piece_floor`]: when the coordinator lets delay windows keep one
//!   piece whatever the delay (pacing under a piece costs a sleep per
//!   piece), judged by what it does to the latency tenants' delays.
//! * [`sim`]: a discrete-event model of one NIC port, with and without
//!   mtrdma, running the shipped rules of [`gate`].
//!
//! # Example
//!
//! ```
//! use mtrdma_sched::{TenantId, TrafficClass};
//! use mtrdma_sched::{
//!     Clock, Descriptor, Dequeue, ManualClock, Nanos, Opcode, RateLimit, Scheduler,
//!     SchedulerConfig, TenantPolicy, TenantScheduler,
//! };
//!
//! let clock = ManualClock::new(Nanos(0));
//! let mut sched = TenantScheduler::new(SchedulerConfig::default()).unwrap();
//! // Tenant 1 gets twice tenant 2's share; tenant 2 is also capped at 1 Gb/s.
//! sched.set_policy(TenantId(1), TenantPolicy::weight(2)).unwrap();
//! sched
//!     .set_policy(TenantId(2), TenantPolicy::weight(1).with_byte_cap(RateLimit::gbits_per_sec(1)))
//!     .unwrap();
//!
//! let bulk = |tenant, handle| {
//!     Descriptor::new(TenantId(tenant), TrafficClass::Bulk, Opcode::Write, 256 << 10, handle)
//! };
//! sched.enqueue(bulk(1, 10), clock.now()).unwrap();
//! sched.enqueue(bulk(2, 20), clock.now()).unwrap();
//!
//! let mut sent = [0u64; 3];
//! loop {
//!     match sched.dequeue(clock.now()) {
//!         Dequeue::Ready(grant) => {
//!             // Post `grant.len` bytes at `grant.offset` of the work request
//!             // `grant.handle`; here, pretend the wire takes 1 ns per byte.
//!             sent[grant.tenant.0 as usize] += grant.len;
//!             clock.advance(Nanos(grant.len));
//!         }
//!         Dequeue::Wait(until) => clock.set(until),
//!         Dequeue::Empty => break,
//!     }
//! }
//! assert_eq!(sent, [0, 256 << 10, 256 << 10]);
//! ```
#![forbid(unsafe_code)]

mod chunk;
pub mod compose;
mod descriptor;
mod error;
mod fifo;
pub mod gate;
mod gcra;
mod guard;
mod id_hash;
mod nodes;
pub mod piece_floor;
mod policy;
pub mod protection;
mod ring;
pub mod share;
pub mod sim;
pub mod stats;
mod tenant;
mod tenant_scheduler;
mod time;
pub mod window;

pub use chunk::{Chunk, ChunkPolicy, Chunks};
pub use descriptor::{Dequeue, Descriptor, Grant, Opcode};
pub use error::{ConfigError, RejectReason, Rejected};
pub use fifo::FifoScheduler;
pub use gcra::{gcra_decide, gcra_shared, EmissionInterval, Gcra, RateLimit};
// Shared by the workspace's crates (the preload library's maps, the async
// wrapper's books), not part of the scheduling API.
#[doc(hidden)]
pub use id_hash::IdHasher;
pub use policy::{SchedulerConfig, TenantPolicy, MAX_QUANTUM, MAX_WEIGHT};
pub use protection::Protection;
pub use tenant::{TenantId, TrafficClass};
pub use tenant_scheduler::{Drained, TenantScheduler};
pub use time::{Clock, ManualClock, Nanos, QuantaClock};
pub use window::{
    Admit, DelayWindow, DelayWindowConfig, FixedWindow, Signals, Verdicts, Window, WindowFactory,
    WindowView, MAX_ALLOWANCE,
};

/// A scheduler of RDMA work requests, driven by the caller.
///
/// The caller enqueues descriptors as the application posts them and asks
/// for the next piece of work whenever the NIC can take one (after a post,
/// after polling a completion, or at the time a [`Dequeue::Wait`] named).
/// Time is always passed in, never read, so an implementation is a pure
/// state machine.
///
/// Contract every implementation keeps: every byte of every accepted
/// descriptor is granted exactly once, pieces of one descriptor in order
/// and ending with one `is_last` grant; a refused descriptor is handed back
/// in [`Rejected`].
pub trait Scheduler<H> {
    /// Queues `d`, or hands it back with the reason it was refused.
    ///
    /// # Errors
    /// [`Rejected`], carrying the descriptor, when it cannot be queued.
    fn enqueue(&mut self, d: Descriptor<H>, now: Nanos) -> Result<(), Rejected<H>>;

    /// The next piece of work that may be posted at `now`, or when to ask
    /// again, or that nothing is queued.
    fn dequeue(&mut self, now: Nanos) -> Dequeue<H>;

    /// Descriptors queued, counting one that is partly granted.
    fn len(&self) -> usize;

    /// Whether nothing is queued.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Sets how `tenant` is treated (its weight and caps), for schedulers
    /// that weigh or cap tenants; the default takes note of nothing.
    ///
    /// # Errors
    /// [`ConfigError`] for a policy the scheduler cannot follow.
    fn set_policy(&mut self, tenant: TenantId, policy: TenantPolicy) -> Result<(), ConfigError> {
        let _ = (tenant, policy);
        Ok(())
    }

    /// How `tenant` is treated, if the scheduler keeps policies.
    fn policy(&self, tenant: TenantId) -> Option<TenantPolicy> {
        let _ = tenant;
        None
    }

    /// Charges `tenant`'s caps for `len` bytes the caller wants to send at
    /// `now` without queueing them (nothing else is queued), or says when
    /// they would allow it. The default has no caps: always now.
    ///
    /// # Errors
    /// The time at which the caps would let the bytes go.
    fn admit_now(&mut self, tenant: TenantId, len: u64, now: Nanos) -> Result<(), Nanos> {
        let _ = (tenant, len, now);
        Ok(())
    }
}
