//! Cost of the data path on the host, per work request, up to the point
//! where the provider's `ibv_post_send` would be called (and from where its
//! `ibv_poll_cq` would return), against a null sink that takes each work
//! request into a ring and completes it at the next poll. No RDMA device
//! is needed: the code measured is the library's own, run against
//! `mtrdma_verbs::testing::NullSink` through the same seam as a real queue
//! pair.
//!
//! Each iteration posts one 64 B RDMA WRITE and polls until its completion
//! has handed the region back:
//!
//! * `verbs/direct`: [`QueuePair::post_send`] and [`QueuePair::poll`]'s
//!   work: bounds check, the region parked in a slab under its `wr_id`,
//!   the `ibv_send_wr` built; at the poll, the slot found again and the
//!   completion built.
//! * `verbs/scheduled`: [`ScheduledQueuePair`] on a scheduler of its own
//!   (what [`QueuePair::scheduled`] gives): the engine's lock, the request
//!   stored as a message, the fast-path decision, the piece queued for and
//!   posted by its queue pair, then at the poll the piece matched to its
//!   request and the request finished.
//! * `verbs/shared8`: the same on one [`SharedScheduler`] with 8 queue
//!   pairs of 8 different tenants, posted to in turn.
//! * `verbs/scheduled_quota`: `scheduled` with a tenant handle from an
//!   embedded quota table: the tenant's shared rate limit is checked and
//!   its demand and posted bytes are accounted for on every work request.
//!
//! After the groups, a summary gives each case's time per work request
//! (criterion's estimate) and what the scheduled cases add to `direct`.
//! The target, `scheduled` adds at most 50 ns, is then judged on paired
//! rounds: `direct` and `scheduled` run alternately, 200,000 work requests
//! each per round, 31 rounds, and the median of the per-round differences
//! is the figure (the machine's drift between criterion's groups, often
//! 10 ns or more here, cancels out of a difference taken round by round).
//!
//! `cargo bench --bench verbs` (add `-- --quick` for a short run).
//!
//! [`QueuePair::post_send`]: mtrdma::verbs::QueuePair::post_send
//! [`QueuePair::poll`]: mtrdma::verbs::QueuePair::poll
//! [`QueuePair::scheduled`]: mtrdma::verbs::QueuePair::scheduled
//! [`ScheduledQueuePair`]: mtrdma::verbs::ScheduledQueuePair
//! [`SharedScheduler`]: mtrdma::verbs::SharedScheduler

#[allow(dead_code)]
mod common;

use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use criterion::{criterion_main, Criterion, Throughput};
use mtrdma::core::{
    LinkConfig, Policy, QuotaTable, RateLimit, TenantEntry, TenantId, TrafficClass,
};
use mtrdma::verbs::testing::{self, HeapRegion, HostCompletion, NullScheduler, NullSink};
use mtrdma::verbs::{ScheduleConfig, SendOp, SharedConfig};

use common::{scheduled, Report, BYTES, DEPTH, REMOTE};

/// The case names, in the order of the summary.
const CASES: [&str; 4] = ["direct", "scheduled", "shared8", "scheduled_quota"];
/// What the scheduled path may add to the direct one, per work request.
const TARGET_NS: f64 = 50.0;
/// Work requests per path per round of the paired rounds.
const ROUND_WRS: u32 = 200_000;

/// One WRITE through the direct path, and its completion.
/// Scheduled as tenant 0, bulk, by the scheduler alone.
fn bulk0() -> ScheduleConfig {
    ScheduleConfig::local(TenantId(0), TrafficClass::Bulk)
}

fn direct(sink: &mut NullSink, region: HeapRegion, out: &mut Vec<HostCompletion>) -> HeapRegion {
    let write = SendOp::Write(REMOTE);
    if sink.post_send(write, region, 0..BYTES, 1).is_err() {
        panic!("the null sink takes every post");
    }
    sink.poll(out).expect("null poll");
    out.pop().expect("completed at the first poll").region
}

