//! The demo on the VM's shared link (`isolation --link`): every tenant is a
//! process of its own, in a cgroup of its own, registered with a running
//! `examples/coordinator` that decides its tenant from that cgroup, as
//! containers would be. Senders run on the link's sender device, their
//! servers on the receiver device, so every byte crosses the one shaped
//! queue (the NIC port) between them.
//!
//! The tenants are `perf` processes (the latency tenant: 16 B
//! WRITEs, an open-loop probe of one request every 500 us; bulk tenants:
//! `write_bw`), unmodified perftest `ib_write_bw` hogs, and this binary
//! itself as a control-path storm (`--storm-tenant`). "Unprotected" bulk
//! tenants post straight on their queue pairs; with mtrdma they post
//! through `ScheduledQueuePair` on its defaults, asking for nothing: the
//! policy's `latency_bound` (16 KiB unless `--latency-bound`) holds every
//! one of them to pieces of a quarter of it (4 KiB: one MTU of the link's
//! default, so that what a latency request finds ahead of it is counted in
//! packets, and each piece's completion carries as many bytes as a packet
//! can) under a delay window, which learns from its own pieces' completion
//! times how much it may keep in the NIC. Next to them the probe posts
//! through mtrdma too, as the latency tenant's scheduled queue pair: its
//! delays tell the coordinator how far the bulk tenants' windows may keep
//! a whole piece (`mtrdma::sched::piece_floor`). Nothing is shared between
//! the processes but the coordinator's table, and no link rate is entered
//! anywhere: the policy's link capacity is the NIC's nominal 100 Gbit/s.

use std::cell::RefCell;
use std::fmt::Write as _;
use std::fs::File;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::plot::{self, BarGroup, LatencySeries};
use crate::progress::Progress;

mod apps;
mod soak;
use crate::{lat, Args, Lat, Report, Way};
use mtrdma::sched::stats::jain_index;

/// The cgroup every demo tenant's cgroup is created under.
const CGROUP_ROOT: &str = "/sys/fs/cgroup/mtrdma-demo";
/// The latency probe's real-time CPU priority (`chrt -f`), the same in
/// every way it is measured (alone, unprotected, with mtrdma). On the
/// emulated host the NIC is software on the same two CPUs as eight or more
/// tenant processes; at normal priority the probe waits for a CPU for
/// milliseconds (its 500 us sleeps ended 0.8 ms late at the median and
/// 9 ms at p99 next to 8 bulk tenants with mtrdma), so its p99 measured
/// the CPU scheduler, not the link. A latency-critical service on such a
/// host gets a CPU of its own or a priority; the softirq threads that do
/// rxe's work run at the same priority (see the VM's link setup).
const PROBE_PRIORITY: &str = "50";
/// The capped tenant's burst, in pieces (see `policy_toml`).
const CAP_BURST_PIECES: u64 = 64;
/// The control-path storm's policy rate (QP creations and MR registrations
/// per second).
const STORM_RATE: u64 = 50;
/// The flooding attackers' work-request cap in the demo's policy (work
/// requests per second): a sixth of what the link carries in packets of
/// one 4 KiB MTU (1,017/s at 200 Mbit/s), at least 50. A fixed number of
/// MTU-sized datagrams would be a larger share of a slower link.
fn attack_wr_rate(link: &LinkSpec) -> u64 {
    (link.rate_bps / 8 / 4096 / 6).max(50)
}
/// Husky's criterion: next to an attacker, the victim keeps at least this
/// share of what it moves alone.
const VICTIM_KEEPS: f64 = 0.8;
/// Local ACK timeout exponent of every bulk sender (4.096 us x 2^20, about
/// 4 s): a sender behind a long queue would otherwise resend what is only
/// waiting.
const ACK_TIMEOUT: &str = "20";

/// Where the link is and what it carries.
pub(crate) struct LinkSpec {
    pub(crate) sender: String,
    pub(crate) receiver: String,
    /// The shaped rate in bits per second (what the bulk tenants' share is
    /// measured against; never given to a tenant).
    pub(crate) rate_bps: u64,
}

impl LinkSpec {
    /// From the environment `cargo xtask vm --link RATE` sets up.
    pub(crate) fn from_env() -> Result<LinkSpec, String> {
        let var = |k: &str| {
            std::env::var(k).map_err(|_| {
                format!("--link: {k} is not set (run it in `cargo xtask vm --link RATE`)")
            })
        };
        let rate_bps: u64 = var("MTRDMA_LINK_RATE_BPS")?
            .parse()
            .map_err(|e| format!("MTRDMA_LINK_RATE_BPS: {e}"))?;
        if rate_bps == 0 {
            return Err("--link needs a shaped link (`--link RATE`, not unshaped)".into());
        }
        Ok(LinkSpec {
            sender: var("MTRDMA_LINK_SENDER")?,
            receiver: var("MTRDMA_LINK_RECEIVER")?,
            rate_bps,
        })
    }

    /// The link's rate in perf's unit (MB/s, MB = 2^20 bytes).
    fn mib_per_sec(&self) -> f64 {
        self.rate_bps as f64 / 8.0 / 1_048_576.0
    }

    /// Microseconds 16 KiB take on the wire.
    fn us_for_16k(&self) -> f64 {
        16_384.0 * 8.0 / self.rate_bps as f64 * 1e6
    }
}

/// The policy file: one tenant per demo role, each matched by its cgroup.
fn policy_toml(args: &Args, link: &LinkSpec) -> String {
    let mut s = String::from(
        "# Written by the isolation demo. The link capacity is the NIC's nominal\n\
         # rate: the shaped link's rate is never told to anyone. Fair rates are\n\
         # recomputed every 20 ms: on the emulated CPU each wake-up of the\n\
         # coordinator costs about a quarter of a millisecond.\n\
         [link]\ncapacity = \"100Gbit\"\nrecompute_interval_ms = 20\n",
    );
    // What a latency request may find queued ahead of it: every mtrdma
    // bulk tenant is held to it, none asks.
    if let Some(bound) = args.latency_bound {
        let _ = writeln!(s, "latency_bound = {bound}");
    }
    let mut tenant = |id: u32, name: &str, extra: &str| {
        let _ = write!(
            s,
            "\n[[tenant]]\nid = {id}\nname = \"{name}\"\n{extra}\
             [[tenant.match]]\ncgroup = \"/mtrdma-demo/{name}\"\n"
        );
    };
    tenant(1, "latency", "class = \"latency\"\n");
    let most = args.bulk.iter().copied().max().unwrap_or(1).max(4);
    for i in 0..most {
        tenant(10 + i as u32, &format!("bulk{i}"), "");
    }
    for (i, (name, w)) in weighted(args).into_iter().enumerate() {
        tenant(70 + i as u32, &name, &format!("weight = {w}\n"));
    }
    // The cap's burst is 64 pieces: what a capped sender may make up after
    // a moment it could not post (its window held it, or on the emulated
    // host it waited for a CPU). With 8 pieces (32 KiB, 5 ms at the demo's
    // cap) the capped tenant kept 0.973 to 0.990 of its cap next to a free
    // one at 200 Mbit/s, with 64 (256 KiB) 1.001 in three runs of one boot;
    // over the demo's 9 s the burst can add at most half a percent.
    let cap = cap_bytes_per_sec(args, link);
    tenant(
        30,
        "capped",
        &format!(
            "rate = {{ rate = {cap}, burst = {} }}\n",
            args.chunk * CAP_BURST_PIECES
        ),
    );
    tenant(31, "free", "");
    // The applications scenario's RPC service (its server and clients)
    // and its pager.
    tenant(60, "rpc", "class = \"latency\"\n");
    tenant(61, "pager", "");
    tenant(50, "victim", "");
    tenant(
        51,
        "attacker",
        &format!(
            "wr_rate = {{ rate = {}, burst = 64 }}\n",
            attack_wr_rate(link)
        ),
    );
    tenant(
        40,
        "storm",
        &format!(
            "qp_create_rate = {{ rate = {STORM_RATE}, burst = 5 }}\n\
             mr_reg_rate = {{ rate = {STORM_RATE}, burst = 5 }}\n"
        ),
    );
    s
}

/// The capped tenant's cap in bytes per second: `--cap-share` of the link.
fn cap_bytes_per_sec(args: &Args, link: &LinkSpec) -> u64 {
    (link.rate_bps as f64 / 8.0 * args.cap_share).round() as u64
}

/// A running coordinator and the cgroups of the demo's tenants.
struct Site<'a> {
    args: &'a Args,
    link: &'a LinkSpec,
    /// Which scenario runs, and about how long is left.
    progress: &'a RefCell<Progress>,
    /// `target/PROFILE`, where the programs a scenario starts are found
    /// (see `programs.rs`).
    profile_dir: PathBuf,
    /// The scenario running, whose programs those are.
    scenario: String,
    socket: PathBuf,
    /// The coordinator's quota table, whose counters say what each
    /// registered tenant posted.
    table: String,
    /// The policy file the coordinator reads (and reloads when it changes).
    policy: PathBuf,
    coordinator: Child,
    coordinator_started: Instant,
    /// How many times the coordinator was killed and started again (the
    /// soak's faults).
    coordinator_restarts: usize,
    logs: PathBuf,
    next_port: u16,
    /// The sender device's network device.
    netdev: String,
    /// Whether the probe runs at [`PROBE_PRIORITY`] (`chrt` works here).
    probe_realtime: bool,
    /// The applications scenario's working set, in pages.
    pager_pages: u64,
}

