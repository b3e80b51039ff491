//! Gather requests on the null sink: one work request whose scatter list
//! names several regions, every region owned until the completion hands
//! it back.

use super::*;
/// Regions tagged `tags`, each with `0..64`.
fn parts(tags: &[u64]) -> Vec<(HeapRegion, Range<usize>)> {
    tags.iter().map(|&t| (tagged(t), 0..64)).collect()
}

/// The tags and ranges of refused parts.
fn back(parts: &[(HeapRegion, Range<usize>)]) -> Vec<(u64, Range<usize>)> {
    parts
        .iter()
        .map(|(r, range)| (tag(r), range.clone()))
        .collect()
}

/// The tags of every region a completion hands back, in order.
fn regions(c: &HostCompletion) -> Vec<u64> {
    std::iter::once(&c.region)
        .chain(&c.gathered)
        .map(tag)
        .collect()
}

fn poll_all(sink: &mut NullSink) -> Vec<HostCompletion> {
    let mut out = Vec::new();
    while sink.sends_in_flight() > 0 {
        sink.poll(&mut out).unwrap();
    }
    out
}

#[test]
fn a_gather_is_one_work_request_with_its_parts_in_order() {
    let mut sink = NullSink::new(1, 16).with_max_send_sge(3).recording();
    let given = vec![
        (tagged(10), 0..16),
        (tagged(11), 8..40),
        (tagged(12), 0..64),
    ];
    let want: Vec<PostedSge> = given
        .iter()
        .map(|(r, range)| PostedSge {
            addr: r.addr() + range.start as u64,
            length: range.len() as u32,
            lkey: 0x1234,
        })
        .collect();
    sink.post_send_gather(SendOp::Write(REMOTE), given, 5)
        .unwrap();
    let log = sink.take_log();
    assert_eq!(log.len(), 1, "one work request");
    assert_eq!(
        log[0].sg_list, want,
        "its scatter list names the parts in order"
    );
    assert_eq!(log[0].remote_addr, REMOTE.addr);
    assert!(log[0].signaled);
    assert_eq!(sink.sends_in_flight(), 1);

    let done = poll_all(&mut sink);
    assert_eq!(done.len(), 1);
    let c = &done[0];
    assert_eq!(
        (c.context, c.status, c.opcode),
        (5, WcStatus::Success, Opcode::Write)
    );
    assert_eq!(c.byte_len, 16 + 32 + 64, "the bytes of all its parts");
    assert_eq!(regions(c), [10, 11, 12], "every region back, in order");
}

#[test]
fn a_gather_of_one_part_is_an_ordinary_request() {
    let mut sink = NullSink::new(1, 16).recording();
    sink.post_send_gather(SendOp::Send, parts(&[3]), 1).unwrap();
    let log = sink.take_log();
    assert_eq!(log[0].sg_list.len(), 1);
    assert_eq!(log[0].length, 64);
    let done = poll_all(&mut sink);
    assert_eq!(regions(&done[0]), [3]);
    assert!(done[0].gathered.is_empty());
}

#[test]
fn empty_parts_name_no_scatter_entry_and_still_come_back() {
    let mut sink = NullSink::new(1, 16).with_max_send_sge(3).recording();
    let given = vec![(tagged(1), 0..0), (tagged(2), 0..8), (tagged(3), 4..4)];
    sink.post_send_gather(SendOp::Send, given, 9).unwrap();
    let log = sink.take_log();
    assert_eq!(log[0].sg_list.len(), 1, "only the non-empty part");
    assert_eq!(log[0].sg_list[0].length, 8);
    let done = poll_all(&mut sink);
    assert_eq!(done[0].byte_len, 8);
    assert_eq!(regions(&done[0]), [1, 2, 3]);
}

