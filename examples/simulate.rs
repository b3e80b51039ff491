//! Simulates one NIC port shared by a latency tenant, message-rate tenants
//! and bulk tenants, with and without mtrdma, and prints a table side by
//! side. With mtrdma, what enters the NIC is decided by the same functions
//! the verbs engine runs (`mtrdma_sched::gate`: the bulk budget, each queue
//! pair's pieces in flight and window, the fast path, grant order) around
//! the built-in scheduler.
//!
//! ```text
//! cargo run --release --example simulate -- --bulk 16
//! cargo run --release --example simulate -- --bulk 3 --weights 1,2,4 --msg-rate 1
//! cargo run --release --example simulate -- --bulk 9999 --ms 100 --rows 10
//! cargo run --release --example simulate -- --separate --link-mbps 200 --base-us 100 \
//!     --chunk-kib 2 --bulk 8 --ms 4000
//! cargo run --release --example simulate -- --separate --link-mbps 200 --base-us 100 \
//!     --chunk-kib 2 --probes 0 --bulk 3 --weights 1,2,4 --ms 12000 --warmup-ms 2000
//! cargo run --release --example simulate -- --latency-bound 16384 --chunk-kib 64 \
//!     --link-mbps 120 --base-us 100 --jitter-us 300 --probes 0 --bulk 3 --weights 1,3,9 \
//!     --ms 12000 --warmup-ms 2000
//! ```
//!
//! The last is what a policy's `latency_bound = "16KiB"` does to tenants on
//! `ScheduleConfig::default()` (64 KiB chunks, 4 in flight), each in a
//! process of its own; the line `bulk shares` gives each bulk tenant's
//! share of what they moved together, the worst one's error against its
//! weight's share, and what they moved.
//!
//! Flags (all optional):
//! `--probes N` latency-probe tenants (16 B, latency class; default 1),
//! `--msg-rate N` message-rate tenants (batches of 64 x 16 B; default 0),
//! `--bulk N` bulk tenants (default 16),
//! `--bulk-kib K` bulk message size (default 1024),
//! `--outstanding N` bulk messages in flight per tenant (default 4),
//! `--weights W,W,..` bulk weights, cycled (default all 1),
//! `--cap-gbps G` cap on each bulk tenant (default none),
//! `--link-gbps G` line rate (default 100),
//! `--link-mbps M` line rate in Mbit/s instead,
//! `--base-us U` delay from the last byte on the wire to the completion
//! (default 1.7),
//! `--separate` every tenant in a process of its own: no shared
//! scheduler, each bulk tenant's bytes in the NIC follow its own delay
//! window (the cross-process protection) instead,
//! `--latency-bound B` every tenant in a process of its own, held as the
//! verbs engine holds a queue pair under a policy's latency bound of `B`
//! bytes: the bound's pieces (the same bytes in flight as `--pieces` x
//! `--chunk-kib`, in more of them) and the bound's window, which keeps the
//! bound's queue allowance at the link's rate (the coordinator publishes
//! the rate; implies `--separate`),
//! `--jitter-us U` up to this much more before each completion reaches its
//! sender, drawn anew per piece (a host that wakes its senders late;
//! default 0),
//! `--spread-ppm P` with `--latency-bound`, the windows' wait after each
//! completion, up to `P` millionths of a piece's time on the wire
//! (`DelayWindowConfig::spread_ppm`; default 3000000), `--spread-from-us U`
//! only where a piece takes at least `U` us on the wire
//! (`DelayWindowConfig::spread_from`; default 500),
//! `--target-ppm P` with `--separate`, the windows' target queueing delay
//! as a share of the path's own delay (default 500000),
//! `--measured-rate` with `--latency-bound`, the rate published is the
//! coordinator's measure (the most the tenants moved together lately,
//! `SimConfig::measured_link_rate`) rather than the link's,
//! `--no-gains` with `--separate`, no coordinator: every window grows by
//! its weight alone (by default a coordinator sets gains on their growth
//! every 20 ms from what each tenant moved, `mtrdma_sched::share`),
//! `--nic-depth N` NIC queue depth in work requests without mtrdma
//! (default 16),
//! `--budget-kib K` with mtrdma, bulk bytes in the NIC (the engine's
//! budget, `SharedConfig::bulk_bytes_in_flight`; default 32),
//! `--pieces N` with mtrdma, pieces each queue pair may have in the NIC
//! (`ScheduleConfig::max_pieces_in_flight`; default 4),
//! `--chunk-kib K` scheduler chunk and quantum (default 8),
//! `--ms T` simulated milliseconds (default 20),
//! `--warmup-ms W` of which not measured at the start (default 1),
//! `--rows N` tenants shown (default 40).

