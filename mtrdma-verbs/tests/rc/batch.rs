//! Batches (several requests, one call) and gather lists (several regions
//! in one request) on reliable-connected queue pairs.

use std::ops::Range;

use super::*;

#[test]
#[ignore = "needs an RDMA device named by MTRDMA_TEST_DEVICE"]
fn a_batch_goes_in_one_call_and_every_request_comes_back_once() {
    let (ctx, pd) = device_pd();
    let (mut a, mut b) = pair(&pd);
    let piece = 4096usize;
    let n = 40u64;
    let target = pd
        .allocate(piece * n as usize, Access::REMOTE_READ_WRITE)
        .unwrap();
    let remote = target.remote().unwrap();
    // 40 WRITEs and a SEND with immediate that tells the peer they are
    // all there (RC delivers in order), in one batch: four completions
    // (two in each list of at most 32) report all 41.
    let note = pd.allocate(64, Access::LOCAL).unwrap();
    b.post_recv(note, 0..64, 99).unwrap();
    let mut batch = a.batch();
    for i in 0..n {
        let src = pd.register(pattern(piece, i as u8), Access::LOCAL).unwrap();
        let to = remote.slice(i * piece as u64, piece as u64).unwrap();
        batch
            .post_send(SendOp::Write(to), src, 0..piece, i)
            .unwrap();
    }
    // (A plain SEND on iWARP, which carries no immediate data.)
    let imm = (!ctx.is_iwarp()).then_some(7);
    let last = imm.map_or(SendOp::Send, SendOp::SendWithImm);
    let note = pd.allocate(8, Access::LOCAL).unwrap();
    batch.post_send(last, note, 0..8, n).unwrap();
    assert_eq!(batch.len(), n as usize + 1);
    batch.submit().unwrap();
    let done = wait(&mut a, n as usize + 1);
    assert_eq!(
        done.iter().map(|c| c.context).collect::<Vec<_>>(),
        (0..=n).collect::<Vec<_>>(),
        "each request completes once, in order"
    );
    assert!(done.iter().all(|c| c.status == WcStatus::Success));
    assert!(done[..n as usize].iter().all(|c| c.opcode == Opcode::Write));
    assert_eq!(done[n as usize].opcode, Opcode::Send);
    assert_eq!(a.in_flight(), (0, 0));
    let got = wait(&mut b, 1).pop().unwrap();
    assert_eq!((got.context, got.imm), (99, imm));
    for i in 0..n as usize {
        assert!(
            target.read()[i * piece..(i + 1) * piece] == pattern(piece, i as u8)[..],
            "WRITE {i} arrived intact"
        );
    }
}

#[test]
#[ignore = "needs an RDMA device named by MTRDMA_TEST_DEVICE"]
fn a_batch_to_a_peer_that_is_gone_comes_back_failed_each_request_once() {
    // Every request of the batch, unsignaled ones included, comes back once
    // (failed), its region with it.
    let (_ctx, pd) = device_pd();
    let (mut a, b) = pair(&pd);
    let piece = 4096usize;
    let target = pd.allocate(piece, Access::REMOTE_READ_WRITE).unwrap();
    let remote = target.remote().unwrap();
    drop(b);
    let mut batch = a.batch();
    for i in 0..20u64 {
        let src = pd.register(pattern(piece, i as u8), Access::LOCAL).unwrap();
        batch
            .post_send(SendOp::Write(remote), src, 0..piece, i)
            .unwrap();
    }
    batch.submit().unwrap();
    let mut out = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while out.len() < 20 && Instant::now() < deadline {
        a.poll(&mut out).unwrap();
    }
    if out.len() < 20 {
        a.set_error().unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        while out.len() < 20 && Instant::now() < deadline {
            a.poll(&mut out).unwrap();
        }
    }
    assert_eq!(
        out.iter().map(|c| c.context).collect::<Vec<_>>(),
        (0..20).collect::<Vec<_>>()
    );
    assert_eq!(a.in_flight(), (0, 0));
    for c in &out {
        assert_eq!(c.region.read(), &pattern(piece, c.context as u8)[..]);
    }
}

