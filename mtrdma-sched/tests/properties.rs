//! Property tests: random workloads and random policy changes never lose,
//! duplicate or reorder work, and deficits stay bounded; GCRA never lets
//! more through than its rate and burst allow.

use std::collections::{HashMap, VecDeque};

use mtrdma_sched::{
    gcra_decide, Dequeue, Descriptor, Gcra, Nanos, Opcode, RateLimit, Scheduler, SchedulerConfig,
    TenantId, TenantPolicy, TenantScheduler, TrafficClass,
};
use proptest::prelude::*;

const TENANTS: u32 = 4;

#[derive(Debug, Clone)]
enum Op {
    Enqueue {
        tenant: u32,
        latency: bool,
        op: Opcode,
        bytes: u64,
    },
    Dequeue {
        advance: u64,
    },
    SetPolicy {
        tenant: u32,
        policy: TenantPolicy,
    },
    Remove {
        tenant: u32,
    },
}

fn opcode() -> impl Strategy<Value = Opcode> {
    prop_oneof![
        Just(Opcode::Send),
        Just(Opcode::Write),
        Just(Opcode::Read),
        Just(Opcode::Atomic)
    ]
}

fn policy() -> impl Strategy<Value = TenantPolicy> {
    let byte_cap = proptest::option::of(
        (1_000_000u64..20_000_000_000, 0u64..200_000)
            .prop_map(|(r, b)| RateLimit::per_second(r).with_burst(b)),
    );
    let wr_cap = proptest::option::of(
        (1_000u64..10_000_000, 0u64..16).prop_map(|(r, b)| RateLimit::per_second(r).with_burst(b)),
    );
    (1u32..8, byte_cap, wr_cap).prop_map(|(w, b, r)| TenantPolicy {
        weight: w,
        byte_cap: b,
        wr_cap: r,
    })
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0..TENANTS, any::<bool>(), opcode(), prop_oneof![0u64..64, 0u64..200_000])
            .prop_map(|(tenant, latency, op, bytes)| Op::Enqueue { tenant, latency, op, bytes }),
        8 => prop_oneof![Just(0u64), 0u64..20_000, 0u64..2_000_000]
            .prop_map(|advance| Op::Dequeue { advance }),
        1 => (0..TENANTS, policy()).prop_map(|(tenant, policy)| Op::SetPolicy { tenant, policy }),
        1 => (0..TENANTS).prop_map(|tenant| Op::Remove { tenant }),
    ]
}

fn config() -> impl Strategy<Value = SchedulerConfig> {
    (
        prop_oneof![Just(512u64), 256u64..5_000, Just(64 << 10)],
        1u64..4,
        prop_oneof![Just(0u32), 0u32..999_999],
        1usize..40,
    )
        .prop_map(|(chunk, q, ppm, limit)| SchedulerConfig {
            chunk_bytes: chunk,
            quantum_bytes: chunk * q,
            bulk_min_share_ppm: ppm,
            max_queued_per_tenant: limit,
        })
}

/// What the scheduler must have done, tracked independently of it.
#[derive(Default)]
struct Model {
    /// Per (tenant, class): handles in enqueue order.
    fifos: HashMap<(u32, bool), VecDeque<u64>>,
    /// Per handle: (bytes, op, bytes granted so far).
    items: HashMap<u64, (u64, Opcode, u64)>,
    /// Largest DRR cost of a piece that may be served.
    max_cost: u64,
}

impl Model {
    fn queued(&self) -> usize {
        self.fifos.values().map(VecDeque::len).sum()
    }

    fn check_grant(
        &mut self,
        chunk: u64,
        g: &mtrdma_sched::Grant<u64>,
    ) -> Result<(), TestCaseError> {
        let key = (g.tenant.0, g.class == TrafficClass::Latency);
        let fifo = self
            .fifos
            .get_mut(&key)
            .expect("grant for a tenant/class with nothing queued");
        // FIFO within tenant and class; pieces of one descriptor not interleaved.
        prop_assert_eq!(fifo.front().copied(), Some(g.handle));
        let (bytes, op, granted) = self.items.get_mut(&g.handle).unwrap();
        prop_assert_eq!(g.op, *op);
        prop_assert_eq!(
            g.offset,
            *granted,
            "pieces in order, none skipped or repeated"
        );
        if op.is_splittable() {
            prop_assert!(g.len <= chunk);
            prop_assert!(g.len == chunk || g.is_last);
        } else {
            prop_assert_eq!(g.len, *bytes);
        }
        *granted += g.len;
        prop_assert_eq!(g.is_last, *granted == *bytes);
        prop_assert!(*granted <= *bytes);
        if g.is_last {
            fifo.pop_front();
            self.items.remove(&g.handle);
        }
        Ok(())
    }
}