#[path = "shared/args.rs"]
mod args;

use std::process::ExitCode;

use mtrdma::sched::sim::{run, Mode, Report, SimConfig, TenantReport, TenantSpec, Workload};
use mtrdma::sched::{DelayWindowConfig, Nanos, Protection, RateLimit, TenantId, TenantPolicy};

#[derive(Debug)]
struct Args {
    probes: u32,
    msg_rate: u32,
    bulk: u32,
    bulk_kib: u64,
    outstanding: u32,
    weights: Vec<u32>,
    cap_gbps: Option<u64>,
    link_bps: u64,
    base_ns: u64,
    separate: bool,
    latency_bound: Option<u64>,
    jitter_ns: u64,
    spread_ppm: Option<u32>,
    /// `--measured-rate`: the windows are told what the tenants moved,
    /// not the link's rate.
    measured_rate: bool,
    spread_from_ns: Option<u64>,
    gains: bool,
    warmup_ms: u64,
    target_ppm: u32,
    nic_depth: usize,
    budget_kib: u64,
    pieces: u32,
    chunk_kib: u64,
    ms: u64,
    rows: usize,
}

fn parse() -> Result<Args, String> {
    let mut a = Args {
        probes: 1,
        msg_rate: 0,
        bulk: 16,
        bulk_kib: 1024,
        outstanding: 4,
        weights: vec![1],
        cap_gbps: None,
        link_bps: 100_000_000_000,
        base_ns: 1_700,
        separate: false,
        latency_bound: None,
        jitter_ns: 0,
        spread_ppm: None,
        measured_rate: false,
        spread_from_ns: None,
        gains: true,
        warmup_ms: 1,
        target_ppm: 500_000,
        nic_depth: 16,
        budget_kib: 32,
        pieces: 4,
        chunk_kib: 8,
        ms: 20,
        rows: 40,
    };
    let mut it = args::Args::from_env();
    while let Some(flag) = it.next_flag(|v| format!("unexpected argument {v}"))? {
        if flag == "--help" || flag == "-h" {
            return Err(String::new());
        }
        if flag == "--separate" {
            a.separate = true;
            continue;
        }
        if flag == "--no-gains" {
            a.gains = false;
            continue;
        }
        if flag == "--measured-rate" {
            a.measured_rate = true;
            continue;
        }
        let value = it.value(&flag)?;
        let num = |v: &str| -> Result<u64, String> {
            v.parse::<u64>().map_err(|e| format!("{flag} {v}: {e}"))
        };
        // Microseconds (fractions allowed, at most a second) in ns.
        let nanos = |v: &str| -> Result<u64, String> {
            let us: f64 = v.parse().map_err(|e| format!("{flag} {v}: {e}"))?;
            if !(0.0..=1e6).contains(&us) {
                return Err(format!("{flag} {v}: 0 to 1000000 us"));
            }
            Ok((us * 1e3).round() as u64)
        };
        match flag.as_str() {
            "--probes" => a.probes = num(&value)? as u32,
            "--msg-rate" => a.msg_rate = num(&value)? as u32,
            "--bulk" => a.bulk = num(&value)? as u32,
            "--bulk-kib" => a.bulk_kib = num(&value)?,
            "--outstanding" => a.outstanding = num(&value)? as u32,
            "--weights" => {
                a.weights = value
                    .split(',')
                    .map(|w| num(w).map(|w| w as u32))
                    .collect::<Result<_, _>>()?;
            }
            "--cap-gbps" => a.cap_gbps = Some(num(&value)?),
            "--link-gbps" => a.link_bps = num(&value)?.saturating_mul(1_000_000_000),
            "--link-mbps" => a.link_bps = num(&value)?.saturating_mul(1_000_000),
            "--base-us" => a.base_ns = nanos(&value)?,
            "--latency-bound" => {
                a.latency_bound = Some(num(&value)?);
                a.separate = true;
            }
            "--jitter-us" => a.jitter_ns = nanos(&value)?,
            "--spread-ppm" => {
                a.spread_ppm = Some(
                    u32::try_from(num(&value)?)
                        .map_err(|_| format!("{flag} {value}: at most 4294967295"))?,
                )
            }
            "--spread-from-us" => a.spread_from_ns = Some(nanos(&value)?),
            "--target-ppm" => {
                a.target_ppm = u32::try_from(num(&value)?)
                    .map_err(|_| format!("{flag} {value}: at most 4294967295"))?
            }
            "--nic-depth" => a.nic_depth = num(&value)? as usize,
            "--budget-kib" => a.budget_kib = num(&value)?,
            "--pieces" => {
                a.pieces = u32::try_from(num(&value)?)
                    .map_err(|_| format!("{flag} {value}: at most 4294967295"))?
            }
            "--chunk-kib" => a.chunk_kib = num(&value)?,
            "--ms" => a.ms = num(&value)?,
            "--warmup-ms" => a.warmup_ms = num(&value)?,
            "--rows" => a.rows = num(&value)? as usize,
            other => return Err(format!("unknown flag {other}")),
        }
    }
    if a.weights.is_empty() {
        return Err("--weights needs at least one weight".into());
    }
    Ok(a)
}

