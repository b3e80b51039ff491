//! The quota table in one process: admission, publication, and every kind
//! of corruption a table can show up with.

use mtrdma_core::table::TableError;
use mtrdma_core::{
    AdmissionError, LinkConfig, Policy, QuotaTable, RateLimit, TenantEntry, TenantId, TrafficClass,
};

#[path = "../src/table/fixtures.rs"]
#[allow(dead_code)]
mod fixtures;

use fixtures::{policy, two_tenants};

/// A unique shared-memory table name for this test process.
fn unique(tag: &str) -> String {
    format!("test-{tag}-{}", std::process::id())
}

#[test]
fn quota_refusal_names_tenant_limit_and_use() {
    let table = QuotaTable::embedded(&two_tenants()).unwrap();
    let kv = table.attach(TenantId(1)).unwrap();
    let held: Vec<_> = (0..4).map(|_| kv.acquire_qp().unwrap()).collect();
    let err = kv.acquire_qp().unwrap_err();
    match &err {
        AdmissionError::QuotaExceeded {
            tenant,
            limit,
            in_use,
            requested,
            field,
            ..
        } => {
            assert_eq!(
                (*tenant, *limit, *in_use, *requested, *field),
                (TenantId(1), 4, 4, 1, "max_qps")
            );
        }
        other => panic!("unexpected {other:?}"),
    }
    let msg = err.to_string();
    assert!(
        msg.contains("tenant 1 (kv)") && msg.contains("limit 4, in use 4"),
        "{msg}"
    );
    drop(held);
    assert!(kv.acquire_qp().is_ok());

    // MR bytes: 1 MiB in all, whatever the split.
    let a = kv.acquire_mr(700 << 10).unwrap();
    let err = kv.acquire_mr(400 << 10).unwrap_err();
    assert!(err.to_string().contains("memory-region bytes"), "{err}");
    let b = kv.acquire_mr(324 << 10).unwrap();
    assert_eq!(a.bytes() + b.bytes(), 1 << 20);
    assert!(kv.acquire_mr(1).is_err());
}

#[test]
fn control_path_rate_limits_storms() {
    let p = policy(vec![TenantEntry::new(TenantId(5), "stormy")
        .with_qp_create_rate(RateLimit::new(10, 3))
        .with_max_qps(1000)]);
    let table = QuotaTable::embedded(&p).unwrap();
    let t = table.attach(TenantId(5)).unwrap();
    let mut held = Vec::new();
    let mut refused = None;
    for _ in 0..10 {
        match t.acquire_qp() {
            Ok(permit) => held.push(permit),
            Err(e) => {
                refused = Some(e);
                break;
            }
        }
    }
    // The burst of 3 plus the one that is always let through, then a refusal.
    assert_eq!(held.len(), 4);
    match refused.unwrap() {
        AdmissionError::RateLimited {
            per_second,
            retry_after_ns,
            operation,
            ..
        } => {
            assert_eq!((per_second, operation), (10, "QP creation"));
            assert!(
                retry_after_ns > 0 && retry_after_ns <= 100_000_000,
                "{retry_after_ns}"
            );
        }
        other => panic!("unexpected {other:?}"),
    }
    // A refused creation does not count against max_qps.
    let usage = table.usage().unwrap();
    assert_eq!(usage[0].qps.0, 4);
    assert!(usage[0].refusals >= 1);
}

#[test]
fn publishing_keeps_live_state_and_handles_see_new_limits() {
    let name = unique("publish");
    let table = QuotaTable::create(&name, 8, 8, &two_tenants()).unwrap();
    let tenant_view = QuotaTable::open(&name).unwrap();
    let kv = tenant_view.attach(TenantId(1)).unwrap();
    let held: Vec<_> = (0..4).map(|_| kv.acquire_qp().unwrap()).collect();
    assert!(kv.acquire_qp().is_err());
    let g0 = tenant_view.generation();

    // The coordinator raises kv's quota and adds a tenant.
    let mut p = two_tenants();
    p.tenants[0].max_qps = 6;
    p.tenants.push(TenantEntry::new(TenantId(9), "new"));
    table.publish(&p).unwrap();
    assert_eq!(tenant_view.generation(), g0 + 1);
    let more: Vec<_> = (0..2).map(|_| kv.acquire_qp().unwrap()).collect();
    assert!(kv.acquire_qp().is_err());
    let usage = tenant_view.usage().unwrap();
    let kv_usage = usage.iter().find(|u| u.tenant == TenantId(1)).unwrap();
    assert_eq!(kv_usage.qps, (6, 6), "live state survived the reload");
    assert!(usage
        .iter()
        .any(|u| u.tenant == TenantId(9) && u.qps.0 == 0));

    // A tenant process cannot publish: `QuotaTable::open` gives a view
    // without `publish` (`TableOwner`'s compile_fail example pins it).
    drop((held, more));
    drop(kv);
    QuotaTable::remove(&name).unwrap();
}

#[test]
fn named_tables_exist_once_and_errors_say_what_to_do() {
    let name = unique("exists");
    let _table = QuotaTable::create(&name, 4, 4, &two_tenants()).unwrap();
    let err = QuotaTable::create(&name, 4, 4, &two_tenants()).unwrap_err();
    assert!(
        err.to_string().contains("a table of that name exists"),
        "{err}"
    );
    QuotaTable::remove(&name).unwrap();
    let err = QuotaTable::open(&name).unwrap_err();
    assert!(
        err.to_string().contains("is the coordinator running"),
        "{err}"
    );
    assert!(matches!(
        QuotaTable::open("bad/name"),
        Err(TableError::BadName(_))
    ));
    // Too many tenants for the capacity.
    let many: Vec<_> = (0..5)
        .map(|i| TenantEntry::new(TenantId(i), format!("t{i}")))
        .collect();
    assert!(matches!(
        QuotaTable::embedded_with_capacity(&policy(many), 4, 4),
        Err(TableError::Full {
            tenants: 5,
            capacity: 4
        })
    ));
}

