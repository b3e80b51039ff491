//! Queue pairs of several tenants on one `SharedScheduler`, on a real
//! device (loopback on the device named by MTRDMA_TEST_DEVICE). Ignored on
//! a plain `cargo test`; `cargo xtask test` runs them in the SoftRoCE VM.

mod common;

use common::{device_pd, pair, pattern, wait};

use std::time::{Duration, Instant};

use mtrdma_core::{TenantId, TrafficClass};
use mtrdma_sched::TenantPolicy;
use mtrdma_verbs::PollCompletions;
use mtrdma_verbs::{
    Access, Completion, MemoryRegion, ProtectionDomain, QueuePair, ScheduleConfig,
    ScheduledQueuePair, SendOp, SharedConfig, SharedScheduler, WcStatus,
};

fn attach(
    qp: QueuePair,
    shared: &SharedScheduler,
    tenant: u32,
    class: TrafficClass,
) -> ScheduledQueuePair {
    qp.scheduled_on(
        shared,
        ScheduleConfig {
            max_pieces_in_flight: 8,
            ..ScheduleConfig::local(TenantId(tenant), class)
        },
    )
    .expect("attach to the shared scheduler")
}

fn scheduler(chunk_bytes: u64, bulk_bytes_in_flight: u64) -> SharedScheduler {
    SharedScheduler::new(SharedConfig {
        chunk_bytes,
        bulk_bytes_in_flight,
        ..SharedConfig::default()
    })
    .unwrap()
}

/// Two connected queue pairs attached to `shared` as bulk tenants 1 and 2,
/// with the peers that must outlive them.
fn two_bulk(
    pd: &ProtectionDomain,
    shared: &SharedScheduler,
) -> (ScheduledQueuePair, ScheduledQueuePair, [QueuePair; 2]) {
    let ((a, pa), (b, pb)) = (pair(pd), pair(pd));
    (
        attach(a, shared, 1, TrafficClass::Bulk),
        attach(b, shared, 2, TrafficClass::Bulk),
        [pa, pb],
    )
}

fn sources(pd: &ProtectionDomain, n: usize, len: usize, seed: u8) -> Vec<MemoryRegion> {
    (0..n)
        .map(|i| {
            pd.register(pattern(len, seed.wrapping_add(i as u8)), Access::LOCAL)
                .unwrap()
        })
        .collect()
}

/// Posts `n` requests `op` on `qp`, each of a source of its own of `len`
/// bytes ([`sources`] from `seed`), with contexts from `first` up.
fn post_sources(
    qp: &mut ScheduledQueuePair,
    pd: &ProtectionDomain,
    op: SendOp,
    n: usize,
    len: usize,
    seed: u8,
    first: u64,
) {
    for (i, src) in sources(pd, n, len, seed).into_iter().enumerate() {
        qp.post_send(op, src, 0..len, first + i as u64).unwrap();
    }
}

fn check(done: &[Completion]) {
    for c in done {
        assert_eq!(c.status, WcStatus::Success, "request {}", c.context);
    }
}

