//! Message rate and bandwidth of RDMA WRITEs posted directly on a queue
//! pair and through mtrdma's scheduled path, on the same device in the same
//! run, with the ratio (a real device: run it on a NIC, or in the SoftRoCE
//! VM with `cargo xtask vm -- target/release/examples/postrate`).
//!
//! ```text
//! cargo run --release --example postrate -- [--device rxe0] [--size 4096]
//!     [--iters 20000] [--outstanding 16] [--rounds 3]
//! ```
//!
//! Both paths use loopback queue pairs on one device, keep the same number
//! of WRITEs outstanding, and alternate for `--rounds` rounds (which goes
//! first alternates too); the best
//! round of each is reported, and the ratio of the two, and also the
//! median of the rounds' own ratios (each round's mtrdma rate over the
//! direct rate of the same round, so drift between rounds cancels).

#[path = "shared/args.rs"]
mod args;
#[path = "shared/lane.rs"]
mod lane;

use std::time::Instant;

use lane::Lane;
use mtrdma::verbs::{
    Access, Context, MemoryRegion, ProtectionDomain, QueuePair, ScheduleConfig, SendOp,
};
use mtrdma::{TenantId, TrafficClass};

struct Args {
    device: Option<String>,
    size: usize,
    iters: u64,
    outstanding: usize,
    rounds: u32,
}

fn parse() -> Result<Args, String> {
    let mut args = Args {
        device: None,
        size: 4096,
        iters: 20_000,
        outstanding: 16,
        rounds: 3,
    };
    let mut it = args::Args::from_env();
    while let Some(flag) = it.next_flag(|v| format!("unexpected argument {v}"))? {
        match flag.as_str() {
            "--device" => args.device = Some(it.value(&flag)?),
            "--size" => args.size = it.parse(&flag)?,
            "--iters" => args.iters = it.parse(&flag)?,
            "--outstanding" => args.outstanding = it.parse(&flag)?,
            "--rounds" => args.rounds = it.parse(&flag)?,
            other => return Err(format!("unknown flag {other}")),
        }
    }
    if args.size == 0 || args.outstanding == 0 || args.iters == 0 || args.rounds == 0 {
        return Err("--size, --iters, --outstanding and --rounds must be at least 1".into());
    }
    Ok(args)
}

fn pair(pd: &ProtectionDomain, depth: u32) -> Result<(QueuePair, QueuePair), mtrdma::verbs::Error> {
    let a = pd.queue_pair().max_send_wr(depth).build()?;
    let b = pd.queue_pair().max_send_wr(depth).build()?;
    let (ea, eb) = (a.endpoint(), b.endpoint());
    Ok((a.connect(&eb)?, b.connect(&ea)?))
}

/// Posts `iters` WRITEs keeping `pool.len()` outstanding; returns seconds.
fn run(
    qp: &mut dyn Lane,
    op: SendOp,
    pool: &mut Vec<MemoryRegion>,
    size: usize,
    iters: u64,
) -> Result<f64, String> {
    let start = Instant::now();
    let (mut posted, mut done) = (0u64, 0u64);
    let mut out = Vec::new();
    while done < iters {
        while posted < iters {
            let Some(region) = pool.pop() else { break };
            qp.post(op, region, size)?;
            posted += 1;
        }
        qp.reap(&mut out)?;
        for c in out.drain(..) {
            if !c.status.is_success() {
                return Err(format!("a WRITE failed: {}", c.status));
            }
            done += 1;
            pool.push(c.region);
        }
    }
    Ok(start.elapsed().as_secs_f64())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = parse()?;
    let ctx = match &args.device {
        Some(name) => Context::open(name)?,
        None => Context::open_first_active()?,
    };
    let pd = ctx.alloc_pd()?;
    let depth = u32::try_from(args.outstanding).unwrap_or(u32::MAX).max(1);
    let target = pd.allocate(args.size, Access::REMOTE_READ_WRITE)?;
    let remote = target.remote().expect("remote access granted");
    let op = SendOp::Write(remote);
    let mut pool: Vec<MemoryRegion> = (0..args.outstanding)
        .map(|_| pd.allocate(args.size, Access::LOCAL))
        .collect::<Result<_, _>>()?;

    let (mut direct, _peer_a) = pair(&pd, depth)?;
    let (sched_qp, _peer_b) = pair(&pd, depth)?;
    // Scheduled as tenant 0 of this process alone: the scheduler's own
    // cost, without a quota table.
    let mut scheduled = sched_qp.scheduled(ScheduleConfig {
        max_pieces_in_flight: depth,
        ..ScheduleConfig::local(TenantId(0), TrafficClass::Bulk)
    })?;

    let (mut best_direct, mut best_sched) = (f64::MAX, f64::MAX);
    let mut ratios = Vec::new();
    for round in 0..args.rounds {
        // Which path goes first alternates, so neither always runs on the
        // heels of the other.
        let (d, s) = if round % 2 == 0 {
            let d = run(&mut direct, op, &mut pool, args.size, args.iters)?;
            (
                d,
                run(&mut scheduled, op, &mut pool, args.size, args.iters)?,
            )
        } else {
            let s = run(&mut scheduled, op, &mut pool, args.size, args.iters)?;
            (run(&mut direct, op, &mut pool, args.size, args.iters)?, s)
        };
        best_direct = best_direct.min(d);
        best_sched = best_sched.min(s);
        ratios.push(d / s);
    }
    ratios.sort_by(f64::total_cmp);
    println!(
        "device {}, RDMA WRITE, {} outstanding, best of {} rounds",
        ctx.name(),
        args.outstanding,
        args.rounds
    );
    println!(
        "{:<10} {:>8} {:>12} {:>16} {:>14}",
        "path", "#bytes", "#iterations", "BW average[MB/s]", "MsgRate[Mpps]"
    );
    let line = |name: &str, secs: f64| {
        let rate = args.iters as f64 / secs;
        println!(
            "{:<10} {:>8} {:>12} {:>16.2} {:>14.6}",
            name,
            args.size,
            args.iters,
            rate * args.size as f64 / 1e6,
            rate / 1e6
        );
        rate
    };
    let d = line("direct", best_direct);
    let s = line("mtrdma", best_sched);
    println!("ratio mtrdma/direct: {:.3}", s / d);
    let shown: Vec<String> = ratios.iter().map(|r| format!("{r:.3}")).collect();
    println!(
        "ratio per round (sorted): {}; median {:.3}",
        shown.join(" "),
        ratios[ratios.len() / 2]
    );
    Ok(())
}
