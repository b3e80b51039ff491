//! Tests of `piece_floor`.

use super::*;

const MS: u64 = 1_000_000;

#[test]
fn words_read_back() {
    for p in [
        Permit::OFF,
        Permit {
            on: true,
            generation: 7,
        },
        Permit {
            on: false,
            generation: u32::MAX,
        },
    ] {
        assert_eq!(Permit::from_word(p.to_word()), Some(p));
    }
    assert_eq!(Permit::from_word(u64::MAX), None);
    // Beyond the field's range, a range saturates; out of order, it is
    // none.
    let far = Shift {
        generation: 1,
        samples: 0,
        range: Some(ShiftRange {
            low: -1 << 40,
            high: 1 << 40,
        }),
    };
    let back = Shift::from_word(far.to_word()).range.unwrap();
    assert_eq!((back.low, back.high), (-64 * FIELD_MAX, 64 * FIELD_MAX));
    let swapped = (1u64 << 63) | 0x10 | (0x01 << 24);
    assert_eq!(Shift::from_word(swapped).range, None);
    for s in [
        Shift::default(),
        Shift {
            generation: 0x7fff,
            samples: u32::MAX,
            range: None,
        },
        Shift {
            generation: 3,
            samples: 0,
            range: Some(ShiftRange {
                low: -64 * 1000,
                high: 64 * FIELD_MAX,
            }),
        },
    ] {
        assert_eq!(Shift::from_word(s.to_word()), s);
    }
}

/// Drives a probe every ms for `for_ms` whose delay is `base` ns and
/// `per` ns more for every sender with the floor, next to `senders`;
/// returns the most senders given it and the ms it was given to all.
fn drive(
    control: &mut FloorControl,
    for_ms: u64,
    base: u64,
    per: u64,
    senders: usize,
) -> (usize, u64) {
    let mut probe = (DelayShift::new(), Shift::default());
    drive_from(control, &mut probe, 0, for_ms, base, per, senders)
}

/// As `drive`, from `from_ms` on, with a probe and its last report.
fn drive_from(
    control: &mut FloorControl,
    probe: &mut (DelayShift, Shift),
    from_ms: u64,
    for_ms: u64,
    base: u64,
    per: u64,
    senders: usize,
) -> (usize, u64) {
    let delay = |granted: usize| base + per * granted as u64;
    drive_with(control, probe, from_ms, for_ms, senders, delay)
}

/// A floor control that granted nothing yet, and a probe that measured
/// nothing yet.
fn fresh() -> (FloorControl, (DelayShift, Shift)) {
    (
        FloorControl::default(),
        (DelayShift::new(), Shift::default()),
    )
}

/// The probe's delay in ns beside `n` senders with the floor: 20 us
/// times n squared over 500 us (two cost 80 us, four 320 us).
fn two_hold_four_do_not(n: usize) -> u64 {
    500_000 + 20_000 * (n * n) as u64
}

/// As `drive_from`, the probe's delay `delay(senders with the floor)`.
fn drive_with(
    control: &mut FloorControl,
    (probe, report): &mut (DelayShift, Shift),
    from_ms: u64,
    for_ms: u64,
    senders: usize,
    delay: impl Fn(usize) -> u64,
) -> (usize, u64) {
    let mut most = 0;
    let mut all_ms = 0;
    for t in from_ms..from_ms + for_ms {
        let now = Nanos(t * MS);
        let delay = delay(control.granted());
        if probe.record(control.permit(None), now, now + Nanos(delay)) {
            *report = probe.report();
        }
        let n = control.update(now + Nanos(MS), *report, Nanos(800_000), senders);
        most = most.max(n);
        all_ms += u64::from(n == senders);
    }
    (most, all_ms)
}

#[test]
fn a_floor_that_costs_nothing_is_given_to_every_sender_and_holds() {
    let mut c = FloorControl::default();
    let (most, all_ms) = drive(&mut c, 60_000, 500_000, 10_000, 8);
    assert_eq!(most, 8);
    assert_eq!(c.withdrawals(), 0);
    // Off for the first reference, eight steps, then 500 ms of every
    // 30 s.
    assert!(all_ms > 56_000, "all eight for {all_ms} ms of 60,000");
    assert_eq!(c.permit(Some(7)).on, c.granted() == 8);
    assert!(!c.permit(Some(8)).on);
}

