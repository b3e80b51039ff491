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
//! A UD queue pair's sends go through the same engine
//! ([`UdQueuePair::scheduled`](crate::UdQueuePair::scheduled), giving a
//! [`ScheduledUdQueuePair`]): each datagram one piece, its destination
//! kept with it until it completes.
//!
//! A queue pair is scheduled on its own ([`QueuePair::scheduled`]) or
//! together with the queue pairs of other tenants of the same process on a
//! [`SharedScheduler`] ([`QueuePair::scheduled_on`]): then one weighted
//! deficit round robin decides between the tenants, the latency class goes
//! first, and the bulk bytes all of them have in the NIC at once are
//! bounded, so a latency request finds little ahead of it whatever the
//! number of bulk tenants. A queue pair on its own owns its scheduler
//! outright and takes no lock to post or poll; on a shared scheduler the
//! scheduler's lock is taken only to decide, never while posting. On a
//! queue pair of its own, a request that may go at once (one piece,
//! nothing queued ahead, room in the NIC, no shared rate limit or caps to
//! charge, no chunked request in flight) is posted exactly as the direct
//! path posts it, its region parked in the queue pair's books, and the
//! scheduler only counts it: the scheduled path then costs next to nothing
//! more than the direct one.
//!
//! Progress is made when the application polls: [`poll`](crate::PollCompletions::poll)
//! reaps completions and posts whatever the scheduler lets go next, for
//! every queue pair of the scheduler. There is no background thread (see
//! [`ScheduledQueuePair::with_progress_thread`] for one).

use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, TryLockError};
use std::time::{Duration, Instant};

use ibverbs_sys as ffi;
use mtrdma_core::{TenantHandle, TenantId, TrafficClass};
#[cfg(doc)]
use mtrdma_sched::{DelayWindow, DelayWindowConfig, Window};
use mtrdma_sched::{Nanos, Protection, Scheduler, TenantPolicy, TenantScheduler, WindowFactory};

use crate::completion::{Completion, WcStatus};
use crate::events::{Armed, Waitable};
use crate::qp::{
    check_gather, check_send, push_in_place, Gather, GatherError, List, PostError, QueuePair,
    RawCompletion, RawSend, Refusal, Region, SendOp, Sink, SCHED_WR,
};

mod clock;
mod config;
mod engine;
mod ledger;
mod paths;
mod ud;
use crate::Error;
pub(crate) use clock::EngineClock;
pub use config::{ScheduleConfig, SharedConfig, Tenancy};
pub(crate) use engine::default_scheduler;
use engine::{Engine, Member};
pub use ledger::PieceRef;
use ledger::{Book, Gathered, Message, Side, PARKED};
#[cfg(any(test, feature = "test-util"))]
pub(crate) use paths::Batched;
pub(crate) use paths::Scheduled;
use paths::*;
pub use ud::ScheduledUdQueuePair;

