//! The mtrdma coordinator: keeps the shared quota table of a host.
//!
//! It creates the table from a TOML policy file (see `examples/policy.toml`),
//! accepts tenant registrations on a Unix socket (a process's tenant comes
//! from its uid, gid and cgroup, never from what it says), recomputes
//! weighted max-min fair rates of the link among tenants with demand,
//! returns the resources of processes that died, reloads the policy on
//! SIGHUP or when the file changes, and prints a per-tenant view every
//! second (headed by the link estimate it publishes for the tenants'
//! delay windows and the share of bytes the windows judged over their
//! target; per tenant, the gain it sets on the windows' growth so that
//! tenants in separate processes share the link by their weights).
//! SIGINT or SIGTERM stops it and removes the table.
//!
//! With `--monitor` it also loads the kernel monitor
//! (`mtrdma::core::monitor::KernelMonitor`, root and kprobes needed; without
//! them it says why and runs on without it): every second, next to each
//! tenant's admitted queue pairs and region bytes, what the kernel saw its
//! processes hold; a line for each tenant that made queue pairs or regions
//! in the last second (`kernel: tenant ... made N queue pairs/s`); and a
//! line when a tenant's processes hold more than mtrdma admitted
//! (`BYPASS:`) or a process of no tenant holds verbs objects
//! (`UNATTRIBUTED:`); and a line whenever the one-piece floor
//! (`mtrdma::sched::piece_floor`) is given to more or fewer tenants
//! (`one-piece floor: given to N of M windowed tenants (K steps taken
//! back) at S s`, S the seconds since the coordinator started). These lines
//! come with `--quiet` too.
//!
//! With `--etcd ENDPOINTS` it joins the coordinators of other hosts through
//! etcd (`mtrdma::core::cluster::etcd`): it applies the cluster's policy
//! from etcd within a second of a change (the `--policy` file is the policy
//! until etcd gives one), publishes what its tenants want under a lease
//! that ends with it, and holds each cluster-wide tenant to its host's
//! share of the tenant's `cluster_cap` (or of `[cluster] capacity`). Without
//! etcd it keeps its last policy and shares and says so (`etcd lost: ...`).
//! With `--etcd-cache FILE` it keeps etcd's last policy there, and one
//! started while etcd is away starts from it rather than from `--policy`.
//!
//! ```text
//! cargo run --release --example coordinator -- --policy examples/policy.toml
//!     [--table NAME] [--socket PATH] [--capacity N (tenants)] [--processes N (per tenant)] [--quiet]
//!     [--no-window-gains] [--no-piece-floor] [--monitor]
//!     [--etcd URL,URL,... [--etcd-prefix /mtrdma/] [--host NAME] [--etcd-ttl SECONDS]
//!      [--etcd-cache FILE]]
//! cargo run --example coordinator -- put-policy FILE --etcd URL,... [--etcd-prefix P]
//! cargo run --example coordinator -- hosts --etcd URL,... [--etcd-prefix P]
//! ```
//!
//! `put-policy` checks a policy file and makes it the cluster's; `hosts`
//! shows what every host reports: the policy revision it applies, and per
//! cluster-wide tenant what it wants there and the share it gives it.
//!
//! Tenant processes then call `mtrdma::core::coordinator::register(socket)`.

#[path = "shared/args.rs"]
mod args;

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mtrdma::core::cluster::etcd::{self, Cluster, ClusterNews, EtcdConfig};
use mtrdma::core::cluster::ALL;
use mtrdma::core::coordinator::{Coordinator, CoordinatorConfig, LinkView};
use mtrdma::core::monitor::{CgroupPaths, KernelCounts, KernelMonitor, KernelView};
use mtrdma::core::table::TenantUsage;
use mtrdma::core::Policy;
use mtrdma::TenantId;

struct Args {
    config: CoordinatorConfig,
    quiet: bool,
    /// Whether to set gains on the tenants' delay windows (see
    /// `Coordinator::set_window_gains`).
    window_gains: bool,
    /// Whether to run the one-piece floor (see
    /// `Coordinator::set_piece_floor`).
    piece_floor: bool,
    /// Whether to load the kernel monitor.
    monitor: bool,
    /// Where to share with other hosts' coordinators.
    etcd: Option<EtcdConfig>,
}

/// This machine's host name.
fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_default()
}

