//! Requests the engine refuses or fails, whole writes, atomics, tenants
//! and shared engines on the null sink.

use super::*;

#[test]
fn a_remote_region_reaching_past_the_address_space_is_refused_not_a_panic() {
    // A peer's description: 1 MiB at 100 bytes below the top of the
    // address space. A chunked WRITE's later pieces would overflow.
    let remote = RemoteRegion {
        addr: u64::MAX - 100,
        len: 1 << 20,
        rkey: 9,
    };
    assert_eq!(remote.slice(200, 8), None);
    let config = ScheduleConfig {
        chunk_bytes: 4096,
        ..bulk0()
    };
    let mut qp = scheduled(NullSink::new(1, 16), config).unwrap();
    let region = HeapRegion::new(16_384);
    let base = region.addr();
    match qp.post_send(SendOp::Write(remote), region, 0..16_384, 1) {
        Err((Error::RemoteOutOfBounds { .. }, back)) => {
            assert_eq!(back.addr(), base, "the region comes back");
        }
        Err((e, _)) => panic!("refused for another reason: {e}"),
        Ok(()) => panic!("posted pieces past the end of the address space"),
    }
    // The direct path refuses it too.
    let mut sink = NullSink::new(1, 16);
    assert!(matches!(
        sink.post_send(SendOp::Read(remote), HeapRegion::new(64), 0..64, 2),
        Err((Error::RemoteOutOfBounds { .. }, _))
    ));
}

#[test]
fn chunked_write_pieces_go_in_order_with_their_offsets() {
    let config = ScheduleConfig {
        chunk_bytes: 4096,
        max_pieces_in_flight: 2,
        ..bulk0()
    };
    let mut qp = scheduled(NullSink::new(1, 16).recording(), config).unwrap();
    let region = HeapRegion::new(16_384);
    let base = region.addr();
    let remote = RemoteRegion {
        addr: 0x9000_0000,
        len: 10_000,
        rkey: 5,
    };
    let op = SendOp::WriteWithImm(remote, 42);
    if let Err((e, _)) = qp.post_send(op, region, 100..10_100, 9) {
        panic!("refused: {e}");
    }
    let done = drain(&mut qp, 1);
    assert_eq!(done.len(), 1, "one completion for the whole request");
    let c = &done[0];
    assert_eq!(
        (c.context, c.status, c.opcode, c.byte_len),
        (9, WcStatus::Success, Opcode::Write, 10_000)
    );
    assert_eq!(c.region.addr(), base, "its region back");
    let log = qp.with_sink(NullSink::take_log);
    let lens = [4096, 4096, 1808];
    assert_eq!(log.len(), lens.len());
    use ffi::ibv_wr_opcode as o;
    for (k, (p, len)) in log.iter().zip(lens).enumerate() {
        let offset = 4096 * k as u64;
        assert_eq!(p.addr, base + 100 + offset, "piece {k}: local offset");
        assert_eq!(p.length, len, "piece {k}: length");
        assert_eq!(
            p.remote_addr,
            remote.addr + offset,
            "piece {k}: remote offset"
        );
        assert_eq!((p.rkey, p.lkey), (5, 0x1234));
        let last = k == lens.len() - 1;
        let want = if last {
            (o::IBV_WR_RDMA_WRITE_WITH_IMM, Some(42))
        } else {
            (o::IBV_WR_RDMA_WRITE, None)
        };
        assert_eq!(
            (p.opcode, p.imm),
            want,
            "only the last piece carries the immediate"
        );
    }
    let mut more = Vec::new();
    qp.poll(&mut more).unwrap();
    assert!(more.is_empty());
}

#[test]
fn poll_wait_on_a_null_sink_returns_at_once_and_finishes_chunked_work() {
    let config = ScheduleConfig {
        chunk_bytes: 1024,
        max_pieces_in_flight: 1,
        ..bulk0()
    };
    let shared = NullScheduler::new(SharedConfig::default()).unwrap();
    let solo = scheduled(NullSink::new(1, 16), config.clone()).unwrap();
    let attached = shared.attach(NullSink::new(2, 16), config).unwrap();
    for mut qp in [solo, attached] {
        let long = Duration::from_secs(30);
        let started = std::time::Instant::now();
        let mut out = Vec::new();
        // Nothing posted: nothing to wait for on a null sink.
        assert_eq!(qp.poll_wait(&mut out, long).unwrap(), 0);
        post(
            &mut qp,
            SendOp::Write(REMOTE),
            HeapRegion::new(8192),
            8192,
            5,
        );
        let mut calls = 0;
        while out.is_empty() {
            qp.poll_wait(&mut out, long).unwrap();
            calls += 1;
            assert!(calls < 1000, "eight pieces finish in a few calls");
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "a null sink's wait never sleeps out its timeout"
        );
        assert_eq!((out.len(), out[0].context), (1, 5));
        assert_eq!(qp.queued(), 0);
    }
}

