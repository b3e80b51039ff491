//! Tests of `delay`.

use super::*;

const PIECE: u64 = 4096;

/// The defaults without the target's floor and without quiet times:
/// the target is twice the path's own delay, which keeps the arithmetic
/// below readable.
fn config() -> DelayWindowConfig {
    DelayWindowConfig {
        target_floor: Nanos::ZERO,
        quiet_every: Nanos::ZERO,
        ..DelayWindowConfig::for_piece(PIECE)
    }
}

fn window() -> DelayWindow {
    window_with(config())
}

/// The window of [`config`] that judges each piece on the lowest delay
/// of the last `filter`.
fn filtered(filter: u32) -> DelayWindow {
    window_with(DelayWindowConfig { filter, ..config() })
}

/// A window of `config`, which must be valid.
fn window_with(config: DelayWindowConfig) -> DelayWindow {
    DelayWindow::new(config).unwrap()
}

/// Sends one piece at a time, each taking `delay`, `n` times.
fn run(w: &mut DelayWindow, now: &mut Nanos, delay: Nanos, n: usize) {
    for _ in 0..n {
        w.on_sent(PIECE, *now);
        w.on_completed(PIECE, *now, *now + delay);
        *now = *now + delay;
    }
}

/// Sends `n` pieces one at a time from time 0, each taking 100 us (the
/// path's own delay); returns the time after the last.
fn from_zero(w: &mut DelayWindow, n: usize) -> Nanos {
    let mut now = Nanos::ZERO;
    run(w, &mut now, Nanos::from_micros(100), n);
    now
}

/// Completes pieces of `bytes` adding up to `total`, each `delay` long.
fn complete(w: &mut DelayWindow, now: &mut Nanos, bytes: u64, total: u64, delay: Nanos) {
    for _ in 0..total / bytes {
        w.on_sent(bytes, *now);
        w.on_completed(bytes, *now, *now + delay);
        *now = *now + Nanos(1);
    }
}

#[test]
fn a_known_link_rate_sets_the_queue_allowance_in_bytes() {
    let mut w = DelayWindow::new(DelayWindowConfig::for_piece(PIECE)).unwrap();
    from_zero(&mut w, 1);
    // No rate known: the floor (800 us) over the path's 100 us.
    assert_eq!(w.target_delay(), Some(Nanos::from_micros(900)));
    // 10 KiB at 25 MB/s take 409.6 us; at 6.25 MB/s 1638.4 us.
    w.set_link_rate(Some(25_000_000));
    assert_eq!(w.target_delay(), Some(Nanos(100_000 + 409_600)));
    w.set_link_rate(Some(6_250_000));
    assert_eq!(w.target_delay(), Some(Nanos(100_000 + 1_638_400)));
    // The share of the path's delay still applies when it is longer.
    w.set_link_rate(Some(1 << 40));
    assert_eq!(w.target_delay(), Some(Nanos::from_micros(200)));
    // A rate measured near idle does not let the queue stand for long.
    w.set_link_rate(Some(1));
    assert_eq!(w.target_delay(), Some(Nanos(100_000) + MAX_ALLOWANCE));
    // Forgotten: the floor again.
    w.set_link_rate(None);
    assert_eq!(w.target_delay(), Some(Nanos::from_micros(900)));
    w.set_link_rate(Some(0));
    assert_eq!(w.target_delay(), Some(Nanos::from_micros(900)));
}

