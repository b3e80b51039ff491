//! Batches and lists on the null sink: one doorbell for many requests,
//! selective signaling, and what a refused or failed list hands back.

use super::*;

#[test]
fn a_watched_sink_reports_what_it_takes_refuses_and_completes() {
    let events = Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = Arc::clone(&events);
    let mut sink = NullSink::new(1, 4).watch(move |e| {
        let e = match e {
            SinkEvent::Posted(p) => format!("posted {} {}", p.wr_id, p.length),
            SinkEvent::Refused(p) => format!("refused {}", p.wr_id),
            SinkEvent::Completed(s) => format!("completed {s:?}"),
        };
        seen.lock().unwrap().push(e);
    });
    post_direct(&mut sink, 7, 64);
    sink.refuse_after(0);
    assert!(sink
        .post_send(SendOp::Write(REMOTE), tagged(8), 0..16, 8)
        .is_err());
    post_direct(&mut sink, 9, 32);
    sink.fail_completion_after(0);
    let mut out = Vec::new();
    sink.poll(&mut out).unwrap();
    let events = events.lock().unwrap();
    assert_eq!(events.len(), 5, "{events:?}");
    assert!(events[0].starts_with("posted ") && events[0].ends_with(" 64"));
    assert!(events[1].starts_with("refused "));
    assert!(events[2].starts_with("posted ") && events[2].ends_with(" 32"));
    assert_eq!(events[3..], ["completed RemoteAccess", "completed Flushed"]);
}

fn post_direct(sink: &mut NullSink, context: u64, len: usize) {
    let r = tagged(context);
    if sink
        .post_send(SendOp::Write(REMOTE), r, 0..len, context)
        .is_err()
    {
        panic!("refused");
    }
}

#[test]
fn a_batch_goes_as_one_list_and_asks_for_two_completions() {
    let mut sink = NullSink::new(1, 64).recording();
    sink.post_batch(writes(20)).unwrap();
    let posted = sink.take_log();
    let signaled: Vec<usize> = (0..posted.len()).filter(|&i| posted[i].signaled).collect();
    assert_eq!(posted.len(), 20);
    assert_eq!(signaled, [9, 19], "the one halfway and the last ask");
    assert_eq!(sink.sends_in_flight(), 20);
    let mut out = Vec::new();
    let reported = sink.poll(&mut out).unwrap();
    assert_eq!(reported, 2, "two completions from the device");
    assert_eq!(
        tags(&out),
        own_tags(0..20),
        "every request hands its own region back, in order"
    );
    assert!(out
        .iter()
        .all(|c| c.status == WcStatus::Success && c.opcode == Opcode::Write && c.byte_len == 64));
    assert_eq!(sink.sends_in_flight(), 0);
}

#[test]
fn a_batch_the_send_queue_cannot_hold_is_refused_whole_requests_back() {
    let mut sink = NullSink::new(1, 8);
    let (e, refused) = sink.post_batch(writes(10)).unwrap_err();
    assert!(matches!(e, Error::SendQueueFull { depth: 8 }), "{e}");
    assert_eq!(refused_tags(&refused), own_tags(0..10));
    assert_eq!(sink.sends_in_flight(), 0);
    // The device refusing one part way: those before it are posted.
    sink.refuse_after(3);
    let (_, refused) = sink.post_batch(writes(6)).unwrap_err();
    assert_eq!(
        refused.iter().map(|(c, _)| *c).collect::<Vec<_>>(),
        [3, 4, 5]
    );
    let mut out = Vec::new();
    sink.poll(&mut out).unwrap();
    assert_eq!(
        out.iter().map(|c| c.context).collect::<Vec<_>>(),
        [0, 1, 2],
        "the unsignaled ones before the refusal are reported"
    );
    assert_eq!(sink.sends_in_flight(), 0);
}

/// The shared engine of the data_path fuzz target's rig: 1 KiB pieces,
/// 8 KiB of bulk in flight, stalled senders' budget released after 20 ms.
fn fuzz_rig_engine() -> SharedConfig {
    SharedConfig {
        chunk_bytes: 1024,
        bulk_bytes_in_flight: 8 << 10,
        stall_after: Duration::from_millis(20),
        ..SharedConfig::default()
    }
}

