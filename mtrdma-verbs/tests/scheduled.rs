//! The scheduled data path on a real device (loopback on the device named
//! by MTRDMA_TEST_DEVICE). Ignored on a plain `cargo test`; `cargo xtask
//! test` runs them in the SoftRoCE VM.

mod common;

use common::{assert_at_cap, capped_table, device_pd, pair, pair_of, pattern, wait};

use std::time::{Duration, Instant};

use mtrdma_core::{LinkConfig, Policy, QuotaTable, RateLimit, TenantEntry, TenantId, TrafficClass};
use mtrdma_sched::FifoScheduler;
use mtrdma_verbs::PollCompletions;
use mtrdma_verbs::{
    Access, Error, MemoryRegion, Opcode, PieceScheduler, QueuePair, ScheduleConfig,
    ScheduledQueuePair, SendOp, SharedConfig, SharedScheduler, WcStatus,
};

/// `qp` scheduled on its own as tenant 0's bulk traffic, in pieces of
/// `chunk_bytes`.
fn chunked(qp: QueuePair, chunk_bytes: u64) -> ScheduledQueuePair {
    qp.scheduled(ScheduleConfig {
        chunk_bytes,
        ..ScheduleConfig::local(TenantId(0), TrafficClass::Bulk)
    })
    .unwrap()
}

#[test]
#[ignore = "needs an RDMA device named by MTRDMA_TEST_DEVICE"]
fn chunked_writes_and_reads_show_one_completion_and_move_every_byte() {
    let (ctx, pd) = device_pd();
    let (a, mut b) = pair(&pd);
    let mut a = chunked(a, 64 << 10);
    for (i, &len) in [1usize, 65_535, 65_536, 65_537, (1 << 20) + 7, 8 << 20]
        .iter()
        .enumerate()
    {
        let seed = i as u8;
        let target = pd.allocate(len, Access::REMOTE_READ_WRITE).unwrap();
        let remote = target.remote().unwrap();

        let src = pd.register(pattern(len, seed), Access::LOCAL).unwrap();
        a.post_send(SendOp::Write(remote), src, 0..len, 1).unwrap();
        let done = wait(&mut a, 1);
        assert_eq!(
            done.len(),
            1,
            "one completion for {len} B however many chunks"
        );
        assert_eq!(
            (done[0].status, done[0].opcode, done[0].byte_len as usize),
            (WcStatus::Success, Opcode::Write, len)
        );
        assert!(
            target.read() == pattern(len, seed),
            "chunked WRITE of {len} B"
        );

        let back = pd.allocate(len, Access::LOCAL).unwrap();
        a.post_send(SendOp::Read(remote), back, 0..len, 2).unwrap();
        let r = wait(&mut a, 1).pop().unwrap();
        assert_eq!(
            (r.status, r.opcode, r.context),
            (WcStatus::Success, Opcode::Read, 2)
        );
        assert!(
            r.region.read() == pattern(len, seed),
            "chunked READ of {len} B"
        );

        // WRITE with immediate: the peer sees one receive, after all the
        // data. iWARP carries no immediate data: refused before anything is
        // queued.
        let src = pd
            .register(pattern(len, seed ^ 0x55), Access::LOCAL)
            .unwrap();
        let op = SendOp::WriteWithImm(remote, 7_000 + i as u32);
        if ctx.is_iwarp() {
            let refused = a.post_send(op, src, 0..len, 4).unwrap_err();
            assert!(
                matches!(*refused.error, Error::OperationUnsupported { .. }),
                "{refused}"
            );
            assert_eq!((refused.region.len(), a.queued()), (len, 0));
            continue;
        }
        let note = pd.allocate(1, Access::LOCAL).unwrap();
        b.post_recv(note, 0..1, 3).unwrap();
        a.post_send(op, src, 0..len, 4).unwrap();
        assert_eq!(wait(&mut a, 1).len(), 1);
        let got = wait(&mut b, 1).pop().unwrap();
        assert_eq!(
            (got.opcode, got.imm),
            (Opcode::RecvWithImm, Some(7_000 + i as u32))
        );
        assert!(target.read() == pattern(len, seed ^ 0x55));
    }
    // A request past the remote region is refused before anything is queued.
    let small = pd.allocate(16, Access::REMOTE_READ_WRITE).unwrap();
    let src = pd.allocate(64, Access::LOCAL).unwrap();
    let refused = a
        .post_send(SendOp::Write(small.remote().unwrap()), src, 0..64, 5)
        .unwrap_err();
    assert!(refused.to_string().contains("refused before posting"));
    assert_eq!(a.queued(), 0);
}

