//! A discrete-event model of one NIC port, to see what a scheduler does to
//! throughput, tail latency and fairness without a device.
//!
//! The model:
//! * One port of `link_bps`; a work request occupies the wire for its bytes
//!   at that rate, one at a time.
//! * In front of the wire, the NIC's FIFO queue. Whatever is in it is sent
//!   in order, so a small work request behind large ones waits for all of
//!   them: head-of-line blocking.
//! * A work request's completion reaches the application `base_latency_ns`
//!   after its last byte leaves (NIC processing, fabric, remote NIC, ack).
//! * Tenants run closed-loop workloads ([`Workload`]), each on one queue
//!   pair: latency probes, message-rate batches and bulk transfers.
//! * Without mtrdma ([`Mode::Fifo`]) every post goes to the NIC queue in
//!   post order (posts that do not fit its `nic_queue_depth` wait, in
//!   order, for room).
//! * With mtrdma, the shipped engine's rules decide what enters the NIC
//!   queue: the same functions of [`crate::gate`] that
//!   `mtrdma-verbs` runs for every scheduled queue pair (the fast path,
//!   the bulk budget, each queue pair's pieces in flight and delay
//!   window), around a [`TenantScheduler`] ([`Mode::Scheduled`]: one
//!   engine for every tenant, as a `SharedScheduler`; [`Mode::Windowed`]:
//!   one engine per tenant, as tenants in separate processes) or any
//!   [`Scheduler`] ([`run_with`]). A piece counts as in the NIC from its
//!   post until its completion reaches its sender, as in the verbs engine.
//!
//! ```
//! use mtrdma_sched::sim::{run, Mode, SimConfig, TenantSpec};
//! use mtrdma_sched::{Nanos, SchedulerConfig, TenantId};
//! let tenants = vec![TenantSpec::probe(TenantId(0)), TenantSpec::bulk(TenantId(1))];
//! let config = SimConfig { duration: Nanos::from_millis(2), ..SimConfig::default() };
//! let fifo = run(&config, &tenants, &Mode::Fifo).unwrap();
//! let sched = run(&config, &tenants, &Mode::Scheduled(SimConfig::scheduler_config())).unwrap();
//! let p99 = |r: &mtrdma_sched::sim::Report| r.tenant(TenantId(0)).unwrap().p99.unwrap();
//! assert!(p99(&sched) < p99(&fifo));
//! ```

pub use crate::stats::{jain_index, percentile};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashSet, VecDeque};

use crate::{TenantId, TrafficClass};
use thiserror::Error;

use crate::descriptor::{Dequeue, Descriptor, Grant, Opcode};
use crate::error::{ConfigError, RejectReason};
use crate::fifo::FifoScheduler;
use crate::gate::{Gate, GrantOrder, Lane, Post};
use crate::piece_floor::{FloorControl, Shift};
use crate::policy::{SchedulerConfig, TenantPolicy};
use crate::share::{LinkEstimate, ShareGains, ShareGainsConfig, TenantRate};
use crate::tenant_scheduler::TenantScheduler;
use crate::time::Nanos;
use crate::window::{splitmix64, Admit, DelayWindow, DelayWindowConfig, Signals, Window};
use crate::Scheduler;

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

