//! Helpers shared by the device tests.
// Each test file uses a different subset.
#![allow(dead_code)]

use std::time::{Duration, Instant};

use mtrdma_core::{
    LinkConfig, Policy, QuotaTable, RateLimit, TableOwner, TenantEntry, TenantHandle, TenantId,
};
use mtrdma_verbs::PollCompletions;
use mtrdma_verbs::{Context, PreparedQueuePair, ProtectionDomain, QueuePair};

/// The device the tests run on: the one MTRDMA_TEST_DEVICE names. Running
/// device tests without naming one is a mistake worth failing on.
pub(crate) fn device() -> Context {
    let name = device_name();
    Context::open(&name).expect("open the test device")
}

/// The name in MTRDMA_TEST_DEVICE.
pub(crate) fn device_name() -> String {
    std::env::var("MTRDMA_TEST_DEVICE")
        .expect("MTRDMA_TEST_DEVICE must name the RDMA device to test (e.g. rxe0)")
}

/// Two queue pairs on one PD, connected to each other.
pub(crate) fn pair(pd: &ProtectionDomain) -> (QueuePair, QueuePair) {
    pair_with(pd, pd.queue_pair().build().expect("build A"))
}

/// As [`pair`], the first created for `tenant` (admitted against its
/// quota, and scheduled as it by default).
pub(crate) fn pair_of(pd: &ProtectionDomain, tenant: &TenantHandle) -> (QueuePair, QueuePair) {
    pair_with(pd, pd.queue_pair().tenant(tenant).build().expect("build A"))
}

fn pair_with(pd: &ProtectionDomain, a: PreparedQueuePair) -> (QueuePair, QueuePair) {
    let b = pd.queue_pair().build().expect("build B");
    let (ea, eb) = (a.endpoint(), b.endpoint());
    (
        a.connect(&eb).expect("connect A"),
        b.connect(&ea).expect("connect B"),
    )
}

/// Two connected queue pairs on one PD; the first has completion events,
/// the second too if `both`.
pub(crate) fn pair_with_events(pd: &ProtectionDomain, both: bool) -> (QueuePair, QueuePair) {
    pair_with_events_of(pd, both, None)
}

/// As [`pair_with_events`], the first created for `tenant` if given.
pub(crate) fn pair_with_events_of(
    pd: &ProtectionDomain,
    both: bool,
    tenant: Option<&TenantHandle>,
) -> (QueuePair, QueuePair) {
    let mut a = pd.queue_pair().completion_events(true);
    if let Some(t) = tenant {
        a = a.tenant(t);
    }
    let a = a.build().unwrap();
    let b = pd.queue_pair().completion_events(both).build().unwrap();
    let (ea, eb) = (a.endpoint(), b.endpoint());
    (a.connect(&eb).unwrap(), b.connect(&ea).unwrap())
}

/// The test device and a protection domain on it.
pub(crate) fn device_pd() -> (Context, ProtectionDomain) {
    let ctx = device();
    let pd = ctx.alloc_pd().unwrap();
    (ctx, pd)
}

/// A quota table whose one tenant (1, "capped") is held to `cap` bytes a
/// second with a burst of `burst` bytes, on a 1 GB/s link.
pub(crate) fn capped_table(cap: u64, burst: u64) -> TableOwner {
    let policy = Policy::new(
        LinkConfig::new(1_000_000_000),
        vec![TenantEntry::new(TenantId(1), "capped").with_rate(RateLimit::new(cap, burst))],
    );
    QuotaTable::embedded(&policy).unwrap()
}

/// Checks that `rate` (bytes a second) keeps to `cap`: at most 5% above
/// it, and at least 80% of it (`why` a rate below is wrong).
pub(crate) fn assert_at_cap(rate: f64, cap: u64, why: &str) {
    assert!(rate <= cap as f64 * 1.05, "{rate:.0} B/s above the cap");
    assert!(rate >= cap as f64 * 0.8, "{rate:.0} B/s: {why}");
}

/// Polls until `n` completions arrive (30 s at most).
pub(crate) fn wait<P: PollCompletions>(qp: &mut P, n: usize) -> Vec<P::Completion> {
    wait_within(qp, n, Duration::from_secs(30))
}

/// Polls until `n` completions arrive (`limit` at most).
pub(crate) fn wait_within<P: PollCompletions>(
    qp: &mut P,
    n: usize,
    limit: Duration,
) -> Vec<P::Completion> {
    let mut out = Vec::new();
    let deadline = Instant::now() + limit;
    while out.len() < n {
        qp.poll(&mut out).expect("poll");
        assert!(
            Instant::now() < deadline,
            "only {} of {n} completions",
            out.len()
        );
    }
    out
}

/// `len` bytes that differ with `seed` and position.
pub(crate) fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}
