//! Waiting for completions without spinning (`poll_wait` on queue pairs
//! built with completion events), on a real device (loopback on the device
//! named by MTRDMA_TEST_DEVICE). Ignored on a plain `cargo test`; `cargo
//! xtask test` runs them in the SoftRoCE VM.

mod common;

use common::{
    assert_at_cap, capped_table, device_pd, pair_with_events, pair_with_events_of, pattern,
};

use std::sync::mpsc;
use std::time::{Duration, Instant};

use mtrdma_core::{TenantId, TrafficClass};
use mtrdma_verbs::PollCompletions;
use mtrdma_verbs::{
    Access, Completion, Error, MemoryRegion, Opcode, PieceScheduler, ProtectionDomain,
    ScheduleConfig, ScheduledQueuePair, SendOp, SharedConfig, SharedScheduler, UdCompletion,
    WcStatus,
};
use rustix::time::{clock_gettime, ClockId};

/// CPU time this thread has used.
fn thread_cpu() -> Duration {
    let t = clock_gettime(ClockId::ThreadCPUTime);
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

/// `poll_wait`s (with `slice` each) until `n` completions arrive, 30 s at
/// most; returns them and how many calls it took.
fn wait_all(
    mut poll_wait: impl FnMut(&mut Vec<Completion>, Duration) -> Result<usize, Error>,
    n: usize,
    slice: Duration,
) -> (Vec<Completion>, usize) {
    let mut out = Vec::new();
    let mut calls = 0;
    let deadline = Instant::now() + Duration::from_secs(30);
    while out.len() < n {
        poll_wait(&mut out, slice).expect("poll_wait");
        calls += 1;
        assert!(
            Instant::now() < deadline,
            "only {} of {n} completions",
            out.len()
        );
    }
    (out, calls)
}

#[test]
#[ignore = "needs an RDMA device named by MTRDMA_TEST_DEVICE"]
fn an_idle_wait_sleeps_out_its_timeout_without_burning_cpu() {
    let (_ctx, pd) = device_pd();
    let (mut a, _b) = pair_with_events(&pd, false);
    let mut out = Vec::new();
    let (wall, cpu) = (Instant::now(), thread_cpu());
    let n = a.poll_wait(&mut out, Duration::from_millis(200)).unwrap();
    let (wall, cpu) = (wall.elapsed(), thread_cpu() - cpu);
    println!("idle poll_wait of 200 ms: {wall:?} wall, {cpu:?} CPU");
    assert_eq!((n, out.len()), (0, 0), "nothing was posted");
    assert!(
        wall >= Duration::from_millis(150),
        "returned after {wall:?}"
    );
    assert!(wall <= Duration::from_secs(2), "returned after {wall:?}");
    assert!(
        cpu.as_secs_f64() < 0.2 * wall.as_secs_f64(),
        "{cpu:?} of CPU in {wall:?}: it spun"
    );
}

#[test]
#[ignore = "needs an RDMA device named by MTRDMA_TEST_DEVICE"]
fn a_write_completes_through_poll_wait() {
    let (_ctx, pd) = device_pd();
    let (mut a, _b) = pair_with_events(&pd, false);
    for (i, len) in [1usize, 4096, 1 << 20].into_iter().enumerate() {
        let target = pd.allocate(len, Access::REMOTE_READ_WRITE).unwrap();
        let src = pd.register(pattern(len, i as u8), Access::LOCAL).unwrap();
        a.post_send(SendOp::Write(target.remote().unwrap()), src, 0..len, 9)
            .unwrap();
        let mut out = Vec::new();
        let n = a.poll_wait(&mut out, Duration::from_secs(30)).unwrap();
        assert_eq!((n, out.len()), (1, 1));
        let c = &out[0];
        assert_eq!(
            (c.status, c.opcode, c.context, c.byte_len as usize),
            (WcStatus::Success, Opcode::Write, 9, len)
        );
        assert!(target.read() == pattern(len, i as u8), "{len} B landed");
    }
}

/// A queue armed by one wait and left with its event unread (the
/// completion was found by `poll`, not by sleeping) is not armed again,
/// and nothing is missed: the next wait takes the old event, arms, and
/// wakes at the next completion; an idle wait after it sleeps out its
/// timeout rather than waking at once on an event it has already taken.
#[test]
#[ignore = "needs an RDMA device named by MTRDMA_TEST_DEVICE"]
fn a_wait_after_a_completion_found_without_sleeping_misses_nothing() {
    let (_ctx, pd) = device_pd();
    let (mut a, _b) = pair_with_events(&pd, false);
    let target = pd.allocate(4096, Access::REMOTE_READ_WRITE).unwrap();
    let remote = target.remote().unwrap();
    let mut out = Vec::new();
    // Arms the queue and times out: armed, no event.
    assert_eq!(a.poll_wait(&mut out, Duration::from_millis(20)).unwrap(), 0);
    for round in 0..50u64 {
        // Found by polling: its event waits on the descriptor, unread.
        let src = pd
            .register(pattern(4096, round as u8), Access::LOCAL)
            .unwrap();
        a.post_send(SendOp::Write(remote), src, 0..4096, round)
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        while out.is_empty() {
            a.poll(&mut out).unwrap();
            assert!(Instant::now() < deadline, "round {round}: no completion");
        }
        assert_eq!(out.pop().unwrap().context, round);
        // The next one is waited for, behind that unread event.
        let src = pd
            .register(pattern(4096, round as u8), Access::LOCAL)
            .unwrap();
        a.post_send(SendOp::Write(remote), src, 0..4096, 1000 + round)
            .unwrap();
        let (got, _) = wait_all(|o, t| a.poll_wait(o, t), 1, Duration::from_secs(5));
        assert_eq!(got[0].context, 1000 + round);
        assert_eq!(got[0].status, WcStatus::Success);
    }
    let wall = Instant::now();
    assert_eq!(
        a.poll_wait(&mut out, Duration::from_millis(100)).unwrap(),
        0
    );
    assert!(
        wall.elapsed() >= Duration::from_millis(80),
        "an idle wait returned after {:?}",
        wall.elapsed()
    );
}

#[test]
#[ignore = "needs an RDMA device named by MTRDMA_TEST_DEVICE"]
fn a_send_a_peer_thread_posts_later_wakes_the_waiting_receiver() {
    const LEN: usize = 3000;
    let (_ctx, pd) = device_pd();
    let (mut receiver, mut sender) = pair_with_events(&pd, false);
    receiver
        .post_recv(pd.allocate(LEN, Access::LOCAL).unwrap(), 0..LEN, 1)
        .unwrap();
    let src = pd.register(pattern(LEN, 42), Access::LOCAL).unwrap();
    let peer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(100));
        sender.post_send(SendOp::Send, src, 0..LEN, 2).unwrap();
        let sent = common::wait(&mut sender, 1).pop().unwrap();
        assert!(sent.status.is_success(), "{}", sent.status);
        sender
    });
    let (wall, cpu) = (Instant::now(), thread_cpu());
    let mut out = Vec::new();
    let n = receiver
        .poll_wait(&mut out, Duration::from_secs(30))
        .unwrap();
    let (wall, cpu) = (wall.elapsed(), thread_cpu() - cpu);
    println!("woke after {wall:?} with {cpu:?} of CPU");
    assert_eq!(n, 1);
    let got = &out[0];
    assert_eq!(
        (got.status, got.opcode, got.context, got.byte_len as usize),
        (WcStatus::Success, Opcode::Recv, 1, LEN)
    );
    assert!(
        got.region.read() == pattern(LEN, 42),
        "the SEND arrived intact"
    );
    assert!(
        wall >= Duration::from_millis(80),
        "returned after {wall:?}, before the peer sent"
    );
    assert!(wall < Duration::from_secs(10), "woke after {wall:?}");
    assert!(
        cpu.as_secs_f64() < 0.5 * wall.as_secs_f64(),
        "{cpu:?} of CPU in {wall:?}: it spun"
    );
    let _sender = peer.join().unwrap();
}

