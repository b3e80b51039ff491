//! Post-to-completion latency and message rate of 64 B RDMA WRITEs on a
//! real RDMA device, posted directly on a queue pair (`raw`) and through
//! mtrdma's scheduled path (`mtrdma`), one request per post and in
//! batches, in the same run. The other benches run on the null sink; this
//! one measures what the device, its driver and the library cost together.
//!
//! ```text
//! MTRDMA_BENCH_DEVICE=mlx5_0 cargo bench --bench device [-- --quick]
//! cargo xtask bench-device [-- --quick]     (rxe0 inside the SoftRoCE VM)
//! ```
//!
//! Without `MTRDMA_BENCH_DEVICE` it prints that it skipped, why, and the
//! devices this host has, and exits successfully, so `cargo bench` works on
//! a machine without RDMA. A name that is not a device is an error that
//! lists the devices there are.
//!
//! Both queue pairs are loopback pairs on the named device (each connected
//! to a peer on the same device, as the device tests do), and every WRITE
//! goes to the same 64 B of a region of the same protection domain:
//!
//! * `device_latency/raw`: [`QueuePair::post_send`] of one WRITE, then
//!   [`QueuePair::poll`] until its completion has handed the region back;
//!   one request in flight at a time.
//! * `device_latency/mtrdma`: the same through a [`ScheduledQueuePair`]
//!   (from [`QueuePair::scheduled`] with
//!   [`ScheduleConfig::local`]`(TenantId(0), TrafficClass::Bulk)`: a
//!   scheduler of its own, no quota table).
//! * `device_rate/raw_single`, `device_rate/mtrdma_single`: 32 WRITEs
//!   outstanding, a new one posted for each that completes.
//! * `device_rate/raw_batch16`, `device_rate/mtrdma_batch16`: the same
//!   window refilled 16 requests at a time, as one [`QueuePair::batch`]
//!   (one doorbell, one completion in 16) or one
//!   [`ScheduledQueuePair::batch`] (accepted together, posted as one list).
//!
//! The scheduled queue pair lets all 32 pieces into the device
//! (`max_pieces_in_flight`), so the window, not the scheduler's default
//! bound, sets how much is outstanding on both paths. Criterion reports the
//! latency per request and the rates in requests per second.
//!
//! After criterion's groups, paired rounds: the six cases in turn, in
//! reverse order every other round, 31 rounds (7 with `--quick`) of about
//! 100 ms per case (20 ms with `--quick`; the number of requests per case
//! is set from a first, uncounted round). The summary gives the medians of
//! each case's per-round figures and of the per-round ratios mtrdma/raw (of
//! the latencies, and of the rates) and batch/single (of the rates), so
//! drift between rounds, large under emulation, cancels out of the ratios.
//!
//! [`QueuePair::post_send`]: mtrdma::verbs::QueuePair::post_send
//! [`QueuePair::poll`]: mtrdma::verbs::QueuePair::poll
//! [`QueuePair::batch`]: mtrdma::verbs::QueuePair::batch
//! [`QueuePair::scheduled`]: mtrdma::verbs::QueuePair::scheduled
//! [`ScheduledQueuePair`]: mtrdma::verbs::ScheduledQueuePair
//! [`ScheduledQueuePair::batch`]: mtrdma::verbs::ScheduledQueuePair::batch
//! [`ScheduleConfig::local`]: mtrdma::verbs::ScheduleConfig::local

use std::process::ExitCode;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput};
use mtrdma::core::{TenantId, TrafficClass};
use mtrdma::verbs::PollCompletions;
use mtrdma::verbs::{
    device_names, Access, Completion, Context, Error, MemoryRegion, ProtectionDomain, QueuePair,
    ScheduleConfig, ScheduledQueuePair, SendOp,
};

/// The environment variable that names the device.
const DEVICE_VAR: &str = "MTRDMA_BENCH_DEVICE";
/// Bytes per WRITE.
const BYTES: usize = 64;
/// WRITEs outstanding in the rate cases.
const WINDOW: usize = 32;
/// Requests per batch in the batch cases.
const BATCH: usize = 16;
/// Send queue depth of every queue pair (room for the window and more).
const DEPTH: u32 = 2 * WINDOW as u32;

/// The two ways of posting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Path {
    Raw,
    Mtrdma,
}

/// How the rate cases refill the window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Posting {
    /// One post per request.
    Single,
    /// `BATCH` requests per post.
    Batch,
}

/// A measured case.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Case {
    /// One request at a time, post to completion.
    Latency(Path),
    /// `WINDOW` requests outstanding.
    Rate(Path, Posting),
}

