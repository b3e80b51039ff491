//! What the built-in scheduling policy costs on the data path when it is
//! built from pieces (`mtrdma_sched::compose`: caps, latency priority and
//! DRR, plugged in through the `Scheduler` trait, statically dispatched)
//! instead of the fused built-in `TenantScheduler`.
//!
//! Both run on a queue pair with a scheduler of its own over the null sink
//! (`mtrdma_verbs::testing`), every request through the scheduler: 64 B RDMA
//! WRITEs in two 32 B pieces, so none takes the fast path. Paired rounds:
//! the two run alternately, 200,000 requests each per round, 31 rounds; the
//! median of the per-round differences is the figure, judged against the
//! target of at most 5 ns per request.
//!
//! `cargo bench --bench compose` (apart from `benches/verbs.rs`, so that
//! the code added here does not change how that binary's paths are
//! compiled).

use std::hint::black_box;
use std::time::Instant;

use mtrdma::core::{TenantId, TrafficClass};
use mtrdma::sched::compose::composed;
use mtrdma::sched::{SchedulerConfig, TenantScheduler};
use mtrdma::verbs::testing::{self, HeapRegion, HostCompletion, NullSink};
use mtrdma::verbs::{PieceScheduler, RemoteRegion, ScheduleConfig, SendOp};

const BYTES: usize = 64;
const PIECE: u64 = 32;
const DEPTH: u32 = 128;
const REMOTE: RemoteRegion = RemoteRegion {
    addr: 0x1000,
    len: 1 << 20,
    rkey: 7,
};
const TARGET_NS: f64 = 5.0;
const ROUNDS: usize = 31;
const ROUND_WRS: u32 = 200_000;

/// One WRITE through `qp`, and its completion.
fn write<Q: PieceScheduler>(
    qp: &mut testing::NullScheduled<Q>,
    region: HeapRegion,
    out: &mut Vec<HostCompletion>,
) -> HeapRegion {
    if qp
        .post_send(SendOp::Write(REMOTE), region, 0..BYTES, 1)
        .is_err()
    {
        panic!("the scheduler accepts every post");
    }
    loop {
        qp.poll(out).expect("null poll");
        if let Some(c) = out.pop() {
            return c.region;
        }
    }
}

fn main() {
    // criterion's `--bench` runs this; listing or testing the benches
    // runs nothing.
    let args: Vec<String> = std::env::args().collect();
    if args.iter().any(|a| a == "--list" || a == "--test") {
        return;
    }
    let config = SchedulerConfig {
        chunk_bytes: PIECE,
        quantum_bytes: PIECE,
        ..SchedulerConfig::default()
    };
    let schedule = ScheduleConfig {
        chunk_bytes: PIECE,
        ..ScheduleConfig::local(TenantId(0), TrafficClass::Bulk)
    };
    let built_in = TenantScheduler::new(config.clone()).expect("valid configuration");
    let mut fused = testing::scheduled_with(NullSink::new(1, DEPTH), schedule.clone(), built_in)
        .expect("a scheduler of its own");
    let pieces = composed(&config).expect("valid configuration");
    let mut composed = testing::scheduled_with(NullSink::new(1, DEPTH), schedule, pieces)
        .expect("a scheduler of its own");
    let mut out = Vec::with_capacity(64);
    let mut region = Some(HeapRegion::new(BYTES));
    let mut time = |f: &mut dyn FnMut(HeapRegion) -> HeapRegion| {
        let start = Instant::now();
        for _ in 0..ROUND_WRS {
            let r = region.take().expect("region back");
            region = Some(black_box(f(r)));
        }
        start.elapsed().as_nanos() as f64 / f64::from(ROUND_WRS)
    };
    let (mut f, mut c, mut added) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..=ROUNDS {
        // Which goes first alternates, so that neither always finds the
        // caches as the other left them.
        let (fused_ns, composed_ns) = if round % 2 == 0 {
            let f = time(&mut |r| write(&mut fused, r, &mut out));
            (f, time(&mut |r| write(&mut composed, r, &mut out)))
        } else {
            let c = time(&mut |r| write(&mut composed, r, &mut out));
            (time(&mut |r| write(&mut fused, r, &mut out)), c)
        };
        if round == 0 {
            continue; // warm-up
        }
        f.push(fused_ns);
        c.push(composed_ns);
        added.push(composed_ns - fused_ns);
    }
    let q = |v: &mut Vec<f64>, p: f64| {
        v.sort_by(f64::total_cmp);
        v[((v.len() - 1) as f64 * p).round() as usize]
    };
    let median = q(&mut added, 0.5);
    println!(
        "paired rounds, every request through the scheduler ({ROUNDS} x {ROUND_WRS}): \
         built-in {:.1} ns, composed of pieces {:.1} ns (medians)",
        q(&mut f, 0.5),
        q(&mut c, 0.5)
    );
    println!(
        "  composed adds {median:.1} ns (median; quartiles {:.1} to {:.1})",
        q(&mut added, 0.25),
        q(&mut added, 0.75)
    );
    let verdict = if median <= TARGET_NS {
        "met"
    } else {
        "NOT met"
    };
    println!("  target: composed adds at most {TARGET_NS} ns: {verdict} ({median:.1} ns)");
}
