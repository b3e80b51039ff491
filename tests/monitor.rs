//! The kernel monitor (`mtrdma::core::monitor`) in the SoftRoCE VM: a
//! tenant that uses mtrdma and unregistered `ibv_rc_pingpong` processes
//! (raw verbs) side by side, each in a cgroup of its own; the monitor puts
//! every queue pair and region with the right cgroup and pid, counts each
//! once, and flags the raw ones (a bypass in a tenant's cgroup, an
//! unattributed process elsewhere). Ignored on a plain `cargo test`;
//! `cargo xtask test` runs it in the VM, as root.

use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use mtrdma::core::coordinator::{Coordinator, CoordinatorConfig};
use mtrdma::core::monitor::{
    CgroupPaths, KernelCounts, KernelMonitor, KernelView, MonitorError, ProcessCounts,
};
use mtrdma::TenantId;

// Its perftest row reader serves the other device tests.
mod common;
use common::example;

const CGROUP_ROOT: &str = "/sys/fs/cgroup";
const REGION: u64 = 64 << 10;

/// The device, or `None` where these tests cannot run: outside the VM
/// without a device, or not as root (inside the VM they must run).
fn device() -> Option<String> {
    let in_vm = std::env::var_os("MTRDMA_VM").is_some();
    let root = rustix::process::geteuid().is_root();
    match std::env::var("MTRDMA_TEST_DEVICE") {
        Ok(d) if root => Some(d),
        _ => {
            assert!(
                !in_vm,
                "inside the VM the monitor's tests run as root on rxe0"
            );
            eprintln!("skipped: the kernel monitor's tests need MTRDMA_TEST_DEVICE and root");
            None
        }
    }
}

/// A coordinator with tenants `good` and `raw`, each taking one cgroup
/// under this test's, and the cgroups (`stray` matches no tenant).
struct Setup {
    coordinator: Coordinator,
    socket: PathBuf,
    base: String,
    dir: PathBuf,
}

