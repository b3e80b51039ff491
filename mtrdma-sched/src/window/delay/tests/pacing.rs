//! A window under one piece: what it keeps, how it paces its pieces, and
//! its quiet periods.

use super::*;

/// Asserts that `per_rtt` pieces per round trip are within `tolerance`
/// (a share) of `want`, for the case `what`.
fn assert_per_rtt(per_rtt: f64, want: f64, tolerance: f64, what: &str) {
    assert!(
        (per_rtt / want - 1.0).abs() < tolerance,
        "{what}: {per_rtt} pieces per round trip, want {want}"
    );
}

#[test]
fn keeps_at_least_the_minimum_and_sends_its_fraction_of_a_piece() {
    for (weight, floor) in [(1u32, PIECE / 64), (4, PIECE / 16)] {
        let mut w = window_with(DelayWindowConfig {
            min_window: PIECE / 64,
            weight,
            base_period: Nanos::from_secs(1_000),
            ..config()
        });
        let mut now = from_zero(&mut w, 1);
        for _ in 0..100 {
            run(&mut w, &mut now, Nanos::from_millis(10), 1);
        }
        // A sender of weight w keeps w times the minimum.
        assert_eq!(w.window(), floor);
        // One piece in flight: the next waits for its completion.
        assert_eq!(w.admit(PIECE, PIECE, now), Admit::AfterCompletion);
        // Nothing in flight and a round trip that rounds down: not
        // before the next one that rounds up.
        let mut waited = false;
        for _ in 0..64 {
            if let Admit::At(at) = w.admit(0, PIECE, now) {
                assert!(at > now);
                assert_eq!(w.admit(0, PIECE, at), Admit::Now);
                waited = true;
                break;
            }
            now = now + w.smoothed_delay().unwrap();
        }
        assert!(waited, "a window under one piece waits between pieces");
        // Pieces still taking 10 ms: the window stays at its floor and
        // moves floor/piece of a piece per round trip.
        let srtt = w.smoothed_delay().unwrap();
        let per_rtt = pieces_per_round_trip(&mut w, &mut now, srtt, 4096);
        let want = floor as f64 / PIECE as f64;
        assert_per_rtt(per_rtt, want, 0.1, &format!("weight {weight}"));
    }
}

/// A window of 0.6 pieces, pieces whose time varies from one to three
/// round trips: a piece that could not go when it was due (the one
/// before had not completed) goes as soon as it can, and the next is
/// still due on time, so the sender moves its window's worth per
/// (average) round trip.
#[test]
fn a_window_under_a_piece_moves_its_share_when_round_trips_vary() {
    // Held at 0.6 pieces: it may grow no further.
    let mut w = window_with(DelayWindowConfig {
        initial_window: 6 * PIECE / 10,
        min_window: 1,
        max_window: 6 * PIECE / 10,
        target_ratio_ppm: 10_000_000,
        ..config()
    });
    let mut now = Nanos::ZERO;
    let rtt = Nanos::from_millis(1);
    let per_rtt = pieces_per_round_trip_spread(&mut w, &mut now, rtt, 2000, 200);
    // Pieces take 2 round trips on average: 0.6 / 2 pieces per `rtt`.
    let want = 0.6 / 2.0;
    assert_per_rtt(per_rtt, want, 0.05, "round trips that vary");
}

#[test]
fn a_window_that_ends_inside_a_piece_moves_that_fraction_per_round_trip() {
    // A window of 2.5 pieces, pieces that take 1 ms: 2.5 pieces per
    // millisecond, not 2 and not 3.
    for (window, want) in [
        (5 * PIECE / 2, 2.5),
        (PIECE / 3, 1.0 / 3.0),
        (21 * PIECE / 4, 5.25),
    ] {
        let mut w = window_with(DelayWindowConfig {
            initial_window: window,
            min_window: 1,
            additive_increase: 1,
            // Every piece is under the target: the window does not
            // shrink, and grows by a byte per piece.
            target_ratio_ppm: 10_000_000,
            ..config()
        });
        let mut now = Nanos::ZERO;
        let per_rtt = pieces_per_round_trip(&mut w, &mut now, Nanos::from_millis(1), 400);
        // The window grew by a byte or a few per piece on the way.
        let want = want * (window + w.window()) as f64 / (2 * window) as f64;
        assert_per_rtt(per_rtt, want, 0.05, &format!("window {window}"));
    }
}

