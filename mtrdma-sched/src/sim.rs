//! A discrete-event model of one NIC port, to see what a scheduler does to
//! throughput, tail latency and fairness without a device.
//!
//! The model:
//! * One port of `link_bps`; a work request occupies the wire for its bytes
//!   at that rate, one at a time.
//! * In front of the wire, a FIFO NIC queue of bounded depth. Whatever is in
//!   it is sent in order, so a small work request behind large ones waits
//!   for all of them: head-of-line blocking.
//! * A work request's completion reaches the application `base_latency_ns`
//!   after its last byte leaves (NIC processing, fabric, remote NIC, ack).
//! * Tenants run closed-loop workloads ([`Workload`]): latency probes,
//!   message-rate batches and bulk transfers.
//! * Without mtrdma ([`Mode::Fifo`]) every post goes to the NIC queue in
//!   post order (posts that do not fit wait, in order, for room). With
//!   mtrdma ([`Mode::Scheduled`]) posts go to a
//!   [`TenantScheduler`], which keeps only
//!   `scheduled_nic_depth` pieces in the NIC queue and chooses what goes
//!   next each time one leaves. [`run_with`] takes any [`Scheduler`].
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
use crate::policy::{SchedulerConfig, TenantPolicy};
use crate::tenant_scheduler::TenantScheduler;
use crate::time::Nanos;
use crate::window::{splitmix64, Admit, DelayWindow, DelayWindowConfig, Window};
use crate::Scheduler;

/// Settings of the simulated port and of the run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimConfig {
    /// Line rate in bits per second. Default 100 Gb/s.
    pub link_bps: u64,
    /// Work requests the NIC queue holds, counting the one on the wire.
    /// Default 16.
    pub nic_queue_depth: usize,
    /// With a scheduler: pieces it keeps in the NIC queue. Default 1: the
    /// next piece is chosen the moment the wire frees (the model has no
    /// doorbell delay, so the wire never idles while work is queued).
    pub scheduled_nic_depth: usize,
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
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            link_bps: 100_000_000_000,
            nic_queue_depth: 16,
            scheduled_nic_depth: 1,
            base_latency_ns: 1_700,
            completion_jitter_ns: 0,
            duration: Nanos::from_millis(20),
            warmup: Nanos::from_millis(1),
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
        }
    }

    /// Batches of 64 x 16 B messages, in the bulk class.
    pub fn message_rate(id: TenantId) -> TenantSpec {
        TenantSpec {
            id,
            class: TrafficClass::Bulk,
            policy: TenantPolicy::weight(1),
            workload: Workload::MessageRate {
                batch: 64,
                bytes: 16,
            },
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
        Mode::Fifo => run_with(
            config,
            tenants,
            FifoScheduler::new(),
            config.nic_queue_depth,
        ),
        Mode::Scheduled(sched_config) => {
            let mut sched = TenantScheduler::new(sched_config.clone())?;
            for t in tenants {
                sched.set_policy(t.id, t.policy)?;
            }
            run_with(config, tenants, sched, config.scheduled_nic_depth)
        }
        Mode::Windowed(sched_config, window) => {
            let mut sources = Vec::with_capacity(tenants.len());
            for t in tenants {
                let mut sched = TenantScheduler::new(sched_config.clone())?;
                sched.set_policy(t.id, t.policy)?;
                let window = match t.class {
                    TrafficClass::Latency => None,
                    TrafficClass::Bulk => Some(DelayWindow::new(DelayWindowConfig {
                        seed: u64::from(t.id.0),
                        weight: t.policy.weight,
                        ..window.clone()
                    })?),
                };
                sources.push(Source::new(sched, window));
            }
            let owner = (0..tenants.len()).collect();
            // The windows bound what is in the NIC, not a depth.
            simulate(config, tenants, sources, owner, usize::MAX)
        }
    }
}

/// Runs `tenants` through any scheduler `sched` (already configured for
/// them), which keeps at most `nic_depth` work requests in the NIC queue.
/// Handles are message numbers.
///
/// # Errors
/// [`SimError`] for an invalid setting or a refused post.
pub fn run_with<S: Scheduler<u64>>(
    config: &SimConfig,
    tenants: &[TenantSpec],
    sched: S,
    nic_depth: usize,
) -> Result<Report, SimError> {
    let owner = vec![0; tenants.len()];
    simulate(
        config,
        tenants,
        vec![Source::new(sched, None)],
        owner,
        nic_depth,
    )
}

