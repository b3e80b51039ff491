//! The coordinator's logic in one process: reloads, fair rates,
//! registration refusals and taking over a table after a crash.

use std::path::{Path, PathBuf};

use mtrdma_core::coordinator::{self, Coordinator, CoordinatorError};
use mtrdma_core::table::FAIR_RATE_TOLERANCE_NS;
use mtrdma_core::{QuotaTable, TenantHandle, TenantId};

/// A policy file: the `[link]` of every test here (1 GB/s, shares
/// recomputed every millisecond), then `$rest` (more of the link's
/// settings, and the tenants).
macro_rules! policy_file {
    ($($rest:literal),+) => {
        concat!(
            "\n[link]\ncapacity = 1000000000\nrecompute_interval_ms = 1\n",
            $($rest),+
        )
    };
}

// The delay windows' side: a file of their own.
#[path = "coordinator/windows.rs"]
mod windows;

#[path = "common/setup.rs"]
mod setup;
use setup::Setup;

const TWO: &str = policy_file!(
    r#"
[[tenant]]
id = 1
name = "light"
weight = 1
max_qps = 2

[[tenant]]
id = 2
name = "heavy"
weight = 3
"#
);

/// Ticks (as the daemon does, every few milliseconds) until a tick tried a
/// reload, for at most two seconds: the file is looked at every
/// `HOUSEKEEPING_INTERVAL_NS`.
fn tick_until_reload(c: &mut Coordinator) -> mtrdma_core::coordinator::TickReport {
    let start = std::time::Instant::now();
    loop {
        let report = c.tick(c.table().now_ns());
        if report.reloaded || report.reload_error.is_some() {
            return report;
        }
        assert!(
            start.elapsed() < std::time::Duration::from_secs(2),
            "no reload within 2 s of the change"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

#[test]
fn reloads_a_changed_policy_and_keeps_the_old_one_when_the_new_is_bad() {
    let s = Setup::new("reload", TWO);
    let mut c = Coordinator::start(s.config.clone()).unwrap();
    let tenant = c.table().attach(TenantId(1)).unwrap();
    let held: Vec<_> = (0..2).map(|_| tenant.acquire_qp().unwrap()).collect();
    assert!(tenant.acquire_qp().is_err());

    s.write_policy(&TWO.replace("max_qps = 2", "max_qps = 3"));
    let report = tick_until_reload(&mut c);
    assert!(report.reloaded, "{report:?}");
    let third = tenant
        .acquire_qp()
        .expect("the raised quota applies to a running tenant");

    s.write_policy("[link]\ncapacity = 0\n");
    let report = tick_until_reload(&mut c);
    assert!(!report.reloaded);
    assert!(report.reload_error.unwrap().contains("capacity"));
    assert_eq!(c.policy().tenants.len(), 2, "the previous policy stays");
    assert!(tenant.acquire_qp().is_err(), "still max_qps = 3");
    drop((held, third));
}

/// A policy in a Kubernetes ConfigMap volume: `policy.toml` links to
/// `..data/policy.toml`, and `..data` to a directory of the update. An
/// update writes a new directory and renames a new `..data` link over the
/// old one. Here the new file has the old one's size and modification
/// time, so only the file the path now resolves to tells the change.
#[test]
fn reloads_a_policy_whose_configmap_volume_swapped_its_data_link() {
    use std::os::unix::fs::symlink;
    let s = Setup::new("configmap", TWO);
    let update = |dir: &str, policy: &str| {
        let at = s.dir.join(dir);
        std::fs::create_dir(&at).unwrap();
        std::fs::write(at.join("policy.toml"), policy).unwrap();
        at.join("policy.toml")
    };
    let first = update("..2026_11_29_10_00_00.1", TWO);
    symlink("..2026_11_29_10_00_00.1", s.dir.join("..data")).unwrap();
    std::fs::remove_file(&s.config.policy_path).unwrap();
    symlink("..data/policy.toml", &s.config.policy_path).unwrap();

    let mut c = Coordinator::start(s.config.clone()).unwrap();
    let tenant = c.table().attach(TenantId(1)).unwrap();
    let held: Vec<_> = (0..2).map(|_| tenant.acquire_qp().unwrap()).collect();
    assert!(tenant.acquire_qp().is_err());

    let raised = TWO.replace("max_qps = 2", "max_qps = 3");
    assert_eq!(raised.len(), TWO.len());
    let second = update("..2026_11_29_10_05_00.2", &raised);
    let then = std::fs::metadata(&first).unwrap().modified().unwrap();
    std::fs::File::options()
        .write(true)
        .open(&second)
        .unwrap()
        .set_modified(then)
        .unwrap();
    symlink("..2026_11_29_10_05_00.2", s.dir.join("..data_tmp")).unwrap();
    std::fs::rename(s.dir.join("..data_tmp"), s.dir.join("..data")).unwrap();

    let report = tick_until_reload(&mut c);
    assert!(report.reloaded, "{report:?}");
    let third = tenant
        .acquire_qp()
        .expect("the raised quota applies to a running tenant");
    drop((held, third));
}

/// A coordinator of `TWO`, and a handle of each of its tenants.
/// A coordinator started on `s`, and its table: the coordinator's own
/// view (on a coordinated table only it may attach a process as a tenant
/// of its choice).
fn started(s: &Setup) -> (Coordinator, QuotaTable) {
    let c = Coordinator::start(s.config.clone()).unwrap();
    let table = c.table().clone();
    (c, table)
}

/// A coordinator started on the policy [`TWO`] (its files named for
/// `tag`), its table, and the handles of its two tenants.
fn two_tenants(tag: &str) -> (Setup, Coordinator, QuotaTable, TenantHandle, TenantHandle) {
    let s = Setup::new(tag, TWO);
    let (c, table) = started(&s);
    let light = table.attach(TenantId(1)).unwrap();
    let heavy = table.attach(TenantId(2)).unwrap();
    (s, c, table, light, heavy)
}

/// Recomputes with nothing waiting at the table's now, then 1 ms later
/// with both tenants backlogged; returns the first time and the second
/// recomputation's rates.
fn both_backlogged(
    c: &mut Coordinator,
    table: &QuotaTable,
    light: &TenantHandle,
    heavy: &TenantHandle,
) -> (u64, Vec<(TenantId, u64)>) {
    let t0 = table.now_ns();
    c.recompute(t0);
    light.add_backlog(1 << 20);
    heavy.add_backlog(1 << 20);
    (t0, c.recompute(t0 + 1_000_000))
}

/// Bytes `tenant`'s rate limits let through in 10 ms of virtual time from
/// `start`, offered 4 KiB every microsecond.
fn sent_in_10ms(tenant: &TenantHandle, start: u64) -> u64 {
    (0..10_000u64)
        .filter(|step| tenant.check_rate(start + step * 1_000, 4096, 1).is_ok())
        .count() as u64
        * 4096
}

#[test]
fn fair_rates_follow_demand_and_weights() {
    let (_s, mut c, table, light, heavy) = two_tenants("fair");
    // Both backlogged: 1:3.
    let (t0, rates) = both_backlogged(&mut c, &table, &light, &heavy);
    assert_eq!(
        rates,
        vec![(TenantId(1), 250_000_000), (TenantId(2), 750_000_000)]
    );

    // The light tenant goes idle: the heavy one gets the whole link, and
    // the idle one is offered the share it would get by coming back.
    light.add_backlog(-(1 << 20));
    let rates = c.recompute(t0 + 2_000_000);
    assert_eq!(
        rates,
        vec![(TenantId(1), 250_000_000), (TenantId(2), 1_000_000_000)]
    );
    let usage = c.usage();
    assert_eq!(usage[1].fair_rate, 1_000_000_000);
    assert!(table.last_heartbeat_ns() >= t0 + 2_000_000);

    // The heavy tenant's shared limiter now runs at its fair rate: over
    // 10 ms of virtual time it may send about 10 MB, and no more than
    // what it may catch up on (the rate's tolerance) besides.
    let sent = sent_in_10ms(&heavy, t0 + 3_000_000);
    // At 1 GB/s, each nanosecond of the tolerance is one byte.
    let tolerance = FAIR_RATE_TOLERANCE_NS;
    assert!(sent <= 10_000_000 + tolerance + 4096 * 2, "{sent}");
    assert!(sent >= 10_000_000 - 4096 * 2, "{sent}");
}

/// A tenant whose fair rate is raised owes, in time, what its bytes take
/// at the new rate: a large request charged at the old rate does not hold
/// it back for the old rate's time (seconds, at low rates).
#[test]
fn a_raised_fair_rate_applies_at_once_to_what_is_owed() {
    let (_s, mut c, table, light, heavy) = two_tenants("raise");
    let (t0, rates) = both_backlogged(&mut c, &table, &light, &heavy);
    assert_eq!(rates[0], (TenantId(1), 250_000_000));
    // 25 MB at 250 MB/s: 100 ms owed.
    let t1 = t0 + 2_000_000;
    light
        .check_rate(t1, 25_000_000, 1)
        .expect("nothing owed before");
    let retry = light.check_rate(t1, 4096, 1).expect_err("100 ms owed");
    assert!(retry >= t1 + 98_000_000, "{}", retry - t1);

    // The heavy tenant goes idle: the light one gets the whole link, and
    // the 24.75 MB it still owes take 24.75 ms at 1 GB/s.
    heavy.add_backlog(-(1 << 20));
    let t2 = t1 + 1_000_000;
    let rates = c.recompute(t2);
    assert_eq!(rates[0], (TenantId(1), 1_000_000_000));
    let retry = light
        .check_rate(t2, 4096, 1)
        .expect_err("what it owes is still owed");
    let wait = retry - t2;
    // Less the 1 ms its fair rate lets it catch up on.
    assert!(
        (23_000_000..=24_800_000).contains(&wait),
        "waits {wait} ns at the new rate"
    );
    assert!(light.check_rate(t2 + 24_800_000, 4096, 1).is_ok());
}

/// Connections that never finish their greeting hold up nothing: a
/// registration that comes after twenty of them is answered at once, they
/// are turned away after their deadline, and beyond the most kept at once
/// a connection is told to try again. (Each silent connection held a tick
/// for 200 ms: twenty held registrations, reclamation, fair rates and
/// shutdown for 4 s.)
#[test]
fn silent_connections_hold_up_no_registration() {
    use mtrdma_core::coordinator::{MAX_PENDING_REGISTRATIONS, REGISTRATION_DEADLINE_NS};
    use std::io::{Read, Write};
    use std::os::unix::net::UnixStream;
    use std::time::{Duration, Instant};

    let s = Setup::new("silent", TWO);
    let mut c = Coordinator::start(s.config.clone()).unwrap();
    let connect = || UnixStream::connect(&s.config.socket).unwrap();
    let silent: Vec<UnixStream> = (0..20).map(|_| connect()).collect();
    // One says half of its greeting and no more.
    (&silent[0]).write_all(b"MTRDMA-REG").unwrap();
    let socket = s.config.socket.clone();
    let client = std::thread::spawn(move || coordinator::register(&socket));
    let started = Instant::now();
    let mut refused = Vec::new();
    while refused.is_empty() {
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "not answered within 2 s"
        );
        refused = c.tick(c.table().now_ns()).refused;
        c.wait(Duration::from_millis(5));
    }
    // TWO matches no process: the answer is a refusal, with its reason.
    assert_eq!(refused.len(), 1, "{refused:?}");
    assert!(refused[0].contains("no tenant"), "{refused:?}");
    assert!(matches!(
        client.join().unwrap(),
        Err(CoordinatorError::Refused(_))
    ));
    assert_eq!(c.pending_registrations(), 20);

    // Past their deadline, they are turned away and told why. The tick's
    // time judges the deadline: no test needs to wait a second out.
    let now = c.table().now_ns();
    assert!(c.tick(now).refused.is_empty(), "before their deadline");
    assert_eq!(c.pending_registrations(), 20);
    let refused = c.tick(now + REGISTRATION_DEADLINE_NS).refused;
    assert_eq!(refused.len(), 20, "{refused:?}");
    assert_eq!(c.pending_registrations(), 0);
    let mut answer = String::new();
    (&silent[0]).read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("ERR no greeting within"), "{answer:?}");

    // A flood: beyond the most kept at once, try again.
    let flood: Vec<UnixStream> = (0..MAX_PENDING_REGISTRATIONS).map(|_| connect()).collect();
    assert!(c.tick(c.table().now_ns()).refused.is_empty());
    let extra = connect();
    let refused = c.tick(c.table().now_ns()).refused;
    assert_eq!(refused.len(), 1, "{refused:?}");
    let mut answer = String::new();
    (&extra).read_to_string(&mut answer).unwrap();
    assert!(answer.contains("try again"), "{answer:?}");
    drop(flood);
    // Connections that closed are dropped at the next tick.
    let refused = c.tick(c.table().now_ns()).refused;
    assert_eq!(refused.len(), MAX_PENDING_REGISTRATIONS);
    assert_eq!(c.pending_registrations(), 0);
}

/// `TWO` with its heavy tenant matching this process's user.
fn two_matching_me() -> String {
    let uid = rustix::process::geteuid().as_raw();
    format!("{TWO}\n[[tenant.match]]\nuid = {uid}\n")
}

/// Ticks until one registration was answered (for at most 10 s).
fn serve_one(c: &mut Coordinator) -> mtrdma_core::coordinator::TickReport {
    let start = std::time::Instant::now();
    loop {
        let report = c.tick(c.table().now_ns());
        if !report.registered.is_empty() || !report.refused.is_empty() {
            return report;
        }
        assert!(start.elapsed() < std::time::Duration::from_secs(10));
        c.wait(std::time::Duration::from_millis(5));
    }
}

/// A coordinator's table is private to its user (mode 0600), a process
/// that opens it by name cannot attach as a tenant of its choice, and a
/// registered process gets the table over the socket: it needs no access
/// to the objects' names (here removed, as in a container whose /dev/shm
/// is its own).
#[test]
fn a_registered_process_gets_the_table_over_the_socket() {
    use std::os::unix::fs::PermissionsExt;
    let s = Setup::new("fds", &two_matching_me());
    let mut c = Coordinator::start(s.config.clone()).unwrap();
    assert!(c.table().is_coordinated());
    let path = format!("/dev/shm/mtrdma.{}.policy", s.config.table);
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "{path}");
    let state = format!("/dev/shm/mtrdma.{}.state", s.config.table);
    assert!(
        !Path::new(&state).exists(),
        "the state has no name anyone could open"
    );
    let by_name = QuotaTable::open(&s.config.table).unwrap();
    assert!(matches!(
        by_name.attach(TenantId(1)),
        Err(mtrdma_core::TableError::Coordinated)
    ));
    assert!(by_name.reclaim_dead().is_empty());
    drop(by_name);
    QuotaTable::remove(&s.config.table).unwrap();

    let socket = s.config.socket.clone();
    let client = std::thread::spawn(move || coordinator::register(&socket));
    let report = serve_one(&mut c);
    assert_eq!(report.registered.len(), 1, "{report:?}");
    let tenant = client.join().unwrap().expect("registered");
    assert_eq!(tenant.tenant(), TenantId(2), "decided from this uid");
    let qp = tenant.acquire_qp().unwrap();
    assert_eq!(c.usage()[1].qps.0, 1, "one table, seen by both");
    drop(qp);
    assert_eq!(c.usage()[1].qps.0, 0);

    // It was handed its own tenant's state alone: the other tenant's
    // counters are out of its reach, and so is a slot of the other's.
    let own = tenant.table();
    let seen: Vec<TenantId> = own.usage().unwrap().iter().map(|u| u.tenant).collect();
    assert_eq!(
        seen,
        [TenantId(2)],
        "the other tenant's state is not mapped"
    );
    let me = mtrdma_core::procinfo::ProcessId::current().unwrap();
    let theirs = c.table().claim_process_slot(TenantId(1), me).unwrap();
    match own.adopt(TenantId(1), theirs) {
        Err(mtrdma_core::TableError::NotOurSlot { reason, .. }) => {
            assert!(reason.contains("not handed"), "{reason}")
        }
        other => panic!("adopted another tenant's slot: {other:?}"),
    }
    let (light, heavy) = (
        state_files(&s.config.table, 0),
        state_files(&s.config.table, 1),
    );
    assert_eq!(
        light.len(),
        1,
        "the other tenant's file is the coordinator's alone"
    );
    assert_eq!(heavy.len(), 2, "the coordinator's and the tenant's");

    // What the registered process was handed it cannot shrink or grow
    // under the others' mappings (which would fault them with SIGBUS).
    for fd in [light, heavy].concat() {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&fd)
            .unwrap();
        let len = file.metadata().unwrap().len();
        for to in [0, len / 2, len + 4096] {
            let err = file.set_len(to).unwrap_err();
            assert_eq!(err.raw_os_error(), Some(1), "{fd:?} to {to}: {err}");
        }
    }
    assert_eq!(tenant.acquire_qp().unwrap().tenant(), TenantId(2));
    assert_eq!(c.usage()[1].qps.0, 0);
}

