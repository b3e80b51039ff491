//! What the coordinator does for the tenants' delay windows: the link
//! estimate, the windows' verdicts, gains and the one-piece floor; and
//! shares that follow tenants as they start, stop and come back.

use super::*;

#[test]
fn the_link_estimate_follows_what_the_tenants_move_together() {
    let s = Setup::new("estimate", TWO);
    let (mut c, table) = started(&s);
    let a = table.attach(TenantId(1)).unwrap();
    let b = table.attach(TenantId(2)).unwrap();
    let t0 = table.now_ns();
    c.recompute(t0);
    assert_eq!(table.link_estimate(), None, "nothing measured yet");

    // 20 ms intervals in which the two move 150 + 100 KB: 12.5 MB/s
    // together. After a second the smoothed rate is within 1% of it.
    let interval = 20_000_000u64;
    let mut now = t0;
    for _ in 0..50 {
        a.record_posted(150_000, 37);
        b.record_posted(100_000, 25);
        now += interval;
        c.recompute(now);
    }
    let rate = table.link_estimate().expect("measured") as f64;
    assert!((rate / 12.5e6 - 1.0).abs() < 0.01, "{rate}");

    // The tenants stop: the estimate falls slowly (by half in 5 s), so a
    // pause does not turn a fast link into a slow one.
    for _ in 0..50 {
        now += interval;
        c.recompute(now);
    }
    let paused = table.link_estimate().expect("still measured") as f64;
    assert!(
        paused > 0.85 * rate && paused < rate,
        "{paused} after {rate}"
    );
}

#[test]
fn the_windows_verdicts_show_in_the_link_view_and_rates_divide_the_policys_capacity() {
    let (_s, mut c, table, light, heavy) = two_tenants("verdicts");
    let mut now = both_waiting(&mut c, &table, (&light, &heavy));
    assert_eq!(c.link_view().over_target, 0.0);
    // 20 ms intervals: the two move 12.5 MB/s together and their windows
    // find 40% of their bytes over target.
    let mut rates = Vec::new();
    for _ in 0..60 {
        light.record_posted(100_000, 25);
        heavy.record_posted(150_000, 37);
        light.record_verdicts(100_000, 40_000);
        heavy.record_verdicts(150_000, 60_000);
        now += 20_000_000;
        rates = c.recompute(now);
    }
    let view = c.link_view();
    assert!((view.over_target - 0.4).abs() < 0.01, "{view:?}");
    assert!(
        (view.estimate_bytes_per_sec as f64 / 12.5e6 - 1.0).abs() < 0.02,
        "{view:?}"
    );
    // The rates divide the policy's capacity whatever the windows see.
    assert_eq!(
        rates,
        vec![(TenantId(1), 250_000_000), (TenantId(2), 750_000_000)]
    );
}

#[test]
fn a_tenant_that_starts_sending_may_take_its_share_at_once() {
    let (_s, mut c, table, light, heavy) = two_tenants("share");
    heavy.add_backlog(1 << 20);
    let mut now = table.now_ns();
    c.recompute(now);
    // The light tenant sends a trickle with nothing waiting: it is
    // published its weighted share (1/4), not 1.25 times its trickle.
    for _ in 0..5 {
        light.record_posted(1_000, 1);
        now += 20_000_000;
        let rates = c.recompute(now);
        assert_eq!(rates[0], (TenantId(1), 250_000_000), "{rates:?}");
    }
}