#[test]
fn senders_are_given_it_twice_as_many_at_a_time_while_the_median_moves_little() {
    let (mut c, mut probe) = fresh();
    // 10 us a sender, a twentieth of the 200 us allowed: 1, 2, 4, 8.
    let mut given_at = Vec::new();
    for t in 0..3_000 {
        let before = c.granted();
        drive_from(&mut c, &mut probe, t, 1, 500_000, 10_000, 8);
        if c.granted() != before {
            given_at.push((t, c.granted()));
        }
    }
    let counts: Vec<usize> = given_at.iter().map(|&(_, n)| n).collect();
    assert_eq!(counts, [1, 2, 4, 8], "{given_at:?}");
    // The reference (1 s), then a report of 64 requests sent after
    // the queue settled (50 ms) for each step.
    let (first, all) = (given_at[0].0, given_at[3].0);
    assert!((990..1_100).contains(&first), "{given_at:?}");
    assert!(all < first + 3 * 150, "{given_at:?}");
    assert_eq!(c.withdrawals(), 0);
}

#[test]
fn a_doubling_that_moves_the_median_too_far_goes_back_to_the_senders_that_held() {
    let (mut c, mut probe) = fresh();
    // Two senders cost 80 us (under half the 200 us allowed), four
    // cost 320 us: the step from two to four is taken back to two,
    // not to three, and is not doubled again before the next
    // reference.
    let delay = two_hold_four_do_not;
    let (most, _) = drive_with(&mut c, &mut probe, 0, 1_500, 8, delay);
    assert_eq!(most, 4);
    assert_eq!(c.withdrawals(), 1);
    assert_eq!(c.granted(), 2);
    // After the wait (2 s), one more at a time: three holds (180 us),
    // four is taken back again.
    let (most, _) = drive_with(&mut c, &mut probe, 1_500, 4_000, 8, delay);
    assert_eq!(most, 4);
    assert_eq!(c.granted(), 3);
    assert_eq!(c.withdrawals(), 2);
}

#[test]
fn a_latency_tenant_that_comes_after_one_left_is_given_the_doubling_ramp_again() {
    let (mut c, mut probe) = fresh();
    // As above: a doubling from two to four is taken back.
    drive_with(&mut c, &mut probe, 0, 1_500, 8, two_hold_four_do_not);
    assert_eq!((c.granted(), c.withdrawals()), (2, 1));
    // The latency tenant leaves: patience runs out and the floor ends.
    let mut now = 1_500 * MS;
    while c.granted() > 0 {
        now += MS;
        c.update(Nanos(now), Shift::default(), Nanos(800_000), 8);
        assert!(now < 5_000 * MS, "still given at {now}");
    }
    // Another comes, next to senders that cost 10 us each: after its
    // reference it is given 1, 2, 4, 8 (not one at a time, and with
    // no wait left from the step taken back before).
    let from = now / MS + 1;
    let mut probe = (DelayShift::new(), Shift::default());
    let mut counts = Vec::new();
    let mut all_at = None;
    for t in from..from + 4_000 {
        let before = c.granted();
        drive_from(&mut c, &mut probe, t, 1, 500_000, 10_000, 8);
        if c.granted() != before {
            counts.push(c.granted());
            if c.granted() == 8 && all_at.is_none() {
                all_at = Some(t - from);
            }
        }
    }
    assert_eq!(&counts[..4], [1, 2, 4, 8], "{counts:?}");
    let all_at = all_at.unwrap();
    assert!(all_at < 1_000 + 1_000 + 4 * 150, "all eight at {all_at} ms");
    assert_eq!(c.withdrawals(), 1);
}

#[test]
fn a_step_that_moves_the_median_is_taken_back_and_tried_ever_less_often() {
    let mut c = FloorControl::default();
    // Each sender with the floor adds 90 us: two are allowed, the
    // third is not.
    let (most, all_ms) = drive(&mut c, 120_000, 500_000, 90_000, 8);
    assert_eq!(most, 3);
    assert_eq!(all_ms, 0);
    assert_eq!(c.granted(), 2);
    // Waits of 2, 4, 8, 16, 32 and 60 s, then the refresh after 30 s
    // starts them afresh: a handful of tries in two minutes.
    assert!((4..=10).contains(&c.withdrawals()), "{}", c.withdrawals());
}

