//! The engine on the null sink: regions handed back in order, windows,
//! virtual time, stalls and pieces in the NIC.

use super::*;

#[test]
fn direct_path_parks_the_region_and_hands_it_back() {
    let mut sink = NullSink::new(1, 2).recording();
    for i in 0..2 {
        sink.post_send(SendOp::Write(REMOTE), tagged(i), 0..64, i)
            .unwrap();
    }
    let (e, r) = sink
        .post_send(SendOp::Write(REMOTE), tagged(9), 0..64, 9)
        .unwrap_err();
    assert!(matches!(e, Error::SendQueueFull { depth: 2 }), "{e}");
    assert_eq!(tag(&r), 9, "the refused region comes back");
    let (e, r) = sink
        .post_send(SendOp::Write(REMOTE), r, 0..65, 9)
        .unwrap_err();
    assert!(matches!(e, Error::LocalRangeOutOfBounds { .. }), "{e}");
    let mut out = Vec::new();
    assert_eq!(sink.poll(&mut out).unwrap(), 2);
    let got: Vec<_> = out.iter().map(|c| (c.context, tag(&c.region))).collect();
    assert_eq!(got, [(0, 0), (1, 1)]);
    assert!(out
        .iter()
        .all(|c| (c.status, c.opcode, c.byte_len) == (WcStatus::Success, Opcode::Write, 64)));
    let log = sink.take_log();
    assert_eq!(log.len(), 2);
    assert_eq!(
        (log[0].remote_addr, log[0].rkey, log[0].length),
        (REMOTE.addr, 0x42, 64)
    );
    sink.set_fail(true);
    let (_, r) = sink
        .post_send(SendOp::Write(REMOTE), r, 0..64, 9)
        .unwrap_err();
    assert_eq!(tag(&r), 9);
    assert_eq!(sink.sends_in_flight(), 0);
}

/// Polls `qp` until `n` requests completed, checking after each poll
/// that at most `bound` work requests are in the NIC (`why` it must).
fn poll_within(qp: &mut NullScheduled, n: usize, bound: u32, why: &str) -> Vec<HostCompletion> {
    let mut out = Vec::new();
    while out.len() < n {
        qp.poll(&mut out).unwrap();
        assert!(qp.with_sink(|s| s.sends_in_flight()) <= bound, "{why}");
    }
    out
}

#[test]
fn every_request_completes_once_with_its_region_in_order() {
    let config = ScheduleConfig {
        max_pieces_in_flight: 4,
        ..bulk0()
    };
    let mut qp = scheduled(NullSink::new(1, 16), config).unwrap();
    for i in 0..100 {
        post(&mut qp, SendOp::Write(REMOTE), tagged(i), 64, i);
        assert!(qp.with_sink(|s| s.sends_in_flight()) <= 4);
    }
    assert_eq!(qp.queued(), 100);
    let out = poll_within(&mut qp, 100, 4, "at most max_pieces_in_flight in the NIC");
    assert_eq!(out.len(), 100);
    for (i, c) in out.iter().enumerate() {
        assert_eq!(c.context, i as u64, "one queue pair completes in order");
        assert_eq!(tag(&c.region), i as u64, "its own region back");
        assert_eq!(
            (c.status, c.opcode, c.byte_len),
            (WcStatus::Success, Opcode::Write, 64)
        );
    }
    assert_eq!(qp.queued(), 0);
    let mut more = Vec::new();
    qp.poll(&mut more).unwrap();
    assert!(more.is_empty(), "nothing completes twice");
    assert_eq!(qp.with_sink(|s| s.sends_in_flight()), 0);
}

/// Sends `requests` WRITEs of 64 KiB on `qp` one after the other,
/// moving `clock` by `step` before each poll: every piece takes `step`
/// from its post to the poll that completes it. Returns the window
/// after each request.
fn paced(
    qp: &mut NullScheduled,
    clock: &ManualClock,
    step: mtrdma_sched::Nanos,
    requests: u64,
) -> Vec<u64> {
    let mut windows = Vec::new();
    let mut out = Vec::new();
    for i in 0..requests {
        post(
            qp,
            SendOp::Write(REMOTE),
            HeapRegion::new(65_536),
            65_536,
            i,
        );
        out.clear();
        while out.is_empty() {
            clock.advance(step);
            qp.poll(&mut out).unwrap();
        }
        assert_eq!(out[0].status, WcStatus::Success);
        windows.push(qp.window().expect("a bulk window").window_bytes);
    }
    windows
}