#[test]
fn a_window_driven_under_a_piece_by_a_sleeping_sender_still_finishes_every_request() {
    // A sender on a shared engine with a delay window polls its first
    // request 380 ms late (its window learns a round trip that long
    // and shrinks to a quarter of a piece), sends a request whole and
    // then 24 pieces: they go slowly, one piece every few round trips,
    // but every request completes, once (found by the data_path fuzz
    // target, whose drain was shorter than this takes).
    let clock = Arc::new(ManualClock::new(Nanos::from_millis(1)));
    let shared = NullScheduler::with_clock(fuzz_rig_engine(), Arc::clone(&clock)).unwrap();
    let window: Arc<dyn WindowFactory> = Arc::new(DelayWindowConfig {
        quiet_every: Nanos::from_millis(50),
        ..DelayWindowConfig::for_piece(1024)
    });
    let config = ScheduleConfig {
        chunk_bytes: 1024,
        max_pieces_in_flight: 8,
        window: Some(window),
        ..ScheduleConfig::local(TenantId(3), TrafficClass::Bulk)
    };
    let mut qp = shared.attach(NullSink::new(3, 16), config).unwrap();
    let w = SendOp::Write(REMOTE);
    let region = |id: u64, len: usize| {
        let mut r = HeapRegion::new(len);
        r.as_mut_slice()[..8].copy_from_slice(&id.to_le_bytes());
        (w, r, 0..len, id)
    };
    let (op, r, range, id) = region(0, 584);
    qp.post_send(op, r, range, id).map_err(|e| e.0).unwrap();
    clock.advance(Nanos::from_millis(380));
    let small = [(1, 296), (2, 264), (3, 8)].map(|(id, len)| region(id, len));
    qp.post_batch(small).map_err(|e| e.0).unwrap();
    let (op, r, range, id) = region(4, 3976);
    qp.post_send_whole(op, r, range, id)
        .map_err(|e| e.0)
        .unwrap();
    let large = [5, 6, 7].map(|id| region(id, 8040));
    qp.post_batch(large).map_err(|e| e.0).unwrap();
    let mut done = Vec::new();
    for _ in 0..30_000 {
        qp.poll(&mut done).unwrap();
        if done.len() >= 8 {
            break;
        }
        clock.advance(Nanos::from_millis(10));
    }
    let mut got: Vec<(u64, u64)> = done.iter().map(|c| (c.context, tag(&c.region))).collect();
    got.sort_unstable();
    assert_eq!(got, own_tags(0..8));
    assert!(done.iter().all(|c| c.status == WcStatus::Success));
    assert_eq!((qp.queued(), qp.with_sink(|s| s.sends_in_flight())), (0, 0));
}

/// Contexts `from..from + n` as a batch (each region tagged with its
/// context).
fn writes_from(from: u64, n: u64) -> Vec<(SendOp, HeapRegion, Range<usize>, u64)> {
    (from..from + n)
        .map(|i| (SendOp::Write(REMOTE), tagged(i), 0..64, i))
        .collect()
}

#[test]
fn batches_between_single_posts_complete_in_order_and_a_failure_among_them_loses_nothing() {
    // A batch, single posts, a batch longer than one list, a single
    // post: the batches' unsignaled requests are reported by their
    // own lists' completions, the single posts by theirs, in order.
    let mut sink = NullSink::new(1, 128).recording();
    sink.post_batch(writes_from(0, 5)).unwrap();
    post_direct(&mut sink, 5, 64);
    post_direct(&mut sink, 6, 64);
    sink.post_batch(writes_from(7, 40)).unwrap();
    post_direct(&mut sink, 47, 64);
    let posted = sink.take_log();
    let signaled = posted.iter().filter(|p| p.signaled).count();
    assert_eq!(posted.len(), 48);
    assert_eq!(
        signaled,
        2 + 2 + 2 + 2 + 1,
        "lists of 5, 32 and 8, two singles, one single"
    );
    let mut out = Vec::new();
    while sink.sends_in_flight() > 0 {
        sink.poll(&mut out).unwrap();
    }
    let got: Vec<(u64, u64)> = out.iter().map(|c| (c.context, tag(&c.region))).collect();
    assert_eq!(got, own_tags(0..48));
    assert!(out.iter().all(|c| c.status == WcStatus::Success));

    // The same with the 30th request failing (unsignaled, in the long
    // batch's first list): those before it succeed, it fails, every
    // later one is flushed, each reported once.
    sink.post_batch(writes_from(0, 5)).unwrap();
    post_direct(&mut sink, 5, 64);
    post_direct(&mut sink, 6, 64);
    sink.post_batch(writes_from(7, 40)).unwrap();
    post_direct(&mut sink, 47, 64);
    sink.fail_completion_after(29);
    let mut out = Vec::new();
    while sink.sends_in_flight() > 0 {
        sink.poll(&mut out).unwrap();
    }
    let got: Vec<(u64, u64, WcStatus)> = out
        .iter()
        .map(|c| (c.context, tag(&c.region), c.status))
        .collect();
    let want: Vec<(u64, u64, WcStatus)> = (0..48)
        .map(|i| match i {
            0..=28 => (i, i, WcStatus::Success),
            29 => (i, i, WcStatus::RemoteAccess),
            _ => (i, i, WcStatus::Flushed),
        })
        .collect();
    assert_eq!(got, want);
}

