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
//! Progress is made when the application polls: [`ScheduledQueuePair::poll`]
//! reaps completions and posts whatever the scheduler lets go next, for
//! every queue pair of the scheduler. There is no background thread (see
//! [`ScheduledQueuePair::with_progress_thread`] for one).

use std::collections::VecDeque;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, TryLockError};
use std::time::{Duration, Instant};

use ibverbs_sys as ffi;
use mtrdma_core::{TenantHandle, TenantId, TrafficClass};
use mtrdma_sched::{
    Admit, Clock, DelayWindow, DelayWindowConfig, Dequeue, Descriptor, Grant, Nanos,
    Opcode as SchedOpcode, QuantaClock, Scheduler, SchedulerConfig, TenantPolicy, TenantScheduler,
    Window,
};

use crate::completion::{Completion, Opcode, WcStatus};
use crate::events::{Armed, Waitable};
use crate::qp::{
    check_send, PostError, QueuePair, RawCompletion, RawSend, Region, SendOp, Sink, PARKED_DONE,
    RAW_WR, SCHED_WR,
};
use crate::slab::Slab;
use crate::{Error, MemoryRegion};

/// Who a scheduled queue pair's sends are scheduled as
/// ([`ScheduleConfig::tenant`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Tenancy {
    /// The tenant the queue pair was created for
    /// ([`QueuePairBuilder::tenant`](crate::QueuePairBuilder::tenant)): its
    /// class, weight and caps from its policy in the quota table, its
    /// shared rate limit (cap and the coordinator's fair rate) and its
    /// accounting there. The default; a queue pair created without a
    /// tenant is refused with [`Error::NoTenant`].
    #[default]
    OfQueuePair,
    /// Scheduled as tenant `id`, of `class`, by this process's scheduler
    /// alone: no quota table, no limit shared with other processes (weights
    /// and caps set with [`SharedScheduler::set_policy`], or weight 1).
    Local {
        /// The tenant it counts as in the scheduler.
        id: TenantId,
        /// Its sends' class.
        class: TrafficClass,
    },
}

/// How a queue pair's sends are scheduled.
#[derive(Debug, Clone)]
pub struct ScheduleConfig {
    /// WRITE and READ longer than this are split into pieces of at most
    /// this many bytes (default 64 KiB). On a [`SharedScheduler`] its own
    /// [`SharedConfig::chunk_bytes`] applies instead.
    pub chunk_bytes: u64,
    /// Pieces of this queue pair in the NIC at once (default 4): what a
    /// latency-sensitive neighbour may find ahead of it.
    pub max_pieces_in_flight: u32,
    /// Who its sends are scheduled as: the tenant the queue pair was
    /// created for (the default), or explicitly a tenant of this process's
    /// scheduler alone. Queue pairs of different tenants on one
    /// [`SharedScheduler`] share it by their weights.
    pub tenant: Tenancy,
    /// A bulk queue pair's bytes in the NIC follow a [`DelayWindow`] with
    /// these settings (default none: only `max_pieces_in_flight` bounds
    /// them). This is what protects a latency-sensitive tenant in another
    /// process: every bulk queue pair that shares the port backs off when
    /// its own pieces' completion times show a queue, so together they
    /// keep the port's queue near the window's target without sharing any
    /// state. Use pieces no longer than the queue a latency request may
    /// find (`chunk_bytes` of one or a few MTUs), and
    /// [`DelayWindowConfig::for_piece`] of that size. A window whose
    /// `weight` is left at 1 takes the tenant's weight (from its policy in
    /// the quota table, or the scheduler's), so bulk tenants in different
    /// processes share the port by their weights. Latency-class queue
    /// pairs have no window.
    pub window: Option<DelayWindowConfig>,
}

impl Default for ScheduleConfig {
    fn default() -> Self {
        ScheduleConfig {
            chunk_bytes: 64 << 10,
            max_pieces_in_flight: 4,
            tenant: Tenancy::OfQueuePair,
            window: None,
        }
    }
}

impl ScheduleConfig {
    /// The defaults, scheduled as tenant `id` of `class` by this process's
    /// scheduler alone ([`Tenancy::Local`]).
    pub fn local(id: TenantId, class: TrafficClass) -> ScheduleConfig {
        ScheduleConfig {
            tenant: Tenancy::Local { id, class },
            ..ScheduleConfig::default()
        }
    }
}

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
}

impl Who {
    fn of<S: Sink>(sink: &S, tenancy: Tenancy) -> Result<Who, Error> {
        match tenancy {
            Tenancy::OfQueuePair => {
                let handle = sink.tenant().ok_or(Error::NoTenant)?.clone();
                Ok(Who {
                    tenant: handle.tenant(),
                    class: handle.class(),
                    quota: Some(handle),
                })
            }
            Tenancy::Local { id, class } => Ok(Who {
                tenant: id,
                class,
                quota: None,
            }),
        }
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
    /// reloads) unless the configuration named one.
    pub weight: u32,
}

/// Settings of a [`SharedScheduler`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharedConfig {
    /// WRITE and READ longer than this are split into pieces of at most
    /// this many bytes (default 64 KiB); also the DRR quantum of a weight-1
    /// tenant.
    pub chunk_bytes: u64,
    /// Bulk-class bytes that all the scheduler's queue pairs together may
    /// have in the NIC at once (default 256 KiB): what a latency request
    /// finds ahead of it. A piece larger than this still goes, alone.
    /// Latency-class pieces do not count against it.
    pub bulk_bytes_in_flight: u64,
    /// Share of the bytes, in parts per million, that bulk traffic keeps
    /// while the latency class is saturated (default 100,000: 10%).
    pub bulk_min_share_ppm: u32,
}

impl Default for SharedConfig {
    fn default() -> Self {
        SharedConfig {
            chunk_bytes: 64 << 10,
            bulk_bytes_in_flight: 256 << 10,
            bulk_min_share_ppm: 100_000,
        }
    }
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
            shared: Shared::new(config, sched)?,
        })
    }

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
}