/// Posts `n` WRITEs of `len` bytes on `a` (request `i` carries
/// `pattern(len, i)`, context `i`) to consecutive slices of a new region,
/// which it returns.
fn post_writes<Q: PieceScheduler>(
    pd: &ProtectionDomain,
    a: &mut ScheduledQueuePair<Q>,
    n: usize,
    len: usize,
) -> MemoryRegion {
    let target = pd.allocate(n * len, Access::REMOTE_READ_WRITE).unwrap();
    let remote = target.remote().unwrap();
    for i in 0..n {
        let src = pd.register(pattern(len, i as u8), Access::LOCAL).unwrap();
        let to = remote.slice((i * len) as u64, len as u64).unwrap();
        a.post_send(SendOp::Write(to), src, 0..len, i as u64)
            .unwrap();
    }
    target
}

/// Checks that each of [`post_writes`]'s `n` WRITEs landed in `target`.
fn check_landed(target: &MemoryRegion, n: usize, len: usize) {
    let landed = target.read();
    for i in 0..n {
        assert!(
            landed[i * len..(i + 1) * len] == pattern(len, i as u8),
            "request {i} landed"
        );
    }
}

#[test]
#[ignore = "needs an RDMA device named by MTRDMA_TEST_DEVICE"]
fn scheduled_requests_queued_behind_the_piece_limit_all_complete_through_poll_wait() {
    const N: usize = 6;
    const LEN: usize = 200 << 10;
    let (_ctx, pd) = device_pd();
    let (a, _b) = pair_with_events(&pd, false);
    let mut a = a
        .scheduled(ScheduleConfig {
            chunk_bytes: 64 << 10,
            max_pieces_in_flight: 1,
            ..ScheduleConfig::local(TenantId(0), TrafficClass::Bulk)
        })
        .unwrap();
    let target = post_writes(&pd, &mut a, N, LEN);
    assert!(a.queued() == N, "all accepted, most of them queued");
    let (wall, cpu) = (Instant::now(), thread_cpu());
    let (done, calls) = wait_all(|out, t| a.poll_wait(out, t), N, Duration::from_secs(5));
    let (wall, cpu) = (wall.elapsed(), thread_cpu() - cpu);
    println!("{N} requests of {LEN} B through {calls} poll_wait calls: {wall:?} wall, {cpu:?} CPU");
    let mut seen: Vec<u64> = done.iter().map(|c| c.context).collect();
    seen.sort_unstable();
    assert_eq!(seen, (0..N as u64).collect::<Vec<_>>());
    for c in &done {
        assert_eq!(
            (c.status, c.opcode, c.byte_len as usize),
            (WcStatus::Success, Opcode::Write, LEN)
        );
    }
    check_landed(&target, N, LEN);
    assert_eq!(a.queued(), 0);
}