/// Writes the [`PollCompletions`](crate::PollCompletions) impl of a
/// scheduled queue pair type `$ty` (over its `inner` engine handle),
/// whose completions are `$completion`, with the documentation given.
macro_rules! scheduled_poll {
    ($(#[$doc:meta])* $ty:ident, $completion:ty) => {
        $(#[$doc])*
        impl<Q: PieceScheduler> crate::PollCompletions for $ty<Q> {
            type Completion = $completion;

            fn poll(&mut self, out: &mut Vec<$completion>) -> Result<usize, Error> {
                self.inner.poll(out)
            }

            fn poll_wait(
                &mut self,
                out: &mut Vec<$completion>,
                timeout: std::time::Duration,
            ) -> Result<usize, Error> {
                self.inner.poll_wait(out, timeout)
            }
        }
    };
}
use scheduled_poll;

scheduled_poll! {
    /// A scheduled queue pair's wait also wakes when its scheduler asked to
    /// run again without a completion (a rate limit or pacing that said
    /// "later"): it then polls, which posts what is due, and sleeps on. On a
    /// [`SharedScheduler`], the other queue pairs' polls can also decide work
    /// for this one or finish its requests, which raises no event on its
    /// channel: its sleep is then cut into slices of at most 1 ms, so such
    /// work waits about 1 ms at most.
    ScheduledQueuePair,
    Completion
}

#[cfg(test)]
mod tests;

/// A scheduler the data path can be driven by: any [`Scheduler`] of
/// [`PieceRef`]s that may move to another thread. Implement
/// [`Scheduler`] for every handle type (`impl<H> Scheduler<H> for
/// MySched<H>`) and pass it to [`QueuePair::scheduled_with`] or
/// [`SharedScheduler::with_scheduler`]; it then decides what reaches the
/// NIC, in place of the built-in [`TenantScheduler`] (which
/// [`QueuePair::scheduled`] and [`SharedScheduler::new`] use). The engine
/// around it keeps the rest: pieces in the NIC, windows, shared rate
/// limits, one completion per request.
pub trait PieceScheduler: Scheduler<PieceRef> + Send + 'static {}

impl<T: Scheduler<PieceRef> + Send + 'static> PieceScheduler for T {}

/// The built-in scheduler of [`QueuePair::scheduled`] and
/// [`SharedScheduler::new`].
pub type DefaultScheduler = TenantScheduler<PieceRef>;

/// A send-side request's operation, and whether it goes as one work
/// request however long ([`ScheduledQueuePair::post_send_whole`]).
#[derive(Debug, Clone, Copy)]
struct Op {
    op: SendOp,
    whole: bool,
}

/// Who a queue pair is scheduled as, resolved against its sink.
struct Who {
    tenant: TenantId,
    class: TrafficClass,
    quota: Option<TenantHandle>,
    /// What the policy's latency bound asks of it: that of the tenant the
    /// queue pair was created for, whoever it is scheduled as.
    protection: Option<Protection>,
}

impl Who {
    fn of<S: Sink>(sink: &S, tenancy: Tenancy) -> Result<Who, Error> {
        let protection = sink.tenant().and_then(TenantHandle::protection);
        match tenancy {
            Tenancy::OfQueuePair => {
                let handle = sink.tenant().ok_or(Error::NoTenant)?.clone();
                Ok(Who {
                    tenant: handle.tenant(),
                    class: handle.class(),
                    quota: Some(handle),
                    protection,
                })
            }
            Tenancy::Local { id, class } => Ok(Who {
                tenant: id,
                // A queue pair of a tenant the bound holds stays bulk:
                // calling it latency here does not take it past the bound.
                class: if protection.is_some() {
                    TrafficClass::Bulk
                } else {
                    class
                },
                quota: None,
                protection,
            }),
        }
    }
}

/// `config` as the latency bound `protection` (if any) holds a queue pair
/// (see [`ScheduleConfig`]'s "Protection by policy"): pieces no larger
/// than the bound's, and a delay window with its queue allowance (or a
/// smaller one the configuration asked for). Unchanged without one (a
/// tenant the bound does not hold, or a queue pair created for no
/// tenant). Applying it twice changes nothing more.
fn held(config: ScheduleConfig, protection: Option<&Protection>) -> ScheduleConfig {
    match protection {
        Some(p) => protected(config, p),
        None => config,
    }
}

fn protected(config: ScheduleConfig, p: &Protection) -> ScheduleConfig {
    // The bytes in flight the configuration allowed, in the smaller
    // pieces; the window decides how many of them are out.
    ScheduleConfig {
        chunk_bytes: p.piece_for(config.chunk_bytes),
        max_pieces_in_flight: p.pieces_for(config.max_pieces_in_flight, config.chunk_bytes),
        window: Some(Arc::new(
            p.window_config(config.window.as_ref().and_then(|w| w.queue_bytes())),
        )),
        ..config
    }
}

/// A queue pair's window as it stands ([`ScheduledQueuePair::window`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowState {
    /// Bytes it may have in the NIC.
    pub window_bytes: u64,
    /// Bytes it has in the NIC.
    pub in_flight_bytes: u64,
    /// The path's own delay: the lowest recent completion time of a piece.
    pub base_delay: Option<Nanos>,
    /// The smoothed completion time of recent pieces.
    pub smoothed_delay: Option<Nanos>,
    /// Completion times above this shrink the window.
    pub target_delay: Option<Nanos>,
    /// The sender's weight: its tenant's (from its policy, following
    /// reloads) unless the configuration named one (a queue pair held to
    /// a latency bound always takes its tenant's).
    pub weight: u32,
    /// The bytes its window lets stand queued at the port, once the link's
    /// rate is known ([`DelayWindowConfig::queue_bytes`]; under a latency
    /// bound at most the bound's allowance).
    pub queue_bytes: u64,
    /// The largest piece it posts (`u64::MAX`: no limit beyond its
    /// scheduler's chunks; under a latency bound at most the bound's).
    pub piece_bytes: u64,
    /// The coordinator's gain on the window's growth, parts per million
    /// (1,000,000: none; see `mtrdma_sched::share`).
    pub gain_ppm: u32,
    /// The weights of the tenants whose windows share the link's growth
    /// with this one, added up, as the coordinator counted them (1: none;
    /// see `mtrdma_sched::DelayWindow::set_sharing_weight`).
    pub sharing_weight: u32,
}

/// One scheduler for the queue pairs of several tenants in one process.
///
/// Attach queue pairs with [`QueuePair::scheduled_on`]; each is one
/// tenant's (tenants may have several). Requests of the latency class go
/// first, bulk tenants share by weighted deficit round robin (set weights
/// and caps with [`set_policy`](Self::set_policy)), and the bulk bytes in
/// the NIC are bounded by [`SharedConfig::bulk_bytes_in_flight`].
/// Cloning gives another handle to the same scheduler; it may be used from
/// several threads.
///
/// Every queue pair attached must be polled (or have a progress thread):
/// polling is what moves the shared work along.
///
/// ```no_run
/// use mtrdma_core::{TenantId, TrafficClass};
/// use mtrdma_sched::TenantPolicy;
/// use mtrdma_verbs::{Context, ScheduleConfig, SharedConfig, SharedScheduler};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let ctx = Context::open_first_active()?;
/// let pd = ctx.alloc_pd()?;
/// let shared = SharedScheduler::new(SharedConfig::default())?;
/// shared.set_policy(TenantId(2), TenantPolicy::weight(4))?;
/// let (a, b) = (pd.queue_pair().build()?, pd.queue_pair().build()?);
/// let (ea, eb) = (a.endpoint(), b.endpoint());
/// // Tenant 2 of this process's scheduler, without a quota table (a queue
/// // pair created with `.tenant(&handle)` is scheduled as its tenant by
/// // `ScheduleConfig::default()`).
/// let bulk = a
///     .connect(&eb)?
///     .scheduled_on(&shared, ScheduleConfig::local(TenantId(2), TrafficClass::Bulk))?;
/// # let _ = (bulk, b.connect(&ea)?);
/// # Ok(())
/// # }
/// ```
pub struct SharedScheduler<Q: PieceScheduler = DefaultScheduler> {
    shared: Shared<QueuePair, Q>,
}

impl<Q: PieceScheduler> Clone for SharedScheduler<Q> {
    fn clone(&self) -> Self {
        SharedScheduler {
            shared: self.shared.clone(),
        }
    }
}

impl<Q: PieceScheduler> std::fmt::Debug for SharedScheduler<Q> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.shared.debug("SharedScheduler", f)
    }
}