/// The cases, in the order of the paired rounds.
const CASES: [Case; 6] = [
    Case::Latency(Path::Raw),
    Case::Latency(Path::Mtrdma),
    Case::Rate(Path::Raw, Posting::Single),
    Case::Rate(Path::Mtrdma, Posting::Single),
    Case::Rate(Path::Raw, Posting::Batch),
    Case::Rate(Path::Mtrdma, Posting::Batch),
];

impl Case {
    /// Criterion's group and function name.
    fn id(self) -> (&'static str, &'static str) {
        match self {
            Case::Latency(Path::Raw) => ("device_latency", "raw"),
            Case::Latency(Path::Mtrdma) => ("device_latency", "mtrdma"),
            Case::Rate(Path::Raw, Posting::Single) => ("device_rate", "raw_single"),
            Case::Rate(Path::Mtrdma, Posting::Single) => ("device_rate", "mtrdma_single"),
            Case::Rate(Path::Raw, Posting::Batch) => ("device_rate", "raw_batch16"),
            Case::Rate(Path::Mtrdma, Posting::Batch) => ("device_rate", "mtrdma_batch16"),
        }
    }
}

/// Either queue pair, driven the same way.
trait Poster {
    /// Posts one WRITE of `region`.
    fn post(&mut self, op: SendOp, region: MemoryRegion);
    /// Posts the WRITEs of `regions` as one batch.
    fn post_batch(&mut self, op: SendOp, regions: &mut Vec<MemoryRegion>, n: usize);
    /// Adds completions to `out`.
    fn reap(&mut self, out: &mut Vec<Completion>);
}

/// [`Poster`] for `$qp`, whose failures it names `$path`.
macro_rules! poster {
    ($qp:ty, $path:literal, $not_posted:literal) => {
        impl Poster for $qp {
            fn post(&mut self, op: SendOp, region: MemoryRegion) {
                if let Err(e) = self.post_send(op, region, 0..BYTES, 0) {
                    panic!(concat!($path, " post_send refused: {}"), e);
                }
            }

            fn post_batch(&mut self, op: SendOp, regions: &mut Vec<MemoryRegion>, n: usize) {
                let mut batch = self.batch();
                for region in regions.drain(regions.len() - n..) {
                    if let Err(e) = batch.post_send(op, region, 0..BYTES, 0) {
                        panic!(concat!($path, " batch refused a request: {}"), e);
                    }
                }
                if let Err(e) = batch.submit() {
                    panic!(concat!($path, " batch not ", $not_posted, ": {}"), e);
                }
            }

            fn reap(&mut self, out: &mut Vec<Completion>) {
                if let Err(e) = self.poll(out) {
                    panic!(concat!($path, " poll failed: {}"), e);
                }
            }
        }
    };
}

poster!(QueuePair, "raw", "posted");
poster!(ScheduledQueuePair, "mtrdma", "accepted");

/// The device's queue pairs and regions.
struct Rig {
    raw: QueuePair,
    mtrdma: ScheduledQueuePair,
    op: SendOp,
    /// The source regions not in flight (`WINDOW` of them between cases).
    pool: Vec<MemoryRegion>,
    out: Vec<Completion>,
    // Kept alive: the peers of the two queue pairs, and the WRITEs' target.
    _peers: (QueuePair, QueuePair),
    _target: MemoryRegion,
}

/// Two queue pairs on `pd`, connected to each other.
fn pair(pd: &ProtectionDomain) -> Result<(QueuePair, QueuePair), Error> {
    let a = pd.queue_pair().max_send_wr(DEPTH).build()?;
    let b = pd.queue_pair().max_send_wr(DEPTH).build()?;
    let (ea, eb) = (a.endpoint(), b.endpoint());
    Ok((a.connect(&eb)?, b.connect(&ea)?))
}

impl Rig {
    fn new(ctx: &Context) -> Result<Rig, Error> {
        let pd = ctx.alloc_pd()?;
        let target = pd.allocate(BYTES, Access::REMOTE_READ_WRITE)?;
        let remote = target.remote().expect("remote access was granted");
        let pool = (0..WINDOW)
            .map(|_| pd.allocate(BYTES, Access::LOCAL))
            .collect::<Result<_, _>>()?;
        let (raw, raw_peer) = pair(&pd)?;
        let (scheduled, scheduled_peer) = pair(&pd)?;
        // Tenant 0 of this process's scheduler alone: the library's own
        // cost, without a quota table; all of the window in the device.
        let mtrdma = scheduled.scheduled(ScheduleConfig {
            max_pieces_in_flight: WINDOW as u32,
            ..ScheduleConfig::local(TenantId(0), TrafficClass::Bulk)
        })?;
        Ok(Rig {
            raw,
            mtrdma,
            op: SendOp::Write(remote),
            pool,
            out: Vec::with_capacity(WINDOW),
            _peers: (raw_peer, scheduled_peer),
            _target: target,
        })
    }