impl Setup {
    fn new(name: &str) -> Setup {
        let base = format!("/mtrdma-monitor-{name}-{}", std::process::id());
        for c in ["good", "raw", "stray"] {
            std::fs::create_dir_all(format!("{CGROUP_ROOT}{base}/{c}")).expect("make a cgroup");
        }
        let dir =
            std::env::temp_dir().join(format!("mtrdma-monitor-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let policy = dir.join("policy.toml");
        std::fs::write(
            &policy,
            format!(
                "[link]\ncapacity = \"100Gbit\"\n\
                 [[tenant]]\nid = 1\nname = \"good\"\n[[tenant.match]]\ncgroup = \"{base}/good\"\n\
                 [[tenant]]\nid = 2\nname = \"raw\"\n[[tenant.match]]\ncgroup = \"{base}/raw\"\n"
            ),
        )
        .unwrap();
        let socket = dir.join("coord.sock");
        let coordinator = Coordinator::start(CoordinatorConfig {
            table: format!("monitor-{name}-{}", std::process::id()),
            socket: socket.clone(),
            policy_path: policy,
            capacity: 8,
            processes: 16,
        })
        .expect("start a coordinator");
        Setup {
            coordinator,
            socket,
            base,
            dir,
        }
    }

    /// `program args` started inside cgroup `c` (it moves itself there
    /// before it becomes the program, so every object it makes is made
    /// there).
    fn spawn_in(&self, c: &str, program: &Path, args: &[&str]) -> Child {
        Command::new("sh")
            .arg("-c")
            .arg("echo $$ > \"$0\" && exec \"$@\"")
            .arg(format!("{CGROUP_ROOT}{}/{c}/cgroup.procs", self.base))
            .arg(program)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start a process in a cgroup")
    }

    /// `examples/control_path MODE --device DEVICE` as a tenant of this
    /// setup's coordinator, in cgroup `good`, with `extra` arguments.
    fn control_path(&self, mode: &str, device: &str, extra: &[&str]) -> Child {
        let socket = self.socket.display().to_string();
        let mut args = vec![mode, "--device", device, "--coordinator", &socket];
        args.extend_from_slice(extra);
        self.spawn_in("good", &example("control_path"), &args)
    }

    fn cgroup_id(&self, c: &str) -> u64 {
        std::fs::metadata(format!("{CGROUP_ROOT}{}/{c}", self.base))
            .unwrap()
            .ino()
    }

    /// Serves the coordinator until `done` says something or the time is
    /// up.
    fn serve_until<T>(&mut self, done: &mpsc::Receiver<T>, what: &str) -> T {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let now = self.coordinator.table().now_ns();
            self.coordinator.tick(now);
            if let Ok(v) = done.recv_timeout(Duration::from_millis(5)) {
                return v;
            }
            assert!(Instant::now() < deadline, "no {what} within 30 s");
        }
    }

    fn view(&mut self, monitor: &mut KernelMonitor) -> KernelView {
        let mut paths = CgroupPaths::new();
        self.coordinator
            .kernel_view(|| monitor.processes(), &mut paths)
            .expect("read the monitor")
    }
}

impl Drop for Setup {
    fn drop(&mut self) {
        for c in ["good", "raw", "stray"] {
            let _ = std::fs::remove_dir(format!("{CGROUP_ROOT}{}/{c}", self.base));
        }
        let _ = std::fs::remove_dir(format!("{CGROUP_ROOT}{}", self.base));
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// What the monitor counts for `pid` (every cgroup it was in).
fn counts_of(monitor: &mut KernelMonitor, pid: u32) -> (KernelCounts, Vec<u64>) {
    let mut sum = KernelCounts::default();
    let mut cgroups = Vec::new();
    for p in monitor.processes().expect("read the monitor") {
        if p.pid == pid {
            sum.add(&p.counts);
            cgroups.push(p.cgroup_id);
        }
    }
    (sum, cgroups)
}

/// Waits until `ok` holds for what the monitor counts for `pid`.
fn wait_for(
    monitor: &mut KernelMonitor,
    pid: u32,
    what: &str,
    ok: impl Fn(&KernelCounts) -> bool,
) -> KernelCounts {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (c, _) = counts_of(monitor, pid);
        if ok(&c) {
            return c;
        }
        assert!(
            Instant::now() < deadline,
            "pid {pid}: {what} within 30 s; counted {c:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn pingpong(setup: &Setup, c: &str, device: &str, port: u16, server: Option<&str>) -> Child {
    let port = port.to_string();
    let mut args = vec!["-d", device, "-g", "1", "-p", &port, "-n", "1000000"];
    args.extend(server);
    setup.spawn_in(c, Path::new("ibv_rc_pingpong"), &args)
}

/// The test device, a setup named `name` and the kernel monitor,
/// started; `None` where the monitor's tests cannot run (see [`device`]).
fn monitored(name: &str) -> Option<(String, Setup, KernelMonitor)> {
    let device = device()?;
    let setup = Setup::new(name);
    let monitor = KernelMonitor::start().expect("the kernel monitor starts in the VM");
    Some((device, setup, monitor))
}

#[test]
#[ignore = "needs a verbs device and root: cargo xtask test runs it in the SoftRoCE VM"]
fn the_monitor_puts_each_object_with_its_process_and_flags_the_raw_ones() {
    let Some((device, mut setup, mut monitor)) = monitored("attr") else {
        return;
    };

    // The tenant using mtrdma: registered, its objects admitted.
    let mut tenant = setup.control_path(
        "hold",
        &device,
        &[
            "--qps",
            "3",
            "--mrs",
            "2",
            "--mr-bytes",
            &REGION.to_string(),
        ],
    );
    let holding = common::lines_starting(tenant.stdout.take().unwrap(), "holding").0;
    let line = setup.serve_until(&holding, "tenant holding its objects");
    let tenant_pid = tenant.id();
    assert!(line.contains(&format!("pid={tenant_pid} ")), "{line}");

    // Raw verbs side by side: a ping-pong server in the raw tenant's
    // cgroup (never registered) and its client in a cgroup of no tenant.
    let port = 20_000 + (std::process::id() % 10_000) as u16;
    let mut server = pingpong(&setup, "raw", &device, port, None);
    common::wait_listening(&mut server, port, "ibv_rc_pingpong's server");
    let mut client = pingpong(&setup, "stray", &device, port, Some("127.0.0.1"));
    let (server_pid, client_pid) = (server.id(), client.id());
    for pid in [server_pid, client_pid] {
        // Created, registered, and connected (INIT, RTR, RTS).
        wait_for(&mut monitor, pid, "a connected queue pair", |c| {
            c.qps_to_rts == 1
        });
    }

    let view = setup.view(&mut monitor);
    let (t, cgroups) = counts_of(&mut monitor, tenant_pid);
    assert_eq!(
        cgroups,
        vec![setup.cgroup_id("good")],
        "the tenant's cgroup"
    );
    assert_eq!(
        (t.qps_created, t.qps_destroyed),
        (3, 0),
        "each queue pair once: {t:?}"
    );
    assert_eq!(
        (t.mrs_registered, t.mr_bytes_registered),
        (2, 2 * REGION),
        "each region once: {t:?}"
    );
    let good = view.tenant(TenantId(1)).unwrap();
    assert_eq!(good.processes, vec![tenant_pid]);
    assert_eq!((good.admitted_qps, good.admitted_mr_bytes), (3, 2 * REGION));
    assert_eq!(
        good.bypass(),
        None,
        "what mtrdma admitted is what the kernel holds"
    );

    for (pid, c) in [(server_pid, "raw"), (client_pid, "stray")] {
        let (k, cgroups) = counts_of(&mut monitor, pid);
        assert_eq!(cgroups, vec![setup.cgroup_id(c)], "pid {pid}'s cgroup");
        assert_eq!(
            (k.qps_created, k.qps_held(), k.qp_state_changes),
            (1, 1, 3),
            "{k:?}"
        );
        assert_eq!((k.mrs_registered, k.mrs_held()), (1, 1), "{k:?}");
        assert!(k.mr_bytes_held() >= 4096, "ibv_rc_pingpong's region: {k:?}");
    }
    let raw = view.tenant(TenantId(2)).unwrap();
    assert_eq!(raw.processes, vec![server_pid]);
    let bypass = raw
        .bypass()
        .expect("raw verbs in a tenant's cgroup are a bypass");
    assert_eq!((bypass.qps_held, bypass.qps_admitted), (1, 0));
    assert_eq!(bypass.unregistered, vec![server_pid]);
    assert_eq!(view.bypasses(), vec![bypass]);
    let stray: Vec<_> = view
        .unattributed
        .iter()
        .filter(|u| u.counts.holds_any())
        .collect();
    assert_eq!(stray.len(), 1, "{stray:?}");
    assert_eq!(stray[0].pid, client_pid);
    assert_eq!(
        stray[0].cgroup.as_deref(),
        Some(format!("{}/stray", setup.base).as_str())
    );

    // Everything ends: the tenant lets go, the raw ones are killed; each
    // object's end is counted once, for the process that made it.
    drop(tenant.stdin.take());
    for c in [&mut server, &mut client] {
        let _ = c.kill();
    }
    for c in [&mut tenant, &mut server, &mut client] {
        let _ = c.wait();
    }
    let t = wait_for(&mut monitor, tenant_pid, "its objects released", |c| {
        !c.holds_any()
    });
    assert_eq!(
        (t.qps_destroyed, t.mrs_released, t.mr_bytes_released),
        (3, 2, 2 * REGION)
    );
    for pid in [server_pid, client_pid] {
        let k = wait_for(&mut monitor, pid, "its objects released at exit", |c| {
            !c.holds_any()
        });
        assert_eq!((k.qps_destroyed, k.mrs_released), (1, 1), "{k:?}");
    }
    // Dead and reclaimed: nothing is left for a bypass.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !setup.view(&mut monitor).bypasses().is_empty() {
        assert!(Instant::now() < deadline, "a bypass outlived its processes");
        let now = setup.coordinator.table().now_ns();
        setup.coordinator.tick(now);
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
#[ignore = "needs a verbs device and root: cargo xtask test runs it in the SoftRoCE VM"]
fn a_storm_shows_in_the_monitors_counts_once_per_object() {
    let Some((device, mut setup, mut monitor)) = monitored("storm") else {
        return;
    };
    let before: Vec<ProcessCounts> = monitor.processes().unwrap();
    let count = 150u64;
    let mut storm = setup.control_path(
        "storm",
        &device,
        &[
            "--count",
            &count.to_string(),
            "--mr-bytes",
            &REGION.to_string(),
        ],
    );
    let done = common::lines_starting(storm.stdout.take().unwrap(), "storm").0;
    let line = setup.serve_until(&done, "the storm's end");
    drop(storm.stdin.take());
    assert!(storm.wait().unwrap().success(), "{line}");
    let pid = storm.id();
    assert!(before.iter().all(|p| p.pid != pid));
    let seconds: f64 = line
        .rsplit("seconds=")
        .next()
        .and_then(|s| s.trim().parse().ok())
        .expect("the storm says how long it took");
    let k = wait_for(&mut monitor, pid, "the storm's objects ended", |c| {
        c.qps_destroyed == count && c.mrs_released == count
    });
    assert_eq!(
        k,
        KernelCounts {
            qps_created: count,
            qps_destroyed: count,
            // mtrdma moves a new queue pair to INIT only.
            qp_state_changes: k.qp_state_changes,
            qps_to_rts: 0,
            mrs_registered: count,
            mrs_released: count,
            mr_bytes_registered: count * REGION,
            mr_bytes_released: count * REGION,
        }
    );
    assert!(k.qp_state_changes <= count, "{k:?}");
    // The rates the coordinator's view shows: objects per second of the
    // storm.
    let view = setup.view(&mut monitor);
    let good = view.tenant(TenantId(1)).unwrap();
    assert_eq!(good.kernel.qps_created, count);
    eprintln!(
        "storm: {count} queue pairs and {count} regions in {seconds:.2} s: {:.0} and {:.0} per second, as the monitor counted them",
        good.kernel.qps_created as f64 / seconds,
        good.kernel.mrs_registered as f64 / seconds
    );
    assert_eq!(good.bypass(), None);
    let _ = std::io::stderr().flush();
}

/// Where the kernel has no RDMA core to probe (this project's hosts: the
/// VM has it) or the caller may not load BPF programs, starting the
/// monitor is a clear error, never a panic, and the coordinator runs on
/// without it.
#[test]
fn without_the_rdma_core_or_privilege_the_monitor_says_why() {
    if Path::new("/sys/module/ib_uverbs").exists() && rustix::process::geteuid().is_root() {
        eprintln!("skipped: this kernel has ib_uverbs and we are root, so the monitor starts");
        return;
    }
    let err = KernelMonitor::start().expect_err("nothing to probe, or no privilege");
    let text = err.to_string();
    match err {
        MonitorError::Attach { function, .. } => {
            assert_eq!(function, "ib_create_qp_user", "the first probe: {text}");
            assert!(text.contains("ib_uverbs module loaded"), "{text}");
        }
        MonitorError::NotPermitted(_) => assert!(text.contains("needs root"), "{text}"),
        other => panic!("an unclear error: {other}"),
    }
}