/// A tenant process and where its output goes.
struct Proc {
    name: String,
    child: Child,
    stdout: PathBuf,
    stderr: PathBuf,
}

/// A tenant process left behind by a scenario that failed part-way is
/// stopped, so that it does not run into the next scenario's measurements.
impl Drop for Proc {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

impl Proc {
    fn wait(self) -> Result<String, String> {
        self.wait_tolerating(None)
    }

    /// Waits for it; a failure whose output contains `excuse` counts as
    /// success.
    fn wait_tolerating(mut self, excuse: Option<&str>) -> Result<String, String> {
        let status = self
            .child
            .wait()
            .map_err(|e| format!("waiting for {}: {e}", self.name))?;
        let out = std::fs::read_to_string(&self.stdout).unwrap_or_default();
        let err = std::fs::read_to_string(&self.stderr).unwrap_or_default();
        let excused = excuse.is_some_and(|e| out.contains(e) || err.contains(e));
        if !status.success() && !excused {
            return Err(format!(
                "{} failed ({status}); its output ({}):\n{out}{err}",
                self.name,
                self.stdout.display()
            ));
        }
        Ok(out)
    }
}

/// Waits until a TCP socket listens on `port` (servers on a busy emulated
/// CPU take a while to start; a client that comes too early fails).
fn wait_listening(port: u16) -> Result<(), String> {
    let want = format!(":{port:04X} ");
    let start = Instant::now();
    loop {
        let listening = ["/proc/net/tcp", "/proc/net/tcp6"].iter().any(|f| {
            std::fs::read_to_string(f).is_ok_and(|t| {
                t.lines().skip(1).any(|l| {
                    let cols: Vec<&str> = l.split_whitespace().collect();
                    // local_address is the 2nd column, the state (0A:
                    // LISTEN) the 4th.
                    cols.len() > 3 && format!("{} ", cols[1]).ends_with(&want) && cols[3] == "0A"
                })
            })
        });
        if listening {
            return Ok(());
        }
        if start.elapsed() > Duration::from_secs(20) {
            return Err(format!("no server listens on port {port} after 20 s"));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The network device under RDMA device `dev`'s port 1.
fn netdev_of(dev: &str) -> Result<String, String> {
    let dir = format!("/sys/class/infiniband/{dev}/ports/1/gid_attrs/ndevs");
    let entries = std::fs::read_dir(&dir).map_err(|e| format!("{dir}: {e}"))?;
    entries
        .filter_map(Result::ok)
        .find_map(|e| {
            std::fs::read_to_string(e.path())
                .ok()
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
        })
        .ok_or_else(|| format!("{dir}: no network device"))
}

/// The CPU time a process has used so far (from `/proc/PID/schedstat`).
fn cpu_time(pid: u32) -> Result<Duration, String> {
    let path = format!("/proc/{pid}/schedstat");
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{path}: {e}"))?;
    let ns: u64 = text
        .split_whitespace()
        .next()
        .and_then(|f| f.parse().ok())
        .ok_or_else(|| format!("{path}: no CPU time in {text:?}"))?;
    Ok(Duration::from_nanos(ns))
}

/// The demo's cgroup `name`, created if missing; the returned file moves
/// the process that writes "0" to it into the cgroup.
fn cgroup_procs(name: &str) -> Result<File, String> {
    let dir = Path::new(CGROUP_ROOT).join(name);
    std::fs::create_dir_all(&dir).map_err(|e| {
        format!(
            "creating the cgroup {} (the link demo runs as root on cgroup2): {e}",
            dir.display()
        )
    })?;
    let procs = dir.join("cgroup.procs");
    std::fs::OpenOptions::new()
        .write(true)
        .open(&procs)
        .map_err(|e| format!("{}: {e}", procs.display()))
}

impl Site<'_> {
    fn port(&mut self) -> u16 {
        self.next_port += 1;
        self.next_port
    }

    /// Starts `cmd` as the process `name` in the cgroup `cgroup` (if any),
    /// its output in files under the logs directory.
    fn spawn(&self, name: &str, cgroup: Option<&str>, mut cmd: Command) -> Result<Proc, String> {
        let stdout = self.logs.join(format!("{name}.out"));
        let stderr = self.logs.join(format!("{name}.err"));
        let file = |p: &Path| File::create(p).map_err(|e| format!("{}: {e}", p.display()));
        cmd.stdin(Stdio::null())
            .stdout(file(&stdout)?)
            .stderr(file(&stderr)?);
        if let Some(cgroup) = cgroup {
            let procs = cgroup_procs(cgroup)?;
            // SAFETY: the closure runs in the child between fork and exec;
            // it only calls write(2) on a file opened before the fork,
            // which is async-signal-safe and allocates nothing.
            unsafe {
                cmd.pre_exec(move || {
                    rustix::io::write(&procs, b"0")
                        .map(drop)
                        .map_err(std::io::Error::from)
                });
            }
        }
        let child = cmd
            .spawn()
            .map_err(|e| format!("starting {name} ({:?}): {e}", cmd.get_program()))?;
        Ok(Proc {
            name: name.to_string(),
            child,
            stdout,
            stderr,
        })
    }

    /// Bytes the sender's network device has sent.
    fn link_bytes(&self) -> Result<u64, String> {
        self.link_counter("tx_bytes")
    }

    /// One of the sender netdev's counters (`/sys/class/net/DEV/statistics`).
    fn link_counter(&self, name: &str) -> Result<u64, String> {
        let path = format!("/sys/class/net/{}/statistics/{name}", self.netdev);
        std::fs::read_to_string(&path)
            .map_err(|e| format!("{path}: {e}"))?
            .trim()
            .parse()
            .map_err(|e| format!("{path}: {e}"))
    }

    /// The program `name`, as the running scenario starts it: on the
    /// demo's list for it (`programs.rs`), and built.
    fn program(&self, name: &str) -> Result<PathBuf, String> {
        crate::programs::find(&self.profile_dir, &self.scenario, name)
    }

    /// Every program the list names for the running scenario is built:
    /// checked before the scenario starts anything.
    fn check_programs(&self) -> Result<(), String> {
        for p in crate::programs::PROGRAMS
            .iter()
            .filter(|p| p.scenarios.contains(&self.scenario.as_str()))
        {
            self.program(p.name)?;
        }
        Ok(())
    }

    fn perf(&self) -> Result<Command, String> {
        Ok(Command::new(self.program("perf")?))
    }

    /// A perf server on the receiver device.
    fn server(&mut self, name: &str) -> Result<(Proc, u16), String> {
        let port = self.port();
        let mut cmd = self.perf()?;
        cmd.args(["--server", "--device", &self.link.receiver, "-p"])
            .arg(port.to_string());
        Ok((self.spawn(&format!("{name}-server"), None, cmd)?, port))
    }

    /// A perf client on the sender device, in its tenant's cgroup.
    fn client(&self, name: &str, port: u16, args: &[String]) -> Result<Proc, String> {
        self.client_with(name, port, args, false)
    }

    /// [`Site::client`], at [`PROBE_PRIORITY`] if `realtime` (and `chrt`
    /// works here).
    fn client_with(
        &self,
        name: &str,
        port: u16,
        args: &[String],
        realtime: bool,
    ) -> Result<Proc, String> {
        self.client_env(name, port, args, realtime, false)
    }

    /// Puts `cmd` under the preload library, registering with the
    /// coordinator.
    fn preloaded(&self, cmd: &mut Command) -> Result<(), String> {
        cmd.env("LD_PRELOAD", self.program("mtrdma-preload")?)
            .env("MTRDMA_COORDINATOR", &self.socket);
        Ok(())
    }

    /// [`Site::client_with`], under the preload library if `preloaded`.
    fn client_env(
        &self,
        name: &str,
        port: u16,
        args: &[String],
        realtime: bool,
        preloaded: bool,
    ) -> Result<Proc, String> {
        let mut cmd = if realtime && self.probe_realtime && !self.args.probe_normal {
            let mut c = Command::new("chrt");
            c.args(["-f", PROBE_PRIORITY]).arg(self.program("perf")?);
            c
        } else {
            self.perf()?
        };
        cmd.args([
            "--connect",
            "127.0.0.1",
            "--device",
            &self.link.sender,
            "-p",
        ])
        .arg(port.to_string())
        .args(args);
        if preloaded {
            self.preloaded(&mut cmd)?;
        }
        self.spawn(name, Some(name), cmd)
    }

    /// One measurement: the latency probe (if `probe`), next to `bulk`
    /// (tenant cgroup, way) perf senders, `hogs` ib_write_bw senders and
    /// the storm (if `storm`, with or without mtrdma).
    fn measure(&mut self, tag: &str, run: &Run) -> Result<Measured, String> {
        println!("{}", self.progress.borrow_mut().measurement(tag));
        let secs = self.args.seconds;
        // The bulk senders run from a lead before the probe to a tail
        // after it.
        let lead = self.args.warmup.as_secs_f64();
        let bulk_secs = secs + 2.0 * lead;
        let logs = self.args.out.join("logs").join(tag);
        std::fs::create_dir_all(&logs).map_err(|e| format!("{}: {e}", logs.display()))?;
        self.logs = logs;
        let mut servers = Vec::new();
        let mut senders = Vec::new();
        let probe_port = if run.probe {
            let (s, port) = self.server("latency")?;
            servers.push(s);
            Some(port)
        } else {
            None
        };
        let mut bulk_ports = Vec::new();
        for (name, _) in &run.bulk {
            let (s, port) = self.server(name)?;
            servers.push(s);
            bulk_ports.push(port);
        }
        let mut hog_servers = Vec::new();
        for i in 0..run.hogs {
            let port = self.port();
            let mut cmd = Command::new("ib_write_bw");
            cmd.args(["-d", &self.link.receiver, "-x", "1", "-s", "1048576", "-p"])
                .arg(port.to_string())
                .args(["-D", &format!("{}", bulk_secs.ceil() as u64)]);
            hog_servers.push((self.spawn(&format!("hog{i}-server"), None, cmd)?, port));
        }
        let ports = probe_port
            .iter()
            .chain(&bulk_ports)
            .chain(hog_servers.iter().map(|(_, p)| p));
        for &port in ports {
            wait_listening(port)?;
        }
        for ((name, way), port) in run.bulk.iter().zip(&bulk_ports) {
            let csv = self.logs.join(format!("{name}.csv"));
            let size = match (way, run.plain_pieces) {
                (Way::Unprotected, Some((piece, _))) => piece as usize,
                _ => self.args.msg,
            };
            let mut a: Vec<String> = [
                "--test",
                "write_bw",
                "-s",
                &size.to_string(),
                "-D",
                &format!("{bulk_secs}"),
                "--wait",
                "--ack-timeout",
                ACK_TIMEOUT,
            ]
            .map(String::from)
            .to_vec();
            a.extend(["--csv".into(), csv.display().to_string()]);
            match way {
                Way::Mtrdma => {
                    // Two messages out: enough to keep the window fed, and
                    // what is queued when the time is up drains quickly.
                    // Nothing asks for protection: the policy's latency
                    // bound gives every tenant its pieces and window.
                    let pool_mib = (2 * self.args.msg).div_ceil(1 << 20).max(1);
                    a.extend(
                        [
                            "--path",
                            "mtrdma",
                            "--pool-mib",
                            &pool_mib.to_string(),
                            "--coordinator",
                            &self.socket.display().to_string(),
                        ]
                        .map(String::from),
                    );
                    // The window's own settings, only where asked for:
                    // overrides a tenant may give (tighter ones are kept).
                    // Without a bound, each tenant opts in (the control).
                    let opt_in = self.args.latency_bound.is_none();
                    if self.args.chunk_given || opt_in {
                        a.extend(["--chunk".into(), self.args.chunk.to_string()]);
                    }
                    if opt_in {
                        a.extend(["--pieces".into(), "64".into()]);
                    }
                    let tuned = opt_in
                        || self.args.window_target.is_some()
                        || self.args.window_floor_us.is_some()
                        || self.args.window_queue.is_some();
                    if tuned {
                        a.push("--window".into());
                    }
                    if let Some(ppm) = self.args.window_target {
                        a.extend(["--window-target".into(), ppm.to_string()]);
                    }
                    if let Some(us) = self.args.window_floor_us {
                        a.extend(["--window-floor".into(), us.to_string()]);
                    }
                    if let Some(bytes) = self.args.window_queue {
                        a.extend(["--window-queue".into(), bytes.to_string()]);
                    }
                }
                _ => {
                    a.extend(["--path".into(), "raw".into()]);
                    if let Some((_, depth)) = run.plain_pieces {
                        a.extend(["--tx-depth".into(), depth.to_string()]);
                    }
                }
            }
            senders.push((name.clone(), csv, self.client(name, *port, &a)?));
        }
        let mut hogs = Vec::new();
        for (i, (_, port)) in hog_servers.iter().enumerate() {
            let name = format!("hog{i}");
            let mut cmd = Command::new("ib_write_bw");
            cmd.args(["-d", &self.link.sender, "-x", "1", "-s", "1048576", "-p"])
                .arg(port.to_string())
                .args(["-D", &format!("{}", bulk_secs.ceil() as u64)])
                .args(["-u", ACK_TIMEOUT, "127.0.0.1"]);
            let cgroup = if run.preloaded {
                // The same program, a tenant: the bulk tenant's cgroup,
                // held to the policy's latency bound with nothing set.
                self.preloaded(&mut cmd)?;
                if self.args.chunk_given || self.args.latency_bound.is_none() {
                    cmd.env("MTRDMA_CHUNK", self.args.chunk.to_string());
                }
                if self.args.latency_bound.is_none() {
                    cmd.env("MTRDMA_WINDOW", "1").env("MTRDMA_PIECES", "64");
                }
                format!("bulk{i}")
            } else {
                name.clone()
            };
            hogs.push(self.spawn(&name, Some(&cgroup), cmd)?);
        }
        let flood = match run.flood {
            None => None,
            Some((kind, way)) => {
                let (server, port) = self.server("attacker")?;
                wait_listening(port)?;
                let csv = self.logs.join("attacker.csv");
                let mut a: Vec<String> = [
                    "--test",
                    kind.test(),
                    "-s",
                    "8",
                    "--tx-depth",
                    "64",
                    "-D",
                    &format!("{bulk_secs}"),
                    "--wait",
                    "--csv",
                    &csv.display().to_string(),
                ]
                .map(String::from)
                .to_vec();
                match way {
                    Way::Mtrdma => a.extend(
                        [
                            "--path",
                            "mtrdma",
                            "--coordinator",
                            &self.socket.display().to_string(),
                        ]
                        .map(String::from),
                    ),
                    _ => a.extend(["--path".into(), "raw".into()]),
                }
                Some((server, csv, self.client("attacker", port, &a)?))
            }
        };
        let storm = match run.storm {
            None => None,
            Some(way) => {
                let mut cmd = Command::new(self.program("isolation")?);
                cmd.args(["--storm-tenant", "--device", &self.link.sender, "--seconds"])
                    .arg(format!("{}", secs + 1.0));
                if run.rnr {
                    cmd.args(["--rnr", "--peer-device", &self.link.receiver]);
                }
                if run.mr_sweep {
                    cmd.arg("--mr-sweep");
                }
                if run.ud {
                    cmd.args(["--ud", "--peer-device", &self.link.receiver]);
                }
                if way == Way::Mtrdma {
                    cmd.arg("--coordinator").arg(&self.socket);
                }
                // The UD flood is the flooding tenant (its work-request
                // rate applies); the storms are the storm tenant.
                let tenant = if run.ud { "attacker" } else { "storm" };
                Some(self.spawn(tenant, Some(tenant), cmd)?)
            }
        };
        // The bulk tenants reach their pace before the probe starts.
        std::thread::sleep(if run.bulk.is_empty() && run.hogs == 0 {
            self.args.warmup.min(Duration::from_millis(200))
        } else {
            self.args.warmup
        });
        let mut measured = Measured::default();
        let counted = (self.link_bytes()?, Instant::now());
        let packets_before = self.link_counter("tx_packets")?;
        let posted_before = self.posted();
        if let Some(port) = probe_port {
            let samples = self.logs.join("latency.samples");
            let _ = std::fs::remove_file(&samples);
            // Next to bulk tenants with mtrdma the probe posts through
            // mtrdma too, as a latency-class tenant's scheduled queue pair
            // (its requests take the fast path): its delays with and
            // without the one-piece floor are the coordinator's evidence
            // (`mtrdma::sched::piece_floor`). Alone and next to
            // unprotected tenants it posts raw.
            let with_mtrdma = run.bulk.iter().any(|(_, way)| *way == Way::Mtrdma);
            let mut a: Vec<String> = [
                "--test",
                "write_comp_lat",
                "-s",
                "16",
                "-D",
                &format!("{secs}"),
                "--path",
                if with_mtrdma && !run.preloaded {
                    "mtrdma"
                } else {
                    "raw"
                },
                "--wait",
                "--interval",
                &self.args.probe_interval_us.to_string(),
                "--samples",
                &samples.display().to_string(),
            ]
            .map(String::from)
            .to_vec();
            if !run.preloaded {
                a.extend(["--coordinator".into(), self.socket.display().to_string()]);
            }
            // Under the preload library the probe registers through it, as
            // every other program there.
            self.client_env("latency", port, &a, true, run.preloaded)?
                .wait()?;
            measured.probe_us = read_samples(&samples)?;
            measured.probe_late_p99_us = std::fs::read_to_string(self.logs.join("latency.err"))
                .ok()
                .and_then(|e| late_p99_us(&e));
        } else {
            std::thread::sleep(Duration::from_secs_f64(secs));
        }
        let window = counted.1.elapsed().as_secs_f64();
        measured.link_mbps = (self.link_bytes()? - counted.0) as f64 / window / 1_048_576.0;
        measured.link_pps = (self.link_counter("tx_packets")? - packets_before) as f64 / window;
        let posted_after = self.posted();
        let preloaded_hogs = (0..run.hogs)
            .filter(|_| run.preloaded)
            .map(|i| (format!("bulk{i}"), Way::Mtrdma));
        for (name, way) in run.bulk.iter().cloned().chain(preloaded_hogs) {
            let bytes = posted_between(&posted_before, &posted_after, &name);
            if let (Way::Mtrdma, Some(bytes)) = (way, bytes) {
                let mbps = bytes as f64 / window / 1_048_576.0;
                measured.bulk_window.push((name, mbps));
            }
        }
        for (name, csv, p) in senders {
            p.wait()?;
            measured.bulk.push((name, bw_avg(&csv)?));
        }
        // perftest computes its report from CPU cycles and refuses to give
        // one when it cannot calibrate them (as on a busy emulated CPU):
        // the hogs' bytes are then counted on the link.
        for (i, h) in hogs.into_iter().enumerate() {
            let out = h.wait_tolerating(Some("Can't produce a report"))?;
            measured
                .bulk
                .push((format!("hog{i}"), perftest_bw(&out).unwrap_or(f64::NAN)));
        }
        if let Some(s) = storm {
            let out = s.wait()?;
            measured.storm = Some(parse_storm(&out)?);
        }
        if let Some((server, csv, client)) = flood {
            client.wait()?;
            server.wait()?;
            // MB/s of 8-byte requests, as requests per second.
            measured.flood_ops = Some(bw_avg(&csv)? * 1_048_576.0 / 8.0);
        }
        for s in servers {
            s.wait()?;
        }
        // A hog's server fails its last exchange when its client gave up
        // at the report (above); the transfer itself ran.
        for (s, _) in hog_servers {
            s.wait_tolerating(Some("Failed to exchange data between server and clients"))?;
        }
        Ok(measured)
    }
}

/// The bytes tenant `name` posted between two readings of
/// [`Site::posted`] (`None` if either reading lacks it).
fn posted_between(before: &[(String, u64)], after: &[(String, u64)], name: &str) -> Option<u64> {
    let of = |posted: &[(String, u64)]| posted.iter().find(|(n, _)| n == name).map(|&(_, b)| b);
    Some(of(after)?.saturating_sub(of(before)?))
}

impl Site<'_> {
    /// Bytes each registered tenant has posted so far, by name, from the
    /// coordinator's quota table (none if it cannot be read).
    fn posted(&self) -> Vec<(String, u64)> {
        mtrdma::core::QuotaTable::open(&self.table)
            .and_then(|t| t.usage())
            .map(|usage| {
                usage
                    .into_iter()
                    .map(|u| (u.name, u.bytes_posted))
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// Who runs in one measurement.
#[derive(Default)]
struct Run {
    probe: bool,
    /// (tenant, way) per perf bulk sender.
    bulk: Vec<(String, Way)>,
    hogs: usize,
    /// The hogs (and the probe with them) run under the preload library as
    /// tenants (`bulk0`..: delay windows), rather than unprotected.
    preloaded: bool,
    storm: Option<Way>,
    /// The storm is an RNR storm (SENDs to a peer that posts no receives).
    rnr: bool,
    /// The storm registers 1 KiB to 64 MiB in turn, each in a protection
    /// domain of its own.
    mr_sweep: bool,
    /// The storm process floods the receiver with UD datagrams, as the
    /// flooding tenant.
    ud: bool,
    /// A tenant flooding the link with 8-byte requests, with or without
    /// mtrdma.
    flood: Option<(Flood, Way)>,
    /// The unprotected bulk senders post requests of this many bytes with
    /// this many outstanding each (the control of plain senders of the
    /// protected tenants' piece size), instead of `--msg` with perf's
    /// default depth.
    plain_pieces: Option<(u64, u32)>,
}

/// What a flooding attacker posts: 8-byte RDMA WRITEs, READs or atomic
/// fetch-and-adds, as many as it can keep outstanding.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Flood {
    Writes,
    Reads,
    Atomics,
}

impl Flood {
    fn test(self) -> &'static str {
        match self {
            Flood::Writes => "write_bw",
            Flood::Reads => "read_bw",
            Flood::Atomics => "atomic_bw",
        }
    }
}

#[derive(Default)]
struct Measured {
    probe_us: Vec<f64>,
    /// (tenant, MB/s with MB = 2^20 bytes) per bulk sender: its own
    /// average over its run (perf's `bw_avg`).
    bulk: Vec<(String, f64)>,
    /// (tenant, MB/s) per bulk sender registered with the coordinator:
    /// what it posted in the measured window (after the bulk senders'
    /// start, while the probe ran), from the quota table's counters. All
    /// the tenants over the same seconds, unlike their own averages, whose
    /// runs start one after another.
    bulk_window: Vec<(String, f64)>,
    /// (operations done, refused, seconds) of the storm.
    storm: Option<(u64, u64, f64)>,
    /// The flooding attacker's requests per second (its own average).
    flood_ops: Option<f64>,
    /// What left the sender's network device while the probe ran (MB/s,
    /// headers included).
    link_mbps: f64,
    /// Packets that left it then, per second.
    link_pps: f64,
    /// How late the probe's sleeps between requests ended, p99 (us):
    /// the share of its latency that is the host's CPUs, not the link
    /// (perf says it on stderr).
    probe_late_p99_us: Option<f64>,
}

/// The p99 of how late a perf probe's sleeps ended, from its stderr
/// ("perf: N sleeps between requests ended late by p50 X us, p99 Y us").
fn late_p99_us(stderr: &str) -> Option<f64> {
    let line = stderr
        .lines()
        .find(|l| l.contains("sleeps between requests ended late by"))?;
    let (_, rest) = line.split_once("p99 ")?;
    rest.split_whitespace().next()?.parse().ok()
}

impl Measured {
    /// The bulk senders' own averages over their runs, added up.
    fn bulk_total(&self) -> f64 {
        self.bulk.iter().map(|(_, v)| v).sum()
    }

    /// What the `n` bulk senders moved together while the probe ran: from
    /// the quota table's counters if all of them are registered, else
    /// their own averages over their runs.
    fn bulk_rate(&self, n: usize) -> f64 {
        if n > 0 && self.bulk_window.len() == n {
            self.bulk_window.iter().map(|(_, v)| v).sum()
        } else {
            self.bulk_total()
        }
    }
}

fn read_samples(path: &Path) -> Result<Vec<f64>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            l.trim()
                .parse::<f64>()
                .map_err(|e| format!("{}: {l:?}: {e}", path.display()))
        })
        .collect()
}

/// `bw_avg_MBps` of the last line of a perf CSV file.
fn bw_avg(path: &Path) -> Result<f64, String> {
    csv_field(path, "bw_avg_MBps")
}

/// Column `name` of the last data row of a CSV file (perf appends a row
/// a run; the pager and the RPC service write one).
fn csv_field(path: &Path, name: &str) -> Result<f64, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().unwrap_or_default().split(',').collect();
    let col = header
        .iter()
        .position(|h| *h == name)
        .ok_or_else(|| format!("{}: no {name} column", path.display()))?;
    lines
        .last()
        .and_then(|l| l.split(',').nth(col))
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| format!("{}: no {name} value", path.display()))
}

