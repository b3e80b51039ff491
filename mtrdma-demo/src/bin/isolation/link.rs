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
mod cluster;
mod measure;
mod scenarios;
mod soak;
use crate::{figure_cell, lat, Args, Lat, Report, Way};
use measure::*;
use mtrdma::sched::stats::jain_index;
use mtrdma_demo::{probe_realtime_works, PROBE_PRIORITY};
use scenarios::*;

/// The cgroup every demo tenant's cgroup is created under.
const CGROUP_ROOT: &str = "/sys/fs/cgroup/mtrdma-demo";
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
    // one at 200 Mbit/s, with 64 (256 KiB) 1.001 in three runs of one boot.
    // The cap scenario judges the rate from the quota table's counters
    // over the measured seconds, after the burst is spent in the senders'
    // lead.
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
    /// Waits until its output holds `text` `count` times (a progress
    /// line), for at most `patience`; an error if it ends first.
    fn wait_said(&mut self, text: &str, count: usize, patience: Duration) -> Result<(), String> {
        let start = Instant::now();
        loop {
            let said = std::fs::read_to_string(&self.stdout).unwrap_or_default();
            if said.matches(text).count() >= count {
                return Ok(());
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                let err = std::fs::read_to_string(&self.stderr).unwrap_or_default();
                return Err(format!(
                    "{} ended ({status}) before {text:?}:\n{said}\n{err}",
                    self.name
                ));
            }
            if start.elapsed() > patience {
                return Err(format!(
                    "{}: no {text:?} (x{count}) after {patience:?}:\n{said}",
                    self.name
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

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
/// CPU take a while to start; a client that comes too early fails). With
/// `server`, the process that is to listen there: if it ends first, says
/// so with what it wrote on stderr.
fn wait_listening(port: u16, mut server: Option<&mut Proc>) -> Result<(), String> {
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
        if let Some(p) = server.as_deref_mut() {
            if let Ok(Some(status)) = p.child.try_wait() {
                let err = std::fs::read_to_string(&p.stderr).unwrap_or_default();
                return Err(format!(
                    "{} ended ({status}) before it listened on port {port}: {}",
                    p.name,
                    err.trim_end()
                ));
            }
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
    /// A port for a server of the run: the next of
    /// [`mtrdma_demo::SERVER_PORTS`] that no socket holds.
    fn port(&mut self) -> u16 {
        self.next_port = mtrdma_demo::next_free_port(self.next_port);
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
    let probe_realtime = probe_realtime_works("isolation");
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
        next_port: mtrdma_demo::SERVER_PORTS.start + (std::process::id() % 500) as u16 * 20,
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
            "cluster" => cluster::scenario_cluster(&mut site, r),
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
