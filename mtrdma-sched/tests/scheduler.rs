//! The composed scheduler on a simulated link, in virtual time.
//!
//! A tiny link model drives the scheduler: whenever the link is free it asks
//! for the next piece, and the piece occupies the link for its bytes at the
//! link rate. Bulk tenants refill their queue whenever a descriptor's last
//! piece goes, so they stay backlogged.

use mtrdma_sched::sim::jain_index;
use mtrdma_sched::{
    ConfigError, Dequeue, Descriptor, Nanos, Opcode, RateLimit, RejectReason, Scheduler,
    SchedulerConfig, TenantId, TenantPolicy, TenantScheduler, TrafficClass,
};

const GBPS: u64 = 1_000_000_000;

fn tx_ns(bytes: u64, bps: u64) -> u64 {
    let ns = (u128::from(bytes) * 8_000_000_000).div_ceil(u128::from(bps));
    u64::try_from(ns).unwrap()
}

#[derive(Debug, Clone)]
struct Sent {
    tenant: TenantId,
    class: TrafficClass,
    handle: u64,
    start: u64,
    end: u64,
    len: u64,
    is_last: bool,
}

/// Runs `s` on a link of `bps` from `from` until `until` ns. Before each decision,
/// `arrive(now, s)` enqueues what has arrived by `now` and returns when the
/// next arrival is due; after each piece, `sent(piece, s)` may refill.
fn drive(
    s: &mut TenantScheduler<u64>,
    bps: u64,
    from: u64,
    until: u64,
    mut arrive: impl FnMut(u64, &mut TenantScheduler<u64>) -> Option<u64>,
    mut sent: impl FnMut(&Sent, &mut TenantScheduler<u64>),
) -> Vec<Sent> {
    let mut now = from;
    let mut log = Vec::new();
    while now < until {
        let next_arrival = arrive(now, s);
        match s.dequeue(Nanos(now)) {
            Dequeue::Ready(g) => {
                let piece = Sent {
                    tenant: g.tenant,
                    class: g.class,
                    handle: g.handle,
                    start: now,
                    end: now + tx_ns(g.len, bps),
                    len: g.len,
                    is_last: g.is_last,
                };
                now = piece.end;
                sent(&piece, s);
                log.push(piece);
            }
            Dequeue::Wait(t) => {
                assert!(t.0 > now, "Wait({t}) at {now} would spin");
                now = next_arrival.map_or(t.0, |a| a.min(t.0));
            }
            Dequeue::Empty => match next_arrival {
                Some(a) => now = a,
                None => break,
            },
        }
    }
    log
}

/// [`drive`] with nothing arriving but what `sent(piece, s)` enqueues.
fn drive_refilled(
    s: &mut TenantScheduler<u64>,
    bps: u64,
    from: u64,
    until: u64,
    sent: impl FnMut(&Sent, &mut TenantScheduler<u64>),
) -> Vec<Sent> {
    drive(s, bps, from, until, |_, _| None, sent)
}

fn bulk(tenant: u32, bytes: u64, handle: u64) -> Descriptor<u64> {
    Descriptor::new(
        TenantId(tenant),
        TrafficClass::Bulk,
        Opcode::Write,
        bytes,
        handle,
    )
}

fn probe(tenant: u32, handle: u64) -> Descriptor<u64> {
    Descriptor::new(
        TenantId(tenant),
        TrafficClass::Latency,
        Opcode::Send,
        16,
        handle,
    )
}

/// Refill: keeps each bulk tenant at two 1 MiB descriptors queued.
fn refill_bulk(p: &Sent, s: &mut TenantScheduler<u64>) {
    if p.class == TrafficClass::Bulk && p.is_last {
        s.enqueue(bulk(p.tenant.0, 1 << 20, p.handle + 1), Nanos(p.end))
            .unwrap();
    }
}

fn bytes_of(log: &[Sent], tenant: u32, from: u64, to: u64) -> u64 {
    log.iter()
        .filter(|p| p.tenant.0 == tenant && p.start >= from && p.start < to)
        .map(|p| p.len)
        .sum()
}

fn config(chunk: u64) -> SchedulerConfig {
    SchedulerConfig {
        chunk_bytes: chunk,
        quantum_bytes: chunk,
        ..SchedulerConfig::default()
    }
}