/// `put-policy FILE` or `hosts`, with `--etcd` and `--etcd-prefix`.
fn command(name: &str, args: Vec<String>) -> Result<(), String> {
    let mut it = args::Args::from_args(args);
    let (mut file, mut endpoints, mut prefix) = (None, None, etcd::DEFAULT_PREFIX.to_string());
    while let Some(token) = it.next()? {
        match token {
            args::Token::Value(v) if name == "put-policy" && file.is_none() => file = Some(v),
            args::Token::Value(v) => return Err(format!("unexpected argument {v}")),
            args::Token::Flag(flag) => match flag.as_str() {
                "--etcd" => endpoints = Some(etcd::split_endpoints(&it.value(&flag)?)),
                "--etcd-prefix" => prefix = it.value(&flag)?,
                other => return Err(format!("unknown flag {other}")),
            },
        }
    }
    let endpoints = endpoints.ok_or("--etcd URL,... is required")?;
    if name == "put-policy" {
        let file = file.ok_or("put-policy FILE: the policy file is missing")?;
        let text = std::fs::read_to_string(&file).map_err(|e| format!("{file}: {e}"))?;
        let revision = etcd::put_policy(&endpoints, &prefix, &text).map_err(|e| e.to_string())?;
        println!("the cluster's policy is {file} (etcd revision {revision})");
        return Ok(());
    }
    let view = etcd::hosts(&endpoints, &prefix).map_err(|e| e.to_string())?;
    for why in &view.unreadable {
        println!("unreadable: {why}");
    }
    match &view.policy {
        None => println!("no policy in etcd under {prefix}: each host applies its own file"),
        Some((revision, Ok(_))) => println!("the cluster's policy: etcd revision {revision}"),
        Some((revision, Err(why))) => {
            println!("the cluster's policy at etcd revision {revision} is not valid: {why}")
        }
    }
    if view.reports.is_empty() {
        println!("no host reports under {prefix}");
    }
    for r in &view.reports {
        println!("host {}: policy revision {}", r.host, r.policy_revision);
        // Every host computes the same shares from the same reports: these
        // are the host's own, under etcd's policy.
        let shares = view.shares(&r.host);
        for (id, want) in &r.demands {
            let want = if *want == ALL {
                "all it can get".to_string()
            } else {
                format!("{:.1} Mbit/s", mbit(*want))
            };
            match shares.as_ref().map(|s| s.get(id).copied().unwrap_or(0)) {
                Some(share) => println!(
                    "  tenant {id}: wants {want}, share {:.1} Mbit/s",
                    mbit(share)
                ),
                None => println!("  tenant {id}: wants {want}"),
            }
        }
    }
    Ok(())
}

fn mbit(bytes_per_sec: u64) -> f64 {
    bytes_per_sec as f64 * 8.0 / 1e6
}

fn default_socket(table: &str) -> PathBuf {
    let dir = if rustix::process::geteuid().is_root() {
        PathBuf::from("/run/mtrdma")
    } else if let Some(runtime) = std::env::var_os("XDG_RUNTIME_DIR") {
        PathBuf::from(runtime)
    } else {
        std::env::temp_dir()
    };
    dir.join(format!("mtrdma-{table}.sock"))
}

