//! The isolation demo: tenants sharing one RDMA port, each scenario run
//! three ways (alone, unprotected, protected by mtrdma), with tables, CSV
//! files and pictures.
//!
//! ```text
//! # tenants as processes on the VM's shared link (cargo xtask vm --link RATE)
//! cargo run --release --example isolation -- --link [--out target/demo/link]
//!     [--seconds 9] [--bulk 1,4,8] [--msg 1048576] [--cap-share 0.25]
//!     [--scenarios latency,hogs,weights,cap,storm]
//!
//! # one process, one SharedScheduler, in loopback or across two devices
//! cargo run --release --example isolation -- [--device rxe0] [--peer-device NAME]
//!     [--out target/demo] [--seconds 3] [--warmup-ms 500] [--bulk 1,4,8]
//!     [--scenarios latency,weights,cap,storm] [--msg 1048576] [--depth 4]
//!     [--chunk 65536] [--budget 131072] [--cap-mbps 4]
//! ```
//!
//! `cargo xtask demo` runs both in the SoftRoCE VM. With `--link` (see
//! `link.rs`) every tenant is a process of its own in a cgroup of its own,
//! registered with `examples/coordinator`, sending from the link's sender
//! device to servers on its receiver: the latency tenant next to 1, 4 and 8
//! bulk tenants, next to unmodified `ib_write_bw` hogs, weights 1:2:4, a
//! capped tenant next to a free one, and a control-path storm.
//!
//! Without `--link`, every tenant has its own queue pair in this one
//! process (sender on `--device`, receiver on `--peer-device`, or both on
//! one device in loopback): the latency tenant on its own thread, the bulk
//! tenants driven by another, a storming tenant on a third.
//! "Unprotected" posts straight on the queue pairs; "mtrdma" attaches them
//! all to one `SharedScheduler` (latency class first, weighted DRR between
//! bulk tenants, bulk bytes in the NIC bounded by `--budget`) with each
//! tenant's policy from one quota table (weights, the cap, control-path
//! rate limits). Loopback on one rxe device never queues (rxe hands a
//! loopback packet straight to the receiver), so there only mtrdma's cost
//! shows; across the link the bulk tenants' bytes queue ahead of the
//! latency tenant's.
//!
//! Scenarios of the single-process run:
//! 1. `latency`: a latency tenant (16 B WRITEs, one outstanding) against 1,
//!    4 and 8 bulk tenants (1 MiB WRITEs, `--depth` outstanding each).
//! 2. `weights`: three bulk tenants with weights 1:2:4.
//! 3. `cap`: a tenant capped at `--cap-mbps` next to one running free.
//! 4. `storm`: a tenant creating and destroying queue pairs and registering
//!    memory regions as fast as it can next to the latency tenant; with
//!    mtrdma its control-path rate limit (50 QP creations/s, 50 MR
//!    registrations/s) refuses the excess, and the storming tenant waits
//!    the retry time each refusal names.
//!
//! Output in `--out`: `results.txt` (the tables), `results.csv` (every
//! figure), `latency_samples.csv` (every latency sample), `timeline.csv`
//! (per-tenant throughput in 250 ms bins), and SVG + PNG pictures; the link
//! run adds `link-policy.toml` and `logs/` (every process's output).

#[path = "../shared/args.rs"]
mod args;
mod link;
mod plot;

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use mtrdma::core::{
    AdmissionError, LinkConfig, Policy, QuotaTable, RateLimit, TenantEntry, TenantHandle, TenantId,
    TrafficClass,
};
use mtrdma::sched::stats::{jain_index, percentile};
use mtrdma::verbs::{
    Access, Completion, Context, Error, MemoryRegion, ProtectionDomain, QueuePair, RemoteRegion,
    ScheduleConfig, ScheduledQueuePair, SendOp, SharedConfig, SharedScheduler,
};
use plot::{BarGroup, LatencySeries, RateSeries};

const PROBE_BYTES: usize = 16;
const BIN: Duration = Duration::from_millis(250);
const STORM_RATE: u64 = 50;

// Tenant ids in the demo's policy.
const PROBE: TenantId = TenantId(1);
const BULK0: u32 = 10;
const WEIGHTED: [(u32, u32); 3] = [(21, 1), (22, 2), (24, 4)];
const CAPPED: TenantId = TenantId(30);
const FREE: TenantId = TenantId(31);
const STORM: TenantId = TenantId(40);

struct Args {
    device: Option<String>,
    /// The receiving queue pairs' device (default: `device`, loopback).
    peer_device: Option<String>,
    /// The demo on the VM's shared link, tenants as processes.
    link: bool,
    /// Run as the control-path storm tenant (a process of the link demo).
    storm_tenant: bool,
    coordinator: Option<PathBuf>,
    /// The capped tenant's cap on the link, as a share of its rate.
    cap_share: f64,
    out: PathBuf,
    seconds: f64,
    warmup: Duration,
    bulk: Vec<usize>,
    scenarios: Vec<String>,
    msg: usize,
    depth: usize,
    chunk: u64,
    budget: u64,
    cap_mbps: f64,
    /// On the link: the windows' queue allowance as a share of the path's
    /// delay (perf's `--window-target`), if not the window's default.
    window_target: Option<u32>,
    /// On the link: the windows' least queue allowance in microseconds
    /// (perf's `--window-floor`), if not the window's default.
    window_floor_us: Option<u64>,
    /// On the link: the windows' queue allowance in bytes at the measured
    /// link rate (perf's `--window-queue`), if not the window's default.
    window_queue: Option<u64>,
}