#[test]
fn more_parts_than_max_send_sge_are_refused_every_region_back_in_order() {
    let mut sink = NullSink::new(1, 16).with_max_send_sge(2).recording();
    let (error, refused) = sink
        .post_send_gather(SendOp::Write(REMOTE), parts(&[1, 2, 3]), 0)
        .unwrap_err();
    assert!(
        matches!(error, Error::TooManyParts { parts: 3, max: 2 }),
        "{error}"
    );
    assert_eq!(back(&refused), [(1, 0..64), (2, 0..64), (3, 0..64)]);
    assert!(sink.take_log().is_empty(), "nothing posted");
    assert_eq!(sink.sends_in_flight(), 0);

    // The default is one entry per request.
    let mut one = NullSink::new(1, 16);
    let (error, refused) = one
        .post_send_gather(SendOp::Send, parts(&[4, 5]), 0)
        .unwrap_err();
    assert!(matches!(error, Error::TooManyParts { parts: 2, max: 1 }));
    assert_eq!(back(&refused), [(4, 0..64), (5, 0..64)]);
}

#[test]
fn a_gather_of_no_parts_is_refused() {
    let mut sink = NullSink::new(1, 16).with_max_send_sge(4);
    let (error, refused) = sink
        .post_send_gather(SendOp::Send, Vec::new(), 0)
        .unwrap_err();
    assert!(matches!(error, Error::EmptyGather));
    assert!(refused.is_empty());
    assert_eq!(sink.sends_in_flight(), 0);
}

#[test]
fn a_range_outside_its_region_is_refused_every_region_back() {
    let mut sink = NullSink::new(1, 16).with_max_send_sge(3).recording();
    let given = vec![(tagged(1), 0..64), (tagged(2), 32..65), (tagged(3), 0..8)];
    let (error, refused) = sink.post_send_gather(SendOp::Send, given, 0).unwrap_err();
    assert!(
        matches!(error, Error::LocalRangeOutOfBounds { ref range, len: 64 } if *range == (32..65)),
        "{error}"
    );
    assert_eq!(back(&refused), [(1, 0..64), (2, 32..65), (3, 0..8)]);
    assert!(sink.take_log().is_empty());
}

#[test]
fn parts_longer_than_the_remote_region_are_refused() {
    let mut sink = NullSink::new(1, 16).with_max_send_sge(3);
    let small = RemoteRegion { len: 100, ..REMOTE };
    let (error, refused) = sink
        .post_send_gather(SendOp::Write(small), parts(&[1, 2]), 0)
        .unwrap_err();
    assert!(
        matches!(error, Error::RemoteOutOfBounds { len: 128, .. }),
        "{error}"
    );
    assert_eq!(refused.len(), 2);
    // Each part fits alone, and two fit together.
    let fits = RemoteRegion { len: 128, ..REMOTE };
    sink.post_send_gather(SendOp::Read(fits), parts(&[1, 2]), 0)
        .unwrap();
    assert_eq!(poll_all(&mut sink)[0].byte_len, 128);
}

#[test]
fn an_atomic_takes_one_region() {
    let mut sink = NullSink::new(1, 16).with_max_send_sge(2);
    let op = SendOp::FetchAdd(REMOTE, 1);
    let given = vec![(tagged(1), 0..4), (tagged(2), 0..4)];
    let (error, refused) = sink.post_send_gather(op, given, 0).unwrap_err();
    assert!(matches!(error, Error::AtomicGather { parts: 2 }), "{error}");
    assert_eq!(back(&refused), [(1, 0..4), (2, 0..4)]);
    // One region of one word is an atomic as post_send takes it.
    let (error, _) = sink
        .post_send_gather(op, vec![(tagged(3), 0..4)], 0)
        .unwrap_err();
    assert!(matches!(error, Error::AtomicLayout { local_len: 4, .. }));
    sink.post_send_gather(op, vec![(tagged(4), 0..8)], 0)
        .unwrap();
    assert_eq!(regions(&poll_all(&mut sink)[0]), [4]);
}

#[test]
fn a_gather_the_device_refuses_hands_every_region_back_in_order() {
    let mut sink = NullSink::new(1, 16).with_max_send_sge(3);
    sink.refuse_after(0);
    let (error, refused) = sink
        .post_send_gather(SendOp::Send, parts(&[7, 8, 9]), 0)
        .unwrap_err();
    assert!(matches!(error, Error::Verbs { .. }), "{error}");
    assert_eq!(back(&refused), [(7, 0..64), (8, 0..64), (9, 0..64)]);
    assert_eq!(sink.sends_in_flight(), 0);
    assert_eq!(sink.books.drain_regions().count(), 0, "nothing left parked");
    // The queue pair goes on as before.
    sink.post_send_gather(SendOp::Send, parts(&[7, 8, 9]), 1)
        .unwrap();
    assert_eq!(regions(&poll_all(&mut sink)[0]), [7, 8, 9]);
}

