//! The quota table across processes: this test binary spawns copies of
//! itself as tenant processes (selected by `MTRDMA_CHILD`), so quotas, rate
//! limits, reclamation and permissions are tested between real processes.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use mtrdma_core::coordinator::{self, Coordinator, CoordinatorConfig};
use mtrdma_core::{LinkConfig, Policy, QuotaTable, RateLimit, TenantEntry, TenantId};

const TENANT: TenantId = TenantId(1);

fn main() {
    if let Ok(role) = std::env::var("MTRDMA_CHILD") {
        child(&role);
        return;
    }
    let tests: &[Test] = &[
        (
            "eight_processes_race_for_eight_qps",
            eight_processes_race_for_eight_qps,
        ),
        (
            "eight_processes_race_for_mr_bytes",
            eight_processes_race_for_mr_bytes,
        ),
        (
            "killed_process_is_reclaimed_within_one_second",
            killed_process_is_reclaimed_within_one_second,
        ),
        (
            "two_processes_share_one_rate_cap",
            two_processes_share_one_rate_cap,
        ),
        (
            "tenant_uid_cannot_write_the_policy",
            tenant_uid_cannot_write_the_policy,
        ),
        (
            "the_uid_test_runs_from_a_directory_other_users_cannot_enter",
            the_uid_test_runs_from_a_directory_other_users_cannot_enter,
        ),
        (
            "a_tenant_in_its_own_pid_and_mount_namespaces_registers_and_is_reclaimed",
            a_tenant_in_its_own_pid_and_mount_namespaces_registers_and_is_reclaimed,
        ),
        (
            "a_restarted_coordinator_finds_the_state_through_a_registered_process",
            a_restarted_coordinator_finds_the_state_through_a_registered_process,
        ),
        (
            "a_coordinator_refuses_objects_another_user_made_first",
            a_coordinator_refuses_objects_another_user_made_first,
        ),
        (
            "registration_refuses_a_coordinator_of_another_user",
            registration_refuses_a_coordinator_of_another_user,
        ),
    ];
    let filter: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    if std::env::args().any(|a| a == "--ignored") {
        // Nothing here needs a device.
        println!("\nrunning 0 tests\n\ntest result: ok. 0 passed; 0 failed; 0 ignored; 0 measured; {} filtered out\n", tests.len());
        return;
    }
    let (mut passed, mut failed, mut skipped) = (0, 0, 0);
    println!("\nrunning {} tests", tests.len());
    for (name, test) in tests {
        if !filter.is_empty() && !filter.iter().any(|f| name.contains(f.as_str())) {
            continue;
        }
        // A test that cannot run here says so, and counts as ignored,
        // never as passed.
        match std::panic::catch_unwind(test) {
            Ok(Outcome::Ran) => {
                println!("test {name} ... ok");
                passed += 1;
            }
            Ok(Outcome::Skipped(why)) => {
                println!("test {name} ... ignored, {why}");
                skipped += 1;
            }
            Err(_) => {
                println!("test {name} ... FAILED");
                failed += 1;
            }
        }
    }
    println!(
        "\ntest result: {}. {passed} passed; {failed} failed; {skipped} ignored; 0 measured; 0 filtered out\n",
        if failed == 0 { "ok" } else { "FAILED" }
    );
    if failed > 0 {
        std::process::exit(101);
    }
}

fn unique(tag: &str) -> String {
    format!("proc-{tag}-{}", std::process::id())
}

fn policy(tenant: TenantEntry) -> Policy {
    Policy::new(LinkConfig::new(12_500_000_000), vec![tenant])
}

/// A child running `role` on table `table`; it waits for "go" on stdin.
struct Kid {
    child: Child,
    out: BufReader<std::process::ChildStdout>,
}

impl Kid {
    fn spawn(role: &str, table: &str, extra: &[(&str, String)]) -> Kid {
        Self::spawn_with(
            Command::new(std::env::current_exe().unwrap()),
            role,
            table,
            extra,
        )
    }

    fn spawn_with(mut cmd: Command, role: &str, table: &str, extra: &[(&str, String)]) -> Kid {
        cmd.env("MTRDMA_CHILD", role)
            .env("MTRDMA_TABLE", table)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped());
        for (k, v) in extra {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("spawn child");
        let out = BufReader::new(child.stdout.take().unwrap());
        Kid { child, out }
    }