#[test]
#[ignore = "needs an RDMA device named by MTRDMA_TEST_DEVICE"]
fn a_scheduled_queue_pair_lends_a_piece_and_takes_it_back_among_its_pieces() {
    // 64 KiB WRITEs in 16 KiB pieces go on while a piece is lent; the
    // piece comes back through the scheduled poll, with the peer's bytes.
    const LEN: usize = 64 << 10;
    let (_ctx, pd) = device_pd();
    let (a, mut b) = pair(&pd);
    let mut a = chunked(a, 16 << 10);
    let piece = pd.allocate(4096, Access::LENDABLE).unwrap();
    let key = a.lend(piece, Access::REMOTE_READ_WRITE).unwrap();
    assert_eq!(a.lent(), 1);
    let target = pd.allocate(LEN, Access::REMOTE_READ_WRITE).unwrap();
    let src = pd.register(pattern(LEN, 3), Access::LOCAL).unwrap();
    a.post_send(SendOp::Write(target.remote().unwrap()), src, 0..LEN, 1)
        .unwrap();
    // The peer writes the lent piece meanwhile.
    let data = pd.register(pattern(4096, 8), Access::LOCAL).unwrap();
    b.post_send(SendOp::Write(key), data, 0..4096, 2).unwrap();
    assert_eq!(wait(&mut b, 1).pop().unwrap().status, WcStatus::Success);
    a.take_back(&key, 3).unwrap();
    let mut done = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while done.len() < 2 {
        a.poll(&mut done).unwrap();
        assert!(Instant::now() < deadline, "{done:?}");
    }
    let back = done.iter().find(|c| c.context == 3).expect("the piece");
    assert_eq!(
        (back.status, back.opcode, back.region.read()),
        (WcStatus::Success, Opcode::Invalidate, pattern(4096, 8))
    );
    let write = done.iter().find(|c| c.context == 1).expect("the WRITE");
    assert_eq!(
        (write.status, write.byte_len),
        (WcStatus::Success, LEN as u32)
    );
    assert_eq!(target.read(), pattern(LEN, 3));
    assert_eq!(a.lent(), 0);
}

#[test]
#[ignore = "needs an RDMA device named by MTRDMA_TEST_DEVICE"]
fn a_write_with_immediate_sent_whole_shows_its_length_to_the_peer() {
    // 64 KiB in 16 KiB pieces: split, the peer's receive completion
    // reports the last piece's 16 KiB; sent whole, all 64 KiB.
    const LEN: usize = 64 << 10;
    let (_ctx, pd) = device_pd();
    let (a, mut b) = pair(&pd);
    let mut a = chunked(a, 16 << 10);
    let target = pd.allocate(LEN, Access::REMOTE_READ_WRITE).unwrap();
    let remote = target.remote().unwrap();
    for (whole, want) in [(false, 16 << 10), (true, LEN as u32)] {
        b.post_recv(pd.allocate(1, Access::LOCAL).unwrap(), 0..1, 1)
            .unwrap();
        let src = pd.register(pattern(LEN, 9), Access::LOCAL).unwrap();
        let op = SendOp::WriteWithImm(remote, 77);
        if whole {
            a.post_send_whole(op, src, 0..LEN, 2).unwrap();
        } else {
            a.post_send(op, src, 0..LEN, 2).unwrap();
        }
        let done = wait(&mut a, 1).pop().unwrap();
        assert_eq!(
            (done.status, done.byte_len),
            (WcStatus::Success, LEN as u32)
        );
        let got = wait(&mut b, 1).pop().unwrap();
        assert_eq!(
            (got.opcode, got.imm, got.byte_len),
            (Opcode::RecvWithImm, Some(77), want),
            "sent whole: {whole}"
        );
        assert!(target.read() == pattern(LEN, 9));
    }
}