/// After a completion, a sender sharing a link whose pieces take 500
/// us or more on the wire, with another piece of its own still on the
/// wire, waits a time of its own, under 3 pieces' time, before it
/// posts again; on a faster link, with no rate known, alone, or with
/// nothing else on the wire, it posts at once.
#[test]
fn waits_a_time_of_its_own_after_a_completion_only_where_pieces_are_long_on_the_wire() {
    // (rate in bytes per second, the weights sharing the port, pieces
    // still out after the completion, whether it waits): a 4 KiB piece
    // takes 819 us at 5 MB/s, 41 us at 100 MB/s.
    for (rate, sharing, still_out, waits) in [
        (Some(5_000_000u64), 3, 1, true),
        (Some(5_000_000), 3, 0, false),
        (Some(5_000_000), 1, 1, false),
        (Some(100_000_000), 3, 1, false),
        (None, 3, 1, false),
    ] {
        let at = format!("{rate:?}, sharing {sharing}, {still_out} still out");
        let mut w = window_with(DelayWindowConfig {
            initial_window: 4 * PIECE,
            additive_increase: 1,
            ..config()
        });
        w.set_link_rate(rate);
        w.set_sharing_weight(sharing);
        let mut now = Nanos::from_secs(10);
        let mut waited = Vec::new();
        for _ in 0..64 {
            // Between quiet times (every 500 ms).
            if now.0 % 500_000_000 < 10_000_000 {
                now = now + Nanos::from_millis(10);
            }
            let sent = now;
            for _ in 0..=still_out {
                w.on_sent(PIECE, sent);
            }
            now = now + Nanos::from_micros(200);
            w.on_completed(PIECE, sent, now);
            match w.admit(still_out * PIECE, PIECE, now) {
                Admit::Now => waited.push(0),
                Admit::At(t) => waited.push((t - now).0),
                Admit::AfterCompletion => panic!("{at}: the window has room"),
            }
            for _ in 0..still_out {
                w.on_completed(PIECE, sent, now);
            }
            now = now + Nanos::from_millis(3);
        }
        let wire = PIECE * 1_000_000_000 / rate.unwrap_or(1 << 40);
        let longest = waited.iter().copied().max().unwrap();
        if waits {
            assert!(longest < 3 * wire, "{at}: waited {longest} ns");
            assert!(longest > wire, "{at}: waited at most {longest} ns");
            let distinct: std::collections::HashSet<_> = waited.iter().collect();
            assert!(distinct.len() > 32, "{at}: waits {waited:?}");
        } else {
            assert_eq!(longest, 0, "{at}: waited {longest} ns");
        }
    }
}

#[test]
fn a_faster_link_keeps_the_same_bytes_queued() {
    // Pieces that take `delay` while the queue ahead of them is
    // `queue` long: the window shrinks once the queue passes the
    // allowance, which is shorter on the faster link.
    let shrinks = |rate: u64, queue_us: u64| {
        let mut w = window_with(DelayWindowConfig {
            quiet_every: Nanos::ZERO,
            ..DelayWindowConfig::for_piece(PIECE)
        });
        w.set_link_rate(Some(rate));
        let mut now = from_zero(&mut w, 20);
        let before = w.window();
        run(&mut w, &mut now, Nanos::from_micros(100 + queue_us), 20);
        w.window() < before
    };
    // 600 us of queue: 15 KB at 25 MB/s (over 10 KiB), 3.75 KB at
    // 6.25 MB/s (under).
    assert!(shrinks(25_000_000, 600));
    assert!(!shrinks(6_250_000, 600));
}

#[test]
fn a_new_weight_applies_from_the_next_completion_and_a_bad_one_is_refused() {
    let mut w = window();
    w.set_weight(4).unwrap();
    w.on_sent(PIECE, Nanos::ZERO);
    w.on_completed(PIECE, Nanos::ZERO, Nanos::from_micros(100));
    // A window of one piece grows by 4 x 1/8 piece for a window's worth.
    assert_eq!(w.window(), PIECE + 4 * PIECE / 8);
    assert!(w.set_weight(0).is_err());
    assert!(w.set_weight(MAX_WEIGHT + 1).is_err());
    assert_eq!(w.config().weight, 4);
}

#[test]
fn grows_by_the_increase_times_the_weight_per_window_of_bytes() {
    for weight in [1u32, 4] {
        let mut w = window_with(DelayWindowConfig { weight, ..config() });
        let mut now = Nanos::ZERO;
        // One piece completed, as large as the window: a whole round
        // trip's worth of bytes under the target.
        run(&mut w, &mut now, Nanos::from_micros(100), 1);
        assert_eq!(w.window(), PIECE + u64::from(weight) * PIECE / 8);
        assert_eq!(w.base_delay(), Some(Nanos::from_micros(100)));
        assert_eq!(w.target_delay(), Some(Nanos::from_micros(200)));
    }
    // A window of four pieces grows by about an eighth of a piece per
    // four pieces completed, not per piece.
    let mut w = window_with(DelayWindowConfig {
        initial_window: 4 * PIECE,
        ..config()
    });
    from_zero(&mut w, 4);
    let grown = w.window() - 4 * PIECE;
    assert!((PIECE / 8 - 8..=PIECE / 8).contains(&grown), "grew {grown}");
}