    fn say(&mut self, line: &str) {
        writeln!(self.child.stdin.as_mut().unwrap(), "{line}").unwrap();
    }

    fn hear(&mut self) -> String {
        let mut line = String::new();
        self.out.read_line(&mut line).unwrap();
        line.trim().to_string()
    }

    fn finish(mut self) -> std::process::ExitStatus {
        drop(self.child.stdin.take());
        self.child.wait().unwrap()
    }
}

fn wait_line() -> String {
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).unwrap();
    line.trim().to_string()
}

/// The child side. Reports on stdout, one line per answer.
fn child(role: &str) {
    let table = std::env::var("MTRDMA_TABLE").unwrap();
    match role {
        "qps" | "mr" => {
            let t = QuotaTable::open(&table).unwrap().attach(TENANT).unwrap();
            assert_eq!(wait_line(), "go");
            let mut held_qps = Vec::new();
            let mut held_mrs = Vec::new();
            for _ in 0..4 {
                if role == "qps" {
                    held_qps.extend(t.acquire_qp().ok());
                } else {
                    held_mrs.extend(t.acquire_mr(1 << 20).ok());
                }
            }
            println!("{}", held_qps.len() + held_mrs.len());
            // Hold everything until the parent has counted.
            let _ = wait_line();
        }
        "register-and-hold" => {
            let socket = PathBuf::from(std::env::var("MTRDMA_SOCKET").unwrap());
            let t = coordinator::register(&socket).unwrap();
            let held: Vec<_> = (0..3).map(|_| t.acquire_qp().unwrap()).collect();
            let mr = t.acquire_mr(5 << 20).unwrap();
            println!("ready {}", held.len());
            std::thread::sleep(Duration::from_secs(600));
            drop((held, mr));
        }
        "register-in-namespaces" => {
            // In PID and mount namespaces of its own, with a /dev/shm of
            // its own: the table reaches it only over the socket.
            let socket = PathBuf::from(std::env::var("MTRDMA_SOCKET").unwrap());
            let by_name = QuotaTable::open(&table).map(|_| ());
            let t = coordinator::register(&socket).unwrap();
            let held: Vec<_> = (0..3).map(|_| t.acquire_qp().unwrap()).collect();
            println!(
                "ready {} pid {} by name: {}",
                held.len(),
                std::process::id(),
                by_name.map_or_else(|e| e.to_string(), |()| "opened".into())
            );
            std::thread::sleep(Duration::from_secs(600));
            drop(held);
        }
        "fake-coordinator" => {
            // Another user's process serving the registration socket.
            let socket = PathBuf::from(std::env::var("MTRDMA_SOCKET").unwrap());
            let listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
            println!("listening");
            if let Ok((mut stream, _)) = listener.accept() {
                let _ = writeln!(stream, "OK {table} 1 0 1 1 1");
            }
            let _ = wait_line();
        }
        "rate" => {
            // Lockstep on a virtual clock the parent advances: at each
            // tick, send 4 KiB pieces until the shared limit refuses.
            let t = QuotaTable::open(&table).unwrap().attach(TENANT).unwrap();
            let mut sent = 0u64;
            loop {
                let line = wait_line();
                let Some(now) = line.strip_prefix("t ") else {
                    break;
                };
                let now: u64 = now.parse().unwrap();
                while t.check_rate(now, 4 << 10, 1).is_ok() {
                    sent += 4 << 10;
                }
                println!("ok");
            }
            println!("{sent}");
        }
        "open-policy-rw" => {
            let name = format!("/mtrdma.{table}.policy");
            let rw = rustix::shm::open(
                name.as_str(),
                rustix::shm::OFlags::RDWR,
                rustix::fs::Mode::empty(),
            );
            let ro = QuotaTable::open(&table).map(|_| ());
            let writable = QuotaTable::open_writable(&table).map(|_| ());
            println!(
                "rw={} ro={} writable={}",
                rw.map_or_else(|e| e.to_string(), |_| "opened".into()),
                ro.map_or_else(|e| e.to_string(), |()| "opened".into()),
                writable.map_or_else(|e| e.to_string(), |()| "opened".into()),
            );
        }
        other => panic!("unknown child role {other}"),
    }
}