#[test]
#[ignore = "needs an RDMA device named by MTRDMA_TEST_DEVICE"]
fn requests_held_back_by_a_rate_cap_go_at_the_cap_through_poll_wait() {
    // Nothing completes while the rate limit holds a request back: only
    // the engine's wake-up time ends the wait.
    const CAP: u64 = 1_000_000;
    const LEN: usize = 4096;
    const N: u64 = 50;
    let table = capped_table(CAP, LEN as u64);
    let (_ctx, pd) = device_pd();
    let handle = table.attach(TenantId(1)).unwrap();
    let (a, _b) = pair_with_events_of(&pd, false, Some(&handle));
    let mut a = a.scheduled(ScheduleConfig::default()).unwrap();
    let target = pd.allocate(LEN, Access::REMOTE_READ_WRITE).unwrap();
    let remote = target.remote().unwrap();
    let mut region = pd.allocate(LEN, Access::LOCAL).unwrap();
    let (start, cpu) = (Instant::now(), thread_cpu());
    for i in 0..N {
        a.post_send(SendOp::Write(remote), region, 0..LEN, i)
            .unwrap();
        let (mut done, _) = wait_all(|out, t| a.poll_wait(out, t), 1, Duration::from_secs(5));
        let c = done.pop().unwrap();
        assert_eq!((c.status, c.context), (WcStatus::Success, i));
        region = c.region;
    }
    let (wall, cpu) = (start.elapsed(), thread_cpu() - cpu);
    // The burst lets the first request go at once: the cap paces the rest.
    let rate = ((N - 1) * LEN as u64) as f64 / wall.as_secs_f64();
    println!(
        "{N} requests of {LEN} B under a {CAP} B/s cap: {rate:.0} B/s, {cpu:?} CPU in {wall:?}"
    );
    assert_at_cap(rate, CAP, "the waits overslept the rate limit's wake-ups");
}