#[test]
fn shrinks_in_proportion_to_the_excess_and_at_most_by_half_per_window() {
    let mut w = filtered(2);
    let mut now = from_zero(&mut w, 1);
    let before = w.window();
    // 250 us against a 200 us target, the filter's two samples both
    // late: a whole window's cut is 0.8 x 50/250 = 16%; a piece of
    // `PIECE` bytes applies PIECE/before of it.
    let late = |w: &mut DelayWindow, now: &mut Nanos, delay: u64| {
        w.on_sent(PIECE, *now);
        w.on_completed(PIECE, *now, *now + Nanos::from_micros(delay));
        *now = *now + Nanos::from_micros(delay);
    };
    late(&mut w, &mut now, 250);
    assert_eq!(
        w.window(),
        before + (PIECE / 8) * PIECE / before,
        "one late piece after a fast one is filtered out: the window grows"
    );
    let before = w.window();
    late(&mut w, &mut now, 250);
    // 16% of a window per window of bytes: 16% of a piece per piece.
    assert_eq!(w.window(), before - PIECE * 16 / 100);
    // A huge excess takes at most half a window per window of bytes.
    let mut w = filtered(1);
    let mut now = from_zero(&mut w, 1);
    let before = w.window();
    complete(&mut w, &mut now, before, before, Nanos::from_millis(50));
    assert_eq!(w.window(), before / 2);
}

#[test]
fn judges_each_piece_on_the_lowest_of_the_last_few() {
    let mut w = filtered(2);
    let mut now = from_zero(&mut w, 50);
    // One slow piece (a descheduled thread) after a fast one: the
    // lowest of the last two is under the target, the window grows.
    let before = w.window();
    run(&mut w, &mut now, Nanos::from_micros(900), 1);
    assert!(w.window() > before, "one late piece is not a queue");
    // A second one: both are late, the window shrinks.
    let before = w.window();
    run(&mut w, &mut now, Nanos::from_micros(900), 1);
    assert!(w.window() < before, "two late pieces are");
    // With a filter of one (the default), the first late piece is
    // enough.
    let mut w = window();
    let mut now = from_zero(&mut w, 50);
    let before = w.window();
    run(&mut w, &mut now, Nanos::from_micros(900), 1);
    assert!(w.window() < before);
}

#[test]
fn many_small_pieces_and_few_large_ones_count_the_same() {
    // Two senders see the same delays for the same bytes, one in whole
    // pieces and one in quarter pieces: their windows move alike, so a
    // sender that completes more pieces per round trip (a free one next
    // to a capped one) is not favoured.
    let mut whole = window_with(DelayWindowConfig {
        initial_window: 8 * PIECE,
        ..config()
    });
    let mut quarters = whole.clone();
    let (mut a, mut b) = (Nanos::ZERO, Nanos::ZERO);
    for round in 0..200 {
        let delay = Nanos::from_micros(if round % 3 == 0 { 400 } else { 150 });
        // A round trip's worth in whole pieces, the same bytes for both.
        let total = (whole.window() / PIECE).max(1) * PIECE;
        complete(&mut whole, &mut a, PIECE, total, delay);
        complete(&mut quarters, &mut b, PIECE / 4, total, delay);
    }
    let (x, y) = (whole.window() as f64, quarters.window() as f64);
    assert!((x / y - 1.0).abs() < 0.05, "{x} vs {y}");
}

#[test]
fn windows_settle_in_proportion_to_their_weights() {
    // Two senders on one queue: the delay is over the target whenever
    // their windows add up to more than the port holds at the target.
    let mut light = window();
    let mut heavy = window_with(DelayWindowConfig {
        weight: 3,
        ..config()
    });
    let (mut a, mut b) = (Nanos::ZERO, Nanos::ZERO);
    let capacity = 24 * PIECE;
    let mut ratios = Vec::new();
    for round in 0..4_000 {
        let over = light.window() + heavy.window() > capacity;
        let delay = Nanos::from_micros(if over { 300 } else { 100 });
        let (l, h) = (light.window(), heavy.window());
        complete(&mut light, &mut a, PIECE / 4, l.max(PIECE / 4), delay);
        complete(&mut heavy, &mut b, PIECE / 4, h.max(PIECE / 4), delay);
        if round >= 2_000 {
            ratios.push(heavy.window() as f64 / light.window() as f64);
        }
    }
    let mean = ratios.iter().sum::<f64>() / ratios.len() as f64;
    assert!((mean / 3.0 - 1.0).abs() < 0.05, "heavy / light = {mean}");
}

/// Keeps posting pieces as `w` admits them, each completing `rtt`
/// after its post, for `rounds` round trips starting at `now`; returns
/// the pieces posted per round trip.
/// Each piece takes `rtt` and up to a tenth more (as real completions
/// do), so that nothing locks to the round trips' phase.
fn pieces_per_round_trip(w: &mut DelayWindow, now: &mut Nanos, rtt: Nanos, rounds: u64) -> f64 {
    pieces_per_round_trip_spread(w, now, rtt, rounds, 10)
}