#[test]
fn a_full_send_queue_refuses_a_gather_every_region_back() {
    let mut sink = NullSink::new(1, 1).with_max_send_sge(2);
    sink.post_send(SendOp::Send, tagged(0), 0..8, 0).unwrap();
    let (error, refused) = sink
        .post_send_gather(SendOp::Send, parts(&[1, 2]), 1)
        .unwrap_err();
    assert!(
        matches!(error, Error::SendQueueFull { depth: 1 }),
        "{error}"
    );
    assert_eq!(back(&refused), [(1, 0..64), (2, 0..64)]);
    assert_eq!(sink.sends_in_flight(), 1);
}

#[test]
fn a_failed_gather_and_the_flushed_ones_after_it_hand_every_region_back() {
    let mut sink = NullSink::new(1, 16).with_max_send_sge(3);
    sink.post_send(SendOp::Write(REMOTE), tagged(0), 0..64, 0)
        .unwrap();
    sink.post_send_gather(SendOp::Write(REMOTE), parts(&[10, 11, 12]), 1)
        .unwrap();
    sink.post_send(SendOp::Write(REMOTE), tagged(2), 0..64, 2)
        .unwrap();
    sink.post_send_gather(SendOp::Write(REMOTE), parts(&[30, 31]), 3)
        .unwrap();
    // The gather fails; everything after it is flushed.
    sink.fail_completion_after(1);
    let done = poll_all(&mut sink);
    let got: Vec<(u64, WcStatus, Vec<u64>)> = done
        .iter()
        .map(|c| (c.context, c.status, regions(c)))
        .collect();
    assert_eq!(
        got,
        [
            (0, WcStatus::Success, vec![0]),
            (1, WcStatus::RemoteAccess, vec![10, 11, 12]),
            (2, WcStatus::Flushed, vec![2]),
            (3, WcStatus::Flushed, vec![30, 31]),
        ]
    );
    assert_eq!(sink.sends_in_flight(), 0);
}

#[test]
fn gathers_and_single_requests_complete_in_order_under_selective_signaling() {
    // Single requests of a batch go unsignaled; a gather after them asks
    // for its completion and reports them.
    let mut sink = NullSink::new(1, 64).with_max_send_sge(2).recording();
    let batch: Vec<_> = (0..6)
        .map(|i| (SendOp::Write(REMOTE), tagged(i), 0..64, i))
        .collect();
    sink.post_batch(batch).unwrap();
    sink.post_send_gather(SendOp::Write(REMOTE), parts(&[60, 61]), 6)
        .unwrap();
    let log = sink.take_log();
    assert!(
        log[..6].iter().any(|p| !p.signaled),
        "the batch is partly unsignaled"
    );
    assert!(log[6].signaled, "a gather asks for its completion");
    let done = poll_all(&mut sink);
    let got: Vec<(u64, Vec<u64>)> = done.iter().map(|c| (c.context, regions(c))).collect();
    let mut want: Vec<(u64, Vec<u64>)> = (0..6).map(|i| (i, vec![i])).collect();
    want.push((6, vec![60, 61]));
    assert_eq!(got, want);
}

#[test]
fn teardown_with_gathers_in_flight_takes_every_region() {
    let mut sink = NullSink::new(1, 16).with_max_send_sge(3);
    sink.post_send_gather(SendOp::Send, parts(&[1, 2, 3]), 0)
        .unwrap();
    sink.post_send(SendOp::Send, tagged(4), 0..8, 1).unwrap();
    sink.post_send_gather(SendOp::Send, parts(&[5, 6]), 2)
        .unwrap();
    // What a teardown that could not drain leaks (never frees): every
    // region parked, the gathers' all of them.
    let mut left: Vec<u64> = sink.books.drain_regions().map(|r| tag(&r)).collect();
    left.sort_unstable();
    assert_eq!(left, [1, 2, 3, 4, 5, 6]);
}

