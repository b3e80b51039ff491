//! Control-path admission and the shared rate limit, against baselines
//! measured in the same run.
//!
//! * `admission/qp_acquire_release`: admit one queue pair against the
//!   tenant's quota and give it back (a compare-and-swap and an atomic
//!   subtract on the tenant's shared counter, plus the calling thread's lane
//!   of the process slot for reclamation), on a table in POSIX shared
//!   memory.
//! * `admission/mr_acquire_release`: the same for memory-region bytes.
//! * `admission/floor_cas_plus_fetch_sub`: the baseline: one
//!   compare-and-swap and one atomic subtract on a word, the least any
//!   exact shared counter costs.
//! * `shared_rate/table_check_rate`: one data-path rate decision through
//!   the quota table (a read of the table's shared clock, a
//!   policy-generation check, one CAS on the tenant's shared TAT), as every
//!   process of a tenant does.
//! * `shared_rate/clock_*`: the clocks alone: `CLOCK_MONOTONIC` through the
//!   vDSO, and the table's shared TSC clock.
//! * `shared_rate/governor`: `governor`'s direct rate limiter `check`, same
//!   rate and burst (one process only).
//!
//! * `coordinator_view/usage`: the per-tenant view a coordinator prints
//!   every second (usage, processes counted per tenant), on a table of
//!   4,096 tenants with 4,096 live process slots; against
//!   `coordinator_view/reclaim_scan`, one pass over the process slots
//!   (what finding dead processes reads, without the `/proc` reads). The
//!   view costs about one such pass plus one read per tenant, not one
//!   pass per tenant.
//!
//! `cargo bench --bench core` (add `-- --quick` for a short run).

use std::hint::black_box;
use std::num::NonZeroU32;

use criterion::measurement::WallTime;
use criterion::{criterion_main, BenchmarkGroup, Criterion, Throughput};
use governor::{Quota, RateLimiter};
use mtrdma::core::clock::monotonic_ns;
use mtrdma::core::{
    LinkConfig, Policy, QuotaTable, RateLimit, TenantEntry, TenantHandle, TenantId,
};

const RATE: u32 = 1_000_000_000;
const BURST: u32 = 1_000;

fn table(tag: &str) -> (String, QuotaTable) {
    let name = format!("bench-{tag}-{}", std::process::id());
    let tenant = TenantEntry::new(TenantId(1), "bench")
        .with_max_qps(1_000)
        .with_max_mr_bytes(1 << 40)
        .with_rate(RateLimit::new(u64::from(RATE), u64::from(BURST)));
    let policy = Policy::new(LinkConfig::new(12_500_000_000), vec![tenant]);
    let table = QuotaTable::create(&name, 16, 16, &policy)
        .expect("create a shared table")
        .table();
    (name, table)
}

/// Runs `benches` in the group `group` (one element an iteration) with
/// the tenant of a shared table of its own, then removes the table.
fn with_tenant(
    c: &mut Criterion,
    tag: &str,
    group: &str,
    benches: impl FnOnce(&mut BenchmarkGroup<'_, WallTime>, &TenantHandle),
) {
    let (name, table) = table(tag);
    let tenant = table.attach(TenantId(1)).expect("attach");
    let mut group = c.benchmark_group(group);
    group.throughput(Throughput::Elements(1));
    benches(&mut group, &tenant);
    group.finish();
    drop(tenant);
    drop(table);
    let _ = QuotaTable::remove(&name);
}

fn admission(c: &mut Criterion) {
    with_tenant(c, "admission", "admission", |group, tenant| {
        group.bench_function("qp_acquire_release", |b| {
            b.iter(|| drop(black_box(tenant.acquire_qp().expect("within quota"))))
        });
        group.bench_function("mr_acquire_release", |b| {
            b.iter(|| drop(black_box(tenant.acquire_mr(4096).expect("within quota"))))
        });
        // The floor: the two atomic read-modify-writes any exact shared
        // counter needs (one to take, one to give back), and nothing else.
        let word = std::sync::atomic::AtomicU64::new(0);
        group.bench_function("floor_cas_plus_fetch_sub", |b| {
            b.iter(|| {
                use std::sync::atomic::Ordering::{AcqRel, Relaxed};
                let v = word.load(Relaxed);
                let _ = black_box(word.compare_exchange(v, v + 1, AcqRel, Relaxed));
                black_box(word.fetch_sub(1, AcqRel))
            })
        });
    });
}

fn shared_rate(c: &mut Criterion) {
    with_tenant(c, "rate", "shared_rate", |group, tenant| {
        group.bench_function("table_check_rate", |b| {
            b.iter(|| black_box(tenant.check_rate(tenant.now_ns(), 1, 0).is_ok()))
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
        group.bench_function("clock_table_now_ns", |b| {
            b.iter(|| black_box(tenant.now_ns()))
        });
    });
}

fn coordinator_view(c: &mut Criterion) {
    const N: u32 = 4_096;
    let tenants = (1..=N)
        .map(|i| TenantEntry::new(TenantId(i), format!("t{i}")))
        .collect();
    let policy = Policy::new(LinkConfig::new(12_500_000_000), tenants);
    let table = QuotaTable::embedded_with_capacity(&policy, N, N).expect("a table of 4,096");
    // Every process slot live, spread over the tenants (identities made
    // up: nothing here reclaims).
    for p in 0..N {
        let process = mtrdma::core::procinfo::ProcessId {
            pid: 4_000_000 + p,
            start_time: u64::from(p),
        };
        table
            .claim_process_slot(TenantId(p % N + 1), process)
            .expect("a free slot");
    }
    let mut group = c.benchmark_group("coordinator_view");
    group.bench_function("usage", |b| {
        b.iter(|| black_box(table.usage().expect("usage").len()))
    });
    group.bench_function("reclaim_scan", |b| {
        b.iter(|| black_box(table.live_process_count()))
    });
    group.finish();
}

/// Runs every group (written out rather than with `criterion_group!`, whose
/// generated public function has no doc comment).
fn benches() {
    let mut c = Criterion::default().configure_from_args();
    admission(&mut c);
    shared_rate(&mut c);
    coordinator_view(&mut c);
}

criterion_main!(benches);