fn assert_within(actual: f64, expected: f64, rel: f64, what: &str) {
    let err = (actual - expected).abs() / expected;
    assert!(
        err <= rel,
        "{what}: got {actual}, expected {expected} (error {:.4}% > {:.4}%)",
        err * 100.0,
        rel * 100.0
    );
}

#[test]
fn weights_1_2_4_share_a_100g_link_for_one_second() {
    let mut s = TenantScheduler::new(config(64 << 10)).unwrap();
    let weights = [1u32, 2, 4];
    for (i, &w) in weights.iter().enumerate() {
        let t = i as u32 + 1;
        s.set_policy(TenantId(t), TenantPolicy::weight(w)).unwrap();
        for h in 0..2 {
            s.enqueue(bulk(t, 1 << 20, h), Nanos(0)).unwrap();
        }
    }
    let second = 1_000_000_000;
    let log = drive_refilled(&mut s, 100 * GBPS, 0, second, refill_bulk);
    let total: u64 = (1..=3).map(|t| bytes_of(&log, t, 0, second)).sum();
    // The link never idles.
    assert_within(total as f64, 12.5e9, 0.001, "link bytes in 1 s");
    let mut normalised = Vec::new();
    for (i, &w) in weights.iter().enumerate() {
        let share = bytes_of(&log, i as u32 + 1, 0, second) as f64 / total as f64;
        assert_within(share, f64::from(w) / 7.0, 0.01, "weighted share");
        normalised.push(share / f64::from(w));
    }
    let jain = jain_index(&normalised);
    assert!(jain >= 0.999, "Jain's index {jain}");
}

/// A tenant capped at `rate` bytes/s on a link of four times its rate,
/// next to an uncapped backlogged tenant, with chunks sized for ~2,000
/// pieces of the capped tenant per second.
fn capped_run(rate_bits: u64, with_competitor: bool) -> (u64, u64) {
    let rate = rate_bits / 8;
    let chunk = (rate / 2_000).clamp(64, 64 << 10);
    let mut s = TenantScheduler::new(config(chunk)).unwrap();
    let cap = RateLimit::per_second(rate).with_burst(chunk);
    s.set_policy(TenantId(1), TenantPolicy::weight(1).with_byte_cap(cap))
        .unwrap();
    s.set_policy(TenantId(2), TenantPolicy::weight(1)).unwrap();
    for h in 0..2 {
        s.enqueue(bulk(1, 1 << 20, h), Nanos(0)).unwrap();
        if with_competitor {
            s.enqueue(bulk(2, 1 << 20, h), Nanos(0)).unwrap();
        }
    }
    let second = 1_000_000_000;
    let log = drive_refilled(&mut s, 4 * rate_bits, 0, second, refill_bulk);
    (bytes_of(&log, 1, 0, second), bytes_of(&log, 2, 0, second))
}

#[test]
fn a_capped_tenant_gets_its_cap_from_1_mbps_to_100_gbps() {
    for rate_bits in [
        1_000_000,
        10_000_000,
        100_000_000,
        GBPS,
        10 * GBPS,
        100 * GBPS,
    ] {
        let expected = rate_bits as f64 / 8.0;
        let (capped, other) = capped_run(rate_bits, true);
        assert_within(
            capped as f64,
            expected,
            0.005,
            &format!("cap {rate_bits} b/s"),
        );
        // Work conserving: the uncapped tenant takes the rest of the link.
        assert_within(other as f64, 3.0 * expected, 0.01, "uncapped neighbour");
        // Alone, the cap still holds: the link idles rather than exceed it.
        let (alone, _) = capped_run(rate_bits, false);
        assert_within(
            alone as f64,
            expected,
            0.005,
            &format!("cap {rate_bits} b/s alone"),
        );
    }
}

