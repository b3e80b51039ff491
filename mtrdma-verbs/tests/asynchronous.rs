//! Awaited completions (feature `tokio`) on a real device (loopback on
//! the device named by MTRDMA_TEST_DEVICE), on a current-thread tokio
//! runtime: the completion channel wakes the task, requests resolve to
//! their own regions, scheduled queue pairs pace on tokio's timer, and
//! futures dropped mid-flight lose nothing. Ignored on a plain `cargo
//! test`; `cargo xtask test` runs them in the SoftRoCE VM.
#![cfg(feature = "tokio")]

mod common;

use std::future::Future;
use std::time::{Duration, Instant};

use common::{capped_table, device_pd, pair_with_events, pair_with_events_of, pattern};
use mtrdma_core::TenantId;
use mtrdma_verbs::asynchronous::{AsyncQueuePair, AsyncRecv, AsyncSend, Pending};
use mtrdma_verbs::{
    Access, Completion, MemoryRegion, PostError, ProtectionDomain, ScheduleConfig, SendOp, WcStatus,
};

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

#[test]
#[ignore = "needs an RDMA device: cargo xtask test runs it in the SoftRoCE VM"]
fn a_receive_a_peer_sends_later_wakes_the_waiting_task() {
    const LEN: usize = 3000;
    let (_ctx, pd) = device_pd();
    let (mut sender, receiver) = pair_with_events(&pd, true);
    let src = pd.register(pattern(LEN, 42), Access::LOCAL).unwrap();
    let peer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(200));
        sender.post_send(SendOp::Send, src, 0..LEN, 2).unwrap();
        let sent = common::wait(&mut sender, 1).pop().unwrap();
        assert!(sent.status.is_success(), "{}", sent.status);
        sender
    });
    let rt = runtime();
    let (c, waited) = rt.block_on(async {
        let receiver = AsyncQueuePair::new(receiver).unwrap();
        let dst = pd.allocate(LEN, Access::LOCAL).unwrap();
        let start = Instant::now();
        let c = receiver.post_recv(dst, 0..LEN).unwrap().await.unwrap();
        (c, start.elapsed())
    });
    assert_eq!(c.status, WcStatus::Success);
    assert_eq!(c.byte_len as usize, LEN);
    assert_eq!(c.region.as_slice(), Some(&pattern(LEN, 42)[..]));
    assert!(
        waited >= Duration::from_millis(150),
        "woke before the send: {waited:?}"
    );
    peer.join().unwrap();
}

/// `n` messages from `a` to `b`, each its own pattern; the futures of
/// every third send are dropped as soon as they are made, and of every
/// fifth receive after one poll: every awaited one resolves to its own
/// region with its own bytes, and the dropped ones' completions, found by
/// the others' polls, lose nothing (the queue pairs end with nothing in
/// flight).
async fn exchange<A, B>(
    pd: &ProtectionDomain,
    a: &AsyncQueuePair<A>,
    b: &AsyncQueuePair<B>,
    n: usize,
) where
    A: AsyncSend<Region = MemoryRegion, Refused = PostError, Completion = Completion>,
    B: AsyncRecv<Completion = Completion>,
{
    const LEN: usize = 2048;
    let mut recvs: Vec<(usize, Pending<B>)> = Vec::new();
    for i in 0..n {
        let dst = pd.allocate(LEN, Access::LOCAL).unwrap();
        let mut r = b.post_recv(dst, 0..LEN).map_err(|e| e.error).unwrap();
        if i % 5 == 4 {
            // Polled once (nothing has come), then dropped.
            let waker = std::task::Waker::noop();
            let _ = std::pin::Pin::new(&mut r).poll(&mut std::task::Context::from_waker(waker));
            drop(r);
        } else {
            recvs.push((i, r));
        }
    }
    let mut sends = Vec::new();
    for i in 0..n {
        let src = pd.register(pattern(LEN, i as u8), Access::LOCAL).unwrap();
        let s = a
            .post_send(SendOp::Send, src, 0..LEN)
            .map_err(|e| e.error)
            .unwrap();
        if i % 3 != 2 {
            sends.push((i, s));
        }
    }
    for (i, s) in sends {
        let c = s.await.unwrap();
        assert_eq!(c.status, WcStatus::Success, "send {i}");
        assert_eq!(
            c.region.as_slice(),
            Some(&pattern(LEN, i as u8)[..]),
            "send {i}'s own region"
        );
    }
    for (i, r) in recvs {
        let c = r.await.unwrap();
        assert_eq!(c.status, WcStatus::Success, "receive {i}");
        assert_eq!(
            c.region.as_slice(),
            Some(&pattern(LEN, i as u8)[..]),
            "receive {i}"
        );
    }
    assert_eq!((a.waiting(), b.waiting()), (0, 0));
}

#[test]
#[ignore = "needs an RDMA device: cargo xtask test runs it in the SoftRoCE VM"]
fn requests_resolve_to_their_own_regions_and_dropped_futures_lose_nothing() {
    let (_ctx, pd) = device_pd();
    let (a, b) = pair_with_events(&pd, true);
    runtime().block_on(async {
        let (a, b) = (
            AsyncQueuePair::new(a).unwrap(),
            AsyncQueuePair::new(b).unwrap(),
        );
        exchange(&pd, &a, &b, 60).await;
        // The dropped sends' completions were polled by the others: the
        // send queue has nothing left in flight.
        assert_eq!(a.with(|q| q.in_flight()), (0, 0));
        assert_eq!(b.with(|q| q.in_flight()), (0, 0));
    });
}

