//! Reliable-connected queue pairs on a real device (loopback: both ends on
//! the device named by MTRDMA_TEST_DEVICE). Ignored on a plain `cargo test`;
//! `cargo xtask test` runs them in the SoftRoCE VM.

mod common;
// Batches and gather lists: a file of their own.
#[path = "rc/batch.rs"]
mod batch;
// Memory the caller owns (mappings, huge pages).
#[path = "rc/memory.rs"]
mod memory;
// Pieces lent through memory windows.
#[path = "rc/window.rs"]
mod window;

use common::{device_pd, pair, pattern, wait};

use std::time::{Duration, Instant};

use mtrdma_core::{LinkConfig, Policy, QuotaTable, TenantEntry, TenantHandle, TenantId};
use mtrdma_verbs::PollCompletions;
use mtrdma_verbs::{
    Access, Completion, Error, MemoryRegion, Opcode, QueuePair, RemoteRegion, SendOp, WcStatus,
};

const SIZES: [usize; 9] = [
    1,
    2,
    63,
    4096,
    65_535,
    65_537,
    1 << 20,
    (1 << 20) + 7,
    8 << 20,
];

#[test]
#[ignore = "needs an RDMA device named by MTRDMA_TEST_DEVICE"]
fn send_write_read_move_every_byte_for_sizes_from_1_b_to_8_mib() {
    let (ctx, pd) = device_pd();
    // iWARP carries no immediate data (refused by name, in
    // `requests_of_a_kind_the_device_does_not_run_are_refused_by_name`).
    let imm = !ctx.is_iwarp();
    let (mut a, mut b) = pair(&pd);
    for (i, &len) in SIZES.iter().enumerate() {
        let seed = i as u8;
        // SEND / RECV.
        let recv = pd.allocate(len, Access::LOCAL).unwrap();
        b.post_recv(recv, 0..len, 1).unwrap();
        let send = pd.register(pattern(len, seed), Access::LOCAL).unwrap();
        a.post_send(SendOp::Send, send, 0..len, 2).unwrap();
        let sent = wait(&mut a, 1).pop().unwrap();
        assert_eq!(
            (sent.status, sent.opcode, sent.context),
            (WcStatus::Success, Opcode::Send, 2)
        );
        assert_eq!(
            sent.region.read(),
            &pattern(len, seed)[..],
            "the sender's buffer comes back intact"
        );
        let got = wait(&mut b, 1).pop().unwrap();
        assert_eq!(
            (got.status, got.opcode, got.byte_len as usize),
            (WcStatus::Success, Opcode::Recv, len)
        );
        assert!(
            got.region.read() == pattern(len, seed),
            "SEND of {len} B arrived intact"
        );

        // SEND with immediate.
        if imm {
            b.post_recv(got.region, 0..len, 3).unwrap();
            a.post_send(
                SendOp::SendWithImm(0xdead_0000 + i as u32),
                sent.region,
                0..len,
                4,
            )
            .unwrap();
            wait(&mut a, 1);
            let got = wait(&mut b, 1).pop().unwrap();
            assert_eq!(got.imm, Some(0xdead_0000 + i as u32));
        }

        // WRITE into B's region, then READ it back into a fresh region.
        let target = pd.allocate(len, Access::REMOTE_READ_WRITE).unwrap();
        let remote = target.remote().unwrap();
        let src = pd
            .register(pattern(len, seed.wrapping_add(7)), Access::LOCAL)
            .unwrap();
        a.post_send(SendOp::Write(remote), src, 0..len, 5).unwrap();
        let w = wait(&mut a, 1).pop().unwrap();
        assert_eq!((w.status, w.opcode), (WcStatus::Success, Opcode::Write));
        let back = pd.allocate(len, Access::LOCAL).unwrap();
        a.post_send(SendOp::Read(remote), back, 0..len, 6).unwrap();
        let r = wait(&mut a, 1).pop().unwrap();
        assert_eq!((r.status, r.opcode), (WcStatus::Success, Opcode::Read));
        assert!(
            r.region.read() == pattern(len, seed.wrapping_add(7)),
            "WRITE+READ of {len} B"
        );
        assert!(
            target.read() == pattern(len, seed.wrapping_add(7)),
            "the WRITE landed"
        );

        // WRITE with immediate: data lands and the peer's receive gets the value.
        if !imm {
            continue;
        }
        let note = pd.allocate(1, Access::LOCAL).unwrap();
        b.post_recv(note, 0..1, 7).unwrap();
        a.post_send(
            SendOp::WriteWithImm(remote, 42 + i as u32),
            w.region,
            0..len,
            8,
        )
        .unwrap();
        wait(&mut a, 1);
        let n = wait(&mut b, 1).pop().unwrap();
        assert_eq!(
            (n.opcode, n.imm, n.byte_len as usize),
            (Opcode::RecvWithImm, Some(42 + i as u32), len)
        );
    }
}