#[test]
fn a_work_request_cap_holds_for_small_messages() {
    let mut s = TenantScheduler::new(config(64 << 10)).unwrap();
    let cap = RateLimit::per_second(100_000).with_burst(8);
    s.set_policy(TenantId(1), TenantPolicy::weight(1).with_wr_cap(cap))
        .unwrap();
    let d = |h| Descriptor::new(TenantId(1), TrafficClass::Latency, Opcode::Send, 64, h);
    for h in 0..4 {
        s.enqueue(d(h), Nanos(0)).unwrap();
    }
    let second = 1_000_000_000;
    let log = drive_refilled(&mut s, 100 * GBPS, 0, second, |p, s| {
        s.enqueue(d(p.handle + 4), Nanos(p.end)).unwrap()
    });
    let wrs = log.iter().filter(|p| p.start < second).count();
    assert_within(wrs as f64, 100_000.0, 0.005, "work requests in 1 s");
}

#[test]
fn a_latency_descriptor_waits_at_most_one_chunk_behind_bulk() {
    for (bulk_tenants, guard_ppm) in [(1u32, 0u32), (4, 100_000), (16, 100_000)] {
        let chunk = 64 << 10;
        let link = 100 * GBPS;
        let mut s = TenantScheduler::new(SchedulerConfig {
            bulk_min_share_ppm: guard_ppm,
            ..config(chunk)
        })
        .unwrap();
        let lat = 1000;
        s.set_policy(TenantId(lat), TenantPolicy::weight(1))
            .unwrap();
        for t in 1..=bulk_tenants {
            s.set_policy(TenantId(t), TenantPolicy::weight(t)).unwrap();
            for h in 0..2 {
                s.enqueue(bulk(t, 1 << 20, h), Nanos(0)).unwrap();
            }
        }
        // Probes arrive 10..90 us apart (a fixed pseudo-random sequence).
        let mut rng = 0x2545_F491_4F6C_DD1Du64;
        let mut next = 7_000u64;
        let mut arrivals = Vec::new();
        let until = 100_000_000;
        let log = drive(
            &mut s,
            link,
            0,
            until,
            |now, s| {
                while next <= now {
                    s.enqueue(probe(lat, arrivals.len() as u64), Nanos(next))
                        .unwrap();
                    arrivals.push(next);
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    next += 10_000 + rng % 80_000;
                }
                Some(next)
            },
            refill_bulk,
        );
        let bound = tx_ns(chunk, link) + tx_ns(16, link);
        let mut probes = 0;
        for p in log.iter().filter(|p| p.tenant.0 == lat) {
            let waited = p.end - arrivals[p.handle as usize];
            assert!(
                waited <= bound,
                "{bulk_tenants} bulk tenants: probe {} waited {waited} ns > {bound} ns",
                p.handle
            );
            probes += 1;
        }
        assert!(probes > 1_000, "only {probes} probes were sent");
        // Bulk still fills the link around the probes.
        let bulk_bytes: u64 = (1..=bulk_tenants)
            .map(|t| bytes_of(&log, t, 0, until))
            .sum();
        assert_within(bulk_bytes as f64, 1.25e9, 0.01, "bulk bytes in 100 ms");
    }
}

#[test]
fn bulk_keeps_its_guaranteed_share_under_saturated_latency_traffic() {
    for share_ppm in [50_000u32, 200_000, 500_000] {
        let mut s = TenantScheduler::new(SchedulerConfig {
            bulk_min_share_ppm: share_ppm,
            ..config(64 << 10)
        })
        .unwrap();
        s.set_policy(TenantId(1), TenantPolicy::weight(1)).unwrap();
        s.set_policy(TenantId(2), TenantPolicy::weight(1)).unwrap();
        let rpc = |h| Descriptor::new(TenantId(2), TrafficClass::Latency, Opcode::Send, 4096, h);
        for h in 0..4 {
            s.enqueue(bulk(1, 1 << 20, h), Nanos(0)).unwrap();
            s.enqueue(rpc(h), Nanos(0)).unwrap();
        }
        let until = 50_000_000;
        let log = drive_refilled(&mut s, 100 * GBPS, 0, until, |p, s| {
            if p.class == TrafficClass::Latency {
                s.enqueue(rpc(p.handle + 4), Nanos(p.end)).unwrap();
            } else {
                refill_bulk(p, s);
            }
        });
        let bulk_bytes = bytes_of(&log, 1, 0, until) as f64;
        let latency_bytes = bytes_of(&log, 2, 0, until) as f64;
        let share = bulk_bytes / (bulk_bytes + latency_bytes);
        let want = f64::from(share_ppm) / 1e6;
        assert_within(
            share,
            want,
            0.01,
            "bulk share under saturated latency class",
        );
    }
}