/// BW average (MB/s) from ib_write_bw's result row.
fn perftest_bw(out: &str) -> Result<f64, String> {
    let mut lines = out.lines().skip_while(|l| !l.contains("#bytes"));
    lines.next();
    lines
        .filter_map(|l| {
            l.split_whitespace()
                .map(str::parse::<f64>)
                .collect::<Result<Vec<_>, _>>()
                .ok()
        })
        .find(|r| r.len() >= 5)
        .map(|r| r[3])
        .ok_or_else(|| format!("no result row in ib_write_bw's output:\n{out}"))
}

/// The storm tenant's one line: `storm: OK ok, REFUSED refused in SECS s`.
fn parse_storm(out: &str) -> Result<(u64, u64, f64), String> {
    let line = out
        .lines()
        .find(|l| l.starts_with("storm:"))
        .ok_or_else(|| format!("no storm line in:\n{out}"))?;
    let nums: Vec<f64> = line
        .split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect();
    match nums[..] {
        [ok, refused, secs] => Ok((ok as u64, refused as u64, secs)),
        _ => Err(format!("a storm line that does not parse: {line:?}")),
    }
}

/// Percentiles with p99.9 only over enough samples.
fn cells(l: &Lat) -> (String, String, String) {
    (
        format!("{:.1}", l.p50),
        format!("{:.1}", l.p99),
        l.p999_cell(),
    )
}