const USAGE: &str = "usage: isolation [--device NAME] [--peer-device NAME] [--out DIR] [--seconds S] [--warmup-ms MS]
    [--bulk 1,4,8] [--scenarios latency,weights,cap,storm] [--msg BYTES] [--depth N]
    [--chunk BYTES] [--budget BYTES] [--cap-mbps MB/s]
on the VM's shared link (cargo xtask vm --link RATE), tenants as processes:
       isolation --link [--out DIR] [--seconds S (default 9)] [--bulk 1,4,8] [--msg BYTES] [--chunk BYTES (default 4096)]
    [--window-target PPM (the windows' queue allowance, see perf --help)] [--window-floor USEC] [--window-queue BYTES]
    [--scenarios latency,hogs,weights,cap,storm] [--cap-share 0.25]
the link demo's storm tenant:
       isolation --storm-tenant --device NAME --seconds S [--coordinator SOCKET]";

const SCENARIOS: [&str; 4] = ["latency", "weights", "cap", "storm"];
const LINK_SCENARIOS: [&str; 5] = ["latency", "hogs", "weights", "cap", "storm"];

fn parse() -> Result<Args, String> {
    let mut args = Args {
        device: None,
        peer_device: None,
        link: false,
        storm_tenant: false,
        coordinator: None,
        cap_share: 0.25,
        out: PathBuf::from("target/demo"),
        seconds: 3.0,
        warmup: Duration::from_millis(500),
        bulk: vec![1, 4, 8],
        scenarios: Vec::new(),
        msg: 1 << 20,
        depth: 4,
        chunk: 64 << 10,
        budget: 128 << 10,
        cap_mbps: 4.0,
        window_target: None,
        window_floor_us: None,
        window_queue: None,
    };
    fn num<T: std::str::FromStr>(flag: &str, v: String) -> Result<T, String>
    where
        T::Err: std::fmt::Display,
    {
        v.parse().map_err(|e| format!("{flag} {v}: {e}"))
    }
    let mut it = args::Args::from_env();
    let mut seconds = None;
    let mut chunk = None;
    while let Some(token) = it.next()? {
        let flag = match token {
            args::Token::Flag(flag) => flag,
            args::Token::Value(v) => return Err(format!("unexpected argument {v}\n{USAGE}")),
        };
        match flag.as_str() {
            "--help" | "-h" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            "--link" => {
                args.link = true;
                continue;
            }
            "--storm-tenant" => {
                args.storm_tenant = true;
                continue;
            }
            _ => {}
        }
        let v = it.value(&flag)?;
        match flag.as_str() {
            "--device" => args.device = Some(v),
            "--peer-device" => args.peer_device = Some(v),
            "--out" => args.out = PathBuf::from(v),
            "--seconds" => seconds = Some(num(&flag, v)?),
            "--coordinator" => args.coordinator = Some(PathBuf::from(v)),
            "--cap-share" => args.cap_share = num(&flag, v)?,
            "--warmup-ms" => args.warmup = Duration::from_millis(num(&flag, v)?),
            "--bulk" => {
                args.bulk = v
                    .split(',')
                    .map(|n| num(&flag, n.to_string()))
                    .collect::<Result<_, _>>()?
            }
            "--scenarios" => args.scenarios = v.split(',').map(String::from).collect(),
            "--msg" => args.msg = num(&flag, v)?,
            "--depth" => args.depth = num(&flag, v)?,
            "--chunk" => chunk = Some(num(&flag, v)?),
            "--budget" => args.budget = num(&flag, v)?,
            "--cap-mbps" => args.cap_mbps = num(&flag, v)?,
            "--window-target" => args.window_target = Some(num(&flag, v)?),
            "--window-floor" => args.window_floor_us = Some(num(&flag, v)?),
            "--window-queue" => args.window_queue = Some(num(&flag, v)?),
            other => return Err(format!("unknown flag {other}\n{USAGE}")),
        }
    }
    // The link demo's probe (one request every 500 us, woken late now and
    // then) needs about 8 s for the 10,000 samples a p99.9 is reported
    // over.
    args.seconds = seconds.unwrap_or(if args.link { 9.0 } else { 3.0 });
    // On the link, the windowed bulk tenants' pieces: one MTU's worth of
    // the link's default by default (see link.rs).
    args.chunk = chunk.unwrap_or(if args.link {
        link::WINDOW_CHUNK
    } else {
        64 << 10
    });
    let known: &[&str] = if args.link {
        &LINK_SCENARIOS
    } else {
        &SCENARIOS
    };
    if args.scenarios.is_empty() {
        args.scenarios = known.iter().map(|s| s.to_string()).collect();
    }
    if !(args.cap_share > 0.0 && args.cap_share < 1.0) {
        return Err("--cap-share must lie between 0 and 1".into());
    }
    if args.link && args.storm_tenant {
        return Err("--link and --storm-tenant are two different runs".into());
    }
    let positive = |x: f64| x.is_finite() && x > 0.0;
    if !positive(args.seconds) || args.msg == 0 || args.depth == 0 || !positive(args.cap_mbps) {
        return Err("--seconds, --msg, --depth and --cap-mbps must be positive".into());
    }
    if args.bulk.iter().any(|&n| n == 0 || n > 64) {
        return Err("--bulk counts must be between 1 and 64".into());
    }
    for s in &args.scenarios {
        if !known.contains(&s.as_str()) {
            return Err(format!("unknown scenario {s} ({})", known.join(", ")));
        }
    }
    Ok(args)
}

/// The demo's tenants, all in one policy and one quota table.
fn policy(args: &Args) -> Policy {
    let mut tenants = vec![TenantEntry::new(PROBE, "latency").with_class(TrafficClass::Latency)];
    let most = args.bulk.iter().copied().max().unwrap_or(1) as u32;
    for i in 0..most {
        tenants.push(TenantEntry::new(TenantId(BULK0 + i), format!("bulk{i}")));
    }
    for (id, w) in WEIGHTED {
        tenants.push(TenantEntry::new(TenantId(id), format!("weight{w}")).with_weight(w));
    }
    let cap = (args.cap_mbps * 1e6) as u64;
    // A burst of four chunks: the capped tenant may catch up a turn it
    // lost because the bulk budget was full when its time came.
    let burst = args.chunk.saturating_mul(4);
    tenants.push(TenantEntry::new(CAPPED, "capped").with_rate(RateLimit::new(cap, burst)));
    tenants.push(TenantEntry::new(FREE, "free"));
    tenants.push(
        TenantEntry::new(STORM, "storm")
            .with_qp_create_rate(RateLimit::new(STORM_RATE, 5))
            .with_mr_reg_rate(RateLimit::new(STORM_RATE, 5)),
    );
    Policy::new(LinkConfig::new(100_000_000_000), tenants)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Way {
    Alone,
    Unprotected,
    Mtrdma,
}

impl Way {
    fn name(self) -> &'static str {
        match self {
            Way::Alone => "alone",
            Way::Unprotected => "unprotected",
            Way::Mtrdma => "mtrdma",
        }
    }
}

/// Either way of posting, driven the same way.
trait Lane: Send {
    fn post(&mut self, op: SendOp, region: MemoryRegion, len: usize) -> Result<(), String>;
    fn reap(&mut self, out: &mut Vec<Completion>) -> Result<(), String>;
}

impl Lane for QueuePair {
    fn post(&mut self, op: SendOp, region: MemoryRegion, len: usize) -> Result<(), String> {
        self.post_send(op, region, 0..len, 0)
            .map_err(|e| e.to_string())
    }
    fn reap(&mut self, out: &mut Vec<Completion>) -> Result<(), String> {
        self.poll(out).map(|_| ()).map_err(|e| e.to_string())
    }
}

impl Lane for ScheduledQueuePair {
    fn post(&mut self, op: SendOp, region: MemoryRegion, len: usize) -> Result<(), String> {
        self.post_send(op, region, 0..len, 0)
            .map_err(|e| e.to_string())
    }
    fn reap(&mut self, out: &mut Vec<Completion>) -> Result<(), String> {
        self.poll(out).map(|_| ()).map_err(|e| e.to_string())
    }
}

/// Who runs in one measurement.
#[derive(Default)]
struct Cast {
    probe: bool,
    bulk: Vec<TenantId>,
    storm: bool,
}

/// What one measurement found.
#[derive(Default)]
struct Measured {
    probe_us: Vec<f64>,
    /// Per bulk tenant, MB/s over the measurement window.
    bulk_mbps: Vec<f64>,
    /// Per bulk tenant, (seconds, MB/s) in 250 ms bins from the start.
    timeline: Vec<Vec<(f64, f64)>>,
    /// Storm operations done and refused per second.
    storm_ok: f64,
    storm_refused: f64,
}

struct Demo<'a> {
    args: &'a Args,
    pd: ProtectionDomain,
    /// The receiving side's, on `--peer-device` (else `pd`).
    peer: Option<ProtectionDomain>,
    table: QuotaTable,
}

struct BulkLane {
    lane: Box<dyn Lane>,
    remote: RemoteRegion,
    pool: Vec<MemoryRegion>,
}

impl Demo<'_> {
    /// Where the targets of the tenants' WRITEs live.
    fn far(&self) -> &ProtectionDomain {
        self.peer.as_ref().unwrap_or(&self.pd)
    }

    /// A connected pair, the sending side created for `tenant` if given.
    fn connect(
        &self,
        depth: u32,
        tenant: Option<&TenantHandle>,
    ) -> Result<(QueuePair, QueuePair), Error> {
        // A local ACK timeout of 4.096 us x 2^20 (about 4 s): across a
        // shaped link the unprotected bulk tenants' megabytes queue for
        // longer than the default 67 ms, which would resend what is only
        // waiting.
        let mut a = self.pd.queue_pair().max_send_wr(depth).ack_timeout(20);
        if let Some(t) = tenant {
            a = a.tenant(t);
        }
        let a = a.build()?;
        let b = self
            .far()
            .queue_pair()
            .max_send_wr(depth)
            .ack_timeout(20)
            .build()?;
        let (ea, eb) = (a.endpoint(), b.endpoint());
        Ok((a.connect(&eb)?, b.connect(&ea)?))
    }

    /// A tenant's queue pair, posting straight or through `shared`.
    fn lane(
        &self,
        tenant: TenantId,
        shared: Option<&SharedScheduler>,
        peers: &mut Vec<QueuePair>,
    ) -> Result<Box<dyn Lane>, String> {
        let depth = u32::try_from(self.args.depth.max(8) * 4).unwrap_or(u32::MAX);
        // Scheduled, the queue pair is created for its tenant (admitted
        // against its quota, scheduled as it).
        let handle = match shared {
            Some(_) => Some(self.table.attach(tenant).map_err(|e| e.to_string())?),
            None => None,
        };
        let (qp, peer) = self
            .connect(depth, handle.as_ref())
            .map_err(|e| e.to_string())?;
        peers.push(peer);
        Ok(match shared {
            None => Box::new(qp),
            Some(shared) => Box::new(
                qp.scheduled_on(
                    shared,
                    ScheduleConfig {
                        max_pieces_in_flight: depth,
                        ..ScheduleConfig::default()
                    },
                )
                .map_err(|e| e.to_string())?,
            ),
        })
    }

    fn measure(&self, way: Way, cast: &Cast) -> Result<Measured, String> {
        let args = self.args;
        let shared = match way {
            Way::Mtrdma => Some(
                SharedScheduler::new(SharedConfig {
                    chunk_bytes: args.chunk,
                    bulk_bytes_in_flight: args.budget,
                    ..SharedConfig::default()
                })
                .map_err(|e| e.to_string())?,
            ),
            _ => None,
        };
        let mut peers = Vec::new();
        let err = |e: Error| e.to_string();
        let probe = if cast.probe {
            let lane = self.lane(PROBE, shared.as_ref(), &mut peers)?;
            let target = self
                .far()
                .allocate(PROBE_BYTES, Access::REMOTE_READ_WRITE)
                .map_err(err)?;
            let local = self.pd.allocate(PROBE_BYTES, Access::LOCAL).map_err(err)?;
            Some((lane, target, local))
        } else {
            None
        };
        let mut bulk = Vec::new();
        let mut targets = Vec::new();
        for &tenant in &cast.bulk {
            let lane = self.lane(tenant, shared.as_ref(), &mut peers)?;
            let target = self
                .far()
                .allocate(args.msg, Access::REMOTE_READ_WRITE)
                .map_err(err)?;
            // One registration per tenant, its `depth` buffers pieces of it.
            let pool = self
                .pd
                .allocate(args.msg * args.depth, Access::LOCAL)
                .and_then(|r| r.into_pieces(args.msg))
                .map_err(err)?;
            bulk.push(BulkLane {
                lane,
                remote: target.remote().expect("remote access granted"),
                pool,
            });
            targets.push(target);
        }
        let storm_handle = match (cast.storm, way) {
            (true, Way::Mtrdma) => Some(self.table.attach(STORM).map_err(|e| e.to_string())?),
            _ => None,
        };

        let stop = &AtomicBool::new(false);
        let start = Instant::now();
        let window = (
            args.warmup,
            args.warmup + Duration::from_secs_f64(args.seconds),
        );
        let msg = args.msg;
        let mut measured = Measured::default();
        std::thread::scope(|s| -> Result<(), String> {
            let bulk_thread = (!bulk.is_empty())
                .then(|| s.spawn(move || drive_bulk(bulk, msg, start, window, stop)));
            let storm = cast.storm.then(|| {
                let (pd, handle) = (&self.pd, storm_handle.as_ref());
                s.spawn(move || storm(pd, handle, start, window, stop))
            });
            let probe_thread = probe.map(|(lane, target, local)| {
                s.spawn(move || run_probe(lane, &target, local, start, window, stop))
            });
            while start.elapsed() < window.1 {
                std::thread::sleep(Duration::from_millis(20));
            }
            stop.store(true, Ordering::Release);
            if let Some(t) = probe_thread {
                measured.probe_us = t.join().map_err(|_| "the probe thread panicked")??;
            }
            if let Some(t) = bulk_thread {
                let records = t.join().map_err(|_| "the bulk thread panicked")??;

                measured.bulk_mbps = (0..cast.bulk.len())
                    .map(|i| rate_mbps(&records, i, window))
                    .collect();
                measured.timeline = timeline(&records, cast.bulk.len(), window.1);
            }
            if let Some(t) = storm {
                let (ok, refused) = t.join().map_err(|_| "the storm thread panicked")??;
                measured.storm_ok = ok as f64 / args.seconds;
                measured.storm_refused = refused as f64 / args.seconds;
            }
            Ok(())
        })?;
        drop(peers);
        Ok(measured)
    }
}

