//! Scheduler cost per descriptor, against baselines measured in the same run.
//!
//! * `enqueue_dequeue/drr/N`: one descriptor enqueued and one dequeued
//!   through the composed `TenantScheduler` with N active tenants.
//! * `enqueue_dequeue/wfq_heap/N`: the same through a binary-heap weighted
//!   fair queue with virtual finish times (O(log N)).
//! * `rate_check/*`: our GCRA check against `governor`'s direct rate
//!   limiter `check`, both reading the TSC clock; plus our pure step in a
//!   compare-and-swap loop on an `AtomicU64` (what the shared-memory table
//!   does).
//!
//! `cargo bench --bench sched` (add `-- --quick` for a short run).

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::atomic::AtomicU64;

use criterion::{criterion_main, BenchmarkId, Criterion, Throughput};
use governor::{Quota, RateLimiter};
use mtrdma::core::gcra_shared;
use mtrdma::sched::compose::composed;
use mtrdma::sched::{
    Clock, Dequeue, Descriptor, Gcra, Nanos, Opcode, QuantaClock, RateLimit, Scheduler,
    SchedulerConfig, TenantId, TenantPolicy, TenantScheduler, TrafficClass,
};

const TENANT_COUNTS: [u32; 4] = [1, 64, 1_024, 65_536];
const BYTES: u64 = 4096;

fn descriptor(tenant: TenantId, handle: u64) -> Descriptor<u64> {
    Descriptor::new(tenant, TrafficClass::Bulk, Opcode::Write, BYTES, handle)
}

/// The baseline: weighted fair queueing with a binary heap ordered by
/// virtual finish time (start = max(virtual time, tenant's last finish)).
struct WfqHeap {
    heap: BinaryHeap<Reverse<(u64, u64, u32, u64)>>,
    last_finish: Vec<u64>,
    weight: Vec<u64>,
    virtual_time: u64,
    seq: u64,
}

impl WfqHeap {
    fn new(tenants: u32) -> Self {
        WfqHeap {
            heap: BinaryHeap::new(),
            last_finish: vec![0; tenants as usize],
            weight: vec![1; tenants as usize],
            virtual_time: 0,
            seq: 0,
        }
    }

    fn enqueue(&mut self, tenant: u32, bytes: u64, handle: u64) {
        let t = tenant as usize;
        let start = self.virtual_time.max(self.last_finish[t]);
        let finish = start + (bytes << 16) / self.weight[t];
        self.last_finish[t] = finish;
        self.seq += 1;
        self.heap.push(Reverse((finish, self.seq, tenant, handle)));
    }

    fn dequeue(&mut self) -> Option<(u32, u64)> {
        let Reverse((finish, _, tenant, handle)) = self.heap.pop()?;
        self.virtual_time = finish;
        Some((tenant, handle))
    }
}

fn enqueue_dequeue(c: &mut Criterion) {
    let mut group = c.benchmark_group("enqueue_dequeue");
    group.throughput(Throughput::Elements(1));
    for &n in &TENANT_COUNTS {
        let mut s = TenantScheduler::new(SchedulerConfig::default()).expect("valid config");
        for t in 0..n {
            s.set_policy(TenantId(t), TenantPolicy::weight(1 + t % 4))
                .expect("valid policy");
            s.enqueue(descriptor(TenantId(t), u64::from(t)), Nanos(0))
                .expect("tenant is known");
        }
        group.bench_with_input(BenchmarkId::new("drr", n), &n, |b, _| {
            b.iter(|| {
                let Dequeue::Ready(g) = s.dequeue(Nanos(0)) else {
                    unreachable!("every tenant stays backlogged")
                };
                s.enqueue(descriptor(g.tenant, g.handle), Nanos(0))
                    .expect("tenant is known");
                black_box(g.handle)
            })
        });

        let mut pieces = composed::<u64>(&SchedulerConfig::default()).expect("valid config");
        for t in 0..n {
            pieces
                .set_policy(TenantId(t), TenantPolicy::weight(1 + t % 4))
                .expect("valid policy");
            pieces
                .enqueue(descriptor(TenantId(t), u64::from(t)), Nanos(0))
                .expect("tenant is known");
        }
        group.bench_with_input(BenchmarkId::new("composed", n), &n, |b, _| {
            b.iter(|| {
                let Dequeue::Ready(g) = pieces.dequeue(Nanos(0)) else {
                    unreachable!("every tenant stays backlogged")
                };
                pieces
                    .enqueue(descriptor(g.tenant, g.handle), Nanos(0))
                    .expect("tenant is known");
                black_box(g.handle)
            })
        });

        let mut wfq = WfqHeap::new(n);
        for t in 0..n {
            wfq.weight[t as usize] = u64::from(1 + t % 4);
            wfq.enqueue(t, BYTES, u64::from(t));
        }
        group.bench_with_input(BenchmarkId::new("wfq_heap", n), &n, |b, _| {
            b.iter(|| {
                let (t, h) = wfq.dequeue().expect("every tenant stays backlogged");
                wfq.enqueue(t, BYTES, h);
                black_box(h)
            })
        });
    }
    group.finish();
}

fn rate_check(c: &mut Criterion) {
    let mut group = c.benchmark_group("rate_check");
    group.throughput(Throughput::Elements(1));
    let per_second = 1_000_000_000u32;

    let clock = QuantaClock::new();
    let mut ours = Gcra::new(RateLimit::per_second(u64::from(per_second)).with_burst(1_000))
        .expect("valid rate");
    group.bench_function("gcra", |b| {
        b.iter(|| black_box(ours.check(clock.now(), 1).is_ok()))
    });

    let tat = AtomicU64::new(0);
    let interval = ours.interval();
    let tolerance = ours.tolerance().0;
    group.bench_function("gcra_atomic_cas", |b| {
        b.iter(|| black_box(gcra_shared(&tat, clock.now().0, 1, interval, tolerance).is_ok()))
    });

    let quota = Quota::per_second(NonZeroU32::new(per_second).expect("non-zero"))
        .allow_burst(NonZeroU32::new(1_000).expect("non-zero"));
    let limiter = RateLimiter::direct(quota);
    group.bench_function("governor", |b| {
        b.iter(|| black_box(limiter.check().is_ok()))
    });
    group.finish();
}

/// Runs every group (written out rather than with `criterion_group!`, whose
/// generated public function has no doc comment).
fn benches() {
    let mut c = Criterion::default().configure_from_args();
    enqueue_dequeue(&mut c);
    rate_check(&mut c);
}

criterion_main!(benches);