fn parse() -> Result<Args, String> {
    let mut policy = None;
    let mut table = String::from("default");
    let mut socket = None;
    let (mut capacity, mut processes, mut quiet) = (64u32, 256u32, false);
    let mut window_gains = true;
    let mut piece_floor = true;
    let mut monitor = false;
    let (mut endpoints, mut prefix, mut host, mut ttl) = (None, None, None, None);
    let mut cache = None;
    let mut it = args::Args::from_env();
    while let Some(flag) = it.next_flag(|v| format!("unexpected argument {v}"))? {
        match flag.as_str() {
            "--policy" => policy = Some(PathBuf::from(it.value(&flag)?)),
            "--table" => table = it.value(&flag)?,
            "--socket" => socket = Some(PathBuf::from(it.value(&flag)?)),
            "--capacity" => capacity = it.parse(&flag)?,
            "--processes" => processes = it.parse(&flag)?,
            "--quiet" => quiet = true,
            "--no-window-gains" => window_gains = false,
            "--no-piece-floor" => piece_floor = false,
            "--monitor" => monitor = true,
            "--etcd" => endpoints = Some(it.value(&flag)?),
            "--etcd-prefix" => prefix = Some(it.value(&flag)?),
            "--host" => host = Some(it.value(&flag)?),
            "--etcd-ttl" => ttl = Some(it.parse(&flag)?),
            "--etcd-cache" => cache = Some(PathBuf::from(it.value(&flag)?)),
            other => return Err(format!("unknown flag {other}")),
        }
    }
    let etcd = match endpoints {
        Some(endpoints) => {
            let mut config = EtcdConfig::new(&endpoints, host.unwrap_or_else(host_name));
            config.prefix = prefix.unwrap_or(config.prefix);
            config.ttl_secs = ttl.unwrap_or(config.ttl_secs);
            config.cache = cache;
            Some(config)
        }
        None if prefix.is_some() || host.is_some() || ttl.is_some() || cache.is_some() => {
            return Err("--etcd-prefix, --host, --etcd-ttl and --etcd-cache go with --etcd".into())
        }
        None => None,
    };
    let policy_path = policy.ok_or("--policy FILE is required (see examples/policy.toml)")?;
    let socket = socket.unwrap_or_else(|| default_socket(&table));
    Ok(Args {
        config: CoordinatorConfig {
            table,
            socket,
            policy_path,
            capacity,
            processes,
        },
        quiet,
        window_gains,
        piece_floor,
        monitor,
        etcd,
    })
}

/// What a cluster step said, as lines.
fn print_news(news: &ClusterNews, cluster: &Cluster, policy: &Policy) {
    if news.connected {
        println!(
            "etcd: connected as {}, {} other hosts",
            cluster.member().host(),
            cluster.member().others().count()
        );
    }
    if let Some(why) = &news.lost {
        println!(
            "etcd lost ({why}): keeping the last policy and shares, trying again every second"
        );
    }
    if let Some(revision) = news.policy_applied {
        println!(
            "policy from etcd (revision {revision}) applied: {} tenants, {} limited across hosts",
            policy.tenants.len(),
            policy.cluster.tenants.len()
        );
    }
    if let Some(why) = &news.policy_refused {
        println!("{why}");
    }
    for why in &news.unreadable {
        println!("etcd: unreadable: {why}");
    }
    if let Some(why) = &news.cache_failed {
        println!("etcd: {why}");
    }
    if !news.hosts_changed.is_empty() {
        let others: Vec<&str> = cluster.member().others().map(|r| r.host.as_str()).collect();
        println!("etcd: other hosts now: {}", others.join(", "));
    }
}

fn gbps(bytes_per_sec: f64) -> f64 {
    bytes_per_sec * 8.0 / 1e9
}

fn print_view(
    usage: &[TenantUsage],
    last: &[TenantUsage],
    secs: f64,
    policy: &Policy,
    view: LinkView,
) {
    let link = policy.link.capacity_bytes_per_sec;
    println!("{}", policy.protection_summary());
    println!(
        "link estimate {:.3} Gb/s (the most the tenants moved together lately); \
         {:.0}% of their windows' bytes over target; one-piece floor given to {} of {} \
         windowed tenants ({} steps taken back)",
        gbps(view.estimate_bytes_per_sec as f64),
        100.0 * view.over_target,
        view.floor_granted,
        view.floor_senders,
        view.floor_withdrawals
    );
    println!(
        "{:>4} {:<16} {:<7} {:>9} {:>9} {:>6} {:>5} {:>11} {:>14} {:>10} {:>5}",
        "id",
        "name",
        "class",
        "sent Gb/s",
        "fair Gb/s",
        "share",
        "gain",
        "QPs",
        "MR MiB",
        "throttled",
        "procs"
    );
    for u in usage {
        // The counters are in memory the tenant writes: a counter that went
        // backwards moves nothing (and is said), never an underflow.
        let moved = last
            .iter()
            .find(|l| l.tenant == u.tenant)
            .map(|before| u.since(before))
            .unwrap_or_default();
        if moved.went_backwards {
            eprintln!("tenant {}: a counter went backwards", u.tenant.0);
        }
        let (sent, throttled) = (moved.bytes_posted, moved.throttled_ns);
        println!(
            "{:>4} {:<16} {:<7} {:>9.3} {:>9.3} {:>5.1}% {:>5.2} {:>5}/{:<5} {:>6}/{:<7} {:>8.1}ms {:>5}",
            u.tenant.0,
            u.name,
            u.class.to_string(),
            gbps(sent as f64 / secs),
            gbps(u.fair_rate as f64),
            100.0 * u.fair_rate as f64 / link.max(1) as f64,
            // The gain on its windows' growth (1: none published).
            if u.window_gain == 0 {
                1.0
            } else {
                u.window_gain as f64 / 1e6
            },
            u.qps.0,
            u.qps.1,
            u.mr_bytes.0 >> 20,
            u.mr_bytes.1 >> 20,
            throttled as f64 / 1e6 / secs,
            u.processes,
        );
    }
    println!();
}