/// (tenant index, completion time since start, bytes)
type Record = (usize, Duration, u64);

fn drive_bulk(
    mut lanes: Vec<BulkLane>,
    msg: usize,
    start: Instant,
    window: (Duration, Duration),
    stop: &AtomicBool,
) -> Result<Vec<Record>, String> {
    let mut records = Vec::new();
    let mut out = Vec::new();
    while !stop.load(Ordering::Acquire) {
        for (i, b) in lanes.iter_mut().enumerate() {
            while let Some(region) = b.pool.pop() {
                b.lane.post(SendOp::Write(b.remote), region, msg)?;
            }
            b.lane.reap(&mut out)?;
            let now = start.elapsed();
            for c in out.drain(..) {
                if !c.status.is_success() {
                    return Err(format!("a bulk WRITE failed: {}", c.status));
                }
                if now < window.1 {
                    records.push((i, now, u64::from(c.byte_len)));
                }
                b.pool.push(c.region);
            }
        }
    }
    Ok(records)
}

fn run_probe(
    mut lane: Box<dyn Lane>,
    target: &MemoryRegion,
    local: MemoryRegion,
    start: Instant,
    window: (Duration, Duration),
    stop: &AtomicBool,
) -> Result<Vec<f64>, String> {
    let remote = target.remote().expect("remote access granted");
    let mut region = Some(local);
    let mut samples = Vec::new();
    let mut out = Vec::new();
    while !stop.load(Ordering::Acquire) {
        let t0 = Instant::now();
        let r = region.take().expect("the probe region is back");
        lane.post(SendOp::Write(remote), r, PROBE_BYTES)?;
        while region.is_none() {
            lane.reap(&mut out)?;
            if let Some(c) = out.pop() {
                if !c.status.is_success() {
                    return Err(format!("a probe WRITE failed: {}", c.status));
                }
                region = Some(c.region);
            }
        }
        let since = t0 - start;
        if since >= window.0 && since < window.1 {
            samples.push(t0.elapsed().as_secs_f64() * 1e6);
        }
    }
    Ok(samples)
}

