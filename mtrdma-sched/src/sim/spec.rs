//! What a simulation is told (the port, the tenants and their
//! workloads, the mode) and what it reports.

use super::*;

/// Settings of the simulated port and of the run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimConfig {
    /// Line rate in bits per second. Default 100 Gb/s.
    pub link_bps: u64,
    /// Work requests the NIC queue holds, counting the one on the wire.
    /// Default 16.
    pub nic_queue_depth: usize,
    /// With mtrdma: the bulk-class bytes all the tenants of one engine
    /// may have in the NIC at once ([`Gate`]'s budget, as
    /// `mtrdma_verbs::SharedConfig::bulk_bytes_in_flight`). A piece is in
    /// the NIC until its completion is seen, so this must cover the
    /// link's bytes in flight (rate times `base_latency_ns`) to keep the
    /// link full; what it holds beyond that is the queue a latency request
    /// finds. Default 64 KiB (21 KB are in flight on a 100 Gb/s link with
    /// 1.7 us to the completion). Not used with [`Mode::Windowed`], where
    /// each tenant's window bounds its own bytes.
    pub bulk_bytes_in_flight: u64,
    /// With mtrdma: pieces each tenant's queue pair may have in the NIC
    /// (`mtrdma_verbs::ScheduleConfig::max_pieces_in_flight`). Default 4.
    pub pieces_per_queue_pair: u32,
    /// With [`run_with`]: WRITEs and READs longer than this are not sent
    /// on the fast path (the scheduler splits them). [`Mode::Scheduled`]
    /// and [`Mode::Windowed`] take it from their scheduler configuration.
    /// Default 8 KiB.
    pub chunk_bytes: u64,
    /// Delay from the last byte on the wire to the completion seen by the
    /// application. Default 1,700 ns.
    pub base_latency_ns: u64,
    /// Up to this much more, drawn anew for every piece (uniform, from a
    /// fixed seed, so runs repeat): the host noticing a completion late,
    /// as a sender woken by completion events does. Default 0.
    pub completion_jitter_ns: u64,
    /// Simulated time. Default 20 ms.
    pub duration: Nanos,
    /// Time at the start not measured. Default 1 ms.
    pub warmup: Nanos,
    /// With [`Mode::Windowed`]: how often a coordinator takes what every
    /// tenant moved and sets the gains of their windows' growth
    /// ([`ShareGains`], as `mtrdma_core`'s coordinator does at its
    /// recomputation), so that tenants in separate processes share the
    /// port by their weights. [`Nanos::ZERO`]: no coordinator, every window
    /// on its own. Default 20 ms.
    pub coordinator_every: Nanos,
    /// The coordinator's settings for those gains.
    pub share_gains: ShareGainsConfig,
    /// With a coordinator: whether it also tells the windows the link's
    /// rate (the simulated link's; `mtrdma_core`'s coordinator publishes
    /// the highest rate the tenants moved together), so that each keeps
    /// its [`DelayWindowConfig::queue_bytes`] queued instead of its
    /// target floor, as windows under a latency bound do. Default false.
    pub publish_link_rate: bool,
    /// With [`publish_link_rate`](Self::publish_link_rate): publish the
    /// rate as `mtrdma_core`'s coordinator measures it, not the link's:
    /// the highest of what the tenants moved together, smoothed over 200
    /// ms, falling by half every 5 s while less is moved; and judge the
    /// link's use (how far the windows share its growth) against the
    /// highest over minutes, as it does. It starts at 0 and is only a
    /// lower bound while the link is not full. Default false.
    pub measured_link_rate: bool,
    /// With mtrdma: the pieces a tenant's queue pair posts in one pump go
    /// as one list, and only a request's last piece, the list's last and
    /// every `k`-th ask for a completion (`k` half the list, rounded up,
    /// and at most `signal_every`), as the verbs engine posts them; the
    /// others complete with the next of their queue pair that does, and
    /// their windows take no delay sample from them
    /// ([`Gate::completed_unsampled`]). 1 (the default): every piece
    /// reports.
    pub signal_every: u32,
    /// With a coordinator and windows: it also runs the one-piece floor's
    /// control ([`FloorControl`]), the latency tenants' queue pairs keep
    /// their delays with and without it ([`Lane::with_delay_shift`]), and
    /// its steps are judged by the time one piece (the scheduler's chunk)
    /// takes on the wire ([`FloorControl::update`]). Default false.
    pub piece_floor: bool,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            link_bps: 100_000_000_000,
            nic_queue_depth: 16,
            bulk_bytes_in_flight: 32 << 10,
            pieces_per_queue_pair: 4,
            chunk_bytes: 8 << 10,
            base_latency_ns: 1_700,
            completion_jitter_ns: 0,
            duration: Nanos::from_millis(20),
            warmup: Nanos::from_millis(1),
            coordinator_every: Nanos::from_millis(20),
            share_gains: ShareGainsConfig::default(),
            publish_link_rate: false,
            measured_link_rate: false,
            signal_every: 1,
            piece_floor: false,
        }
    }
}