impl SharedScheduler {
    /// A scheduler with no queue pairs yet, deciding with the built-in
    /// [`TenantScheduler`].
    pub fn new(config: SharedConfig) -> Result<SharedScheduler, Error> {
        let sched = default_scheduler(&config)?;
        SharedScheduler::with_scheduler(config, sched)
    }
}

impl<Q: PieceScheduler> SharedScheduler<Q> {
    /// A scheduler with no queue pairs yet, deciding with `sched` (see
    /// [`PieceScheduler`]).
    pub fn with_scheduler(config: SharedConfig, sched: Q) -> Result<SharedScheduler<Q>, Error> {
        Ok(SharedScheduler {
            shared: Shared::new(config, sched, EngineClock::real())?,
        })
    }

    shared_scheduler_methods!();
}

/// The methods a shared scheduler ([`SharedScheduler`], and the null
/// sinks' `NullScheduler`) has over its engine (`self.shared`): tenants'
/// policies, and what it holds.
macro_rules! shared_scheduler_methods {
    () => {
        /// Sets `tenant`'s weight and caps (also while it runs: a changed cap
        /// keeps its rate state). A tenant without one gets the weight of its
        /// quota table policy, or 1.
        pub fn set_policy(&self, tenant: TenantId, policy: TenantPolicy) -> Result<(), Error> {
            self.shared.set_policy(tenant, policy)
        }

        /// Bulk bytes posted by the scheduler's queue pairs and not yet
        /// completed.
        pub fn bulk_bytes_in_flight(&self) -> u64 {
            self.shared.bulk_bytes_in_flight()
        }

        /// Queue pairs attached.
        pub fn queue_pairs(&self) -> usize {
            self.shared.queue_pairs()
        }
    };
}
pub(crate) use shared_scheduler_methods;

