//! Tests of `compose`.

use super::*;
use crate::descriptor::Opcode;
use crate::RateLimit;
use crate::TenantScheduler;

/// A deterministic mix: three tenants, both classes, all opcodes, sizes
/// from 0 to 300 KiB, posted in bursts between dequeues.
fn workload() -> Vec<Vec<Descriptor<u64>>> {
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut handle = 0;
    (0..200)
        .map(|_| {
            (0..next() % 4)
                .map(|_| {
                    let r = next();
                    let tenant = TenantId(1 + (r % 3) as u32);
                    let class = if r % 5 == 0 {
                        TrafficClass::Latency
                    } else {
                        TrafficClass::Bulk
                    };
                    let op = [Opcode::Send, Opcode::Write, Opcode::Read][(r >> 8) as usize % 3];
                    handle += 1;
                    let d = Descriptor::new(tenant, class, op, (r >> 16) % (300 << 10), handle);
                    if r % 7 == 0 {
                        d.whole()
                    } else {
                        d
                    }
                })
                .collect()
        })
        .collect()
}

fn config() -> SchedulerConfig {
    SchedulerConfig {
        chunk_bytes: 16 << 10,
        quantum_bytes: 32 << 10,
        bulk_min_share_ppm: 200_000,
        ..SchedulerConfig::default()
    }
}

/// Runs `workload` through `s`, `per_round` dequeues after each burst,
/// then everything left; returns the grants.
fn grants<S: Scheduler<u64>>(mut s: S, per_round: usize, step: u64) -> Vec<Grant<u64>> {
    for (t, w) in [(1, 1), (2, 2), (3, 4)] {
        s.set_policy(TenantId(t), TenantPolicy::weight(w)).unwrap();
    }
    let mut now = 0;
    let mut out = Vec::new();
    let mut take = |s: &mut S, now: &mut u64, n: usize| {
        for _ in 0..n {
            *now += step;
            match s.dequeue(Nanos(*now)) {
                Dequeue::Ready(g) => out.push(g),
                Dequeue::Wait(at) => *now = at.0,
                Dequeue::Empty => break,
            }
        }
    };
    for burst in workload() {
        for d in burst {
            s.enqueue(d, Nanos(now)).unwrap();
        }
        take(&mut s, &mut now, per_round);
    }
    take(&mut s, &mut now, usize::MAX);
    assert!(s.is_empty());
    out
}

#[test]
fn composed_without_caps_grants_what_the_built_in_scheduler_grants() {
    for per_round in [1, 3, 50] {
        let built_in = grants(TenantScheduler::new(config()).unwrap(), per_round, 10);
        let pieces = grants(composed::<u64>(&config()).unwrap(), per_round, 10);
        assert!(built_in.len() > 500);
        assert_eq!(built_in, pieces, "{per_round} dequeues per burst");
    }
}

#[test]
fn shaped_tenants_keep_their_caps_and_every_byte_arrives_once_in_order() {
    let mut s = composed::<u64>(&config()).unwrap();
    // 100 MB/s with a 16 KiB burst, and 2,000 requests/s.
    let cap = TenantPolicy::weight(1)
        .with_byte_cap(RateLimit::per_second(100_000_000).with_burst(16 << 10))
        .with_wr_cap(RateLimit::per_second(2_000).with_burst(2));
    s.set_policy(TenantId(1), cap).unwrap();
    s.set_policy(TenantId(2), TenantPolicy::weight(1)).unwrap();
    let mut sent: std::collections::HashMap<u64, (u64, u64)> = Default::default();
    for h in 0..64u64 {
        let tenant = TenantId(1 + (h % 2) as u32);
        let bytes = 1 + h * 5_000;
        sent.insert(h, (bytes, 0));
        s.enqueue(
            Descriptor::new(tenant, TrafficClass::Bulk, Opcode::Write, bytes, h),
            Nanos(0),
        )
        .unwrap();
    }
    let (mut now, mut capped_bytes, mut capped_wrs, mut last) = (0u64, 0u64, 0u64, 0u64);
    loop {
        match s.dequeue(Nanos(now)) {
            Dequeue::Ready(g) => {
                let (bytes, got) = sent.get_mut(&g.handle).unwrap();
                assert_eq!(g.offset, *got, "pieces in order");
                *got += g.len;
                assert_eq!(g.is_last, *got == *bytes);
                if g.tenant == TenantId(1) {
                    capped_bytes += g.len;
                    capped_wrs += 1;
                    last = now;
                }
            }
            Dequeue::Wait(at) => now = at.0,
            Dequeue::Empty => break,
        }
    }
    assert!(sent.values().all(|(bytes, got)| bytes == got));
    assert!(s.is_empty());
    // Within the caps: bytes within one burst of 100 MB/s, requests
    // within two of 2,000/s, over the time the tenant took.
    let secs = last as f64 / 1e9;
    assert!(capped_bytes as f64 <= 100e6 * secs + f64::from(16u32 << 10) + 16_384.0);
    assert!(capped_wrs as f64 <= 2_000.0 * secs + 3.0);
    // And not far below them: the caps are what held it back.
    assert!(capped_bytes as f64 >= 0.9 * 100e6 * secs || capped_wrs as f64 >= 0.9 * 2_000.0 * secs);
}

#[test]
fn pieces_compose_with_others() {
    // Latency in arrival order, bulk by weight.
    let mut s = Priority::new(
        crate::FifoScheduler::new(),
        Drr::new(&config()).unwrap(),
        0,
        32 << 10,
    )
    .unwrap();
    s.set_policy(TenantId(1), TenantPolicy::weight(1)).unwrap();
    let d = |class, h| Descriptor::new(TenantId(1), class, Opcode::Send, 64, h);
    s.enqueue(d(TrafficClass::Bulk, 1), Nanos(0)).unwrap();
    s.enqueue(d(TrafficClass::Latency, 2), Nanos(0)).unwrap();
    s.enqueue(d(TrafficClass::Latency, 3), Nanos(0)).unwrap();
    let order: Vec<u64> =
        std::iter::from_fn(|| s.dequeue(Nanos(0)).ready().map(|g| g.handle)).collect();
    assert_eq!(order, [2, 3, 1]);
    assert!(matches!(
        Priority::new(
            Drr::<u8>::new(&config()).unwrap(),
            Drr::<u8>::new(&config()).unwrap(),
            1_000_000,
            1
        ),
        Err(ConfigError::BulkShareTooLarge { .. })
    ));
}