/// The engine behind a [`SharedScheduler`], for queue pairs whose work
/// requests go to any [`Sink`]: the device's send queues, or a null sink
/// on the host ([`crate::bench`]).
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
    pub(crate) fn new(config: SharedConfig, sched: Q) -> Result<Shared<S, Q>, Error> {
        Ok(Shared {
            engine: Arc::new(Mutex::new(Engine::new(config, sched)?)),
        })
    }

    pub(crate) fn debug(&self, name: &str, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let e = self.lock();
        f.debug_struct(name)
            .field("queue_pairs", &e.members.len())
            .field("queued", &e.sched.len())
            .field("bulk_bytes_in_flight", &e.bulk_in_flight)
            .finish()
    }

    pub(crate) fn set_policy(&self, tenant: TenantId, policy: TenantPolicy) -> Result<(), Error> {
        let mut e = self.lock();
        e.set_policy(tenant, policy)?;
        if !e.explicit.contains(&tenant) {
            e.explicit.push(tenant);
        }
        Ok(())
    }

    pub(crate) fn bulk_bytes_in_flight(&self) -> u64 {
        self.lock().bulk_in_flight
    }

    pub(crate) fn queue_pairs(&self) -> usize {
        self.lock().members.len()
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
        let side = Arc::new(Side {
            qp: Mutex::new(sink),
            book: Mutex::new(Book::default()),
            mail: AtomicBool::new(false),
        });
        let mut e = self.lock();
        let (member, tenant, class) =
            e.add_member(Some(Arc::clone(&side)), qpn, sq_room, who, config)?;
        let (wake_at, clock) = (Arc::clone(&e.wake_at), e.clock.clone());
        drop(e);
        let attached = Attached {
            engine: Arc::clone(&self.engine),
            side,
            wake_at,
            clock,
            raw: Vec::new(),
            pieces: Vec::new(),
            sides: Vec::new(),
            member,
            class,
        };
        Ok(Scheduled {
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

impl QueuePair {
    /// Routes this queue pair's sends through a scheduler of its own, the
    /// built-in [`TenantScheduler`].
    pub fn scheduled(self, config: ScheduleConfig) -> Result<ScheduledQueuePair, Error> {
        let sched = default_scheduler(&SharedConfig {
            chunk_bytes: config.chunk_bytes,
            ..SharedConfig::default()
        })?;
        self.scheduled_with(config, sched)
    }

    /// Routes this queue pair's sends through `sched`, a scheduler of its
    /// own (see [`PieceScheduler`]).
    pub fn scheduled_with<Q: PieceScheduler>(
        self,
        config: ScheduleConfig,
        sched: Q,
    ) -> Result<ScheduledQueuePair<Q>, Error> {
        let inner = Scheduled::solo(self, config, sched)?;
        Ok(ScheduledQueuePair { inner })
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

impl<Q: PieceScheduler> ScheduledQueuePair<Q> {
    /// The queue pair number.
    pub fn qpn(&self) -> u32 {
        self.inner.qpn
    }

    /// The tenant its sends are scheduled as.
    pub fn tenant(&self) -> TenantId {
        self.inner.tenant
    }

    /// Its traffic class.
    pub fn class(&self) -> TrafficClass {
        self.inner.class
    }

    /// Send requests accepted and not yet handed back by [`poll`](Self::poll).
    pub fn queued(&self) -> usize {
        self.inner.queued()
    }

    /// What its window (see [`ScheduleConfig::window`]) has learnt, if it
    /// has one.
    pub fn window(&self) -> Option<WindowState> {
        self.inner.window()
    }

    /// Accepts a send-side request. It is posted now if the scheduler lets
    /// it go, or kept in the software backlog and posted by a later
    /// [`poll`](Self::poll) (of this or another queue pair of the same
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
    pub fn post_send(
        &mut self,
        op: SendOp,
        region: MemoryRegion,
        range: Range<usize>,
        context: u64,
    ) -> Result<(), PostError> {
        self.inner
            .post_send(op, region, range, context, false)
            .map_err(PostError::new)
    }

    /// [`post_send`](Self::post_send), but the request goes to the NIC as
    /// one work request however long it is: scheduled and charged to its
    /// tenant as one piece, so it holds the NIC (and what waits behind it)
    /// for as long as it takes. For a [`SendOp::WriteWithImm`] whose peer
    /// reads the message's length from its receive completion.
    pub fn post_send_whole(
        &mut self,
        op: SendOp,
        region: MemoryRegion,
        range: Range<usize>,
        context: u64,
    ) -> Result<(), PostError> {
        self.inner
            .post_send(op, region, range, context, true)
            .map_err(PostError::new)
    }

    /// Posts a receive (receives are not scheduled).
    pub fn post_recv(
        &mut self,
        region: MemoryRegion,
        range: Range<usize>,
        context: u64,
    ) -> Result<(), PostError> {
        self.inner
            .with_sink(|qp| qp.post_recv(region, range, context))
    }

    /// Reaps completions, posts what the scheduler lets go next, and moves
    /// finished requests (one completion each, region handed back) and
    /// receives into `out`. Returns how many it added.
    pub fn poll(&mut self, out: &mut Vec<Completion>) -> Result<usize, Error> {
        self.inner.poll(out)
    }

    /// [`poll`](Self::poll), sleeping rather than spinning while there is
    /// nothing to hand back: it returns once it has added completions to
    /// `out` (how many), or with 0 when `timeout` runs out. The queue pair
    /// must have been built with
    /// [`completion_events(true)`](crate::QueuePairBuilder::completion_events);
    /// otherwise this returns [`Error::NoCompletionEvents`].
    ///
    /// It wakes for a completion on the queue pair, and also when the
    /// scheduler asked to run again without one (a rate limit or pacing
    /// that said "later"): it then polls, which posts what is due, and
    /// sleeps on. On a [`SharedScheduler`], the other queue pairs' polls
    /// can also decide work for this one or finish its requests, which
    /// raises no event on its channel: its sleep is then cut into slices of
    /// at most 1 ms, so such work waits about 1 ms at most.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use mtrdma_verbs::{Access, Context, ScheduleConfig, SendOp};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let ctx = Context::open_first_active()?;
    /// let pd = ctx.alloc_pd()?;
    /// let a = pd.queue_pair().completion_events(true).build()?;
    /// let b = pd.queue_pair().build()?;
    /// let (ea, eb) = (a.endpoint(), b.endpoint());
    /// let mut a = a.connect(&eb)?.scheduled(ScheduleConfig::default())?;
    /// let _b = b.connect(&ea)?;
    ///
    /// let target = pd.allocate(1 << 20, Access::REMOTE_READ_WRITE)?;
    /// let src = pd.allocate(1 << 20, Access::LOCAL)?;
    /// a.post_send(SendOp::Write(target.remote().unwrap()), src, 0..1 << 20, 1)?;
    /// let mut done = Vec::new();
    /// while done.is_empty() {
    ///     a.poll_wait(&mut done, Duration::from_millis(100))?;
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub fn poll_wait(
        &mut self,
        out: &mut Vec<Completion>,
        timeout: Duration,
    ) -> Result<usize, Error> {
        self.inner.poll_wait(out, timeout)
    }
}

/// What a finished request of a queue pair of sink `S` is handed back as.
pub(crate) type Done<S> = <<S as Sink>::Region as Region>::Completion;

/// A scheduled queue pair, for any [`Sink`]: what [`ScheduledQueuePair`]
/// is.
pub(crate) struct Scheduled<S: Sink, Q: PieceScheduler> {
    way: Way<S, Q>,
    pub(crate) qpn: u32,
    pub(crate) tenant: TenantId,
    pub(crate) class: TrafficClass,
}

/// How a queue pair reaches its engine.
enum Way<S: Sink, Q: PieceScheduler> {
    /// An engine of its own ([`QueuePair::scheduled`]), owned outright: no
    /// other thread can reach it, so nothing is locked.
    Solo(Box<Solo<S, Q>>),
    /// A [`SharedScheduler`]'s engine, behind its lock.
    Attached(Attached<S, Q>),
}

impl<S: Sink, Q: PieceScheduler> Scheduled<S, Q> {
    /// `sink` on a scheduler of its own.
    pub(crate) fn solo(
        sink: S,
        config: ScheduleConfig,
        sched: Q,
    ) -> Result<Scheduled<S, Q>, Error> {
        let mut engine = Engine::new(
            SharedConfig {
                chunk_bytes: config.chunk_bytes,
                // One queue pair: `max_pieces_in_flight` is its bound.
                bulk_bytes_in_flight: u64::MAX,
                ..SharedConfig::default()
            },
            sched,
        )?;
        engine.solo = true;
        let who = Who::of(&sink, config.tenant)?;
        let qpn = sink.qpn();
        let (member, tenant, class) =
            engine.add_member(None, qpn, sink.send_room(), who, config)?;
        Ok(Scheduled {
            way: Way::Solo(Box::new(Solo {
                engine,
                sink,
                member,
                raw: Vec::new(),
            })),
            qpn,
            tenant,
            class,
        })
    }

    pub(crate) fn debug(&self, name: &str, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct(name)
            .field("qpn", &self.qpn)
            .field("tenant", &self.tenant)
            .field("class", &self.class)
            .field("queued", &self.queued())
            .finish()
    }

    /// Requests accepted and not yet handed back.
    pub(crate) fn queued(&self) -> usize {
        match &self.way {
            Way::Solo(solo) => solo.engine.member(solo.member).accepted,
            Way::Attached(a) => lock(&a.engine).member(a.member).accepted,
        }
    }

    /// See [`ScheduledQueuePair::window`].
    pub(crate) fn window(&self) -> Option<WindowState> {
        let state = |m: &Member<S>| {
            m.window.as_ref().map(|w| WindowState {
                window_bytes: w.window(),
                in_flight_bytes: m.bytes_out,
                base_delay: w.base_delay(),
                smoothed_delay: w.smoothed_delay(),
                target_delay: w.target_delay(),
                weight: w.config().weight,
            })
        };
        match &self.way {
            Way::Solo(solo) => state(solo.engine.member(solo.member)),
            Way::Attached(a) => state(lock(&a.engine).member(a.member)),
        }
    }

    /// Runs `f` on the queue pair (not on the engine).
    pub(crate) fn with_sink<R>(&mut self, f: impl FnOnce(&mut S) -> R) -> R {
        match &mut self.way {
            Way::Solo(solo) => f(&mut solo.sink),
            Way::Attached(a) => f(&mut lock(&a.side.qp)),
        }
    }

    /// See [`ScheduledQueuePair::post_send`].
    #[inline]
    pub(crate) fn post_send(
        &mut self,
        op: SendOp,
        region: S::Region,
        range: Range<usize>,
        context: u64,
        whole: bool,
    ) -> Result<(), (Error, S::Region)> {
        let sge = match check_send(op, &region, &range) {
            Ok(sge) => sge,
            Err(error) => return Err((error, region)),
        };
        match &mut self.way {
            Way::Solo(solo) => solo.post_send(op, whole, region, range, sge, context),
            Way::Attached(a) => {
                let member = a.member;
                a.with_engine(|e| {
                    let piece =
                        e.post_send(member, Op { op, whole }, region, range, sge, context)?;
                    e.own_pieces.extend(piece);
                    Ok(())
                })
            }
        }
    }

    /// See [`ScheduledQueuePair::poll`].
    #[inline]
    pub(crate) fn poll(&mut self, out: &mut Vec<Done<S>>) -> Result<usize, Error> {
        match &mut self.way {
            Way::Solo(solo) => solo.poll(out),
            Way::Attached(a) => a.poll(out),
        }
    }

    /// See [`ScheduledQueuePair::poll_wait`].
    pub(crate) fn poll_wait(
        &mut self,
        out: &mut Vec<Done<S>>,
        timeout: Duration,
    ) -> Result<usize, Error> {
        match &mut self.way {
            Way::Solo(solo) => crate::events::poll_wait(&mut **solo, out, timeout),
            Way::Attached(a) => crate::events::poll_wait(a, out, timeout),
        }
    }
}

/// `v.push(x)`, always inlined: `x` (a completion, several words) is
/// written straight into `v`'s buffer rather than built on the stack and
/// copied by an out-of-line `push` (which reads back the narrow stores
/// just made, a stall that cost ~5 ns per request on the null-sink bench).
#[inline(always)]
fn push_in_place<T>(v: &mut Vec<T>, x: T) {
    v.reserve(1);
    let len = v.len();
    // SAFETY: `reserve(1)` left room for at least one more element at
    // index `len`, which is written before the length covers it.
    unsafe {
        v.as_mut_ptr().add(len).write(x);
        v.set_len(len + 1);
    }
}

/// Whether the engine asked (through `wake_at`) to be pumped by now.
#[inline]
fn wake_due(wake_at: &AtomicU64, clock: &QuantaClock) -> bool {
    let wake = wake_at.load(Ordering::Acquire);
    wake != u64::MAX && clock.now().0 >= wake
}

/// When the engine asked (through `wake_at`) to be pumped, as an instant;
/// `None`: not before a completion or a post.
fn wake_instant(wake_at: &AtomicU64, clock: &QuantaClock) -> Option<Instant> {
    let wake = wake_at.load(Ordering::Acquire);
    if wake == u64::MAX {
        return None;
    }
    let left = Duration::from_nanos(wake.saturating_sub(clock.now().0));
    Instant::now().checked_add(left)
}

/// The longest a queue pair on a [`SharedScheduler`] sleeps in
/// `poll_wait` before polling again: work the other queue pairs decide
/// for it raises no event on its channel.
const ATTACHED_WAIT: Duration = Duration::from_millis(1);

/// A queue pair with an engine of its own. Everything the shared engine
/// leaves in a side's book for its owner goes straight to the owner here
/// (`own_pieces`, `own_done`), and the owner posts and polls its queue
/// pair itself.
struct Solo<S: Sink, Q: PieceScheduler> {
    engine: Engine<S, Q>,
    sink: S,
    member: usize,
    /// Piece completions to match: polled, or of pieces the NIC refused.
    raw: Vec<RawCompletion>,
}

impl<S: Sink, Q: PieceScheduler> Solo<S, Q> {
    #[inline]
    fn post_send(
        &mut self,
        op: SendOp,
        whole: bool,
        region: S::Region,
        range: Range<usize>,
        sge: ffi::ibv_sge,
        context: u64,
    ) -> Result<(), (Error, S::Region)> {
        // A request sent whole (rare) always goes through the engine.
        let region = if !whole && self.engine.may_park(self.member, op, u64::from(sge.length)) {
            // Posted as the direct path posts, its region parked in the
            // queue pair's books; the engine only counts it.
            match self.sink.park_and_post(op, region, sge, context, SCHED_WR) {
                Ok(()) => {
                    self.engine.parked(self.member, sge.length);
                    return Ok(());
                }
                // Refused by the queue pair: through the engine, whose
                // refused pieces complete as failed at the next poll (as
                // every accepted request ends, with one completion).
                Err((_, region)) => region,
            }
        } else {
            region
        };
        let result =
            self.engine
                .post_send(self.member, Op { op, whole }, region, range, sge, context);
        if let Ok(Some(piece)) = result {
            // The fast path: nothing else was decided.
            if let Some(failed) = post_piece(&mut self.sink, piece) {
                self.raw.push(failed);
            }
            return Ok(());
        }
        self.post_decided();
        result.map(|_| ())
    }

    #[inline]
    fn poll(&mut self, out: &mut Vec<Done<S>>) -> Result<usize, Error> {
        let before = out.len();
        let polled = self.sink.poll(out, &mut self.raw);
        let due = wake_due(&self.engine.wake_at, &self.engine.clock);
        if !self.raw.is_empty() || due {
            // Finished requests go straight to `out` (the engine's list is
            // empty between calls).
            std::mem::swap(out, &mut self.engine.own_done);
            self.engine.completed(self.member, &self.raw, due);
            std::mem::swap(out, &mut self.engine.own_done);
            out.append(&mut self.engine.own_done);
            self.raw.clear();
            self.post_decided();
        }
        polled.map(|_| out.len() - before)
    }

    /// Posts the pieces the engine decided, in order; a piece the NIC
    /// refuses completes as failed at the next poll.
    #[inline]
    fn post_decided(&mut self) {
        if !self.engine.own_pieces.is_empty() {
            self.post_pieces();
        }
    }

    #[inline(never)]
    fn post_pieces(&mut self) {
        for piece in self.engine.own_pieces.drain(..) {
            if let Some(failed) = post_piece(&mut self.sink, piece) {
                self.raw.push(failed);
            }
        }
    }
}

impl<S: Sink, Q: PieceScheduler> Waitable for Solo<S, Q> {
    type Item = Done<S>;

    fn poll(&mut self, out: &mut Vec<Done<S>>) -> Result<usize, Error> {
        Solo::poll(self, out)
    }

    fn check_events(&mut self) -> Result<(), Error> {
        self.sink.check_events()
    }

    fn arm(&mut self) -> Result<Armed, Error> {
        self.sink.arm_events()
    }

    fn take_events(&mut self) -> Result<(), Error> {
        self.sink.take_events()
    }

    fn poll_by(&self) -> Option<Instant> {
        wake_instant(&self.engine.wake_at, &self.engine.clock)
    }

    fn woke_late(&mut self, late: Duration) {
        self.engine.host_delay = Nanos(u64::try_from(late.as_nanos()).unwrap_or(u64::MAX));
    }
}

impl<S: Sink, Q: PieceScheduler> Drop for Solo<S, Q> {
    fn drop(&mut self) {
        self.engine.detach(self.member, Some(&mut self.sink));
    }
}

/// Posts one piece on `qp`; if the NIC refuses it, the completion that
/// fails it.
#[inline(always)]
fn post_piece<S: Sink>(qp: &mut S, piece: RawSend) -> Option<RawCompletion> {
    let wr_id = piece.wr_id;
    // SAFETY: the piece lies inside its message's region (checked at
    // `post_send`), and the engine keeps the message, region and all,
    // until every piece decided for it has completed or failed
    // (`finish_if_done` counts decided pieces), or forever if the queue
    // pair cannot be drained (`detach`).
    match unsafe { qp.post(piece) } {
        Ok(()) => None,
        Err(e) => Some(refused(wr_id, &e)),
    }
}

/// The completion that fails piece `wr_id`, which the NIC refused.
#[cold]
fn refused(wr_id: u64, e: &Error) -> RawCompletion {
    tracing::warn!(error = %e, "posting a scheduled piece failed");
    RawCompletion {
        wr_id,
        status: WcStatus::LocalQpOperation,
    }
}

/// A queue pair attached to a [`Shared`] engine.
struct Attached<S: Sink, Q: PieceScheduler> {
    engine: Arc<Mutex<Engine<S, Q>>>,
    /// Its queue pair and finished requests: polled without the engine's
    /// lock, which is taken only when there is scheduling to do.
    side: Arc<Side<S>>,
    /// When the engine next wants a pump without a completion (the
    /// engine's clock; `u64::MAX`: not before a completion or a post).
    wake_at: Arc<AtomicU64>,
    clock: QuantaClock,
    /// Piece completions polled and not yet matched (kept for its capacity).
    raw: Vec<RawCompletion>,
    /// Own pieces the engine decided, to post (kept for its capacity).
    pieces: Vec<RawSend>,
    /// Other queue pairs' sides to post for (kept for its capacity).
    sides: Vec<Arc<Side<S>>>,
    member: usize,
    class: TrafficClass,
}

impl<S: Sink, Q: PieceScheduler> Attached<S, Q> {
    fn poll(&mut self, out: &mut Vec<Done<S>>) -> Result<usize, Error> {
        let before = out.len();
        let mut raw = std::mem::take(&mut self.raw);
        let polled = lock(&self.side.qp).poll(out, &mut raw);
        // What the engine or other threads left for this queue pair.
        if self.side.mail.load(Ordering::Acquire) {
            let to_post = {
                let mut book = lock(&self.side.book);
                self.side.mail.store(false, Ordering::Relaxed);
                out.append(&mut book.done);
                raw.append(&mut book.raw);
                !book.to_post.is_empty()
            };
            if to_post {
                self.side.flush();
            }
        }
        // Only a finished piece or a due wake-up gives the scheduler
        // something to do; otherwise the engine's lock is left to others.
        let due = wake_due(&self.wake_at, &self.clock);
        if !raw.is_empty() || due {
            let member = self.member;
            self.with_engine(|e| {
                e.completed(member, &raw, due);
                out.append(&mut e.own_done);
            });
        }
        raw.clear();
        self.raw = raw;
        polled.map(|_| out.len() - before)
    }

    /// Runs `f` on the engine, then posts what it decided outside the
    /// engine's lock: posting can be slow (SoftRoCE moves the data in the
    /// posting thread) and must not hold up the other queue pairs.
    ///
    /// Pieces decided for this queue pair are posted by this thread, which
    /// takes the queue pair's lock before letting go of the engine's, so
    /// they keep their order. Pieces decided for other queue pairs are left
    /// to their owners' next poll, unless they have waited longer than
    /// [`HELP_AFTER_NS`]: then a bulk queue pair posts them (never a
    /// latency one, whose thread must not be held up by other tenants'
    /// work).
    fn with_engine<R>(&mut self, f: impl FnOnce(&mut Engine<S, Q>) -> R) -> R {
        let mut e = lock(&self.engine);
        e.caller = self.member;
        let result = f(&mut e);
        e.caller = usize::MAX;
        std::mem::swap(&mut self.pieces, &mut e.own_pieces);
        if !e.own_done.is_empty() {
            // Finished while posting (another queue pair's poll reaped
            // them): the next poll hands them over.
            let mut book = lock(&self.side.book);
            book.done.append(&mut e.own_done);
            self.side.mail.store(true, Ordering::Release);
        }
        if !e.flush.is_empty() {
            let now = e.clock.now().0;
            let helps = self.class == TrafficClass::Bulk;
            let (own, sides) = (&self.side, &mut self.sides);
            e.flush.retain(|s| {
                let due = Arc::ptr_eq(s, own)
                    || (helps && now.saturating_sub(lock(&s.book).decided_at) >= HELP_AFTER_NS);
                if due {
                    sides.push(Arc::clone(s));
                }
                !due
            });
        }
        let qp = if self.pieces.is_empty() {
            None
        } else {
            match self.side.qp.try_lock() {
                Ok(qp) => Some(qp),
                Err(TryLockError::Poisoned(p)) => Some(p.into_inner()),
                Err(TryLockError::WouldBlock) => {
                    // Another thread is posting for this queue pair: queue
                    // these behind its pieces for it (or the next poll).
                    let mut book = lock(&self.side.book);
                    if book.to_post.is_empty() {
                        book.decided_at = e.clock.now().0;
                    }
                    book.to_post.extend(self.pieces.drain(..));
                    self.side.mail.store(true, Ordering::Release);
                    if !e.flush.iter().any(|s| Arc::ptr_eq(s, &self.side)) {
                        e.flush.push(Arc::clone(&self.side));
                    }
                    None
                }
            }
        };
        drop(e);
        if let Some(mut qp) = qp {
            for piece in self.pieces.drain(..) {
                self.side.post(&mut qp, piece);
            }
        }
        for side in self.sides.drain(..) {
            side.flush();
        }
        result
    }
}

impl<S: Sink, Q: PieceScheduler> Waitable for Attached<S, Q> {
    type Item = Done<S>;

    fn poll(&mut self, out: &mut Vec<Done<S>>) -> Result<usize, Error> {
        Attached::poll(self, out)
    }

    fn check_events(&mut self) -> Result<(), Error> {
        lock(&self.side.qp).check_events()
    }

    fn arm(&mut self) -> Result<Armed, Error> {
        lock(&self.side.qp).arm_events()
    }

    fn take_events(&mut self) -> Result<(), Error> {
        lock(&self.side.qp).take_events()
    }

    fn poll_by(&self) -> Option<Instant> {
        let slice = Instant::now() + ATTACHED_WAIT;
        Some(wake_instant(&self.wake_at, &self.clock).map_or(slice, |at| at.min(slice)))
    }
}

impl<S: Sink, Q: PieceScheduler> Drop for Attached<S, Q> {
    fn drop(&mut self) {
        let member = self.member;
        self.with_engine(|e| e.detach(member, None));
    }
}

/// The handle of a scheduled request, as a [`PieceScheduler`] sees it
/// (opaque: a scheduler only keeps it and hands it back in its grants).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PieceRef {
    // Which message a scheduled piece belongs to. `seq` tells a message
    // from a later one stored under the same key (the descriptors of a
    // detached queue pair stay queued until the scheduler hands them out).
    message: usize,
    seq: u64,
}

/// One send request and the pieces of it still in the NIC.
struct Message<R> {
    member: usize,
    seq: u64,
    op: SendOp,
    region: R,
    start: usize,
    len: u64,
    context: u64,
    pieces_out: u32,
    last_granted: bool,
    status: WcStatus,
}

impl<R: Region> Message<R> {
    /// The request's one completion, its region handed back.
    #[inline]
    fn complete(self) -> R::Completion {
        let opcode = if self.status.is_success() {
            self.op.completion_opcode()
        } else {
            Opcode::Unknown
        };
        let byte_len = u32::try_from(self.len).unwrap_or(u32::MAX);
        self.region
            .complete(self.context, self.status, opcode, byte_len, None)
    }
}

/// A piece in the NIC. An RC send queue completes in order, so the front
/// of a queue pair's list is the next completion's piece. Whether it counts
/// against the bulk budget is its queue pair's class. (Two words, so it
/// travels in registers.)
#[derive(Debug, Clone, Copy)]
struct InFlight {
    /// Its request's key, or [`PARKED`].
    message: usize,
    /// Bytes (a piece's scatter entry holds at most `u32::MAX`).
    len: u32,
    /// When it was posted (the engine's clock), for a queue pair with a
    /// window; 0 otherwise.
    sent_at: u64,
}

/// [`InFlight::message`] of a request parked in the queue pair's books.
const PARKED: usize = usize::MAX;

/// A queue pair and what its owner collects at its next poll.
///
/// Two locks, so that the engine never waits for a post in progress
/// (on SoftRoCE a post moves the data before it returns): `qp` is held to
/// post and to poll, `book` only for moments. Lock order: engine, then
/// `qp`, then `book`; the engine only ever tries `qp` (`reap_others`) or
/// takes it to tear down (`detach`).
struct Side<S: Sink> {
    qp: Mutex<S>,
    book: Mutex<Book<Done<S>>>,
    /// Whether `book` may hold something for the owner (set under the
    /// book's lock by whoever adds; cleared by the owner under it), so an
    /// owner's poll with nothing new takes no lock but the queue pair's.
    mail: AtomicBool,
}

/// A queue pair's bookkeeping between the engine and its owner.
struct Book<C> {
    /// Pieces the engine decided to post, in order, posted by `flush`.
    to_post: VecDeque<RawSend>,
    /// When the oldest of `to_post` was decided (the engine's clock).
    decided_at: u64,
    /// Finished requests and receives waiting for the owner's poll.
    done: Vec<C>,
    /// Completions of pieces polled and not yet matched to their requests.
    raw: Vec<RawCompletion>,
}

impl<C> Default for Book<C> {
    fn default() -> Self {
        Book {
            to_post: VecDeque::new(),
            decided_at: 0,
            done: Vec::new(),
            raw: Vec::new(),
        }
    }
}

impl<S: Sink> Side<S> {
    /// Posts the pieces the engine queued, in order.
    fn flush(&self) {
        if lock(&self.book).to_post.is_empty() {
            return;
        }
        let mut qp = lock(&self.qp);
        loop {
            // Only the holder of `qp` takes pieces, so they go in order.
            let Some(piece) = lock(&self.book).to_post.pop_front() else {
                return;
            };
            self.post(&mut qp, piece);
        }
    }

    /// Posts one piece on `qp` (this side's, locked by the caller). A
    /// piece the NIC refuses completes as failed at the next poll.
    fn post(&self, qp: &mut S, piece: RawSend) {
        if let Some(failed) = post_piece(qp, piece) {
            self.deliver(|book| book.raw.push(failed));
        }
    }

    /// Leaves a finished request for the owner's next poll.
    #[inline(never)]
    fn deliver_done(&self, done: Done<S>) {
        self.deliver(|book| book.done.push(done));
    }

    /// Leaves something in the book for the owner's next poll.
    fn deliver(&self, f: impl FnOnce(&mut Book<Done<S>>)) {
        let mut book = lock(&self.book);
        f(&mut book);
        self.mail.store(true, Ordering::Release);
    }

    /// Polls into the book (for the engine, on the owner's behalf);
    /// skipped while the queue pair is busy posting.
    fn try_reap(&self) -> Result<(), Error> {
        let Ok(mut qp) = self.qp.try_lock() else {
            return Ok(());
        };
        let (mut done, mut raw) = (Vec::new(), Vec::new());
        let polled = qp.poll(&mut done, &mut raw);
        if !done.is_empty() || !raw.is_empty() {
            self.deliver(|book| {
                book.done.append(&mut done);
                book.raw.append(&mut raw);
            });
        }
        polled.map(|_| ())
    }
}

/// One attached queue pair.
struct Member<S: Sink> {
    /// Its side, or none for a queue pair with an engine of its own, whose
    /// pieces and finished requests go to `own_pieces` and `own_done`.
    side: Option<Arc<Side<S>>>,
    /// Send queue slots for its pieces.
    sq_room: u32,
    tenant: TenantId,
    class: TrafficClass,
    quota: Option<TenantHandle>,
    max_pieces: u32,
    in_flight: VecDeque<InFlight>,
    /// Pieces granted and not yet posted (the queue pair was full, the
    /// bulk budget spent, or its shared rate limit said wait), in order.
    pending: VecDeque<Grant<PieceRef>>,
    /// When the shared rate limit lets the head of `pending` go (on the
    /// quota table's clock).
    retry_at: u64,
    /// Whether it is in the engine's `waiting` list.
    waiting: bool,
    /// Bytes accepted and not yet posted (its share of the tenant's demand
    /// in the quota table).
    backlog: u64,
    /// Requests accepted and not yet handed back.
    accepted: usize,
    /// Pieces of `in_flight` the engine posted raw (the others were
    /// parked in the queue pair's books, see [`Engine::may_park`]).
    raw_out: u32,
    /// What bounds its bulk bytes in the NIC by their completion times.
    window: Option<DelayWindow>,
    /// Whether the window's weight is the tenant's (left at 1 in the
    /// configuration), so that a reload changes it too.
    window_takes_weight: bool,
    /// The quota table's policy sequence its tenant's weight and caps were
    /// read at (see [`Engine::follow_policy`]).
    policy_seq: u64,
    /// Bytes of `in_flight`.
    bytes_out: u64,
}

impl<S: Sink> Member<S> {
    /// Counts a piece of `message` (or [`PARKED`]) of `len` bytes as in
    /// the NIC from `now` (read only for a queue pair with a window);
    /// returns the bytes it takes from the bulk budget (none for the
    /// latency class).
    #[inline]
    fn hold(&mut self, message: usize, len: u64, now: impl FnOnce() -> Nanos) -> u64 {
        let sent_at = match &mut self.window {
            Some(w) => {
                let now = now();
                w.on_sent(len, now);
                now.0
            }
            None => 0,
        };
        self.in_flight.push_back(InFlight {
            message,
            len: u32::try_from(len).unwrap_or(u32::MAX),
            sent_at,
        });
        self.bytes_out += len;
        self.bulk_bytes(len)
    }

    /// Takes the piece of `message` (or [`PARKED`]) out of `in_flight`
    /// (the front one, as an RC send queue completes in order, unless a
    /// refused post completed out of turn); returns the bytes it gives
    /// back to the bulk budget, or `None` if it is not in flight.
    #[inline]
    fn release(&mut self, message: usize, now: impl FnOnce() -> Nanos, host: Nanos) -> Option<u64> {
        let piece = match self.in_flight.front() {
            Some(p) if p.message == message => self.in_flight.pop_front(),
            _ => self
                .in_flight
                .iter()
                .position(|p| p.message == message)
                .and_then(|at| self.in_flight.remove(at)),
        }?;
        let len = u64::from(piece.len);
        self.bytes_out -= len;
        if let Some(w) = &mut self.window {
            if let Some(q) = &self.quota {
                // The queue allowance in bytes at the link's measured rate.
                w.set_link_rate(q.link_estimate());
            }
            w.on_completed_late(len, Nanos(piece.sent_at), now(), host);
            if let Some(q) = &self.quota {
                // What the window saw, for the coordinator's capacity.
                let v = w.take_verdicts();
                if v.judged > 0 {
                    q.record_verdicts(v.judged, v.over_target);
                }
            }
        }
        Some(self.bulk_bytes(len))
    }

    /// Whether its window lets a piece of `len` bytes go at `now` (always
    /// without a window); if pacing says later, `wake` is brought forward
    /// to that time.
    #[inline]
    fn window_admits(&self, len: u64, now: Nanos, wake: &mut u64) -> bool {
        let Some(w) = &self.window else {
            return true;
        };
        match w.admit(self.bytes_out, len, now) {
            Admit::Now => true,
            Admit::At(at) => {
                *wake = (*wake).min(at.0);
                false
            }
            Admit::AfterCompletion => false,
        }
    }

    /// What `len` bytes of this queue pair count against the bulk budget.
    #[inline]
    fn bulk_bytes(&self, len: u64) -> u64 {
        if self.class == TrafficClass::Latency {
            0
        } else {
            len
        }
    }
}

/// Everything behind a [`SharedScheduler`]: the queue pairs, their
/// requests, and the one scheduler that orders them.
struct Engine<S: Sink, Q: PieceScheduler> {
    sched: Q,
    chunk_bytes: u64,
    /// Bound on `bulk_in_flight`.
    budget: u64,
    bulk_in_flight: u64,
    /// Latency-class descriptors in `sched`.
    latency_queued: usize,
    members: Slab<Member<S>>,
    messages: Slab<Message<S::Region>>,
    /// Members with pending pieces.
    waiting: Vec<usize>,
    pending_total: usize,
    next_seq: u64,
    /// Tenants whose policy was set on the scheduler itself.
    explicit: Vec<TenantId>,
    /// Whether any tenant was ever given caps in `sched` (which the fast
    /// path must then ask).
    capped: bool,
    clock: QuantaClock,
    /// Shared with the queue pairs: see `ScheduledQueuePair::wake_at`.
    wake_at: Arc<AtomicU64>,
    /// Sides with pieces to post once the engine's lock is released.
    flush: Vec<Arc<Side<S>>>,
    /// The member whose owner holds the engine's lock (`usize::MAX`: none).
    caller: usize,
    /// Pieces decided for `caller`, which it posts itself.
    own_pieces: Vec<RawSend>,
    /// Requests of `caller` that finished, which it takes itself.
    own_done: Vec<Done<S>>,
    /// Piece completions being matched (kept for its capacity).
    scratch: Vec<RawCompletion>,
    /// `CLOCK_MONOTONIC` minus `clock` at creation: windows run on the
    /// clock every process shares, so that their quiet times line up
    /// across processes.
    shared_offset: u64,
    /// How long the thread that polls next waited for a CPU after a
    /// completion woke it (see `Waitable::woke_late`): the completions it
    /// finds are judged that much earlier by the windows.
    host_delay: Nanos,
    /// The earliest time (the engine's clock) a queue pair held back by
    /// its rate limit or window pacing may go again, found by this pump.
    timed_wake: u64,
    /// Whether every queue pair has an engine of its own (no sides): then
    /// nothing but completions and `timed_wake` makes work.
    solo: bool,
}

/// How often queue pairs that hold bulk budget are polled by the others
/// when the budget is spent and their owners have not polled them.
const REAP_INTERVAL_NS: u64 = 100_000;

/// How long pieces decided for a queue pair wait for its owner to post
/// them before another thread does.
const HELP_AFTER_NS: u64 = 1_000_000;

/// The built-in scheduler for `config`: latency first, weighted DRR,
/// caps, chunks of `chunk_bytes`.
pub(crate) fn default_scheduler(config: &SharedConfig) -> Result<DefaultScheduler, Error> {
    TenantScheduler::new(SchedulerConfig {
        chunk_bytes: config.chunk_bytes,
        quantum_bytes: config.chunk_bytes,
        bulk_min_share_ppm: config.bulk_min_share_ppm,
        ..SchedulerConfig::default()
    })
    .map_err(Error::ScheduleConfig)
}

impl<S: Sink, Q: PieceScheduler> Engine<S, Q> {
    fn new(config: SharedConfig, sched: Q) -> Result<Engine<S, Q>, Error> {
        Ok(Engine {
            sched,
            chunk_bytes: config.chunk_bytes,
            budget: config.bulk_bytes_in_flight.max(1),
            bulk_in_flight: 0,
            latency_queued: 0,
            members: Slab::default(),
            messages: Slab::default(),
            waiting: Vec::new(),
            pending_total: 0,
            next_seq: 0,
            explicit: Vec::new(),
            capped: false,
            clock: QuantaClock::new(),
            wake_at: Arc::new(AtomicU64::new(u64::MAX)),
            flush: Vec::new(),
            caller: usize::MAX,
            own_pieces: Vec::new(),
            own_done: Vec::new(),
            scratch: Vec::new(),
            shared_offset: 0,
            host_delay: Nanos::ZERO,
            timed_wake: u64::MAX,
            solo: false,
        })
    }

    /// Adds queue pair `qpn` with `sq_room` send queue slots; returns its
    /// member key, tenant and class.
    fn add_member(
        &mut self,
        side: Option<Arc<Side<S>>>,
        qpn: u32,
        sq_room: u32,
        who: Who,
        config: ScheduleConfig,
    ) -> Result<(usize, TenantId, TrafficClass), Error> {
        let Who {
            tenant,
            class,
            quota,
        } = who;
        let policy_seq = quota.as_ref().map_or(0, TenantHandle::policy_seq);
        if !self.explicit.contains(&tenant) {
            // The tenant's weight, and its caps too: the scheduler then
            // holds a capped tenant back itself (the others keep its turns)
            // rather than granting pieces the quota table would refuse.
            let local = quota
                .as_ref()
                .and_then(TenantHandle::policy)
                .map_or_else(TenantPolicy::default, |p| p.schedule);
            self.set_policy(tenant, local)?;
        }
        let window_takes_weight = config.window.as_ref().is_some_and(|w| w.weight == 1);
        let window = match (&config.window, class) {
            (Some(w), TrafficClass::Bulk) => {
                if self.shared_offset == 0 {
                    self.shared_offset =
                        mtrdma_core::clock::monotonic_ns().saturating_sub(self.clock.now().0);
                }
                // Queue pairs of one port start again after a quiet time
                // at points of their own.
                let seed = u64::from(qpn);
                // A window left at weight 1 takes the tenant's weight, so
                // that tenants in different processes share the port by
                // their policies' weights.
                let weight = if w.weight == 1 {
                    self.sched.policy(tenant).map_or(1, |p| p.weight)
                } else {
                    w.weight
                };
                Some(
                    DelayWindow::new(DelayWindowConfig {
                        seed,
                        weight,
                        ..w.clone()
                    })
                    .map_err(Error::ScheduleConfig)?,
                )
            }
            _ => None,
        };
        let member = self.members.insert(Member {
            side,
            sq_room,
            tenant,
            class,
            quota,
            max_pieces: config.max_pieces_in_flight.max(1),
            in_flight: VecDeque::new(),
            pending: VecDeque::new(),
            retry_at: 0,
            waiting: false,
            backlog: 0,
            accepted: 0,
            raw_out: 0,
            window,
            window_takes_weight,
            policy_seq,
            bytes_out: 0,
        });
        Ok((member, tenant, class))
    }

    /// Matches the piece completions `member` polled (`raw`) to their
    /// requests, then decides what goes next if there may be anything
    /// (`due`: a wake-up the engine asked for has come).
    #[inline]
    fn completed(&mut self, member: usize, raw: &[RawCompletion], due: bool) {
        self.process(member, raw);
        // With nothing queued or waiting there is nothing to decide unless
        // a wake-up is due.
        if due || !self.sched.is_empty() || !self.waiting.is_empty() {
            self.pump();
        }
    }

    /// Takes up a policy reload: when the quota table's policy changed
    /// since `member`'s tenant's weight and caps were read, reads them
    /// again into the scheduler (unless set with
    /// [`SharedScheduler::set_policy`]) and into the windows of its
    /// tenant's queue pairs that follow its weight. One atomic load per
    /// request when nothing changed.
    #[inline]
    fn follow_policy(&mut self, member: usize) {
        let m = self.member(member);
        let Some(q) = &m.quota else {
            return;
        };
        let seq = q.policy_seq();
        if seq != m.policy_seq {
            self.policy_changed(member, seq);
        }
    }

    #[cold]
    #[inline(never)]
    fn policy_changed(&mut self, member: usize, seq: u64) {
        let m = self.member_mut(member);
        m.policy_seq = seq;
        let tenant = m.tenant;
        let Some(policy) = m.quota.as_ref().and_then(TenantHandle::policy) else {
            return;
        };
        if !self.explicit.contains(&tenant) {
            if let Err(e) = self.set_policy(tenant, policy.schedule) {
                tracing::warn!(%tenant, error = %e, "keeping the last weight and caps");
                return;
            }
        }
        let weight = self.sched.policy(tenant).map_or(1, |p| p.weight);
        for m in self.members.values_mut() {
            if m.tenant != tenant {
                continue;
            }
            m.policy_seq = seq;
            if let (Some(w), true) = (&mut m.window, m.window_takes_weight) {
                if let Err(e) = w.set_weight(weight) {
                    tracing::warn!(%tenant, error = %e, "keeping the window's weight");
                }
            }
        }
    }

    /// Sets `tenant`'s weight and caps in the scheduler.
    fn set_policy(&mut self, tenant: TenantId, policy: TenantPolicy) -> Result<(), Error> {
        self.sched
            .set_policy(tenant, policy)
            .map_err(Error::ScheduleConfig)?;
        self.capped |= policy.byte_cap.is_some() || policy.wr_cap.is_some();
        Ok(())
    }

    fn now(&self) -> Nanos {
        Nanos(self.clock.now().0)
    }

    /// The engine's clock as the windows see it (shared by every process).
    #[inline]
    fn window_now(clock: &QuantaClock, offset: u64) -> Nanos {
        Nanos(clock.now().0.saturating_add(offset))
    }

    #[inline]
    fn member(&self, member: usize) -> &Member<S> {
        self.members
            .get(member)
            .expect("a queue pair's member entry lives as long as it does")
    }

    #[inline]
    fn member_mut(&mut self, member: usize) -> &mut Member<S> {
        self.members
            .get_mut(member)
            .expect("a queue pair's member entry lives as long as it does")
    }

    /// Whether `member`'s request of `len` bytes may be posted now as the
    /// direct path posts it, its region parked in the queue pair's own
    /// books (its completion then comes out of the queue pair's poll in
    /// order, and the engine only counts the piece): a queue pair with an
    /// engine of its own, no shared rate limit or caps to charge, a request
    /// of one piece with nothing queued ahead, room in the NIC, and no raw
    /// piece in flight (whose request would finish after this one's).
    #[inline]
    fn may_park(&self, member: usize, op: SendOp, len: u64) -> bool {
        let m = self.member(member);
        m.side.is_none()
            && m.quota.is_none()
            && m.window.is_none()
            && !self.capped
            && m.raw_out == 0
            && self.unhindered(m, op, len)
    }

    /// Whether `m`'s request of `len` bytes may skip the scheduler's
    /// queues (before caps and rate limits): it is one piece, nothing it
    /// should wait behind is queued, and there is room for it in the NIC
    /// and in the bulk budget.
    #[inline]
    fn unhindered(&self, m: &Member<S>, op: SendOp, len: u64) -> bool {
        let latency = m.class == TrafficClass::Latency;
        let one_piece =
            len <= self.chunk_bytes || matches!(op, SendOp::Send | SendOp::SendWithImm(_));
        let nothing_ahead = if latency {
            self.latency_queued == 0
        } else {
            self.sched.is_empty()
        };
        one_piece
            && nothing_ahead
            && m.pending.is_empty()
            && (m.in_flight.len() as u32) < m.max_pieces.min(m.sq_room)
            && (latency || self.bulk_fits(len))
            && (m.window.is_none() || {
                let now = Self::window_now(&self.clock, self.shared_offset);
                // A time to try again is found when the request is pumped.
                let mut later = u64::MAX;
                m.window_admits(len, now, &mut later)
            })
    }

    /// Counts a request of `len` bytes that `may_park` let go, posted.
    #[inline]
    fn parked(&mut self, member: usize, len: u32) {
        let m = self
            .members
            .get_mut(member)
            .expect("a queue pair's member entry lives as long as it does");
        // No window on a parked queue pair (`may_park`): no clock reading.
        self.bulk_in_flight += m.hold(PARKED, u64::from(len), || Nanos(0));
        m.accepted += 1;
    }

    /// Counts one parked request as finished (its completion went to the
    /// owner from the queue pair's poll).
    #[inline]
    fn parked_done(&mut self, member: usize) {
        let m = self.member_mut(member);
        let Some(bulk) = m.release(PARKED, || Nanos(0), Nanos::ZERO) else {
            tracing::error!("completion for a parked request that is not in flight");
            return;
        };
        m.accepted -= 1;
        self.bulk_in_flight -= bulk;
    }

    /// Whether a bulk piece of `len` bytes fits the budget now.
    #[inline]
    fn bulk_fits(&self, len: u64) -> bool {
        self.bulk_in_flight == 0 || self.bulk_in_flight.saturating_add(len) <= self.budget
    }

    /// Accepts a request whose range `check_send` found to be `sge`:
    /// lets it go now if it may (the fast path), or queues it. Returns the
    /// piece when its owner is to post it at once (the caller holding the
    /// engine, or a queue pair with an engine of its own); anything else
    /// decided is in `own_pieces` or the books.
    #[inline]
    fn post_send(
        &mut self,
        member: usize,
        Op { op, whole }: Op,
        region: S::Region,
        range: Range<usize>,
        sge: ffi::ibv_sge,
        context: u64,
    ) -> Result<Option<RawSend>, (Error, S::Region)> {
        self.follow_policy(member);
        let len = (range.end - range.start) as u64;
        let seq = self.next_seq;
        self.next_seq += 1;
        let kind = match op {
            SendOp::Send | SendOp::SendWithImm(_) => SchedOpcode::Send,
            SendOp::Write(_) | SendOp::WriteWithImm(..) => SchedOpcode::Write,
            SendOp::Read(_) => SchedOpcode::Read,
        };
        let m = self.member(member);
        let (tenant, class) = (m.tenant, m.class);
        let latency = class == TrafficClass::Latency;
        // Fast path: nothing in the way and the tenant's caps in this
        // scheduler let it go now: post it without a trip through the
        // scheduler's queues (if its shared rate limit agrees).
        // A request sent whole that is longer than a piece waits for the
        // scheduler, which grants it as one piece.
        let fast = self.unhindered(m, op, len)
            && (!self.capped || self.sched.admit_now(tenant, len, self.now()).is_ok());
        let go = fast && self.rate_allows(member, len);
        let message = self.messages.insert(Message {
            member,
            seq,
            op,
            region,
            start: range.start,
            len,
            context,
            // Sent now: its one piece is out, and the last.
            pieces_out: u32::from(go),
            last_granted: go,
            status: WcStatus::Success,
        });
        self.member_mut(member).accepted += 1;
        if go {
            let (opcode, remote, imm) = op.lower(true);
            let raw = RawSend {
                wr_id: RAW_WR | message as u64,
                opcode,
                sge,
                remote: remote.map(|r| (r.addr, r.rkey)),
                imm,
            };
            return Ok(self.launch(member, raw, len));
        }
        let handle = PieceRef { message, seq };
        if fast {
            // Held back by its shared rate limit only (its caps here have
            // been charged): the wake-up time must say when to try again.
            self.add_backlog(member, len);
            self.make_pending(Grant {
                tenant,
                class,
                op: kind,
                handle,
                offset: 0,
                len,
                is_last: true,
            });
            self.pump();
            return Ok(None);
        }
        let mut descriptor = Descriptor::new(tenant, class, kind, len, handle);
        if whole {
            descriptor = descriptor.whole();
        }
        if let Err(rejected) = self.sched.enqueue(descriptor, self.now()) {
            self.member_mut(member).accepted -= 1;
            let message = self.messages.remove(message).expect("just stored");
            return Err((Error::Rejected(rejected.reason), message.region));
        }
        if latency {
            self.latency_queued += 1;
        }
        self.add_backlog(member, len);
        self.pump();
        Ok(None)
    }

    /// Counts `len` accepted bytes as the tenant's demand until posted.
    fn add_backlog(&mut self, member: usize, len: u64) {
        let m = self.member_mut(member);
        if let Some(q) = &m.quota {
            m.backlog += len;
            q.add_backlog(i64::try_from(len).unwrap_or(i64::MAX));
        }
    }

    /// Queues a granted piece behind its queue pair's other pending ones.
    fn make_pending(&mut self, grant: Grant<PieceRef>) {
        let Some(msg) = self
            .messages
            .get(grant.handle.message)
            .filter(|m| m.seq == grant.handle.seq)
        else {
            // The queue pair it belonged to was detached.
            return;
        };
        let member = msg.member;
        let m = self.member_mut(member);
        m.pending.push_back(grant);
        if !m.waiting {
            m.waiting = true;
            self.waiting.push(member);
        }
        self.pending_total += 1;
    }

    /// Posts `member`'s pending pieces, in order, while its queue pair,
    /// the bulk budget and its shared rate limit allow.
    fn drain_member(&mut self, member: usize) {
        loop {
            let budget_ok = {
                let m = self.member(member);
                let Some(g) = m.pending.front() else { return };
                let slots = m.max_pieces.min(m.sq_room);
                if m.in_flight.len() as u32 >= slots {
                    return;
                }
                g.class == TrafficClass::Latency || self.bulk_fits(g.len)
            };
            if !budget_ok {
                return;
            }
            let len = self.member(member).pending.front().map_or(0, |g| g.len);
            let m = self.member(member);
            if m.window.is_some() {
                let now = Self::window_now(&self.clock, self.shared_offset);
                let mut at = u64::MAX;
                if !m.window_admits(len, now, &mut at) {
                    if at != u64::MAX {
                        let wait = at.saturating_sub(now.0);
                        self.timed_wake = self.timed_wake.min(self.clock.now().0 + wait);
                    }
                    return;
                }
            }
            if !self.rate_allows(member, len) {
                let m = self.member(member);
                if let Some(q) = &m.quota {
                    let wait = m.retry_at.saturating_sub(q.now_ns());
                    self.timed_wake = self.timed_wake.min(self.clock.now().0 + wait);
                }
                return;
            }
            let m = self.member_mut(member);
            let grant = m.pending.pop_front().expect("checked above");
            self.pending_total -= 1;
            self.post_piece(member, grant);
        }
    }

    /// Whether `member`'s tenant may post `len` bytes now by its shared rate
    /// limit (charging it if so; otherwise noting when to try again).
    #[inline]
    fn rate_allows(&mut self, member: usize, len: u64) -> bool {
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
                m.retry_at = at;
                false
            }
        }
    }

    /// Posts pending pieces, then new ones from the scheduler, while the
    /// queue pairs, the bulk budget and the rate limits allow.
    fn pump(&mut self) {
        self.timed_wake = u64::MAX;
        let wake = self.pump_until();
        self.wake_at.store(wake, Ordering::Release);
    }

    /// [`pump`](Self::pump); returns when the engine next wants to be
    /// pumped if no piece completes and nothing is posted before then.
    fn pump_until(&mut self) -> u64 {
        let mut i = 0;
        while i < self.waiting.len() {
            let member = self.waiting[i];
            self.drain_member(member);
            match self.members.get_mut(member) {
                Some(m) if !m.pending.is_empty() => i += 1,
                other => {
                    if let Some(m) = other {
                        m.waiting = false;
                    }
                    self.waiting.swap_remove(i);
                }
            }
        }
        let mut reaped = false;
        // Grants waiting for their queue pair do not hold up the others,
        // but their number is bounded so the scheduler keeps the order. A
        // queue pair on its own has no others: one grant waits for room,
        // the rest stay with the scheduler, which orders them when room
        // comes (a scheduler of the user's own decides then, not now).
        let pending_cap = if self.solo {
            1
        } else {
            64.max(4 * self.members.len())
        };
        let reap_soon = self.clock.now().0.saturating_add(REAP_INTERVAL_NS);
        while self.pending_total < pending_cap {
            if self.latency_queued == 0 && !self.bulk_fits(1) {
                // Nothing may go until a bulk piece completes; queue pairs
                // whose owners have not polled may hold finished ones.
                if reaped {
                    return self.soon(reap_soon);
                }
                reaped = true;
                self.reap_others();
                continue;
            }
            let grant = match self.sched.dequeue(self.now()) {
                Dequeue::Ready(grant) => grant,
                Dequeue::Wait(at) if self.waiting.is_empty() => return at.0,
                Dequeue::Wait(at) => return at.0.min(self.soon(reap_soon)),
                Dequeue::Empty if self.waiting.is_empty() => return u64::MAX,
                Dequeue::Empty => return self.soon(reap_soon),
            };
            if grant.is_last && grant.class == TrafficClass::Latency {
                self.latency_queued -= 1;
            }
            let member = self
                .messages
                .get(grant.handle.message)
                .filter(|m| m.seq == grant.handle.seq)
                .map(|m| m.member);
            self.make_pending(grant);
            if let Some(member) = member {
                self.drain_member(member);
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
    fn soon(&self, reap_soon: u64) -> u64 {
        if self.solo {
            self.timed_wake
        } else {
            reap_soon
        }
    }

    /// Polls the queue pairs that hold bulk pieces in the NIC (their
    /// finished requests wait in `done` for their owners).
    fn reap_others(&mut self) {
        let holders: Vec<usize> = self
            .members
            .iter()
            .filter(|(_, m)| {
                m.side.is_some() && m.class != TrafficClass::Latency && !m.in_flight.is_empty()
            })
            .map(|(k, _)| k)
            .collect();
        for member in holders {
            if let Err(e) = self.reap(member) {
                tracing::warn!(error = %e, "polling a scheduled queue pair failed");
            }
        }
    }

    /// Polls `member`'s completion queue: receives go to its `done`, pieces
    /// are matched to their requests, and finished requests go to `done`.
    fn reap(&mut self, member: usize) -> Result<(), Error> {
        let Some(side) = self.member(member).side.clone() else {
            return Ok(());
        };
        let result = side.try_reap();
        let mut raw = std::mem::take(&mut self.scratch);
        if side.mail.load(Ordering::Acquire) {
            std::mem::swap(&mut raw, &mut lock(&side.book).raw);
        }
        self.process(member, &raw);
        raw.clear();
        self.scratch = raw;
        result
    }

    /// Matches the piece completions `member`'s side has collected to
    /// their requests.
    #[inline]
    fn process(&mut self, member: usize, raw: &[RawCompletion]) {
        for c in raw {
            if c.wr_id == PARKED_DONE {
                self.parked_done(member);
            } else {
                let message = (c.wr_id & !RAW_WR) as usize;
                self.piece_done(member, message, c.status);
            }
        }
    }

    /// Accounts one finished piece.
    #[inline]
    fn piece_done(&mut self, member: usize, message: usize, status: WcStatus) {
        let (clock, offset, host) = (&self.clock, self.shared_offset, self.host_delay);
        let m = self
            .members
            .get_mut(member)
            .expect("a queue pair's member entry lives as long as it does");
        let Some(bulk) = m.release(message, || Self::window_now(clock, offset), host) else {
            tracing::error!(message, "completion for a piece that is not in flight");
            return;
        };
        m.raw_out -= 1;
        self.bulk_in_flight -= bulk;
        let Some(msg) = self.messages.get_mut(message) else {
            return;
        };
        if !status.is_success() && msg.status.is_success() {
            msg.status = status;
        }
        if msg.pieces_out == 1 && msg.last_granted {
            // Its last piece: finished (the count is not written first, so
            // the move out of the slab does not wait for that store).
            self.finish(message);
        } else {
            msg.pieces_out -= 1;
        }
    }

    fn post_piece(&mut self, member: usize, grant: Grant<PieceRef>) {
        let PieceRef { message, seq } = grant.handle;
        let Some(msg) = self.messages.get_mut(message).filter(|m| m.seq == seq) else {
            return;
        };
        if grant.is_last {
            msg.last_granted = true;
        }
        let m = self
            .members
            .get_mut(member)
            .expect("pending pieces belong to attached queue pairs");
        if let Some(q) = &m.quota {
            m.backlog = m.backlog.saturating_sub(grant.len);
            q.add_backlog(-i64::try_from(grant.len).unwrap_or(i64::MAX));
        }
        if !msg.status.is_success() {
            // The request already failed: its remaining pieces are dropped.
            self.finish_if_done(message);
            return;
        }
        let (opcode, remote, imm) = msg.op.lower(grant.is_last);
        let Some(mut sge) = msg.region.sge(&(msg.start..msg.start + msg.len as usize)) else {
            // Checked at `post_send`; should it ever fail, fail the request
            // rather than leave it waiting forever.
            msg.status = WcStatus::LocalLength;
            self.finish_if_done(message);
            return;
        };
        sge.addr += grant.offset;
        sge.length = u32::try_from(grant.len).unwrap_or(u32::MAX);
        let raw = RawSend {
            wr_id: RAW_WR | message as u64,
            opcode,
            sge,
            remote: remote.map(|r| (r.addr + grant.offset, r.rkey)),
            imm,
        };
        msg.pieces_out += 1;
        if let Some(raw) = self.launch(member, raw, grant.len) {
            self.own_pieces.push(raw);
        }
    }

    /// Counts `raw`, a piece of `len` bytes, as in flight on `member`'s
    /// queue pair and hands it to whoever posts it: back to the caller if
    /// the owner does (it holds the engine, or has no side), else to its
    /// side's book.
    #[inline]
    #[must_use]
    fn launch(&mut self, member: usize, raw: RawSend, len: u64) -> Option<RawSend> {
        let message = (raw.wr_id & !RAW_WR) as usize;
        let (clock, offset) = (&self.clock, self.shared_offset);
        let m = self
            .members
            .get_mut(member)
            .expect("pieces belong to attached queue pairs");
        self.bulk_in_flight += m.hold(message, len, || Self::window_now(clock, offset));
        m.raw_out += 1;
        if let Some(q) = &m.quota {
            q.record_posted(len, 1);
        }
        let side = match &m.side {
            // Its owner holds the engine and posts it on the way out; no
            // piece of it waits in the book (that would set the mail).
            Some(side) if member != self.caller || side.mail.load(Ordering::Acquire) => side,
            _ => return Some(raw),
        };
        let now = self.clock.now().0;
        side.deliver(|book| {
            if book.to_post.is_empty() {
                book.decided_at = now;
            }
            book.to_post.push_back(raw);
        });
        if !self.flush.iter().any(|s| Arc::ptr_eq(s, side)) {
            self.flush.push(Arc::clone(side));
        }
        None
    }

    /// Completes a request once all its pieces are granted and done.
    fn finish_if_done(&mut self, message: usize) {
        let ready = matches!(
            self.messages.get(message),
            Some(m) if m.pieces_out == 0 && m.last_granted
        );
        if ready {
            self.finish(message);
        }
    }

    /// Completes request `message` (all its pieces are done or dropped).
    #[inline]
    fn finish(&mut self, message: usize) {
        let Some(m) = self.messages.remove(message) else {
            return;
        };
        let Some(owner) = self.members.get_mut(m.member) else {
            // Its queue pair was detached: the region is dropped.
            return;
        };
        owner.accepted -= 1;
        match &owner.side {
            Some(side) if m.member != self.caller => side.deliver_done(m.complete()),
            _ => push_in_place(&mut self.own_done, m.complete()),
        }
    }

    /// Takes a queue pair out: its requests are dropped (their regions
    /// freed once the NIC is done with them, or never) and its share of
    /// the bulk budget returned. `own` is the queue pair of a member
    /// without a side.
    fn detach(&mut self, member: usize, own: Option<&mut S>) {
        let Some(m) = self.members.remove(member) else {
            return;
        };
        if let Some(q) = &m.quota {
            // What is still waiting here is no longer demand.
            q.add_backlog(-i64::try_from(m.backlog).unwrap_or(i64::MAX));
        }
        self.pending_total -= m.pending.len();
        if m.waiting {
            self.waiting.retain(|&w| w != member);
        }
        let bulk = m.bulk_bytes(m.in_flight.iter().map(|p| u64::from(p.len)).sum());
        let drained = match (&m.side, own) {
            (Some(side), _) => {
                // Pieces decided and not posted never reach the NIC.
                self.flush.retain(|s| !Arc::ptr_eq(s, side));
                let mut qp = lock(&side.qp);
                lock(&side.book).to_post.clear();
                qp.shutdown()
            }
            (None, Some(qp)) => {
                self.own_pieces.clear();
                qp.shutdown()
            }
            // No queue pair to drain: keep the regions.
            (None, None) => false,
        };
        self.bulk_in_flight -= bulk;
        let messages = self.messages.remove_where(|msg| msg.member == member);
        if !drained {
            // The NIC may still reach these regions: never free them.
            for msg in messages {
                std::mem::forget(msg.region);
            }
        }
        // Its queued descriptors stay in the scheduler until handed out
        // and are dropped then (their messages are gone).
        self.pump();
    }
}