#[test]
#[ignore = "needs an RDMA device named by MTRDMA_TEST_DEVICE"]
fn a_write_outside_the_remote_region_is_refused_before_posting() {
    let (_ctx, pd) = device_pd();
    let (mut a, _b) = pair(&pd);
    let target = pd.allocate(4096, Access::REMOTE_READ_WRITE).unwrap();
    let remote = target.remote().unwrap();
    assert!(
        remote.slice(4000, 100).is_none(),
        "a slice past the end does not exist"
    );
    let tail = remote.slice(4000, 96).unwrap();
    let src = pd.register(pattern(200, 1), Access::LOCAL).unwrap();
    let refused = a
        .post_send(SendOp::Write(tail), src, 0..200, 1)
        .unwrap_err();
    assert!(
        matches!(*refused.error, Error::RemoteOutOfBounds { len: 200, .. }),
        "{}",
        refused.error
    );
    assert!(refused.to_string().contains("refused before posting"));
    assert_eq!(
        refused.region.read(),
        &pattern(200, 1)[..],
        "the region comes back untouched"
    );
    assert_eq!(a.in_flight(), (0, 0), "nothing was posted");
    let err = a
        .post_send(SendOp::Send, refused.region, 100..300, 2)
        .unwrap_err();
    assert!(
        matches!(*err.error, Error::LocalRangeOutOfBounds { .. }),
        "{}",
        err.error
    );
    // Regions without remote rights have no remote descriptor.
    assert!(pd.allocate(16, Access::LOCAL).unwrap().remote().is_none());
}

/// Fetch-and-add and compare-and-swap change the peer's word and return
/// what it held, on a plain queue pair and through a tenant's scheduler
/// (one completion each, never split); operands that are not one aligned
/// 8-byte word are refused before posting.
#[test]
#[ignore = "needs an RDMA device named by MTRDMA_TEST_DEVICE"]
fn atomics_change_the_peers_word_and_return_what_it_held() {
    let (_ctx, pd) = device_pd();
    let a = pd.queue_pair().build().unwrap();
    let b = pd.queue_pair().access(Access::REMOTE_ALL).build().unwrap();
    let (mut a, _b) = common::connect(a, b);
    let word = pd
        .register(40u64.to_ne_bytes().to_vec(), Access::REMOTE_ALL)
        .unwrap();
    let remote = word.remote().unwrap();
    let old = |c: &mtrdma_verbs::Completion| {
        assert_eq!(
            (c.status, c.opcode, c.byte_len),
            (WcStatus::Success, Opcode::Atomic, 8)
        );
        u64::from_ne_bytes(c.region.read().try_into().unwrap())
    };
    let local = pd.allocate(8, Access::LOCAL).unwrap();
    a.post_send(SendOp::FetchAdd(remote, 2), local, 0..8, 1)
        .unwrap();
    let c = wait(&mut a, 1).pop().unwrap();
    assert_eq!(old(&c), 40);
    let ops = [
        (
            SendOp::CompareSwap {
                remote,
                compare: 42,
                swap: 7,
            },
            42,
        ),
        (
            SendOp::CompareSwap {
                remote,
                compare: 1,
                swap: 9,
            },
            7,
        ),
    ];
    let mut local = c.region;
    for (i, (op, held)) in ops.into_iter().enumerate() {
        a.post_send(op, local, 0..8, 2 + i as u64).unwrap();
        let c = wait(&mut a, 1).pop().unwrap();
        assert_eq!(old(&c), held);
        local = c.region;
    }
    assert_eq!(
        word.read(),
        7u64.to_ne_bytes(),
        "the swap that did not match left it"
    );

    // Not one aligned word: refused, the region back untouched.
    let wide = pd.allocate(16, Access::LOCAL).unwrap();
    let refused = a
        .post_send(SendOp::FetchAdd(remote, 1), wide, 0..16, 9)
        .unwrap_err();
    assert!(
        matches!(*refused.error, Error::AtomicLayout { local_len: 16, .. }),
        "{}",
        refused.error
    );
    let askew = mtrdma_verbs::RemoteRegion {
        addr: remote.addr + 4,
        len: 4,
        ..remote
    };
    let refused = a
        .post_send(SendOp::FetchAdd(askew, 1), local, 0..8, 9)
        .unwrap_err();
    assert!(
        refused.to_string().contains("8-byte aligned"),
        "{}",
        refused.error
    );
    assert_eq!(a.in_flight(), (0, 0), "nothing was posted");
    let local = refused.region;

    // Through a tenant's scheduler: one completion, the word changed once.
    let (_table, tenant) = tenant(4, 1 << 20);
    let s = pd.queue_pair().tenant(&tenant).build().unwrap();
    let t = pd.queue_pair().access(Access::REMOTE_ALL).build().unwrap();
    let (s, _t) = common::connect(s, t);
    let mut s = s
        .scheduled(mtrdma_verbs::ScheduleConfig::default())
        .unwrap();
    s.post_send(SendOp::FetchAdd(remote, 5), local, 0..8, 10)
        .unwrap();
    let c = wait(&mut s, 1).pop().unwrap();
    assert_eq!((c.context, old(&c)), (10, 7));
    assert_eq!(word.read(), 12u64.to_ne_bytes());
}