#[test]
fn without_the_guard_saturated_latency_starves_bulk() {
    // The guard is what the previous test measures: turned off, strict
    // priority gives bulk nothing.
    let mut s = TenantScheduler::new(SchedulerConfig {
        bulk_min_share_ppm: 0,
        ..config(64 << 10)
    })
    .unwrap();
    s.set_policy(TenantId(1), TenantPolicy::weight(1)).unwrap();
    let rpc = |h| Descriptor::new(TenantId(1), TrafficClass::Latency, Opcode::Send, 4096, h);
    s.enqueue(bulk(1, 1 << 20, 0), Nanos(0)).unwrap();
    s.enqueue(rpc(0), Nanos(0)).unwrap();
    let log = drive_refilled(&mut s, 100 * GBPS, 0, 1_000_000, |p, s| {
        if p.class == TrafficClass::Latency {
            s.enqueue(rpc(p.handle + 1), Nanos(p.end)).unwrap();
        }
    });
    assert!(log.iter().all(|p| p.class == TrafficClass::Latency));
}

#[test]
fn an_idle_tenants_share_goes_to_the_others_within_one_round() {
    let chunk = 64 << 10;
    let link = 100 * GBPS;
    let mut s = TenantScheduler::new(config(chunk)).unwrap();
    let weights = [(1u32, 1u32), (2, 1), (3, 2)];
    for &(t, w) in &weights {
        s.set_policy(TenantId(t), TenantPolicy::weight(w)).unwrap();
        for h in 0..2 {
            s.enqueue(bulk(t, 1 << 20, h), Nanos(0)).unwrap();
        }
    }
    let stop = 10_000_000;
    let until = 20_000_000;
    let log = drive_refilled(&mut s, link, 0, until, |p, s| {
        // Tenant 1 stops refilling at 10 ms and goes idle.
        if p.tenant.0 != 1 || p.end < stop {
            refill_bulk(p, s);
        }
    });
    let idle_at = log
        .iter()
        .filter(|p| p.tenant.0 == 1)
        .map(|p| p.end)
        .max()
        .unwrap();
    assert!(idle_at >= stop);
    // The link never idles: every piece starts when the previous ends.
    for w in log.windows(2) {
        assert_eq!(w[0].end, w[1].start);
    }
    // In the first round after tenant 1 is idle, tenants 2 and 3 each get
    // their quantum (less at most one chunk of carried-over deficit).
    let q2 = s.quantum(TenantId(2)).unwrap() as u64;
    let q3 = s.quantum(TenantId(3)).unwrap() as u64;
    let round_end = idle_at + tx_ns(q2 + q3, link);
    let got2 = bytes_of(&log, 2, idle_at, round_end);
    let got3 = bytes_of(&log, 3, idle_at, round_end);
    assert!(
        got2 + chunk >= q2,
        "tenant 2 got {got2} of {q2} in the first round"
    );
    assert!(
        got3 + chunk >= q3,
        "tenant 3 got {got3} of {q3} in the first round"
    );
    // From then on they split the whole link 1:2.
    let after2 = bytes_of(&log, 2, round_end, until) as f64;
    let after3 = bytes_of(&log, 3, round_end, until) as f64;
    assert_within(
        after3 / (after2 + after3),
        2.0 / 3.0,
        0.01,
        "share after idle",
    );
    let rate = (after2 + after3) * 8.0 / ((until - round_end) as f64 / 1e9);
    assert_within(rate, link as f64, 0.01, "link use after idle");
}

