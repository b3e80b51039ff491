//! Tests of `gate`.

use super::*;
use crate::{DelayWindow, DelayWindowConfig, TenantId};

fn grant(class: TrafficClass, len: u64, is_last: bool) -> Grant<()> {
    Grant {
        tenant: TenantId(1),
        class,
        op: Opcode::Write,
        handle: (),
        offset: 0,
        len,
        is_last,
    }
}

#[test]
fn a_lane_with_a_piece_limit_splits_large_grants_and_keeps_the_last_mark() {
    let mut lane: Lane<()> = Lane::new(TrafficClass::Bulk, 4, None).with_piece_limit(4096);
    let mut g = grant(TrafficClass::Bulk, 10_000, true);
    g.offset = 65_536;
    assert_eq!(lane.push_granted(g), 3);
    let pieces: Vec<_> = lane
        .pending()
        .iter()
        .map(|g| (g.offset, g.len, g.is_last))
        .collect();
    assert_eq!(
        pieces,
        [
            (65_536, 4096, false),
            (69_632, 4096, false),
            (73_728, 1808, true)
        ]
    );
    // A grant that is not its request's last keeps no mark at all.
    let mut lane: Lane<()> = Lane::new(TrafficClass::Bulk, 4, None).with_piece_limit(4096);
    assert_eq!(lane.push_granted(grant(TrafficClass::Bulk, 8192, false)), 2);
    assert!(lane.pending().iter().all(|g| !g.is_last));
    // SEND and atomics cannot be split; small grants go whole.
    let mut send = grant(TrafficClass::Bulk, 8192, true);
    send.op = Opcode::Send;
    assert_eq!(lane.push_granted(send), 1);
    assert_eq!(lane.push_granted(grant(TrafficClass::Bulk, 4096, true)), 1);
}

#[test]
fn waiting_pieces_go_in_grant_order_past_held_lanes_but_not_past_the_budget() {
    let mut order = GrantOrder::default();
    // Lane 1 is held by its own slots; lane 2's piece is held by the
    // budget; lane 3's (granted after it) must wait behind it.
    for key in [1, 2, 3] {
        order.push(TrafficClass::Bulk, key);
    }
    order.push(TrafficClass::Latency, 9);
    let mut offered = Vec::new();
    order.drain(|key| {
        offered.push(key);
        match key {
            9 => Post::Posted,
            1 => Post::Held,
            _ => Post::Budget,
        }
    });
    assert_eq!(
        offered,
        [9, 1, 2],
        "latency first; nothing after the budget stop"
    );
    assert_eq!(order.len(), 3);
    // A new bulk grant waits behind the one the budget holds.
    order.push(TrafficClass::Bulk, 4);
    order.drain_newest(TrafficClass::Bulk, 4, |_| panic!("must wait its turn"));
    // Once the budget frees, they go in the order granted.
    let mut offered = Vec::new();
    order.drain(|key| {
        offered.push(key);
        if key == 1 {
            Post::Held
        } else {
            Post::Posted
        }
    });
    assert_eq!(offered, [1, 2, 3, 4]);
    assert_eq!(order.len(), 1);
    assert_eq!(order.remove_lane(TrafficClass::Bulk, 1), 1);
    assert!(order.is_empty());
}