/// Two tenants with work waiting, moving 1:5 while their weights say 1:3:
/// the coordinator publishes a gain above 1 on the light tenant's
/// windows and under 1 on the heavy one's. A tenant reads 1 when the
/// coordinator's recomputations stop for a second (fail-static: the
/// windows go back to their weights alone), when it has nothing waiting,
/// and when the coordinator's gains are turned off.
/// A tenant held by its work-request cap (8-byte requests at 1,000/s, a
/// backlog waiting) contends for nothing more: the other tenant's window
/// keeps a gain of 1 and shares its growth with no one. (It was counted
/// as a contender of equal weight: the other's gain fell to about 0.5, and
/// its window with it.)
#[test]
fn a_tenant_held_by_its_work_request_cap_does_not_contend() {
    use mtrdma_sched::share::GAIN_ONE;
    const FLOOD: &str = policy_file!(
        r#"
[[tenant]]
id = 1
name = "victim"

[[tenant]]
id = 2
name = "flood"
wr_rate = { rate = 1000, burst = 64 }
"#
    );
    let s = Setup::new("wrcap", FLOOD);
    let (mut c, table) = started(&s);
    let (victim, flood) = (
        table.attach(TenantId(1)).unwrap(),
        table.attach(TenantId(2)).unwrap(),
    );
    victim.add_backlog(1 << 20);
    flood.add_backlog(1 << 20);
    let interval = 20_000_000u64;
    let mut now = table.now_ns();
    c.recompute(now);
    // Each 20 ms the victim moves 400 KB through its windows, the flood
    // `requests` of 8 bytes: the victim's gain stays 1, with no one to
    // share its windows' growth with.
    let mut flood_for_a_second = |requests: u64| {
        for _ in 0..50 {
            victim.record_posted(400_000, 100);
            victim.record_verdicts(400_000, 0);
            flood.record_posted(8 * requests, requests);
            now += interval;
            c.recompute(now);
        }
        assert_eq!(victim.window_gain(now), GAIN_ONE, "{requests} requests");
        assert_eq!(victim.sharing_weight(now), 1, "{requests} requests");
    };
    // At its cap (20 in 20 ms).
    flood_for_a_second(20);
    // With no delay window, at a third of its cap (an atomic's round trip
    // holds it there): it does not contend for the windows' gains either.
    flood_for_a_second(7);
}

/// Both tenants backlogged, then a first recomputation (with nothing
/// measured yet) at the table's now, which it returns.
fn both_waiting(
    c: &mut Coordinator,
    table: &QuotaTable,
    (light, heavy): (&TenantHandle, &TenantHandle),
) -> u64 {
    light.add_backlog(1 << 20);
    heavy.add_backlog(1 << 20);
    let now = table.now_ns();
    c.recompute(now);
    now
}

/// `n` intervals of 20 ms in which `light` moves 100 KB and `heavy`
/// 500 KB through their windows, none of it over target, each followed
/// by a recomputation.
fn both_move(
    c: &mut Coordinator,
    (light, heavy): (&TenantHandle, &TenantHandle),
    now: &mut u64,
    n: u32,
) {
    for _ in 0..n {
        light.record_posted(100_000, 25);
        heavy.record_posted(500_000, 125);
        light.record_verdicts(100_000, 0);
        heavy.record_verdicts(500_000, 0);
        *now += 20_000_000;
        c.recompute(*now);
    }
}

#[test]
fn window_gains_follow_the_shares_and_lapse_with_the_coordinator() {
    use mtrdma_core::table::HEARTBEAT_STALE_NS;
    use mtrdma_sched::share::GAIN_ONE;

    let (_s, mut c, table, light, heavy) = two_tenants("gains");
    let mut now = both_waiting(&mut c, &table, (&light, &heavy));
    assert_eq!(light.window_gain(now), GAIN_ONE, "nothing measured yet");
    both_move(&mut c, (&light, &heavy), &mut now, 50);
    let (l, h) = (light.window_gain(now), heavy.window_gain(now));
    assert!(l > GAIN_ONE * 3 / 2, "light tenant's gain {l}");
    assert!(h < GAIN_ONE * 2 / 3, "heavy tenant's gain {h}");
    // Normalised: a geometric mean of 1.
    let mean = (f64::from(l) * f64::from(h)).sqrt() / f64::from(GAIN_ONE);
    assert!((mean - 1.0).abs() < 0.01, "geometric mean {mean}");

    // Their windows share one increase per round trip: weights 1 and 3.
    assert_eq!(light.sharing_weight(now), 4);
    assert_eq!(heavy.sharing_weight(now), 4);

    // No recomputation for longer than HEARTBEAT_STALE_NS: gain 1, and
    // each window grows on its own again.
    assert_eq!(light.window_gain(now + HEARTBEAT_STALE_NS + 1), GAIN_ONE);
    assert_eq!(heavy.window_gain(now + HEARTBEAT_STALE_NS + 1), GAIN_ONE);
    assert_eq!(light.sharing_weight(now + HEARTBEAT_STALE_NS + 1), 1);

    // Nothing waiting any more: the light tenant no longer contends. A
    // moment of it keeps its gain; a second of it gives it 1 again, and the
    // heavy tenant, with nobody to share with, goes back to 1 too.
    light.add_backlog(-(1 << 20));
    both_move(&mut c, (&light, &heavy), &mut now, 2);
    assert_eq!(light.window_gain(now), l, "a moment without work keeps it");
    both_move(&mut c, (&light, &heavy), &mut now, 100);
    assert_eq!(light.window_gain(now), GAIN_ONE);
    let h = f64::from(heavy.window_gain(now)) / f64::from(GAIN_ONE);
    assert!((h - 1.0).abs() < 0.001, "the heavy tenant alone: gain {h}");
    assert_eq!(heavy.sharing_weight(now), 3, "the heavy tenant alone");

    // Turned off: 1 for every tenant, whatever they move.
    light.add_backlog(1 << 20);
    c.set_window_gains(false);
    both_move(&mut c, (&light, &heavy), &mut now, 10);
    assert_eq!(light.window_gain(now), GAIN_ONE);
    assert_eq!(heavy.window_gain(now), GAIN_ONE);
    assert_eq!(heavy.sharing_weight(now), 1);
}