/// A quota table whose one tenant (1) may have `max_qps` queue pairs and
/// `max_mr_bytes` of registered memory, and that tenant.
fn tenant(max_qps: u32, max_mr_bytes: u64) -> (QuotaTable, TenantHandle) {
    let tenant = TenantEntry::new(TenantId(1), "t")
        .with_max_qps(max_qps)
        .with_max_mr_bytes(max_mr_bytes);
    let table = QuotaTable::embedded(&Policy::new(LinkConfig::new(1_000_000_000), vec![tenant]))
        .unwrap()
        .table();
    let handle = table.attach(TenantId(1)).unwrap();
    (table, handle)
}

#[test]
#[ignore = "needs an RDMA device named by MTRDMA_TEST_DEVICE"]
fn a_tenant_gets_exactly_its_quota_of_qps_and_mr_bytes() {
    let (_ctx, pd) = device_pd();
    let (table, t) = tenant(4, 10 << 20);
    let mut made = Vec::new();
    let mut refused = 0;
    for _ in 0..7 {
        match pd.queue_pair().tenant(&t).build() {
            Ok(qp) => made.push(qp),
            Err(Error::Admission(e)) => {
                assert!(e.to_string().contains("limit 4, in use 4"), "{e}");
                refused += 1;
            }
            Err(e) => panic!("unexpected error {e}"),
        }
    }
    assert_eq!((made.len(), refused), (4, 3));
    drop(made);
    assert_eq!(
        table.usage().unwrap()[0].qps.0,
        0,
        "dropped queue pairs give their quota back"
    );

    let mut regions = Vec::new();
    let mut refused = 0;
    for _ in 0..7 {
        match pd.register_for(&t, vec![0u8; 3 << 20], Access::LOCAL) {
            Ok(mr) => regions.push(mr),
            Err(Error::Admission(_)) => refused += 1,
            Err(e) => panic!("unexpected error {e}"),
        }
    }
    assert_eq!((regions.len(), refused), (3, 4), "3 x 3 MiB fit in 10 MiB");
    drop(regions);
    assert_eq!(table.usage().unwrap()[0].mr_bytes.0, 0);
}

#[test]
#[ignore = "needs an RDMA device named by MTRDMA_TEST_DEVICE"]
fn dropping_a_qp_with_100_requests_in_flight_frees_every_buffer() {
    let (_ctx, pd) = device_pd();
    let (table, t) = tenant(16, 1 << 30);
    let (a, mut b) = pair(&pd);
    for i in 0..100 {
        let mr: MemoryRegion = pd.register_for(&t, vec![0u8; 4096], Access::LOCAL).unwrap();
        b.post_recv(mr, 0..4096, i).unwrap();
    }
    assert_eq!(b.in_flight(), (0, 100));
    assert_eq!(table.usage().unwrap()[0].mr_bytes.0, 100 * 4096);
    drop(b);
    // Every region was flushed, deregistered and freed: the tenant's
    // memory-region count is back to zero.
    assert_eq!(table.usage().unwrap()[0].mr_bytes.0, 0);
    drop(a);
}