/// For 2 s, keeps each queue pair `t` writing `msg` bytes to
/// `targets[t]` from its `spare[t]` regions, each region posted again
/// once its request completes (successfully, and with all `msg` bytes if
/// `whole`); returns the bytes each completed and the seconds taken.
fn write_for_2_s<Q: PieceScheduler>(
    qps: &mut [ScheduledQueuePair<Q>],
    targets: &[MemoryRegion],
    spare: &mut [Vec<MemoryRegion>],
    msg: usize,
    whole: bool,
) -> ([u64; 2], f64) {
    let mut done_bytes = [0u64; 2];
    let start = Instant::now();
    let mut out = Vec::new();
    while start.elapsed() < Duration::from_secs(2) {
        for t in 0..2 {
            while let Some(region) = spare[t].pop() {
                let remote = targets[t].remote().unwrap();
                qps[t]
                    .post_send(SendOp::Write(remote), region, 0..msg, 0)
                    .unwrap();
            }
            qps[t].poll(&mut out).unwrap();
            for c in out.drain(..) {
                assert!(c.status.is_success(), "{}", c.status);
                if whole {
                    assert_eq!(c.byte_len as usize, msg, "one completion per request");
                }
                done_bytes[t] += u64::from(c.byte_len);
                spare[t].push(c.region);
            }
        }
    }
    (done_bytes, start.elapsed().as_secs_f64())
}

#[test]
#[ignore = "needs an RDMA device named by MTRDMA_TEST_DEVICE"]
fn a_capped_tenant_stays_within_5_percent_of_its_cap_next_to_an_uncapped_one() {
    const CAP: u64 = 2_000_000; // 2 MB/s: well below what rxe under emulation gives one tenant
    const MSG: usize = 1 << 20;
    let policy = Policy::new(
        LinkConfig::new(1_000_000_000),
        vec![
            TenantEntry::new(TenantId(1), "capped").with_rate(RateLimit::new(CAP, 64 << 10)),
            TenantEntry::new(TenantId(2), "free"),
        ],
    );
    let table = QuotaTable::embedded(&policy).unwrap();
    let (_ctx, pd) = device_pd();
    let mut qps = Vec::new();
    let mut targets = Vec::new();
    let mut peers = Vec::new();
    for tenant in [1, 2] {
        let handle = table.attach(TenantId(tenant)).unwrap();
        let (a, b) = pair_of(&pd, &handle);
        let a = a.scheduled(ScheduleConfig::default()).unwrap();
        qps.push(a);
        peers.push(b);
        targets.push(pd.allocate(MSG, Access::REMOTE_READ_WRITE).unwrap());
    }
    let mut spare: Vec<Vec<_>> = (0..2)
        .map(|_| {
            (0..3)
                .map(|_| pd.allocate(MSG, Access::LOCAL).unwrap())
                .collect()
        })
        .collect();
    let (done_bytes, secs) = write_for_2_s(&mut qps, &targets, &mut spare, MSG, false);
    let capped = done_bytes[0] as f64 / secs;
    let free = done_bytes[1] as f64 / secs;
    println!("capped tenant {capped:.0} B/s (cap {CAP}), uncapped {free:.0} B/s over {secs:.2} s");
    // Completed whole messages lag the limiter by up to the messages in
    // flight; count what was admitted as well.
    let posted = table.usage().unwrap()[0].bytes_posted as f64 / secs;
    println!("capped tenant admitted {posted:.0} B/s");
    assert!(
        (posted / CAP as f64 - 1.0).abs() <= 0.05,
        "admitted {posted:.0} B/s against {CAP}"
    );
    assert!(
        capped <= CAP as f64 * 1.05,
        "completed {capped:.0} B/s above the cap"
    );
    assert!(free > capped, "the uncapped tenant is not held to the cap");
    // Work still queued when the queue pairs go is no longer demand.
    drop(qps);
    let usage = table.usage().unwrap();
    assert_eq!(
        (usage[0].backlog_bytes, usage[1].backlog_bytes),
        (0, 0),
        "the demand the coordinator sees returns to zero"
    );
}

