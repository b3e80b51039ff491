//! What a latency bound holds on the null sink: the policy's pieces and
//! window, whatever a tenant's own code asks, and reloads.

use super::*;

/// A policy with a 16 KiB latency bound: tenant 1 bulk (weight 3)
/// held to it, tenant 2 bulk and exempt by name, tenant 3 latency.
fn bounded_table() -> mtrdma_core::TableOwner {
    let policy = Policy::new(
        LinkConfig::new(1 << 40).with_latency_bound(16 << 10),
        vec![
            mtrdma_core::TenantEntry::new(TenantId(1), "bulk").with_weight(3),
            mtrdma_core::TenantEntry::new(TenantId(2), "backup"),
            mtrdma_core::TenantEntry::new(TenantId(3), "kv").with_class(TrafficClass::Latency),
        ],
    )
    .with_exempt(["backup"]);
    QuotaTable::embedded(&policy).unwrap()
}

/// Posts one 256 KiB WRITE on `qp` and returns the lengths of the
/// pieces its recording sink saw.
fn pieces_of_one_write<Q: PieceScheduler>(qp: &mut NullScheduled<Q>) -> Vec<u32> {
    let len = 256 << 10;
    if let Err((e, _)) = qp.post_send(SendOp::Write(REMOTE), HeapRegion::new(len), 0..len, 7) {
        panic!("refused: {e}");
    }
    let done = drain(qp, 1);
    assert_eq!(done.len(), 1, "one completion for the whole request");
    let log = qp.with_sink(NullSink::take_log);
    assert_eq!(
        log.iter().map(|p| u64::from(p.length)).sum::<u64>(),
        len as u64
    );
    log.iter().map(|p| p.length).collect()
}

/// What a tenant's own code asks for when it wants no protection at
/// all: no window, 1 MiB pieces, many in flight, and a window weight
/// of its own for when one is forced on it.
fn loose() -> ScheduleConfig {
    ScheduleConfig {
        chunk_bytes: 1 << 20,
        max_pieces_in_flight: 64,
        window: Some(std::sync::Arc::new(DelayWindowConfig {
            weight: 1000,
            queue_bytes: 1 << 30,
            ..DelayWindowConfig::for_piece(1 << 20)
        })),
        ..ScheduleConfig::default()
    }
}

#[test]
fn a_tenant_held_to_a_latency_bound_cannot_loosen_it_from_its_own_code() {
    let table = bounded_table();
    let sink = || {
        NullSink::new(1, 64)
            .recording()
            .with_tenant(table.attach(TenantId(1)).unwrap())
    };
    let no_window = ScheduleConfig {
        window: None,
        ..loose()
    };
    let shared = NullScheduler::new(SharedConfig {
        chunk_bytes: 1 << 20,
        ..SharedConfig::default()
    })
    .unwrap();
    // On an engine of its own, with a scheduler that does not chunk at
    // all, on a shared engine that chunks by 1 MiB, and scheduled as a
    // "latency" tenant of the process's own: every way, 4 KiB pieces
    // under a window of the bound's allowance and the tenant's weight.
    let ways: Vec<(&str, NullScheduled)> = vec![
        (
            "default",
            scheduled(sink(), ScheduleConfig::default()).unwrap(),
        ),
        ("no window", scheduled(sink(), no_window.clone()).unwrap()),
        ("loose window", scheduled(sink(), loose()).unwrap()),
        ("shared", shared.attach(sink(), no_window.clone()).unwrap()),
        (
            "local latency",
            scheduled(
                sink(),
                ScheduleConfig {
                    tenant: crate::Tenancy::Local {
                        id: TenantId(9),
                        class: TrafficClass::Latency,
                    },
                    ..no_window.clone()
                },
            )
            .unwrap(),
        ),
    ];
    for (way, mut qp) in ways {
        assert_eq!(qp.class(), TrafficClass::Bulk, "{way}");
        let w = qp.window().unwrap_or_else(|| panic!("{way}: no window"));
        assert_eq!((w.queue_bytes, w.piece_bytes), (10 << 10, 4096), "{way}");
        if way != "local latency" {
            assert_eq!(w.weight, 3, "{way}: the tenant's weight, not its code's");
        }
        let pieces = pieces_of_one_write(&mut qp);
        assert!(pieces.iter().all(|&l| l <= 4096), "{way}: {pieces:?}");
        assert_eq!(pieces.len(), 64, "{way}");
    }
    let mut qp = scheduled_with(sink(), no_window, mtrdma_sched::FifoScheduler::new()).unwrap();
    assert_eq!(qp.window().unwrap().piece_bytes, 4096, "own scheduler");
    let pieces = pieces_of_one_write(&mut qp);
    assert!(
        pieces.iter().all(|&l| l <= 4096),
        "own scheduler: {pieces:?}"
    );
    // Tighter settings of its own are kept.
    let tight = ScheduleConfig {
        chunk_bytes: 2048,
        window: Some(std::sync::Arc::new(DelayWindowConfig {
            queue_bytes: 4096,
            ..DelayWindowConfig::for_piece(2048)
        })),
        ..ScheduleConfig::default()
    };
    let mut qp = scheduled(sink(), tight).unwrap();
    let w = qp.window().unwrap();
    assert_eq!((w.queue_bytes, w.piece_bytes), (4096, 2048));
    assert!(pieces_of_one_write(&mut qp).iter().all(|&l| l <= 2048));
}