#[test]
fn runtime_policy_changes_apply_to_weights_and_caps() {
    let mut s = TenantScheduler::new(config(64 << 10)).unwrap();
    s.set_policy(TenantId(1), TenantPolicy::weight(1)).unwrap();
    s.set_policy(TenantId(2), TenantPolicy::weight(1)).unwrap();
    for h in 0..2 {
        s.enqueue(bulk(1, 1 << 20, h), Nanos(0)).unwrap();
        s.enqueue(bulk(2, 1 << 20, h), Nanos(0)).unwrap();
    }
    let link = 100 * GBPS;
    let phase = 20_000_000;
    let rate_in = |log: &[Sent], t: u32, from: u64| {
        bytes_of(log, t, from, from + phase) as f64 * 8.0 / (phase as f64 / 1e9)
    };
    let log = drive_refilled(&mut s, link, 0, phase, refill_bulk);
    let equal = rate_in(&log, 1, 0) / rate_in(&log, 2, 0);
    assert_within(equal, 1.0, 0.01, "1:1 before the change");
    // Tenant 1 gets weight 3: from now on 3:1.
    s.set_policy(TenantId(1), TenantPolicy::weight(3)).unwrap();
    let t1 = log.last().unwrap().end;
    let log = drive_refilled(&mut s, link, t1, t1 + phase, refill_bulk);
    let ratio = rate_in(&log, 1, t1) / rate_in(&log, 2, t1);
    assert_within(ratio, 3.0, 0.01, "3:1 after the change");
    // Tenant 1 is now capped at 10 Gb/s; tenant 2 takes the rest.
    let cap = |gbps| RateLimit::gbits_per_sec(gbps).with_burst(64 << 10);
    s.set_policy(TenantId(1), TenantPolicy::weight(3).with_byte_cap(cap(10)))
        .unwrap();
    let t2 = log.last().unwrap().end;
    let log = drive_refilled(&mut s, link, t2, t2 + phase, refill_bulk);
    assert_within(rate_in(&log, 1, t2), 10e9, 0.01, "capped rate");
    assert_within(rate_in(&log, 2, t2), 90e9, 0.01, "uncapped neighbour");
    // Raising the cap applies at once.
    s.set_policy(TenantId(1), TenantPolicy::weight(3).with_byte_cap(cap(20)))
        .unwrap();
    let t3 = log.last().unwrap().end;
    let log = drive_refilled(&mut s, link, t3, t3 + phase, refill_bulk);
    assert_within(rate_in(&log, 1, t3), 20e9, 0.01, "raised cap");
    // Removing the cap: back to 3:1 of the whole link.
    s.set_policy(TenantId(1), TenantPolicy::weight(3)).unwrap();
    let t4 = log.last().unwrap().end;
    let log = drive_refilled(&mut s, link, t4, t4 + phase, refill_bulk);
    assert_within(rate_in(&log, 1, t4), 75e9, 0.01, "cap removed");
}

#[test]
fn bad_configuration_is_an_error_not_a_panic() {
    let err = |c: SchedulerConfig| TenantScheduler::<u64>::new(c).unwrap_err();
    assert_eq!(
        err(SchedulerConfig {
            chunk_bytes: 0,
            ..SchedulerConfig::default()
        }),
        ConfigError::ZeroChunk
    );
    assert_eq!(
        err(SchedulerConfig {
            chunk_bytes: 4096,
            quantum_bytes: 1024,
            ..SchedulerConfig::default()
        }),
        ConfigError::QuantumBelowChunk {
            quantum: 1024,
            chunk: 4096
        }
    );
    assert!(matches!(
        err(SchedulerConfig {
            bulk_min_share_ppm: 1_000_000,
            ..SchedulerConfig::default()
        }),
        ConfigError::BulkShareTooLarge { .. }
    ));
    assert_eq!(
        err(SchedulerConfig {
            max_queued_per_tenant: 0,
            ..SchedulerConfig::default()
        }),
        ConfigError::ZeroQueueLimit
    );
    let mut s = TenantScheduler::<u64>::new(SchedulerConfig::default()).unwrap();
    assert_eq!(
        s.set_policy(TenantId(9), TenantPolicy::weight(0)),
        Err(ConfigError::ZeroWeight {
            tenant: TenantId(9)
        })
    );
    assert_eq!(
        s.set_policy(
            TenantId(9),
            TenantPolicy::weight(1).with_wr_cap(RateLimit::per_second(0))
        ),
        Err(ConfigError::ZeroRate)
    );
    // A refused policy leaves no tenant behind; a refused change keeps the old one.
    assert_eq!(s.tenant_count(), 0);
    s.set_policy(TenantId(9), TenantPolicy::weight(5)).unwrap();
    assert!(s.set_policy(TenantId(9), TenantPolicy::weight(0)).is_err());
    assert_eq!(s.policy(TenantId(9)), Some(TenantPolicy::weight(5)));
}