#[test]
fn on_a_manual_clock_a_stalled_queue_pair_gives_up_the_bulk_budget_after_stall_after() {
    // Two bulk tenants share 8 KiB in the NIC. The first fills it and
    // is never polled (its pieces never complete, as behind a peer
    // that is gone); the second waits until the first's oldest piece
    // has been out for `stall_after` (the clock moved by hand in steps
    // of 1 ms), and no sooner.
    let clock = Arc::new(ManualClock::new(mtrdma_sched::Nanos::from_millis(1)));
    let stall = Duration::from_millis(100);
    let shared = NullScheduler::with_clock(
        SharedConfig {
            chunk_bytes: 4096,
            bulk_bytes_in_flight: 8192,
            stall_after: stall,
            ..SharedConfig::default()
        },
        Arc::clone(&clock),
    )
    .unwrap();
    let bulk = |t| ScheduleConfig::local(TenantId(t), TrafficClass::Bulk);
    let mut stuck = shared.attach(NullSink::new(1, 16), bulk(1)).unwrap();
    let mut other = shared.attach(NullSink::new(2, 16), bulk(2)).unwrap();
    post(
        &mut stuck,
        SendOp::Write(REMOTE),
        HeapRegion::new(8192),
        8192,
        1,
    );
    assert_eq!(stuck.with_sink(|s| s.sends_in_flight()), 2);
    post(
        &mut other,
        SendOp::Write(REMOTE),
        HeapRegion::new(4096),
        4096,
        2,
    );
    let mut out = Vec::new();
    let step = mtrdma_sched::Nanos::from_millis(1);
    for _ in 0..99 {
        clock.advance(step);
        other.poll(&mut out).unwrap();
        assert_eq!(
            other.with_sink(|s| s.sends_in_flight()),
            0,
            "held while the budget is the first one's"
        );
    }
    clock.advance(step);
    for _ in 0..100 {
        other.poll(&mut out).unwrap();
    }
    assert_eq!(out.len(), 1, "released at 100 ms");
    assert_eq!((out[0].context, out[0].status), (2, WcStatus::Success));
    // The first one's request is still there, and completes once
    // polled.
    let done = drain(&mut stuck, 1);
    assert_eq!((done[0].context, done[0].status), (1, WcStatus::Success));
}

#[test]
fn a_request_sent_whole_that_is_larger_than_the_window_goes_alone() {
    // A window of about one 1 KiB piece. First, requests sent whole of
    // one and three pieces: the second is larger than the window, and
    // with nothing in flight no completion would make room. Then one
    // of 1352 B split in two pieces, and one of 1352 B sent whole,
    // polled every millisecond (later than the round trip that would
    // round the window up to fit it). Each time, the large one goes
    // alone.
    for (split, lens) in [(false, [1032, 3080]), (true, [1352, 1352])] {
        let clock = Arc::new(ManualClock::new(mtrdma_sched::Nanos::from_millis(1)));
        let config = ScheduleConfig {
            chunk_bytes: 1024,
            max_pieces_in_flight: 8,
            window: Some(Arc::new(DelayWindowConfig {
                quiet_every: mtrdma_sched::Nanos::from_millis(5),
                ..DelayWindowConfig::for_piece(1024)
            })),
            ..bulk0()
        };
        let mut qp =
            scheduled_with_clock(NullSink::new(1, 16), config, Arc::clone(&clock)).unwrap();
        for (i, len) in lens.into_iter().enumerate() {
            let (r, op) = (HeapRegion::new(len), SendOp::Write(REMOTE));
            let result = if split && i == 0 {
                qp.post_send(op, r, 0..len, i as u64)
            } else {
                qp.post_send_whole(op, r, 0..len, i as u64)
            };
            if let Err((e, _)) = result {
                panic!("refused: {e}");
            }
        }
        let mut out = Vec::new();
        for _ in 0..20 {
            qp.poll(&mut out).unwrap();
            clock.advance(mtrdma_sched::Nanos::from_millis(1));
        }
        assert_eq!(
            out.iter()
                .map(|c| (c.context, c.byte_len))
                .collect::<Vec<_>>(),
            [(0, lens[0] as u32), (1, lens[1] as u32)],
            "split first: {split}"
        );
        assert!(qp.window().unwrap().window_bytes < lens[1] as u64);
        assert_eq!(qp.queued(), 0);
    }
}