#[test]
#[ignore = "needs an RDMA device named by MTRDMA_TEST_DEVICE"]
fn two_bulk_tenants_share_by_their_weights() {
    let (_ctx, pd) = device_pd();
    let shared = scheduler(16 << 10, 32 << 10);
    shared
        .set_policy(TenantId(1), TenantPolicy::weight(1))
        .unwrap();
    shared
        .set_policy(TenantId(3), TenantPolicy::weight(3))
        .unwrap();
    let ((a, _pa), (b, _pb)) = (pair(&pd), pair(&pd));
    let mut light = attach(a, &shared, 1, TrafficClass::Bulk);
    let mut heavy = attach(b, &shared, 3, TrafficClass::Bulk);
    const N: usize = 48;
    const LEN: usize = 128 << 10;
    let target_light = pd.allocate(LEN, Access::REMOTE_READ_WRITE).unwrap();
    let target_heavy = pd.allocate(LEN, Access::REMOTE_READ_WRITE).unwrap();
    let (rl, rh) = (
        target_light.remote().unwrap(),
        target_heavy.remote().unwrap(),
    );
    // Both backlogged from the start: all requests queued up front.
    for (i, (s1, s3)) in sources(&pd, N, LEN, 1)
        .into_iter()
        .zip(sources(&pd, N, LEN, 3))
        .enumerate()
    {
        light
            .post_send(SendOp::Write(rl), s1, 0..LEN, i as u64)
            .unwrap();
        heavy
            .post_send(SendOp::Write(rh), s3, 0..LEN, i as u64)
            .unwrap();
    }
    let (mut done_light, mut done_heavy) = (Vec::new(), Vec::new());
    let mut light_when_heavy_finished = None;
    let deadline = Instant::now() + Duration::from_secs(120);
    while done_light.len() < N || done_heavy.len() < N {
        light.poll(&mut done_light).unwrap();
        heavy.poll(&mut done_heavy).unwrap();
        if done_heavy.len() == N && light_when_heavy_finished.is_none() {
            light_when_heavy_finished = Some(done_light.len());
        }
        assert!(
            shared.bulk_bytes_in_flight() <= 32 << 10,
            "bulk bytes in the NIC stay within the budget"
        );
        assert!(Instant::now() < deadline, "the transfers did not finish");
    }
    check(&done_light);
    check(&done_heavy);
    // Weight 3 against 1: when the heavy tenant has sent its 48 requests
    // the light one has sent about 16 (an equal share would be all 48).
    let light_then = light_when_heavy_finished.unwrap();
    assert!(
        (8..=24).contains(&light_then),
        "the weight-1 tenant had {light_then} of {N} requests done when the weight-3 tenant finished"
    );
    assert!(target_heavy.read() == pattern(LEN, 3u8.wrapping_add((N - 1) as u8)));
    assert_eq!(shared.bulk_bytes_in_flight(), 0);
}

#[test]
#[ignore = "needs an RDMA device named by MTRDMA_TEST_DEVICE"]
fn a_latency_request_overtakes_queued_bulk_work() {
    let (_ctx, pd) = device_pd();
    let shared = scheduler(64 << 10, 128 << 10);
    let ((a, _pa), (b, _pb)) = (pair(&pd), pair(&pd));
    let mut bulk = attach(a, &shared, 1, TrafficClass::Bulk);
    let mut probe = attach(b, &shared, 2, TrafficClass::Latency);
    const N: usize = 16;
    const LEN: usize = 1 << 20;
    let target = pd.allocate(LEN, Access::REMOTE_READ_WRITE).unwrap();
    let remote = target.remote().unwrap();
    post_sources(&mut bulk, &pd, SendOp::Write(remote), N, LEN, 0, 0);
    let small = pd.allocate(16, Access::REMOTE_READ_WRITE).unwrap();
    let small_remote = small.remote().unwrap();
    let mut region = pd.allocate(16, Access::LOCAL).unwrap();
    let mut bulk_done = Vec::new();
    // Ten probes, one at a time, while the 16 MiB of bulk WRITEs run: each
    // waits for what is in the NIC (at most 128 KiB of bulk), not for the
    // backlog.
    for round in 0..10u64 {
        probe
            .post_send(SendOp::Write(small_remote), region, 0..16, round)
            .unwrap();
        let mut got = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(30);
        while got.is_empty() {
            probe.poll(&mut got).unwrap();
            bulk.poll(&mut bulk_done).unwrap();
            assert!(Instant::now() < deadline, "probe {round} did not finish");
        }
        let c = got.pop().unwrap();
        assert_eq!((c.status, c.context), (WcStatus::Success, round));
        region = c.region;
    }
    assert!(
        bulk_done.len() < N / 2,
        "the probes finished after {} of {N} bulk WRITEs: they waited for the backlog",
        bulk_done.len()
    );
    bulk_done.extend(wait(&mut bulk, N - bulk_done.len()));
    check(&bulk_done);
    assert!(target.read() == pattern(LEN, (N - 1) as u8));
}