/// The kernel monitor's side of the view: what each tenant's processes
/// hold and did in the last `secs`, bypasses and unattributed processes.
struct KernelReport {
    monitor: KernelMonitor,
    cgroups: CgroupPaths,
    last: HashMap<TenantId, KernelCounts>,
    /// Unattributed pids already said.
    said_unattributed: HashSet<u32>,
}

impl KernelReport {
    fn view(&mut self, coordinator: &mut Coordinator) -> Option<KernelView> {
        let monitor = &mut self.monitor;
        match coordinator.kernel_view(|| monitor.processes(), &mut self.cgroups) {
            Ok(view) => Some(view),
            Err(e) => {
                eprintln!("kernel monitor: {e}");
                None
            }
        }
    }

    /// Says each bypass and unattributed process once, when it is first
    /// seen, and which tenants made queue pairs or regions in the last
    /// `secs` (quiet or not).
    fn news(&mut self, view: &KernelView, secs: f64) {
        // The coordinator says each bypass once, when it begins.
        for b in &view.new_bypasses {
            println!("BYPASS: {b}");
        }
        for u in &view.unattributed {
            if u.counts.holds_any() && self.said_unattributed.insert(u.pid) {
                println!(
                    "UNATTRIBUTED: pid {} (uid {}, cgroup {}) holds {} queue pairs and {} region bytes and matches no tenant",
                    u.pid,
                    u.uid,
                    u.cgroup.as_deref().unwrap_or("(gone)"),
                    u.counts.qps_held(),
                    u.counts.mr_bytes_held()
                );
            }
        }
        for t in &view.tenants {
            let before = self.last.insert(t.tenant, t.kernel).unwrap_or_default();
            let d = t.kernel.since(&before);
            if d.qps_created > 0 || d.mrs_registered > 0 {
                println!(
                    "kernel: tenant {} ({}) made {:.1} queue pairs/s and {:.1} regions/s; holds {} queue pairs ({} admitted) and {} region bytes ({} admitted)",
                    t.tenant.0,
                    t.name,
                    d.qps_created as f64 / secs,
                    d.mrs_registered as f64 / secs,
                    t.kernel.qps_held(),
                    t.admitted_qps,
                    t.kernel.mr_bytes_held(),
                    t.admitted_mr_bytes
                );
            }
        }
    }