#[test]
fn refused_descriptors_are_handed_back() {
    let mut s = TenantScheduler::new(SchedulerConfig {
        max_queued_per_tenant: 2,
        ..SchedulerConfig::default()
    })
    .unwrap();
    let unknown = s.enqueue(bulk(7, 100, 1), Nanos(0)).unwrap_err();
    assert_eq!(unknown.reason, RejectReason::UnknownTenant(TenantId(7)));
    assert_eq!(unknown.descriptor, bulk(7, 100, 1));
    s.set_policy(TenantId(7), TenantPolicy::default()).unwrap();
    s.enqueue(bulk(7, 100, 1), Nanos(0)).unwrap();
    s.enqueue(bulk(7, 100, 2), Nanos(0)).unwrap();
    let full = s.enqueue(bulk(7, 100, 3), Nanos(0)).unwrap_err();
    assert_eq!(
        full.reason,
        RejectReason::QueueFull {
            tenant: TenantId(7),
            limit: 2
        }
    );
    assert_eq!(full.descriptor.handle, 3);
    assert_eq!(s.len(), 2);
}

#[test]
fn removing_a_tenant_hands_back_its_queue_including_a_partly_sent_one() {
    let mut s = TenantScheduler::new(config(1024)).unwrap();
    s.set_policy(TenantId(1), TenantPolicy::weight(1)).unwrap();
    s.set_policy(TenantId(2), TenantPolicy::weight(1)).unwrap();
    s.enqueue(bulk(1, 4096, 10), Nanos(0)).unwrap();
    s.enqueue(bulk(1, 100, 11), Nanos(0)).unwrap();
    s.enqueue(probe(1, 12), Nanos(0)).unwrap();
    s.enqueue(bulk(2, 100, 20), Nanos(0)).unwrap();
    assert_eq!(s.dequeue(Nanos(0)).ready().unwrap().handle, 12);
    let first = s.dequeue(Nanos(0)).ready().unwrap();
    assert_eq!((first.handle, first.len, first.is_last), (10, 1024, false));
    let drained = s.remove_tenant(TenantId(1)).unwrap();
    let got: Vec<_> = drained
        .iter()
        .map(|d| (d.descriptor.handle, d.granted_bytes))
        .collect();
    assert_eq!(got, vec![(10, 1024), (11, 0)]);
    assert_eq!(s.len(), 1);
    assert_eq!(s.remove_tenant(TenantId(1)), None);
    // The other tenant is unaffected, and a re-added tenant starts clean.
    assert_eq!(s.dequeue(Nanos(0)).ready().unwrap().handle, 20);
    s.set_policy(TenantId(1), TenantPolicy::weight(1)).unwrap();
    s.enqueue(bulk(1, 10, 30), Nanos(0)).unwrap();
    let g = s.dequeue(Nanos(0)).ready().unwrap();
    assert_eq!((g.handle, g.offset, g.len, g.is_last), (30, 0, 10, true));
    assert_eq!(s.dequeue(Nanos(0)), Dequeue::Empty);
}

#[test]
fn sends_larger_than_the_quantum_are_not_split_and_still_shared_fairly() {
    let mut s = TenantScheduler::new(config(4096)).unwrap();
    let send = |t, h| Descriptor::new(TenantId(t), TrafficClass::Bulk, Opcode::Send, 1 << 20, h);
    for t in 1..=2 {
        s.set_policy(TenantId(t), TenantPolicy::weight(t)).unwrap();
        for h in 0..2 {
            s.enqueue(send(t, h), Nanos(0)).unwrap();
        }
    }
    let until = 50_000_000;
    let log = drive_refilled(&mut s, 100 * GBPS, 0, until, |p, s| {
        s.enqueue(send(p.tenant.0, p.handle + 2), Nanos(p.end))
            .unwrap()
    });
    assert!(log.iter().all(|p| p.len == 1 << 20 && p.is_last));
    let ratio = bytes_of(&log, 2, 0, until) as f64 / bytes_of(&log, 1, 0, until) as f64;
    assert_within(ratio, 2.0, 0.02, "weighted share of whole SENDs");
}