#[test]
#[ignore = "needs an RDMA device named by MTRDMA_TEST_DEVICE"]
fn a_progress_thread_completes_work_the_application_never_polls() {
    let (_ctx, pd) = device_pd();
    let (a, _b) = pair(&pd);
    let a = chunked(a, 16 << 10);
    let driven = a.with_progress_thread(Duration::from_micros(50));
    let target = pd.allocate(256 << 10, Access::REMOTE_READ_WRITE).unwrap();
    let remote = target.remote().unwrap();
    for i in 0..20u64 {
        let src = pd
            .register(pattern(256 << 10, i as u8), Access::LOCAL)
            .unwrap();
        driven
            .post_send(SendOp::Write(remote), src, 0..256 << 10, i)
            .unwrap();
    }
    let mut seen = Vec::new();
    while seen.len() < 20 {
        let c = driven
            .completions()
            .recv_timeout(Duration::from_secs(30))
            .expect("the progress thread delivers every completion");
        assert!(c.status.is_success(), "{}", c.status);
        assert_eq!(c.region.read(), &pattern(256 << 10, c.context as u8)[..]);
        seen.push(c.context);
    }
    seen.sort_unstable();
    assert_eq!(seen, (0..20).collect::<Vec<_>>());
    let (qp, result) = driven.stop();
    result.unwrap();
    assert_eq!(qp.queued(), 0);
}

#[test]
#[ignore = "needs an RDMA device named by MTRDMA_TEST_DEVICE"]
fn one_request_at_a_time_under_a_cap_keeps_moving_at_the_cap() {
    let (_ctx, pd) = device_pd();
    // Each request is posted with nothing else queued (the fast path) and
    // is held back by the shared rate limit: the queue pair must come back
    // to it by itself when the limit allows, at the cap's pace.
    const CAP: u64 = 1_000_000;
    const LEN: usize = 4096;
    const N: u64 = 100;
    let table = capped_table(CAP, LEN as u64);
    let (a, _b) = pair_of(&pd, &table.attach(TenantId(1)).unwrap());
    let mut a = a.scheduled(ScheduleConfig::default()).unwrap();
    let target = pd.allocate(LEN, Access::REMOTE_READ_WRITE).unwrap();
    let remote = target.remote().unwrap();
    let mut region = pd.allocate(LEN, Access::LOCAL).unwrap();
    let start = Instant::now();
    for i in 0..N {
        a.post_send(SendOp::Write(remote), region, 0..LEN, i)
            .unwrap();
        let c = wait(&mut a, 1).pop().unwrap();
        assert_eq!((c.status, c.context), (WcStatus::Success, i));
        region = c.region;
    }
    let rate = (N * LEN as u64) as f64 / start.elapsed().as_secs_f64();
    println!("{N} requests of {LEN} B one at a time under a {CAP} B/s cap: {rate:.0} B/s");
    assert_at_cap(rate, CAP, "held back far below the cap");
}