/// This process's descriptors of table `table`'s state file of tenant
/// slot `slot`.
fn state_files(table: &str, slot: u32) -> Vec<PathBuf> {
    let label = format!("/memfd:mtrdma.{table}.tenant{slot} (deleted)");
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| std::fs::read_link(p).is_ok_and(|t| t.as_os_str() == label.as_str()))
        .collect()
}

/// A coordinator does not take over a table others may write (one made
/// without a coordinator, or whose policy object was opened up), and does
/// not bind its socket where it cannot trust the path.
#[test]
fn a_coordinator_refuses_a_table_others_may_write_and_an_unsafe_socket_path() {
    use std::os::unix::fs::PermissionsExt;
    let s = Setup::new("private", TWO);
    let policy = mtrdma_core::Policy::from_toml_str(TWO).unwrap();
    let made = QuotaTable::create(&s.config.table, 8, 8, &policy).unwrap();
    match Coordinator::start(s.config.clone()) {
        Err(CoordinatorError::Table(mtrdma_core::TableError::NotPrivate { mode, .. })) => {
            assert_eq!(mode, 0o644, "the uncoordinated table's policy object")
        }
        other => panic!("took over an uncoordinated table: {other:?}"),
    }
    drop(made);
    QuotaTable::remove(&s.config.table).unwrap();

    let made = QuotaTable::create_coordinated(&s.config.table, 8, 8, &policy).unwrap();
    let policy_object = format!("/dev/shm/mtrdma.{}.policy", s.config.table);
    std::fs::set_permissions(&policy_object, std::fs::Permissions::from_mode(0o666)).unwrap();
    let err = Coordinator::start(s.config.clone()).unwrap_err();
    assert!(
        err.to_string().contains("mode 666") && err.to_string().contains("remove it"),
        "{err}"
    );
    drop(made);
    QuotaTable::remove(&s.config.table).unwrap();
    // Its own private table it takes over.
    drop(QuotaTable::create_coordinated(&s.config.table, 8, 8, &policy).unwrap());
    drop(Coordinator::start(s.config.clone()).unwrap());

    // Something that is not a socket where the socket goes.
    let _ = std::fs::remove_file(&s.config.socket);
    std::fs::write(&s.config.socket, b"not a socket").unwrap();
    assert!(matches!(
        Coordinator::start(s.config.clone()),
        Err(CoordinatorError::UnsafeSocket { .. })
    ));
    std::fs::remove_file(&s.config.socket).unwrap();
    // A directory anyone may write, without the sticky bit.
    let open_dir = s.dir.join("open");
    std::fs::create_dir(&open_dir).unwrap();
    std::fs::set_permissions(&open_dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let mut config = s.config.clone();
    config.socket = open_dir.join("sock");
    match Coordinator::start(config) {
        Err(CoordinatorError::UnsafeSocket { problem, .. }) => {
            assert!(problem.contains("may be changed by others"), "{problem}")
        }
        other => panic!("bound in a directory anyone may write: {other:?}"),
    }
}

#[test]
fn a_process_no_rule_matches_is_refused_with_the_reason() {
    let s = Setup::new("refuse", TWO);
    let mut c = Coordinator::start(s.config.clone()).unwrap();
    let socket = s.config.socket.clone();
    let client = std::thread::spawn(move || coordinator::register(&socket));
    let mut refused = Vec::new();
    for _ in 0..2000 {
        refused = c.tick(c.table().now_ns()).refused;
        if !refused.is_empty() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    assert_eq!(refused.len(), 1);
    match client.join().unwrap() {
        Err(CoordinatorError::Refused(reason)) => {
            assert!(
                reason.contains("no tenant of the policy matches uid"),
                "{reason}"
            )
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[test]
fn a_restarted_coordinator_takes_over_and_tenants_carry_on() {
    let s = Setup::new("takeover", TWO);
    let first = Coordinator::start(s.config.clone()).unwrap();
    let tenant = first.table().attach(TenantId(1)).unwrap();
    let held = tenant.acquire_qp().unwrap();
    // A second coordinator may not run beside the first.
    assert!(matches!(
        Coordinator::start(s.config.clone()),
        Err(CoordinatorError::AlreadyRunning(_))
    ));
    drop(first); // dies without cleaning up: table and socket file stay

    // The tenant goes on with the last policy (fail-static).
    let second = tenant.acquire_qp().unwrap();
    assert!(tenant.acquire_qp().is_err());

    let c = Coordinator::start(s.config.clone()).unwrap();
    let usage = c.usage();
    assert_eq!(
        usage[0].qps.0, 2,
        "the new coordinator sees the running tenant's use"
    );
    drop((held, second));
    assert_eq!(c.usage()[0].qps.0, 0);
    c.shutdown(true).unwrap();
    assert!(
        QuotaTable::open(&s.config.table).is_err(),
        "shutdown removed the table"
    );
}

/// A restarted coordinator finds each tenant's state through a live
/// process that holds it; a tenant's state that no process holds any more
/// (its processes and the old coordinator are gone) owes nothing to
/// anyone, and is made anew.
#[test]
fn a_restarted_coordinator_finds_each_tenants_state_or_makes_it_anew() {
    let s = Setup::new("stategone", &two_matching_me());
    let mut c = Coordinator::start(s.config.clone()).unwrap();
    let socket = s.config.socket.clone();
    let client = std::thread::spawn(move || coordinator::register(&socket));
    assert_eq!(serve_one(&mut c).registered.len(), 1);
    let heavy = client.join().unwrap().expect("registered");
    let held = heavy.acquire_qp().unwrap();
    let light = c.table().attach(TenantId(1)).unwrap();
    let gone = light.acquire_qp().unwrap();
    let light_file = state_files(&s.config.table, 0);
    assert_eq!(light_file.len(), 1);
    let old_inode = std::fs::metadata(&light_file[0]).unwrap();
    drop(gone);
    drop(light);
    drop(c); // dies without cleaning up; no one holds the light tenant's state now
    assert!(state_files(&s.config.table, 0).is_empty());

    let c = Coordinator::start(s.config.clone()).unwrap();
    let usage = c.usage();
    assert_eq!(
        (usage[0].qps.0, usage[1].qps.0),
        (0, 1),
        "the heavy tenant's found through its process, the light one's anew"
    );
    use std::os::unix::fs::MetadataExt;
    let new_file = state_files(&s.config.table, 0);
    assert_eq!(new_file.len(), 1);
    assert_ne!(
        std::fs::metadata(&new_file[0]).unwrap().ino(),
        old_inode.ino()
    );
    let light = c.table().attach(TenantId(1)).unwrap();
    let _two = (light.acquire_qp().unwrap(), light.acquire_qp().unwrap());
    assert!(
        light.acquire_qp().is_err(),
        "max_qps 2 holds on the new file"
    );
    drop(held);
    assert_eq!(c.usage()[1].qps.0, 0, "one file, seen by both");
}