#[test]
fn a_flushing_teardown_completes_every_gather() {
    let mut sink = NullSink::new(1, 16).with_max_send_sge(3);
    sink.post_send_gather(SendOp::Send, parts(&[1, 2, 3]), 0)
        .unwrap();
    sink.post_send_gather(SendOp::Send, parts(&[5, 6]), 2)
        .unwrap();
    assert!(Sink::shutdown(&mut sink), "drained");
    assert_eq!(sink.sends_in_flight(), 0);
    assert_eq!(sink.books.drain_regions().count(), 0, "nothing left parked");
}

#[test]
fn the_sink_refuses_a_scatter_list_longer_than_it_was_built_for() {
    // What a provider does when a request names more entries than the
    // queue pair's max_send_sge: the books must not be ahead of it.
    let mut sink = NullSink::new(1, 16);
    let (a, b) = (tagged(1), tagged(2));
    let mut sges = [a.sge(&(0..8)).unwrap(), b.sge(&(0..8)).unwrap()];
    let mut wr = ffi::ibv_send_wr {
        sg_list: sges.as_mut_ptr(),
        num_sge: 2,
        opcode: ffi::ibv_wr_opcode::IBV_WR_SEND,
        // SAFETY: all-zero is a valid value of this plain C struct.
        ..unsafe { std::mem::zeroed() }
    };
    // SAFETY: the scatter list names `a` and `b`, alive until the end of
    // the test; nothing is posted.
    assert!(unsafe { sink.post_wr(&mut wr) }.is_err());
}

/// Tags of (context, region) entries.
fn entries(refused: &[(u64, HeapRegion)]) -> Vec<(u64, u64)> {
    refused.iter().map(|(c, r)| (*c, tag(r))).collect()
}

/// A batch of six: single WRITEs with contexts and tags `0..6`, but for
/// request 3, a gather of regions tagged 30, 31, 32.
fn mixed_batch(sink: &mut NullSink) -> Batch<'_, NullSink> {
    let mut batch = Batch::new(sink);
    for i in 0..6 {
        if i == 3 {
            batch
                .push_gather(SendOp::Write(REMOTE), parts(&[30, 31, 32]), i)
                .unwrap();
        } else {
            batch
                .push(SendOp::Write(REMOTE), tagged(i), 0..64, i)
                .unwrap();
        }
    }
    batch
}

#[test]
fn a_batch_carries_a_gather_in_its_list_unsignaled_and_hands_its_regions_back() {
    let mut sink = NullSink::new(1, 64).with_max_send_sge(3).recording();
    let batch = mixed_batch(&mut sink);
    assert_eq!(batch.len(), 6);
    assert!(batch.submit().is_ok());
    let log = sink.take_log();
    assert_eq!(log.len(), 6, "one work request each");
    let signaled: Vec<usize> = (0..6).filter(|&i| log[i].signaled).collect();
    assert_eq!(signaled, [2, 5]);
    assert_eq!(log[3].sg_list.len(), 3, "the gather's whole list");
    assert!(log
        .iter()
        .enumerate()
        .all(|(i, p)| i == 3 || p.sg_list.len() == 1));
    let done = poll_all(&mut sink);
    let got: Vec<(u64, Vec<u64>, u32)> = done
        .iter()
        .map(|c| (c.context, regions(c), c.byte_len))
        .collect();
    let want: Vec<(u64, Vec<u64>, u32)> = (0..6)
        .map(|i| {
            if i == 3 {
                (3, vec![30, 31, 32], 192)
            } else {
                (i, vec![i], 64)
            }
        })
        .collect();
    assert_eq!(
        got, want,
        "the unsignaled gather completes with its regions"
    );
}

