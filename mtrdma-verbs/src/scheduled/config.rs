//! How a scheduled queue pair is configured ([`ScheduleConfig`], with
//! whom it is scheduled as, [`Tenancy`]) and how a shared scheduler is
//! ([`SharedConfig`]).

use super::*;

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
///
/// # Protection by policy
///
/// When the policy in the quota table sets a latency bound (`[link]
/// latency_bound` in the policy file), the queue pairs of every bulk
/// tenant it does not exempt by name are held to it, whatever this
/// configuration says: their WRITE and READ reach the NIC in pieces of at
/// most the bound's piece size (a quarter of the bound), under a delay
/// window whose queue allowance is the bound's and whose weight is the
/// tenant's ([`Protection`] has the arithmetic). The settings are
/// **clamped, not refused**: a configuration that asks for larger pieces,
/// no window, a longer queue or a weight of its own still works, held to
/// the bound, so that code written without knowing the policy (this
/// type's defaults included) protects its neighbours without a change.
/// Smaller pieces and a smaller queue allowance of its own are kept. The
/// bytes in flight it allows (`max_pieces_in_flight` x `chunk_bytes`)
/// stay the same in the smaller pieces (the defaults' 4 x 64 KiB become
/// 64 pieces of 4 KiB), and the window decides how many are out. A queue
/// pair created for such a tenant stays bulk when scheduled as a
/// [`Tenancy::Local`] tenant. [`ScheduledQueuePair::window`] shows what
/// it runs with. The bound is read when the queue pair is scheduled.
///
/// Without a bound (or for a latency-class or exempt tenant, or a queue
/// pair created for no tenant) the configuration is taken as it is.
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
    /// A bulk queue pair's bytes in the NIC follow a window made by this
    /// factory (default none: only `max_pieces_in_flight` bounds them; set
    /// it with [`with_window`](Self::with_window)). A [`DelayWindowConfig`]
    /// makes a [`DelayWindow`], which protects a latency-sensitive tenant
    /// in another process: every bulk queue pair that shares the port
    /// backs off when its own pieces' completion times show a queue, so
    /// together they keep the port's queue near the window's target
    /// without sharing any state. Use pieces no longer than the queue a
    /// latency request may find (`chunk_bytes` of one or a few MTUs), and
    /// [`DelayWindowConfig::for_piece`] of that size. A window that names
    /// no weight of its own ([`WindowFactory::weight`]; a
    /// `DelayWindowConfig` left at weight 1) takes the tenant's (from its
    /// policy in the quota table, or the scheduler's), so bulk tenants in
    /// different processes share the port by their weights. Any other
    /// [`WindowFactory`] plugs in a rule of its own ([`Window`]). Latency-
    /// class queue pairs have no window. Under a policy's latency bound
    /// the bound's [`DelayWindow`] replaces whatever this names (see
    /// "Protection by policy" above).
    pub window: Option<Arc<dyn WindowFactory>>,
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
    /// The same configuration, its bulk queue pairs' bytes in the NIC
    /// following windows `factory` makes ([`window`](Self::window)).
    ///
    /// ```
    /// use mtrdma_sched::DelayWindowConfig;
    /// use mtrdma_verbs::ScheduleConfig;
    /// let config = ScheduleConfig {
    ///     chunk_bytes: 4096,
    ///     ..ScheduleConfig::default()
    /// }
    /// .with_window(DelayWindowConfig::for_piece(4096));
    /// assert!(config.window.is_some());
    /// ```
    pub fn with_window(self, factory: impl WindowFactory + 'static) -> ScheduleConfig {
        ScheduleConfig {
            window: Some(Arc::new(factory)),
            ..self
        }
    }

    /// The defaults, scheduled as tenant `id` of `class` by this process's
    /// scheduler alone ([`Tenancy::Local`]).
    pub fn local(id: TenantId, class: TrafficClass) -> ScheduleConfig {
        ScheduleConfig {
            tenant: Tenancy::Local { id, class },
            ..ScheduleConfig::default()
        }
    }
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
    /// A queue pair whose oldest bulk piece has been in the NIC this long
    /// is stuck, not queued (a peer that posts no receives, or one that is
    /// gone): its bytes stop counting against
    /// [`bulk_bytes_in_flight`](Self::bulk_bytes_in_flight), so that the
    /// other queue pairs' bulk traffic goes on, and it posts nothing more
    /// until its pieces complete or fail (default 100 ms,
    /// [`mtrdma_sched::gate::DEFAULT_STALL_AFTER`]).
    pub stall_after: Duration,
}

impl Default for SharedConfig {
    fn default() -> Self {
        SharedConfig {
            chunk_bytes: 64 << 10,
            bulk_bytes_in_flight: 256 << 10,
            bulk_min_share_ppm: 100_000,
            stall_after: Duration::from_nanos(mtrdma_sched::gate::DEFAULT_STALL_AFTER.0),
        }
    }
}