/// The engine behind a [`SharedScheduler`], for queue pairs whose work
/// requests go to any [`Sink`]: the device's send queues, or a null sink
/// on the host ([`crate::testing`]).
pub(crate) struct Shared<S: Sink, Q: PieceScheduler> {
    engine: Arc<Mutex<Engine<S, Q>>>,
}

impl<S: Sink, Q: PieceScheduler> Clone for Shared<S, Q> {
    fn clone(&self) -> Self {
        Shared {
            engine: Arc::clone(&self.engine),
        }
    }
}

impl<S: Sink, Q: PieceScheduler> Shared<S, Q> {
    pub(crate) fn new(
        config: SharedConfig,
        sched: Q,
        clock: EngineClock,
    ) -> Result<Shared<S, Q>, Error> {
        Ok(Shared {
            engine: Arc::new(Mutex::new(Engine::new(config, sched, clock)?)),
        })
    }

    pub(crate) fn debug(&self, name: &str, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let e = self.lock();
        f.debug_struct(name)
            .field("queue_pairs", &e.queue_pairs())
            .field("queued", &e.queued_pieces())
            .field("bulk_bytes_in_flight", &e.bulk_in_flight())
            .finish()
    }

    pub(crate) fn set_policy(&self, tenant: TenantId, policy: TenantPolicy) -> Result<(), Error> {
        self.lock().set_explicit_policy(tenant, policy)
    }

    pub(crate) fn bulk_bytes_in_flight(&self) -> u64 {
        self.lock().bulk_in_flight()
    }

    pub(crate) fn queue_pairs(&self) -> usize {
        self.lock().queue_pairs()
    }