#[test]
fn a_batch_refused_before_its_gather_hands_every_region_back_in_order() {
    let mut sink = NullSink::new(1, 64).with_max_send_sge(3);
    sink.refuse_after(2);
    let refusal = mixed_batch(&mut sink).submit().err().unwrap();
    assert_eq!((refusal.posted, refusal.not_posted), (2, 4));
    assert_eq!(
        entries(&refusal.refused),
        [(2, 2), (3, 30), (3, 31), (3, 32), (4, 4), (5, 5)],
        "the gather's regions as consecutive entries with its context"
    );
    // The two taken complete (the last of them unsignaled: reported by the
    // zero-length WRITE the sink posts after a cut list).
    let done = poll_all(&mut sink);
    let got: Vec<(u64, Vec<u64>)> = done.iter().map(|c| (c.context, regions(c))).collect();
    assert_eq!(got, [(0, vec![0]), (1, vec![1])]);
    assert_eq!(sink.books.drain_regions().count(), 0, "nothing left parked");
}

#[test]
fn a_cancelled_batch_hands_a_gathers_regions_back_and_a_refused_gather_leaves_it_unchanged() {
    let mut sink = NullSink::new(1, 64).with_max_send_sge(3);
    let mut batch = mixed_batch(&mut sink);
    let (error, back_parts) = batch
        .push_gather(SendOp::Send, parts(&[40, 41, 42, 43]), 9)
        .unwrap_err();
    assert!(matches!(error, Error::TooManyParts { parts: 4, max: 3 }));
    assert_eq!(back(&back_parts).len(), 4);
    assert_eq!(batch.len(), 6, "unchanged");
    let cancelled = batch.cancel();
    assert_eq!(
        entries(&cancelled),
        [
            (0, 0),
            (1, 1),
            (2, 2),
            (3, 30),
            (3, 31),
            (3, 32),
            (4, 4),
            (5, 5)
        ]
    );
    assert_eq!(sink.sends_in_flight(), 0);
    assert_eq!(sink.books.drain_regions().count(), 0);
}

#[test]
fn a_dropped_batch_with_a_gather_leaves_nothing_parked() {
    let mut sink = NullSink::new(1, 64).with_max_send_sge(3);
    drop(mixed_batch(&mut sink));
    assert_eq!(sink.books.drain_regions().count(), 0);
}

/// A `len`-byte region whose first bytes say `tag`.
fn big(tag: u64, len: usize) -> HeapRegion {
    let mut r = HeapRegion::new(len);
    r.as_mut_slice()[..8].copy_from_slice(&tag.to_le_bytes());
    r
}

/// A scheduled null sink that takes `sges` entries per request and cuts
/// requests in 4 KiB pieces: on an engine of its own, or attached to a
/// shared one.
fn scheduled_ways(sges: u32) -> Vec<(&'static str, NullScheduled)> {
    let config = || ScheduleConfig {
        chunk_bytes: 4096,
        max_pieces_in_flight: 16,
        ..ScheduleConfig::local(mtrdma_core::TenantId(0), mtrdma_core::TrafficClass::Bulk)
    };
    let shared = NullScheduler::new(crate::SharedConfig {
        chunk_bytes: 4096,
        bulk_bytes_in_flight: 1 << 20,
        ..crate::SharedConfig::default()
    })
    .unwrap();
    vec![
        (
            "solo",
            scheduled(
                NullSink::new(1, 64).with_max_send_sge(sges).recording(),
                config(),
            )
            .unwrap(),
        ),
        (
            "shared",
            shared
                .attach(
                    NullSink::new(2, 64).with_max_send_sge(sges).recording(),
                    config(),
                )
                .unwrap(),
        ),
    ]
}

/// Every completion's context, success and regions, in order.
fn outcomes(done: &[HostCompletion]) -> Vec<(u64, bool, Vec<u64>)> {
    done.iter()
        .map(|c| (c.context, c.status.is_success(), regions(c)))
        .collect()
}

