//! Queue pairs and memory regions on a real device: a tenant that holds
//! some, a storm of them, and what the kernel monitor costs them.
//!
//! ```text
//! cargo run --release --example control_path -- hold [--device rxe0] [--coordinator SOCKET]
//!     [--qps 3] [--mrs 2] [--mr-bytes 65536]
//! cargo run --release --example control_path -- storm [--device rxe0] [--coordinator SOCKET]
//!     [--count 200] [--mr-bytes 65536]
//! cargo run --release --example control_path -- cost [--device rxe0] [--ops 300] [--rounds 10]
//!     [--mr-bytes 65536]
//! ```
//!
//! - `hold`: creates `--qps` queue pairs and registers `--mrs` regions of
//!   `--mr-bytes`, as the tenant a running coordinator decides for this
//!   process (`--coordinator`: admitted against its quota) or with raw
//!   verbs (not admitted: what the kernel monitor calls a bypass), prints
//!   `holding pid=P qps=N mrs=N mr_bytes=B` and keeps them until its
//!   standard input closes.
//! - `storm`: creates and destroys `--count` queue pairs and registers and
//!   deregisters `--count` regions, one after another, and prints
//!   `storm pid=P qps=N mrs=N seconds=S`.
//! - `cost`: QP creations and region registrations per second without
//!   and with the kernel monitor attached (`mtrdma::core::monitor`, root
//!   needed), in alternating rounds (which goes first alternates too), and
//!   the medians of each round's ratio: the monitor's cost on the control
//!   path.

#[path = "shared/args.rs"]
mod args;

use std::io::{Read, Write};
use std::path::PathBuf;
use std::time::Instant;

use mtrdma::core::coordinator::register;
use mtrdma::core::monitor::{KernelCounts, KernelMonitor};
use mtrdma::core::TenantHandle;
use mtrdma::verbs::{Access, Context, MemoryRegion, PreparedQueuePair, ProtectionDomain};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Hold,
    Storm,
    Cost,
}

struct Args {
    mode: Mode,
    device: Option<String>,
    coordinator: Option<PathBuf>,
    qps: u32,
    mrs: u32,
    mr_bytes: usize,
    count: u32,
    ops: u32,
    rounds: u32,
}

const USAGE: &str =
    "control_path hold|storm|cost [--device NAME] [--coordinator SOCKET] [--qps N] [--mrs N] \
[--mr-bytes B] [--count N] [--ops N] [--rounds N]";

fn parse() -> Result<Args, String> {
    let mut it = args::Args::from_env();
    let mode = match it.next()? {
        Some(args::Token::Value(v)) => match v.as_str() {
            "hold" => Mode::Hold,
            "storm" => Mode::Storm,
            "cost" => Mode::Cost,
            other => return Err(format!("unknown mode {other}\n{USAGE}")),
        },
        _ => return Err(format!("a mode first\n{USAGE}")),
    };
    let mut a = Args {
        mode,
        device: None,
        coordinator: None,
        qps: 3,
        mrs: 2,
        mr_bytes: 64 << 10,
        count: 200,
        ops: 300,
        rounds: 10,
    };
    while let Some(flag) = it.next_flag(|v| format!("unexpected argument {v}\n{USAGE}"))? {
        match flag.as_str() {
            "--device" => a.device = Some(it.value(&flag)?),
            "--coordinator" => a.coordinator = Some(PathBuf::from(it.value(&flag)?)),
            "--qps" => a.qps = it.parse(&flag)?,
            "--mrs" => a.mrs = it.parse(&flag)?,
            "--mr-bytes" => a.mr_bytes = it.parse(&flag)?,
            "--count" => a.count = it.parse(&flag)?,
            "--ops" => a.ops = it.parse(&flag)?,
            "--rounds" => a.rounds = it.parse(&flag)?,
            "--help" | "-h" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            other => return Err(format!("unknown flag {other}\n{USAGE}")),
        }
    }
    if a.mr_bytes == 0 || a.ops == 0 || a.rounds == 0 {
        return Err("--mr-bytes, --ops and --rounds must be positive".into());
    }
    Ok(a)
}

/// A queue pair, admitted for `tenant` if there is one.
fn queue_pair(
    pd: &ProtectionDomain,
    tenant: Option<&TenantHandle>,
) -> Result<PreparedQueuePair, String> {
    let b = pd.queue_pair();
    match tenant {
        Some(t) => b.tenant(t).build(),
        None => b.build(),
    }
    .map_err(|e| format!("creating a queue pair: {e}"))
}

/// A region of `bytes`, admitted for `tenant` if there is one.
fn region(
    pd: &ProtectionDomain,
    tenant: Option<&TenantHandle>,
    bytes: usize,
) -> Result<MemoryRegion, String> {
    let buf = vec![0u8; bytes];
    match tenant {
        Some(t) => pd.register_for(t, buf, Access::LOCAL),
        None => pd.register(buf, Access::LOCAL),
    }
    .map_err(|e| format!("registering {bytes} bytes: {e}"))
}

/// Creates and destroys `n` queue pairs; returns the seconds it took.
fn qp_round(pd: &ProtectionDomain, tenant: Option<&TenantHandle>, n: u32) -> Result<f64, String> {
    let t0 = Instant::now();
    for _ in 0..n {
        drop(queue_pair(pd, tenant)?);
    }
    Ok(t0.elapsed().as_secs_f64())
}