/// A coordinator that stops recomputing: once its heartbeat is more than
/// `HEARTBEAT_STALE_NS` old, a tenant is no longer held to the fair rate
/// it last published, only to its policy (here: no cap), and a new
/// recomputation applies again.
#[test]
fn fair_rates_lapse_when_the_coordinator_stops() {
    use mtrdma_core::table::HEARTBEAT_STALE_NS;

    let (_s, mut c, table, light, heavy) = two_tenants("lapse");
    let (t0, rates) = both_backlogged(&mut c, &table, &light, &heavy);
    assert_eq!(rates[1], (TenantId(2), 750_000_000));
    let held = sent_in_10ms(&heavy, t0 + 2_000_000);
    assert!(held <= 7_500_000 + FAIR_RATE_TOLERANCE_NS + 8192, "{held}");
    // The coordinator is silent for longer than the heartbeat allows.
    let later = t0 + 1_000_000 + HEARTBEAT_STALE_NS + 1_000_000;
    let free = sent_in_10ms(&heavy, later);
    assert_eq!(free, 10_000 * 4096, "no fair rate holds it any more");
    // It comes back: the fair rate holds again.
    c.recompute(later + 20_000_000);
    let again = sent_in_10ms(&heavy, later + 21_000_000);
    assert!(
        again <= 7_500_000 + FAIR_RATE_TOLERANCE_NS + 8192,
        "{again}"
    );
}