#[test]
fn a_scheduled_gather_goes_whole_as_one_work_request_and_hands_every_region_back() {
    for (way, mut qp) in scheduled_ways(3) {
        // A request split in pieces before it, and one after.
        qp.post_send(SendOp::Write(REMOTE), big(1, 16_384), 0..16_384, 1)
            .unwrap();
        let given = vec![
            (big(20, 8192), 0..8192),
            (big(21, 8192), 100..8192),
            (big(22, 8192), 0..8192),
        ];
        let want: Vec<(u64, u32)> = given
            .iter()
            .map(|(r, range)| (r.addr() + range.start as u64, range.len() as u32))
            .collect();
        qp.post_send_gather(SendOp::Write(REMOTE), given, 2)
            .unwrap();
        qp.post_send(SendOp::Write(REMOTE), big(3, 8192), 0..8192, 3)
            .unwrap();
        let done = drain(&mut qp, 3);
        let got: Vec<(u64, WcStatus, Vec<u64>, u32)> = done
            .iter()
            .map(|c| (c.context, c.status, regions(c), c.byte_len))
            .collect();
        assert_eq!(
            got,
            [
                (1, WcStatus::Success, vec![1], 16_384),
                (2, WcStatus::Success, vec![20, 21, 22], 8192 * 3 - 100),
                (3, WcStatus::Success, vec![3], 8192),
            ],
            "{way}"
        );
        let log = qp.with_sink(NullSink::take_log);
        let lists: Vec<&Posted> = log.iter().filter(|p| p.sg_list.len() > 1).collect();
        assert_eq!(lists.len(), 1, "{way}: the gather is one work request");
        let sent: Vec<(u64, u32)> = lists[0]
            .sg_list
            .iter()
            .map(|e| (e.addr, e.length))
            .collect();
        assert_eq!(sent, want, "{way}: its whole list, in order, never split");
        assert_eq!(lists[0].remote_addr, REMOTE.addr, "{way}");
        assert_eq!(
            log.len(),
            4 + 1 + 2,
            "{way}: the others went as 4 KiB pieces"
        );
        assert_eq!(qp.queued(), 0, "{way}");
    }
}

/// Checks the refusal of a gather of `parts(&[first, first + 1, first +
/// 2])` on a queue pair that takes two entries: every region back, in
/// order, with its range.
#[allow(clippy::type_complexity)]
fn refused_three_of_two(
    result: Result<(), (Error, Vec<(HeapRegion, Range<usize>)>)>,
    first: u64,
    way: &str,
) {
    let (error, refused) = result.unwrap_err();
    assert!(
        matches!(error, Error::TooManyParts { parts: 3, max: 2 }),
        "{way}: {error}"
    );
    let want: Vec<(u64, Range<usize>)> = (first..first + 3).map(|t| (t, 0..64)).collect();
    assert_eq!(back(&refused), want, "{way}");
}

#[test]
fn a_scheduled_gather_is_checked_and_refused_every_region_back() {
    for (way, mut qp) in scheduled_ways(2) {
        let refused = qp.post_send_gather(SendOp::Send, parts(&[1, 2, 3]), 0);
        refused_three_of_two(refused, 1, way);
        let small = RemoteRegion { len: 100, ..REMOTE };
        let (error, refused) = qp
            .post_send_gather(SendOp::Write(small), parts(&[4, 5]), 0)
            .unwrap_err();
        assert!(
            matches!(error, Error::RemoteOutOfBounds { .. }),
            "{way}: {error}"
        );
        assert_eq!(back(&refused), [(4, 0..64), (5, 0..64)], "{way}");
        assert!(qp.with_sink(NullSink::take_log).is_empty(), "{way}");
    }
}

#[test]
fn a_failed_scheduled_gather_hands_every_region_back_once() {
    for (way, mut qp) in scheduled_ways(3) {
        qp.with_sink(|s| s.fail_completion_after(0));
        qp.post_send_gather(SendOp::Write(REMOTE), parts(&[1, 2, 3]), 0)
            .unwrap();
        qp.post_send_gather(SendOp::Write(REMOTE), parts(&[4, 5]), 1)
            .unwrap();
        let done = drain(&mut qp, 2);
        assert_eq!(
            outcomes(&done),
            [(0, false, vec![1, 2, 3]), (1, false, vec![4, 5])],
            "{way}"
        );
        let mut more = Vec::new();
        qp.poll(&mut more).unwrap();
        assert!(more.is_empty(), "{way}: nothing comes back twice");
    }
}