/// A window of a test's own: a fixed budget that counts the windows
/// built and keeps the last signals it was given.
#[derive(Debug, Default)]
struct Recorder {
    built: std::sync::atomic::AtomicU32,
    signals: std::sync::Arc<std::sync::Mutex<Vec<mtrdma_sched::Signals>>>,
}

#[derive(Debug)]
struct Recorded {
    budget: mtrdma_sched::FixedWindow,
    signals: std::sync::Arc<std::sync::Mutex<Vec<mtrdma_sched::Signals>>>,
}

impl mtrdma_sched::Window for Recorded {
    fn admit(&self, in_flight: u64, bytes: u64, now: mtrdma_sched::Nanos) -> mtrdma_sched::Admit {
        self.budget.admit(in_flight, bytes, now)
    }
    fn on_sent(&mut self, _: u64, _: mtrdma_sched::Nanos) {}
    fn on_completed(&mut self, _: u64, _: mtrdma_sched::Nanos, _: mtrdma_sched::Nanos) {}
    fn window(&self) -> u64 {
        self.budget.window()
    }
    fn signals(&mut self, s: &mtrdma_sched::Signals) {
        self.signals.lock().unwrap().push(*s);
    }
}

impl mtrdma_sched::WindowFactory for Recorder {
    fn build(
        &self,
        _seed: u64,
        _weight: u32,
    ) -> Result<Box<dyn mtrdma_sched::Window>, mtrdma_sched::ConfigError> {
        self.built
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(Box::new(Recorded {
            budget: mtrdma_sched::FixedWindow::new(8192),
            signals: std::sync::Arc::clone(&self.signals),
        }))
    }
}

#[test]
fn a_window_of_ones_own_bounds_the_queue_pair_and_hears_the_coordinator() {
    let table = QuotaTable::embedded(&weighted(2)).unwrap();
    let recorder = std::sync::Arc::new(Recorder::default());
    let config = ScheduleConfig {
        chunk_bytes: 4096,
        max_pieces_in_flight: 16,
        window: Some(recorder.clone()),
        ..ScheduleConfig::default()
    };
    let sink = NullSink::new(1, 64)
        .recording()
        .with_tenant(table.attach(TenantId(1)).unwrap());
    let mut qp = scheduled(sink, config).unwrap();
    assert_eq!(recorder.built.load(std::sync::atomic::Ordering::Relaxed), 1);
    assert_eq!(qp.window().unwrap().window_bytes, 8192);
    // At most two 4 KiB pieces out at once: the sink saw them posted
    // in pairs, never more than two before a poll took one back.
    let len = 64 << 10;
    let region = HeapRegion::new(len);
    if let Err((e, _)) = qp.post_send(SendOp::Write(REMOTE), region, 0..len, 1) {
        panic!("refused: {e}");
    }
    let mut most = 0;
    let mut done = Vec::new();
    while done.is_empty() {
        most = most.max(qp.window().unwrap().in_flight_bytes);
        qp.poll(&mut done).unwrap();
    }
    assert!(most <= 8192 && most > 0, "{most}");
    // Every completion told it the coordinator's signals (none
    // published here: no link rate, the neutral gain and sharing).
    let heard = recorder.signals.lock().unwrap().clone();
    assert_eq!(heard.len(), 16, "one per piece");
    assert!(heard.iter().all(|s| s.link_rate == Some(0)
        && s.gain_ppm == Some(mtrdma_sched::share::GAIN_ONE)
        && s.weight.is_none()));
}

#[test]
fn a_latency_bound_replaces_a_window_of_the_tenants_own() {
    let table = bounded_table();
    let recorder = std::sync::Arc::new(Recorder::default());
    let config = ScheduleConfig {
        window: Some(recorder.clone()),
        ..ScheduleConfig::default()
    };
    let sink = NullSink::new(1, 64)
        .recording()
        .with_tenant(table.attach(TenantId(1)).unwrap());
    let qp = scheduled(sink, config).unwrap();
    assert_eq!(recorder.built.load(std::sync::atomic::Ordering::Relaxed), 0);
    let w = qp.window().unwrap();
    assert_eq!(
        (w.queue_bytes, w.piece_bytes, w.weight),
        (10 << 10, 4096, 3)
    );
}