/// Registers and deregisters `n` regions of `bytes`; returns the seconds.
fn mr_round(
    pd: &ProtectionDomain,
    tenant: Option<&TenantHandle>,
    n: u32,
    bytes: usize,
) -> Result<f64, String> {
    let t0 = Instant::now();
    for _ in 0..n {
        drop(region(pd, tenant, bytes)?);
    }
    Ok(t0.elapsed().as_secs_f64())
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// What the monitor has counted for this process so far.
fn seen_by(monitor: &mut KernelMonitor) -> Result<KernelCounts, String> {
    let me = std::process::id();
    let mut seen = KernelCounts::default();
    for p in monitor.processes().map_err(|e| e.to_string())? {
        if p.pid == me {
            seen.add(&p.counts);
        }
    }
    Ok(seen)
}

fn cost(pd: &ProtectionDomain, a: &Args) -> Result<(), String> {
    // Loaded once; attached for the blocks "with" it, detached for the
    // others, so blocks of both kinds can alternate closely.
    let mut monitor = KernelMonitor::start().map_err(|e| e.to_string())?;
    println!(
        "control_path cost: {} QP creations+destructions and {} registrations+deregistrations of {} B per block, \
         {} rounds of a block without and a block with the kernel monitor's probes attached (which goes first alternates)",
        a.ops, a.ops, a.mr_bytes, a.rounds
    );
    // [QP, MR] x [without, with]: each block's rate; each round's ratio.
    let mut rates = [[Vec::new(), Vec::new()], [Vec::new(), Vec::new()]];
    let mut ratios = [Vec::new(), Vec::new()];
    // Each timed block after an untimed tenth of it, so that both start
    // from the same warm state.
    let warm = a.ops / 10 + 1;
    for round in 0..a.rounds {
        let order = if round % 2 == 0 {
            [false, true]
        } else {
            [true, false]
        };
        let mut line = format!("round {}:", round + 1);
        for (kind, name) in [(0, "QP/s"), (1, "MR/s")] {
            let mut rate = [0.0; 2];
            for on in order {
                if on {
                    monitor.resume().map_err(|e| e.to_string())?;
                } else {
                    monitor.pause().map_err(|e| e.to_string())?;
                }
                let before = seen_by(&mut monitor)?;
                let secs = if kind == 0 {
                    qp_round(pd, None, warm)?;
                    qp_round(pd, None, a.ops)?
                } else {
                    mr_round(pd, None, warm, a.mr_bytes)?;
                    mr_round(pd, None, a.ops, a.mr_bytes)?
                };
                // With its probes attached the monitor saw every one of
                // them, once; detached, none.
                let d = seen_by(&mut monitor)?.since(&before);
                let (made, ended) = if kind == 0 {
                    (d.qps_created, d.qps_destroyed)
                } else {
                    (d.mrs_registered, d.mrs_released)
                };
                let want = if on { u64::from(a.ops + warm) } else { 0 };
                if (made, ended) != (want, want) {
                    return Err(format!(
                        "the monitor counted {made} made and {ended} ended of a block's {want} {name}"
                    ));
                }
                rate[usize::from(on)] = f64::from(a.ops) / secs;
                rates[kind][usize::from(on)].push(rate[usize::from(on)]);
            }
            ratios[kind].push(rate[1] / rate[0]);
            line += &format!(
                " {name} {:.0} without, {:.0} with ({:.3});",
                rate[0],
                rate[1],
                rate[1] / rate[0]
            );
        }
        println!("{}", line.trim_end_matches(';'));
    }
    for (kind, name) in [
        (0, "QP creations+destructions/s"),
        (1, "MR registrations+deregistrations/s"),
    ] {
        let r = median(ratios[kind].clone());
        println!(
            "medians: {name} {:.0} without, {:.0} with; each round's ratio: median {:.3} (target at least 0.95: {})",
            median(rates[kind][0].clone()),
            median(rates[kind][1].clone()),
            r,
            if r >= 0.95 { "met" } else { "NOT met" }
        );
    }
    Ok(())
}

fn main() {
    let a = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("control_path: {e}");
            std::process::exit(2);
        }
    };
    if let Err(e) = run(&a) {
        eprintln!("control_path: {e}");
        std::process::exit(1);
    }
}

fn run(a: &Args) -> Result<(), String> {
    let tenant = match &a.coordinator {
        Some(socket) => Some(
            register(socket).map_err(|e| format!("registering at {}: {e}", socket.display()))?,
        ),
        None => None,
    };
    let ctx = match &a.device {
        Some(name) => Context::open(name),
        None => Context::open_first_active(),
    }
    .map_err(|e| e.to_string())?;
    let pd = ctx.alloc_pd().map_err(|e| e.to_string())?;
    let pid = std::process::id();
    match a.mode {
        Mode::Hold => {
            let qps = (0..a.qps)
                .map(|_| queue_pair(&pd, tenant.as_ref()))
                .collect::<Result<Vec<_>, _>>()?;
            let mrs = (0..a.mrs)
                .map(|_| region(&pd, tenant.as_ref(), a.mr_bytes))
                .collect::<Result<Vec<_>, _>>()?;
            println!(
                "holding pid={pid} qps={} mrs={} mr_bytes={}",
                qps.len(),
                mrs.len(),
                mrs.len() * a.mr_bytes
            );
            std::io::stdout().flush().map_err(|e| e.to_string())?;
            // Until whoever started it closes its standard input.
            let mut sink = Vec::new();
            let _ = std::io::stdin().read_to_end(&mut sink);
            drop(qps);
            drop(mrs);
            println!("released");
        }
        Mode::Storm => {
            let t0 = Instant::now();
            qp_round(&pd, tenant.as_ref(), a.count)?;
            mr_round(&pd, tenant.as_ref(), a.count, a.mr_bytes)?;
            println!(
                "storm pid={pid} qps={} mrs={} seconds={:.3}",
                a.count,
                a.count,
                t0.elapsed().as_secs_f64()
            );
        }
        Mode::Cost => cost(&pd, a)?,
    }
    Ok(())
}