/// A batch of `qp` holding one WRITE of a region tagged 1, context 1.
fn batch_of_one_write(qp: &mut NullScheduled) -> NullBatch<'_> {
    let mut batch = qp.batch();
    batch
        .post_send(SendOp::Write(REMOTE), tagged(1), 0..64, 1)
        .unwrap();
    batch
}

/// Every completion's context and regions, in order.
fn handed_back(done: &[HostCompletion]) -> Vec<(u64, Vec<u64>)> {
    done.iter().map(|c| (c.context, regions(c))).collect()
}

#[test]
fn a_scheduled_batch_sends_its_gather_whole_in_the_batchs_list_and_hands_every_region_back() {
    for (way, mut qp) in scheduled_ways(3) {
        // The gather first: the engine lets all three go at once, as one
        // list, the gather in it without a completion of its own.
        let mut batch = qp.batch();
        batch
            .post_send_gather(SendOp::Write(REMOTE), parts(&[20, 21, 22]), 0)
            .unwrap();
        batch
            .post_send(SendOp::Write(REMOTE), tagged(1), 0..64, 1)
            .unwrap();
        batch
            .post_send(SendOp::Write(REMOTE), tagged(2), 0..64, 2)
            .unwrap();
        assert_eq!(batch.len(), 3, "{way}");
        batch.submit().unwrap();
        let log = qp.with_sink(NullSink::take_log);
        let shape: Vec<(usize, bool)> = log.iter().map(|p| (p.sg_list.len(), p.signaled)).collect();
        assert_eq!(
            shape,
            [(3, false), (1, true), (1, true)],
            "{way}: one work request for the gather, reported by the next"
        );
        let done = drain(&mut qp, 3);
        assert_eq!(
            handed_back(&done),
            [(0, vec![20, 21, 22]), (1, vec![1]), (2, vec![2])],
            "{way}"
        );
        assert!(done.iter().all(|c| c.status.is_success()), "{way}");
        assert_eq!(done[0].byte_len, 3 * 64, "{way}");

        // Behind a request the engine lets go at once: still in order.
        let mut batch = qp.batch();
        batch
            .post_send(SendOp::Write(REMOTE), tagged(3), 0..64, 3)
            .unwrap();
        batch
            .post_send_gather(SendOp::Send, parts(&[30, 31]), 4)
            .unwrap();
        batch
            .post_send(SendOp::Write(REMOTE), tagged(5), 0..64, 5)
            .unwrap();
        batch.submit().unwrap();
        let log = qp.with_sink(NullSink::take_log);
        let lists: Vec<usize> = log.iter().map(|p| p.sg_list.len()).collect();
        assert_eq!(lists, [1, 2, 1], "{way}: in order, the gather whole");
        let done = drain(&mut qp, 3);
        assert_eq!(
            handed_back(&done),
            [(3, vec![3]), (4, vec![30, 31]), (5, vec![5])],
            "{way}"
        );
        let mut more = Vec::new();
        qp.poll(&mut more).unwrap();
        assert!(more.is_empty(), "{way}: nothing comes back twice");
        assert_eq!(qp.queued(), 0, "{way}");
    }
}

#[test]
fn a_scheduled_batchs_gather_is_checked_when_added_and_a_refused_one_leaves_the_batch_unchanged() {
    for (way, mut qp) in scheduled_ways(2) {
        let mut batch = batch_of_one_write(&mut qp);
        let refused = batch.post_send_gather(SendOp::Send, parts(&[2, 3, 4]), 2);
        refused_three_of_two(refused, 2, way);
        let (error, refused) = batch
            .post_send_gather(
                SendOp::Send,
                vec![(tagged(5), 0..64), (tagged(6), 0..65)],
                3,
            )
            .unwrap_err();
        assert!(
            matches!(error, Error::LocalRangeOutOfBounds { .. }),
            "{way}: {error}"
        );
        assert_eq!(back(&refused), [(5, 0..64), (6, 0..65)], "{way}");
        let (error, refused) = batch
            .post_send_gather(SendOp::Send, Vec::new(), 4)
            .unwrap_err();
        assert!(matches!(error, Error::EmptyGather), "{way}: {error}");
        assert!(refused.is_empty(), "{way}");
        assert_eq!(batch.len(), 1, "{way}: the batch is unchanged");
        batch.submit().unwrap();
        let done = drain(&mut qp, 1);
        assert_eq!(handed_back(&done), [(1, vec![1])], "{way}");
    }
}