/// Runs `tenants` on the port described by `config`, with or without the
/// default scheduler.
///
/// # Errors
/// [`SimError`] for an invalid setting.
pub fn run(config: &SimConfig, tenants: &[TenantSpec], mode: &Mode) -> Result<Report, SimError> {
    match mode {
        Mode::Fifo => {
            let engine = Engine::raw(FifoScheduler::new(), config.nic_queue_depth);
            simulate(config, tenants, vec![engine], no_windows(tenants.len()), 0)
        }
        Mode::Scheduled(sched_config) => {
            let mut sched = TenantScheduler::new(sched_config.clone())?;
            for t in tenants {
                sched.set_policy(t.id, t.policy)?;
            }
            let gate = Gate::new(sched_config.chunk_bytes, config.bulk_bytes_in_flight);
            let engine = Engine::gated(sched, gate, false);
            simulate(config, tenants, vec![engine], no_windows(tenants.len()), 0)
        }
        Mode::Windowed(sched_config, window) => {
            let mut engines = Vec::with_capacity(tenants.len());
            let mut windows = Vec::with_capacity(tenants.len());
            for t in tenants {
                let mut sched = TenantScheduler::new(sched_config.clone())?;
                sched.set_policy(t.id, t.policy)?;
                // An engine of its own: its window, not a budget, bounds
                // its bytes in the NIC (as a queue pair scheduled alone).
                engines.push(Engine::gated(
                    sched,
                    Gate::new(sched_config.chunk_bytes, u64::MAX),
                    true,
                ));
                windows.push(match t.class {
                    TrafficClass::Latency => None,
                    TrafficClass::Bulk => Some(Box::new(DelayWindow::new(DelayWindowConfig {
                        seed: u64::from(t.id.0),
                        weight: t.policy.weight,
                        ..window.clone()
                    })?) as Box<dyn Window>),
                });
            }
            simulate(config, tenants, engines, windows, sched_config.chunk_bytes)
        }
    }
}

/// No window for any of `n` tenants (one engine schedules them all).
fn no_windows(n: usize) -> Vec<Option<Box<dyn Window>>> {
    std::iter::repeat_with(|| None).take(n).collect()
}

/// Runs `tenants` through any scheduler `sched` (already configured for
/// them) behind the engine's rules ([`crate::gate`]): every tenant one
/// queue pair of [`SimConfig::pieces_per_queue_pair`] pieces, their bulk
/// bytes in the NIC bounded together by
/// [`SimConfig::bulk_bytes_in_flight`], pieces of at most
/// [`SimConfig::chunk_bytes`] where the scheduler does not split.
/// Handles are message numbers.
///
/// # Errors
/// [`SimError`] for an invalid setting or a refused post.
pub fn run_with<S: Scheduler<u64>>(
    config: &SimConfig,
    tenants: &[TenantSpec],
    sched: S,
) -> Result<Report, SimError> {
    let gate = Gate::new(config.chunk_bytes, config.bulk_bytes_in_flight);
    simulate(
        config,
        tenants,
        vec![Engine::gated(sched, gate, false)],
        std::iter::repeat_with(|| None)
            .take(tenants.len())
            .collect(),
        0,
    )
}