/// An atomic goes whole (never split, whatever the piece size), as its
/// verbs opcode, and completes once as an atomic; one that is not a
/// single aligned 8-byte word is refused before anything is posted.
#[test]
fn an_atomic_goes_whole_and_a_misshapen_one_is_refused() {
    let config = ScheduleConfig {
        chunk_bytes: 4,
        ..bulk0()
    };
    let mut qp = scheduled(NullSink::new(1, 16).recording(), config).unwrap();
    let op = SendOp::CompareSwap {
        remote: REMOTE,
        compare: 1,
        swap: 2,
    };
    if let Err((e, _)) = qp.post_send(op, HeapRegion::new(8), 0..8, 5) {
        panic!("refused: {e}");
    }
    let log = qp.with_sink(|s| s.take_log());
    assert_eq!(log.len(), 1, "never split");
    assert_eq!(
        (log[0].opcode, log[0].length, log[0].remote_addr),
        (
            ffi::ibv_wr_opcode::IBV_WR_ATOMIC_CMP_AND_SWP,
            8,
            REMOTE.addr
        )
    );
    let done = drain(&mut qp, 1);
    assert_eq!(
        (
            done[0].context,
            done[0].status,
            done[0].opcode,
            done[0].byte_len
        ),
        (5, WcStatus::Success, Opcode::Atomic, 8)
    );
    for (region, range, remote) in [
        (HeapRegion::new(16), 0..16, REMOTE),
        (
            HeapRegion::new(8),
            0..8,
            RemoteRegion {
                addr: REMOTE.addr + 4,
                ..REMOTE
            },
        ),
        (HeapRegion::new(8), 0..8, RemoteRegion { len: 4, ..REMOTE }),
    ] {
        match qp.post_send(SendOp::FetchAdd(remote, 1), region, range.clone(), 6) {
            Err((Error::AtomicLayout { .. }, back)) => assert_eq!(back.len(), range.len()),
            other => panic!("{range:?} to {remote:?}: {:?}", other.err().map(|e| e.0)),
        }
    }
    assert_eq!(qp.with_sink(|s| s.take_log().len()), 0, "nothing posted");
}

#[test]
fn a_refused_post_comes_back_as_a_failed_completion() {
    let mut qp = scheduled(NullSink::new(1, 16), bulk0()).unwrap();
    qp.with_sink(|s| s.set_fail(true));
    post(&mut qp, SendOp::Write(REMOTE), tagged(7), 64, 7);
    let done = drain(&mut qp, 1);
    assert_eq!(done.len(), 1);
    let c = &done[0];
    assert_eq!(
        (c.context, c.status, c.opcode),
        (7, WcStatus::LocalQpOperation, Opcode::Unknown)
    );
    assert_eq!(tag(&c.region), 7, "its region back");
    assert_eq!(qp.queued(), 0);

    // A chunked request whose second piece is refused: one failed
    // completion, the rest of its pieces dropped.
    qp.with_sink(|s| s.set_fail(false));
    let config = ScheduleConfig {
        chunk_bytes: 1024,
        max_pieces_in_flight: 1,
        ..bulk0()
    };
    let mut qp = scheduled(NullSink::new(1, 16).recording(), config).unwrap();
    if let Err((e, _)) = qp.post_send(SendOp::Write(REMOTE), HeapRegion::new(4096), 0..4096, 3) {
        panic!("refused: {e}");
    }
    assert_eq!(
        qp.with_sink(|s| s.take_log().len()),
        1,
        "one piece at a time"
    );
    qp.with_sink(|s| s.set_fail(true));
    let done = drain(&mut qp, 1);
    assert_eq!(done.len(), 1);
    assert_eq!(
        (done[0].context, done[0].status, done[0].region.len()),
        (3, WcStatus::LocalQpOperation, 4096)
    );
    assert_eq!(qp.queued(), 0);
    qp.with_sink(|s| s.set_fail(false));
    post(&mut qp, SendOp::Write(REMOTE), tagged(4), 64, 4);
    let done = drain(&mut qp, 1);
    assert_eq!((done[0].context, done[0].status), (4, WcStatus::Success));
}