fn latency_figures(r: &mut Report, scenario: &str, way: Way, case: &str, l: &Lat) {
    for (k, v) in l.figures() {
        r.figure(scenario, way, case, "latency", k, v);
    }
    r.figure(scenario, way, case, "latency", "samples", l.n as f64);
}

/// A target's verdict line.
fn verdict(ok: bool) -> &'static str {
    if ok {
        "met"
    } else {
        "NOT met"
    }
}

fn scenario_latency(site: &mut Site<'_>, r: &mut Report) -> Result<(), String> {
    let (args, link) = (site.args, site.link);
    r.say(format!(
        "\n== latency tenant (16 B WRITE every {} us) next to bulk tenants ({} B WRITEs), each a process ==",
        args.probe_interval_us, args.msg
    ));
    let alone = site.measure(
        "latency-alone",
        &Run {
            probe: true,
            ..Run::default()
        },
    )?;
    let a = lat(&alone.probe_us);
    let bound = a.p99 + link.us_for_16k();
    r.say(format!(
        "{:>4} {:<12} {:>9} {:>9} {:>10} {:>9} {:>10} {:>9} {:>8} {:>12}",
        "bulk",
        "way",
        "p50 us",
        "p99 us",
        "p99.9 us",
        "p99/alone",
        "bulk MB/s",
        "of link",
        "samples",
        "late p99 us"
    ));
    r.say(
        "(bulk MB/s: with mtrdma what the bulk tenants posted while the probe ran, from the \
         quota table's counters; unprotected tenants are not registered: their own averages over \
         their runs; late p99: how late the probe's sleeps between requests ended, the host's \
         CPUs' share of its latency, not the link's)",
    );
    let row = |r: &mut Report, n: usize, way: &str, l: &Lat, bulk: f64, late: Option<f64>| {
        let (p50, p99, p999) = cells(l);
        r.say(format!(
            "{n:>4} {way:<12} {p50:>9} {p99:>9} {p999:>10} {:>9.2} {bulk:>10.2} {:>8.1}% {:>8} {:>12}",
            l.p99 / a.p99,
            100.0 * bulk / link.mib_per_sec(),
            l.n,
            late.map_or("-".to_string(), |us| format!("{us:.0}"))
        ));
    };
    row(r, 0, "alone", &a, 0.0, alone.probe_late_p99_us);
    latency_figures(r, "link_latency", Way::Alone, "0", &a);
    r.keep_samples("link_latency", Way::Alone, "0", &alone.probe_us);
    let mut bars = Vec::new();
    let mut verdicts = Vec::new();
    let mut cdf = vec![LatencySeries {
        label: "alone".into(),
        samples_us: alone.probe_us.clone(),
    }];
    for &n in &args.bulk {
        let mut p99 = vec![a.p99];
        let (mut share, mut wire) = (0.0, 0.0);
        for way in [Way::Unprotected, Way::Mtrdma] {
            let run = Run {
                probe: true,
                bulk: (0..n).map(|i| (format!("bulk{i}"), way)).collect(),
                ..Run::default()
            };
            let m = site.measure(&format!("latency-{n}-{}", way.name()), &run)?;
            let l = lat(&m.probe_us);
            let bulk = m.bulk_rate(n);
            row(r, n, way.name(), &l, bulk, m.probe_late_p99_us);
            if let Some(late) = m.probe_late_p99_us {
                r.figure(
                    "link_latency",
                    way,
                    &n.to_string(),
                    "latency",
                    "late_p99_us",
                    late,
                );
            }
            let case = n.to_string();
            latency_figures(r, "link_latency", way, &case, &l);
            r.figure("link_latency", way, &case, "bulk", "mbps_total", bulk);
            r.figure(
                "link_latency",
                way,
                &case,
                "bulk",
                "mbps_total_own_runs",
                m.bulk_total(),
            );
            r.figure("link_latency", way, &case, "link", "mbps", m.link_mbps);
            r.keep_samples("link_latency", way, &case, &m.probe_us);
            p99.push(l.p99);
            share = bulk / link.mib_per_sec();
            wire = m.link_mbps;
            if Some(&n) == args.bulk.iter().max() {
                cdf.push(LatencySeries {
                    label: format!("{} ({n} bulk)", way.name()),
                    samples_us: m.probe_us,
                });
            }
        }
        // The control: plain senders of the protected tenants' piece size
        // next to the same probe, in the same boot. Where they move less
        // than 95% of the link (what ib_write_bw of that size fills alone
        // at the rate the demo runs at), the host's CPUs, not the design,
        // hold the pieces back, and the target is 0.9x what they move
        // (85% of a link they would fill).
        let control = if args.control_depth > 0 {
            let run = Run {
                probe: true,
                bulk: (0..n)
                    .map(|i| (format!("bulk{i}"), Way::Unprotected))
                    .collect(),
                plain_pieces: Some((args.chunk, args.control_depth)),
                ..Run::default()
            };
            let m = site.measure(&format!("latency-{n}-control"), &run)?;
            let l = lat(&m.probe_us);
            let bulk = m.bulk_rate(n);
            // A bound under 4 KiB gives pieces that are not whole KiB.
            let piece = if args.chunk % 1024 == 0 {
                format!("{}K", args.chunk >> 10)
            } else {
                format!("{}B", args.chunk)
            };
            let label = format!("plain {piece} x{}", args.control_depth);
            row(r, n, &label, &l, bulk, m.probe_late_p99_us);
            let case = n.to_string();
            r.figure(
                "link_latency",
                Way::Unprotected,
                &case,
                "control",
                "mbps_total",
                bulk,
            );
            r.figure(
                "link_latency",
                Way::Unprotected,
                &case,
                "control",
                "p99_us",
                l.p99,
            );
            r.figure(
                "link_latency",
                Way::Unprotected,
                &case,
                "control",
                "link_mbps",
                m.link_mbps,
            );
            Some((bulk / link.mib_per_sec(), m.link_mbps))
        } else {
            None
        };
        let (unprot, ours) = (p99[1], p99[2]);
        let mut v = format!(
            "  {n} bulk: mtrdma p99 {ours:.0} us vs bound {bound:.0} us (alone + 16 KiB at the link rate): {}; bulk with mtrdma {:.0}% of the link",
            verdict(ours <= bound),
            100.0 * share,
        );
        match control {
            // Against the control, both are counted over the same seconds
            // by the same counter: the bytes that left the sender's
            // network device while the probe ran (the probe's own and the
            // headers included, alike in both runs). The tenants' own
            // figures cover different spans: the quota table's counters
            // while the probe ran for mtrdma, the senders' averages over
            // their whole runs for the plain control (which start before
            // the probe and can exceed the link).
            Some((c, c_wire)) => {
                let ratio = if c_wire > 0.0 { wire / c_wire } else { 0.0 };
                let c_link = c_wire / link.mib_per_sec();
                let _ = write!(
                    v,
                    " ({ratio:.2}x the control on the wire while the probe ran, {wire:.1} against {c_wire:.1} MB/s; the control filled {:.0}% of the link on the wire, {:.0}% by its own average",
                    100.0 * c_link,
                    100.0 * c
                );
                if c_link < 0.95 {
                    let _ = write!(
                        v,
                        "; target 85% of the link or 0.9x the control): {}",
                        verdict(share >= 0.85 || ratio >= 0.9)
                    );
                } else {
                    let _ = write!(v, "; target 85%): {}", verdict(share >= 0.85));
                }
            }
            None => {
                let _ = write!(v, " (target 85%): {}", verdict(share >= 0.85));
            }
        }
        if n >= 4 {
            let _ = write!(
                v,
                "; unprotected/mtrdma p99 {:.1}x (target 10x): {}",
                unprot / ours,
                verdict(unprot >= 10.0 * ours)
            );
        }
        if n == 4 {
            let _ = write!(
                v,
                "; unprotected/alone p99 {:.1}x (the problem, target 20x): {}",
                unprot / a.p99,
                verdict(unprot >= 20.0 * a.p99)
            );
        }
        verdicts.push(v);
        bars.push(BarGroup {
            label: format!("{n} bulk"),
            values: p99,
        });
    }
    for v in verdicts {
        r.say(v);
    }
    let out = &args.out;
    plot::grouped_bars(
        &out.join("link_latency_p99"),
        "Latency tenant p99 next to bulk tenants (separate processes, shared link)",
        "p99 latency (us)",
        &["alone", "unprotected", "mtrdma"],
        &bars,
    )?;
    plot::latency_cdf(
        &out.join("link_latency_cdf"),
        "Latency tenant on the shared link: CDF of 16 B WRITE latency",
        &cdf,
    )
}