/// A queue pair whose pieces stay in the NIC (a peer that posts no
/// receives) stops holding the budget once its oldest piece is
/// `stall_after` old: another queue pair's pieces go, the stuck one
/// posts nothing more, and when its pieces complete (failed, typically)
/// the budget's count comes out right and the lane goes again.
#[test]
fn a_stuck_queue_pair_stops_holding_the_budget() {
    let mut gate = Gate::new(4096, 8192).with_stall_after(Nanos::from_millis(100));
    let mut stuck: Lane<()> = Lane::new(TrafficClass::Bulk, 8, None);
    let mut other: Lane<()> = Lane::new(TrafficClass::Bulk, 8, None);
    let at = |ms: u64| move || Nanos::from_millis(ms);
    gate.sent(&mut stuck, 1, 4096, at(0));
    gate.sent(&mut stuck, 2, 4096, at(1));
    assert_eq!(gate.admits(&other, 4096, at(2)), Admit::AfterCompletion);
    assert!(!gate.may_grant());
    // Queued, not stuck, for a while.
    assert!(!gate.release_if_stalled(&mut stuck, Nanos::from_millis(99)));
    assert!(!gate.may_grant());
    assert!(gate.release_if_stalled(&mut stuck, Nanos::from_millis(100)));
    assert!(stuck.is_stalled());
    assert_eq!(gate.bulk_in_flight(), 0);
    assert!(gate.may_grant());
    assert_eq!(gate.admits(&other, 4096, at(100)), Admit::Now);
    assert_eq!(gate.admits(&stuck, 4096, at(100)), Admit::AfterCompletion);
    assert!(!gate.unhindered(&stuck, Opcode::Write, 4096, true, at(100)));
    // Released once only.
    assert!(!gate.release_if_stalled(&mut stuck, Nanos::from_millis(500)));
    gate.sent(&mut other, 7, 4096, at(100));
    gate.sent(&mut other, 8, 4096, at(100));
    assert_eq!(gate.bulk_in_flight(), 8192);
    // The stuck pieces fail: nothing is taken off the budget twice.
    assert_eq!(
        gate.completed(&mut stuck, 1, at(600), Nanos::ZERO),
        Some(4096)
    );
    assert!(stuck.is_stalled(), "one of its pieces is still out");
    assert_eq!(
        gate.completed(&mut stuck, 2, at(600), Nanos::ZERO),
        Some(4096)
    );
    assert!(!stuck.is_stalled());
    assert_eq!(gate.bulk_in_flight(), 8192);
    assert_eq!(
        gate.completed(&mut other, 7, at(601), Nanos::ZERO),
        Some(4096)
    );
    assert_eq!(gate.bulk_in_flight(), 4096);
    // Usable again, and counted again.
    assert_eq!(gate.admits(&stuck, 4096, at(601)), Admit::Now);
    gate.sent(&mut stuck, 3, 4096, at(601));
    assert_eq!(gate.bulk_in_flight(), 8192);
    // A latency lane is never taken for stuck: it holds no budget.
    let mut latency: Lane<()> = Lane::new(TrafficClass::Latency, 8, None);
    gate.sent(&mut latency, 9, 16, at(0));
    assert!(!gate.release_if_stalled(&mut latency, Nanos::from_secs(10)));
    // A stalled lane that goes away gives back only what it still holds.
    assert!(gate.release_if_stalled(&mut stuck, Nanos::from_secs(10)));
    gate.forget(&stuck);
    assert_eq!(gate.bulk_in_flight(), 4096, "the other lane's piece 8");
}

#[test]
fn a_piece_larger_than_the_budget_goes_alone() {
    let mut gate = Gate::new(1 << 20, 4096);
    let mut lane: Lane<()> = Lane::new(TrafficClass::Bulk, 8, None);
    let now = || Nanos(0);
    assert_eq!(gate.admits(&lane, 1 << 20, now), Admit::Now);
    gate.sent(&mut lane, 0, 1 << 20, now);
    assert_eq!(gate.admits(&lane, 1, now), Admit::AfterCompletion);
    assert!(!gate.may_grant());
    assert_eq!(
        gate.completed(&mut lane, 0, now, Nanos::ZERO),
        Some(1 << 20)
    );
    assert_eq!(gate.bulk_in_flight(), 0);
    assert!(gate.may_grant());
}

/// A window of `0` bytes that never grows, and that holds back until a
/// completion whatever does not fit (even with nothing in flight).
#[derive(Debug)]
struct Strict(u64);

impl crate::Window for Strict {
    fn admit(&self, in_flight: u64, bytes: u64, _now: Nanos) -> Admit {
        Admit::now_if(in_flight + bytes <= self.0)
    }
    fn on_sent(&mut self, _bytes: u64, _now: Nanos) {}
    fn on_completed(&mut self, _bytes: u64, _sent_at: Nanos, _now: Nanos) {}
    fn window(&self) -> u64 {
        self.0
    }
}