/// Creates and destroys queue pairs and registers and drops 64 KiB
/// regions as fast as it may; returns the operations done and refused in
/// the window.
fn storm(
    pd: &ProtectionDomain,
    handle: Option<&TenantHandle>,
    start: Instant,
    window: (Duration, Duration),
    stop: &AtomicBool,
) -> Result<(u64, u64), String> {
    let (mut ok, mut refused) = (0u64, 0u64);
    let mut count = |result: Result<(), Error>| -> Result<(), String> {
        let inside = (window.0..window.1).contains(&start.elapsed());
        match result {
            Ok(()) => ok += u64::from(inside),
            Err(Error::Admission(AdmissionError::RateLimited { retry_after_ns, .. })) => {
                refused += u64::from(inside);
                std::thread::sleep(Duration::from_nanos(retry_after_ns));
            }
            Err(e) => return Err(format!("storm: {e}")),
        }
        Ok(())
    };
    while !stop.load(Ordering::Acquire) {
        let qp = match handle {
            Some(h) => pd.queue_pair().tenant(h).build(),
            None => pd.queue_pair().build(),
        };
        count(qp.map(drop))?;
        let buf = vec![0u8; 64 << 10];
        let mr = match handle {
            Some(h) => pd.register_for(h, buf, Access::LOCAL),
            None => pd.register(buf, Access::LOCAL),
        };
        count(mr.map(drop))?;
    }
    Ok((ok, refused))
}