#[test]
#[ignore = "needs an RDMA device named by MTRDMA_TEST_DEVICE"]
fn the_peer_destroyed_mid_transfer_gives_errors_and_buffers_back() {
    let (_ctx, pd) = device_pd();
    let (mut a, b) = pair(&pd);
    let target = pd.allocate(1 << 20, Access::REMOTE_READ_WRITE).unwrap();
    let remote = target.remote().unwrap();
    // The first write completes while the peer lives; then the peer goes
    // away with the rest still to be sent.
    let first = pd.register(pattern(1 << 20, 0), Access::LOCAL).unwrap();
    a.post_send(SendOp::Write(remote), first, 0..1 << 20, 0)
        .unwrap();
    let mut out = wait(&mut a, 1);
    assert!(out[0].status.is_success());
    drop(b);
    let n = 20u64;
    for i in 1..n {
        let src = pd
            .register(pattern(1 << 20, i as u8), Access::LOCAL)
            .unwrap();
        a.post_send(SendOp::Write(remote), src, 0..1 << 20, i)
            .unwrap();
    }
    // A moment for the transport's own errors (its retries take longer
    // than that on rxe; either way every request must come back).
    let deadline = Instant::now() + Duration::from_secs(2);
    while out.len() < n as usize && Instant::now() < deadline {
        a.poll(&mut out).unwrap();
    }
    let before_error_state = out.len();
    if out.len() < n as usize {
        // What an application does once it knows the peer is gone, instead
        // of waiting out the transport's retries: flush everything.
        a.set_error().unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        while out.len() < n as usize && Instant::now() < deadline {
            a.poll(&mut out).unwrap();
        }
    }
    println!("{before_error_state} of {n} completed before the error state");
    assert_eq!(out.len(), n as usize, "every request completes");
    assert_eq!(a.in_flight(), (0, 0));
    assert!(
        out[1..].iter().all(|c| !c.status.is_success()),
        "every write to the dead peer failed"
    );
    let mut contexts: Vec<u64> = out.iter().map(|c| c.context).collect();
    contexts.sort_unstable();
    assert_eq!(
        contexts,
        (0..n).collect::<Vec<_>>(),
        "each buffer came back once"
    );
    for c in &out {
        assert_eq!(c.region.read(), &pattern(1 << 20, c.context as u8)[..]);
        if !c.status.is_success() {
            assert!(
                matches!(
                    c.status,
                    WcStatus::RetryExceeded
                        | WcStatus::Flushed
                        | WcStatus::RemoteInvalidRequest
                        | WcStatus::RemoteAccess
                ),
                "{}",
                c.status
            );
        }
    }
}

#[test]
#[ignore = "needs an RDMA device named by MTRDMA_TEST_DEVICE"]
fn small_sends_go_inline_and_arrive_intact() {
    let (_ctx, pd) = device_pd();
    let a = pd.queue_pair().max_inline_data(64).build().unwrap();
    let b = pd.queue_pair().max_inline_data(64).build().unwrap();
    let (mut a, mut b) = common::connect(a, b);
    let target = pd.allocate(256, Access::REMOTE_READ_WRITE).unwrap();
    let remote = target.remote().unwrap();
    // Inline (16 and 64 B) and not (65 and 256 B), WRITE and SEND.
    for (i, len) in [16usize, 64, 65, 256].into_iter().enumerate() {
        let src = pd.register(pattern(len, i as u8), Access::LOCAL).unwrap();
        a.post_send(SendOp::Write(remote), src, 0..len, i as u64)
            .unwrap();
        let c = wait(&mut a, 1).pop().unwrap();
        assert_eq!((c.status, c.byte_len as usize), (WcStatus::Success, len));
        assert_eq!(
            c.region.read(),
            pattern(len, i as u8),
            "the region comes back as it was"
        );
        assert_eq!(
            &target.read()[..len],
            &pattern(len, i as u8)[..],
            "WRITE of {len} B"
        );

        let landing = pd.allocate(len, Access::LOCAL).unwrap();
        b.post_recv(landing, 0..len, 100).unwrap();
        let src = pd
            .register(pattern(len, 0x40 ^ i as u8), Access::LOCAL)
            .unwrap();
        a.post_send(SendOp::Send, src, 0..len, 200).unwrap();
        assert!(wait(&mut a, 1)[0].status.is_success());
        let got = wait(&mut b, 1).pop().unwrap();
        assert_eq!(
            got.region.read(),
            pattern(len, 0x40 ^ i as u8),
            "SEND of {len} B"
        );
    }
}

