//! The isolation demo: tenants sharing one RDMA port, each scenario run
//! three ways (alone, unprotected, protected by mtrdma), with tables, CSV
//! files and pictures.
//!
//! ```text
//! # tenants as processes on the VM's shared link (cargo xtask vm --link RATE)
//! cargo run --release -p mtrdma-demo --bin isolation -- --link [--out target/demo/link]
//!     [--seconds 9] [--bulk 1,4,8] [--msg 1048576] [--cap-share 0.25]
//!     [--scenarios latency,hogs,weights,cap,storm,attack,apps]
//!
//! # one process, one SharedScheduler, in loopback or across two devices
//! cargo run --release -p mtrdma-demo --bin isolation -- [--device rxe0] [--peer-device NAME]
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
//! (per-tenant throughput in 250 ms bins), `scenarios.tsv` (which
//! scenarios ran, and why any did not: see `status.rs`), and SVG + PNG
//! pictures; the link run adds `link-policy.toml` and `logs/` (every
//! process's output). A scenario that cannot run is reported and the next
//! one runs; the exit status is 1 when any did not run.

mod cli;
mod demo;
mod link;
mod plot;
mod programs;
mod progress;
mod report;
mod scenarios;
// Shared with `cargo xtask demo`, which reads what this program writes.
#[allow(dead_code)]
mod status;

use std::cell::RefCell;
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
    Access, AddressHandle, Completion, Context, Error, MemoryRegion, PostError, ProtectionDomain,
    QueuePair, RemoteRegion, ScheduleConfig, ScheduledUdQueuePair, SendOp, SharedConfig,
    SharedScheduler, UdCompletion, UdEndpoint, UdQueuePair,
};
use mtrdma_demo::args;
use plot::{BarGroup, LatencySeries, RateSeries};

use cli::*;
use demo::*;
use report::*;
use scenarios::*;

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
    let table = QuotaTable::embedded(&policy(&args))
        .map_err(|e| e.to_string())?
        .table();
    let progress = RefCell::new(progress::Progress::new(
        args.scenarios
            .iter()
            .map(|s| (s.clone(), planned(s, &args)))
            .collect(),
        args.warmup + Duration::from_secs_f64(args.seconds + 1.0),
    ));
    let demo = Demo {
        args: &args,
        pd,
        peer,
        table,
        progress: &progress,
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
    let ran = run_scenarios(
        &args.out,
        &args.scenarios,
        &mut r,
        &progress,
        |s, r| match s {
            "latency" => scenario_latency(&demo, r),
            "weights" => scenario_weights(&demo, r),
            "cap" => scenario_cap(&demo, r),
            "storm" => scenario_storm(&demo, r),
            _ => unreachable!("checked in parse"),
        },
    );
    write_report(&args.out, &r)?;
    ran
}

/// Runs `scenarios` one after another with `each`: a scenario that cannot
/// run is reported and the next one runs all the same. Which ran is kept
/// in `out/scenarios.tsv` as it goes (see `status.rs`), and the report ends
/// with the list. An error names every scenario that did not run; a
/// target a scenario did not meet is in its table, not an error.
/// `progress` says which scenario runs and about how long is left.
fn run_scenarios(
    out: &Path,
    scenarios: &[String],
    r: &mut Report,
    progress: &RefCell<progress::Progress>,
    mut each: impl FnMut(&str, &mut Report) -> Result<(), String>,
) -> Result<(), String> {
    let mut record = status::Record::start(out, scenarios)?;
    for s in scenarios {
        println!("{}", progress.borrow_mut().begin(s));
        let ran = each(s, r);
        let kept = progress.borrow_mut().end(ran.is_ok());
        let state = match ran.and(kept) {
            Ok(()) => status::State::Ran,
            Err(why) => {
                r.say(format!("\n== scenario {s} did not run: {why}"));
                status::State::Failed(why)
            }
        };
        record.set(s, state)?;
    }
    let failed = record.failed();
    r.say(format!(
        "\nscenarios: {} of {} ran{}",
        scenarios.len() - failed.len(),
        scenarios.len(),
        if failed.is_empty() {
            String::new()
        } else {
            let names: Vec<&str> = failed.iter().map(|(s, _)| *s).collect();
            format!("; did not run: {}", names.join(", "))
        }
    ));
    match failed.as_slice() {
        [] => Ok(()),
        failed => Err(failed
            .iter()
            .map(|(s, why)| format!("scenario {s} did not run: {why}"))
            .collect::<Vec<_>>()
            .join("\n")),
    }
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
    let peer = match (args.rnr || args.ud, &args.peer_device) {
        (true, Some(name)) => Some(
            open_device(Some(name))?
                .alloc_pd()
                .map_err(|e| e.to_string())?,
        ),
        (true, None) => return Err("--rnr and --ud need --peer-device".into()),
        _ => None,
    };
    let stop = AtomicBool::new(false);
    let length = Duration::from_secs_f64(args.seconds);
    let start = Instant::now();
    let window = (Duration::ZERO, length);
    let run = StormRun {
        handle: handle.as_ref(),
        start,
        window,
        stop: &stop,
    };
    let (ok, refused) = std::thread::scope(|s| {
        let t = s.spawn(|| match &peer {
            Some(peer) if args.ud => ud_flood(&pd, peer, run),
            Some(peer) => rnr_storm(&pd, peer, run),
            None => storm(&pd, run, args.mr_sweep),
        });
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