/// A tenant's rate in the window: the bytes completed after its first
/// completion in the window over the time to its last one (whole 1 MiB
/// messages would otherwise make a short window's figure coarse).
fn rate_mbps(records: &[Record], tenant: usize, window: (Duration, Duration)) -> f64 {
    let mine: Vec<&Record> = records
        .iter()
        .filter(|r| r.0 == tenant && r.1 >= window.0 && r.1 < window.1)
        .collect();
    match (mine.first(), mine.last()) {
        (Some(first), Some(last)) if mine.len() >= 2 && last.1 > first.1 => {
            let bytes: u64 = mine[1..].iter().map(|r| r.2).sum();
            bytes as f64 / (last.1 - first.1).as_secs_f64() / 1e6
        }
        _ => {
            let bytes: u64 = mine.iter().map(|r| r.2).sum();
            bytes as f64 / (window.1 - window.0).as_secs_f64() / 1e6
        }
    }
}

fn timeline(records: &[Record], tenants: usize, end: Duration) -> Vec<Vec<(f64, f64)>> {
    let bins = (end.as_nanos() / BIN.as_nanos()).max(1) as usize;
    let mut bytes = vec![vec![0u64; bins]; tenants];
    for &(i, t, b) in records {
        let bin = (t.as_nanos() / BIN.as_nanos()) as usize;
        if bin < bins {
            bytes[i][bin] += b;
        }
    }
    bytes
        .into_iter()
        .map(|row| {
            row.into_iter()
                .enumerate()
                .map(|(k, b)| {
                    let t = (k as f64 + 0.5) * BIN.as_secs_f64();
                    (t, b as f64 / BIN.as_secs_f64() / 1e6)
                })
                .collect()
        })
        .collect()
}

/// p99.9 is reported only over at least this many samples: below, it is
/// one or a few samples' worth of noise.
pub(crate) const P999_MIN_SAMPLES: usize = 10_000;

struct Lat {
    p50: f64,
    p99: f64,
    /// `None` under [`P999_MIN_SAMPLES`] samples.
    p999: Option<f64>,
    n: usize,
}

impl Lat {
    /// p99.9 for a table cell: "-" where there are too few samples.
    fn p999_cell(&self) -> String {
        self.p999.map_or_else(|| "-".into(), |v| format!("{v:.1}"))
    }

    /// The percentiles as result figures (p99.9 only where reported).
    fn figures(&self) -> Vec<(&'static str, f64)> {
        let mut out = vec![("p50_us", self.p50), ("p99_us", self.p99)];
        if let Some(v) = self.p999 {
            out.push(("p999_us", v));
        }
        out
    }
}

fn lat(samples: &[f64]) -> Lat {
    let mut s = samples.to_vec();
    s.sort_by(f64::total_cmp);
    Lat {
        p50: percentile(&s, 0.50).unwrap_or(f64::NAN),
        p99: percentile(&s, 0.99).unwrap_or(f64::NAN),
        p999: (s.len() >= P999_MIN_SAMPLES)
            .then(|| percentile(&s, 0.999))
            .flatten(),
        n: s.len(),
    }
}

/// Everything written out: the tables, one CSV line per figure, the
/// samples and the timelines.
#[derive(Default)]
struct Report {
    text: String,
    csv: String,
    samples: String,
    timeline: String,
}

impl Report {
    fn say(&mut self, line: impl AsRef<str>) {
        println!("{}", line.as_ref());
        self.text.push_str(line.as_ref());
        self.text.push('\n');
    }

    fn figure(&mut self, scenario: &str, way: Way, case: &str, tenant: &str, metric: &str, v: f64) {
        let _ = writeln!(
            self.csv,
            "{scenario},{},{case},{tenant},{metric},{v:.4}",
            way.name()
        );
    }

    fn keep_samples(&mut self, scenario: &str, way: Way, case: &str, samples: &[f64]) {
        for (i, s) in samples.iter().enumerate() {
            let _ = writeln!(self.samples, "{scenario},{},{case},{i},{s:.3}", way.name());
        }
    }