impl SimConfig {
    /// The scheduler settings used in the simulations: 8 KiB chunks (655 ns
    /// on a 100 Gb/s wire) and an 8 KiB quantum, the rest default.
    pub fn scheduler_config() -> SchedulerConfig {
        SchedulerConfig {
            chunk_bytes: 8 << 10,
            quantum_bytes: 8 << 10,
            ..SchedulerConfig::default()
        }
    }
}

/// What a tenant does, closed loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Workload {
    /// One message of `bytes` at a time; the next is posted `think_ns`
    /// after the previous completes.
    Probe {
        /// Message size.
        bytes: u64,
        /// Pause between a completion and the next post.
        think_ns: u64,
    },
    /// `batch` messages of `bytes` posted at once; the next batch when all
    /// have completed.
    MessageRate {
        /// Messages per batch.
        batch: u32,
        /// Message size.
        bytes: u64,
    },
    /// Always `outstanding` RDMA WRITEs of `bytes` in flight.
    Bulk {
        /// Message size.
        bytes: u64,
        /// Messages kept in flight.
        outstanding: u32,
    },
}

impl Workload {
    /// A short name for tables.
    pub fn name(&self) -> &'static str {
        match self {
            Workload::Probe { .. } => "probe",
            Workload::MessageRate { .. } => "msg-rate",
            Workload::Bulk { .. } => "bulk",
        }
    }
}

/// One simulated tenant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TenantSpec {
    /// Its id.
    pub id: TenantId,
    /// The class of all its work requests.
    pub class: TrafficClass,
    /// Its scheduling policy (used only with a scheduler).
    pub policy: TenantPolicy,
    /// What it sends.
    pub workload: Workload,
    /// With mtrdma: pieces its queue pair may have in the NIC, if not
    /// [`SimConfig::pieces_per_queue_pair`].
    pub pieces_in_flight: Option<u32>,
    /// When it posts its first work request. Default [`Nanos::ZERO`]: at
    /// the start of the run.
    pub start: Nanos,
}

impl TenantSpec {
    /// 16 B latency probes, back to back, in the latency class.
    pub fn probe(id: TenantId) -> TenantSpec {
        TenantSpec {
            id,
            class: TrafficClass::Latency,
            policy: TenantPolicy::weight(1),
            workload: Workload::Probe {
                bytes: 16,
                think_ns: 0,
            },
            pieces_in_flight: None,
            start: Nanos::ZERO,
        }
    }

    /// Batches of 64 x 16 B messages, in the bulk class, on a queue pair
    /// that may have a whole batch in the NIC.
    pub fn message_rate(id: TenantId) -> TenantSpec {
        TenantSpec {
            id,
            class: TrafficClass::Bulk,
            policy: TenantPolicy::weight(1),
            workload: Workload::MessageRate {
                batch: 64,
                bytes: 16,
            },
            pieces_in_flight: Some(64),
            start: Nanos::ZERO,
        }
    }

    /// 1 MiB WRITEs, 4 in flight, in the bulk class.
    pub fn bulk(id: TenantId) -> TenantSpec {
        TenantSpec {
            id,
            class: TrafficClass::Bulk,
            policy: TenantPolicy::weight(1),
            workload: Workload::Bulk {
                bytes: 1 << 20,
                outstanding: 4,
            },
            pieces_in_flight: None,
            start: Nanos::ZERO,
        }
    }