    fn lock(&self) -> MutexGuard<'_, Engine<S, Q>> {
        lock(&self.engine)
    }

    /// Attaches `sink`: its sends are scheduled with the other queue pairs
    /// of this scheduler.
    pub(crate) fn attach(&self, sink: S, config: ScheduleConfig) -> Result<Scheduled<S, Q>, Error> {
        let who = Who::of(&sink, config.tenant)?;
        let qpn = sink.qpn();
        let sq_room = sink.send_room();
        let device = sink.device().cloned();
        let side = Arc::new(Side {
            qp: Mutex::new(sink),
            book: Mutex::new(Book::default()),
            mail: AtomicBool::new(false),
            refusals: AtomicBool::new(false),
        });
        let mut e = self.lock();
        let (member, tenant, class) =
            e.add_member(Some(Arc::clone(&side)), qpn, sq_room, who, config)?;
        let (wake_at, clock) = e.wake_handle();
        drop(e);
        let attached = Attached {
            engine: Arc::clone(&self.engine),
            side,
            wake_at,
            clock,
            raw: Vec::new(),
            pieces: Vec::new(),
            sides: Vec::new(),
            took: false,
            member,
            class,
        };
        Ok(Scheduled {
            device,
            way: Way::Attached(attached),
            qpn,
            tenant,
            class,
        })
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // The engine's invariants hold between calls; a panic in another
    // thread's call does not leave them half-changed in a way that matters
    // more than refusing every later call would.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// `config` as the policy's latency bound holds a queue pair created for
/// `tenant` ([`held`]), and the built-in scheduler of such a queue pair
/// scheduled on its own: what [`QueuePair::scheduled`] passes on to
/// [`QueuePair::scheduled_with`].
pub(crate) fn solo_parts(
    config: ScheduleConfig,
    tenant: Option<&TenantHandle>,
) -> Result<(ScheduleConfig, DefaultScheduler), Error> {
    let config = held(config, tenant.and_then(TenantHandle::protection).as_ref());
    let sched = default_scheduler(&SharedConfig {
        chunk_bytes: config.chunk_bytes,
        ..SharedConfig::default()
    })?;
    Ok((config, sched))
}

/// Writes a queue pair's `scheduled` (a scheduler of its own, the
/// built-in one, with the documentation given) and `scheduled_with` (a
/// scheduler of its own it is given), which makes the scheduled queue
/// pair `$scheduled` with `$body` from the queue pair (`$qp`), its
/// `$config` and its scheduler (`$sched`).
macro_rules! solo_scheduled {
    (
        $(#[$doc:meta])*
        $scheduled:ident, |$qp:ident, $config:ident, $sched:ident| $body:block
    ) => {
        $(#[$doc])*
        pub fn scheduled(self, config: ScheduleConfig) -> Result<$scheduled, Error> {
            let (config, sched) = solo_parts(config, Sink::tenant(&self))?;
            self.scheduled_with(config, sched)
        }

        /// Routes this queue pair's sends through `sched`, a scheduler of its
        /// own (see [`PieceScheduler`]).
        pub fn scheduled_with<Q: PieceScheduler>(
            self,
            $config: ScheduleConfig,
            $sched: Q,
        ) -> Result<$scheduled<Q>, Error> {
            let $qp = self;
            $body
        }
    };
}
use solo_scheduled;

impl QueuePair {
    solo_scheduled! {
        /// Routes this queue pair's sends through a scheduler of its own, the
        /// built-in [`TenantScheduler`].
        ScheduledQueuePair, |qp, config, sched| {
            let inner = Scheduled::solo(qp, config, sched, EngineClock::real())?;
            Ok(ScheduledQueuePair { inner })
        }
    }

    /// Routes this queue pair's sends through `shared`, together with the
    /// other queue pairs attached to it.
    pub fn scheduled_on<Q: PieceScheduler>(
        self,
        shared: &SharedScheduler<Q>,
        config: ScheduleConfig,
    ) -> Result<ScheduledQueuePair<Q>, Error> {
        let inner = shared.shared.attach(self, config)?;
        Ok(ScheduledQueuePair { inner })
    }
}

/// A queue pair whose sends are scheduled (see the module docs).
///
/// It may be moved to another thread (it is `Send`); posting and polling
/// take `&mut self`, so one thread uses it at a time (wrap it in a mutex,
/// or use [`with_progress_thread`](Self::with_progress_thread), to share
/// it).
pub struct ScheduledQueuePair<Q: PieceScheduler = DefaultScheduler> {
    inner: Scheduled<QueuePair, Q>,
}

impl<Q: PieceScheduler> std::fmt::Debug for ScheduledQueuePair<Q> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.inner.debug("ScheduledQueuePair", f)
    }
}

/// What a scheduled queue pair (RC or UD) tells of its scheduling: its
/// tenant, class, sends queued and window.
macro_rules! scheduled_accessors {
    () => {
        /// The tenant its sends are scheduled as.
        pub fn tenant(&self) -> TenantId {
            self.inner.tenant
        }

        /// Its traffic class.
        pub fn class(&self) -> TrafficClass {
            self.inner.class
        }

        /// Sends accepted and not yet handed back by
        /// [`poll`](crate::PollCompletions::poll).
        pub fn queued(&self) -> usize {
            self.inner.queued()
        }

        /// What its window (see [`ScheduleConfig::window`]) has learnt, if
        /// it has one.
        pub fn window(&self) -> Option<WindowState> {
            self.inner.window()
        }
    };
}
pub(crate) use scheduled_accessors;

impl<Q: PieceScheduler> ScheduledQueuePair<Q> {
    /// It, as something whose completions can be waited for.
    #[cfg_attr(not(feature = "tokio"), allow(dead_code))]
    pub(crate) fn waitable(&mut self) -> &mut dyn Waitable<Item = Completion> {
        self.inner.waitable()
    }
}

impl<Q: PieceScheduler> ScheduledQueuePair<Q> {
    /// The queue pair number.
    pub fn qpn(&self) -> u32 {
        self.inner.qpn
    }

    /// Lends `region` to the peer through a memory window, as
    /// [`QueuePair::lend`] does. The bind goes to the device at once,
    /// ahead of sends the scheduler still holds (it moves no bytes).
    pub fn lend(
        &mut self,
        region: crate::MemoryRegion,
        rights: crate::Access,
    ) -> Result<crate::RemoteRegion, PostError> {
        self.inner.with_sink(|qp| qp.lend(region, rights))
    }

    /// Takes back the piece lent under `lent`'s key, as
    /// [`QueuePair::take_back`] does; the piece comes back in a completion
    /// [`poll`](crate::PollCompletions::poll) hands out. The invalidation
    /// goes to the device at once, ahead of sends the scheduler still
    /// holds (none of them uses the lent piece, which the queue pair
    /// holds).
    pub fn take_back(&mut self, lent: &crate::RemoteRegion, context: u64) -> Result<(), Error> {
        self.inner.with_sink(|qp| qp.take_back(lent, context))
    }

    /// Pieces lent and not yet taken back.
    pub fn lent(&self) -> usize {
        self.inner.with_sink_ref(|qp| qp.lent())
    }

    scheduled_accessors!();

    crate::macros::posting_fn! {
        /// Accepts a send-side request. It is posted now if the scheduler lets
        /// it go, or kept in the software backlog and posted by a later
        /// [`poll`](crate::PollCompletions::poll) (of this or another queue pair of the same
        /// scheduler). Bounds are checked first; a refused request hands its
        /// region back.
        ///
        /// A WRITE or READ longer than the chunk size goes as pieces, and the
        /// request completes once, after its last. The peer sees a split
        /// [`SendOp::WriteWithImm`] as plain WRITEs and a last WRITE with the
        /// immediate, so its receive completion reports only the last piece's
        /// bytes (16 KiB for a 64 KiB write in 16 KiB pieces): a peer that
        /// sizes the message from its completion must be sent it with
        /// [`post_send_whole`](Self::post_send_whole).
        pub fn post_send(&mut self, op: SendOp) posts (region, range, context) {
            self.inner
                .post_send(op, region, range, context, false)
                .map_err(PostError::new)
        }
    }

    crate::macros::posting_fn! {
        /// [`post_send`](Self::post_send), but the request goes to the NIC as
        /// one work request however long it is: scheduled and charged to its
        /// tenant as one piece, so it holds the NIC (and what waits behind it)
        /// for as long as it takes. For a [`SendOp::WriteWithImm`] whose peer
        /// reads the message's length from its receive completion.
        pub fn post_send_whole(&mut self, op: SendOp) posts (region, range, context) {
            self.inner
                .post_send(op, region, range, context, true)
                .map_err(PostError::new)
        }
    }

    crate::macros::posting_fn! {
        /// Posts one send-side operation on several regions (a gather list),
        /// as [`QueuePair::post_send_gather`] does and checked as it checks
        /// (against the `max_send_sge` the queue pair was built with). The
        /// request is scheduled and charged to its tenant as one piece and
        /// goes to the NIC whole, as one work request, as
        /// [`post_send_whole`](Self::post_send_whole) sends a request: a
        /// scatter list is never split. Its completion hands every region
        /// back in order ([`Completion::region`], then
        /// [`Completion::gathered`]); on refusal (by the checks, or by the
        /// scheduler) every region comes back untouched in the
        /// [`GatherError`], in order, with its range.
        ///
        /// ```no_run
        /// use mtrdma_core::{TenantId, TrafficClass};
        /// use mtrdma_verbs::{Access, Context, PollCompletions, ScheduleConfig, SendOp};
        ///
        /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
        /// let ctx = Context::open_first_active()?;
        /// let pd = ctx.alloc_pd()?;
        /// let a = pd.queue_pair().max_send_sge(2).build()?;
        /// let b = pd.queue_pair().build()?;
        /// let (ea, eb) = (a.endpoint(), b.endpoint());
        /// let (a, _b) = (a.connect(&eb)?, b.connect(&ea)?);
        /// let mut a = a.scheduled(ScheduleConfig::local(TenantId(1), TrafficClass::Bulk))?;
        /// let target = pd.allocate(8192, Access::REMOTE_READ_WRITE)?;
        ///
        /// let header = pd.allocate(64, Access::LOCAL)?;
        /// let body = pd.allocate(4096, Access::LOCAL)?;
        /// let parts = vec![(header, 0..64), (body, 0..4096)];
        /// a.post_send_gather(SendOp::Write(target.remote().unwrap()), parts, 1)?;
        /// let mut done = Vec::new();
        /// while done.is_empty() {
        ///     a.poll(&mut done)?;
        /// }
        /// assert_eq!(done[0].gathered.len(), 1);
        /// # Ok(())
        /// # }
        /// ```
        pub fn post_send_gather(&mut self, op: SendOp) posts gather (parts, context) {
            self.inner
                .post_gather(op, parts, context)
                .map_err(GatherError::new)
        }
    }

    crate::macros::posting_fn! {
        /// Posts a receive (receives are not scheduled).
        pub fn post_recv(&mut self) posts (region, range, context) {
            self.inner
                .with_sink(|qp| qp.post_recv(region, range, context))
        }
    }
}

impl<Q: PieceScheduler> ScheduledQueuePair<Q> {
    /// Starts a batch of send-side requests accepted together (see
    /// [`ScheduledBatch`]).
    pub fn batch(&mut self) -> ScheduledBatch<'_, Q> {
        ScheduledBatch {
            inner: paths::Batched::new(&mut self.inner),
        }
    }
}