    fn keep_timeline(&mut self, scenario: &str, way: Way, names: &[String], m: &Measured) {
        for (name, points) in names.iter().zip(&m.timeline) {
            for (t, v) in points {
                let _ = writeln!(
                    self.timeline,
                    "{scenario},{},{name},{t:.3},{v:.4}",
                    way.name()
                );
            }
        }
    }
}

const WAYS: [Way; 3] = [Way::Alone, Way::Unprotected, Way::Mtrdma];

fn scenario_latency(demo: &Demo<'_>, r: &mut Report) -> Result<(), String> {
    let args = demo.args;
    r.say(format!(
        "\n== 1. latency tenant ({PROBE_BYTES} B WRITE, 1 outstanding) against bulk tenants ({} B WRITEs, {} outstanding each) ==",
        args.msg, args.depth
    ));
    let alone = demo.measure(
        Way::Alone,
        &Cast {
            probe: true,
            ..Cast::default()
        },
    )?;
    let a = lat(&alone.probe_us);
    r.keep_samples("latency", Way::Alone, "0", &alone.probe_us);
    r.say(format!(
        "{:>4} {:<12} {:>9} {:>9} {:>10} {:>9} {:>12} {:>10}",
        "bulk", "way", "p50 us", "p99 us", "p99.9 us", "p99/alone", "bulk MB/s", "samples"
    ));
    let row = |r: &mut Report, n: usize, way: Way, l: &Lat, bulk: f64| {
        r.say(format!(
            "{n:>4} {:<12} {:>9.1} {:>9.1} {:>10} {:>9.2} {:>12.2} {:>10}",
            way.name(),
            l.p50,
            l.p99,
            l.p999_cell(),
            l.p99 / a.p99,
            bulk,
            l.n
        ));
    };
    row(r, 0, Way::Alone, &a, 0.0);
    for (m, v) in a.figures() {
        r.figure("latency", Way::Alone, "0", "latency", m, v);
    }
    let mut bars = Vec::new();
    let mut cdf = Vec::new();
    let mut summary = Vec::new();
    for &n in &args.bulk {
        let cast = Cast {
            probe: true,
            bulk: (0..n as u32).map(|i| TenantId(BULK0 + i)).collect(),
            storm: false,
        };
        let mut p99 = vec![a.p99];
        let mut totals = Vec::new();
        let mut lats = Vec::new();
        for way in [Way::Unprotected, Way::Mtrdma] {
            let m = demo.measure(way, &cast)?;
            let l = lat(&m.probe_us);
            let total: f64 = m.bulk_mbps.iter().sum();
            row(r, n, way, &l, total);
            let case = n.to_string();
            for (k, v) in l.figures() {
                r.figure("latency", way, &case, "latency", k, v);
            }
            for (i, v) in m.bulk_mbps.iter().enumerate() {
                r.figure("latency", way, &case, &format!("bulk{i}"), "mbps", *v);
            }
            r.keep_samples("latency", way, &case, &m.probe_us);
            p99.push(l.p99);
            totals.push(total);
            lats.push((way, m.probe_us));
        }
        summary.push(format!(
            "  {n} bulk: p99 mtrdma/alone {:.2} (target <= 1.5), unprotected/mtrdma {:.2} (target >= 5 at 8 bulk), bulk MB/s mtrdma/unprotected {:.2} (target >= 0.8)",
            p99[2] / p99[0],
            p99[1] / p99[2],
            totals[1] / totals[0]
        ));
        bars.push(BarGroup {
            label: format!("{n} bulk"),
            values: p99,
        });
        if Some(&n) == args.bulk.iter().max() {
            cdf = vec![LatencySeries {
                label: "alone".into(),
                samples_us: alone.probe_us.clone(),
            }];
            for (way, samples) in lats {
                cdf.push(LatencySeries {
                    label: format!("{} ({n} bulk)", way.name()),
                    samples_us: samples,
                });
            }
        }
    }
    for line in summary {
        r.say(line);
    }
    let out = &args.out;
    plot::grouped_bars(
        &out.join("latency_p99"),
        "Latency tenant p99 (16 B WRITE) against bulk tenants",
        "p99 latency (us)",
        &["alone", "unprotected", "mtrdma"],
        &bars,
    )?;
    plot::latency_cdf(
        &out.join("latency_cdf"),
        "Latency tenant: CDF of 16 B WRITE latency",
        &cdf,
    )
}