    /// The same tenant with another policy.
    pub fn with_policy(self, policy: TenantPolicy) -> TenantSpec {
        TenantSpec { policy, ..self }
    }

    /// The same tenant in another class.
    pub fn with_class(self, class: TrafficClass) -> TenantSpec {
        TenantSpec { class, ..self }
    }

    /// The same tenant, starting at `start`.
    pub fn starting_at(self, start: Nanos) -> TenantSpec {
        TenantSpec { start, ..self }
    }
}

/// With or without mtrdma.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mode {
    /// No scheduler: posts go to the NIC queue in post order.
    Fifo,
    /// A [`TenantScheduler`] with this configuration and each tenant's
    /// policy.
    Scheduled(SchedulerConfig),
    /// Every tenant in a process of its own, as tenants in separate
    /// containers are: its own [`TenantScheduler`] (this configuration)
    /// splits its work into pieces, and a bulk tenant keeps in the NIC
    /// only what its [`DelayWindow`] allows, learnt from its own pieces'
    /// completion times. Nothing is shared between the tenants but the
    /// NIC's FIFO; latency-class tenants have no window.
    Windowed(SchedulerConfig, DelayWindowConfig),
}

/// Why a simulation could not run.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum SimError {
    /// A scheduler or tenant setting was refused.
    #[error("invalid scheduler setting: {0}")]
    Config(#[from] ConfigError),
    /// The link rate is 0.
    #[error("the link rate must be at least 1 bit per second")]
    ZeroLink,
    /// A NIC queue depth is 0.
    #[error("NIC queue depths must be at least 1 work request")]
    ZeroDepth,
    /// The warm-up is not shorter than the run.
    #[error("the warm-up ({warmup}) must be shorter than the run ({duration})")]
    WarmupTooLong {
        /// The warm-up asked for.
        warmup: Nanos,
        /// The run's duration.
        duration: Nanos,
    },
    /// Two tenants have the same id.
    #[error("{0} appears twice")]
    DuplicateTenant(TenantId),
    /// A workload posts nothing (a batch of 0, or 0 outstanding).
    #[error("{0} has a workload that never posts anything")]
    IdleWorkload(TenantId),
    /// The scheduler refused a post.
    #[error("the scheduler refused a post: {0}")]
    Refused(RejectReason),
}

/// Results for one tenant.
#[derive(Debug, Clone, PartialEq)]
pub struct TenantReport {
    /// Its id.
    pub id: TenantId,
    /// Its class.
    pub class: TrafficClass,
    /// Its weight.
    pub weight: u32,
    /// Its workload.
    pub workload: Workload,
    /// Bytes that left the wire in the measured window.
    pub bytes: u64,
    /// Throughput in the measured window, in Gb/s.
    pub gbps: f64,
    /// Messages posted in the measured window that completed.
    pub messages: u64,
    /// Median post-to-completion latency.
    pub p50: Option<Nanos>,
    /// 99th percentile latency.
    pub p99: Option<Nanos>,
    /// 99.9th percentile latency.
    pub p999: Option<Nanos>,
}

/// Results of one run.
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    /// Per tenant, in the order given.
    pub tenants: Vec<TenantReport>,
    /// All tenants' throughput, in Gb/s.
    pub total_gbps: f64,
    /// Jain's index of the weight-normalised throughput of the tenants with
    /// a [`Workload::Bulk`] workload (the ones always backlogged); 1 if
    /// there are none.
    pub jain_index: f64,
    /// With [`SimConfig::piece_floor`]: the coordinator's floor at the
    /// end of the run.
    pub piece_floor: Option<FloorReport>,
}

/// The one-piece floor at the end of a run ([`Report::piece_floor`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FloorReport {
    /// Windowed tenants that had it.
    pub granted: usize,
    /// The most that had it at once, over the run.
    pub most: usize,
    /// Steps taken back ([`FloorControl::withdrawals`]).
    pub withdrawals: u64,
    /// The share of the measured time it was given to every windowed
    /// tenant, in parts per million.
    pub all_ppm: u32,
}

impl Report {
    /// The report of tenant `id`.
    pub fn tenant(&self, id: TenantId) -> Option<&TenantReport> {
        self.tenants.iter().find(|t| t.id == id)
    }
}