    /// Runs `requests` requests of `case`; returns how long they took.
    fn run(&mut self, case: Case, requests: u64) -> Duration {
        let Rig {
            raw,
            mtrdma,
            op,
            pool,
            out,
            ..
        } = self;
        let start = Instant::now();
        match case {
            Case::Latency(Path::Raw) => latency(raw, *op, pool, out, requests),
            Case::Latency(Path::Mtrdma) => latency(mtrdma, *op, pool, out, requests),
            Case::Rate(Path::Raw, how) => rate(raw, *op, how, pool, out, requests),
            Case::Rate(Path::Mtrdma, how) => rate(mtrdma, *op, how, pool, out, requests),
        }
        start.elapsed()
    }
}

/// Takes the regions of the completions in `out` back into `pool`; returns
/// how many there were.
fn take_back(out: &mut Vec<Completion>, pool: &mut Vec<MemoryRegion>) -> u64 {
    let n = out.len() as u64;
    for c in out.drain(..) {
        if !c.status.is_success() {
            panic!("a WRITE failed: {}", c.status);
        }
        pool.push(c.region);
    }
    n
}

/// `requests` WRITEs one at a time, each polled to its completion.
fn latency(
    qp: &mut impl Poster,
    op: SendOp,
    pool: &mut Vec<MemoryRegion>,
    out: &mut Vec<Completion>,
    requests: u64,
) {
    for _ in 0..requests {
        let region = pool.pop().expect("every region is back between requests");
        qp.post(op, region);
        while out.is_empty() {
            qp.reap(out);
        }
        take_back(out, pool);
    }
}

/// `requests` WRITEs with up to `WINDOW` outstanding, refilled one at a
/// time or a batch at a time.
fn rate(
    qp: &mut impl Poster,
    op: SendOp,
    posting: Posting,
    pool: &mut Vec<MemoryRegion>,
    out: &mut Vec<Completion>,
    requests: u64,
) {
    let (mut posted, mut done) = (0u64, 0u64);
    while done < requests {
        match posting {
            Posting::Single => {
                while posted < requests {
                    let Some(region) = pool.pop() else { break };
                    qp.post(op, region);
                    posted += 1;
                }
            }
            Posting::Batch => loop {
                // The last batch of a run may be short.
                let n = (requests - posted).min(BATCH as u64) as usize;
                if n == 0 || pool.len() < n {
                    break;
                }
                qp.post_batch(op, pool, n);
                posted += n as u64;
            },
        }
        qp.reap(out);
        done += take_back(out, pool);
    }
}

/// How long the paired rounds run.
#[derive(Debug, Clone, Copy)]
struct Rounds {
    rounds: usize,
    per_case: Duration,
}

const FULL: Rounds = Rounds {
    rounds: 31,
    per_case: Duration::from_millis(100),
};
const QUICK: Rounds = Rounds {
    rounds: 7,
    per_case: Duration::from_millis(20),
};