#[test]
fn a_batch_refused_in_its_second_list_hands_back_what_was_not_posted() {
    // 40 requests go as lists of 32 and 8; the device takes the first
    // list and 3 of the second, the 3rd of them unsignaled: a
    // zero-length WRITE reports them, and the other 5 come back.
    let mut sink = NullSink::new(1, 128).recording();
    sink.refuse_after(35);
    let (e, refused) = sink.post_batch(writes(40)).unwrap_err();
    assert!(matches!(e, Error::Verbs { .. }), "{e}");
    assert_eq!(refused_tags(&refused), own_tags(35..40));
    let posted = sink.take_log();
    assert_eq!(posted.len(), 36, "35 requests and the zero-length WRITE");
    assert_eq!((posted[35].length, posted[35].signaled), (0, true));
    let mut out = Vec::new();
    while sink.sends_in_flight() > 0 {
        sink.poll(&mut out).unwrap();
    }
    assert_eq!(
        out.iter().map(|c| c.context).collect::<Vec<_>>(),
        (0..35).collect::<Vec<_>>(),
        "every posted request once, the zero-length WRITE none"
    );
    // The books are empty: a batch after it is numbered afresh.
    sink.post_batch(writes(3)).unwrap();
    let mut out = Vec::new();
    sink.poll(&mut out).unwrap();
    assert_eq!(out.iter().map(|c| c.context).collect::<Vec<_>>(), [0, 1, 2]);
    assert_eq!(sink.sends_in_flight(), 0);
}

#[test]
fn a_failed_request_in_a_batch_reports_every_request_once() {
    let mut sink = NullSink::new(1, 64);
    sink.post_batch(writes(20)).unwrap();
    // The 6th fails: unsignaled, it reports itself; the five before it
    // succeeded; all after it are flushed.
    sink.fail_completion_after(5);
    let mut out = Vec::new();
    while sink.sends_in_flight() > 0 {
        sink.poll(&mut out).unwrap();
    }
    let got: Vec<_> = out.iter().map(|c| (c.context, c.status)).collect();
    let want: Vec<_> = (0..20)
        .map(|i| match i {
            0..=4 => (i, WcStatus::Success),
            5 => (i, WcStatus::RemoteAccess),
            _ => (i, WcStatus::Flushed),
        })
        .collect();
    assert_eq!(got, want);
}

/// Posts a WRITE of 64 KiB on `qp` with `context`.
fn write_64k(qp: &mut NullScheduled, context: u64) {
    post(
        qp,
        SendOp::Write(REMOTE),
        HeapRegion::new(65536),
        65536,
        context,
    );
}

#[test]
fn a_split_request_goes_as_one_list_and_a_failed_piece_fails_it_once() {
    for (way, mut qp) in [
        (
            "solo",
            scheduled(
                NullSink::new(1, 64).recording(),
                ScheduleConfig {
                    chunk_bytes: 4096,
                    max_pieces_in_flight: 16,
                    ..bulk0()
                },
            )
            .unwrap(),
        ),
        (
            "shared",
            NullScheduler::new(SharedConfig {
                chunk_bytes: 4096,
                bulk_bytes_in_flight: 1 << 20,
                ..SharedConfig::default()
            })
            .unwrap()
            .attach(
                NullSink::new(2, 64).recording(),
                ScheduleConfig {
                    max_pieces_in_flight: 16,
                    ..bulk0()
                },
            )
            .unwrap(),
        ),
    ] {
        write_64k(&mut qp, 7);
        let done = drain(&mut qp, 1);
        let posted = qp.with_sink(|s| s.take_log());
        assert_eq!(posted.len(), 16, "{way}");
        assert_eq!(
            posted.iter().filter(|p| p.signaled).count(),
            2,
            "{way}: the piece halfway and the request's last ask for a completion"
        );
        assert!(posted[7].signaled && posted[15].signaled, "{way}");
        assert_eq!(
            (done.len(), done[0].context, done[0].status),
            (1, 7, WcStatus::Success)
        );

        // The 4th piece of the next one fails: the request fails once,
        // its region back, and nothing is left in flight.
        qp.with_sink(|s| s.fail_completion_after(3));
        write_64k(&mut qp, 8);
        let done = drain(&mut qp, 1);
        assert_eq!(done.len(), 1, "{way}");
        assert_eq!(
            (done[0].context, done[0].status, done[0].region.len()),
            (8, WcStatus::RemoteAccess, 65536),
            "{way}"
        );
        let mut more = Vec::new();
        for _ in 0..100 {
            qp.poll(&mut more).unwrap();
        }
        assert!(more.is_empty(), "{way}: reported once");
        assert_eq!(qp.queued(), 0, "{way}");
        assert_eq!(qp.with_sink(|s| s.sends_in_flight()), 0, "{way}");
    }
}