#[test]
fn a_refused_piece_stops_the_rest_of_its_request_and_its_immediate() {
    let config = ScheduleConfig {
        chunk_bytes: 1024,
        max_pieces_in_flight: 4,
        ..bulk0()
    };
    let shared = shared_1k();
    let solo = scheduled(NullSink::new(1, 16).recording(), config.clone()).unwrap();
    let attached = shared
        .attach(NullSink::new(2, 16).recording(), config)
        .unwrap();
    for (way, mut qp) in [("solo", solo), ("shared", attached)] {
        // Four pieces decided at once; the second is refused.
        qp.with_sink(|s| s.refuse_after(1));
        post(
            &mut qp,
            SendOp::WriteWithImm(REMOTE, 42),
            HeapRegion::new(4096),
            4096,
            9,
        );
        let done = drain(&mut qp, 1);
        let posted = qp.with_sink(|s| s.take_log());
        // The first piece went unsignaled in a list the refusal cut:
        // a zero-length WRITE that asks for its completion reports it.
        let nop = posted.iter().position(|p| p.wr_id == crate::qp::NOP_WR);
        assert_eq!(nop, Some(1), "{way}: {posted:?}");
        assert!(!posted[0].signaled && posted[1].signaled && posted[1].length == 0);
        let posted: Vec<_> = posted.into_iter().filter(|p| p.length > 0).collect();
        assert_eq!(
            posted.iter().map(|p| p.remote_addr).collect::<Vec<_>>(),
            [REMOTE.addr],
            "{way}: nothing after the refused piece reaches the peer"
        );
        assert!(
            posted.iter().all(|p| p.imm.is_none()),
            "{way}: the peer is not told the request arrived whole"
        );
        assert_eq!(done.len(), 1, "{way}: one completion");
        assert_eq!(
            (done[0].context, done[0].status, done[0].region.len()),
            (9, WcStatus::LocalQpOperation, 4096),
            "{way}: the request fails with its refusal, its region back"
        );
        // The queue pair goes on: the next request is sent whole.
        post(
            &mut qp,
            SendOp::WriteWithImm(REMOTE, 43),
            HeapRegion::new(4096),
            4096,
            10,
        );
        let done = drain(&mut qp, 1);
        assert_eq!(
            (done[0].context, done[0].status),
            (10, WcStatus::Success),
            "{way}"
        );
        let posted = qp.with_sink(|s| s.take_log());
        assert_eq!(posted.len(), 4, "{way}");
        assert_eq!(posted[3].imm, Some(43), "{way}");
        assert_eq!(qp.queued(), 0, "{way}");
    }
}

/// Dropping a queue pair of a shared engine waits for the NIC to flush
/// it (up to seconds); meanwhile the engine's other queue pairs post
/// and finish their work. (The drain held the engine's lock: every
/// other queue pair of the engine stopped until it ended.)
#[test]
fn a_queue_pair_being_drained_holds_up_no_other() {
    let shared = shared_1k();
    let config = ScheduleConfig {
        chunk_bytes: 1024,
        max_pieces_in_flight: 1,
        ..bulk0()
    };
    let mut slow = NullSink::new(1, 16);
    let hold = slow.hold_shutdown();
    let mut leaving = shared.attach(slow, config.clone()).unwrap();
    post(
        &mut leaving,
        SendOp::Write(REMOTE),
        HeapRegion::new(8192),
        8192,
        1,
    );
    let other_config = ScheduleConfig {
        tenant: crate::Tenancy::Local {
            id: TenantId(1),
            class: TrafficClass::Bulk,
        },
        ..config
    };
    let mut other = shared.attach(NullSink::new(2, 16), other_config).unwrap();
    let dropper = std::thread::spawn(move || drop(leaving));
    assert!(
        hold.wait_started(Duration::from_secs(10)),
        "the drain began"
    );
    let (tx, rx) = crossbeam_channel::bounded(1);
    let worker = std::thread::spawn(move || {
        post(
            &mut other,
            SendOp::Write(REMOTE),
            HeapRegion::new(4096),
            4096,
            2,
        );
        let done = drain(&mut other, 1);
        let _ = tx.send(done.first().map(|c| (c.context, c.status)));
    });
    let finished = rx.recv_timeout(Duration::from_secs(10));
    hold.release();
    dropper.join().unwrap();
    worker.join().unwrap();
    assert_eq!(
        finished,
        Ok(Some((2, WcStatus::Success))),
        "the other queue pair finished its request during the drain"
    );
}