#[test]
#[ignore = "needs an RDMA device: cargo xtask test runs it in the SoftRoCE VM"]
fn a_scheduled_queue_pair_paces_on_the_runtime_and_resolves_every_request() {
    // A tenant capped at 256 KiB/s: 40 messages of 2 KiB take about a
    // quarter of a second of pacing, which the futures wait out on tokio's
    // timer.
    let table = capped_table(256 << 10, 2048);
    let handle = table.attach(TenantId(1)).unwrap();
    let (_ctx, pd) = device_pd();
    let (a, b) = pair_with_events_of(&pd, true, Some(&handle));
    let a = a.scheduled(ScheduleConfig::default()).unwrap();
    runtime().block_on(async {
        let (a, b) = (
            AsyncQueuePair::new(a).unwrap(),
            AsyncQueuePair::new(b).unwrap(),
        );
        let start = Instant::now();
        exchange(&pd, &a, &b, 40).await;
        assert!(
            start.elapsed() >= Duration::from_millis(150),
            "{:?}",
            start.elapsed()
        );
    });
}

#[test]
#[ignore = "needs an RDMA device: cargo xtask test runs it in the SoftRoCE VM"]
fn datagrams_posted_with_the_queue_pairs_own_send_resolve_to_their_own_regions() {
    const LEN: usize = 512;
    let (_ctx, pd) = device_pd();
    let qp = pd.ud_queue_pair().completion_events(true).build().unwrap();
    let ep = qp.endpoint();
    let to_self = qp.address_handle(&ep).unwrap();
    runtime().block_on(async {
        let qp = AsyncQueuePair::new(qp).unwrap();
        let recvs: Vec<_> = (0..8)
            .map(|_| {
                let dst = pd.allocate(LEN, Access::LOCAL).unwrap();
                qp.post_recv(dst, 0..LEN).map_err(|e| e.error).unwrap()
            })
            .collect();
        let sends: Vec<_> = (0..8u8)
            .map(|i| {
                let src = pd.register(pattern(LEN, i), Access::LOCAL).unwrap();
                qp.post_with(|q, id| q.post_send(&to_self, ep.qpn, ep.qkey, src, 0..LEN, id))
                    .map_err(|e| e.error)
                    .unwrap()
            })
            .collect();
        for (i, s) in sends.into_iter().enumerate() {
            let c = s.await.unwrap();
            assert_eq!(c.status, WcStatus::Success, "send {i}");
            assert_eq!(c.region.as_slice(), Some(&pattern(LEN, i as u8)[..]));
        }
        // A UD queue pair receives in the order the datagrams came.
        for (i, r) in recvs.into_iter().enumerate() {
            let c = r.await.unwrap();
            assert_eq!(
                (c.status, c.byte_len as usize),
                (WcStatus::Success, LEN),
                "receive {i}"
            );
            assert_eq!(
                c.region.as_slice().map(|b| &b[..LEN]),
                Some(&pattern(LEN, i as u8)[..])
            );
        }
        assert_eq!(qp.waiting(), 0);
    });
}

#[test]
#[ignore = "needs an RDMA device: cargo xtask test runs it in the SoftRoCE VM"]
fn one_registration_serves_every_queue_pair_of_a_shared_completion_queue() {
    const N: usize = 8;
    const LEN: usize = 1024;
    let (ctx, pd) = device_pd();
    let mut server = ctx
        .shared_completion_queue()
        .entries(2048)
        .completion_events(true)
        .build()
        .unwrap();
    let mut clients = Vec::new();
    let mut qpns = Vec::new();
    for _ in 0..N {
        let prepared = pd.queue_pair().build().unwrap();
        let builder = pd.queue_pair().max_send_wr(4).max_recv_wr(4);
        let (qpn, client) = common::connect_on(&mut server, builder, prepared);
        clients.push(client);
        qpns.push(qpn);
    }
    runtime().block_on(async {
        let server = AsyncQueuePair::new(server).unwrap();
        // A receive on each of the server's queue pairs, one future each.
        let recvs: Vec<_> = qpns
            .iter()
            .map(|&qpn| {
                let dst = pd.allocate(LEN, Access::LOCAL).unwrap();
                server
                    .post_with(|cq, id| cq.post_recv(qpn, dst, 0..LEN, id))
                    .map_err(|e| e.error)
                    .unwrap()
            })
            .collect();
        for (i, c) in clients.iter_mut().enumerate() {
            let src = pd.register(pattern(LEN, i as u8), Access::LOCAL).unwrap();
            c.post_send(SendOp::Send, src, 0..LEN, i as u64).unwrap();
        }
        for (i, r) in recvs.into_iter().enumerate() {
            let got = r.await.unwrap();
            assert_eq!(got.qpn, qpns[i], "receive {i} on its own queue pair");
            assert_eq!(got.completion.status, WcStatus::Success);
            assert_eq!(
                got.completion.region.as_slice(),
                Some(&pattern(LEN, i as u8)[..])
            );
        }
        assert_eq!(server.waiting(), 0);
    });
    for c in &mut clients {
        let sent = common::wait(c, 1).pop().unwrap();
        assert!(sent.status.is_success(), "{}", sent.status);
    }
}
