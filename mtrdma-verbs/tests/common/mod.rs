//! Helpers shared by the device tests.
// Each test file uses a different subset.
#![allow(dead_code)]

use std::time::{Duration, Instant};

use mtrdma_core::TenantHandle;
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

/// The test device and a protection domain on it.
pub(crate) fn device_pd() -> (Context, ProtectionDomain) {
    let ctx = device();
    let pd = ctx.alloc_pd().unwrap();
    (ctx, pd)
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