/// Several send-side requests accepted together
/// ([`ScheduledQueuePair::batch`]): the scheduler takes them in one go
/// (one turn of a [`SharedScheduler`]'s lock), and the pieces it lets go
/// reach the NIC as one list of work requests (one doorbell), most of them
/// without a completion of their own (see [`PostBatch`](crate::PostBatch)).
/// Each request is scheduled, split and charged as
/// [`post_send`](ScheduledQueuePair::post_send) would, and completes once,
/// its region handed back, from [`poll`](crate::PollCompletions::poll).
///
/// The ownership rules are those of `post_send`: a region moves into the
/// batch when its request is added and comes back in its completion (or
/// in the [`BatchError`](crate::BatchError)). Dropping a batch without submitting it posts
/// nothing and frees its regions; take them back with
/// [`cancel`](Self::cancel).
#[must_use = "a batch posts nothing until it is submitted"]
pub struct ScheduledBatch<'qp, Q: PieceScheduler = DefaultScheduler> {
    inner: paths::Batched<'qp, QueuePair, Q>,
}

impl<Q: PieceScheduler> std::fmt::Debug for ScheduledBatch<'_, Q> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScheduledBatch")
            .field("requests", &self.inner.len())
            .finish()
    }
}

impl<Q: PieceScheduler> ScheduledBatch<'_, Q> {
    crate::macros::batch_methods! {
        /// Adds a send-side request; its range and remote region are checked
        /// now, and on refusal the region comes back in the [`PostError`].
        post_send;
        /// Adds a gather request (several regions, one work request), checked
        /// now as [`ScheduledQueuePair::post_send_gather`] checks it (against
        /// the queue pair's `max_send_sge`); on refusal every region comes
        /// back in the [`GatherError`], in order, and the batch is unchanged.
        /// Once submitted it is scheduled and charged as one piece and goes
        /// to the NIC whole, as that single post sends it; when the scheduler
        /// lets it go at once it reaches the NIC in the same list as the
        /// batch's other requests let go with it. Once added, its regions are
        /// the batch's: they come back in its completion
        /// ([`Completion::region`], then [`Completion::gathered`]), or, if it
        /// is not accepted, as consecutive entries of
        /// [`BatchError::refused`](crate::BatchError::refused) (or of [`cancel`](Self::cancel)'s answer)
        /// that share its context.
        ///
        /// ```no_run
        /// use mtrdma_core::{TenantId, TrafficClass};
        /// use mtrdma_verbs::{Access, Context, PollCompletions, ScheduleConfig, SendOp};
        ///
        /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
        /// let ctx = Context::open_first_active()?;
        /// let pd = ctx.alloc_pd()?;
        /// let a = pd.queue_pair().max_send_sge(2).build()?;
        /// let b = pd.queue_pair().build()?;
        /// let (ea, eb) = (a.endpoint(), b.endpoint());
        /// let (a, _b) = (a.connect(&eb)?, b.connect(&ea)?);
        /// let mut a = a.scheduled(ScheduleConfig::local(TenantId(1), TrafficClass::Bulk))?;
        /// let target = pd.allocate(8192, Access::REMOTE_READ_WRITE)?;
        /// let remote = target.remote().unwrap();
        ///
        /// let mut batch = a.batch();
        /// let header = pd.allocate(64, Access::LOCAL)?;
        /// let body = pd.allocate(4096, Access::LOCAL)?;
        /// let parts = vec![(header, 0..64), (body, 0..4096)];
        /// batch.post_send_gather(SendOp::Write(remote.slice(0, 4160).unwrap()), parts, 1)?;
        /// let tail = pd.allocate(1024, Access::LOCAL)?;
        /// batch.post_send(SendOp::Write(remote.slice(4160, 1024).unwrap()), tail, 0..1024, 2)?;
        /// batch.submit()?;
        /// let mut done = Vec::new();
        /// while done.len() < 2 {
        ///     a.poll(&mut done)?;
        /// }
        /// assert_eq!(done[0].gathered.len(), 1);
        /// # Ok(())
        /// # }
        /// ```
        post_send_gather;
        /// Hands the requests to the scheduler, in order. If it refuses one
        /// (a cap of this scheduler's, say), those before it were accepted;
        /// it and those after it come back in the [`BatchError`](crate::BatchError) (a gather
        /// request's regions as consecutive entries with its context). A
        /// piece the NIC refuses fails its request at the next poll, as with
        /// `post_send`.
        submit;
        /// Hands nothing to the scheduler and the requests back, in order, as
        /// (context, region); a gather request's regions as consecutive
        /// entries with its context, in order.
        cancel;
    }
}

/// What a finished request of a queue pair of sink `S` is handed back as.
pub(crate) type Done<S> = <<S as Sink>::Region as Region>::Completion;