#[test]
#[ignore = "needs an RDMA device named by MTRDMA_TEST_DEVICE"]
fn a_scheduler_of_ones_own_drives_queue_pairs_on_their_own_and_shared() {
    // A strict FIFO (mtrdma_sched::FifoScheduler) in place of the built-in
    // scheduler: every request completes once, every byte lands, in order.
    const LEN: usize = 1 << 20;
    let (_ctx, pd) = device_pd();
    let local = || ScheduleConfig::local(TenantId(0), TrafficClass::Bulk);
    let (a, _b) = pair(&pd);
    let solo = a.scheduled_with(local(), FifoScheduler::new()).unwrap();
    let shared =
        SharedScheduler::with_scheduler(SharedConfig::default(), FifoScheduler::new()).unwrap();
    let (c, _d) = pair(&pd);
    let attached = c.scheduled_on(&shared, local()).unwrap();
    for (k, mut qp) in [solo, attached].into_iter().enumerate() {
        let target = pd.allocate(4 * LEN, Access::REMOTE_READ_WRITE).unwrap();
        let remote = target.remote().unwrap();
        for i in 0..4usize {
            let src = pd
                .register(pattern(LEN, (k * 4 + i) as u8), Access::LOCAL)
                .unwrap();
            let to = remote.slice((i * LEN) as u64, LEN as u64).unwrap();
            qp.post_send(SendOp::Write(to), src, 0..LEN, i as u64)
                .unwrap();
        }
        let done = wait(&mut qp, 4);
        let order: Vec<u64> = done.iter().map(|c| c.context).collect();
        assert_eq!(order, [0, 1, 2, 3], "queue pair {k}: in order");
        assert!(done.iter().all(|c| c.status == WcStatus::Success));
        let got = target.read();
        for i in 0..4usize {
            assert!(
                got[i * LEN..(i + 1) * LEN] == pattern(LEN, (k * 4 + i) as u8),
                "queue pair {k}: request {i} landed"
            );
        }
    }
}

#[test]
#[ignore = "needs an RDMA device named by MTRDMA_TEST_DEVICE"]
fn the_built_in_policy_composed_of_pieces_caps_a_tenant_and_moves_every_byte() {
    // mtrdma_sched::compose: caps, latency priority and DRR as separate
    // pieces, plugged in through the Scheduler trait in place of the fused
    // built-in scheduler.
    const CAP: u64 = 2_000_000; // 2 MB/s
    const MSG: usize = 64 << 10;
    let config = mtrdma_sched::SchedulerConfig::default();
    let pieces = mtrdma_sched::compose::composed(&config).unwrap();
    let shared = SharedScheduler::with_scheduler(SharedConfig::default(), pieces).unwrap();
    let capped = mtrdma_sched::TenantPolicy::weight(1)
        .with_byte_cap(mtrdma_sched::RateLimit::per_second(CAP).with_burst(MSG as u64));
    shared.set_policy(TenantId(1), capped).unwrap();
    shared
        .set_policy(TenantId(2), mtrdma_sched::TenantPolicy::weight(1))
        .unwrap();
    let (_ctx, pd) = device_pd();
    let mut qps = Vec::new();
    let mut peers = Vec::new();
    let mut targets = Vec::new();
    for tenant in [1, 2] {
        let (a, b) = pair(&pd);
        let local = ScheduleConfig::local(TenantId(tenant), TrafficClass::Bulk);
        qps.push(a.scheduled_on(&shared, local).unwrap());
        peers.push(b);
        targets.push(pd.allocate(MSG, Access::REMOTE_READ_WRITE).unwrap());
    }
    let mut spare: Vec<Vec<_>> = (0..2)
        .map(|t| {
            (0..4)
                .map(|i| {
                    pd.register(pattern(MSG, (t * 4 + i) as u8), Access::LOCAL)
                        .unwrap()
                })
                .collect()
        })
        .collect();
    let mut out = Vec::new();
    let (done_bytes, secs) = write_for_2_s(&mut qps, &targets, &mut spare, MSG, true);
    let (capped, free) = (done_bytes[0] as f64 / secs, done_bytes[1] as f64 / secs);
    println!("composed: capped tenant {capped:.0} B/s (cap {CAP}), uncapped {free:.0} B/s");
    // Completed messages lag the cap by the burst and what is in flight.
    let slack = 5.0 * MSG as f64 / secs;
    assert!(
        capped <= CAP as f64 + slack,
        "{capped:.0} B/s above the cap"
    );
    assert!(
        capped >= 0.8 * CAP as f64,
        "{capped:.0} B/s far below the cap"
    );
    assert!(
        free > 2.0 * capped,
        "the uncapped tenant is not held to the cap"
    );
    // Once everything in flight is back, the last bytes written by each
    // tenant landed whole.
    let deadline = Instant::now() + Duration::from_secs(30);
    while spare.iter().any(|s| s.len() < 4) {
        assert!(
            Instant::now() < deadline,
            "requests in flight never completed"
        );
        for t in 0..2 {
            qps[t].poll(&mut out).unwrap();
            for c in out.drain(..) {
                assert!(c.status.is_success(), "{}", c.status);
                spare[t].push(c.region);
            }
        }
    }
    for (t, target) in targets.iter().enumerate() {
        let got = target.read();
        assert!(
            (0..4).any(|i| got == pattern(MSG, (t * 4 + i) as u8)),
            "tenant {}: a write landed torn",
            t + 1
        );
    }
}