fn scenario_weights(demo: &Demo<'_>, r: &mut Report) -> Result<(), String> {
    r.say("\n== 2. three bulk tenants with weights 1:2:4 ==");
    let tenants: Vec<TenantId> = WEIGHTED.iter().map(|&(id, _)| TenantId(id)).collect();
    let weights: Vec<f64> = WEIGHTED.iter().map(|&(_, w)| f64::from(w)).collect();
    let names: Vec<String> = WEIGHTED
        .iter()
        .map(|&(_, w)| format!("weight{w}"))
        .collect();
    let mut per_way: Vec<Vec<f64>> = Vec::new();
    // Alone: each tenant by itself.
    let mut alone = Vec::new();
    for &t in &tenants {
        let m = demo.measure(
            Way::Alone,
            &Cast {
                bulk: vec![t],
                ..Cast::default()
            },
        )?;
        alone.push(m.bulk_mbps[0]);
    }
    per_way.push(alone);
    let mut series = Vec::new();
    for way in [Way::Unprotected, Way::Mtrdma] {
        let m = demo.measure(
            way,
            &Cast {
                bulk: tenants.clone(),
                ..Cast::default()
            },
        )?;
        r.keep_timeline("weights", way, &names, &m);
        if way == Way::Mtrdma {
            for (name, points) in names.iter().zip(&m.timeline) {
                series.push(RateSeries {
                    label: format!("{name} (mtrdma)"),
                    points: points.clone(),
                });
            }
        }
        per_way.push(m.bulk_mbps);
    }
    r.say(format!(
        "{:<12} {:>12} {:>12} {:>12} {:>10} {:>8}",
        "way", "weight1 MB/s", "weight2 MB/s", "weight4 MB/s", "total", "Jain"
    ));
    for (way, v) in WAYS.iter().zip(&per_way) {
        let normalised: Vec<f64> = v.iter().zip(&weights).map(|(x, w)| x / w).collect();
        let j = if *way == Way::Alone {
            f64::NAN
        } else {
            jain_index(&normalised)
        };
        let total: f64 = v.iter().sum();
        r.say(format!(
            "{:<12} {:>12.2} {:>12.2} {:>12.2} {:>10.2} {:>8.4}",
            way.name(),
            v[0],
            v[1],
            v[2],
            total,
            j
        ));
        for (name, x) in names.iter().zip(v) {
            r.figure("weights", *way, "1:2:4", name, "mbps", *x);
        }
        if *way != Way::Alone {
            r.figure("weights", *way, "1:2:4", "all", "jain", j);
            let shares: Vec<String> = v
                .iter()
                .zip(&weights)
                .map(|(x, w)| format!("{:.3} (want {:.3})", x / total, w / 7.0))
                .collect();
            r.say(format!("  {} shares: {}", way.name(), shares.join(", ")));
        }
    }
    let groups: Vec<BarGroup> = names
        .iter()
        .enumerate()
        .map(|(i, n)| BarGroup {
            label: n.clone(),
            values: per_way.iter().map(|v| v[i]).collect(),
        })
        .collect();
    let out = &demo.args.out;
    plot::grouped_bars(
        &out.join("weights_bars"),
        "Bulk tenants with weights 1:2:4",
        "MB/s",
        &["alone", "unprotected", "mtrdma"],
        &groups,
    )?;
    plot::rates_over_time(
        &out.join("weights_timeline"),
        "Bulk tenants with weights 1:2:4 under mtrdma",
        "MB/s",
        &series,
    )
}

fn scenario_cap(demo: &Demo<'_>, r: &mut Report) -> Result<(), String> {
    let cap = demo.args.cap_mbps;
    r.say(format!(
        "\n== 3. a tenant capped at {cap:.2} MB/s next to one running free =="
    ));
    let names = vec!["capped".to_string(), "free".to_string()];
    r.say(format!(
        "{:<12} {:>12} {:>12} {:>14}",
        "way", "capped MB/s", "free MB/s", "capped / cap"
    ));
    let mut groups = vec![
        BarGroup {
            label: "capped".into(),
            values: Vec::new(),
        },
        BarGroup {
            label: "free".into(),
            values: Vec::new(),
        },
    ];
    let mut series = Vec::new();
    for way in WAYS {
        // Alone: the capped tenant by itself, under mtrdma (its cap holds
        // with no one else around).
        let (run_way, bulk) = match way {
            Way::Alone => (Way::Mtrdma, vec![CAPPED]),
            w => (w, vec![CAPPED, FREE]),
        };
        let m = demo.measure(
            run_way,
            &Cast {
                bulk,
                ..Cast::default()
            },
        )?;
        let capped = m.bulk_mbps[0];
        let free = m.bulk_mbps.get(1).copied().unwrap_or(f64::NAN);
        r.say(format!(
            "{:<12} {:>12.3} {:>12.3} {:>14.3}",
            way.name(),
            capped,
            free,
            capped / cap
        ));
        r.figure("cap", way, &format!("{cap}"), "capped", "mbps", capped);
        r.figure("cap", way, &format!("{cap}"), "free", "mbps", free);
        groups[0].values.push(capped);
        groups[1]
            .values
            .push(if free.is_nan() { 0.0 } else { free });
        if way == Way::Mtrdma {
            r.keep_timeline("cap", way, &names, &m);
            for (name, points) in names.iter().zip(&m.timeline) {
                series.push(RateSeries {
                    label: format!("{name} (mtrdma)"),
                    points: points.clone(),
                });
            }
        }
    }
    let out = &demo.args.out;
    plot::grouped_bars(
        &out.join("cap_bars"),
        &format!("A tenant capped at {cap} MB/s next to one running free"),
        "MB/s",
        &["alone", "unprotected", "mtrdma"],
        &groups,
    )?;
    plot::rates_over_time(
        &out.join("cap_timeline"),
        &format!("Capped ({cap} MB/s) and free tenant under mtrdma"),
        "MB/s",
        &series,
    )
}

