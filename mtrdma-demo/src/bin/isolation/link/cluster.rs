//! Cluster-wide shares on the link (`--scenarios cluster`): each end of
//! the VM's link is a host with a coordinator of its own (`rxa`'s, and
//! one for processes on `rxb` sending back over the link, which is shaped
//! both ways), joined through a three-member etcd on loopback. The policy
//! is put into etcd and both coordinators apply it. Measured from each
//! host's quota table (the bytes its tenants posted over the same window):
//!
//! 1. one tenant under a cluster-wide cap, its sender on one host only,
//!    then on both: the host alone takes the whole cap, the two split it,
//!    and together they stay within 2% of it;
//! 2. two tenants of equal cluster weight, one on each host, sharing the
//!    cluster's capacity: Jain's index of what they moved (target 0.99);
//! 3. `rxb` lost with both senders running (its coordinator and sender
//!    killed): once its lease runs out, `rxa`'s sender has the whole cap.

use super::*;
use mtrdma::core::cluster::etcd::{self, LocalEtcd};

/// The lease of each host's report, seconds.
const TTL_SECS: u64 = 2;

/// One end of the link as a host: its coordinator and where its senders
/// send from and to.
struct Host {
    name: &'static str,
    /// The RDMA device its senders use, and their servers' (the other end).
    sender: String,
    receiver: String,
    socket: PathBuf,
    table: String,
    coordinator: Option<Proc>,
}

/// The policy of phase 1 and 3: tenant `shared`, whose processes are in
/// the cgroups `cluster-shared-rxa` and `-rxb`, may move `cap` bytes a
/// second on both hosts together; or, with `capacity`, tenants `one` and
/// `two` of equal cluster weight share that many.
fn policy(cap: u64, capacity: bool) -> String {
    let mut s = String::from(
        "# Written by the isolation demo's cluster scenario.\n\
         [link]\ncapacity = \"100Gbit\"\nrecompute_interval_ms = 20\n",
    );
    let mut tenant = |id: u32, name: &str, extra: &str, cgroups: &[&str]| {
        let _ = write!(s, "\n[[tenant]]\nid = {id}\nname = \"{name}\"\n{extra}");
        for c in cgroups {
            let _ = write!(s, "[[tenant.match]]\ncgroup = \"/mtrdma-demo/{c}\"\n");
        }
    };
    if capacity {
        tenant(2, "one", "cluster_weight = 1\n", &["cluster-one"]);
        tenant(3, "two", "cluster_weight = 1\n", &["cluster-two"]);
        s = format!("[cluster]\ncapacity = {cap}\n\n{s}");
    } else {
        tenant(
            1,
            "shared",
            &format!("cluster_cap = {cap}\n"),
            &["cluster-shared-rxa", "cluster-shared-rxb"],
        );
    }
    s
}

impl Site<'_> {
    /// Starts `host`'s coordinator on `local` (its policy until etcd's),
    /// joined through `endpoints`.
    fn cluster_coordinator(
        &self,
        host: &mut Host,
        local: &Path,
        endpoints: &str,
    ) -> Result<(), String> {
        let mut cmd = Command::new(self.program("coordinator")?);
        cmd.arg("--policy")
            .arg(local)
            .args(["--table", &host.table, "--socket"])
            .arg(&host.socket)
            .args(["--etcd", endpoints, "--host", host.name])
            .args(["--etcd-ttl", &TTL_SECS.to_string(), "--quiet"]);
        host.coordinator = Some(self.spawn(&format!("coordinator-{}", host.name), None, cmd)?);
        Ok(())
    }

    /// A sender of tenant cgroup `cgroup` on `host` to a server of its
    /// own on the other end, for `secs`; returns it and its server.
    fn cluster_sender(
        &mut self,
        host: &Host,
        cgroup: &str,
        secs: f64,
    ) -> Result<(Proc, Proc), String> {
        let port = self.port();
        let mut server = self.perf()?;
        server
            .args(["--server", "--device", &host.receiver, "-p"])
            .arg(port.to_string());
        let mut server = self.spawn(&format!("{cgroup}-server"), None, server)?;
        wait_listening(port, Some(&mut server))?;
        let pool_mib = (2 * self.args.msg).div_ceil(1 << 20).max(1);
        let mut cmd = self.perf()?;
        cmd.args(["--connect", "127.0.0.1", "--device", &host.sender, "-p"])
            .arg(port.to_string())
            .args(["--test", "write_bw", "-s", &self.args.msg.to_string()])
            .args([
                "-D",
                &format!("{secs}"),
                "--wait",
                "--ack-timeout",
                ACK_TIMEOUT,
            ])
            .args(["--path", "mtrdma", "--pool-mib", &pool_mib.to_string()])
            .arg("--coordinator")
            .arg(&host.socket);
        Ok((self.spawn(cgroup, Some(cgroup), cmd)?, server))
    }
}

/// How long a coordinator has to say it applied a policy from etcd.
const APPLY_PATIENCE: Duration = Duration::from_secs(30);