#[test]
fn a_scheduled_batch_is_accepted_together_and_completes_request_by_request() {
    let shared = NullScheduler::new(SharedConfig::default()).unwrap();
    let sixteen = ScheduleConfig {
        max_pieces_in_flight: 16,
        ..bulk0()
    };
    let solo = scheduled(NullSink::new(1, 64).recording(), sixteen.clone()).unwrap();
    let attached = shared
        .attach(NullSink::new(2, 64).recording(), sixteen)
        .unwrap();
    for (way, mut qp) in [("solo", solo), ("shared", attached)] {
        qp.post_batch(writes(16)).unwrap();
        let posted = qp.with_sink(|s| s.take_log());
        assert_eq!(posted.len(), 16, "{way}");
        assert_eq!(
            posted.iter().filter(|p| p.signaled).count(),
            2,
            "{way}: two completions for the batch"
        );
        let done = drain(&mut qp, 16);
        assert_eq!(tags(&done), own_tags(0..16), "{way}");
        assert_eq!(qp.queued(), 0, "{way}");
        // A request out of bounds refuses it and those after it, the
        // ones before accepted.
        let mut batch = writes(4);
        batch[2].2 = 0..65;
        let (e, refused) = qp.post_batch(batch).unwrap_err();
        assert!(
            matches!(e, Error::LocalRangeOutOfBounds { .. }),
            "{way}: {e}"
        );
        assert_eq!(refused.len(), 4, "{way}: checked before any is accepted");
        assert_eq!(qp.queued(), 0, "{way}");
    }
}

/// A scheduled queue pair (on a recording null sink) that may have four
/// pieces in the NIC at once.
fn four_at_once() -> NullScheduled {
    let four = ScheduleConfig {
        max_pieces_in_flight: 4,
        ..bulk0()
    };
    scheduled(NullSink::new(1, 64).recording(), four).unwrap()
}

#[test]
fn a_scheduled_batch_past_what_may_go_at_once_or_cut_by_the_device_loses_nothing() {
    // Four may go at once (the rest wait for the engine); then the
    // device refuses the third of the list, and then everything.
    let mut qp = four_at_once();
    qp.post_batch(writes(16)).unwrap();
    assert!(qp.queued() > 0, "the engine holds what may not go yet");
    let done = drain(&mut qp, 16);
    let got: Vec<(u64, u64, WcStatus)> = done
        .iter()
        .map(|c| (c.context, tag(&c.region), c.status))
        .collect();
    let want: Vec<(u64, u64, WcStatus)> = (0..16).map(|i| (i, i, WcStatus::Success)).collect();
    assert_eq!(got, want, "every request once, in order");
    assert_eq!(qp.with_sink(|s| s.take_log()).len(), 16);

    qp.with_sink(|s| s.refuse_after(2));
    qp.post_batch(writes(4)).unwrap();
    let mut done = drain(&mut qp, 4);
    done.sort_by_key(|c| c.context);
    assert_eq!(
        done.iter()
            .map(|c| (c.context, tag(&c.region), c.status))
            .collect::<Vec<_>>(),
        (0..4)
            .map(|i| (i, i, WcStatus::Success))
            .collect::<Vec<_>>(),
        "the two the device refused went through the engine"
    );

    qp.with_sink(|s| s.set_fail(true));
    qp.post_batch(writes(4)).unwrap();
    let mut done = drain(&mut qp, 4);
    done.sort_by_key(|c| c.context);
    assert_eq!(
        tags(&done),
        own_tags(0..4),
        "a refused request comes back once, failed"
    );
    assert!(done.iter().all(|c| c.status != WcStatus::Success));
    assert_eq!(qp.queued(), 0);
    assert_eq!(qp.with_sink(|s| s.sends_in_flight()), 0);
}

#[test]
fn a_scheduled_batch_dropped_unsubmitted_posts_nothing_and_holds_no_room() {
    // The requests a batch lets go at once are counted as they are added;
    // a batch dropped unsubmitted must give that room back, or the queue
    // pair would stall.
    let mut qp = four_at_once();
    for round in 0..3 {
        let mut batch = qp.batch();
        for i in 0..4 {
            batch
                .post_send(SendOp::Write(REMOTE), tagged(i), 0..64, i)
                .unwrap();
        }
        assert_eq!(batch.len(), 4);
        drop(batch);
        assert_eq!(qp.queued(), 0, "round {round}");
        assert!(qp.with_sink(NullSink::take_log).is_empty(), "round {round}");
    }
    qp.post_batch(writes(4)).unwrap();
    assert_eq!(
        qp.with_sink(NullSink::take_log).len(),
        4,
        "all four go to the NIC at once"
    );
    let done = drain(&mut qp, 4);
    assert_eq!(tags(&done), own_tags(0..4));
    assert!(done.iter().all(|c| c.status == WcStatus::Success));
    assert_eq!(qp.queued(), 0);
}