#[test]
fn posts_nothing_for_twice_the_target_at_the_start_of_every_period() {
    let mut w = window_with(DelayWindowConfig {
        target_floor: Nanos::ZERO,
        ..DelayWindowConfig::for_piece(PIECE)
    });
    from_zero(&mut w, 24);
    // Target 200 us: quiet for the first 400 us of every 500 ms, on
    // the clock every sender shares, whatever is in flight; then each
    // sender starts again at a point of its own within one round trip
    // (100 us), which differs between senders and between periods.
    let period = Nanos::from_millis(500);
    let mut turns = Vec::new();
    for seed in 0..8 {
        let mut w = w.clone();
        w.config.seed = seed;
        for k in 1..4 {
            let start = Nanos(period.0 * k);
            let end = start + Nanos::from_micros(400);
            let Admit::At(resume) = w.admit(0, PIECE, start) else {
                panic!("no quiet time at {start}");
            };
            assert!(resume >= end && resume < end + Nanos::from_micros(100));
            assert_eq!(w.admit(PIECE, PIECE, resume - Nanos(1)), Admit::At(resume));
            assert_eq!(w.admit(0, PIECE, resume), Admit::Now);
            assert_eq!(w.admit(0, PIECE, start - Nanos(1)), Admit::Now);
            turns.push(resume - start);
        }
    }
    turns.sort();
    turns.dedup();
    assert!(turns.len() >= 20, "senders start again apart: {turns:?}");
    // Before the path's delay is known there is no target, so no quiet.
    assert_eq!(window().admit(0, PIECE, period), Admit::Now);
}

/// A piece sent at `now` whose completion is found `after` it, `host` of
/// that spent waiting for a CPU.
fn found_late(w: &mut DelayWindow, now: Nanos, after: Nanos, host: Nanos) {
    w.on_sent(PIECE, now);
    w.on_completed_late(PIECE, now, now + after, host);
}

#[test]
fn a_completion_found_late_by_the_host_is_judged_on_the_nics_time() {
    let mut w = window();
    let mut now = from_zero(&mut w, 24);
    assert_eq!(w.target_delay(), Some(Nanos::from_micros(200)));
    // Every piece is found 1 ms after it was posted, 900 us of which
    // its thread waited for a CPU: 100 us at the NIC, the window grows.
    let mut late = w.clone();
    let before = w.window();
    for _ in 0..16 {
        found_late(
            &mut late,
            now,
            Nanos::from_millis(1),
            Nanos::from_micros(900),
        );
        w.on_sent(PIECE, now);
        w.on_completed(PIECE, now, now + Nanos::from_millis(1));
        now = now + Nanos::from_millis(1);
    }
    assert!(late.window() > before, "{} <= {before}", late.window());
    assert!(
        w.window() < before,
        "without the host's delay taken off it shrinks"
    );
    // More taken off than the whole sample: judged at the path's own
    // delay, which the host's delay never lowers.
    found_late(
        &mut late,
        now,
        Nanos::from_micros(150),
        Nanos::from_millis(5),
    );
    assert_eq!(late.base_delay(), Some(Nanos::from_micros(100)));
}