#[test]
fn the_exempt_and_the_latency_class_keep_their_own_settings_under_a_bound() {
    let table = bounded_table();
    for tenant in [TenantId(2), TenantId(3)] {
        let sink = NullSink::new(1, 64)
            .recording()
            .with_tenant(table.attach(tenant).unwrap());
        let mut qp = scheduled(sink, ScheduleConfig::default()).unwrap();
        assert!(qp.window().is_none(), "{tenant}");
        let pieces = pieces_of_one_write(&mut qp);
        assert_eq!(pieces, [64 << 10; 4], "{tenant}");
    }
}

#[test]
fn a_policy_reload_reaches_a_running_queue_pair() {
    let table = QuotaTable::embedded(&weighted(1)).unwrap();
    let (sink, config) = windowed_tenant(&table);
    let mut qp = scheduled(sink, config).unwrap();
    assert_eq!(qp.window().unwrap().weight, 1);
    post(&mut qp, SendOp::Write(REMOTE), tagged(0), 64, 0);
    drain(&mut qp, 1);
    // The coordinator (here the table's creator) publishes weight 4:
    // the next request runs under it.
    table.publish(&weighted(4)).unwrap();
    post(&mut qp, SendOp::Write(REMOTE), tagged(1), 64, 1);
    drain(&mut qp, 1);
    assert_eq!(qp.window().unwrap().weight, 4);
}

#[test]
fn dropping_a_scheduled_queue_pair_with_work_queued_frees_it() {
    let mut qp = scheduled(NullSink::new(1, 4), bulk0()).unwrap();
    for i in 0..10 {
        post(&mut qp, SendOp::Write(REMOTE), tagged(i), 64, i);
    }
    drop(qp);
}

#[test]
fn a_cap_set_on_the_shared_scheduler_holds_back_requests_sent_one_at_a_time() {
    // 64 KiB/s: the first 64 KiB request goes at once, the second not
    // for a second, though nothing is queued ahead of it when it is
    // posted.
    let shared = NullScheduler::new(SharedConfig::default()).unwrap();
    let cap = RateLimit::per_second(64 << 10);
    shared
        .set_policy(TenantId(5), TenantPolicy::weight(1).with_byte_cap(cap))
        .unwrap();
    let config = ScheduleConfig::local(TenantId(5), TrafficClass::Bulk);
    let mut qp = shared.attach(NullSink::new(1, 16), config).unwrap();
    let remote = RemoteRegion {
        len: 64 << 10,
        ..REMOTE
    };
    post(
        &mut qp,
        SendOp::Write(remote),
        HeapRegion::new(64 << 10),
        64 << 10,
        1,
    );
    assert_eq!(drain(&mut qp, 1).len(), 1, "within the burst");
    post(
        &mut qp,
        SendOp::Write(remote),
        HeapRegion::new(64 << 10),
        64 << 10,
        2,
    );
    assert_eq!(
        qp.with_sink(|s| s.sends_in_flight()),
        0,
        "over the cap: held back, not posted"
    );
    assert_eq!(qp.queued(), 1);
    drop(qp);
}