#[test]
fn on_a_manual_clock_the_engine_and_its_window_run_in_virtual_time() {
    use mtrdma_sched::Nanos;
    let piece = 4096;
    let config = ScheduleConfig {
        chunk_bytes: piece,
        max_pieces_in_flight: 64,
        window: Some(Arc::new(DelayWindowConfig {
            quiet_every: Nanos::ZERO,
            ..DelayWindowConfig::for_piece(piece)
        })),
        ..bulk0()
    };
    let run = || {
        let clock = Arc::new(ManualClock::new(Nanos::from_millis(1)));
        let mut qp =
            scheduled_with_clock(NullSink::new(1, 128), config.clone(), Arc::clone(&clock))
                .unwrap();
        // Pieces that take 100 us (the path's own delay, no queue):
        // the window grows. Then every piece takes 2 ms, a standing
        // queue far over the target: it shrinks to its least, a
        // quarter of a piece, and stays there (one piece every four
        // round trips) until, a base period later, it takes the 2 ms
        // for the path's own delay.
        let mut windows = paced(&mut qp, &clock, Nanos::from_micros(100), 100);
        windows.extend(paced(&mut qp, &clock, Nanos::from_millis(2), 10));
        assert_eq!(qp.queued(), 0);
        windows
    };
    let windows = run();
    let grown = windows[99];
    assert!(grown >= 4 * piece, "an empty queue lets it grow: {grown}");
    assert_eq!(
        windows[103..],
        [piece / 4; 7],
        "a standing queue shrinks it to its least"
    );
    // Nothing but the manual clock moves the engine's time: the same
    // run gives the same windows, request by request.
    assert_eq!(run(), windows);
}

#[test]
fn a_window_bounds_the_bytes_in_the_nic_and_every_request_completes_in_order() {
    // A window fixed at 3 pieces of 4 KiB (and quiet times off): 16 KiB
    // requests split in 4 pieces, with room for 8 pieces otherwise.
    let piece = 4096;
    let window = DelayWindowConfig {
        initial_window: 3 * piece,
        min_window: 3 * piece,
        max_window: 3 * piece,
        quiet_every: mtrdma_sched::Nanos::ZERO,
        ..DelayWindowConfig::for_piece(piece)
    };
    let config = ScheduleConfig {
        chunk_bytes: piece,
        max_pieces_in_flight: 8,
        window: Some(std::sync::Arc::new(window)),
        ..bulk0()
    };
    let mut qp = scheduled(NullSink::new(1, 16).recording(), config).unwrap();
    let remote = RemoteRegion {
        addr: 0x9000_0000,
        len: 1 << 20,
        rkey: 5,
    };
    for i in 0..20u64 {
        let mut region = HeapRegion::new(16_384);
        region.as_mut_slice()[..8].copy_from_slice(&i.to_le_bytes());
        if let Err((e, _)) = qp.post_send(SendOp::Write(remote), region, 0..16_384, i) {
            panic!("refused: {e}");
        }
        assert!(qp.with_sink(|s| s.sends_in_flight()) <= 3);
    }
    let out = poll_within(&mut qp, 20, 3, "never more than the window in the NIC");
    for (i, c) in out.iter().enumerate() {
        assert_eq!((c.context, tag(&c.region)), (i as u64, i as u64));
        assert_eq!((c.status, c.byte_len), (WcStatus::Success, 16_384));
    }
    let log = qp.with_sink(NullSink::take_log);
    assert_eq!(log.len(), 80, "every piece posted once");
    assert!(log.iter().all(|p| p.length == 4096));
    assert_eq!(qp.queued(), 0);
}

#[test]
fn a_latency_queue_pair_has_no_window() {
    let window = DelayWindowConfig {
        initial_window: 1,
        min_window: 1,
        max_window: 1,
        ..DelayWindowConfig::for_piece(4096)
    };
    let config = ScheduleConfig {
        max_pieces_in_flight: 4,
        window: Some(std::sync::Arc::new(window)),
        ..ScheduleConfig::local(TenantId(0), TrafficClass::Latency)
    };
    let mut qp = scheduled(NullSink::new(1, 16), config).unwrap();
    for i in 0..4 {
        post(&mut qp, SendOp::Write(REMOTE), tagged(i), 64, i);
    }
    assert_eq!(
        qp.with_sink(|s| s.sends_in_flight()),
        4,
        "latency pieces are not held back by a window"
    );
    assert_eq!(drain(&mut qp, 4).len(), 4);
}