#[test]
fn a_sender_that_learnt_a_long_delay_still_posts_in_every_period() {
    // Its first pieces waited 300 ms behind a queue that drained: its
    // target (600 ms) and its round trip are longer than the quiet
    // times' period (500 ms), and its window is at its floor.
    let mut w = window_with(DelayWindowConfig {
        target_floor: Nanos::ZERO,
        ..DelayWindowConfig::for_piece(PIECE)
    });
    let mut now = Nanos::ZERO;
    run(&mut w, &mut now, Nanos::from_millis(300), 8);
    assert!(w.target_delay().unwrap() > Nanos::from_millis(500));
    let period = Nanos::from_millis(500);
    for k in 4..40 {
        let start = Nanos(period.0 * k);
        // Quiet for at most half of the period, then it may post.
        let resume = match w.admit(0, PIECE, start) {
            Admit::At(at) => at,
            other => panic!("no quiet time at {start}: {other:?}"),
        };
        assert!(
            resume - start <= Nanos(period.0 / 2),
            "quiet until {resume} from {start}"
        );
        assert_eq!(w.admit(0, PIECE, resume), Admit::Now);
    }
}

#[test]
fn by_default_keeps_a_quarter_piece_and_a_target_of_at_least_the_floor() {
    let mut w = window_with(DelayWindowConfig {
        quiet_every: Nanos::ZERO,
        base_period: Nanos::from_secs(1_000),
        ..DelayWindowConfig::for_piece(PIECE)
    });
    let mut now = from_zero(&mut w, 1);
    // 100 us of path: the target's queue is the floor, not 100 us.
    assert_eq!(w.target_delay(), Some(Nanos::from_micros(900)));
    // 850 us is under the target: the window grows.
    let before = w.window();
    run(&mut w, &mut now, Nanos::from_micros(850), 1);
    assert!(w.window() > before);
    // However long the pieces take, a sender keeps a quarter of a
    // piece: one piece every four round trips.
    run(&mut w, &mut now, Nanos::from_millis(10), 100);
    assert_eq!(w.window(), PIECE / 4);
    let srtt = w.smoothed_delay().unwrap();
    let per_rtt = pieces_per_round_trip(&mut w, &mut now, srtt, 400);
    assert!(
        (per_rtt - 0.25).abs() < 0.02,
        "{per_rtt} pieces per round trip"
    );
}

#[test]
fn one_large_piece_does_not_make_the_window_deaf_to_the_usual_ones() {
    // A request sent whole of 4 pieces, then pieces of the usual size
    // that meet a standing queue (2 ms each): their samples count
    // again once the large piece is out of memory, and the window
    // shrinks.
    let mut w = window();
    let mut now = from_zero(&mut w, 20);
    let before = w.window();
    w.on_sent(4 * PIECE, now);
    w.on_completed(4 * PIECE, now, now + Nanos::from_micros(100));
    now = now + Nanos::from_micros(100);
    run(
        &mut w,
        &mut now,
        Nanos::from_millis(2),
        2 * PIECE_MEMORY as usize + 8,
    );
    assert!(
        w.window() < before / 2,
        "the usual pieces' delays are heard: {before} -> {}",
        w.window()
    );
}

#[test]
fn a_piece_larger_than_the_window_goes_alone_whenever_the_sender_polls() {
    // A window a few bytes over 4 pieces, and a request sent whole of
    // 4.5 pieces: with nothing in flight it goes at once, at any time
    // (not only in the round trips that round the window up, which a
    // late sender would miss); beside a piece in flight it waits.
    let mut w = window_with(DelayWindowConfig {
        initial_window: 4 * PIECE,
        additive_increase: 1,
        quiet_every: Nanos::ZERO,
        ..config()
    });
    let now = from_zero(&mut w, 1);
    let big = 4 * PIECE + PIECE / 2;
    assert!(w.window() > 4 * PIECE && w.window() < big);
    for late in 0..50 {
        let at = now + Nanos::from_micros(37 * late);
        assert_eq!(w.admit(0, big, at), Admit::Now, "{late}");
    }
    assert_ne!(w.admit(PIECE, big, now), Admit::Now);
}