#[test]
#[ignore = "needs an RDMA device named by MTRDMA_TEST_DEVICE"]
fn a_queue_pair_that_is_not_polled_does_not_stall_the_others() {
    let (_ctx, pd) = device_pd();
    let shared = scheduler(64 << 10, 64 << 10);
    let (mut idle, mut busy, _peers) = two_bulk(&pd, &shared);
    const LEN: usize = 256 << 10;
    let target = pd.allocate(LEN, Access::REMOTE_READ_WRITE).unwrap();
    let remote = target.remote().unwrap();
    post_sources(&mut idle, &pd, SendOp::Write(remote), 4, LEN, 10, 0);
    post_sources(&mut busy, &pd, SendOp::Write(remote), 4, LEN, 20, 10);
    // Only `busy` is polled: the budget `idle`'s pieces hold comes back
    // anyway, and `idle`'s requests move along too.
    let done = wait(&mut busy, 4);
    check(&done);
    let rest = wait(&mut idle, 4);
    check(&rest);
    let mut contexts: Vec<u64> = rest.iter().map(|c| c.context).collect();
    contexts.sort_unstable();
    assert_eq!(contexts, [0, 1, 2, 3], "every request comes back once");
    assert_eq!(shared.bulk_bytes_in_flight(), 0);
}

#[test]
#[ignore = "needs an RDMA device named by MTRDMA_TEST_DEVICE"]
fn dropping_a_queue_pair_with_queued_work_frees_its_share() {
    let (_ctx, pd) = device_pd();
    let shared = scheduler(64 << 10, 128 << 10);
    let (mut doomed, mut other, _peers) = two_bulk(&pd, &shared);
    const LEN: usize = 1 << 20;
    // Separate targets: WRITEs of the dropped queue pair already in the
    // NIC may still land after the other's.
    let doomed_target = pd.allocate(LEN, Access::REMOTE_READ_WRITE).unwrap();
    let target = pd.allocate(LEN, Access::REMOTE_READ_WRITE).unwrap();
    let (doomed_remote, remote) = (doomed_target.remote().unwrap(), target.remote().unwrap());
    post_sources(&mut doomed, &pd, SendOp::Write(doomed_remote), 8, LEN, 0, 0);
    let src = pd.register(pattern(LEN, 99), Access::LOCAL).unwrap();
    other
        .post_send(SendOp::Write(remote), src, 0..LEN, 7)
        .unwrap();
    assert_eq!(shared.queue_pairs(), 2);
    drop(doomed);
    assert_eq!(shared.queue_pairs(), 1);
    let done = wait(&mut other, 1);
    check(&done);
    assert_eq!(done[0].context, 7);
    assert!(target.read() == pattern(LEN, 99));
    assert_eq!(shared.bulk_bytes_in_flight(), 0);
}

#[test]
#[ignore = "needs an RDMA device named by MTRDMA_TEST_DEVICE"]
fn threads_of_several_tenants_post_and_poll_on_one_scheduler() {
    let (_ctx, pd) = device_pd();
    let shared = scheduler(32 << 10, 96 << 10);
    std::thread::scope(|s| {
        for t in 0..4u32 {
            let (pd, shared) = (&pd, &shared);
            s.spawn(move || {
                let (a, _peer) = pair(pd);
                let class = if t == 0 {
                    TrafficClass::Latency
                } else {
                    TrafficClass::Bulk
                };
                let mut qp = attach(a, shared, t, class);
                let len = if t == 0 { 64 } else { 100_000 };
                let target = pd.allocate(len, Access::REMOTE_READ_WRITE).unwrap();
                let remote = target.remote().unwrap();
                for i in 0..20u8 {
                    let seed = (t as u8).wrapping_mul(50).wrapping_add(i);
                    let src = pd.register(pattern(len, seed), Access::LOCAL).unwrap();
                    qp.post_send(SendOp::Write(remote), src, 0..len, u64::from(i))
                        .unwrap();
                    let c = wait(&mut qp, 1).pop().unwrap();
                    assert_eq!((c.status, c.context), (WcStatus::Success, u64::from(i)));
                    assert!(target.read() == pattern(len, seed), "tenant {t} write {i}");
                }
            });
        }
    });
    assert_eq!(shared.queue_pairs(), 0);
    assert_eq!(shared.bulk_bytes_in_flight(), 0);
}