#[test]
#[ignore = "needs an RDMA device named by MTRDMA_TEST_DEVICE"]
fn pieces_of_one_registration_are_posted_at_once_and_come_back() {
    const PIECE: usize = 16 << 10;
    const PIECES: usize = 8;
    let (_ctx, pd) = device_pd();
    // One registration of 128 KiB for the tenant, counted once.
    let (table, t) = tenant(16, 1 << 30);
    let (mut a, _b) = pair(&pd);
    let target = pd
        .allocate(PIECE * PIECES, Access::REMOTE_READ_WRITE)
        .unwrap();
    let remote = target.remote().unwrap();
    let mut data = Vec::new();
    for i in 0..PIECES {
        data.extend(pattern(PIECE, i as u8));
    }
    let source = pd.register_for(&t, data.clone(), Access::LOCAL).unwrap();
    assert_eq!(
        table.usage().unwrap()[0].mr_bytes.0,
        (PIECE * PIECES) as u64
    );
    // Every piece in flight at once, each WRITE to its own slice.
    let pieces = source.into_pieces(PIECE).unwrap();
    assert_eq!(pieces.len(), PIECES);
    for (i, piece) in pieces.into_iter().enumerate() {
        assert_eq!((piece.offset(), piece.len()), (i * PIECE, PIECE));
        let to = remote.slice((i * PIECE) as u64, PIECE as u64).unwrap();
        a.post_send(SendOp::Write(to), piece, 0..PIECE, i as u64)
            .unwrap();
    }
    assert_eq!(a.in_flight().0, PIECES as u32);
    let mut done = wait(&mut a, PIECES);
    assert!(done.iter().all(|c| c.status == WcStatus::Success));
    assert!(target.read() == data, "every piece landed at its place");
    // The pieces come back and join into the registration again.
    done.sort_by_key(|c| c.context);
    let mut pieces = done.into_iter().map(|c| c.region);
    let mut whole = pieces.next().unwrap();
    for piece in pieces {
        whole = whole.join(piece).map_err(|_| "adjacent pieces").unwrap();
    }
    assert_eq!((whole.offset(), whole.len()), (0, PIECE * PIECES));
    assert!(whole.as_slice().unwrap() == &data[..]);
    // Still one registration until the last piece goes.
    assert_eq!(
        table.usage().unwrap()[0].mr_bytes.0,
        (PIECE * PIECES) as u64
    );
    drop(whole);
    assert_eq!(table.usage().unwrap()[0].mr_bytes.0, 0);
}

#[test]
#[ignore = "needs an RDMA device named by MTRDMA_TEST_DEVICE"]
fn queues_deeper_than_the_device_allows_are_refused_by_name() {
    let (table, handle) = tenant(4, 1 << 30);
    let (_ctx, pd) = device_pd();
    // u32::MAX + 128 for the completion queue overflowed before.
    match pd
        .queue_pair()
        .tenant(&handle)
        .max_send_wr(u32::MAX)
        .build()
    {
        Err(Error::QueueTooDeep { what, asked, .. }) => {
            assert_eq!((what, asked), ("max_send_wr", u64::from(u32::MAX)));
        }
        other => panic!("expected QueueTooDeep, got {other:?}"),
    }
    match pd
        .ud_queue_pair()
        .tenant(&handle)
        .max_recv_wr(u32::MAX)
        .build()
    {
        Err(Error::QueueTooDeep { what, .. }) => assert_eq!(what, "max_recv_wr"),
        other => panic!("expected QueueTooDeep, got {other:?}"),
    }
    // The refused queue pairs' admissions were given back.
    assert_eq!(table.usage().unwrap()[0].qps.0, 0);
    pd.queue_pair().tenant(&handle).build().unwrap();
}

