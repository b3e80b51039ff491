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
    // The peer sends 200 ms after the receive is up (timed from then:
    // setting up the runtime may take longer than that on an emulated
    // CPU, and a SEND before the receive would find none).
    let (posted_tx, posted_rx) = std::sync::mpsc::channel();
    let peer = std::thread::spawn(move || {
        posted_rx.recv().unwrap();
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
        let pending = receiver.post_recv(dst, 0..LEN).unwrap();
        posted_tx.send(()).unwrap();
        let c = tokio::time::timeout(Duration::from_secs(30), pending)
            .await
            .expect("the SEND's arrival wakes the task")
            .unwrap();
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

/// A future that counts how often it is polled.
struct Counted<F> {
    inner: F,
    polls: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

impl<F: Future + Unpin> Future for Counted<F> {
    type Output = F::Output;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<F::Output> {
        self.polls
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        std::pin::Pin::new(&mut self.inner).poll(cx)
    }
}

/// 32 tasks, each waiting for a receive of its own, which a peer thread
/// fills one SEND at a time, 2 ms apart, 20 rounds (each task posts its
/// receive again when it completes): every message reaches the task whose
/// receive it was, and a completion wakes its own task and, when that task
/// was the one registered for the completion channel, one other to take
/// over, not every task that waits. With every waiting task woken each
/// time a request resolved, each message would cost about as many polls
/// as tasks wait (31 here); the bound allows 8.
#[test]
#[ignore = "needs an RDMA device: cargo xtask test runs it in the SoftRoCE VM"]
fn many_tasks_waiting_for_receives_are_woken_one_each_not_all_each_time() {
    const TASKS: usize = 32;
    const ROUNDS: usize = 20;
    const LEN: usize = 64;
    let (_ctx, pd) = device_pd();
    let (mut sender, receiver) = pair_with_events(&pd, true);
    let messages = TASKS * ROUNDS;
    let polls = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let rt = runtime();
    let receiver = rt.block_on(async { AsyncQueuePair::new(receiver).unwrap() });
    let mut tasks = tokio::task::JoinSet::new();
    let (posted_tx, posted_rx) = std::sync::mpsc::channel();
    for t in 0..TASKS {
        let (q, polls, posted_tx) = (receiver.clone(), polls.clone(), posted_tx.clone());
        let mut dst = pd.allocate(LEN, Access::LOCAL).unwrap();
        tasks.spawn_on(
            async move {
                let mut got = Vec::new();
                for round in 0..ROUNDS {
                    let pending = q.post_recv(dst, 0..LEN).map_err(|e| e.error).unwrap();
                    if round == 0 {
                        posted_tx.send(()).unwrap();
                    }
                    let c = Counted {
                        inner: pending,
                        polls: polls.clone(),
                    }
                    .await
                    .unwrap();
                    assert_eq!(c.status, WcStatus::Success, "task {t}, round {round}");
                    got.push(c.region.as_slice().unwrap()[0]);
                    dst = c.region;
                }
                (t, got)
            },
            rt.handle(),
        );
    }
    let src = pd.register(vec![0u8; LEN], Access::LOCAL).unwrap();
    let peer = std::thread::spawn(move || {
        // Every task's first receive is up before the first SEND.
        for _ in 0..TASKS {
            posted_rx.recv().unwrap();
        }
        let mut src = src;
        for i in 0..messages {
            std::thread::sleep(Duration::from_millis(2));
            src.as_mut_slice().unwrap()[0] = i as u8;
            sender
                .post_send(SendOp::Send, src, 0..LEN, i as u64)
                .unwrap();
            let sent = common::wait(&mut sender, 1).pop().unwrap();
            assert!(sent.status.is_success(), "SEND {i}: {}", sent.status);
            src = sent.region;
        }
        sender
    });
    let results = rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(120), async {
            let mut all = Vec::new();
            while let Some(done) = tasks.join_next().await {
                all.push(done.expect("a task finished without panicking"));
            }
            all
        })
        .await
        .expect("every task finishes: no wake-up is lost")
    });
    peer.join().unwrap();
    assert_eq!(receiver.waiting(), 0);
    // The receive queue is first in, first out: in every round each task's
    // receive takes the message of its place in that round's order.
    let mut firsts: Vec<u8> = results.iter().map(|(_, got)| got[0]).collect();
    firsts.sort_unstable();
    assert_eq!(firsts, (0..TASKS as u8).collect::<Vec<_>>());
    for (t, got) in &results {
        assert_eq!(got.len(), ROUNDS, "task {t}");
    }
    let polls = polls.load(std::sync::atomic::Ordering::Relaxed);
    let messages = messages as u64;
    eprintln!(
        "{messages} messages, {polls} polls of the receives' futures ({:.2} a message)",
        polls as f64 / messages as f64
    );
    assert!(
        polls <= 8 * messages,
        "{polls} polls for {messages} messages"
    );
}