#[test]
fn a_cancelled_scheduled_batch_hands_its_gathers_regions_back_in_order() {
    for (way, mut qp) in scheduled_ways(3) {
        let mut batch = batch_of_one_write(&mut qp);
        batch
            .post_send_gather(SendOp::Write(REMOTE), parts(&[20, 21, 22]), 2)
            .unwrap();
        batch
            .post_send(SendOp::Write(REMOTE), tagged(3), 0..64, 3)
            .unwrap();
        assert_eq!(
            entries(&batch.cancel()),
            [(1, 1), (2, 20), (2, 21), (2, 22), (3, 3)],
            "{way}"
        );
        assert!(qp.with_sink(NullSink::take_log).is_empty(), "{way}");
        assert_eq!(qp.queued(), 0, "{way}");
    }
}

#[test]
fn a_gather_the_scheduler_refuses_in_a_batch_hands_every_region_back_once() {
    // One descriptor queued at most, one piece in the NIC: the first
    // request goes, the second is granted and waits for room, the third
    // waits in the scheduler's queue, the gather after it is refused, and
    // so is what follows it.
    let config = ScheduleConfig {
        max_pieces_in_flight: 1,
        ..ScheduleConfig::local(mtrdma_core::TenantId(0), mtrdma_core::TrafficClass::Bulk)
    };
    let sched = mtrdma_sched::TenantScheduler::new(mtrdma_sched::SchedulerConfig {
        max_queued_per_tenant: 1,
        ..mtrdma_sched::SchedulerConfig::default()
    })
    .unwrap();
    let sink = NullSink::new(1, 64).with_max_send_sge(3).recording();
    let mut qp = scheduled_with(sink, config, sched).unwrap();
    let mut batch = qp.batch();
    for i in 0..3 {
        batch
            .post_send(SendOp::Write(REMOTE), tagged(i), 0..64, i)
            .unwrap();
    }
    batch
        .post_send_gather(SendOp::Write(REMOTE), parts(&[20, 21, 22]), 3)
        .unwrap();
    batch
        .post_send(SendOp::Write(REMOTE), tagged(4), 0..64, 4)
        .unwrap();
    let (error, refused) = batch.submit().unwrap_err();
    assert!(matches!(error, Error::Rejected(_)), "{error}");
    assert_eq!(entries(&refused), [(3, 20), (3, 21), (3, 22), (4, 4)]);
    let done = drain(&mut qp, 3);
    assert_eq!(
        handed_back(&done),
        [(0, vec![0]), (1, vec![1]), (2, vec![2])]
    );
    let mut more = Vec::new();
    for _ in 0..100 {
        qp.poll(&mut more).unwrap();
    }
    assert!(more.is_empty(), "nothing comes back twice");
    assert_eq!(qp.queued(), 0);
    assert!(qp
        .with_sink(NullSink::take_log)
        .iter()
        .all(|p| p.sg_list.len() == 1));
}

#[test]
fn a_failed_gather_in_a_scheduled_batch_hands_every_region_back_once() {
    for (way, mut qp) in scheduled_ways(3) {
        qp.with_sink(|s| s.fail_completion_after(1));
        let mut batch = batch_of_one_write(&mut qp);
        batch
            .post_send_gather(SendOp::Write(REMOTE), parts(&[20, 21]), 2)
            .unwrap();
        batch
            .post_send_gather(SendOp::Write(REMOTE), parts(&[30, 31, 32]), 3)
            .unwrap();
        batch.submit().unwrap();
        let done = drain(&mut qp, 3);
        assert_eq!(
            outcomes(&done),
            [
                (1, true, vec![1]),
                (2, false, vec![20, 21]),
                (3, false, vec![30, 31, 32])
            ],
            "{way}"
        );
        let mut more = Vec::new();
        qp.poll(&mut more).unwrap();
        assert!(more.is_empty(), "{way}: nothing comes back twice");
    }
}