fn scenario_hogs(site: &mut Site<'_>, r: &mut Report) -> Result<(), String> {
    r.say(
        "\n== unmodified perftest: the latency tenant next to ib_write_bw hogs (1 MiB WRITEs); \
         unprotected, and with every sender under the preload library (libmtrdma_preload.so) as a tenant ==",
    );
    r.say(format!(
        "{:>4} {:<13} {:>9} {:>9} {:>10} {:>9} {:>10} {:>10} {:>8}",
        "hogs",
        "way",
        "p50 us",
        "p99 us",
        "p99.9 us",
        "p99/alone",
        "hogs MB/s",
        "link MB/s",
        "of link"
    ));
    r.say(
        "(hogs MB/s: under the library what the hogs posted while the probe ran, from the quota \
         table's counters; unprotected, perftest's own reports, or NaN where it gave none)",
    );
    let link = site.link.mib_per_sec();
    let mut alone_p99 = f64::NAN;
    let mut p99s = Vec::new();
    // Under the library next to 4 hogs only (the demo keeps to its 15
    // minutes; `isolation --link --scenarios hogs` is the same).
    let runs = [(0usize, false), (1, false), (4, false), (4, true)];
    for (n, preloaded) in runs {
        // Its own alone run first (0 hogs): the baseline of this scenario.
        let tag = if preloaded {
            format!("hogs-{n}-preload")
        } else {
            format!("hogs-{n}")
        };
        let m = site.measure(
            &tag,
            &Run {
                probe: true,
                hogs: n,
                preloaded,
                ..Run::default()
            },
        )?;
        let l = lat(&m.probe_us);
        if n == 0 {
            alone_p99 = l.p99;
        }
        let (mbps, linked) = (m.bulk_rate(n), m.link_mbps);
        let (p50, p99, p999) = cells(&l);
        let way = match (n, preloaded) {
            (0, _) => Way::Alone,
            (_, false) => Way::Unprotected,
            (_, true) => Way::Mtrdma,
        };
        let label = match way {
            Way::Alone => "alone",
            Way::Unprotected => "unprotected",
            Way::Mtrdma => "preloaded",
        };
        r.say(format!(
            "{n:>4} {label:<13} {p50:>9} {p99:>9} {p999:>10} {:>9.2} {mbps:>10.2} {linked:>10.2} {:>7.1}%",
            l.p99 / alone_p99,
            100.0 * mbps / link
        ));
        p99s.push((n, preloaded, l.p99, mbps));
        let case = n.to_string();
        latency_figures(r, "link_hogs", way, &case, &l);
        r.figure("link_hogs", way, &case, "hogs", "mbps_total", mbps);
        r.figure("link_hogs", way, &case, "link", "mbps", linked);
    }
    let bound = alone_p99 + site.link.us_for_16k();
    for &(n, _, p99, mbps) in p99s.iter().filter(|&&(n, p, _, _)| p && n > 0) {
        let unprotected = p99s
            .iter()
            .find(|&&(m, p, _, _)| m == n && !p)
            .map_or(f64::NAN, |x| x.2);
        r.say(format!(
            "  {n} hogs under the library: p99 {p99:.0} us vs bound {bound:.0} us (alone + 16 KiB at the link rate): {}; \
             hogs {:.0}% of the link (target 85%): {}; unprotected/preloaded p99 {:.1}x (target 10x): {}",
            verdict(p99 <= bound),
            100.0 * mbps / link,
            verdict(mbps >= 0.85 * link),
            unprotected / p99,
            verdict(unprotected / p99 >= 10.0)
        ));
    }
    Ok(())
}