/// Waits until every host's coordinator said it applied its `nth` policy
/// from etcd.
fn applied(hosts: &mut [Host; 2], nth: usize) -> Result<(), String> {
    for h in hosts.iter_mut() {
        let c = h
            .coordinator
            .as_mut()
            .ok_or_else(|| format!("{}'s coordinator is not running", h.name))?;
        c.wait_said("policy from etcd", nth, APPLY_PATIENCE)?;
    }
    Ok(())
}

/// Bytes per second each of `who` (host index, tenant name) posted from
/// `lead` into the run for `secs`, by the hosts' tables.
fn rates(hosts: &[Host], who: &[(usize, &str)], lead: Duration, secs: f64) -> Vec<f64> {
    std::thread::sleep(lead);
    let before: Vec<Vec<(String, u64)>> = hosts.iter().map(|h| posted_in(&h.table)).collect();
    std::thread::sleep(Duration::from_secs_f64(secs));
    let after: Vec<Vec<(String, u64)>> = hosts.iter().map(|h| posted_in(&h.table)).collect();
    who.iter()
        .map(|&(h, name)| posted_between(&before[h], &after[h], name).unwrap_or(0) as f64 / secs)
        .collect()
}

pub(super) fn scenario_cluster(site: &mut Site<'_>, r: &mut Report) -> Result<(), String> {
    let cap = (site.link.rate_bps as f64 / 8.0 * site.args.cap_share).round() as u64;
    let mb = |b: f64| b / 1_048_576.0;
    r.say(format!(
        "\n== cluster-wide shares: each end of the link a host with its own coordinator, joined through etcd; cap {:.2} MB/s ({:.0}% of the link) ==",
        mb(cap as f64),
        100.0 * site.args.cap_share
    ));
    let logs = site.args.out.join("logs").join("cluster");
    std::fs::create_dir_all(&logs).map_err(|e| format!("{}: {e}", logs.display()))?;
    site.logs = logs.clone();
    println!("{}", site.progress.borrow_mut().measurement("cluster-etcd"));
    let etcd_dir = std::env::temp_dir().join(format!("mtrdma-cluster-etcd-{}", std::process::id()));
    let etcd_cluster = LocalEtcd::start(&etcd_dir, "link").map_err(|e| e.to_string())?;
    let endpoints = etcd_cluster.endpoints();
    let put = |text: &str| {
        etcd::put_policy(&endpoints, etcd::DEFAULT_PREFIX, text)
            .map(drop)
            .map_err(|e| e.to_string())
    };
    let local = logs.join("local.toml");
    std::fs::write(&local, policy(cap, false)).map_err(|e| format!("{}: {e}", local.display()))?;
    put(&policy(cap, false))?;
    let pid = std::process::id();
    let mut hosts = [("rxa", true), ("rxb", false)].map(|(name, forward)| {
        let (sender, receiver) = if forward {
            (site.link.sender.clone(), site.link.receiver.clone())
        } else {
            (site.link.receiver.clone(), site.link.sender.clone())
        };
        Host {
            name,
            sender,
            receiver,
            // A local file system: a socket cannot be bound on the VM's
            // shares.
            socket: std::env::temp_dir().join(format!("mtrdma-cluster-{name}-{pid}.sock")),
            table: format!("cluster-{name}-{pid}"),
            coordinator: None,
        }
    });
    let joined = endpoints.join(",");
    for h in hosts.iter_mut() {
        site.cluster_coordinator(h, &local, &joined)?;
    }
    applied(&mut hosts, 1)?;
    let result = measure_cluster(site, r, &mut hosts, cap, &put);
    for h in hosts.iter_mut() {
        if let Some(c) = h.coordinator.take() {
            if let Some(p) = rustix::process::Pid::from_raw(c.child.id() as i32) {
                let _ = rustix::process::kill_process(p, rustix::process::Signal::TERM);
            }
            let _ = c.wait();
        }
        // A killed coordinator leaves its table, as a crashed one does.
        let _ = mtrdma::core::QuotaTable::remove(&h.table);
    }
    drop(etcd_cluster);
    result
}

/// Puts `text` into etcd as the cluster's policy and waits until both
/// hosts' coordinators said they applied their `nth` policy from etcd.
fn apply(
    hosts: &mut [Host; 2],
    put: &dyn Fn(&str) -> Result<(), String>,
    text: &str,
    nth: usize,
) -> Result<(), String> {
    put(text)?;
    applied(hosts, nth)
}

/// A sender on each host, in cgroups `cgroups`, as tenants `names`: what
/// each moved over the measurement's window.
fn both(
    site: &mut Site<'_>,
    hosts: &[Host; 2],
    cgroups: [&str; 2],
    names: [&str; 2],
) -> Result<Vec<f64>, String> {
    let (secs, lead) = (site.args.seconds, site.args.warmup);
    let run_secs = secs + 2.0 * lead.as_secs_f64();
    let (a, sa) = site.cluster_sender(&hosts[0], cgroups[0], run_secs)?;
    let (b, sb) = site.cluster_sender(&hosts[1], cgroups[1], run_secs)?;
    let got = rates(hosts, &[(0, names[0]), (1, names[1])], lead, secs);
    for p in [a, b, sa, sb] {
        p.wait()?;
    }
    Ok(got)
}