#[test]
#[ignore = "needs an RDMA device named by MTRDMA_TEST_DEVICE"]
fn a_queue_pair_on_a_shared_scheduler_completes_queued_work_through_poll_wait() {
    let (_ctx, pd) = device_pd();
    const N: usize = 6;
    const LEN: usize = 128 << 10;
    let shared = SharedScheduler::new(SharedConfig {
        chunk_bytes: 32 << 10,
        bulk_bytes_in_flight: 64 << 10,
        ..SharedConfig::default()
    })
    .unwrap();
    let (a, _b) = pair_with_events(&pd, false);
    let mut a = a
        .scheduled_on(
            &shared,
            ScheduleConfig::local(TenantId(1), TrafficClass::Bulk),
        )
        .unwrap();
    let target = post_writes(&pd, &mut a, N, LEN);
    let (done, calls) = wait_all(|out, t| a.poll_wait(out, t), N, Duration::from_secs(5));
    println!("{N} requests of {LEN} B on a shared scheduler through {calls} poll_wait calls");
    assert!(done.iter().all(|c| c.status.is_success()));
    check_landed(&target, N, LEN);
    // Idle: the wait sleeps out its timeout (in slices of at most 1 ms).
    let mut out = Vec::new();
    let wall = Instant::now();
    assert_eq!(a.poll_wait(&mut out, Duration::from_millis(50)).unwrap(), 0);
    assert!(wall.elapsed() >= Duration::from_millis(40));
}

#[test]
#[ignore = "needs an RDMA device named by MTRDMA_TEST_DEVICE"]
fn poll_wait_without_completion_events_is_a_clear_error() {
    let (ctx, pd) = device_pd();
    let (mut a, b) = common::pair(&pd);
    let mut out = Vec::new();
    let e = a
        .poll_wait(&mut out, Duration::from_millis(10))
        .unwrap_err();
    assert!(matches!(e, Error::NoCompletionEvents), "{e:?}");
    assert!(e.to_string().contains("completion_events(true)"), "{e}");
    let mut b = b
        .scheduled(ScheduleConfig::local(TenantId(0), TrafficClass::Bulk))
        .unwrap();
    let e = b
        .poll_wait(&mut out, Duration::from_millis(10))
        .unwrap_err();
    assert!(matches!(e, Error::NoCompletionEvents), "{e:?}");
    if ctx.is_iwarp() {
        // No datagrams on iWARP, and it says so.
        let e = pd.ud_queue_pair().build().unwrap_err();
        assert!(matches!(e, Error::OperationUnsupported { .. }), "{e}");
        return;
    }
    let mut ud = pd.ud_queue_pair().build().unwrap();
    let mut ud_out: Vec<UdCompletion> = Vec::new();
    let e = ud
        .poll_wait(&mut ud_out, Duration::from_millis(10))
        .unwrap_err();
    assert!(matches!(e, Error::NoCompletionEvents), "{e:?}");
}