/// A connected pair on `pd`: the first scheduled in 4 KiB pieces and
/// taking gathers of three regions.
fn gather_pair(
    pd: &mtrdma_verbs::ProtectionDomain,
) -> (mtrdma_verbs::ScheduledQueuePair, mtrdma_verbs::QueuePair) {
    let a = pd.queue_pair().max_send_sge(3).build().unwrap();
    let b = pd.queue_pair().build().unwrap();
    let (a, b) = common::connect(a, b);
    let a = chunked(a, 4096);
    (a, b)
}

/// `n` regions of 8 KiB with the patterns of `base`, `base + 1`, ..., each
/// with its whole range.
fn gather_parts(
    pd: &mtrdma_verbs::ProtectionDomain,
    base: u8,
    n: u8,
) -> Vec<(mtrdma_verbs::MemoryRegion, std::ops::Range<usize>)> {
    (0..n)
        .map(|i| {
            let mr = pd.register(pattern(8192, base + i), Access::LOCAL).unwrap();
            (mr, 0..8192)
        })
        .collect()
}

/// What a gather of `gather_parts(_, base, 3)` sends, back to back.
fn gathered(base: u8) -> Vec<u8> {
    (0..3).flat_map(|i| pattern(8192, base + i)).collect()
}

#[test]
#[ignore = "needs an RDMA device named by MTRDMA_TEST_DEVICE"]
fn a_scheduled_gather_goes_whole_and_lands_its_regions_back_to_back() {
    let (_ctx, pd) = device_pd();
    // Pieces of 4 KiB: a gather of 24 KiB still goes as one work request.
    let (mut a, mut b) = gather_pair(&pd);
    let parts = |base: u8| gather_parts(&pd, base, 3);
    let want = gathered;

    let target = pd.allocate(3 * 8192, Access::REMOTE_READ_WRITE).unwrap();
    a.post_send_gather(SendOp::Write(target.remote().unwrap()), parts(1), 1)
        .unwrap();
    let done = wait(&mut a, 1).pop().unwrap();
    assert_eq!(
        (done.status, done.opcode, done.byte_len),
        (WcStatus::Success, Opcode::Write, 3 * 8192)
    );
    let back: Vec<Vec<u8>> = done.into_regions().iter().map(|r| r.read()).collect();
    assert_eq!(
        back,
        (1..4).map(|s| pattern(8192, s)).collect::<Vec<_>>(),
        "every region back, in order"
    );
    assert!(target.read() == want(1), "the WRITE landed whole, in order");

    let recv = pd.allocate(3 * 8192, Access::LOCAL).unwrap();
    b.post_recv(recv, 0..3 * 8192, 2).unwrap();
    a.post_send_gather(SendOp::Send, parts(5), 3).unwrap();
    let sent = wait(&mut a, 1).pop().unwrap();
    assert_eq!((sent.status, sent.gathered.len()), (WcStatus::Success, 2));
    let got = wait(&mut b, 1).pop().unwrap();
    assert_eq!((got.status, got.byte_len), (WcStatus::Success, 3 * 8192));
    assert!(got.region.read() == want(5), "the SEND arrived whole");
}