fn race(role: &str, tenant: TenantEntry) -> (u64, u64) {
    let name = unique(role);
    let table = QuotaTable::create(&name, 4, 32, &policy(tenant)).unwrap();
    let mut kids: Vec<Kid> = (0..8).map(|_| Kid::spawn(role, &name, &[])).collect();
    for k in &mut kids {
        k.say("go");
    }
    let won: u64 = kids
        .iter_mut()
        .map(|k| k.hear().parse::<u64>().unwrap())
        .sum();
    let usage = table.usage().unwrap()[0].clone();
    let in_use = if role == "qps" {
        usage.qps.0
    } else {
        usage.mr_bytes.0
    };
    for k in kids {
        assert!(k.finish().success());
    }
    // Every process let go on exit: nothing is left in use.
    let after = table.usage().unwrap()[0].clone();
    assert_eq!((after.qps.0, after.mr_bytes.0, after.processes), (0, 0, 0));
    QuotaTable::remove(&name).unwrap();
    (won, in_use)
}

fn eight_processes_race_for_eight_qps() -> Outcome {
    let (won, in_use) = race("qps", TenantEntry::new(TENANT, "racer").with_max_qps(8));
    assert_eq!(
        (won, in_use),
        (8, 8),
        "8 processes x 4 attempts against max_qps = 8"
    );
    Outcome::Ran
}

fn eight_processes_race_for_mr_bytes() -> Outcome {
    let (won, in_use) = race(
        "mr",
        TenantEntry::new(TENANT, "racer").with_max_mr_bytes(8 << 20),
    );
    assert_eq!(
        (won, in_use),
        (8, 8 << 20),
        "8 processes x 4 MiB against 8 MiB"
    );
    Outcome::Ran
}

fn killed_process_is_reclaimed_within_one_second() -> Outcome {
    let mut c = Coord::start("coord");
    let mut kid = c.spawn_registering();
    // Serve the registration while the child waits for its answer.
    let registered = c.serve();
    assert_eq!(registered.len(), 1, "the child registered");
    assert_eq!(
        registered[0].1, TENANT,
        "identity came from the child's uid"
    );
    assert_eq!(kid.hear(), "ready 3");
    let usage = c.coord.usage()[0].clone();
    assert_eq!(
        (usage.qps.0, usage.mr_bytes.0, usage.processes),
        (3, 5 << 20, 1)
    );

    kid.child.kill().unwrap(); // SIGKILL: no destructor runs
    let _ = kid.child.wait();
    let killed = Instant::now();
    let reclaimed = c.reclaimed_within(Duration::from_secs(5));
    let took = killed.elapsed();
    assert_eq!(reclaimed.len(), 1);
    assert_eq!((reclaimed[0].qps, reclaimed[0].mr_bytes), (3, 5 << 20));
    assert!(took < Duration::from_secs(1), "reclaimed after {took:?}");
    let usage = c.coord.usage()[0].clone();
    assert_eq!((usage.qps.0, usage.mr_bytes.0, usage.processes), (0, 0, 0));
    c.finish();
    Outcome::Ran
}

/// Two processes of one tenant draw on one 100 MB/s budget in the table.
/// They run in lockstep on a virtual clock (100 us ticks for 1 s, shorter
/// than the 64 KiB burst lasts, as for a sender that never pauses) so that
/// the result depends on the shared limit, not on how the machine schedules
/// them; within each tick they race for the budget for real.
fn two_processes_share_one_rate_cap() -> Outcome {
    const CAP: u64 = 100_000_000; // 100 MB/s
    let name = unique("rate");
    let tenant = TenantEntry::new(TENANT, "capped").with_rate(RateLimit::new(CAP, 64 << 10));
    let table = QuotaTable::create(&name, 4, 8, &policy(tenant)).unwrap();
    let mut kids: Vec<Kid> = (0..2).map(|_| Kid::spawn("rate", &name, &[])).collect();
    let start = table.now_ns();
    for tick in 0..=10_000u64 {
        let now = start + tick * 100_000;
        for k in &mut kids {
            k.say(&format!("t {now}"));
        }
        for k in &mut kids {
            assert_eq!(k.hear(), "ok");
        }
    }
    for k in &mut kids {
        k.say("end");
    }
    let sent: Vec<u64> = kids.iter_mut().map(|k| k.hear().parse().unwrap()).collect();
    for k in kids {
        assert!(k.finish().success());
    }
    drop(table);
    QuotaTable::remove(&name).unwrap();
    let total = sent.iter().sum::<u64>() as f64;
    let ratio = total / CAP as f64;
    println!("two processes sent {sent:?} bytes in 1 s: {ratio:.4} of the cap");
    assert!(sent.iter().all(|&s| s > 0), "both processes sent: {sent:?}");
    assert!(
        (0.98..=1.02).contains(&ratio),
        "together {ratio:.4} of the cap"
    );
    Outcome::Ran
}