#[test]
fn shared_rate_limit_holds_in_virtual_time() {
    // 1 GB/s with 64 KiB of burst: over 10 ms of virtual time two handles
    // of one tenant together send at most 10 MB + burst + one request.
    let p =
        policy(vec![TenantEntry::new(TenantId(3), "capped")
            .with_rate(RateLimit::new(1_000_000_000, 64 << 10))]);
    let table = QuotaTable::embedded(&p).unwrap();
    let a = table.attach(TenantId(3)).unwrap();
    let b = table.attach(TenantId(3)).unwrap();
    let mut sent = 0u64;
    let start = 1_000_000_000u64;
    let mut now = start;
    while now < start + 10_000_000 {
        for h in [&a, &b] {
            if h.check_rate(now, 4096, 1).is_ok() {
                sent += 4096;
            }
        }
        now += 1_000;
    }
    let max = 10_000_000 + (64 << 10) + 4096;
    assert!(sent <= max, "{sent} > {max}");
    assert!(sent >= 10_000_000 - 4096, "{sent}");
}

/// Leaves table `name`'s policy as a coordinator that died in the middle
/// of publishing does: its sequence odd (offset 24 of the policy region).
fn tear_policy(name: &str) {
    use std::os::unix::fs::FileExt;
    let shm = std::fs::OpenOptions::new()
        .write(true)
        .open(format!("/dev/shm/mtrdma.{name}.policy"))
        .unwrap();
    shm.write_all_at(&7u64.to_le_bytes(), 24).unwrap();
}

/// A policy of one tenant, `t` as `with` makes it, on a 1 GB/s link.
fn one_tenant(with: impl FnOnce(TenantEntry) -> TenantEntry) -> Policy {
    Policy::new(
        LinkConfig::new(1_000_000_000),
        vec![with(TenantEntry::new(TenantId(1), "t"))],
    )
}

/// Creates the table `name` of `policy` and opens it as a tenant, which
/// `opened` may use, then leaves the policy half-written, as a creator
/// that died publishing would; returns what `opened` did.
fn torn<T>(name: &str, policy: &Policy, opened: impl FnOnce(QuotaTable) -> T) -> T {
    let first = QuotaTable::create(name, 4, 4, policy).unwrap();
    let opened = opened(QuotaTable::open(name).unwrap());
    tear_policy(name);
    drop(first);
    opened
}

#[test]
fn a_writer_that_takes_over_a_half_written_policy_recovers_it() {
    let name = format!("torn-{}", std::process::id());
    let policy = |weight| one_tenant(|t| t.with_weight(weight));
    let tenant = torn(&name, &policy(1), |table| table);
    // A restarted coordinator takes the table over (it could not before:
    // opening failed on the half-written policy) and publishes a whole one.
    let taken = QuotaTable::open_writable(&name).expect("take over a half-written policy");
    taken.publish(&policy(3)).unwrap();
    // The tenant that was running sees it.
    let snap = tenant.snapshot().unwrap();
    assert_eq!(snap.policy.tenants[0].schedule.weight, 3);
    drop((taken, tenant));
    QuotaTable::remove(&name).unwrap();
}

/// Counts the warnings logged on the thread it is the default for.
struct Warnings(std::sync::Arc<std::sync::atomic::AtomicUsize>);

impl tracing::Subscriber for Warnings {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        if *event.metadata().level() == tracing::Level::WARN {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

/// A coordinator that dies in the middle of publishing leaves the policy
/// half written. A running tenant keeps its last good policy (its limits
/// still hold) and reads the table again only when it changes: it says so
/// once, not at every call after a wait on the table each time. A
/// restarted coordinator's publish reaches it.
#[test]
fn a_tenant_keeps_its_last_policy_while_the_table_is_half_written() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    let name = format!("torn-tenant-{}", std::process::id());
    let policy = |max_qps| one_tenant(|t| t.with_max_qps(max_qps));
    let (table, tenant) = torn(&name, &policy(2), |table| {
        let tenant = table.attach(TenantId(1)).unwrap();
        (table, tenant)
    });

    let warnings = Arc::new(AtomicUsize::new(0));
    let subscriber = Warnings(Arc::clone(&warnings));
    let held = tracing::subscriber::with_default(subscriber, || {
        let now = tenant.now_ns();
        for i in 0..50 {
            assert!(tenant.check_rate(now + i, 64, 1).is_ok());
        }
        // The last good policy's limits still hold.
        let held: Vec<_> = (0..2).map(|_| tenant.acquire_qp().unwrap()).collect();
        assert!(tenant.acquire_qp().is_err(), "max_qps = 2 still holds");
        held
    });
    assert_eq!(
        warnings.load(Ordering::SeqCst),
        1,
        "one warning for the half-written policy, not one per call"
    );

    // A restarted coordinator takes over and publishes: the tenant sees it.
    let taken = QuotaTable::open_writable(&name).unwrap();
    taken.publish(&policy(3)).unwrap();
    let third = tenant
        .acquire_qp()
        .expect("the new policy's max_qps = 3 applies");
    drop((held, third));
    drop((tenant, taken, table));
    QuotaTable::remove(&name).unwrap();
}