fn measure_cluster(
    site: &mut Site<'_>,
    r: &mut Report,
    hosts: &mut [Host; 2],
    cap: u64,
    put: &dyn Fn(&str) -> Result<(), String>,
) -> Result<(), String> {
    let secs = site.args.seconds;
    let lead = site.args.warmup;
    let run_secs = secs + 2.0 * lead.as_secs_f64();
    let capf = cap as f64;
    let mb = |b: f64| b / 1_048_576.0;
    r.say(format!(
        "{:<34} {:>10} {:>10} {:>10} {:>12}",
        "case", "rxa MB/s", "rxb MB/s", "sum MB/s", "sum / cap"
    ));
    let row = |r: &mut Report, case: &str, a: f64, b: f64, check: &str| {
        r.say(format!(
            "{case:<34} {:>10.3} {:>10.3} {:>10.3} {:>12.3}{check}",
            mb(a),
            mb(b),
            mb(a + b),
            (a + b) / capf
        ));
    };
    let within = |sum: f64| {
        format!(
            "  (within 2%: {})",
            verdict((sum / capf - 1.0).abs() <= 0.02)
        )
    };

    // 1. The cap: one host's sender alone, then both.
    println!(
        "{}",
        site.progress.borrow_mut().measurement("cluster-alone")
    );
    let (alone, server) = site.cluster_sender(&hosts[1], "cluster-shared-rxb", run_secs)?;
    let got = rates(hosts, &[(1, "shared")], lead, secs);
    alone.wait()?;
    server.wait()?;
    row(r, "cap, rxb's sender alone", 0.0, got[0], &within(got[0]));
    r.figure(
        "link_cluster",
        Way::Mtrdma,
        "alone",
        "rxb",
        "mbps",
        mb(got[0]),
    );

    println!("{}", site.progress.borrow_mut().measurement("cluster-both"));
    let got = both(
        site,
        hosts,
        ["cluster-shared-rxa", "cluster-shared-rxb"],
        ["shared"; 2],
    )?;
    row(
        r,
        "cap, a sender on each host",
        got[0],
        got[1],
        &within(got[0] + got[1]),
    );
    r.figure(
        "link_cluster",
        Way::Mtrdma,
        "both",
        "rxa",
        "mbps",
        mb(got[0]),
    );
    r.figure(
        "link_cluster",
        Way::Mtrdma,
        "both",
        "rxb",
        "mbps",
        mb(got[1]),
    );

    // 2. Equal weights across hosts.
    println!(
        "{}",
        site.progress.borrow_mut().measurement("cluster-weights")
    );
    apply(hosts, put, &policy(cap, true), 2)?;
    let got = both(site, hosts, ["cluster-one", "cluster-two"], ["one", "two"])?;
    let jain = jain_index(&got);
    row(
        r,
        "capacity, tenant one on rxa, two on rxb",
        got[0],
        got[1],
        &format!(
            "{}; Jain {jain:.4} (0.99: {})",
            within(got[0] + got[1]),
            verdict(jain >= 0.99)
        ),
    );
    r.figure(
        "link_cluster",
        Way::Mtrdma,
        "weights",
        "jain",
        "index",
        jain,
    );

    // 3. rxb is lost with both senders running.
    println!("{}", site.progress.borrow_mut().measurement("cluster-dead"));
    apply(hosts, put, &policy(cap, false), 3)?;
    let dead_secs = run_secs + TTL_SECS as f64 + 1.0;
    let (a, sa) = site.cluster_sender(&hosts[0], "cluster-shared-rxa", dead_secs)?;
    let (b, sb) = site.cluster_sender(&hosts[1], "cluster-shared-rxb", dead_secs)?;
    std::thread::sleep(lead);
    // The host is lost: its coordinator and its sender die at once (a
    // sender left running would go on at its last rate, and on the
    // emulated CPUs take what rxa's needs).
    let mut b = b;
    for p in [
        hosts[1].coordinator.as_mut().map(|c| &mut c.child),
        Some(&mut b.child),
    ]
    .into_iter()
    .flatten()
    {
        let _ = p.kill();
        let _ = p.wait();
    }
    hosts[1].coordinator = None;
    // rxa's alone, from its lease's time to live and a second after.
    let got = rates(
        hosts,
        &[(0, "shared")],
        Duration::from_secs(TTL_SECS + 1),
        secs,
    );
    a.wait()?;
    sa.wait()?;
    // Its server lost its client.
    drop(sb);
    drop(b);
    row(
        r,
        &format!("cap, rxb's host lost, +{}s", TTL_SECS + 1),
        got[0],
        0.0,
        &within(got[0]),
    );
    r.figure(
        "link_cluster",
        Way::Mtrdma,
        "dead",
        "rxa",
        "mbps",
        mb(got[0]),
    );
    Ok(())
}