/// As [`pieces_per_round_trip`], each piece taking `rtt` and up to
/// `spread` percent more.
fn pieces_per_round_trip_spread(
    w: &mut DelayWindow,
    now: &mut Nanos,
    rtt: Nanos,
    rounds: u64,
    spread: u64,
) -> f64 {
    // (posted, completes)
    let mut in_nic: Vec<(Nanos, Nanos)> = Vec::new();
    let mut sent = 0u64;
    let step = Nanos(rtt.0 / 100);
    let end = *now + Nanos(rtt.0 * rounds);
    while *now < end {
        while let Some(pos) = in_nic.iter().position(|&(_, done)| done <= *now) {
            let (posted, _) = in_nic.remove(pos);
            w.on_completed(PIECE, posted, *now);
        }
        while w.admit(in_nic.len() as u64 * PIECE, PIECE, *now) == Admit::Now {
            w.on_sent(PIECE, *now);
            let extra = splitmix64(sent) % (rtt.0 * spread / 100).max(1);
            in_nic.push((*now, *now + rtt + Nanos(extra)));
            sent += 1;
        }
        *now = *now + step;
    }
    sent as f64 / rounds as f64
}

#[test]
fn a_gain_scales_the_growth_and_lowers_the_floor_as_a_weight_does() {
    let one = crate::share::GAIN_ONE;
    for (gain, growth, floor) in [
        (one, PIECE / 8, PIECE / 4),
        (2 * one, PIECE / 4, PIECE / 4),
        (one / 2, PIECE / 16, PIECE / 8),
    ] {
        let mut w = window();
        w.set_gain(gain);
        assert_eq!(w.gain(), gain);
        let mut now = Nanos::ZERO;
        // One piece as large as the window: a round trip's worth of
        // bytes under the target.
        run(&mut w, &mut now, Nanos::from_micros(100), 1);
        assert_eq!(w.window(), PIECE + growth, "gain {gain}");
        // Far over the target for long: down to the floor.
        for _ in 0..200 {
            run(&mut w, &mut now, Nanos::from_millis(2), 1);
        }
        assert_eq!(w.window(), floor, "gain {gain}");
    }
    // 0 counts as the least gain, never as a window of 0.
    let mut w = window();
    w.set_gain(0);
    assert_eq!(w.gain(), 1);
}

/// The port's windows share their growth: a window told that weights
/// adding up to 4 share its port (its own weight 2 among them) grows by
/// 2/4 of an increase; its cuts and floor are its own.
#[test]
fn the_weights_sharing_the_port_divide_the_growth() {
    // Growth: increase (512 B) x weight / sharing.
    for (sharing, weight, growth) in [(0, 1, 512), (1, 1, 512), (4, 2, 256), (8, 1, 64)] {
        let mut w = window_with(DelayWindowConfig { weight, ..config() });
        w.set_sharing_weight(sharing);
        assert_eq!(w.sharing_weight(), sharing.max(1));
        let mut now = from_zero(&mut w, 1);
        assert_eq!(
            w.window(),
            PIECE + growth,
            "sharing {sharing}, weight {weight}"
        );
        for _ in 0..200 {
            run(&mut w, &mut now, Nanos::from_millis(2), 1);
        }
        assert_eq!(
            w.window(),
            PIECE / 4 * u64::from(weight),
            "the floor is its own"
        );
    }
}

#[test]
fn the_piece_floor_holds_one_piece_whatever_the_delay_and_the_gain() {
    let mut w = window();
    w.set_gain(250_000);
    let mut now = Nanos::ZERO;
    // A standing queue: every piece takes ten times the path's delay.
    let run = |w: &mut DelayWindow, now: &mut Nanos, n: u32| {
        for i in 0..n {
            let delay = if i == 0 { 100 } else { 1_000 };
            w.on_sent(PIECE, *now);
            w.on_completed(PIECE, *now, *now + Nanos::from_micros(delay));
            *now = *now + Nanos::from_micros(delay);
        }
    };
    run(&mut w, &mut now, 200);
    assert!(
        w.window() < PIECE / 4,
        "gain 1/4 lowers the floor: {}",
        w.window()
    );
    w.signals(&Signals {
        piece_floor: Some(true),
        ..Signals::default()
    });
    assert!(w.piece_floor());
    assert_eq!(w.window(), PIECE, "raised to one piece at once");
    run(&mut w, &mut now, 200);
    assert_eq!(w.window(), PIECE, "held there by the floor");
    assert_eq!(
        w.admit(0, PIECE, now),
        Admit::Now,
        "no pacing under a piece"
    );
    w.signals(&Signals {
        piece_floor: Some(false),
        ..Signals::default()
    });
    run(&mut w, &mut now, 200);
    let after = w.window();
    assert!(after < PIECE / 4, "taken back, it shrinks: {after}");
}

