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
    connect(a, pd.queue_pair().build().expect("build B"))
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
    connect(a, b)
}

/// Whether the test device is iWARP, which connects only through rdma_cm.
pub(crate) fn iwarp() -> bool {
    let dev = device_name();
    std::fs::read_to_string(format!("/sys/class/infiniband/{dev}/node_type"))
        .is_ok_and(|t| t.contains("RNIC"))
}

/// Connects `a` and `b` to each other: by exchanging their endpoints, or,
/// on an iWARP device, through rdma_cm on the device's own address (with
/// the `rdmacm` feature; without it iWARP cannot connect).
pub(crate) fn connect(a: PreparedQueuePair, b: PreparedQueuePair) -> (QueuePair, QueuePair) {
    #[cfg(feature = "rdmacm")]
    if iwarp() {
        return connect_by_address(a, b);
    }
    let (ea, eb) = (a.endpoint(), b.endpoint());
    (
        a.connect(&eb).expect("connect A"),
        b.connect(&ea).expect("connect B"),
    )
}

/// Builds a queue pair from `builder` on `server` and connects `client`
/// to it: by exchanging endpoints, or, on an iWARP device, through rdma_cm
/// (the server accepting onto its shared completion queue). Returns the
/// server's queue pair number and the client's queue pair.
pub(crate) fn connect_on(
    server: &mut mtrdma_verbs::SharedCompletionQueue,
    builder: mtrdma_verbs::QueuePairBuilder<'_>,
    client: PreparedQueuePair,
) -> (u32, QueuePair) {
    #[cfg(feature = "rdmacm")]
    if iwarp() {
        return connect_on_by_address(server, builder, client);
    }
    let me = server.prepare(builder).expect("prepare on the server");
    server
        .connect(me.qpn, &client.endpoint())
        .expect("connect the server's side");
    (me.qpn, client.connect(&me).expect("connect the client"))
}

/// The identifiers of the connections made through rdma_cm, kept for the
/// rest of the test process (a connection lasts as long as its
/// identifier, and the queue pairs go to the test).
#[cfg(feature = "rdmacm")]
static KEPT: std::sync::Mutex<Vec<mtrdma_verbs::cm::ConnectionGuard>> =
    std::sync::Mutex::new(Vec::new());

/// A listener on the test device's own address, and the address.
#[cfg(feature = "rdmacm")]
fn listen() -> (mtrdma_verbs::cm::Listener, std::net::SocketAddr) {
    let ip = mtrdma_verbs::testing::device_ipv4(&device_name()).expect("the device's address");
    let listener =
        mtrdma_verbs::cm::Listener::bind(std::net::SocketAddr::new(ip.into(), 0)).expect("listen");
    let addr = listener.local_addr().expect("bound");
    (listener, addr)
}

/// `client` connected to `addr` through rdma_cm, on a thread of its own.
#[cfg(feature = "rdmacm")]
fn connect_from_thread(
    client: PreparedQueuePair,
    addr: std::net::SocketAddr,
) -> std::thread::JoinHandle<mtrdma_verbs::cm::Connection> {
    std::thread::spawn(move || {
        mtrdma_verbs::cm::Connector::resolve(addr, CM_WAIT)
            .expect("resolve")
            .connect(client, b"", CM_WAIT)
            .expect("connect")
    })
}

#[cfg(feature = "rdmacm")]
const CM_WAIT: Duration = Duration::from_secs(10);

/// [`connect_on`] through rdma_cm.
#[cfg(feature = "rdmacm")]
fn connect_on_by_address(
    server: &mut mtrdma_verbs::SharedCompletionQueue,
    builder: mtrdma_verbs::QueuePairBuilder<'_>,
    client: PreparedQueuePair,
) -> (u32, QueuePair) {
    let (mut listener, addr) = listen();
    let client = connect_from_thread(client, addr);
    let request = listener.next_request(CM_WAIT).expect("a request");
    let accepted = request
        .accept_on(server, builder, b"", CM_WAIT)
        .expect("accept");
    let (qp, guard) = client.join().expect("the connecting thread").into_parts();
    KEPT.lock().unwrap().extend([accepted.guard, guard]);
    (accepted.qpn, qp)
}

/// [`connect`] through rdma_cm: `b` accepts on a port of the device's
/// address, `a` connects to it. The connections' identifiers are kept
/// for the rest of the test process (a connection lasts as long as its
/// identifier, and the queue pairs go to the test).
#[cfg(feature = "rdmacm")]
pub(crate) fn connect_by_address(
    a: PreparedQueuePair,
    b: PreparedQueuePair,
) -> (QueuePair, QueuePair) {
    let (mut listener, addr) = listen();
    let a = connect_from_thread(a, addr);
    let request = listener.next_request(CM_WAIT).expect("a request");
    let b = request.accept(b, b"", CM_WAIT).expect("accept");
    let a = a.join().expect("the connecting thread");
    let ((a, ga), (b, gb)) = (a.into_parts(), b.into_parts());
    KEPT.lock().unwrap().extend([ga, gb]);
    (a, b)
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