fn us(n: Option<Nanos>) -> String {
    n.map_or_else(|| "-".to_string(), |n| format!("{:.2}", n.0 as f64 / 1e3))
}

fn cells(t: &TenantReport) -> String {
    format!(
        "{:>8.2} {:>9} {:>9} {:>9}",
        t.gbps,
        us(t.p50),
        us(t.p99),
        us(t.p999)
    )
}

fn main() -> ExitCode {
    let args = match parse() {
        Ok(a) => a,
        Err(e) => {
            if !e.is_empty() {
                eprintln!("error: {e}");
            }
            eprintln!("usage: simulate [--probes N] [--msg-rate N] [--bulk N] [--bulk-kib K] [--outstanding N] [--weights W,..] [--cap-gbps G] [--link-gbps G | --link-mbps M] [--base-us U] [--separate] [--latency-bound B] [--jitter-us U] [--spread-ppm P] [--spread-from-us U] [--measured-rate] [--target-ppm P] [--no-gains] [--nic-depth N] [--budget-kib K] [--pieces N] [--chunk-kib K] [--ms T] [--warmup-ms W] [--rows N]");
            return if e.is_empty() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            };
        }
    };
    let mut tenants = Vec::new();
    let mut id = 0u32;
    for _ in 0..args.probes {
        tenants.push(TenantSpec::probe(TenantId(id)));
        id += 1;
    }
    for _ in 0..args.msg_rate {
        tenants.push(TenantSpec::message_rate(TenantId(id)));
        id += 1;
    }
    for i in 0..args.bulk {
        let mut policy = TenantPolicy::weight(args.weights[i as usize % args.weights.len()]);
        if let Some(g) = args.cap_gbps {
            policy =
                policy.with_byte_cap(RateLimit::gbits_per_sec(g).with_burst(args.chunk_kib << 10));
        }
        tenants.push(TenantSpec {
            workload: Workload::Bulk {
                bytes: args.bulk_kib << 10,
                outstanding: args.outstanding,
            },
            ..TenantSpec::bulk(TenantId(id)).with_policy(policy)
        });
        id += 1;
    }
    // Under a latency bound, as the verbs engine holds a queue pair: the
    // bound's pieces (the same bytes in flight in more of them) and its
    // window, whose allowance is bytes at the link's published rate.
    let protection = match args.latency_bound.map(Protection::for_bound).transpose() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("error: --latency-bound: {e}");
            return ExitCode::FAILURE;
        }
    };
    let (chunk, pieces) = match &protection {
        Some(p) => (
            p.piece_for(args.chunk_kib << 10),
            p.pieces_for(args.pieces, args.chunk_kib << 10),
        ),
        None => (args.chunk_kib << 10, args.pieces),
    };
    let config = SimConfig {
        link_bps: args.link_bps,
        base_latency_ns: args.base_ns,
        nic_queue_depth: args.nic_depth,
        bulk_bytes_in_flight: args.budget_kib.saturating_mul(1 << 10),
        pieces_per_queue_pair: pieces,
        completion_jitter_ns: args.jitter_ns,
        duration: Nanos::from_millis(args.ms),
        warmup: Nanos::from_millis(args.warmup_ms),
        coordinator_every: if args.gains {
            SimConfig::default().coordinator_every
        } else {
            Nanos::ZERO
        },
        publish_link_rate: protection.is_some(),
        measured_link_rate: args.measured_rate,
        ..SimConfig::default()
    };
    let sched_config = mtrdma::sched::SchedulerConfig {
        chunk_bytes: chunk,
        quantum_bytes: chunk,
        ..SimConfig::scheduler_config()
    };
    let alone: Vec<TenantSpec> = tenants
        .iter()
        .copied()
        .filter(|t| !matches!(t.workload, Workload::Bulk { .. }))
        .collect();
    let protected = if let Some(p) = &protection {
        let window = p.window_config(None);
        Mode::Windowed(
            sched_config,
            DelayWindowConfig {
                spread_ppm: args.spread_ppm.unwrap_or(window.spread_ppm),
                spread_from: args.spread_from_ns.map_or(window.spread_from, Nanos),
                ..window
            },
        )
    } else if args.separate {
        // The model has no host noise (no sender wakes late), so the
        // target needs no floor: its share of the path's delay is enough.
        let window = DelayWindowConfig {
            target_ratio_ppm: args.target_ppm,
            target_floor: Nanos::ZERO,
            ..DelayWindowConfig::for_piece(args.chunk_kib << 10)
        };
        Mode::Windowed(sched_config, window)
    } else {
        Mode::Scheduled(sched_config)
    };
    let results = (|| -> Result<(Report, Report, Report), mtrdma::sched::sim::SimError> {
        Ok((
            run(&config, &alone, &Mode::Fifo)?,
            run(&config, &tenants, &Mode::Fifo)?,
            run(&config, &tenants, &protected)?,
        ))
    })();
    let (alone, without, with) = match results {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    println!(
        "one {} Gb/s port, NIC queue depth {}, {} ms ({} ms measured), {} tenants; latency in us",
        args.link_bps as f64 / 1e9,
        args.nic_depth,
        args.ms,
        args.ms - args.warmup_ms,
        tenants.len()
    );
    if let Some(p) = &protection {
        println!(
            "mtrdma: every tenant an engine of its own under a {} B latency bound: {} pieces of {} B per queue pair, windows keeping {} B queued, {}",
            p.bound_bytes,
            pieces,
            chunk,
            p.queue_bytes,
            if args.gains {
                "the coordinator's gains on their growth every 20 ms"
            } else {
                "no coordinator"
            }
        );
    } else if args.separate {
        println!(
            "mtrdma: every tenant an engine of its own, {} pieces of {} KiB per queue pair, delay windows, {}",
            args.pieces,
            args.chunk_kib,
            if args.gains {
                "the coordinator's gains on their growth every 20 ms"
            } else {
                "no coordinator"
            }
        );
    } else {
        println!(
            "mtrdma: one engine, bulk budget {} KiB, {} pieces of {} KiB per queue pair",
            args.budget_kib, args.pieces, args.chunk_kib
        );
    }
    println!(
        "{:>6} {:>8} {:>7} {:>6} | {:^37} | {:^37}",
        "tenant",
        "workload",
        "class",
        "weight",
        "without mtrdma (FIFO)",
        if args.separate {
            "mtrdma, separate processes"
        } else {
            "with mtrdma"
        }
    );
    println!(
        "{:>6} {:>8} {:>7} {:>6} | {:>8} {:>9} {:>9} {:>9} | {:>8} {:>9} {:>9} {:>9}",
        "", "", "", "", "Gb/s", "p50", "p99", "p99.9", "Gb/s", "p50", "p99", "p99.9"
    );
    for (w, s) in without.tenants.iter().zip(&with.tenants).take(args.rows) {
        println!(
            "{:>6} {:>8} {:>7} {:>6} | {} | {}",
            w.id.0,
            w.workload.name(),
            w.class.to_string(),
            w.weight,
            cells(w),
            cells(s)
        );
    }
    if tenants.len() > args.rows {
        println!("   ... {} more tenants", tenants.len() - args.rows);
    }
    println!(
        "{:>30} | {:>8.2} {:>29} | {:>8.2}",
        "total", without.total_gbps, "", with.total_gbps
    );
    println!(
        "{:>30} | {:>38.4} | {:>37.4}",
        "Jain's index (bulk, by weight)", without.jain_index, with.jain_index
    );
    // Each bulk tenant's share of what the bulk tenants moved, against
    // its weight's share: the figure `isolation --link --scenarios
    // weights` reports from the link.
    let bulk: Vec<&TenantReport> = with
        .tenants
        .iter()
        .filter(|t| matches!(t.workload, Workload::Bulk { .. }))
        .collect();
    let moved: u64 = bulk.iter().map(|t| t.bytes).sum();
    let weights: u64 = bulk.iter().map(|t| u64::from(t.weight)).sum();
    if !bulk.is_empty() && moved > 0 {
        let off = |t: &&TenantReport| {
            let share = t.bytes as f64 / moved as f64;
            let due = f64::from(t.weight) / weights as f64;
            (share / due - 1.0).abs()
        };
        let worst = bulk.iter().map(off).fold(0.0, f64::max);
        let shares: Vec<String> = bulk
            .iter()
            .map(|t| format!("{:.3}", t.bytes as f64 / moved as f64))
            .collect();
        println!(
            "{:>30} | {:>38} | {:>37}",
            "bulk shares (mtrdma)",
            "",
            format!(
                "{} ({:.1}% off; {:.1} Mbit/s)",
                shares.join(" "),
                worst * 100.0,
                bulk.iter().map(|t| t.gbps).sum::<f64>() * 1e3
            )
        );
    }
    for a in &alone.tenants {
        let (w, s) = (without.tenant(a.id), with.tenant(a.id));
        if let (Some(w), Some(s), Some(p)) = (w, s, a.p99) {
            let ratio = |x: Option<Nanos>| x.map_or(f64::NAN, |x| x.0 as f64 / p.0 as f64);
            println!(
                "tenant {} ({}) p99 alone {} us: {:.1}x without mtrdma, {:.2}x with",
                a.id.0,
                a.workload.name(),
                us(a.p99),
                ratio(w.p99),
                ratio(s.p99)
            );
        }
    }
    ExitCode::SUCCESS
}
