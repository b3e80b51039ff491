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

mod spec;
mod world;

pub use spec::*;
use world::*;

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