/// The weights scenario's tenants: their policy names and weights
/// (`--weights`, default 1,2,4).
fn weighted(args: &Args) -> Vec<(String, u32)> {
    args.weights
        .iter()
        .enumerate()
        .map(|(i, &w)| (format!("weighted{i}"), w))
        .collect()
}

fn scenario_weights(site: &mut Site<'_>, r: &mut Report) -> Result<(), String> {
    let tenants = weighted(site.args);
    let sum: u32 = tenants.iter().map(|(_, w)| w).sum();
    let ratio = tenants
        .iter()
        .map(|(_, w)| w.to_string())
        .collect::<Vec<_>>()
        .join(":");
    r.say(format!(
        "\n== {} bulk tenants with weights {ratio}, each a process ==",
        tenants.len()
    ));
    let mut header = format!("{:<12}", "way");
    for (_, w) in &tenants {
        let _ = write!(header, " {:>9}", format!("w{w} MB/s"));
    }
    let want: Vec<String> = tenants
        .iter()
        .map(|(_, w)| format!("{:.3}", f64::from(*w) / f64::from(sum)))
        .collect();
    let _ = write!(header, " {:>10}  shares (want {})", "total", want.join(" "));
    r.say(header);
    r.say(
        "(mtrdma: what each tenant posted in the same measured seconds, from the quota table's \
         counters; unprotected tenants are not registered: each one's average over its own run; \
         Jain: of each tenant's rate over its weight)",
    );
    let mut groups: Vec<BarGroup> = tenants
        .iter()
        .map(|(name, w)| BarGroup {
            label: format!("{name} (weight {w})"),
            values: Vec::new(),
        })
        .collect();
    for way in [Way::Unprotected, Way::Mtrdma] {
        let run = Run {
            bulk: tenants
                .iter()
                .map(|(name, _)| (name.clone(), way))
                .collect(),
            ..Run::default()
        };
        let m = site.measure(&format!("weights-{}", way.name()), &run)?;
        // With mtrdma, what each tenant posted over the same seconds (the
        // quota table's counters); unprotected tenants are not registered,
        // so their own averages over their runs.
        let rates = if m.bulk_window.len() == run.bulk.len() {
            &m.bulk_window
        } else {
            &m.bulk
        };
        let total: f64 = rates.iter().map(|(_, x)| x).sum();
        let v: Vec<f64> = rates.iter().map(|(_, x)| *x).collect();
        let shares: Vec<f64> = v.iter().map(|x| x / total).collect();
        let worst = shares
            .iter()
            .zip(&tenants)
            .map(|(s, (_, w))| {
                let want = f64::from(*w) / f64::from(sum);
                (s - want).abs() / want
            })
            .fold(0.0, f64::max);
        let normalised: Vec<f64> = v
            .iter()
            .zip(&tenants)
            .map(|(x, (_, w))| x / f64::from(*w))
            .collect();
        let jain = jain_index(&normalised);
        let mut line = format!("{:<12}", way.name());
        for x in &v {
            let _ = write!(line, " {x:>9.2}");
        }
        let _ = write!(line, " {total:>10.2}  ");
        let _ = write!(
            line,
            "{}  (worst {:.0}% off, Jain {jain:.3}{})",
            shares
                .iter()
                .map(|s| format!("{s:.3}"))
                .collect::<Vec<_>>()
                .join(" "),
            100.0 * worst,
            if way == Way::Mtrdma {
                format!(
                    "; target 5% off: {}, Jain 0.99: {}",
                    verdict(worst <= 0.05),
                    verdict(jain >= 0.99)
                )
            } else {
                String::new()
            }
        );
        r.say(line);
        for ((name, x), g) in rates.iter().zip(&mut groups) {
            r.figure("link_weights", way, &ratio, name, "mbps", *x);
            g.values.push(*x);
        }
        // Each tenant's own average over its run, for comparison.
        for (name, x) in &m.bulk {
            r.figure("link_weights", way, &ratio, name, "mbps_own_run", *x);
        }
        r.figure(
            "link_weights",
            way,
            &ratio,
            "all",
            "worst_share_error",
            worst,
        );
        r.figure("link_weights", way, &ratio, "all", "jain", jain);
    }
    plot::grouped_bars(
        &site.args.out.join("link_weights"),
        &format!("Bulk tenants with weights {ratio} (separate processes, shared link)"),
        "MB/s",
        &["unprotected", "mtrdma"],
        &groups,
    )
}

fn scenario_cap(site: &mut Site<'_>, r: &mut Report) -> Result<(), String> {
    let cap = cap_bytes_per_sec(site.args, site.link) as f64 / 1_048_576.0;
    r.say(format!(
        "\n== a tenant capped at {cap:.2} MB/s ({:.0}% of the link) next to one running free ==",
        100.0 * site.args.cap_share
    ));
    r.say(format!(
        "{:<12} {:>12} {:>12} {:>14}",
        "way", "capped MB/s", "free MB/s", "capped / cap"
    ));
    for (label, runs) in [
        ("alone", vec![("capped", Way::Mtrdma)]),
        (
            "unprotected",
            vec![("capped", Way::Unprotected), ("free", Way::Unprotected)],
        ),
        (
            "mtrdma",
            vec![("capped", Way::Mtrdma), ("free", Way::Mtrdma)],
        ),
    ] {
        let run = Run {
            bulk: runs.iter().map(|(n, w)| (n.to_string(), *w)).collect(),
            ..Run::default()
        };
        let m = site.measure(&format!("cap-{label}"), &run)?;
        let capped = m.bulk[0].1;
        let free = m.bulk.get(1).map_or(f64::NAN, |b| b.1);
        let off = (capped / cap - 1.0).abs();
        r.say(format!(
            "{label:<12} {capped:>12.3} {free:>12.3} {:>14.3}{}",
            capped / cap,
            if label == "unprotected" {
                String::new()
            } else {
                format!("  (target within 2%: {})", verdict(off <= 0.02))
            }
        ));
        let way = match label {
            "alone" => Way::Alone,
            "unprotected" => Way::Unprotected,
            _ => Way::Mtrdma,
        };
        r.figure(
            "link_cap",
            way,
            &format!("{cap:.3}"),
            "capped",
            "mbps",
            capped,
        );
        if !free.is_nan() {
            r.figure("link_cap", way, &format!("{cap:.3}"), "free", "mbps", free);
        }
    }
    Ok(())
}

fn scenario_storm(site: &mut Site<'_>, r: &mut Report) -> Result<(), String> {
    r.say(format!(
        "\n== control-path storm (QP create/destroy, 64 KiB MR register/deregister) next to the latency tenant; policy: {STORM_RATE}/s each =="
    ));
    r.say(format!(
        "{:<12} {:>9} {:>9} {:>10} {:>12} {:>12}",
        "way", "p50 us", "p99 us", "p99.9 us", "storm ops/s", "refused/s"
    ));
    for way in [Way::Alone, Way::Unprotected, Way::Mtrdma] {
        let run = Run {
            probe: true,
            storm: (way != Way::Alone).then_some(way),
            ..Run::default()
        };
        let m = site.measure(&format!("storm-{}", way.name()), &run)?;
        let l = lat(&m.probe_us);
        let (p50, p99, p999) = cells(&l);
        let (ok, refused, secs) = m.storm.unwrap_or((0, 0, 1.0));
        let rate = ok as f64 / secs;
        // Each round trip of the storm is one QP creation and one MR
        // registration: the policy allows STORM_RATE of each per second.
        let want = 2.0 * STORM_RATE as f64;
        let note = if way == Way::Mtrdma {
            format!(
                "  (target within 5% of {want:.0}/s: {})",
                verdict((rate / want - 1.0).abs() <= 0.05)
            )
        } else {
            String::new()
        };
        r.say(format!(
            "{:<12} {p50:>9} {p99:>9} {p999:>10} {rate:>12.1} {:>12.1}{note}",
            way.name(),
            refused as f64 / secs
        ));
        latency_figures(r, "link_storm", way, "storm", &l);
        r.figure("link_storm", way, "storm", "storm", "ops_per_s", rate);
    }
    Ok(())
}