fn check_deficits(s: &TenantScheduler<u64>, max_cost: u64) -> Result<(), TestCaseError> {
    for t in 0..TENANTS {
        let Some(q) = s.quantum(TenantId(t)) else {
            continue;
        };
        for class in [TrafficClass::Latency, TrafficClass::Bulk] {
            let d = s.deficit(TenantId(t), class).unwrap();
            prop_assert!(d <= q, "deficit {} above quantum {}", d, q);
            prop_assert!(
                d > -(max_cost.max(1) as i64),
                "deficit {} below -{}",
                d,
                max_cost
            );
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn no_descriptor_lost_or_duplicated_fifo_and_bounded_deficits(
        config in config(),
        ops in proptest::collection::vec(op(), 1..250),
    ) {
        let chunk = config.chunk_bytes;
        let mut s = TenantScheduler::new(config).unwrap();
        let mut m = Model::default();
        let mut now = 0u64;
        let mut next_handle = 0u64;
        for op in ops {
            match op {
                Op::Enqueue { tenant, latency, op, bytes } => {
                    let class = if latency { TrafficClass::Latency } else { TrafficClass::Bulk };
                    let d = Descriptor::new(TenantId(tenant), class, op, bytes, next_handle);
                    match s.enqueue(d.clone(), Nanos(now)) {
                        Ok(()) => {
                            m.fifos.entry((tenant, latency)).or_default().push_back(next_handle);
                            m.items.insert(next_handle, (bytes, op, 0));
                            let cost = if op.is_splittable() { bytes.min(chunk) } else { bytes };
                            m.max_cost = m.max_cost.max(cost);
                        }
                        Err(rejected) => prop_assert_eq!(rejected.descriptor, d),
                    }
                    next_handle += 1;
                }
                Op::Dequeue { advance } => {
                    now += advance;
                    match s.dequeue(Nanos(now)) {
                        Dequeue::Ready(g) => m.check_grant(chunk, &g)?,
                        Dequeue::Wait(t) => {
                            prop_assert!(t.0 > now);
                            prop_assert!(m.queued() > 0);
                        }
                        Dequeue::Empty => prop_assert_eq!(m.queued(), 0),
                    }
                }
                Op::SetPolicy { tenant, policy } => {
                    s.set_policy(TenantId(tenant), policy).unwrap();
                }
                Op::Remove { tenant } => {
                    let drained = s.remove_tenant(TenantId(tenant));
                    let mut expected = Vec::new();
                    for latency in [true, false] {
                        for h in m.fifos.remove(&(tenant, latency)).unwrap_or_default() {
                            let (_, _, granted) = m.items.remove(&h).unwrap();
                            expected.push((h, granted));
                        }
                    }
                    let got: Vec<_> = drained
                        .unwrap_or_default()
                        .into_iter()
                        .map(|d| (d.descriptor.handle, d.granted_bytes))
                        .collect();
                    prop_assert_eq!(got, expected);
                }
            }
            prop_assert_eq!(s.len(), m.queued());
            check_deficits(&s, m.max_cost)?;
        }
        // Drain: everything still queued comes out, whatever the caps.
        let mut steps = 0u64;
        loop {
            match s.dequeue(Nanos(now)) {
                Dequeue::Ready(g) => m.check_grant(chunk, &g)?,
                Dequeue::Wait(t) => {
                    prop_assert!(t.0 > now);
                    now = t.0;
                }
                Dequeue::Empty => break,
            }
            check_deficits(&s, m.max_cost)?;
            steps += 1;
            prop_assert!(steps < 2_000_000, "drain does not terminate");
        }
        prop_assert_eq!(m.queued(), 0);
        prop_assert!(m.items.is_empty());
        prop_assert_eq!(s.len(), 0);
    }

    #[test]
    fn gcra_never_exceeds_rate_plus_burst(
        rate in 1u64..100_000_000_000,
        burst in 0u64..1_000_000,
        steps in proptest::collection::vec((0u64..5_000_000, 0u64..100_000), 1..120),
    ) {
        let limit = RateLimit::per_second(rate).with_burst(burst);
        let mut g = Gcra::new(limit).unwrap();
        let tau = g.tolerance().0;
        let mut now = 0u64;
        let mut sent: Vec<(u64, u64)> = Vec::new();
        for (advance, cost) in steps {
            now += advance;
            // The pure step and the wrapper agree.
            let pure = gcra_decide(g.tat().0, now, cost, g.interval(), tau);
            match g.check(Nanos(now), cost) {
                Ok(()) => {
                    prop_assert_eq!(pure, Ok(g.tat().0));
                    sent.push((now, g.interval().increment(cost)));
                }
                Err(retry) => {
                    prop_assert_eq!(pure, Err(retry.0));
                    prop_assert!(retry.0 > now);
                    // It conforms exactly at the retry time, not before.
                    prop_assert!(g.peek(retry, cost).is_ok());
                    prop_assert!(g.peek(Nanos(retry.0 - 1), cost).is_err());
                }
            }
        }
        // Over any run of conforming sends i..=j:
        // sum of their times <= elapsed + tolerance + the last one's time.
        for i in 0..sent.len() {
            let mut total = 0u64;
            for j in i..sent.len() {
                total += sent[j].1;
                prop_assert!(
                    total <= (sent[j].0 - sent[i].0) + tau + sent[j].1,
                    "sends {}..={} use {} ns in {} ns", i, j, total, sent[j].0 - sent[i].0
                );
            }
        }
    }

    #[test]
    fn gcra_rate_change_keeps_state(
        first in 1u64..1_000_000_000,
        second in 1u64..1_000_000_000,
        cost in 1u64..1_000_000,
    ) {
        let mut g = Gcra::new(RateLimit::per_second(first)).unwrap();
        g.check(Nanos(1_000), cost).unwrap();
        let tat = g.tat();
        g.set_limit(RateLimit::per_second(second)).unwrap();
        prop_assert_eq!(g.tat(), tat);
        prop_assert_eq!(g.limit().per_second, second);
    }
}