#[test]
fn a_piece_larger_than_its_window_goes_alone_but_not_beside_another() {
    // An 8 KiB piece (a request sent whole) cannot fit a 4 KiB window,
    // and with nothing in flight no completion would ever make room:
    // alone, it goes; beside another piece, even a zero-length one, it
    // waits for that one's completion.
    let mut gate = Gate::new(1 << 20, 1 << 20);
    let mut lane: Lane<()> = Lane::new(TrafficClass::Bulk, 8, Some(Box::new(Strict(4096))));
    let now = || Nanos(0);
    gate.sent(&mut lane, 0, 1024, now);
    assert_eq!(gate.admits(&lane, 8192, now), Admit::AfterCompletion);
    assert_eq!(gate.completed(&mut lane, 0, now, Nanos::ZERO), Some(1024));
    assert_eq!(gate.admits(&lane, 8192, now), Admit::Now);
    gate.sent(&mut lane, 1, 0, now);
    assert_eq!(gate.admits(&lane, 8192, now), Admit::AfterCompletion);
}

#[test]
fn latency_pieces_take_slots_but_no_budget() {
    let mut gate = Gate::new(4096, 4096);
    let mut bulk: Lane<()> = Lane::new(TrafficClass::Bulk, 8, None);
    let mut lat: Lane<()> = Lane::new(TrafficClass::Latency, 2, None);
    let now = || Nanos(0);
    gate.sent(&mut bulk, 0, 4096, now);
    assert!(!gate.unhindered(&bulk, Opcode::Write, 4096, true, now));
    assert!(gate.unhindered(&lat, Opcode::Send, 64, true, now));
    gate.sent(&mut lat, 1, 64, now);
    gate.sent(&mut lat, 2, 64, now);
    assert_eq!(gate.bulk_in_flight(), 4096);
    // Two slots: the third waits for a completion.
    assert_eq!(gate.admits(&lat, 64, now), Admit::AfterCompletion);
    assert_eq!(gate.completed(&mut lat, 2, now, Nanos::ZERO), Some(64));
    assert_eq!(gate.admits(&lat, 64, now), Admit::Now);
}

#[test]
fn a_queued_latency_descriptor_keeps_others_off_the_fast_path_until_granted() {
    let mut gate = Gate::new(4096, 1 << 20);
    let lat: Lane<()> = Lane::new(TrafficClass::Latency, 8, None);
    let now = || Nanos(0);
    gate.enqueued(TrafficClass::Latency);
    assert!(!gate.unhindered(&lat, Opcode::Send, 64, false, now));
    // Its first piece out is not its last: still queued.
    gate.granted(&grant(TrafficClass::Latency, 64, false));
    assert_eq!(gate.latency_queued(), 1);
    gate.granted(&grant(TrafficClass::Latency, 64, true));
    assert!(gate.unhindered(&lat, Opcode::Send, 64, false, now));
}

#[test]
fn splittable_requests_longer_than_a_piece_take_the_scheduler() {
    let gate = Gate::new(4096, 1 << 20);
    let lane: Lane<()> = Lane::new(TrafficClass::Bulk, 8, None);
    let now = || Nanos(0);
    assert!(!gate.unhindered(&lane, Opcode::Write, 4097, true, now));
    assert!(!gate.unhindered(&lane, Opcode::Read, 4097, true, now));
    assert!(gate.unhindered(&lane, Opcode::Send, 4097, true, now));
    // Bulk waits behind anything queued.
    assert!(!gate.unhindered(&lane, Opcode::Write, 64, false, now));
}

#[test]
fn a_window_bounds_a_lane_and_out_of_turn_completions_are_found() {
    let mut gate = Gate::new(4096, u64::MAX);
    let window = DelayWindow::new(DelayWindowConfig::for_piece(4096)).unwrap();
    let first = window.window();
    let mut lane: Lane<()> = Lane::new(TrafficClass::Bulk, 1024, Some(Box::new(window)));
    let mut t = 0;
    let mut tag = 0;
    while gate.admits(&lane, 4096, || Nanos(t)) == Admit::Now {
        gate.sent(&mut lane, tag, 4096, || Nanos(t));
        tag += 1;
        t += 1;
        assert!(tag < 1024, "the window bounds the lane");
    }
    assert!(lane.bytes_out() >= first.min(4096));
    // A piece that completes out of turn is found, and counted once.
    let last = tag - 1;
    assert_eq!(
        gate.completed(&mut lane, last, || Nanos(t), Nanos::ZERO),
        Some(4096)
    );
    assert_eq!(
        gate.completed(&mut lane, last, || Nanos(t), Nanos::ZERO),
        None
    );
    gate.forget(&lane);
    assert_eq!(gate.bulk_in_flight(), 0);
}