/// The adversarial table's attackers (its rows; each runs both ways).
const ATTACKERS: usize = 7;

/// The adversarial table: a victim bulk tenant next to each attacker,
/// unprotected and with mtrdma; an attacker passes when the victim keeps
/// at least [`VICTIM_KEEPS`] of what it moves alone (Husky's criterion),
/// from its own average over its run.
fn scenario_attack(site: &mut Site<'_>, r: &mut Report) -> Result<(), String> {
    r.say(format!(
        "\n== adversarial: a victim tenant ({} B WRITEs) next to each attacker; an attacker passes when the victim \
         keeps at least {VICTIM_KEEPS} of its throughput alone ==\n\
         (policy: the flooding attackers {} work requests/s, the storms {STORM_RATE} QP creations and \
         {STORM_RATE} MR registrations/s; the UD flood's op/s: datagrams of one MTU sent (the flooding tenant, to a \
         peer that posts no receives); the MR storm registers 1 KiB to 64 MiB in turn, each in a protection domain \
         of its own; the RNR storm's op/s: SENDs failed after their RNR retries; \
         victim MB/s: its own average over its run; link MB/s and packets/s: what left the sender's network \
         device, every tenant's traffic and headers)",
        site.args.msg,
        attack_wr_rate(site.link)
    ));
    r.say(format!(
        "{:<22} {:<12} {:>12} {:>9} {:>14} {:>10} {:>11}  {}",
        "attacker",
        "way",
        "victim MB/s",
        "of alone",
        "attacker op/s",
        "link MB/s",
        "link pkt/s",
        "verdict"
    ));
    let victim = |way| vec![("victim".to_string(), way)];
    let mut alone = [0.0f64; 2];
    for (i, way) in [Way::Unprotected, Way::Mtrdma].into_iter().enumerate() {
        let m = site.measure(
            &format!("attack-none-{}", way.name()),
            &Run {
                bulk: victim(way),
                ..Run::default()
            },
        )?;
        alone[i] = m.bulk[0].1;
        r.say(format!(
            "{:<22} {:<12} {:>12.2} {:>9.2} {:>14} {:>10.2} {:>11.0}  -",
            "(none)",
            way.name(),
            alone[i],
            1.0,
            "-",
            m.link_mbps,
            m.link_pps
        ));
        r.figure("link_attack", way, "none", "victim", "mbps", alone[i]);
    }
    // (label, tag, flood, storm): the storm process runs the attacks
    // without a flood.
    let storm = |rnr, mr_sweep, ud| Run {
        rnr,
        mr_sweep,
        ud,
        ..Run::default()
    };
    let attacks: [(&str, &str, Option<Flood>, Run); ATTACKERS] = [
        (
            "8 B WRITE flood",
            "write_flood",
            Some(Flood::Writes),
            Run::default(),
        ),
        (
            "8 B READ flood",
            "read_flood",
            Some(Flood::Reads),
            Run::default(),
        ),
        (
            "8 B atomic flood",
            "atomic_flood",
            Some(Flood::Atomics),
            Run::default(),
        ),
        ("UD flood", "ud_flood", None, storm(false, false, true)),
        ("QP/MR storm", "storm", None, storm(false, false, false)),
        (
            "MR 1K-64M storm",
            "mr_sweep_storm",
            None,
            storm(false, true, false),
        ),
        ("RNR storm", "rnr_storm", None, storm(true, false, false)),
    ];
    for (label, tag, flood, kind) in attacks {
        for (i, way) in [Way::Unprotected, Way::Mtrdma].into_iter().enumerate() {
            let run = Run {
                bulk: victim(way),
                flood: flood.map(|f| (f, way)),
                storm: flood.is_none().then_some(way),
                rnr: kind.rnr,
                mr_sweep: kind.mr_sweep,
                ud: kind.ud,
                ..Run::default()
            };
            let m = site.measure(&format!("attack-{tag}-{}", way.name()), &run)?;
            let got = m.bulk[0].1;
            let share = got / alone[i];
            let ops = match (m.flood_ops, m.storm) {
                (Some(ops), _) => ops,
                (None, Some((ok, _, secs))) => ok as f64 / secs,
                _ => f64::NAN,
            };
            r.say(format!(
                "{label:<22} {:<12} {got:>12.2} {share:>9.2} {ops:>14.0} {:>10.2} {:>11.0}  {}",
                way.name(),
                m.link_mbps,
                m.link_pps,
                if share >= VICTIM_KEEPS {
                    "pass"
                } else {
                    "FAIL"
                }
            ));
            r.figure("link_attack", way, tag, "victim", "mbps", got);
            r.figure("link_attack", way, tag, "victim", "share_of_alone", share);
            r.figure("link_attack", way, tag, "attacker", "ops_per_s", ops);
            r.figure("link_attack", way, tag, "link", "packets_per_s", m.link_pps);
        }
    }
    r.say(format!(
        "{:<22} {:<12} not reproducible on rxe: it keeps QP and MR contexts in host memory, with no NIC cache to thrash",
        "many QPs, many MRs", "-"
    ));
    Ok(())
}

/// The measurements link scenario `scenario` makes (for its progress;
/// see `progress.rs`): each [`Site::measure`], and each run of the
/// applications.
fn planned(scenario: &str, args: &Args) -> usize {
    match scenario {
        // Alone, then unprotected, mtrdma and (with a control depth) the
        // plain control next to each bulk count.
        "latency" => 1 + args.bulk.len() * (2 + usize::from(args.control_depth > 0)),
        // Alone, 1 and 4 hogs, 4 hogs under the preload library.
        "hogs" => 4,
        "weights" => 2,
        // cap: alone, unprotected, mtrdma; storm: the same.
        "cap" | "storm" => 3,
        // The victim alone both ways, then seven attackers both ways.
        "attack" => 2 + ATTACKERS * 2,
        // The pager alone, then the two applications alone, unprotected
        // and with mtrdma.
        "apps" => 4,
        // A check after every round.
        "soak" => soak::rounds(args.soak_seconds),
        _ => 0,
    }
}