fn scenario_storm(demo: &Demo<'_>, r: &mut Report) -> Result<(), String> {
    r.say(format!(
        "\n== 4. control-path storm: QP create/destroy and 64 KiB MR register/deregister next to the latency tenant (mtrdma: {STORM_RATE}/s each) =="
    ));
    r.say(format!(
        "{:<12} {:>9} {:>9} {:>10} {:>9} {:>14} {:>14}",
        "way", "p50 us", "p99 us", "p99.9 us", "p99/alone", "storm ops/s", "refused/s"
    ));
    let mut alone_p99 = f64::NAN;
    let mut cdf = Vec::new();
    for way in WAYS {
        let m = demo.measure(
            way,
            &Cast {
                probe: true,
                bulk: Vec::new(),
                storm: way != Way::Alone,
            },
        )?;
        let l = lat(&m.probe_us);
        if way == Way::Alone {
            alone_p99 = l.p99;
        }
        r.say(format!(
            "{:<12} {:>9.1} {:>9.1} {:>10} {:>9.2} {:>14.1} {:>14.1}",
            way.name(),
            l.p50,
            l.p99,
            l.p999_cell(),
            l.p99 / alone_p99,
            m.storm_ok,
            m.storm_refused
        ));
        for (k, v) in l.figures() {
            r.figure("storm", way, "storm", "latency", k, v);
        }
        r.figure("storm", way, "storm", "storm", "ops_per_s", m.storm_ok);
        r.figure(
            "storm",
            way,
            "storm",
            "storm",
            "refused_per_s",
            m.storm_refused,
        );
        r.keep_samples("storm", way, "storm", &m.probe_us);
        cdf.push(LatencySeries {
            label: way.name().into(),
            samples_us: m.probe_us,
        });
    }
    plot::latency_cdf(
        &demo.args.out.join("storm_cdf"),
        "Latency tenant next to a control-path storm",
        &cdf,
    )
}

fn write(path: &Path, header: &str, body: &str) -> Result<(), String> {
    std::fs::write(path, format!("{header}\n{body}"))
        .map_err(|e| format!("writing {}: {e}", path.display()))
}

fn run() -> Result<(), String> {
    let args = parse()?;
    if args.storm_tenant {
        return storm_tenant(&args);
    }
    std::fs::create_dir_all(&args.out)
        .map_err(|e| format!("creating {}: {e}", args.out.display()))?;
    let mut r = Report::default();
    if args.link {
        let spec = link::LinkSpec::from_env()?;
        // What was measured is written out even if a later scenario fails.
        let done = link::run(&args, &spec, &mut r);
        write_report(&args.out, &r)?;
        return done;
    }
    let ctx = open_device(args.device.as_deref())?;
    let pd = ctx.alloc_pd().map_err(|e| e.to_string())?;
    let peer_ctx = match &args.peer_device {
        Some(name) => Some(open_device(Some(name))?),
        None => None,
    };
    let peer = match &peer_ctx {
        Some(c) => Some(c.alloc_pd().map_err(|e| e.to_string())?),
        None => None,
    };
    let table = QuotaTable::embedded(&policy(&args)).map_err(|e| e.to_string())?;
    let demo = Demo {
        args: &args,
        pd,
        peer,
        table,
    };
    r.say(format!(
        "mtrdma isolation demo in one process (SharedScheduler) on {}{}: {} s per measurement after {} ms warm-up; mtrdma: chunk {} B, bulk budget {} B in the NIC",
        ctx.name(),
        peer_ctx
            .as_ref()
            .map_or_else(|| " in loopback".to_string(), |c| format!(" -> {}", c.name())),
        args.seconds,
        args.warmup.as_millis(),
        args.chunk,
        args.budget
    ));
    for s in &args.scenarios {
        match s.as_str() {
            "latency" => scenario_latency(&demo, &mut r)?,
            "weights" => scenario_weights(&demo, &mut r)?,
            "cap" => scenario_cap(&demo, &mut r)?,
            "storm" => scenario_storm(&demo, &mut r)?,
            _ => unreachable!("checked in parse"),
        }
    }
    write_report(&args.out, &r)
}

/// The link demo's control-path storm, as a process of its own: creates
/// and destroys queue pairs and registers memory for `--seconds`, as a
/// tenant of the coordinator at `--coordinator` if given (its rate limits
/// apply), else with no limits; prints one line with what it did.
fn storm_tenant(args: &Args) -> Result<(), String> {
    let ctx = open_device(args.device.as_deref())?;
    let pd = ctx.alloc_pd().map_err(|e| e.to_string())?;
    let handle = match &args.coordinator {
        Some(socket) => Some(
            mtrdma::core::coordinator::register(socket)
                .map_err(|e| format!("registering at {}: {e}", socket.display()))?,
        ),
        None => None,
    };
    let stop = AtomicBool::new(false);
    let length = Duration::from_secs_f64(args.seconds);
    let start = Instant::now();
    let (ok, refused) = std::thread::scope(|s| {
        let t = s.spawn(|| storm(&pd, handle.as_ref(), start, (Duration::ZERO, length), &stop));
        std::thread::sleep(length);
        stop.store(true, Ordering::Release);
        t.join()
            .map_err(|_| "the storm thread panicked".to_string())?
    })?;
    println!("storm: {ok} ok, {refused} refused in {} s", args.seconds);
    Ok(())
}

/// The device `name`, or the first active one.
fn open_device(name: Option<&str>) -> Result<Context, String> {
    match name {
        Some(name) => Context::open(name),
        None => Context::open_first_active(),
    }
    .map_err(|e| e.to_string())
}

/// Writes the report's tables and CSV files into `out`.
fn write_report(out: &Path, r: &Report) -> Result<(), String> {
    write(&out.join("results.txt"), "", &r.text)?;
    write(
        &out.join("results.csv"),
        "scenario,way,case,tenant,metric,value",
        &r.csv,
    )?;
    write(
        &out.join("latency_samples.csv"),
        "scenario,way,case,sample,latency_us",
        &r.samples,
    )?;
    write(
        &out.join("timeline.csv"),
        "scenario,way,tenant,seconds,mbps",
        &r.timeline,
    )?;
    println!("\nwrote tables, CSV and pictures to {}", out.display());
    Ok(())
}

fn main() -> std::process::ExitCode {
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("isolation: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