/// Runs `tenants`, tenant `i` posting through `engines[i]` if there is one
/// per tenant, else through `engines[0]`; tenant `i`'s queue pair has
/// window `windows[i]`; windows' pieces are of `piece` bytes (0: no
/// windows).
fn simulate<S: Scheduler<u64>>(
    config: &SimConfig,
    tenants: &[TenantSpec],
    engines: Vec<Engine<S>>,
    windows: Vec<Option<Box<dyn Window>>>,
    piece: u64,
) -> Result<Report, SimError> {
    if config.link_bps == 0 {
        return Err(SimError::ZeroLink);
    }
    if config.nic_queue_depth == 0
        || config.pieces_per_queue_pair == 0
        || tenants.iter().any(|t| t.pieces_in_flight == Some(0))
    {
        return Err(SimError::ZeroDepth);
    }
    if config.warmup >= config.duration {
        return Err(SimError::WarmupTooLong {
            warmup: config.warmup,
            duration: config.duration,
        });
    }
    let mut seen = HashSet::new();
    for t in tenants {
        if !seen.insert(t.id) {
            return Err(SimError::DuplicateTenant(t.id));
        }
        let idle = match t.workload {
            Workload::Probe { .. } => false,
            Workload::MessageRate { batch, .. } => batch == 0,
            Workload::Bulk { outstanding, .. } => outstanding == 0,
        };
        if idle {
            return Err(SimError::IdleWorkload(t.id));
        }
    }
    let owner = if engines.len() == tenants.len() {
        (0..tenants.len()).collect()
    } else {
        vec![0; tenants.len()]
    };
    let floor = config.piece_floor
        && config.coordinator_every > Nanos::ZERO
        && windows.iter().any(Option::is_some);
    let lanes = tenants
        .iter()
        .zip(windows)
        .map(|(t, w)| {
            let slots = t.pieces_in_flight.unwrap_or(config.pieces_per_queue_pair);
            let lane = Lane::new(t.class, slots, w);
            if floor && t.class == TrafficClass::Latency {
                lane.with_delay_shift()
            } else {
                lane
            }
        })
        .collect();
    let mut sim = Sim {
        config,
        specs: tenants,
        engines,
        owner,
        lanes,
        next_engine: 0,
        nic: VecDeque::new(),
        wire_busy: false,
        wire_end: 0,
        events: BinaryHeap::new(),
        seq: 0,
        next_tag: 0,
        wake_at: None,
        msgs: Vec::new(),
        state: tenants.iter().map(|_| TenantState::default()).collect(),
        rng: 0,
        gains: None,
        floor: floor.then(FloorControl::default),
        floor_piece: piece,
        floor_most: 0,
        floor_all_ns: 0,
        shifts: vec![Shift::default(); tenants.len()],
        moved: LinkEstimate::default(),
        lists: vec![Vec::new(); tenants.len()],
        listed: Vec::new(),
        quiet: vec![VecDeque::new(); tenants.len()],
    };
    if config.coordinator_every > Nanos::ZERO && sim.lanes.iter().any(|l| l.window().is_some()) {
        sim.gains = Some(ShareGains::new(config.share_gains));
        sim.at(config.coordinator_every.0, Event::Recompute);
    }
    sim.start()?;
    sim.run()?;
    Ok(sim.report())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    /// The piece at the head of the NIC queue has left the wire.
    WireDone,
    /// A message's completion reaches its application.
    Completion { msg: u64 },
    /// A piece's completion reaches its sender (for its lane).
    PieceDone { tenant: u32, tag: usize },
    /// A tenant posts (after a think time).
    Post { tenant: u32 },
    /// An engine asked to be called again.
    Wake,
    /// The coordinator recomputes the windows' gains.
    Recompute,
}

#[derive(Debug, Clone, Copy)]
struct Msg {
    tenant: u32,
    posted: u64,
}

#[derive(Debug, Default)]
struct TenantState {
    /// Messages of the current batch not yet complete (message-rate).
    batch_left: u32,
    bytes: u64,
    /// Bytes that left the wire since the coordinator last looked.
    moved: u64,
    samples: Vec<u64>,
}

/// One process's sending side: its scheduler, and either the engine's
/// rules ([`Gate`]) or none (posts go to the NIC queue in order, at most
/// `raw_depth` in it: no mtrdma).
struct Engine<S> {
    sched: S,
    gate: Option<Gate>,
    /// An engine of one queue pair ([`Gate::pending_bound`]).
    solo: bool,
    raw_depth: usize,
    /// Tenants (queue pairs) with pending pieces, in grant order.
    order: GrantOrder,
}

impl<S> Engine<S> {
    fn raw(sched: S, depth: usize) -> Engine<S> {
        Engine {
            sched,
            gate: None,
            solo: false,
            raw_depth: depth,
            order: GrantOrder::default(),
        }
    }

    fn gated(sched: S, gate: Gate, solo: bool) -> Engine<S> {
        Engine {
            sched,
            gate: Some(gate),
            solo,
            raw_depth: usize::MAX,
            order: GrantOrder::default(),
        }
    }
}

/// A piece in the NIC queue.
struct InNic {
    grant: Grant<u64>,
    /// Its tag in its tenant's lane (none without mtrdma).
    tag: Option<usize>,
    /// Whether it asks for its completion ([`SimConfig::signal_every`]).
    signaled: bool,
}