#[test]
fn no_latency_sender_no_floor() {
    let mut c = FloorControl::default();
    for t in 0..20_000 {
        assert_eq!(
            c.update(Nanos(t * MS), Shift::default(), Nanos(800_000), 4),
            0
        );
    }
    assert!(!c.permit(None).on && !c.permit(Some(0)).on);
}

#[test]
fn senders_that_come_are_given_it_by_the_next_steps_and_a_silent_latency_sender_ends_it() {
    let (mut c, mut probe) = fresh();
    drive_from(&mut c, &mut probe, 0, 5_000, 500_000, 0, 2);
    assert_eq!(c.granted(), 2);
    let now = Nanos(5_000 * MS);
    // Two senders leave: they take theirs.
    assert_eq!(c.update(now, Shift::default(), Nanos(800_000), 1), 1);
    // Three come: they are given it in the steps that follow, with no
    // new reference.
    let (most, all_ms) = drive_from(&mut c, &mut probe, 5_001, 1_500, 500_000, 0, 4);
    assert_eq!((most, c.granted()), (4, 4));
    assert!(all_ms > 1_000, "all four for {all_ms} ms");
    assert_eq!(c.withdrawals(), 0);
    // No report of the current generation comes in: patience runs out.
    let mut now = 6_501 * MS;
    while c.granted() > 0 {
        now += MS;
        c.update(Nanos(now), Shift::default(), Nanos(800_000), 4);
        assert!(now < 10_000 * MS, "still given at {now}");
    }
}

#[test]
fn requests_sent_while_the_queue_settles_are_not_counted() {
    let mut s = DelayShift::new();
    let on = Permit {
        on: true,
        generation: 1,
    };
    for t in 0..200u64 {
        s.record(
            Permit::OFF,
            Nanos((200 + t) * MS),
            Nanos((200 + t) * MS + 1000),
        );
    }
    assert_eq!(s.report().samples, 200);
    // The change is seen at 400 ms; requests sent before 450 ms are
    // not counted.
    for t in 0..100u64 {
        let sent = Nanos((400 + t) * MS);
        s.record(on, sent, sent + Nanos(5_000));
    }
    let r = s.report();
    assert_eq!(r.samples, 49);
    assert_eq!(r.range, None, "too few samples");
    for t in 100..200u64 {
        let sent = Nanos((400 + t) * MS);
        s.record(on, sent, sent + Nanos(5_000));
    }
    let r = s.report().range.unwrap();
    assert_eq!((r.low, r.high), (4_000, 4_000), "no spread: no margin");
    // With spread, the range widens around the shift.
    let mut s = DelayShift::new();
    for t in 0..256u64 {
        let sent = Nanos((200 + t) * MS);
        s.record(Permit::OFF, sent, sent + Nanos(1_000 + (t % 10) * 100));
    }
    for t in 0..300u64 {
        let sent = Nanos((500 + t) * MS);
        s.record(on, sent, sent + Nanos(6_000 + (t % 10) * 100));
    }
    let r = s.report().range.unwrap();
    assert!(
        r.low < 5_100 && r.high > 5_100 && r.high - r.low < 400,
        "{r:?}"
    );
}

#[test]
fn merge_takes_the_current_generation_s_largest_shift() {
    let p = Permit {
        on: true,
        generation: 9,
    };
    let r = |g: u16, s: Option<i64>| Shift {
        generation: g,
        samples: 80,
        range: s.map(|s| ShiftRange {
            low: s - 5,
            high: s + 5,
        }),
    };
    let m = FloorControl::merge(
        p,
        [
            r(9, Some(10)),
            r(8, Some(1_000)),
            r(9, Some(30)),
            r(9, None),
        ],
    );
    assert_eq!(m.range.map(|r| (r.low, r.high)), Some((25, 35)));
    assert_eq!(m.samples, 80);
    assert_eq!(FloorControl::merge(p, [r(8, Some(5))]).range, None);
}
