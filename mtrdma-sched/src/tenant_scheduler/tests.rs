//! Tests of `tenant_scheduler`.

use super::*;

#[test]
fn hot_slot_is_one_cache_line() {
    assert_eq!(std::mem::size_of::<Hot>(), 64);
    assert_eq!(std::mem::align_of::<Hot>(), 64);
}

#[test]
fn freed_nodes_are_reused_last_in_first_out() {
    let d = |h| Descriptor::new(TenantId(1), TrafficClass::Bulk, crate::Opcode::Write, 1, h);
    let mut nodes = Nodes::new();
    let (a, b) = (nodes.alloc(d(1)), nodes.alloc(d(2)));
    assert_eq!((a, b), (0, 1));
    nodes.link(a, b);
    assert_eq!(nodes.release(a), (Some(d(1)), b));
    assert_eq!(nodes.release(b), (Some(d(2)), NIL));
    assert_eq!(nodes.get(a), None);
    assert_eq!(nodes.alloc(d(3)), b);
    assert_eq!(nodes.alloc(d(4)), a);
    assert_eq!(nodes.alloc(d(5)), 2);
    assert_eq!(nodes.get(a), Some(&d(4)));
}

#[test]
fn a_whole_descriptor_is_granted_in_one_piece() {
    let mut s = TenantScheduler::new(SchedulerConfig {
        chunk_bytes: 4096,
        quantum_bytes: 4096,
        ..SchedulerConfig::default()
    })
    .unwrap();
    s.set_policy(TenantId(1), TenantPolicy::weight(1)).unwrap();
    let d = |bytes, h| {
        Descriptor::new(
            TenantId(1),
            TrafficClass::Bulk,
            crate::Opcode::Write,
            bytes,
            h,
        )
    };
    s.enqueue(d(10_000, 1).whole(), Nanos::ZERO).unwrap();
    s.enqueue(d(10_000, 2), Nanos::ZERO).unwrap();
    let mut grants = Vec::new();
    while let Dequeue::Ready(g) = s.dequeue(Nanos::ZERO) {
        grants.push((g.handle, g.len, g.is_last));
    }
    assert_eq!(
        grants,
        [
            (1, 10_000, true),
            (2, 4096, false),
            (2, 4096, false),
            (2, 1808, true)
        ]
    );
}

#[test]
fn admit_now_charges_the_caps_that_queued_pieces_then_wait_for() {
    use crate::gcra::RateLimit;
    let mut s: TenantScheduler<u32> = TenantScheduler::new(SchedulerConfig::default()).unwrap();
    let cap = RateLimit::per_second(1_000);
    s.set_policy(TenantId(1), TenantPolicy::weight(1).with_byte_cap(cap))
        .unwrap();
    s.set_policy(TenantId(2), TenantPolicy::weight(1)).unwrap();
    let t0 = Nanos(1_000_000_000);
    assert_eq!(
        s.admit_now(TenantId(1), 1_000, t0),
        Ok(()),
        "the first goes"
    );
    let at = s.admit_now(TenantId(1), 1_000, t0).unwrap_err();
    assert!(at > t0, "over the cap until {at:?}");
    assert_eq!(
        s.admit_now(TenantId(1), 1_000, t0),
        Err(at),
        "a refusal charges nothing"
    );
    // Uncapped and unknown tenants always go.
    for _ in 0..100 {
        assert_eq!(s.admit_now(TenantId(2), 1 << 30, t0), Ok(()));
        assert_eq!(s.admit_now(TenantId(3), 1 << 30, t0), Ok(()));
    }
    // The charge counts for what is queued next.
    let d = Descriptor::new(
        TenantId(1),
        TrafficClass::Bulk,
        crate::Opcode::Write,
        1_000,
        7,
    );
    s.enqueue(d, t0).unwrap();
    assert!(matches!(s.dequeue(t0), Dequeue::Wait(w) if w == at));
    assert_eq!(s.dequeue(at).ready().map(|g| g.handle), Some(7));
}