/// Runs `tenants`, tenant `i` posting through `sources[owner[i]]`.
fn simulate<S: Scheduler<u64>>(
    config: &SimConfig,
    tenants: &[TenantSpec],
    sources: Vec<Source<S>>,
    owner: Vec<usize>,
    nic_depth: usize,
) -> Result<Report, SimError> {
    if config.link_bps == 0 {
        return Err(SimError::ZeroLink);
    }
    if nic_depth == 0 || config.nic_queue_depth == 0 || config.scheduled_nic_depth == 0 {
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
    let mut sim = Sim {
        config,
        specs: tenants,
        sources,
        owner,
        next_source: 0,
        nic_depth,
        nic: VecDeque::new(),
        wire_busy: false,
        wire_end: 0,
        events: BinaryHeap::new(),
        seq: 0,
        wake_at: None,
        msgs: Vec::new(),
        state: tenants.iter().map(|_| TenantState::default()).collect(),
        rng: 0,
    };
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
    /// A piece's completion reaches its sender (for its window).
    PieceDone { source: u32, len: u64, sent_at: u64 },
    /// A tenant posts (after a think time).
    Post { tenant: u32 },
    /// The scheduler asked to be called again.
    Wake,
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
    samples: Vec<u64>,
}

/// Where pieces come from: one scheduler for every tenant, or one per
/// tenant (a process of its own), with the window that bounds what it
/// keeps in the NIC.
struct Source<S> {
    sched: S,
    window: Option<DelayWindow>,
    /// Bytes of its pieces in the NIC and not yet completed.
    in_flight: u64,
    /// A piece granted by its scheduler that its window held back.
    held: Option<Grant<u64>>,
}

impl<S> Source<S> {
    fn new(sched: S, window: Option<DelayWindow>) -> Source<S> {
        Source {
            sched,
            window,
            in_flight: 0,
            held: None,
        }
    }
}

/// A piece in the NIC queue.
struct InNic {
    grant: Grant<u64>,
    source: u32,
    sent_at: u64,
}

struct Sim<'a, S> {
    config: &'a SimConfig,
    specs: &'a [TenantSpec],
    sources: Vec<Source<S>>,
    /// The source each tenant posts through.
    owner: Vec<usize>,
    /// Where the next fill of the NIC starts (round robin over sources).
    next_source: usize,
    nic_depth: usize,
    nic: VecDeque<InNic>,
    wire_busy: bool,
    /// Exact time the wire frees, in units of 1/link_bps ns, so that
    /// back-to-back pieces do not each round up to a whole ns.
    wire_end: u128,
    events: BinaryHeap<Reverse<(u64, u64, Event)>>,
    seq: u64,
    wake_at: Option<u64>,
    msgs: Vec<Msg>,
    state: Vec<TenantState>,
    /// State of the jitter's generator.
    rng: u64,
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
            for _ in 0..n {
                self.post(i as u32, 0)?;
            }
        }
        self.pump(0, false);
        Ok(())
    }

    /// Tenant `t` posts what its workload posts at once.
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
        for _ in 0..count {
            let msg = self.msgs.len() as u64;
            self.msgs.push(Msg {
                tenant: t,
                posted: now,
            });
            let d = Descriptor::new(spec.id, spec.class, op, bytes, msg);
            self.sources[self.owner[t as usize]]
                .sched
                .enqueue(d, Nanos(now))
                .map_err(|r| SimError::Refused(r.reason))?;
        }
        Ok(())
    }

    /// Fills the NIC queue from the sources and starts the wire.
    /// `wire_just_freed`: called on the event of the wire freeing, whose
    /// time is rounded up to a whole ns; the next piece starts at the exact
    /// free time.
    fn pump(&mut self, now: u64, wire_just_freed: bool) {
        // Round robin over the sources, one piece each per turn, until
        // none has a piece it may post or the NIC queue is full.
        let n = self.sources.len();
        let mut idle = 0;
        while idle < n && self.nic.len() < self.nic_depth {
            let i = self.next_source % n;
            self.next_source = (i + 1) % n;
            match self.next_piece(i, now) {
                Some(grant) => {
                    idle = 0;
                    let src = &mut self.sources[i];
                    src.in_flight += grant.len;
                    if let Some(w) = &mut src.window {
                        w.on_sent(grant.len, Nanos(now));
                    }
                    self.nic.push_back(InNic {
                        grant,
                        source: i as u32,
                        sent_at: now,
                    });
                }
                None => idle += 1,
            }
        }
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

    /// Source `i`'s next piece, if its scheduler grants one and its window
    /// lets it go now (else it is held, with a wake-up when pacing names a
    /// time).
    fn next_piece(&mut self, i: usize, now: u64) -> Option<Grant<u64>> {
        let src = &mut self.sources[i];
        let grant = match src.held.take() {
            Some(g) => g,
            None => match src.sched.dequeue(Nanos(now)) {
                Dequeue::Ready(g) => g,
                Dequeue::Wait(t) => {
                    self.wake(t.0);
                    return None;
                }
                Dequeue::Empty => return None,
            },
        };
        let admit = src.window.as_ref().map_or(Admit::Now, |w| {
            w.admit(src.in_flight, grant.len, Nanos(now))
        });
        match admit {
            Admit::Now => Some(grant),
            Admit::At(t) => {
                src.held = Some(grant);
                self.wake(t.0);
                None
            }
            Admit::AfterCompletion => {
                src.held = Some(grant);
                None
            }
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
                        source,
                        sent_at,
                    }) = self.nic.pop_front()
                    {
                        let msg = self.msgs[g.handle as usize];
                        if now > warm {
                            // Bytes of the piece that left inside the window.
                            let tx = self.tx_ns(g.len).max(1);
                            let inside = (now - warm).min(tx);
                            let bytes = u128::from(g.len) * u128::from(inside) / u128::from(tx);
                            self.state[msg.tenant as usize].bytes += bytes as u64;
                        }
                        let done = now + self.config.base_latency_ns + self.jitter();
                        let len = g.len;
                        self.at(
                            done,
                            Event::PieceDone {
                                source,
                                len,
                                sent_at,
                            },
                        );
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
                Event::PieceDone {
                    source,
                    len,
                    sent_at,
                } => {
                    let src = &mut self.sources[source as usize];
                    src.in_flight -= len;
                    if let Some(w) = &mut src.window {
                        w.on_completed(len, Nanos(sent_at), Nanos(now));
                    }
                    self.pump(now, false);
                }
                Event::Post { tenant } => {
                    self.post(tenant, now)?;
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
        Report {
            tenants,
            total_gbps: total,
            jain_index: jain_index(&normalised),
        }
    }
}