/// A queue pair whose requests may name `sges` regions, connected to a
/// plain one.
fn gather_pair(pd: &mtrdma_verbs::ProtectionDomain, sges: u32) -> (QueuePair, QueuePair) {
    let a = pd.queue_pair().max_send_sge(sges).build().expect("build A");
    let b = pd.queue_pair().build().expect("build B");
    super::common::connect(a, b)
}

/// Three regions of different sizes (their bytes `pattern(len, seed)`),
/// each with the range a gather takes of it, and those bytes back to back.
fn three_parts(
    pd: &mtrdma_verbs::ProtectionDomain,
) -> (Vec<(MemoryRegion, Range<usize>)>, Vec<u8>) {
    let shapes: [(usize, u8, Range<usize>); 3] =
        [(200, 1, 50..150), (5000, 2, 0..4096), (7, 3, 0..7)];
    let mut want = Vec::new();
    let parts = shapes
        .into_iter()
        .map(|(len, seed, range)| {
            want.extend_from_slice(&pattern(len, seed)[range.clone()]);
            (
                pd.register(pattern(len, seed), Access::LOCAL).unwrap(),
                range,
            )
        })
        .collect();
    (parts, want)
}

/// The regions of `done`, in order, hold what `three_parts` put there.
fn assert_three_back(done: Completion) {
    let regions = done.into_regions();
    let lens: Vec<usize> = regions.iter().map(MemoryRegion::len).collect();
    assert_eq!(lens, [200, 5000, 7], "every region back, in order");
    for (region, (len, seed)) in regions.iter().zip([(200, 1), (5000, 2), (7, 3)]) {
        assert_eq!(region.read(), pattern(len, seed), "untouched");
    }
}

#[test]
#[ignore = "needs an RDMA device named by MTRDMA_TEST_DEVICE"]
fn a_gather_writes_and_sends_three_regions_back_to_back_and_hands_them_all_back() {
    let (ctx, pd) = device_pd();
    // iWARP carries no immediate data, and READs into one scatter entry:
    // there the SEND goes without a value, and a READ into three regions
    // is refused by name.
    let iwarp = ctx.is_iwarp();
    let (mut a, mut b) = gather_pair(&pd, 3);
    assert_eq!(a.max_send_sge(), 3);
    let (parts, want) = three_parts(&pd);
    let total = want.len();
    assert_eq!(total, 100 + 4096 + 7);

    // WRITE: the peer's region holds the parts' bytes, concatenated.
    let target = pd.allocate(total + 64, Access::REMOTE_READ_WRITE).unwrap();
    let remote = target.remote().unwrap();
    a.post_send_gather(SendOp::Write(remote), parts, 1).unwrap();
    let done = wait(&mut a, 1).pop().unwrap();
    assert_eq!(
        (
            done.status,
            done.opcode,
            done.context,
            done.byte_len as usize
        ),
        (WcStatus::Success, Opcode::Write, 1, total)
    );
    assert_eq!(done.gathered.len(), 2);
    assert_three_back(done);
    let landed = target.read();
    assert!(
        landed[..total] == want[..],
        "the WRITE landed whole, in order"
    );
    assert!(
        landed[total..].iter().all(|&b| b == 0),
        "and nothing past it"
    );

    // SEND: one receive gets the whole message.
    let (parts, want) = three_parts(&pd);
    let recv = pd.allocate(8192, Access::LOCAL).unwrap();
    b.post_recv(recv, 0..8192, 2).unwrap();
    let imm = (!iwarp).then_some(77);
    let op = imm.map_or(SendOp::Send, SendOp::SendWithImm);
    a.post_send_gather(op, parts, 3).unwrap();
    let sent = wait(&mut a, 1).pop().unwrap();
    assert_eq!(
        (sent.status, sent.opcode),
        (WcStatus::Success, Opcode::Send)
    );
    assert_three_back(sent);
    let got = wait(&mut b, 1).pop().unwrap();
    assert_eq!(
        (got.status, got.opcode, got.byte_len as usize, got.imm),
        (WcStatus::Success, Opcode::Recv, total, imm)
    );
    assert!(
        got.region.read()[..total] == want[..],
        "the SEND arrived whole"
    );
    assert!(got.gathered.is_empty());

    // READ: the peer's bytes are scattered back into three fresh regions.
    let fresh: Vec<(MemoryRegion, Range<usize>)> = [(100, 0..100), (4096, 0..4096), (7, 0..7)]
        .into_iter()
        .map(|(len, range)| (pd.allocate(len, Access::LOCAL).unwrap(), range))
        .collect();
    if iwarp {
        let refused = a
            .post_send_gather(SendOp::Read(remote), fresh, 4)
            .unwrap_err();
        assert!(
            matches!(*refused.error, Error::OperationUnsupported { .. }),
            "{refused}"
        );
        assert_eq!(refused.parts.len(), 3, "every region back");
        return;
    }
    a.post_send_gather(SendOp::Read(remote), fresh, 4).unwrap();
    let read = wait(&mut a, 1).pop().unwrap();
    assert_eq!(
        (read.status, read.byte_len as usize),
        (WcStatus::Success, total)
    );
    let bytes: Vec<u8> = read
        .into_regions()
        .iter()
        .flat_map(MemoryRegion::read)
        .collect();
    assert!(bytes == want, "the READ filled the regions in order");
}