/// Starts the coordinator `binary` on `policy`, keeping the table `table`
/// (taking it over if it exists) and listening on `socket`, its output in
/// `log`; returns once it says it started.
fn spawn_coordinator(
    binary: &Path,
    args: &Args,
    policy: &Path,
    table: &str,
    socket: &Path,
    log: &Path,
) -> Result<Child, String> {
    let mut cmd = Command::new(binary);
    cmd.arg("--policy")
        .arg(policy)
        .args(["--table", table])
        .arg("--socket")
        .arg(socket)
        .args((!args.coordinator_view).then_some("--quiet"))
        .args((!args.window_gains).then_some("--no-window-gains"))
        .args((!args.piece_floor).then_some("--no-piece-floor"))
        // With the coordinator's `--monitor` (isolation's
        // `--coordinator-monitor`) the kernel's view of every tenant's
        // queue pairs and regions: the storm's rates, and the unprotected
        // (unregistered) tenants flagged as bypassing. Off by default: it
        // costs the coordinator about 2% of an emulated core over the
        // demo (its view every second walks every process seen).
        .args(args.coordinator_monitor.then_some("--monitor"))
        .stdin(Stdio::null())
        .stdout(File::create(log).map_err(|e| format!("{}: {e}", log.display()))?)
        .stderr(Stdio::inherit());
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("starting {}: {e}", binary.display()))?;
    // Its first line says it listens (a restarted one finds the socket
    // file of the one before it, so the file says nothing).
    let started = Instant::now();
    loop {
        let said = std::fs::read_to_string(log).unwrap_or_default();
        if said.contains("mtrdma coordinator: table") {
            return Ok(child);
        }
        if let Ok(Some(status)) = child.try_wait() {
            return Err(format!(
                "the coordinator exited at start ({status}): {said}"
            ));
        }
        if started.elapsed() > Duration::from_secs(10) {
            let _ = child.kill();
            let _ = child.wait();
            return Err("the coordinator did not say it started within 10 s".into());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

impl Site<'_> {
    /// Starts the coordinator again (after the one before was killed), on
    /// the same table, socket and policy, its output in `log` under the
    /// logs directory.
    fn start_coordinator(&mut self, log: &str) -> Result<(), String> {
        let binary = self.program("coordinator")?;
        let log = self.args.out.join("logs").join(log);
        self.coordinator = spawn_coordinator(
            &binary,
            self.args,
            &self.policy,
            &self.table,
            &self.socket,
            &log,
        )?;
        self.coordinator_started = Instant::now();
        self.coordinator_restarts += 1;
        Ok(())
    }
}

/// Runs the link demo's scenarios; writes into `args.out`.
pub(crate) fn run(args: &Args, link: &LinkSpec, r: &mut Report) -> Result<(), String> {
    let me = std::env::current_exe().map_err(|e| format!("finding this binary: {e}"))?;
    // target/PROFILE/isolation -> target/PROFILE
    let profile_dir = me
        .parent()
        .ok_or("this binary is not in a target/PROFILE directory")?
        .to_path_buf();
    let coordinator = crate::programs::find(&profile_dir, "link", "coordinator")?;
    let policy = args.out.join("link-policy.toml");
    std::fs::write(&policy, policy_toml(args, link))
        .map_err(|e| format!("{}: {e}", policy.display()))?;
    let socket = std::env::temp_dir().join(format!("mtrdma-demo-{}.sock", std::process::id()));
    let table = format!("demo-{}", std::process::id());
    let logs = args.out.join("logs");
    std::fs::create_dir_all(&logs).map_err(|e| format!("{}: {e}", logs.display()))?;
    let child = spawn_coordinator(
        &coordinator,
        args,
        &policy,
        &table,
        &socket,
        &logs.join("coordinator.log"),
    )?;
    let started = Instant::now();
    let probe_realtime = Command::new("chrt")
        .args(["-f", PROBE_PRIORITY, "true"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !probe_realtime {
        eprintln!(
            "isolation: warning: cannot run the latency probe at real-time priority (chrt -f {PROBE_PRIORITY}); \
             its tail then measures the CPU scheduler as much as the link"
        );
    }
    r.say(format!(
        "\nmtrdma on the shared link: {} -> {} shaped to {:.0} Mbit/s ({:.2} MB/s); every tenant a process in its own cgroup, \
         registered with the coordinator; {} s per measurement; bulk with mtrdma: {} ({} B pieces{}){}; \
         the latency probe {} (through mtrdma as a latency-class queue pair next to bulk tenants with mtrdma, raw otherwise)",
        link.sender,
        link.receiver,
        link.rate_bps as f64 / 1e6,
        link.mib_per_sec(),
        args.seconds,
        match args.latency_bound {
            Some(b) => format!("on their defaults, held to the policy's latency_bound of {b} B"),
            None => "no latency bound; each opts in with a delay window".to_string(),
        },
        args.chunk,
        if args.chunk_given { ", asked for by --chunk" } else { "" },
        match (args.window_floor_us, args.window_queue) {
            (None, None) => String::new(),
            (floor, queue) => format!(
                ", queue floor {} us, queue {} B at the measured link rate",
                floor.map_or("default".to_string(), |us| us.to_string()),
                queue.map_or("default".to_string(), |b| b.to_string())
            ),
        } + if args.window_gains {
            ""
        } else {
            ", no window gains from the coordinator"
        } + if args.piece_floor {
            ""
        } else {
            ", no one-piece floor from the coordinator"
        },
        if args.probe_normal {
            "at normal CPU priority (--probe-priority normal) in every way".to_string()
        } else if probe_realtime {
            format!("at real-time CPU priority (chrt -f {PROBE_PRIORITY}) in every way")
        } else {
            "at normal CPU priority (chrt refused)".to_string()
        }
    ));
    let progress = RefCell::new(Progress::new(
        args.scenarios
            .iter()
            .map(|s| (s.clone(), planned(s, args)))
            .collect(),
        // The bulk senders' lead and tail, the probe's seconds, and the
        // tenants' start and exit.
        Duration::from_secs_f64(args.seconds + 5.0) + 2 * args.warmup,
    ));
    let mut site = Site {
        args,
        link,
        progress: &progress,
        profile_dir,
        scenario: String::new(),
        socket,
        table,
        policy,
        coordinator: child,
        coordinator_started: started,
        coordinator_restarts: 0,
        logs,
        next_port: 20_000 + (std::process::id() % 1_000) as u16 * 20,
        netdev: netdev_of(&link.sender)?,
        probe_realtime,
        pager_pages: apps::PAGER_WORKING_SET,
    };
    let ran = crate::run_scenarios(&args.out, &args.scenarios, r, &progress, |s, r| {
        site.scenario = s.to_string();
        site.check_programs()?;
        match s {
            "latency" => scenario_latency(&mut site, r),
            "hogs" => scenario_hogs(&mut site, r),
            "weights" => scenario_weights(&mut site, r),
            "cap" => scenario_cap(&mut site, r),
            "storm" => scenario_storm(&mut site, r),
            "attack" => scenario_attack(&mut site, r),
            "apps" => apps::scenario_apps(&mut site, r),
            "soak" => soak::scenario_soak(&mut site, r),
            _ => unreachable!("checked in parse"),
        }
    });
    let cpu = cpu_time(site.coordinator.id());
    let wall = site.coordinator_started.elapsed();
    let pid = rustix::process::Pid::from_raw(site.coordinator.id() as i32);
    if let Some(pid) = pid {
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
    }
    let _ = site.coordinator.wait();
    let cpu = cpu?;
    let share = cpu.as_secs_f64() / wall.as_secs_f64();
    if site.coordinator_restarts > 0 {
        // The last of several coordinators, from its start (which reads
        // the policy and takes the table over) to the end: not the
        // steady cost the target is about.
        r.say(format!(
            "\ncoordinator (restarted {} times; the last one): {:.2} s of CPU over {:.0} s ({:.2}% of one core)",
            site.coordinator_restarts,
            cpu.as_secs_f64(),
            wall.as_secs_f64(),
            100.0 * share
        ));
        return ran;
    }
    r.say(format!(
        "\ncoordinator: {:.2} s of CPU over {:.0} s ({:.2}% of one core; target under 5%: {})",
        cpu.as_secs_f64(),
        wall.as_secs_f64(),
        100.0 * share,
        verdict(share < 0.05)
    ));
    r.figure(
        "link",
        Way::Mtrdma,
        "all",
        "coordinator",
        "cpu_share",
        share,
    );
    if args.coordinator_monitor {
        r.say(monitor_summary(
            &args.out.join("logs").join("coordinator.log"),
        ));
    }
    ran
}

/// What the coordinator's kernel monitor said over the run, from its log:
/// the tenants it found holding more than mtrdma admitted (the
/// unprotected runs' processes, which never register), the processes of
/// no tenant, and the fastest creation of queue pairs it saw per tenant
/// (the storm's).
fn monitor_summary(log: &std::path::Path) -> String {
    let Ok(text) = std::fs::read_to_string(log) else {
        return format!("kernel monitor: no coordinator log at {}", log.display());
    };
    if let Some(off) = text.lines().find(|l| l.starts_with("kernel monitor off")) {
        return off.to_string();
    }
    let bypass: std::collections::BTreeSet<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("BYPASS: tenant "))
        .filter_map(|l| l.split(')').next())
        .collect();
    let strays = text
        .lines()
        .filter(|l| l.starts_with("UNATTRIBUTED:"))
        .count();
    let mut fastest: Vec<(String, f64)> = Vec::new();
    for l in text
        .lines()
        .filter_map(|l| l.strip_prefix("kernel: tenant "))
    {
        let name = l.split(" made ").next().unwrap_or("").to_string();
        let rate: f64 = l
            .split(" made ")
            .nth(1)
            .and_then(|r| r.split_whitespace().next())
            .and_then(|r| r.parse().ok())
            .unwrap_or(0.0);
        match fastest.iter_mut().find(|(n, _)| *n == name) {
            Some((_, r)) => *r = r.max(rate),
            None => fastest.push((name, rate)),
        }
    }
    let rates: Vec<String> = fastest
        .iter()
        .map(|(n, r)| format!("{n} {r:.0}/s"))
        .collect();
    format!(
        "kernel monitor (logs/coordinator.log): tenants whose processes held more than mtrdma admitted \
         (the unprotected runs): {}; processes of no tenant holding verbs objects: {strays}; \
         most queue pairs made in a second, by tenant: {}",
        if bypass.is_empty() {
            "none".to_string()
        } else {
            bypass.into_iter().map(|b| format!("{b})")).collect::<Vec<_>>().join(", ")
        },
        if rates.is_empty() {
            "none".to_string()
        } else {
            rates.join(", ")
        }
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_perf_csv_perftest_rows_and_the_storm_line() {
        let dir = std::env::temp_dir().join(format!("mtrdma-link-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let csv = dir.join("b.csv");
        std::fs::write(
            &csv,
            "test,path,device,tenant,tx_depth,chunk_bytes,pieces,bytes,iterations,bw_peak_MBps,bw_avg_MBps\n\
             write_bw,raw,rxa,-,128,65536,4,65536,100,20.0,18.5\n",
        )
        .unwrap();
        assert_eq!(bw_avg(&csv).unwrap(), 18.5);
        let bw = " #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]\n 1048576    100             24.74              19.62  \t\t   0.000314\n";
        assert_eq!(perftest_bw(bw).unwrap(), 19.62);
        assert!(perftest_bw("nothing").is_err());
        assert_eq!(
            parse_storm("storm: 120 ok, 30 refused in 6 s\n").unwrap(),
            (120, 30, 6.0)
        );
        assert!(parse_storm("storm: broken\n").is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