#[test]
#[ignore = "needs an RDMA device named by MTRDMA_TEST_DEVICE"]
fn dropping_queue_pairs_after_events_and_timeouts_does_not_hang() {
    let (_ctx, pd) = device_pd();
    let (finished, rx) = mpsc::channel();
    let pd2 = pd.clone();
    std::thread::spawn(move || {
        let pd = pd2;
        let (mut a, mut b) = pair_with_events(&pd, true);
        let target = pd.allocate(4096, Access::REMOTE_READ_WRITE).unwrap();
        let remote = target.remote().unwrap();
        let mut out = Vec::new();
        // An event taken and acknowledged: a WRITE posted after the wait
        // armed the completion queue.
        b.post_recv(pd.allocate(64, Access::LOCAL).unwrap(), 0..64, 1)
            .unwrap();
        let src = pd.allocate(64, Access::LOCAL).unwrap();
        let poster = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            a.post_send(SendOp::Send, src, 0..64, 2).unwrap();
            a
        });
        assert_eq!(b.poll_wait(&mut out, Duration::from_secs(30)).unwrap(), 1);
        let mut a = poster.join().unwrap();
        // A timeout: armed, nothing came.
        assert_eq!(b.poll_wait(&mut out, Duration::from_millis(30)).unwrap(), 0);
        assert_eq!(a.poll_wait(&mut out, Duration::from_secs(30)).unwrap(), 1);
        assert_eq!(a.poll_wait(&mut out, Duration::from_millis(30)).unwrap(), 0);
        // An event raised and never taken: `a` is armed by the timeout
        // above, then a WRITE completes; and one request still in flight.
        let src = pd.allocate(4096, Access::LOCAL).unwrap();
        a.post_send(SendOp::Write(remote), src, 0..4096, 3).unwrap();
        b.post_recv(pd.allocate(64, Access::LOCAL).unwrap(), 0..64, 4)
            .unwrap();
        std::thread::sleep(Duration::from_millis(50));
        drop(a);
        drop(b);
        // A scheduled queue pair too.
        let (a, _b) = pair_with_events(&pd, false);
        let mut a = a
            .scheduled(ScheduleConfig::local(TenantId(0), TrafficClass::Bulk))
            .unwrap();
        let src = pd.allocate(4096, Access::LOCAL).unwrap();
        a.post_send(SendOp::Write(remote), src, 0..4096, 5).unwrap();
        assert_eq!(a.poll_wait(&mut out, Duration::from_secs(30)).unwrap(), 1);
        assert_eq!(a.poll_wait(&mut out, Duration::from_millis(30)).unwrap(), 0);
        drop(a);
        finished.send(()).unwrap();
    });
    rx.recv_timeout(Duration::from_secs(60))
        .expect("the queue pairs were dropped within 60 s");
}

#[test]
#[ignore = "needs an RDMA device named by MTRDMA_TEST_DEVICE"]
fn a_ud_datagram_wakes_a_waiting_server() {
    let (_ctx, pd) = device_pd();
    let mut server = pd.ud_queue_pair().completion_events(true).build().unwrap();
    let mut client = pd.ud_queue_pair().build().unwrap();
    let mtu = server.mtu() as usize;
    server
        .post_recv(pd.allocate(mtu, Access::LOCAL).unwrap(), 0..mtu, 1)
        .unwrap();
    let ep = server.endpoint();
    let to_server = client.address_handle(&ep).unwrap();
    let msg = pd.register(pattern(100, 7), Access::LOCAL).unwrap();
    let client_qpn = client.qpn();
    let sender = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(100));
        client
            .post_send(&to_server, ep.qpn, ep.qkey, msg, 0..100, 2)
            .unwrap();
        let mut out = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(10);
        while out.is_empty() && Instant::now() < deadline {
            client.poll(&mut out).unwrap();
        }
        assert!(out[0].status.is_success());
    });
    let mut got = Vec::new();
    let wall = Instant::now();
    assert_eq!(
        server.poll_wait(&mut got, Duration::from_secs(30)).unwrap(),
        1
    );
    assert!(wall.elapsed() >= Duration::from_millis(80));
    let c = &got[0];
    assert_eq!(
        (c.status, c.byte_len, c.source.map(|s| s.qpn)),
        (WcStatus::Success, 100, Some(client_qpn))
    );
    assert!(c.region.read()[..100] == pattern(100, 7)[..]);
    sender.join().unwrap();
    // Nothing more: the wait times out.
    assert_eq!(
        server
            .poll_wait(&mut got, Duration::from_millis(50))
            .unwrap(),
        0
    );
}