#[test]
#[ignore = "needs an RDMA device named by MTRDMA_TEST_DEVICE"]
fn gathers_the_device_or_the_queue_pair_cannot_take_are_refused_regions_back() {
    let (ctx, pd) = device_pd();
    // More entries than the device has.
    let max = ctx.max_sge().unwrap();
    let too_many = pd.queue_pair().max_send_sge(max + 1).build().unwrap_err();
    assert!(
        matches!(too_many, Error::TooManySges { asked, max: m, .. } if asked == max + 1 && m == max),
        "{too_many}"
    );
    // More regions than the queue pair takes.
    let (mut a, _b) = gather_pair(&pd, 2);
    let target = pd.allocate(8192, Access::REMOTE_READ_WRITE).unwrap();
    let (parts, _) = three_parts(&pd);
    let refused = a
        .post_send_gather(SendOp::Write(target.remote().unwrap()), parts, 0)
        .unwrap_err();
    assert!(
        matches!(*refused.error, Error::TooManyParts { parts: 3, max: 2 }),
        "{}",
        refused.error
    );
    let ranges: Vec<Range<usize>> = refused.parts.iter().map(|(_, r)| r.clone()).collect();
    assert_eq!(ranges, [50..150, 0..4096, 0..7]);
    assert_three_back_parts(refused.parts);
    assert_eq!(a.in_flight(), (0, 0));
}

/// As `assert_three_back`, for refused parts.
fn assert_three_back_parts(parts: Vec<(MemoryRegion, Range<usize>)>) {
    for ((region, _), (len, seed)) in parts.iter().zip([(200, 1), (5000, 2), (7, 3)]) {
        assert_eq!(region.read(), pattern(len, seed), "untouched, in order");
    }
    assert_eq!(parts.len(), 3);
}