fn data_path(c: &mut Criterion) {
    let mut group = c.benchmark_group("verbs");
    group.throughput(Throughput::Elements(1));
    let mut out = Vec::with_capacity(64);

    let mut sink = NullSink::new(1, DEPTH);
    let mut region = Some(HeapRegion::new(BYTES));
    group.bench_function(CASES[0], |b| {
        b.iter(|| {
            let r = region.take().expect("region back");
            region = Some(black_box(direct(&mut sink, r, &mut out)));
        })
    });

    let mut qp =
        testing::scheduled(NullSink::new(1, DEPTH), bulk0()).expect("a scheduler of its own");
    group.bench_function(CASES[1], |b| {
        b.iter(|| {
            let r = region.take().expect("region back");
            region = Some(black_box(scheduled(&mut qp, r, &mut out)));
        })
    });
    drop(qp);

    let shared = NullScheduler::new(SharedConfig::default()).expect("a shared scheduler");
    let mut qps: Vec<_> = (0..8u32)
        .map(|i| {
            let config = ScheduleConfig::local(TenantId(i + 1), TrafficClass::Bulk);
            let qp = shared
                .attach(NullSink::new(i + 1, DEPTH), config)
                .expect("attach");
            (qp, Some(HeapRegion::new(BYTES)))
        })
        .collect();
    let mut turn = 0;
    group.bench_function(CASES[2], |b| {
        b.iter(|| {
            let (qp, region) = &mut qps[turn % 8];
            turn += 1;
            let r = region.take().expect("region back");
            *region = Some(black_box(scheduled(qp, r, &mut out)));
        })
    });
    drop(qps);

    let tenant = TenantEntry::new(TenantId(1), "bench")
        .with_rate(RateLimit::new(1 << 40, 1 << 30))
        .with_max_qps(1_000)
        .with_max_mr_bytes(1 << 40);
    let policy = Policy::new(LinkConfig::new(1 << 40), vec![tenant]);
    let table = QuotaTable::embedded(&policy).expect("an embedded quota table");
    let handle = table.attach(TenantId(1)).expect("attach the tenant");
    let sink = NullSink::new(1, DEPTH).with_tenant(handle);
    let mut qp = testing::scheduled(sink, ScheduleConfig::default()).expect("with its tenant");
    group.bench_function(CASES[3], |b| {
        b.iter(|| {
            let r = region.take().expect("region back");
            region = Some(black_box(scheduled(&mut qp, r, &mut out)));
        })
    });
    drop(qp);
    group.finish();
}

/// Where criterion keeps its estimates (set explicitly, so the summary
/// finds them): `$CRITERION_HOME`, `$CARGO_TARGET_DIR/criterion`, or
/// `target/criterion` of the workspace.
fn output_directory() -> PathBuf {
    if let Some(home) = std::env::var_os("CRITERION_HOME") {
        return home.into();
    }
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(target) => Path::new(&target).join("criterion"),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("target/criterion"),
    }
}

/// Criterion's estimate of one case's time per iteration, in ns: the slope
/// (what it prints as `time`) or, without one, the mean. Only estimates
/// written by this run (`since`) count.
fn estimate(dir: &Path, case: &str, since: SystemTime) -> Option<f64> {
    let path = dir.join("verbs").join(case).join("new/estimates.json");
    let modified = std::fs::metadata(&path).ok()?.modified().ok()?;
    if modified < since {
        return None;
    }
    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).ok()?).ok()?;
    ["slope", "mean"]
        .iter()
        .find_map(|k| json[k]["point_estimate"].as_f64())
}

fn summary(dir: &Path, since: SystemTime) {
    let ns: Vec<Option<f64>> = CASES.iter().map(|c| estimate(dir, c, since)).collect();
    let direct = ns[0];
    println!("\nper work request (64 B WRITE, post + completion, null sink):");
    for (case, ns) in CASES.iter().zip(&ns) {
        let Some(ns) = *ns else { continue };
        match direct {
            Some(d) if *case != CASES[0] => {
                println!(
                    "  {case:<16} {ns:>7.1} ns   adds {:>6.1} ns to direct",
                    ns - d
                )
            }
            _ => println!("  {case:<16} {ns:>7.1} ns"),
        }
    }
}

/// Runs `direct` and `scheduled` alternately and prints what `scheduled`
/// adds: the median, quartiles and extremes of the per-round differences.
fn paired() {
    let report = Report {
        title: ["\npaired rounds ", " work requests per path"],
        names: ["direct", "scheduled", "scheduled"],
        range: true,
        target: TARGET_NS,
    };
    let mut sink = NullSink::new(1, DEPTH);
    let mut qp =
        testing::scheduled(NullSink::new(1, DEPTH), bulk0()).expect("a scheduler of its own");
    report.run(
        ROUND_WRS,
        false,
        &mut |r, out| direct(&mut sink, r, out),
        &mut |r, out| scheduled(&mut qp, r, out),
    );
}

/// Runs the group, then the summary (written out rather than with
/// `criterion_group!`, whose generated public function has no doc comment).
fn benches() {
    let dir = output_directory();
    let since = SystemTime::now();
    let mut c = Criterion::default()
        .output_directory(&dir)
        .configure_from_args();
    data_path(&mut c);
    summary(&dir, since);
    // Not when criterion only lists or tests the benches, or profiles.
    let args: Vec<String> = std::env::args().collect();
    let has = |flag: &str| args.iter().any(|a| a == flag);
    if has("--bench") && !has("--list") && !has("--profile-time") {
        paired();
    }
}

criterion_main!(benches);