/// A piece held back by its tenant's fair rate goes soon after the
/// coordinator raises the rate, not when the old rate would have let it
/// (4 s here): a tenant idle at a tiny rate that starts to send, a host's
/// share of a cluster-wide cap that grows.
#[test]
fn a_piece_held_by_its_tenants_fair_rate_goes_soon_after_the_rate_is_raised() {
    use mtrdma_core::coordinator::{Coordinator, CoordinatorConfig};
    let name = format!("raised-{}", std::process::id());
    let dir = std::env::temp_dir().join(&name);
    std::fs::create_dir_all(&dir).unwrap();
    let policy = |capacity: u64| {
        Policy::new(
            LinkConfig::new(capacity),
            vec![mtrdma_core::TenantEntry::new(TenantId(1), "t")],
        )
    };
    let policy_path = dir.join("policy.toml");
    std::fs::write(
        &policy_path,
        "[link]\ncapacity = 1024\n\n[[tenant]]\nid = 1\nname = \"t\"\n",
    )
    .unwrap();
    let mut c = Coordinator::start(CoordinatorConfig {
        table: name.clone(),
        socket: dir.join("sock"),
        policy_path,
        capacity: 4,
        processes: 4,
    })
    .unwrap();
    let sink = NullSink::new(1, 16).with_tenant(c.table().attach(TenantId(1)).unwrap());
    let config = ScheduleConfig {
        chunk_bytes: 4096,
        ..ScheduleConfig::default()
    };
    let mut qp = scheduled(sink, config).unwrap();
    // 1 KiB/s: the first piece goes, the second waits 4 s.
    c.recompute(c.table().now_ns());
    post(
        &mut qp,
        SendOp::Write(REMOTE),
        HeapRegion::new(4096),
        4096,
        0,
    );
    drain(&mut qp, 1);
    post(
        &mut qp,
        SendOp::Write(REMOTE),
        HeapRegion::new(4096),
        4096,
        1,
    );
    let mut out = Vec::new();
    qp.poll(&mut out).unwrap();
    assert!(out.is_empty(), "held at 1 KiB/s");
    c.apply_policy(policy(1 << 30)).unwrap();
    c.recompute(c.table().now_ns());
    let raised = std::time::Instant::now();
    while out.is_empty() && raised.elapsed() < Duration::from_secs(10) {
        qp.poll(&mut out).unwrap();
        std::thread::sleep(Duration::from_millis(1));
    }
    let took = raised.elapsed();
    assert_eq!(out.len(), 1);
    assert!(
        took < Duration::from_secs(1),
        "went {took:?} after the rate was raised"
    );
    drop(qp);
    c.shutdown(true).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

/// A long request paced by its tenant's cap whose second piece fails
/// reports at once, not after the cap has paced out the rest (8 s
/// here: 62 more pieces of 1 KiB at 8 KiB/s).
#[test]
fn a_paced_request_that_fails_reports_at_once() {
    let shared = shared_1k();
    let cap = RateLimit::new(8 << 10, 1024);
    shared
        .set_policy(TenantId(5), TenantPolicy::weight(1).with_byte_cap(cap))
        .unwrap();
    let config = ScheduleConfig {
        chunk_bytes: 1024,
        max_pieces_in_flight: 1,
        ..ScheduleConfig::local(TenantId(5), TrafficClass::Bulk)
    };
    let mut qp = shared.attach(NullSink::new(1, 16), config).unwrap();
    qp.with_sink(|s| s.refuse_after(1));
    let started = std::time::Instant::now();
    post(
        &mut qp,
        SendOp::Write(REMOTE),
        HeapRegion::new(64 << 10),
        64 << 10,
        7,
    );
    let mut out = Vec::new();
    while out.is_empty() && started.elapsed() < Duration::from_secs(20) {
        qp.poll(&mut out).unwrap();
        std::thread::sleep(Duration::from_millis(1));
    }
    let took = started.elapsed();
    assert_eq!(out.len(), 1);
    assert_eq!(
        (out[0].context, out[0].status),
        (7, WcStatus::LocalQpOperation)
    );
    assert!(
        took < Duration::from_secs(2),
        "reported after {took:?}, the rest paced out first"
    );
    assert_eq!(qp.queued(), 0);
}

#[test]
fn parked_and_chunked_requests_complete_in_the_order_posted() {
    // Small requests go parked (as the direct path posts them) when
    // nothing is ahead; a chunked one goes piece by piece through the
    // engine. Interleaved, they must still complete in order, each
    // with its own length and region.
    let config = ScheduleConfig {
        chunk_bytes: 1024,
        max_pieces_in_flight: 4,
        ..bulk0()
    };
    let mut qp = scheduled(NullSink::new(1, 16), config).unwrap();
    let mut want = Vec::new();
    let mut out = Vec::new();
    for i in 0..60u64 {
        let len = if i % 3 == 1 { 2048 } else { 64 };
        let mut region = HeapRegion::new(len);
        region.as_mut_slice()[..8].copy_from_slice(&i.to_le_bytes());
        let remote = RemoteRegion {
            len: 1 << 20,
            ..REMOTE
        };
        if let Err((e, _)) = qp.post_send(SendOp::Write(remote), region, 0..len, i) {
            panic!("refused: {e}");
        }
        want.push((i, len));
        if i % 4 == 3 {
            qp.poll(&mut out).unwrap();
        }
    }
    out.extend(drain(&mut qp, 60 - out.len()));
    let got: Vec<(u64, usize)> = out
        .iter()
        .map(|c| (c.context, c.byte_len as usize))
        .collect();
    assert_eq!(got, want, "in order, each with its length");
    assert!(out
        .iter()
        .all(|c| tag(&c.region) == c.context && c.status.is_success()));
    assert_eq!(qp.queued(), 0);
    assert_eq!(qp.with_sink(|s| s.sends_in_flight()), 0);
}