/// A coordinator for tenant 1, matched by this process's uid, on a
/// socket in a directory of its own.
struct Coord {
    dir: PathBuf,
    socket: PathBuf,
    name: String,
    coord: Coordinator,
}

impl Coord {
    /// A child that registers with this coordinator over its socket and
    /// holds what it is given.
    fn spawn_registering(&self) -> Kid {
        Kid::spawn(
            "register-and-hold",
            &self.name,
            &[("MTRDMA_SOCKET", self.socket.display().to_string())],
        )
    }

    fn config(&self) -> CoordinatorConfig {
        CoordinatorConfig {
            table: self.name.clone(),
            socket: self.socket.clone(),
            policy_path: self.dir.join("policy.toml"),
            capacity: 4,
            processes: 8,
        }
    }

    /// The coordinator dies without cleaning up (its table and socket
    /// file stay), and a new one starts on the same table.
    fn restart(self) -> Coord {
        let config = self.config();
        let Coord {
            dir,
            socket,
            name,
            coord,
        } = self;
        drop(coord);
        let coord = Coordinator::start(config).expect("a restarted coordinator takes over");
        Coord {
            dir,
            socket,
            name,
            coord,
        }
    }

    fn start(tag: &str) -> Coord {
        let dir = std::env::temp_dir().join(unique(tag));
        std::fs::create_dir_all(&dir).unwrap();
        let policy_path = dir.join("policy.toml");
        let uid = rustix::process::getuid().as_raw();
        std::fs::write(
            &policy_path,
            format!(
                "[link]\ncapacity = \"100Gbit\"\n\n[[tenant]]\nid = 1\nname = \"holder\"\nmax_qps = 3\n\
                 [[tenant.match]]\nuid = {uid}\n"
            ),
        )
        .unwrap();
        let name = unique(tag);
        let socket = dir.join("coordinator.sock");
        let coord = Coordinator::start(CoordinatorConfig {
            table: name.clone(),
            socket: socket.clone(),
            policy_path,
            capacity: 4,
            processes: 8,
        })
        .unwrap();
        Coord {
            dir,
            socket,
            name,
            coord,
        }
    }