#[test]
fn a_shallow_send_queue_bounds_the_pieces_posted() {
    let mut qp = scheduled(NullSink::new(1, 2), bulk0()).unwrap();
    for i in 0..10 {
        post(&mut qp, SendOp::Send, tagged(i), 64, i);
    }
    assert_eq!(qp.with_sink(|s| s.sends_in_flight()), 2);
    let out = drain(&mut qp, 10);
    let contexts: Vec<u64> = out.iter().map(|c| c.context).collect();
    assert_eq!(contexts, (0..10).collect::<Vec<_>>());
    assert!(out.iter().all(|c| c.opcode == Opcode::Send));
}

#[test]
fn a_whole_write_with_immediate_goes_as_one_work_request() {
    // Queued behind another request (not the fast path) and on it.
    for queued_behind in [true, false] {
        let config = ScheduleConfig {
            chunk_bytes: 4096,
            max_pieces_in_flight: 2,
            ..bulk0()
        };
        let mut qp = scheduled(NullSink::new(1, 16).recording(), config).unwrap();
        let remote = RemoteRegion {
            addr: 0x9000_0000,
            len: 16_384,
            rkey: 5,
        };
        if queued_behind {
            let op = SendOp::Write(remote);
            if let Err((e, _)) = qp.post_send(op, HeapRegion::new(16_384), 0..16_384, 1) {
                panic!("refused: {e}");
            }
        }
        let region = HeapRegion::new(10_000);
        let op = SendOp::WriteWithImm(remote, 42);
        if let Err((e, _)) = qp.post_send_whole(op, region, 0..10_000, 9) {
            panic!("refused: {e}");
        }
        let done = drain(&mut qp, 1 + usize::from(queued_behind));
        let c = done
            .iter()
            .find(|c| c.context == 9)
            .expect("its completion");
        assert_eq!((c.status, c.byte_len), (WcStatus::Success, 10_000));
        let log = qp.with_sink(NullSink::take_log);
        let mine: Vec<&Posted> = log.iter().filter(|p| p.imm.is_some()).collect();
        assert_eq!(mine.len(), 1, "one work request");
        assert_eq!(
            (mine[0].opcode, mine[0].length, mine[0].imm),
            (
                ffi::ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM,
                10_000,
                Some(42)
            )
        );
        // Every other work request is a piece of the first request.
        assert_eq!(log.len(), 1 + 4 * usize::from(queued_behind));
    }
}

#[test]
fn a_scheduler_of_ones_own_decides_what_reaches_the_nic() {
    // The built-in scheduler splits a 16 KiB WRITE into 4 KiB pieces;
    // a FIFO plugged in its place grants it whole, in arrival order.
    let config = ScheduleConfig {
        chunk_bytes: 4096,
        ..bulk0()
    };
    let remote = RemoteRegion {
        addr: 0x9000_0000,
        len: 1 << 20,
        rkey: 5,
    };
    let mut fifo = scheduled_with(
        NullSink::new(1, 16).recording(),
        config.clone(),
        mtrdma_sched::FifoScheduler::new(),
    )
    .unwrap();
    let mut builtin = scheduled(NullSink::new(2, 16).recording(), config).unwrap();
    for i in 0..3u64 {
        let region = HeapRegion::new(16 << 10);
        if let Err((e, _)) = fifo.post_send(SendOp::Write(remote), region, 0..16 << 10, i) {
            panic!("refused: {e}");
        }
        let region = HeapRegion::new(16 << 10);
        if let Err((e, _)) = builtin.post_send(SendOp::Write(remote), region, 0..16 << 10, i) {
            panic!("refused: {e}");
        }
    }
    let mut out = Vec::new();
    while out.len() < 3 {
        fifo.poll(&mut out).unwrap();
    }
    let order: Vec<u64> = out.iter().map(|c| c.context).collect();
    assert_eq!(order, [0, 1, 2]);
    assert!(out.iter().all(|c| c.byte_len == 16 << 10));
    let lens: Vec<u32> = fifo
        .with_sink(NullSink::take_log)
        .iter()
        .map(|p| p.length)
        .collect();
    assert_eq!(lens, [16 << 10; 3], "one work request each");
    assert_eq!(drain(&mut builtin, 3).len(), 3);
    assert_eq!(
        builtin.with_sink(NullSink::take_log).len(),
        12,
        "4 pieces each"
    );
}