/// A queue pair whose peer never posts a receive (and asks for the
/// longest wait between retries, 655 ms) keeps its SENDs in the NIC for
/// seconds. On a shared scheduler those bytes used to hold the bulk budget
/// until its SENDs failed, and every other tenant's bulk traffic stopped
/// with them. Now the stuck queue pair is taken off the budget once its
/// oldest piece has been out for `stall_after` (100 ms): the other tenant
/// finishes long before the stuck one fails, and the stuck one's requests
/// all come back, failed, with the error that says why (none is lost).
#[test]
#[ignore = "needs an RDMA device named by MTRDMA_TEST_DEVICE"]
fn a_stuck_queue_pair_does_not_hold_the_others_bulk_traffic() {
    let (_ctx, pd) = device_pd();
    let shared = scheduler(16 << 10, 64 << 10);
    // The stuck pair: its peer posts no receive and asks for 655 ms
    // between retries (7 tries: about 4.6 s before the SEND fails).
    let a = pd.queue_pair().build().unwrap();
    let b = pd.queue_pair().min_rnr_timer(0).build().unwrap();
    let (a, _b) = common::connect(a, b);
    let mut stuck = attach(a, &shared, 1, TrafficClass::Bulk);
    let (c, _pc) = pair(&pd);
    let mut other = attach(c, &shared, 2, TrafficClass::Bulk);

    const SEND: usize = 16 << 10;
    let start = Instant::now();
    // Four SENDs fill the budget.
    post_sources(&mut stuck, &pd, SendOp::Send, 4, SEND, 1, 0);
    const LEN: usize = 256 << 10;
    let target = pd.allocate(LEN, Access::REMOTE_READ_WRITE).unwrap();
    let remote = target.remote().unwrap();
    post_sources(&mut other, &pd, SendOp::Write(remote), 4, LEN, 20, 10);
    let (mut done_stuck, mut done_other) = (Vec::new(), Vec::new());
    let mut other_finished = None;
    let deadline = start + Duration::from_secs(60);
    while done_stuck.len() < 4 || done_other.len() < 4 {
        stuck.poll(&mut done_stuck).unwrap();
        other.poll(&mut done_other).unwrap();
        if done_other.len() == 4 && other_finished.is_none() {
            other_finished = Some((start.elapsed(), done_stuck.len()));
        }
        assert!(Instant::now() < deadline, "requests never came back");
        std::thread::sleep(Duration::from_micros(200));
    }
    check(&done_other);
    let (other_took, stuck_done_then) = other_finished.unwrap();
    assert_eq!(
        stuck_done_then, 0,
        "the stuck SENDs were still in the NIC when the other tenant finished ({other_took:?})"
    );
    assert!(
        other_took < Duration::from_secs(3),
        "the other tenant's 1 MiB took {other_took:?}, waiting behind the stuck queue pair"
    );
    // The stuck SENDs all come back, the first with the reason.
    let mut contexts: Vec<u64> = done_stuck.iter().map(|c| c.context).collect();
    contexts.sort_unstable();
    assert_eq!(contexts, [0, 1, 2, 3], "every request comes back once");
    assert!(done_stuck.iter().all(|c| c.status != WcStatus::Success));
    assert!(
        done_stuck
            .iter()
            .any(|c| c.status == WcStatus::RnrRetryExceeded),
        "statuses {:?}",
        done_stuck.iter().map(|c| c.status).collect::<Vec<_>>()
    );
    assert_eq!(shared.bulk_bytes_in_flight(), 0);
}