    /// Ticks until a registration was answered (10 s at most).
    fn serve(&mut self) -> Vec<(u32, TenantId)> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let report = self.coord.tick(self.coord.table().now_ns());
            if !report.registered.is_empty() || !report.refused.is_empty() {
                assert!(report.refused.is_empty(), "{:?}", report.refused);
                return report.registered;
            }
            assert!(Instant::now() < deadline, "no registration within 10 s");
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// Ticks until a dead process was reclaimed (for at most `wait`).
    fn reclaimed_within(&mut self, wait: Duration) -> Vec<mtrdma_core::table::Reclaimed> {
        let deadline = Instant::now() + wait;
        loop {
            let reclaimed = self.coord.tick(self.coord.table().now_ns()).reclaimed;
            if !reclaimed.is_empty() || Instant::now() >= deadline {
                return reclaimed;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn finish(self) {
        self.coord.shutdown(true).unwrap();
        std::fs::remove_dir_all(&self.dir).unwrap();
    }
}

/// A tenant in a container's way: PID and mount namespaces of its own and
/// a /dev/shm of its own. It registers (its pid there is 1, the
/// coordinator sees another), gets the table over the socket, and what it
/// held is reclaimed when it is killed. (Registration failed: the slot's
/// pid was compared with the tenant's own.)
fn a_tenant_in_its_own_pid_and_mount_namespaces_registers_and_is_reclaimed() -> Outcome {
    if !rustix::process::geteuid().is_root() {
        return Outcome::Skipped("making PID and mount namespaces needs root");
    }
    let namespaces = ["--pid", "--fork", "--mount", "--mount-proc", "--kill-child"];
    let works = Command::new("unshare")
        .args(namespaces)
        .arg("true")
        .status()
        .is_ok_and(|s| s.success());
    if !works {
        return Outcome::Skipped("unshare cannot make PID and mount namespaces on this host");
    }
    let mut c = Coord::start("ns");
    let mut cmd = Command::new("unshare");
    cmd.args(namespaces)
        .args(["sh", "-c", "mount -t tmpfs tmpfs /dev/shm && exec \"$0\""]);
    cmd.arg(std::env::current_exe().unwrap());
    let mut kid = Kid::spawn_with(
        cmd,
        "register-in-namespaces",
        &c.name,
        &[("MTRDMA_SOCKET", c.socket.display().to_string())],
    );
    let registered = c.serve();
    assert_eq!(registered.len(), 1);
    let line = kid.hear();
    assert!(line.starts_with("ready 3 pid 1 by name: "), "{line}");
    assert!(
        line.contains("No such file"),
        "the table's names are not visible in there: {line}"
    );
    let usage = c.coord.usage()[0].clone();
    assert_eq!((usage.qps.0, usage.processes), (3, 1));

    kid.child.kill().unwrap(); // unshare --kill-child takes the tenant along
    let _ = kid.child.wait();
    let reclaimed = c.reclaimed_within(Duration::from_secs(5));
    assert_eq!(reclaimed.len(), 1, "the namespaced tenant was reclaimed");
    assert_eq!(reclaimed[0].qps, 3);
    c.finish();
    Outcome::Ran
}

/// A coordinator that dies leaves the table's state (a sealed memory file
/// with no name) in the registered processes alone; the coordinator that
/// takes over finds it through one of them, sees what they hold, and
/// reclaims it when they die.
fn a_restarted_coordinator_finds_the_state_through_a_registered_process() -> Outcome {
    let mut c = Coord::start("restart");
    let mut kid = c.spawn_registering();
    assert_eq!(c.serve().len(), 1);
    assert_eq!(kid.hear(), "ready 3");
    let mut c = c.restart();
    let usage = c.coord.usage()[0].clone();
    assert_eq!(
        (usage.qps.0, usage.mr_bytes.0, usage.processes),
        (3, 5 << 20, 1),
        "the new coordinator sees what the tenant process holds"
    );
    kid.child.kill().unwrap();
    let _ = kid.child.wait();
    let reclaimed = c.reclaimed_within(Duration::from_secs(5));
    assert_eq!(reclaimed.len(), 1);
    assert_eq!((reclaimed[0].qps, reclaimed[0].mr_bytes), (3, 5 << 20));
    c.finish();
    Outcome::Ran
}

/// A table, or a socket, that another user put in place first is not
/// taken over: what they wrote would be handed to every tenant, and they
/// could answer registrations.
fn a_coordinator_refuses_objects_another_user_made_first() -> Outcome {
    if !rustix::process::geteuid().is_root() {
        return Outcome::Skipped("giving objects to another uid needs root");
    }
    let chown = |path: &str, uid: u32| {
        std::os::unix::fs::chown(path, Some(uid), Some(uid)).unwrap();
    };
    let c = Coord::start("foreign");
    let config = |c: &Coord| CoordinatorConfig {
        table: c.name.clone(),
        socket: c.dir.join("second.sock"),
        policy_path: c.dir.join("policy.toml"),
        capacity: 4,
        processes: 8,
    };
    // The state has no name: only the policy object could be put there.
    let objects = [format!("/dev/shm/mtrdma.{}.policy", c.name)];
    for object in &objects {
        chown(object, 65534);
    }
    match Coordinator::start(config(&c)) {
        Err(coordinator::CoordinatorError::Table(mtrdma_core::TableError::NotPrivate {
            owner,
            ..
        })) => assert_eq!(owner, 65534),
        other => panic!("took over another user's table: {other:?}"),
    }
    for object in &objects {
        chown(object, 0);
    }
    // A socket another user left where this one's goes.
    let theirs = c.dir.join("theirs.sock");
    drop(std::os::unix::net::UnixListener::bind(&theirs).unwrap());
    chown(theirs.to_str().unwrap(), 65534);
    let mut cfg = config(&c);
    cfg.socket = theirs;
    match Coordinator::start(cfg) {
        Err(coordinator::CoordinatorError::UnsafeSocket { problem, .. }) => {
            assert!(problem.contains("belongs to uid 65534"), "{problem}")
        }
        other => panic!("bound over another user's socket: {other:?}"),
    }
    c.finish();
    Outcome::Ran
}

/// A registering process trusts only a coordinator running as root or as
/// its own user: another user's process on the socket could hand it a
/// table of its making.
fn registration_refuses_a_coordinator_of_another_user() -> Outcome {
    use std::os::unix::fs::PermissionsExt;
    if !rustix::process::geteuid().is_root() {
        return Outcome::Skipped("running a process as another uid needs root");
    }
    let reachable = Reachable::copy_of_this_binary();
    let dir = std::env::temp_dir().join(unique("fake"));
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let socket = dir.join("sock");
    let mut cmd = Command::new(&reachable.exe);
    cmd.uid(65534).gid(65534);
    let mut kid = Kid::spawn_with(
        cmd,
        "fake-coordinator",
        "fake",
        &[("MTRDMA_SOCKET", socket.display().to_string())],
    );
    assert_eq!(kid.hear(), "listening");
    let result = coordinator::register(&socket);
    kid.say("done");
    assert!(kid.finish().success());
    let _ = std::fs::remove_dir_all(&dir);
    match result {
        Err(coordinator::CoordinatorError::Untrusted { uid, .. }) => assert_eq!(uid, 65534),
        other => panic!("trusted another user's coordinator: {other:?}"),
    }
    Outcome::Ran
}

/// A test: its name and body.
type Test = (&'static str, fn() -> Outcome);

/// Whether a test ran, or why it could not here.
enum Outcome {
    Ran,
    Skipped(&'static str),
}

/// A copy of this test binary that `uid` can execute: the build's own
/// may sit under a directory other users cannot enter (a clone in `/root`,
/// mode 0700). Removed with the returned directory's guard.
struct Reachable {
    dir: PathBuf,
    exe: PathBuf,
}

impl Reachable {
    fn copy_of_this_binary() -> Reachable {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(unique("exe"));
        std::fs::create_dir(&dir).expect("make a directory for the copy");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        let exe = dir.join("processes");
        std::fs::copy(std::env::current_exe().unwrap(), &exe).expect("copy the test binary");
        std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
        Reachable { dir, exe }
    }
}

impl Drop for Reachable {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn tenant_uid_cannot_write_the_policy() -> Outcome {
    if !rustix::process::geteuid().is_root() {
        return Outcome::Skipped("dropping to another uid needs root");
    }
    let name = unique("perm");
    let table = QuotaTable::create(&name, 4, 4, &policy(TenantEntry::new(TENANT, "t"))).unwrap();
    // Run as uid 65534 from a copy that uid can reach.
    let reachable = Reachable::copy_of_this_binary();
    let mut cmd = Command::new(&reachable.exe);
    cmd.uid(65534).gid(65534);
    let mut kid = Kid::spawn_with(cmd, "open-policy-rw", &name, &[]);
    let answer = kid.hear();
    assert!(kid.finish().success());
    drop(table);
    QuotaTable::remove(&name).unwrap();
    assert!(answer.starts_with("rw=Permission denied"), "{answer}");
    assert!(
        answer.contains("ro=opened"),
        "a tenant may read the policy: {answer}"
    );
    assert!(
        answer.contains("writable=open of shared-memory object")
            && answer.contains("Permission denied"),
        "{answer}"
    );
    Outcome::Ran
}

/// The README's test command as root on a clone under a directory other
/// users cannot enter (`/root`, mode 0700): the test that drops to uid
/// 65534 must still run, from a copy that uid can reach. Runs this binary
/// from such a directory with only that test selected.
fn the_uid_test_runs_from_a_directory_other_users_cannot_enter() -> Outcome {
    use std::os::unix::fs::PermissionsExt;
    if !rustix::process::geteuid().is_root() {
        return Outcome::Skipped("dropping to another uid needs root");
    }
    let closed = std::env::temp_dir().join(unique("closed"));
    std::fs::create_dir(&closed).unwrap();
    std::fs::set_permissions(&closed, std::fs::Permissions::from_mode(0o700)).unwrap();
    let exe = closed.join("processes");
    std::fs::copy(std::env::current_exe().unwrap(), &exe).unwrap();
    let out = Command::new(&exe)
        .arg("tenant_uid_cannot_write_the_policy")
        .output()
        .expect("run the copy");
    let _ = std::fs::remove_dir_all(&closed);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("test tenant_uid_cannot_write_the_policy ... ok"),
        "from a 0700 directory: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    Outcome::Ran
}
