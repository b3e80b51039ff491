//! Control-path admission and the shared rate limit, against baselines
//! measured in the same run.
//!
//! * `admission/qp_acquire_release`: admit one queue pair against the
//!   tenant's quota and give it back (two compare-and-swaps on the tenant's
//!   shared counter plus the process slot's count), on a table in POSIX
//!   shared memory.
//! * `admission/mr_acquire_release`: the same for memory-region bytes.
//! * `shared_rate/table_check_rate`: one data-path rate decision through
//!   the quota table (CLOCK_MONOTONIC read, policy-generation check, one CAS
//!   on the tenant's shared TAT), as every process of a tenant does.
//! * `shared_rate/governor`: `governor`'s direct rate limiter `check`, same
//!   rate and burst (one process only).
//!
//! `cargo bench --bench core` (add `-- --quick` for a short run).

use std::hint::black_box;
use std::num::NonZeroU32;

use criterion::{criterion_main, Criterion, Throughput};
use governor::{Quota, RateLimiter};
use mtrdma::core::clock::monotonic_ns;
use mtrdma::core::{LinkConfig, Policy, QuotaTable, RateCap, TenantId, TenantPolicy};

const RATE: u32 = 1_000_000_000;
const BURST: u32 = 1_000;

fn table(tag: &str) -> (String, QuotaTable) {
    let name = format!("bench-{tag}-{}", std::process::id());
    let tenant = TenantPolicy::new(TenantId(1), "bench")
        .with_max_qps(1_000)
        .with_max_mr_bytes(1 << 40)
        .with_rate(RateCap::new(u64::from(RATE), u64::from(BURST)));
    let policy = Policy::new(LinkConfig::new(12_500_000_000), vec![tenant]);
    let table = QuotaTable::create(&name, 16, 16, &policy).expect("create a shared table");
    (name, table)
}

fn admission(c: &mut Criterion) {
    let (name, table) = table("admission");
    let tenant = table.attach(TenantId(1)).expect("attach");
    let mut group = c.benchmark_group("admission");
    group.throughput(Throughput::Elements(1));
    group.bench_function("qp_acquire_release", |b| {
        b.iter(|| drop(black_box(tenant.acquire_qp().expect("within quota"))))
    });
    group.bench_function("mr_acquire_release", |b| {
        b.iter(|| drop(black_box(tenant.acquire_mr(4096).expect("within quota"))))
    });
    group.finish();
    drop(tenant);
    drop(table);
    let _ = QuotaTable::remove(&name);
}

fn shared_rate(c: &mut Criterion) {
    let (name, table) = table("rate");
    let tenant = table.attach(TenantId(1)).expect("attach");
    let mut group = c.benchmark_group("shared_rate");
    group.throughput(Throughput::Elements(1));
    group.bench_function("table_check_rate", |b| {
        b.iter(|| black_box(tenant.check_rate(monotonic_ns(), 1, 0).is_ok()))
    });
    let quota = Quota::per_second(NonZeroU32::new(RATE).expect("non-zero"))
        .allow_burst(NonZeroU32::new(BURST).expect("non-zero"));
    let limiter = RateLimiter::direct(quota);
    group.bench_function("governor", |b| {
        b.iter(|| black_box(limiter.check().is_ok()))
    });
    group.bench_function("clock_monotonic_ns", |b| {
        b.iter(|| black_box(monotonic_ns()))
    });
    let clock = quanta::Clock::new();
    group.bench_function("clock_quanta", |b| b.iter(|| black_box(clock.now())));
    group.finish();
    drop(tenant);
    drop(table);
    let _ = QuotaTable::remove(&name);
}

/// Runs every group (written out rather than with `criterion_group!`, whose
/// generated public function has no doc comment).
fn benches() {
    let mut c = Criterion::default().configure_from_args();
    admission(&mut c);
    shared_rate(&mut c);
}

criterion_main!(benches);