struct Sim<'a, S> {
    config: &'a SimConfig,
    specs: &'a [TenantSpec],
    engines: Vec<Engine<S>>,
    /// The engine each tenant posts through.
    owner: Vec<usize>,
    /// Each tenant's queue pair.
    lanes: Vec<Lane<u64>>,
    /// Where the next fill of the NIC starts (round robin over engines).
    next_engine: usize,
    nic: VecDeque<InNic>,
    wire_busy: bool,
    /// Exact time the wire frees, in units of 1/link_bps ns, so that
    /// back-to-back pieces do not each round up to a whole ns.
    wire_end: u128,
    events: BinaryHeap<Reverse<(u64, u64, Event)>>,
    seq: u64,
    next_tag: usize,
    wake_at: Option<u64>,
    msgs: Vec<Msg>,
    state: Vec<TenantState>,
    /// State of the jitter's generator.
    rng: u64,
    /// The coordinator's gains ([`SimConfig::coordinator_every`]), if the
    /// tenants have windows and a coordinator runs.
    gains: Option<ShareGains>,
    /// The coordinator's one-piece floor ([`SimConfig::piece_floor`]), the
    /// windows' piece size, and each latency tenant's last report.
    floor: Option<FloorControl>,
    floor_piece: u64,
    shifts: Vec<Shift>,
    /// The most windowed tenants that had the floor at once, and the
    /// measured time all had it (ns).
    floor_most: usize,
    floor_all_ns: u64,
    /// What the tenants moved together, as the coordinator measures it
    /// (see [`SimConfig::measured_link_rate`]).
    moved: LinkEstimate,
    /// Per tenant: the tags of the pieces posted in this pump (its list;
    /// kept only with [`SimConfig::signal_every`] above 1).
    lists: Vec<Vec<usize>>,
    /// The tenants whose lists are not empty.
    listed: Vec<usize>,
    /// Per tenant: tags of unsignaled pieces off the wire, waiting for the
    /// completion of a later piece to report them.
    quiet: Vec<VecDeque<usize>>,
}