/// The one-piece floor through the table: a latency tenant's reports
/// (`TenantHandle::report_delay_shift`, as its engine writes them) decide
/// which bulk tenants' windows get it (`TenantHandle::floor_permit`), one
/// tenant at a time, as far as the latency tenant's median delay allows;
/// a step that moves it too far is taken back; a stopped coordinator's
/// permits lapse; and the floor can be turned off.
#[test]
fn the_one_piece_floor_is_given_by_the_latency_tenant_s_delays() {
    use mtrdma_core::table::HEARTBEAT_STALE_NS;
    use mtrdma_sched::piece_floor::DelayShift;
    use mtrdma_sched::Nanos;

    const FLOOR: &str = policy_file!(
        "latency_bound = 16384\n",
        r#"
[[tenant]]
id = 1
name = "latency"
class = "latency"

[[tenant]]
id = 2
name = "bulk-a"

[[tenant]]
id = 3
name = "bulk-b"
"#
    );
    let s = Setup::new("floor", FLOOR);
    let (mut c, table) = started(&s);
    let latency = table.attach(TenantId(1)).unwrap();
    let bulk = [
        table.attach(TenantId(2)).unwrap(),
        table.attach(TenantId(3)).unwrap(),
    ];
    let interval = 20_000_000u64;
    let mut now = table.now_ns();
    let mut probe = DelayShift::new();
    // Each bulk tenant with the floor adds `per` ns to the probe's delay of
    // 300 us; 4 KiB pieces at the measured 20 MB/s take 205 us, and a
    // step may move the median by a quarter of that.
    let mut run = |c: &mut Coordinator, now: &mut u64, ms: u64, per: u64| {
        let mut most = 0;
        for _ in 0..ms / 20 {
            for b in &bulk {
                b.record_posted(200_000, 50);
                b.record_verdicts(200_000, 0);
            }
            let permit = latency.floor_permit(*now);
            let given = bulk.iter().filter(|b| b.floor_permit(*now).on).count() as u64;
            assert_eq!(
                permit.on,
                given > 0,
                "the latency tenant's permit says whether any has it"
            );
            // Forty requests of the probe in these 20 ms.
            for i in 0..40 {
                let sent = *now + i * 500_000;
                let delay = 300_000 + per * given;
                if probe.record(permit, Nanos(sent), Nanos(sent + delay)) {
                    latency.report_delay_shift(probe.report());
                }
            }
            *now += interval;
            c.recompute(*now);
            most = most.max(bulk.iter().filter(|b| b.floor_permit(*now).on).count());
        }
        most
    };
    // The floor costs the probe nothing: both get it.
    assert_eq!(run(&mut c, &mut now, 3_000, 0), 2);
    let view = c.link_view();
    assert_eq!((view.floor_granted, view.floor_senders), (2, 2));
    // Now each costs it 40 us: two are too many, one is kept.
    run(&mut c, &mut now, 2_000, 40_000);
    assert_eq!(bulk.iter().filter(|b| b.floor_permit(now).on).count(), 1);
    assert!(c.link_view().floor_withdrawals >= 1);
    // What a window is told at a completion, in one read, is what each
    // accessor says.
    for b in &bulk {
        let s = b.window_signals(now);
        assert_eq!(s.piece_floor, Some(b.floor_permit(now).on));
        assert_eq!(s.gain_ppm, Some(b.window_gain(now)));
        assert_eq!(s.sharing_weight, Some(b.sharing_weight(now)));
        assert_eq!(s.link_rate, Some(b.link_estimate().unwrap_or(0)));
    }
    // A stopped coordinator's permits lapse.
    let stale = now + HEARTBEAT_STALE_NS + 1;
    assert!(!bulk[0].floor_permit(stale).on);
    assert!(!latency.floor_permit(stale).on);
    let s = bulk[0].window_signals(stale);
    assert_eq!(
        (s.piece_floor, s.gain_ppm, s.sharing_weight),
        (Some(false), Some(mtrdma_sched::share::GAIN_ONE), Some(1))
    );
    // Turned off: no floor, whatever the probe says.
    c.set_piece_floor(false);
    assert_eq!(run(&mut c, &mut now, 1_000, 0), 0);
}

/// A tenant a reload removes and a later one brings back is measured
/// afresh: what it posted while out of the policy is not taken for one
/// interval's traffic (which would have lifted the link's estimate to
/// 100 MB/s here).
#[test]
fn a_tenant_removed_and_brought_back_by_reloads_is_measured_afresh() {
    let (s, mut c, table, light, heavy) = two_tenants("readd");
    let t0 = table.now_ns();
    c.recompute(t0);
    heavy.record_posted(1 << 20, 16);
    light.record_posted(1 << 20, 16);
    c.recompute(t0 + 1_000_000_000);
    let before = c.link_view().estimate_bytes_per_sec;
    assert!(before > 0 && before < 4 << 20, "{before}");

    let only_light = TWO.split("[[tenant]]\nid = 2").next().unwrap().to_string();
    s.write_policy(&only_light);
    c.reload().unwrap();
    assert_eq!(c.policy().tenants.len(), 1);
    c.recompute(t0 + 2_000_000_000);
    heavy.record_posted(100 << 20, 1600);

    s.write_policy(TWO);
    c.reload().unwrap();
    c.recompute(t0 + 3_000_000_000);
    let after = c.link_view().estimate_bytes_per_sec;
    assert!(after <= before, "{after} after, {before} before");
}