#[test]
fn queue_pairs_of_eight_tenants_each_get_their_own_requests_back() {
    let shared = NullScheduler::new(SharedConfig {
        chunk_bytes: 1024,
        bulk_bytes_in_flight: 4096,
        ..SharedConfig::default()
    })
    .unwrap();
    let mut qps: Vec<NullScheduled> = (0..8u32)
        .map(|i| {
            let config = ScheduleConfig::local(TenantId(i + 1), TrafficClass::Bulk);
            shared.attach(NullSink::new(i, 16), config).unwrap()
        })
        .collect();
    assert_eq!(shared.queue_pairs(), 8);
    for (q, qp) in qps.iter_mut().enumerate() {
        for i in 0..20u64 {
            let context = q as u64 * 1000 + i;
            let region = HeapRegion::new(3000);
            if let Err((e, _)) = qp.post_send(SendOp::Write(REMOTE), region, 0..3000, context) {
                panic!("refused: {e}");
            }
        }
    }
    assert!(shared.bulk_bytes_in_flight() <= 4096);
    let mut got: Vec<Vec<u64>> = vec![Vec::new(); 8];
    let mut out = Vec::new();
    for _ in 0..100_000 {
        if got.iter().map(Vec::len).sum::<usize>() == 160 {
            break;
        }
        for (q, qp) in qps.iter_mut().enumerate() {
            qp.poll(&mut out).unwrap();
            assert!(
                shared.bulk_bytes_in_flight() <= 4096,
                "the bulk budget holds"
            );
            got[q].extend(out.drain(..).map(|c| {
                assert_eq!((c.status, c.byte_len), (WcStatus::Success, 3000));
                c.context
            }));
        }
    }
    for (q, contexts) in got.iter().enumerate() {
        let want: Vec<u64> = (0..20).map(|i| q as u64 * 1000 + i).collect();
        assert_eq!(
            contexts, &want,
            "queue pair {q}: its own, once each, in order"
        );
    }
    assert_eq!(shared.bulk_bytes_in_flight(), 0);
    drop(qps);
    assert_eq!(shared.queue_pairs(), 0);
}

#[test]
fn a_tenant_handle_accounts_every_request() {
    let tenant = mtrdma_core::TenantEntry::new(TenantId(1), "host")
        .with_rate(RateLimit::new(1 << 40, 1 << 30));
    let policy = Policy::new(LinkConfig::new(1 << 40), vec![tenant]);
    let table = QuotaTable::embedded(&policy).unwrap();
    let handle = table.attach(TenantId(1)).unwrap();
    let sink = NullSink::new(1, 16).with_tenant(handle);
    let mut qp = scheduled(sink, ScheduleConfig::default()).unwrap();
    for i in 0..50 {
        post(&mut qp, SendOp::Write(REMOTE), tagged(i), 64, i);
    }
    let done = drain(&mut qp, 50);
    assert_eq!(done.len(), 50);
    assert!(done.iter().all(|c| c.status.is_success()));
}

#[test]
fn a_queue_pair_created_without_a_tenant_is_not_scheduled_as_tenant_0_by_accident() {
    // The default schedules a queue pair as the tenant it was created
    // for; without one that is an error, on its own or shared.
    let e = scheduled(NullSink::new(1, 16), ScheduleConfig::default()).unwrap_err();
    assert!(matches!(e, Error::NoTenant), "{e:?}");
    assert!(e.to_string().contains("ScheduleConfig::local"), "{e}");
    let shared = NullScheduler::new(SharedConfig::default()).unwrap();
    let e = shared
        .attach(NullSink::new(2, 16), ScheduleConfig::default())
        .unwrap_err();
    assert!(matches!(e, Error::NoTenant), "{e:?}");
    assert_eq!(shared.queue_pairs(), 0);
    // Chosen explicitly, it is scheduled as the tenant named.
    let qp = scheduled(
        NullSink::new(3, 16),
        ScheduleConfig::local(TenantId(7), TrafficClass::Latency),
    )
    .unwrap();
    assert_eq!(
        (qp.tenant(), qp.class()),
        (TenantId(7), TrafficClass::Latency)
    );
}

#[test]
fn a_window_takes_its_tenants_weight_under_a_scheduler_that_keeps_no_policies() {
    let table = QuotaTable::embedded(&weighted(4)).unwrap();
    let (sink, config) = windowed_tenant(&table);
    let qp = scheduled_with(sink, config, mtrdma_sched::FifoScheduler::new()).unwrap();
    assert_eq!(qp.window().unwrap().weight, 4);
}