#[test]
fn admits_while_the_window_has_room() {
    let mut w = window_with(DelayWindowConfig {
        initial_window: 4 * PIECE,
        additive_increase: 1,
        ..config()
    });
    let now = from_zero(&mut w, 1);
    let win = w.window();
    assert!(win > 4 * PIECE && win < 4 * PIECE + 8);
    assert_eq!(w.admit(0, PIECE, now), Admit::Now);
    assert_eq!(w.admit(3 * PIECE, PIECE, now), Admit::Now);
    // A fifth piece: the window ends a few bytes into it, so it goes
    // only in the few round trips that round the window up.
    w.on_sent(PIECE, now);
    assert!(matches!(w.admit(4 * PIECE, PIECE, now), Admit::At(_)));
    // A sixth never fits: only a completion makes room.
    assert_eq!(w.admit(5 * PIECE, PIECE, now), Admit::AfterCompletion);
}

#[test]
fn ignores_short_pieces_and_relearns_the_base_each_period() {
    let mut w = window();
    let mut now = Nanos::ZERO;
    run(&mut w, &mut now, Nanos::from_micros(300), 5);
    // A 16 B piece's fast completion says nothing of the queue.
    w.on_completed(16, now, now + Nanos::from_micros(10));
    assert_eq!(w.base_delay(), Some(Nanos::from_micros(300)));
    // A longer path (say, rerouted) is learnt within two periods.
    run(&mut w, &mut now, Nanos::from_micros(500), 200_000);
    assert_eq!(w.base_delay(), Some(Nanos::from_micros(500)));
}

#[test]
fn tells_the_bytes_it_judged_and_those_over_its_target() {
    let mut w = window();
    let mut now = Nanos::ZERO;
    // Path 100 us, target 200 us: ten pieces on time.
    run(&mut w, &mut now, Nanos::from_micros(100), 10);
    let v = w.take_verdicts();
    assert_eq!(v.judged, 10 * PIECE);
    assert_eq!(v.over_target, 0);
    assert_eq!(w.take_verdicts(), Verdicts::default(), "taken once");
    // A queue: four pieces at 500 us, one short piece (not judged).
    run(&mut w, &mut now, Nanos::from_micros(500), 4);
    w.on_completed(16, now, now + Nanos::from_millis(5));
    let v = w.take_verdicts();
    assert_eq!((v.judged, v.over_target), (4 * PIECE, 4 * PIECE));
}

#[test]
fn refuses_settings_out_of_range() {
    let ok = DelayWindowConfig::for_piece(PIECE);
    assert!(ok.validate().is_ok());
    for bad in [
        DelayWindowConfig {
            min_window: 0,
            ..ok.clone()
        },
        DelayWindowConfig {
            max_window: 1,
            ..ok.clone()
        },
        DelayWindowConfig {
            initial_window: ok.max_window + 1,
            ..ok.clone()
        },
        DelayWindowConfig {
            additive_increase: 0,
            ..ok.clone()
        },
        DelayWindowConfig {
            max_decrease_ppm: 1_000_000,
            ..ok.clone()
        },
        DelayWindowConfig {
            decrease_ppm: 1_000_001,
            ..ok.clone()
        },
        DelayWindowConfig {
            base_period: Nanos::ZERO,
            ..ok.clone()
        },
        DelayWindowConfig {
            weight: 0,
            ..ok.clone()
        },
        DelayWindowConfig {
            weight: MAX_WEIGHT + 1,
            ..ok.clone()
        },
        DelayWindowConfig {
            filter: 0,
            ..ok.clone()
        },
        DelayWindowConfig {
            filter: MAX_FILTER + 1,
            ..ok.clone()
        },
    ] {
        let err = DelayWindow::new(bad).unwrap_err();
        assert!(matches!(err, ConfigError::Window { .. }), "{err}");
    }
    // A zero-byte piece still gives valid defaults.
    assert!(DelayWindowConfig::for_piece(0).validate().is_ok());
}

mod pacing;