/// A SEND to a peer that never posts a receive fails with "receiver not
/// ready" after a bounded number of retries, instead of retrying for ever
/// (the verbs' `rnr_retry = 7`, which kept it, and everything posted
/// behind it, in the NIC for good). The requests behind it are flushed:
/// all come back, none lost.
#[test]
#[ignore = "needs an RDMA device named by MTRDMA_TEST_DEVICE"]
fn a_send_to_a_peer_without_receives_fails_after_bounded_retries() {
    let (_ctx, pd) = device_pd();
    // Default retries (6) at the peer's default wait (0.64 ms), and three
    // retries at a 20 ms wait.
    for (rnr_retry, timer, longest) in [(None, None, 2u64), (Some(3), Some(22), 3)] {
        let mut a = pd.queue_pair();
        if let Some(n) = rnr_retry {
            a = a.rnr_retry(n);
        }
        let a = a.build().unwrap();
        let mut b = pd.queue_pair();
        if let Some(code) = timer {
            b = b.min_rnr_timer(code);
        }
        let b = b.build().unwrap();
        let (mut a, _b) = common::connect(a, b);
        let start = Instant::now();
        for i in 0..3u64 {
            let src = pd.register(pattern(64, i as u8), Access::LOCAL).unwrap();
            a.post_send(SendOp::Send, src, 0..64, i).unwrap();
        }
        let mut out = Vec::new();
        let deadline = start + Duration::from_secs(30);
        while out.len() < 3 {
            a.poll(&mut out).unwrap();
            assert!(
                Instant::now() < deadline,
                "the SEND was still being retried after 30 s"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        let took = start.elapsed();
        assert_eq!(out[0].context, 0);
        assert_eq!(out[0].status, WcStatus::RnrRetryExceeded);
        assert!(out[1..].iter().all(|c| c.status == WcStatus::Flushed));
        assert!(
            took < Duration::from_secs(longest),
            "failed after {took:?} (rnr_retry {rnr_retry:?}, peer's timer {timer:?})"
        );
        assert_eq!(a.in_flight(), (0, 0));
    }
}

/// Immediate data and atomic operations where the device runs them; where
/// it does not (iWARP has no immediate data; SoftiWARP has no atomics
/// either) a clear refusal, the region handed back, the queue pair still
/// working.
#[test]
#[ignore = "needs an RDMA device named by MTRDMA_TEST_DEVICE"]
fn requests_of_a_kind_the_device_does_not_run_are_refused_by_name() {
    let (ctx, pd) = device_pd();
    eprintln!(
        "{}: iWARP {}, atomics {}",
        ctx.name(),
        ctx.is_iwarp(),
        ctx.has_atomics()
    );
    let a = pd.queue_pair().build().unwrap();
    let b = pd.queue_pair().access(Access::REMOTE_ALL).build().unwrap();
    let (mut a, mut b) = common::connect(a, b);
    let word = pd.allocate(8, Access::REMOTE_ALL).unwrap();
    let remote = word.remote().unwrap();
    // Receives for the two requests with immediate data, and the SEND.
    for i in 0..3 {
        let recv = pd.allocate(64, Access::LOCAL).unwrap();
        b.post_recv(recv, 0..64, i).unwrap();
    }
    let ops = [
        (SendOp::SendWithImm(5), !ctx.is_iwarp(), "immediate data"),
        (
            SendOp::WriteWithImm(remote, 6),
            !ctx.is_iwarp(),
            "immediate data",
        ),
        (
            SendOp::FetchAdd(remote, 1),
            ctx.has_atomics(),
            "atomic operations",
        ),
    ];
    for (i, (op, runs, what)) in ops.into_iter().enumerate() {
        let local = pd.allocate(8, Access::LOCAL).unwrap();
        match a.post_send(op, local, 0..8, i as u64) {
            Ok(()) => {
                assert!(runs, "{what} posted on a device without them");
                let done = wait(&mut a, 1).pop().unwrap();
                assert_eq!(done.status, WcStatus::Success, "{what}");
            }
            Err(refused) => {
                assert!(!runs, "{what} refused: {refused}");
                match *refused.error {
                    Error::OperationUnsupported { operation, .. } => assert_eq!(operation, what),
                    ref other => panic!("{what}: {other}"),
                }
                assert_eq!(refused.region.len(), 8, "the region comes back");
            }
        }
    }
    // The queue pair still works: a SEND.
    let local = pd.register(pattern(64, 3), Access::LOCAL).unwrap();
    a.post_send(SendOp::Send, local, 0..64, 9).unwrap();
    assert_eq!(wait(&mut a, 1).pop().unwrap().status, WcStatus::Success);
    // The peer's receives: one per request with immediate data that ran,
    // and the SEND's last.
    let imm = if ctx.is_iwarp() { 0 } else { 2 };
    let got = wait(&mut b, imm + 1).pop().unwrap();
    assert_eq!(got.region.read()[..64], pattern(64, 3)[..]);
}