#[test]
#[ignore = "needs an RDMA device named by MTRDMA_TEST_DEVICE"]
fn a_gather_the_peer_refuses_and_those_flushed_after_it_hand_every_region_back() {
    let (ctx, pd) = device_pd();
    let (table, t) = tenant(16, 1 << 30);
    let (mut a, _b) = gather_pair(&pd, 3);
    let target = pd.allocate(8192, Access::REMOTE_READ_WRITE).unwrap();
    let good = target.remote().unwrap();
    let bad = RemoteRegion {
        rkey: good.rkey.wrapping_add(1),
        ..good
    };
    let parts = |seed: u8| -> Vec<(MemoryRegion, Range<usize>)> {
        (0..3)
            .map(|i| {
                let mr = pd
                    .register_for(&t, pattern(1000, seed + i), Access::LOCAL)
                    .unwrap();
                (mr, 0..1000)
            })
            .collect()
    };
    a.post_send_gather(SendOp::Write(good), parts(0), 0)
        .unwrap();
    a.post_send_gather(SendOp::Write(bad), parts(10), 1)
        .unwrap();
    a.post_send_gather(SendOp::Write(good), parts(20), 2)
        .unwrap();
    let done = wait(&mut a, 3);
    let statuses: Vec<(u64, WcStatus)> = done.iter().map(|c| (c.context, c.status)).collect();
    assert_eq!(statuses[0], (0, WcStatus::Success));
    assert_eq!((statuses[1].0, statuses[2].0), (1, 2));
    if ctx.is_iwarp() {
        // An iWARP WRITE completes once sent; the peer refuses it by
        // terminating the connection, which fails what follows.
        assert!(
            matches!(
                statuses[2].1,
                WcStatus::Flushed | WcStatus::LocalQpOperation
            ),
            "{statuses:?}"
        );
    } else {
        assert!(
            matches!(
                statuses[1].1,
                WcStatus::RemoteAccess | WcStatus::RemoteInvalidRequest
            ),
            "{}",
            statuses[1].1
        );
        assert_eq!(statuses[2], (2, WcStatus::Flushed));
    }
    for c in done {
        let seed = c.context as u8 * 10;
        let regions = c.into_regions();
        assert_eq!(regions.len(), 3, "every region back");
        for (i, region) in regions.iter().enumerate() {
            assert_eq!(region.read(), pattern(1000, seed + i as u8), "in order");
        }
    }
    assert_eq!(table.usage().unwrap()[0].mr_bytes.0, 0, "all freed");
    assert_eq!(a.in_flight(), (0, 0));
}

#[test]
#[ignore = "needs an RDMA device named by MTRDMA_TEST_DEVICE"]
fn dropping_a_qp_with_gathers_in_flight_frees_every_region() {
    let (table, t) = tenant(16, 1 << 30);
    let (_ctx, pd) = device_pd();
    let (mut a, b) = gather_pair(&pd, 4);
    // SENDs the peer has no receive for: they wait in the device until
    // the teardown flushes them.
    for i in 0..8u64 {
        let parts = (0..4)
            .map(|_| {
                let mr = pd.register_for(&t, vec![7u8; 4096], Access::LOCAL).unwrap();
                (mr, 0..4096)
            })
            .collect();
        a.post_send_gather(SendOp::Send, parts, i).unwrap();
    }
    assert_eq!(a.in_flight(), (8, 0));
    assert_eq!(table.usage().unwrap()[0].mr_bytes.0, 32 * 4096);
    drop(a);
    assert_eq!(
        table.usage().unwrap()[0].mr_bytes.0,
        0,
        "every region flushed, deregistered and freed"
    );
    drop(b);
}

#[test]
#[ignore = "needs an RDMA device named by MTRDMA_TEST_DEVICE"]
fn a_batch_carries_gathers_and_single_requests_in_one_call() {
    let (_ctx, pd) = device_pd();
    let (mut a, _b) = gather_pair(&pd, 3);
    let target = pd.allocate(8 * 8192, Access::REMOTE_READ_WRITE).unwrap();
    let remote = target.remote().unwrap();
    let mut wants = Vec::new();
    let mut batch = a.batch();
    for i in 0..8u64 {
        let to = remote.slice(i * 8192, 8192).unwrap();
        if i % 2 == 0 {
            let (parts, want) = three_parts(&pd);
            batch.post_send_gather(SendOp::Write(to), parts, i).unwrap();
            wants.push(want);
        } else {
            let src = pd.register(pattern(1000, i as u8), Access::LOCAL).unwrap();
            batch.post_send(SendOp::Write(to), src, 0..1000, i).unwrap();
            wants.push(pattern(1000, i as u8));
        }
    }
    batch.submit().unwrap();
    let done = wait(&mut a, 8);
    let contexts: Vec<u64> = done.iter().map(|c| c.context).collect();
    assert_eq!(contexts, (0..8).collect::<Vec<_>>(), "in order, once each");
    for c in done {
        assert_eq!(c.status, WcStatus::Success);
        let i = c.context;
        if i % 2 == 0 {
            assert_three_back(c);
        } else {
            assert!(c.gathered.is_empty());
            assert_eq!(c.region.read(), pattern(1000, i as u8));
        }
    }
    let landed = target.read();
    for (i, want) in wants.iter().enumerate() {
        let at = i * 8192;
        assert!(
            landed[at..at + want.len()] == want[..],
            "request {i} landed"
        );
    }
}
