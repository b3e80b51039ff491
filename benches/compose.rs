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

#[allow(dead_code)]
mod common;

use mtrdma::core::{TenantId, TrafficClass};
use mtrdma::sched::compose::composed;
use mtrdma::sched::{SchedulerConfig, TenantScheduler};
use mtrdma::verbs::testing::{self, NullSink};
use mtrdma::verbs::ScheduleConfig;

use common::{scheduled as write, Report, DEPTH};

const PIECE: u64 = 32;
const TARGET_NS: f64 = 5.0;
const ROUND_WRS: u32 = 200_000;

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
    let report = Report {
        title: ["paired rounds, every request through the scheduler ", ""],
        names: ["built-in", "composed of pieces", "composed"],
        range: false,
        target: TARGET_NS,
    };
    // Which goes first alternates, so that neither always finds the
    // caches as the other left them.
    report.run(
        ROUND_WRS,
        true,
        &mut |r, out| write(&mut fused, r, out),
        &mut |r, out| write(&mut composed, r, out),
    );
}