fn groups(c: &mut Criterion, rig: &mut Rig) {
    for group_name in ["device_latency", "device_rate"] {
        let mut group = c.benchmark_group(group_name);
        group.throughput(Throughput::Elements(1));
        for case in CASES.into_iter().filter(|c| c.id().0 == group_name) {
            group.bench_function(case.id().1, |b| b.iter_custom(|n| rig.run(case, n)));
        }
        group.finish();
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The cases in turn, round after round (every other round in reverse
/// order); prints the medians of the per-round figures and ratios.
fn paired(rig: &mut Rig, device: &str, plan: Rounds) {
    // A first round sizes the others: about `per_case` for each case.
    let requests: Vec<u64> = CASES
        .iter()
        .map(|&case| {
            let probe = match case {
                Case::Latency(_) => 200,
                Case::Rate(..) => 2_000,
            };
            let took = rig.run(case, probe).as_secs_f64().max(1e-9);
            let n = plan.per_case.as_secs_f64() / took * probe as f64;
            (n as u64).clamp(100, 100_000_000)
        })
        .collect();
    // Seconds per request, per case and round.
    let mut per_request: Vec<Vec<f64>> = vec![Vec::new(); CASES.len()];
    for round in 0..plan.rounds {
        let mut order: Vec<usize> = (0..CASES.len()).collect();
        if round % 2 == 1 {
            order.reverse();
        }
        for i in order {
            let took = rig.run(CASES[i], requests[i]);
            per_request[i].push(took.as_secs_f64() / requests[i] as f64);
        }
    }
    let index = |case: Case| CASES.iter().position(|&c| c == case).expect("a case");
    let us = |case: Case| median(per_request[index(case)].iter().map(|s| s * 1e6).collect());
    let krate = |case: Case| median(per_request[index(case)].iter().map(|s| 1e-3 / s).collect());
    // The median of the per-round ratios a/b of seconds per request.
    let ratio = |a: Case, b: Case| {
        let (a, b) = (&per_request[index(a)], &per_request[index(b)]);
        median(a.iter().zip(b).map(|(a, b)| a / b).collect())
    };
    let single = |p| Case::Rate(p, Posting::Single);
    let batch = |p| Case::Rate(p, Posting::Batch);
    let (lat_raw, lat_mtrdma) = (Case::Latency(Path::Raw), Case::Latency(Path::Mtrdma));

    println!(
        "\npaired rounds on {device} ({} rounds, about {} ms per case each, every other round \
         in reverse order), medians of the rounds:",
        plan.rounds,
        plan.per_case.as_millis()
    );
    println!(
        "  post-to-completion latency, one {BYTES} B WRITE at a time ({} / {} per round):",
        requests[index(lat_raw)],
        requests[index(lat_mtrdma)]
    );
    println!("    raw     {:>9.2} us", us(lat_raw));
    println!(
        "    mtrdma  {:>9.2} us   mtrdma/raw {:.3}",
        us(lat_mtrdma),
        ratio(lat_mtrdma, lat_raw)
    );
    println!(
        "  message rate, {BYTES} B WRITEs, {WINDOW} outstanding, in k requests/s \
         ({} / {} / {} / {} per round):",
        requests[index(single(Path::Raw))],
        requests[index(single(Path::Mtrdma))],
        requests[index(batch(Path::Raw))],
        requests[index(batch(Path::Mtrdma))],
    );
    println!("                 single  batch{BATCH}  batch/single");
    for (name, path) in [("raw", Path::Raw), ("mtrdma", Path::Mtrdma)] {
        println!(
            "    {name:<10} {:>9.1} {:>8.1} {:>13.3}",
            krate(single(path)),
            krate(batch(path)),
            // A rate ratio: the inverse of the ratio of times.
            ratio(single(path), batch(path)),
        );
    }
    println!(
        "    mtrdma/raw {:>9.3} {:>8.3}",
        ratio(single(Path::Raw), single(Path::Mtrdma)),
        ratio(batch(Path::Raw), batch(Path::Mtrdma)),
    );
}

/// The devices on this host, for messages.
fn available() -> String {
    match device_names() {
        Ok(names) if names.is_empty() => "none".to_string(),
        Ok(names) => names.join(", "),
        Err(e) => format!("none: the device list is not available ({e})"),
    }
}

/// Opens the device named `device`, or says why not and what there is.
fn open(device: &str) -> Result<Context, String> {
    let names = device_names()
        .map_err(|e| format!("cannot list this host's RDMA devices to find {device:?}: {e}"))?;
    if !names.iter().any(|n| n == device) {
        return Err(format!(
            "{DEVICE_VAR}={device}: no RDMA device of that name (devices on this host: {})",
            available()
        ));
    }
    Context::open(device).map_err(|e| format!("cannot open {device}: {e}"))
}

fn main() -> ExitCode {
    let device = std::env::var(DEVICE_VAR).unwrap_or_default();
    if device.is_empty() {
        println!(
            "device bench skipped: {DEVICE_VAR} is not set, so there is no RDMA device to \
             measure on (it runs only on a device named for it).\n  \
             run it with: {DEVICE_VAR}=<device> cargo bench --bench device \
             (devices on this host: {})\n  \
             or on SoftRoCE in the VM: cargo xtask bench-device",
            available()
        );
        return ExitCode::SUCCESS;
    }
    let ctx = match open(&device) {
        Ok(ctx) => ctx,
        Err(e) => {
            eprintln!("device bench: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut rig = match Rig::new(&ctx) {
        Ok(rig) => rig,
        Err(e) => {
            eprintln!(
                "device bench: cannot set up loopback queue pairs on {device}: {e} \
                 (is its port active? `ibv_devinfo -d {device}`)"
            );
            return ExitCode::FAILURE;
        }
    };

    let args: Vec<String> = std::env::args().collect();
    let has = |flag: &str| args.iter().any(|a| a == flag);
    // Shorter than criterion's defaults: six cases on a device, a minute
    // or two under emulation. Command-line options still override these.
    let mut c = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .configure_from_args();
    groups(&mut c, &mut rig);
    // Not when criterion only lists or tests the benches, or profiles.
    if has("--bench") && !has("--list") && !has("--profile-time") {
        let plan = if has("--quick") { QUICK } else { FULL };
        paired(&mut rig, &device, plan);
    }
    ExitCode::SUCCESS
}