    fn print(&self, view: &KernelView) {
        println!("kernel monitor: what each tenant's processes hold (and what mtrdma admitted)");
        println!(
            "{:>4} {:<16} {:>13} {:>9} {:>17} {:>6}",
            "id", "name", "QPs held/adm", "to RTS", "MR MiB held/adm", "procs"
        );
        for t in &view.tenants {
            println!(
                "{:>4} {:<16} {:>6}/{:<6} {:>9} {:>8}/{:<8} {:>6}",
                t.tenant.0,
                t.name,
                t.kernel.qps_held(),
                t.admitted_qps,
                t.kernel.qps_to_rts,
                t.kernel.mr_bytes_held() >> 20,
                t.admitted_mr_bytes >> 20,
                t.processes.len()
            );
        }
        let strays = view
            .unattributed
            .iter()
            .filter(|u| u.counts.holds_any())
            .count();
        if strays > 0 {
            println!("kernel: {strays} processes of no tenant hold verbs objects");
        }
        println!();
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut argv = std::env::args().skip(1);
    if let Some(name) = argv.next().filter(|a| a == "put-policy" || a == "hosts") {
        return Ok(command(&name, argv.collect())?);
    }
    let args = parse()?;
    if let Some(dir) = args.config.socket.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let socket = args.config.socket.clone();
    let mut coordinator = Coordinator::start(args.config)?;
    coordinator.set_window_gains(args.window_gains);
    coordinator.set_piece_floor(args.piece_floor);
    let stop = Arc::new(AtomicBool::new(false));
    signal_hook::flag::register(signal_hook::consts::SIGINT, Arc::clone(&stop))?;
    signal_hook::flag::register(signal_hook::consts::SIGTERM, Arc::clone(&stop))?;
    signal_hook::flag::register(signal_hook::consts::SIGHUP, coordinator.reload_flag())?;
    println!(
        "mtrdma coordinator: table {:?}, {} tenants, registration socket {}\n{}",
        coordinator.table().name().unwrap_or("?"),
        coordinator.policy().tenants.len(),
        socket.display(),
        coordinator.policy().protection_summary()
    );

    let mut kernel = if args.monitor {
        match KernelMonitor::start() {
            Ok(monitor) => {
                println!("kernel monitor: attached");
                Some(KernelReport {
                    monitor,
                    cgroups: CgroupPaths::new(),
                    last: HashMap::new(),
                    said_unattributed: HashSet::new(),
                })
            }
            Err(e) => {
                println!("kernel monitor off: {e}");
                None
            }
        }
    } else {
        None
    };

    let mut cluster = match args.etcd {
        Some(config) => {
            println!(
                "etcd: joining {} as host {:?} under {}",
                config.endpoints.join(","),
                config.host,
                config.prefix
            );
            let mut cluster = Cluster::start(config)?;
            // The last policy etcd gave, kept: the limits to hold until
            // etcd answers.
            if let Some(kept) = cluster.take_kept_policy() {
                coordinator.apply_policy(kept)?;
                println!(
                    "policy kept from etcd (revision {}) applied until etcd answers",
                    cluster.policy_revision()
                );
            }
            Some(cluster)
        }
        None => None,
    };

    let mut last_print = Instant::now();
    let started = last_print;
    let mut last_usage = coordinator.usage();
    let mut last_floor = (0, 0);
    while !stop.load(Ordering::Acquire) {
        let now = coordinator.table().now_ns();
        let report = coordinator.tick(now);
        if let Some(cluster) = cluster.as_mut() {
            let news = cluster.step(&mut coordinator, now);
            print_news(&news, cluster, coordinator.policy());
        }
        for (slot, tenant) in &report.registered {
            println!(
                "registered a process as {tenant} (process slot {slot}) at {:.3} s",
                started.elapsed().as_secs_f64()
            );
        }
        for reason in &report.refused {
            println!("refused a registration: {reason}");
        }
        for r in &report.reclaimed {
            println!(
                "process {} of {} died: returned {} QPs and {} MR bytes",
                r.process.pid, r.tenant, r.qps, r.mr_bytes
            );
        }
        if report.reloaded {
            println!(
                "policy reloaded: {} tenants",
                coordinator.policy().tenants.len()
            );
        }
        if let Some(e) = report.reload_error {
            println!("policy reload failed, keeping the previous policy: {e}");
        }
        // Every change of the one-piece floor, also with --quiet.
        let link = coordinator.link_view();
        let floor = (link.floor_granted, link.floor_senders);
        if floor != last_floor && (floor.0 > 0 || last_floor.0 > 0) {
            println!(
                "one-piece floor: given to {} of {} windowed tenants ({} steps taken back) at {:.3} s",
                floor.0,
                floor.1,
                link.floor_withdrawals,
                started.elapsed().as_secs_f64()
            );
        }
        last_floor = floor;
        if last_print.elapsed() >= Duration::from_secs(1) {
            let secs = last_print.elapsed().as_secs_f64();
            let view = kernel.as_mut().and_then(|k| k.view(&mut coordinator));
            if let (Some(k), Some(view)) = (kernel.as_mut(), &view) {
                k.news(view, secs);
            }
            if !args.quiet {
                let usage = coordinator.usage();
                print_view(
                    &usage,
                    &last_usage,
                    secs,
                    coordinator.policy(),
                    coordinator.link_view(),
                );
                if let (Some(k), Some(view)) = (kernel.as_ref(), &view) {
                    k.print(view);
                }
                last_usage = usage;
            }
            last_print = Instant::now();
        }
        let interval = u64::from(coordinator.policy().link.recompute_interval_ms);
        coordinator.wait(Duration::from_millis(interval.max(1)));
    }
    if let Some(cluster) = cluster {
        cluster.leave();
    }
    println!("stopping: removing the table and the socket");
    coordinator.shutdown(true)?;
    Ok(())
}