#[test]
#[ignore = "needs an RDMA device named by MTRDMA_TEST_DEVICE"]
fn a_scheduled_batch_carries_gathers_whole_among_single_requests() {
    let (_ctx, pd) = device_pd();
    // Pieces of 4 KiB: the single WRITE is split, each gather goes whole.
    let (mut a, mut b) = gather_pair(&pd);
    let parts = |base: u8, n: u8| gather_parts(&pd, base, n);
    let want = gathered;
    let target = pd
        .allocate(3 * 8192 + 16384, Access::REMOTE_READ_WRITE)
        .unwrap();
    let remote = target.remote().unwrap();
    let recv = pd.allocate(3 * 8192, Access::LOCAL).unwrap();
    b.post_recv(recv, 0..3 * 8192, 9).unwrap();

    let mut batch = a.batch();
    batch
        .post_send_gather(
            SendOp::Write(remote.slice(0, 3 * 8192).unwrap()),
            parts(1, 3),
            1,
        )
        .unwrap();
    let single = pd.register(pattern(16384, 4), Access::LOCAL).unwrap();
    let to = remote.slice(3 * 8192, 16384).unwrap();
    batch
        .post_send(SendOp::Write(to), single, 0..16384, 2)
        .unwrap();
    // Refused when added, every region back; the batch is unchanged.
    let refused = batch
        .post_send_gather(SendOp::Send, parts(20, 4), 7)
        .unwrap_err();
    assert!(
        matches!(
            *refused.error,
            mtrdma_verbs::Error::TooManyParts { parts: 4, max: 3 }
        ),
        "{}",
        refused.error
    );
    let back: Vec<Vec<u8>> = refused.parts.iter().map(|(r, _)| r.read()).collect();
    assert_eq!(back, (20..24).map(|s| pattern(8192, s)).collect::<Vec<_>>());
    batch
        .post_send_gather(SendOp::Send, parts(5, 3), 3)
        .unwrap();
    assert_eq!(batch.len(), 3);
    batch.submit().unwrap();

    let done = wait(&mut a, 3);
    let got: Vec<(u64, WcStatus, u32, usize)> = done
        .iter()
        .map(|c| (c.context, c.status, c.byte_len, c.gathered.len()))
        .collect();
    assert_eq!(
        got,
        [
            (1, WcStatus::Success, 3 * 8192, 2),
            (2, WcStatus::Success, 16384, 0),
            (3, WcStatus::Success, 3 * 8192, 2),
        ],
        "one completion a request, in order"
    );
    let back: Vec<Vec<u8>> = done
        .into_iter()
        .next()
        .unwrap()
        .into_regions()
        .iter()
        .map(|r| r.read())
        .collect();
    assert_eq!(back, (1..4).map(|s| pattern(8192, s)).collect::<Vec<_>>());
    let landed = target.read();
    assert!(
        landed[..3 * 8192] == want(1),
        "the gathered WRITE landed whole"
    );
    assert!(
        landed[3 * 8192..] == pattern(16384, 4),
        "the split WRITE landed"
    );
    let got = wait(&mut b, 1).pop().unwrap();
    assert_eq!((got.status, got.byte_len), (WcStatus::Success, 3 * 8192));
    assert!(
        got.region.read() == want(5),
        "the gathered SEND arrived whole"
    );

    // A cancelled batch hands a gather's regions back as consecutive
    // entries with its context.
    let mut batch = a.batch();
    batch
        .post_send_gather(SendOp::Send, parts(30, 2), 4)
        .unwrap();
    let cancelled: Vec<(u64, Vec<u8>)> = batch
        .cancel()
        .into_iter()
        .map(|(c, r)| (c, r.read()))
        .collect();
    assert_eq!(cancelled, [(4, pattern(8192, 30)), (4, pattern(8192, 31))]);
    assert_eq!(a.queued(), 0);
}