impl<S: Scheduler<u64>> Sim<'_, S> {
    fn at(&mut self, time: u64, event: Event) {
        self.seq += 1;
        self.events.push(Reverse((time, self.seq, event)));
    }

    /// A draw of the completion jitter.
    fn jitter(&mut self) -> u64 {
        let span = self.config.completion_jitter_ns;
        if span == 0 {
            return 0;
        }
        // SplitMix64: the mixer of the state before its step.
        let draw = splitmix64(self.rng);
        self.rng = self.rng.wrapping_add(0x9e37_79b9_7f4a_7c15);
        draw % (span + 1)
    }

    fn tx_ns(&self, bytes: u64) -> u64 {
        let ns = (u128::from(bytes) * 8_000_000_000).div_ceil(u128::from(self.config.link_bps));
        u64::try_from(ns).unwrap_or(u64::MAX)
    }

    fn start(&mut self) -> Result<(), SimError> {
        for i in 0..self.specs.len() {
            let n = match self.specs[i].workload {
                Workload::Probe { .. } | Workload::MessageRate { .. } => 1,
                Workload::Bulk { outstanding, .. } => outstanding,
            };
            let start = self.specs[i].start.0;
            for _ in 0..n {
                if start == 0 {
                    self.post(i as u32, 0)?;
                } else {
                    self.at(start, Event::Post { tenant: i as u32 });
                }
            }
        }
        self.pump(0, false);
        Ok(())
    }

    /// Tenant `t` posts what its workload posts at once: each message goes
    /// straight to the NIC if the engine's fast path lets it
    /// ([`Gate::unhindered`], and the scheduler's caps), else to the
    /// scheduler.
    fn post(&mut self, t: u32, now: u64) -> Result<(), SimError> {
        let spec = self.specs[t as usize];
        let (op, bytes, count) = match spec.workload {
            Workload::Probe { bytes, .. } => (Opcode::Send, bytes, 1),
            Workload::MessageRate { batch, bytes } => {
                self.state[t as usize].batch_left = batch;
                (Opcode::Send, bytes, batch)
            }
            Workload::Bulk { bytes, .. } => (Opcode::Write, bytes, 1),
        };
        let e = self.owner[t as usize];
        for _ in 0..count {
            let msg = self.msgs.len() as u64;
            self.msgs.push(Msg {
                tenant: t,
                posted: now,
            });
            let engine = &mut self.engines[e];
            let lane = &self.lanes[t as usize];
            let fast = engine.gate.as_ref().is_some_and(|g| {
                g.unhindered(lane, op, bytes, engine.sched.is_empty(), || Nanos(now))
            }) && engine.sched.admit_now(spec.id, bytes, Nanos(now)).is_ok();
            if fast {
                let grant = Grant {
                    tenant: spec.id,
                    class: spec.class,
                    op,
                    handle: msg,
                    offset: 0,
                    len: bytes,
                    is_last: true,
                };
                self.send(t as usize, grant, now);
                continue;
            }
            let d = Descriptor::new(spec.id, spec.class, op, bytes, msg);
            let engine = &mut self.engines[e];
            engine
                .sched
                .enqueue(d, Nanos(now))
                .map_err(|r| SimError::Refused(r.reason))?;
            if let Some(g) = &mut engine.gate {
                g.enqueued(spec.class);
            }
        }
        Ok(())
    }

    /// Puts `grant`, of tenant `t`, in the NIC queue, counted in its lane.
    fn send(&mut self, t: usize, grant: Grant<u64>, now: u64) {
        let tag = self.next_tag;
        self.next_tag += 1;
        let gate = self.engines[self.owner[t]]
            .gate
            .as_mut()
            .expect("only gated engines have lanes");
        gate.sent(&mut self.lanes[t], tag, grant.len, || Nanos(now));
        // Provisionally: the list's pieces are settled when it closes.
        let signaled = grant.is_last || self.config.signal_every <= 1;
        if self.config.signal_every > 1 {
            if self.lists[t].is_empty() {
                self.listed.push(t);
            }
            self.lists[t].push(tag);
        }
        self.nic.push_back(InNic {
            grant,
            tag: Some(tag),
            signaled,
        });
    }

    /// The end of a pump: each tenant's pieces of it go as one list, in
    /// which the last piece and every `k`-th ask for a completion, `k`
    /// half the list (rounded up) and at most
    /// [`SimConfig::signal_every`], as the verbs engine posts them: a
    /// window of a few pieces frees half of them while the rest are on
    /// the wire.
    fn close_lists(&mut self) {
        for t in std::mem::take(&mut self.listed) {
            let n = self.lists[t].len();
            let every = n
                .div_ceil(2)
                .clamp(1, self.config.signal_every.max(1) as usize);
            for (i, tag) in self.lists[t].drain(..).enumerate() {
                if (i + 1) % every != 0 && i + 1 != n {
                    continue;
                }
                if let Some(p) = self.nic.iter_mut().rev().find(|p| p.tag == Some(tag)) {
                    p.signaled = true;
                }
            }
        }
    }

    /// Fills the NIC queue from the engines and starts the wire.
    /// `wire_just_freed`: called on the event of the wire freeing, whose
    /// time is rounded up to a whole ns; the next piece starts at the exact
    /// free time.
    fn pump(&mut self, now: u64, wire_just_freed: bool) {
        let n = self.engines.len();
        if n == 1 {
            self.step(0, now, usize::MAX);
        } else {
            // Processes posting at once: round robin over their engines,
            // one step each per turn, until none moves.
            let mut idle = 0;
            while idle < n {
                let e = self.next_engine % n;
                self.next_engine = (e + 1) % n;
                if self.step(e, now, 1) > 0 {
                    idle = 0;
                } else {
                    idle += 1;
                }
            }
        }
        self.close_lists();
        if !self.wire_busy {
            if let Some(head) = self.nic.front() {
                self.wire_busy = true;
                let bps = u128::from(self.config.link_bps);
                let start = if wire_just_freed {
                    self.wire_end
                } else {
                    self.wire_end.max(u128::from(now) * bps)
                };
                self.wire_end = start + u128::from(head.grant.len) * 8_000_000_000;
                let end = u64::try_from(self.wire_end.div_ceil(bps)).unwrap_or(u64::MAX);
                self.at(end, Event::WireDone);
            }
        }
    }

    /// Engine `e` at `now`, as the verbs engine pumps: its lanes' pending
    /// pieces first, in grant order, then new grants from its scheduler
    /// while the gate lets it ask, each posted if it may go. Stops after
    /// `limit` moves (a piece posted or a grant taken); returns them.
    fn step(&mut self, e: usize, now: u64, limit: usize) -> usize {
        if self.engines[e].gate.is_none() {
            return self.step_raw(e, now, limit);
        }
        let mut moved = 0;
        let mut order = std::mem::take(&mut self.engines[e].order);
        order.drain(|t| {
            if moved >= limit {
                return Post::Held;
            }
            let post = self.post_head(e, t, now);
            if post == Post::Posted {
                moved += 1;
            }
            post
        });
        let bound = Gate::pending_bound(self.lanes.len(), self.engines[e].solo);
        while moved < limit && order.len() < bound {
            let engine = &mut self.engines[e];
            let gate = engine.gate.as_mut().expect("checked above");
            if !gate.may_grant() {
                break;
            }
            let grant = match engine.sched.dequeue(Nanos(now)) {
                Dequeue::Ready(grant) => grant,
                Dequeue::Wait(t) => {
                    self.wake(t.0);
                    break;
                }
                Dequeue::Empty => break,
            };
            gate.granted(&grant);
            let t = self.msgs[grant.handle as usize].tenant as usize;
            let class = grant.class;
            self.lanes[t].push_pending(grant);
            order.push(class, t);
            moved += 1;
            if moved < limit {
                order.drain_newest(class, t, |t| {
                    let post = self.post_head(e, t, now);
                    if post == Post::Posted {
                        moved += 1;
                    }
                    post
                });
            }
        }
        self.engines[e].order = order;
        moved
    }

    /// No mtrdma: whatever engine `e`'s scheduler hands out, while the
    /// NIC queue has room.
    fn step_raw(&mut self, e: usize, now: u64, limit: usize) -> usize {
        let mut moved = 0;
        while moved < limit && self.nic.len() < self.engines[e].raw_depth {
            match self.engines[e].sched.dequeue(Nanos(now)) {
                Dequeue::Ready(grant) => {
                    self.nic.push_back(InNic {
                        grant,
                        tag: None,
                        signaled: true,
                    });
                    moved += 1;
                }
                Dequeue::Wait(t) => {
                    self.wake(t.0);
                    break;
                }
                Dequeue::Empty => break,
            }
        }
        moved
    }

    /// Posts tenant `t`'s first pending piece if the gate of engine `e`
    /// lets it go at `now` (asking for a wake-up when its window's pacing
    /// names a time).
    fn post_head(&mut self, e: usize, t: usize, now: u64) -> Post {
        let lane = &self.lanes[t];
        let Some(len) = lane.pending().front().map(|g| g.len) else {
            return Post::Held;
        };
        let gate = self.engines[e].gate.as_ref().expect("gated");
        if gate.budget_holds(lane, len) {
            return Post::Budget;
        }
        match gate.admits(lane, len, || Nanos(now)) {
            Admit::Now => {
                let grant = self.lanes[t].pop_pending().expect("checked above");
                self.send(t, grant, now);
                Post::Posted
            }
            Admit::At(at) => {
                self.wake(at.0);
                Post::Held
            }
            Admit::AfterCompletion => Post::Held,
        }
    }

    /// Asks for a pump at `t`, unless one is due earlier.
    fn wake(&mut self, t: u64) {
        if self.wake_at.is_none_or(|w| t < w) {
            self.wake_at = Some(t);
            self.at(t, Event::Wake);
        }
    }

    fn run(&mut self) -> Result<(), SimError> {
        let end = self.config.duration.0;
        let warm = self.config.warmup.0;
        while let Some(Reverse((now, _, event))) = self.events.pop() {
            if now > end {
                break;
            }
            match event {
                Event::WireDone => {
                    self.wire_busy = false;
                    if let Some(InNic {
                        grant: g,
                        tag,
                        signaled,
                    }) = self.nic.pop_front()
                    {
                        let msg = self.msgs[g.handle as usize];
                        self.state[msg.tenant as usize].moved += g.len;
                        if now > warm {
                            // Bytes of the piece that left inside the window.
                            let tx = self.tx_ns(g.len).max(1);
                            let inside = (now - warm).min(tx);
                            let bytes = u128::from(g.len) * u128::from(inside) / u128::from(tx);
                            self.state[msg.tenant as usize].bytes += bytes as u64;
                        }
                        let done = now + self.config.base_latency_ns + self.jitter();
                        match tag {
                            Some(tag) if signaled => {
                                let tenant = msg.tenant;
                                self.at(done, Event::PieceDone { tenant, tag });
                            }
                            Some(tag) => self.quiet[msg.tenant as usize].push_back(tag),
                            None => {}
                        }
                        if g.is_last {
                            self.at(done, Event::Completion { msg: g.handle });
                        }
                    }
                    self.pump(now, true);
                }
                Event::Completion { msg } => {
                    let m = self.msgs[msg as usize];
                    let t = m.tenant as usize;
                    if m.posted >= warm {
                        self.state[t].samples.push(now - m.posted);
                    }
                    match self.specs[t].workload {
                        Workload::Probe { think_ns: 0, .. } | Workload::Bulk { .. } => {
                            self.post(m.tenant, now)?;
                        }
                        Workload::Probe { think_ns, .. } => {
                            self.at(now + think_ns, Event::Post { tenant: m.tenant });
                        }
                        Workload::MessageRate { .. } => {
                            self.state[t].batch_left -= 1;
                            if self.state[t].batch_left == 0 {
                                self.post(m.tenant, now)?;
                            }
                        }
                    }
                    self.pump(now, false);
                }
                Event::PieceDone { tenant, tag } => {
                    let t = tenant as usize;
                    let gate = self.engines[self.owner[t]]
                        .gate
                        .as_mut()
                        .expect("only gated engines tag pieces");
                    // The unsignaled pieces before it complete with it.
                    while let Some(&q) = self.quiet[t].front() {
                        if q > tag {
                            break;
                        }
                        self.quiet[t].pop_front();
                        gate.completed_unsampled(&mut self.lanes[t], q, || Nanos(now));
                    }
                    gate.completed(&mut self.lanes[t], tag, || Nanos(now), Nanos::ZERO);
                    if let Some(report) = self.lanes[t].take_shift_report() {
                        self.shifts[t] = report;
                    }
                    self.pump(now, false);
                }
                Event::Post { tenant } => {
                    self.post(tenant, now)?;
                    self.pump(now, false);
                }
                Event::Recompute => {
                    self.recompute(now);
                    self.at(now + self.config.coordinator_every.0, Event::Recompute);
                    self.pump(now, false);
                }
                Event::Wake => {
                    if self.wake_at == Some(now) {
                        self.wake_at = None;
                        self.pump(now, false);
                    }
                }
            }
        }
        Ok(())
    }

    /// The coordinator's recomputation: what each tenant moved since the
    /// last, into the gains of their windows.
    fn recompute(&mut self, now: u64) {
        // The time a piece takes on the wire, by which the floor's steps
        // are judged.
        let piece = Nanos(self.tx_ns(self.floor_piece));
        let Some(gains) = self.gains.as_mut() else {
            return;
        };
        let every = self.config.coordinator_every.0.max(1);
        let rates: Vec<TenantRate> = self
            .specs
            .iter()
            .zip(&mut self.state)
            .map(|(spec, st)| {
                let moved = std::mem::take(&mut st.moved);
                TenantRate {
                    id: spec.id,
                    weight: spec.policy.weight,
                    bytes_per_sec: (u128::from(moved) * 1_000_000_000 / u128::from(every)) as u64,
                    // A bulk tenant always has more to send, once started.
                    wants_more: matches!(spec.workload, Workload::Bulk { .. })
                        && spec.start.0 <= now,
                    cap: spec.policy.byte_cap.map(|c| c.per_second),
                }
            })
            .collect();
        gains.update(Nanos(now), &rates);
        // The link's use as the coordinator sees it: what the tenants moved,
        // smoothed over 200 ms, against the link's rate (which the
        // simulator knows; the coordinator takes the highest it has seen).
        let total: u64 = rates.iter().map(|r| r.bytes_per_sec).sum();
        let estimate = self.moved.update(total, every);
        let (used, rate) = if self.config.measured_link_rate {
            (self.moved.utilization_ppm(), estimate)
        } else {
            let link = self.config.link_bps as f64 / 8.0;
            let used = self.moved.smoothed() / link * 1e6;
            (used.clamp(0.0, 1e6) as u32, self.config.link_bps / 8)
        };
        let sharing = crate::share::sharing_for(gains.sharing_weight(), used);
        let link_rate = self.config.publish_link_rate.then_some(rate);
        // The floor: given to the windowed tenants that have started, in
        // the order of the specs.
        let senders = self
            .specs
            .iter()
            .zip(&self.lanes)
            .filter(|(spec, lane)| lane.window().is_some() && spec.start.0 <= now)
            .count();
        if let Some(floor) = self.floor.as_mut() {
            let report = FloorControl::merge(floor.permit(None), self.shifts.iter().copied());
            let n = floor.update(Nanos(now), report, piece, senders);
            self.floor_most = self.floor_most.max(n);
            if n == senders && now >= self.config.warmup.0 {
                self.floor_all_ns += self.config.coordinator_every.0;
            }
        }
        let mut sender = 0;
        for (spec, lane) in self.specs.iter().zip(&mut self.lanes) {
            let started = spec.start.0 <= now;
            let piece_floor = self.floor.as_ref().map(|f| {
                lane.set_permit(f.permit(None));
                started && f.permit(Some(sender)).on
            });
            if let Some(w) = lane.window_mut() {
                sender += usize::from(started);
                w.signals(&Signals {
                    gain_ppm: Some(gains.gain(spec.id)),
                    sharing_weight: Some(sharing),
                    link_rate,
                    piece_floor,
                    ..Signals::default()
                });
            }
        }
    }

    fn report(&mut self) -> Report {
        let window = (self.config.duration - self.config.warmup).as_secs_f64();
        let mut tenants = Vec::with_capacity(self.specs.len());
        let mut normalised = Vec::new();
        let mut total = 0.0;
        for (spec, st) in self.specs.iter().zip(&mut self.state) {
            st.samples.sort_unstable();
            let gbps = st.bytes as f64 * 8.0 / window / 1e9;
            total += gbps;
            if let Workload::Bulk { .. } = spec.workload {
                normalised.push(gbps / f64::from(spec.policy.weight));
            }
            let pct = |p| percentile(&st.samples, p).map(Nanos);
            tenants.push(TenantReport {
                id: spec.id,
                class: spec.class,
                weight: spec.policy.weight,
                workload: spec.workload,
                bytes: st.bytes,
                gbps,
                messages: st.samples.len() as u64,
                p50: pct(0.5),
                p99: pct(0.99),
                p999: pct(0.999),
            });
        }
        let piece_floor = self.floor.as_ref().map(|f| FloorReport {
            granted: f.granted(),
            most: self.floor_most,
            withdrawals: f.withdrawals(),
            all_ppm: (self.floor_all_ns as f64
                / (self.config.duration - self.config.warmup).0 as f64
                * 1e6) as u32,
        });
        Report {
            tenants,
            total_gbps: total,
            jain_index: jain_index(&normalised),
            piece_floor,
        }
    }
}
