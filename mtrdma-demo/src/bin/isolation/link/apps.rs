//! The applications scenario on the shared link (`--scenarios apps`): a
//! latency-sensitive RPC service (`examples/rpc`: eight clients on one UD
//! server queue pair, finding each other through a memcached started
//! here) next to a swap-like pager (`remote_memory`: 4 KiB
//! pages to two memory nodes over RC, every page checked). The clients
//! and the pager run on the sender device, the RPC server and the memory
//! nodes on the receiver device, so requests and page-outs cross the link
//! one way, answers and page-ins the other, both shaped.
//!
//! First the pager runs alone, at the link's rate in this boot: on the
//! emulated host rxe's work per byte (its softirqs) caps what one pager
//! moves, and a link faster than that is not its bottleneck, so nothing
//! queues there for mtrdma to keep short. The scenario then shapes the
//! link (both ends, tbf as `cargo xtask vm --link` does) to half of what
//! the pager moved alone in its busier direction, rounded down to
//! 10 Mbit/s, if that is slower than the boot's rate; and puts the
//! boot's rate back afterwards. No tenant is told the rate.
//!
//! Three runs: the RPC service alone, next to the pager unprotected (both
//! post straight on their queue pairs), and with mtrdma (both registered
//! with the coordinator as their cgroups' tenants; the RPC service's UD
//! sends scheduled in the latency class, the pager's pages through a
//! delay window). The same programs with the same settings in every run.

use super::*;

/// Clients of the RPC service, all on one server queue pair.
const RPC_CLIENTS: u32 = 8;
/// Each client's requests this far apart: together one request every
/// 2 ms. One server thread on the emulated CPU answers about 3,400
/// requests a second at most (closed loop, eight clients); well under
/// that the service's latency is its round trip, not a queue at its
/// server.
const RPC_INTERVAL_US: u64 = 16_000;
/// The service's CPU priority (`nice`), in every run.
const RPC_NICE: &str = "-10";
/// Pages the pager touches, spread over two nodes, at most: 16 MiB. Its
/// cache is an eighth of them, so nearly every access misses.
pub(super) const PAGER_WORKING_SET: u64 = 4_096;
/// The fewest pages it touches.
const PAGER_MIN_WORKING_SET: u64 = 1_024;
/// The pager first writes every page once; on the scenario's link that
/// takes about this long at most (the working set is chosen for it).
const PAGER_FILL_SECS: f64 = 2.0;
/// Misses in flight at once: a swap device's queue of reads and
/// writebacks.
const PAGER_DEPTH: u32 = 32;
const PAGE: f64 = 4096.0;

/// The pager and its memory nodes, running.
struct PagerRun {
    nodes: Vec<Proc>,
    pager: Proc,
    csv: PathBuf,
}

impl PagerRun {
    /// Waits for the pager and its nodes: (page-ins/s, page-outs/s,
    /// page-in p99 us, corrupt pages) from its CSV.
    fn finish(self) -> Result<(f64, f64, f64, f64), String> {
        // Exit status 2 is a corrupt page: the report says so.
        self.pager.wait_tolerating(Some("CORRUPT"))?;
        for n in self.nodes {
            n.wait()?;
        }
        let csv = &self.csv;
        let secs = csv_field(csv, "seconds")?;
        Ok((
            csv_field(csv, "page_ins")? / secs,
            csv_field(csv, "page_outs")? / secs,
            csv_field(csv, "p99_us").unwrap_or(f64::NAN),
            csv_field(csv, "corrupt")?,
        ))
    }
}

/// What one run measured.
struct AppRun {
    rpc_us: Vec<f64>,
    rpc_rps: f64,
    rpc_lost: f64,
    /// (page-ins/s, page-outs/s, page-in p99 us, corrupt) of the pager.
    pager: Option<(f64, f64, f64, f64)>,
    /// With mtrdma: the bytes per second the pager posted while the
    /// service was measured, from the quota table's counters.
    pager_posted: Option<f64>,
}

impl Site<'_> {
    /// `program` at a raised CPU priority (`nice -n RPC_NICE`), the same
    /// in every run. Not the probe's real-time priority: the service's
    /// nine threads wake thousands of times a second, and at a real-time
    /// priority on the emulated host they took the CPU from everything
    /// else (a memory node took 21 s to start next to them, and a pager
    /// built without optimisations never finished writing its pages).
    fn raised(&self, program: &Path) -> Command {
        let mut c = Command::new("nice");
        c.args(["-n", RPC_NICE]).arg(program);
        c
    }

    fn coordinated(&self, cmd: &mut Command, way: Way) {
        if way == Way::Mtrdma {
            cmd.args(["--path", "mtrdma", "--coordinator"])
                .arg(&self.socket);
        } else {
            cmd.args(["--path", "raw"]);
        }
    }

    /// Starts the two memory nodes on the receiver device: their
    /// processes and addresses. Memory nodes are servers that run all the
    /// time; they are up before the service and the pager start.
    fn start_nodes(&mut self) -> Result<(Vec<Proc>, Vec<String>), String> {
        let mut nodes = Vec::new();
        let mut addrs = Vec::new();
        for i in 0..2 {
            let port = self.port();
            let mut cmd = Command::new(self.program("remote_memory")?);
            cmd.args(["node", "--device", &self.link.receiver, "-p"])
                .arg(port.to_string())
                .args(["--pages", &(self.pager_pages / 2).to_string()]);
            let mut node = self.spawn(&format!("node{i}"), None, cmd)?;
            wait_listening(port, Some(&mut node))?;
            nodes.push(node);
            addrs.push(format!("127.0.0.1:{port}"));
        }
        Ok((nodes, addrs))
    }

    /// Starts the pager (posting `way`'s way) on running `nodes`, and
    /// waits until its initial fill is done and it has reached its pace.
    fn start_pager(
        &mut self,
        way: Way,
        (nodes, addrs): (Vec<Proc>, Vec<String>),
        seconds: f64,
    ) -> Result<PagerRun, String> {
        let csv = self.logs.join("pager.csv");
        let mut cmd = Command::new(self.program("remote_memory")?);
        cmd.args(["client", "--device", &self.link.sender]);
        for a in &addrs {
            cmd.args(["--node", a]);
        }
        cmd.args([
            "--working-set",
            &self.pager_pages.to_string(),
            "--cache",
            &(self.pager_pages / 8).to_string(),
            "--depth",
            &PAGER_DEPTH.to_string(),
            "--seconds",
            &format!("{seconds}"),
            "--chunk",
            &self.args.chunk.to_string(),
        ])
        .arg("--csv")
        .arg(&csv);
        self.coordinated(&mut cmd, way);
        let mut pager = self.spawn("pager", Some("pager"), cmd)?;
        pager.wait_said("initial fill", 1, Duration::from_secs(120))?;
        // The pager reaches its pace before anything is measured.
        std::thread::sleep(Duration::from_millis(1500));
        Ok(PagerRun { nodes, pager, csv })
    }

    /// The pager alone, unprotected: (page-ins/s, page-outs/s, page-in
    /// p99 us, corrupt pages).
    fn run_pager_alone(&mut self, tag: &str) -> Result<(f64, f64, f64, f64), String> {
        self.log_dir(tag)?;
        let nodes = self.start_nodes()?;
        let seconds = self.args.seconds + 3.0;
        self.start_pager(Way::Unprotected, nodes, seconds)?.finish()
    }

    /// Starts run `tag`: its progress line, and its processes' log
    /// directory.
    fn log_dir(&mut self, tag: &str) -> Result<(), String> {
        println!("{}", self.progress.borrow_mut().measurement(tag));
        let logs = self.args.out.join("logs").join(tag);
        std::fs::create_dir_all(&logs).map_err(|e| format!("{}: {e}", logs.display()))?;
        self.logs = logs;
        Ok(())
    }

    /// One run (`apps-WAY`): the RPC service `rpc` way, alone or with the
    /// pager next to it the same way, started after the service or, with
    /// `pager_first`, before it.
    fn run_apps(&mut self, registry: &str, rpc: Way, pager_first: bool) -> Result<AppRun, String> {
        let pager = match rpc {
            Way::Alone => None,
            way => Some(way),
        };
        let tag = &format!("apps-{}", rpc.name());
        let secs = self.args.seconds;
        self.log_dir(tag)?;
        let name = format!("{tag}-{}", std::process::id());
        let nodes = pager.map(|_| self.start_nodes()).transpose()?;
        // A pager started first runs while the service starts (its
        // clients find the server, 1.5 s) and through the service's
        // measured seconds.
        let (early, nodes) = match (pager, nodes) {
            (Some(way), Some(n)) if pager_first => {
                (Some(self.start_pager(way, n, secs + 6.0)?), None)
            }
            (_, n) => (None, n),
        };
        // Otherwise the service runs first; the pager starts next to it,
        // and the service is measured once the pager is at its pace.
        let start_file = self.logs.join("rpc.start");
        let _ = std::fs::remove_file(&start_file);
        let mut cmd = self.raised(&self.program("rpc")?);
        cmd.args([
            "server",
            "--device",
            &self.link.receiver,
            "--registry",
            registry,
        ])
        .args(["--name", &name, "--clients", &RPC_CLIENTS.to_string()])
        .args(["--seconds", &format!("{}", secs + 300.0)]);
        self.coordinated(&mut cmd, rpc);
        let server = self.spawn("rpc-server", Some("rpc"), cmd)?;
        let (samples, csv) = (self.logs.join("rpc.samples"), self.logs.join("rpc.csv"));
        let mut cmd = self.raised(&self.program("rpc")?);
        cmd.args([
            "client",
            "--device",
            &self.link.sender,
            "--registry",
            registry,
        ])
        .args(["--name", &name, "--clients", &RPC_CLIENTS.to_string()])
        .args(["--seconds", &format!("{secs}")])
        .args(["--interval", &RPC_INTERVAL_US.to_string()])
        .arg("--samples")
        .arg(&samples)
        .arg("--csv")
        .arg(&csv)
        .arg("--start-file")
        .arg(&start_file);
        self.coordinated(&mut cmd, rpc);
        let client = self.spawn("rpc-client", Some("rpc"), cmd)?;
        // The clients have found the server and are sending.
        std::thread::sleep(Duration::from_millis(1500));
        let pager_run = match (early, pager, nodes) {
            (Some(early), _, _) => Ok(Some(early)),
            (None, Some(way), Some(nodes)) => self.start_pager(way, nodes, secs + 3.0).map(Some),
            _ => Ok(None),
        };
        // Written whatever happened, so the clients measure and end.
        let started =
            std::fs::write(&start_file, b"").map_err(|e| format!("{}: {e}", start_file.display()));
        // With mtrdma, what the pager posts while the service is measured.
        let counted = pager == Some(Way::Mtrdma);
        let measured = Instant::now();
        let before = if counted { self.posted() } else { Vec::new() };
        let pager_run = pager_run?;
        started?;
        client.wait()?;
        let pager_posted = counted
            .then(|| posted_between(&before, &self.posted(), "pager"))
            .flatten()
            .map(|bytes| bytes as f64 / measured.elapsed().as_secs_f64());
        server.wait()?;
        let mut run = AppRun {
            rpc_us: read_samples(&samples)?,
            rpc_rps: csv_field(&csv, "rps")?,
            rpc_lost: csv_field(&csv, "lost")?,
            pager: None,
            pager_posted,
        };
        if let Some(p) = pager_run {
            run.pager = Some(p.finish()?);
        }
        Ok(run)
    }
}

/// tbf's bucket beyond the MTU and in packets, as `cargo xtask vm --link`
/// sets it (xtask's `TBF_HEADROOM` and `TBF_BUCKET_PACKETS`).
const TBF_HEADROOM: u64 = 64;
const TBF_BUCKET_PACKETS: u64 = 2;

/// The link's two ends shaped to `bps` (the tbf qdiscs `cargo xtask vm
/// --link` put there, changed in place).
fn shape(netdevs: &[String], bps: u64) -> Result<(), String> {
    for dev in netdevs {
        let mtu_path = format!("/sys/class/net/{dev}/mtu");
        let mtu: u64 = std::fs::read_to_string(&mtu_path)
            .map_err(|e| format!("{mtu_path}: {e}"))?
            .trim()
            .parse()
            .map_err(|e| format!("{mtu_path}: {e}"))?;
        let burst = (mtu + TBF_HEADROOM) * TBF_BUCKET_PACKETS;
        let out = Command::new("tc")
            .args(["qdisc", "change", "dev", dev, "root", "tbf", "rate"])
            .arg(format!("{bps}bit"))
            .args(["burst", &burst.to_string(), "limit", "16mb"])
            .output()
            .map_err(|e| format!("running tc: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "tc qdisc change dev {dev} ... rate {bps}bit: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
    }
    Ok(())
}

/// The link's ends shaped to another rate while it lives, and back to
/// the boot's rate when dropped.
struct Reshaped {
    netdevs: Vec<String>,
    boot_bps: u64,
}

impl Drop for Reshaped {
    fn drop(&mut self) {
        if let Err(e) = shape(&self.netdevs, self.boot_bps) {
            eprintln!("isolation: putting the link back to its boot rate: {e}");
        }
    }
}

/// A memcached of the scenario's own on 127.0.0.1, stopped when dropped.
struct Memcached(Child);

impl Memcached {
    fn start(site: &mut Site<'_>) -> Result<(Memcached, String), String> {
        let port = site.port();
        let mut cmd = Command::new("memcached");
        cmd.args(["-l", "127.0.0.1", "-U", "0", "-p", &port.to_string()]);
        if rustix::process::geteuid().is_root() {
            cmd.args(["-u", "root"]);
        }
        let child = cmd
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| {
                format!(
                    "starting memcached (Debian's package; `cargo xtask deps` installs it): {e}"
                )
            })?;
        let m = Memcached(child);
        wait_listening(port, None)?;
        Ok((m, format!("127.0.0.1:{port}")))
    }
}

impl Drop for Memcached {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub(super) fn scenario_apps(site: &mut Site<'_>, r: &mut Report) -> Result<(), String> {
    r.say(format!(
        "\n== applications: an RPC service ({RPC_CLIENTS} clients on one UD server queue pair, a request every {} us in all, found through memcached) next to a pager (a working set of 4 KiB pages over 2 memory nodes, an eighth of them cached, {PAGER_DEPTH} misses in flight), each a process ==",
        RPC_INTERVAL_US / u64::from(RPC_CLIENTS)
    ));
    let (_memcached, registry) = Memcached::start(site)?;
    // The pager alone, at the boot's rate, and the link it is to share.
    let solo = site.run_pager_alone("apps-pager-alone")?;
    let (ins, outs, _, corrupt0) = solo;
    let busier = ins.max(outs) * PAGE;
    let boot_bps = site.link.rate_bps;
    let half = ((busier * 8.0 / 2.0) / 10e6).floor() as u64 * 10_000_000;
    let chosen = half.max(10_000_000).min(boot_bps);
    r.say(format!(
        "the pager alone moves {:.2} MB/s in its busier direction ({:.0}% of the link at this boot's {:.0} Mbit/s; {} corrupt); \
         the scenario shapes the link to {:.0} Mbit/s{}",
        busier / 1_048_576.0,
        100.0 * busier * 8.0 / boot_bps as f64,
        boot_bps as f64 / 1e6,
        corrupt0,
        chosen as f64 / 1e6,
        if chosen < boot_bps {
            " (half of what the pager moves alone: the link, not the pager's CPU, is then the bottleneck)"
        } else {
            " (the boot's rate: the pager alone fills more than half of it)"
        }
    ));
    let netdevs = vec![site.netdev.clone(), netdev_of(&site.link.receiver)?];
    let _back = if chosen < boot_bps {
        shape(&netdevs, chosen)?;
        Some(Reshaped { netdevs, boot_bps })
    } else {
        None
    };
    let link = LinkSpec {
        sender: site.link.sender.clone(),
        receiver: site.link.receiver.clone(),
        rate_bps: chosen,
    };
    // A working set the pager writes out once in about PAGER_FILL_SECS at
    // the link's rate (its nodes hold half each).
    let fill_pages = (chosen as f64 / 8.0 * PAGER_FILL_SECS / PAGE) as u64 / 64 * 64;
    site.pager_pages = fill_pages.clamp(PAGER_MIN_WORKING_SET, PAGER_WORKING_SET);
    r.say(format!(
        "the pager's working set: {} pages ({:.1} MiB), {} cached",
        site.pager_pages,
        site.pager_pages as f64 * PAGE / 1_048_576.0,
        site.pager_pages / 8
    ));
    r.figure(
        "apps",
        Way::Alone,
        "pager",
        "pager",
        "busier_direction_mbps",
        busier / 1_048_576.0,
    );
    r.figure(
        "apps",
        Way::Alone,
        "pager",
        "pager",
        "link_bps",
        chosen as f64,
    );
    let alone = site.run_apps(&registry, Way::Alone, false)?;
    let unprot = site.run_apps(&registry, Way::Unprotected, false)?;
    let pager_first = site.args.pager_first;
    let ours = site.run_apps(&registry, Way::Mtrdma, pager_first)?;
    r.say(format!(
        "{:<12} {:>9} {:>9} {:>10} {:>9} {:>6} {:>11} {:>12} {:>8} {:>8}",
        "way",
        "p50 us",
        "p99 us",
        "p99.9 us",
        "req/s",
        "lost",
        "pager MB/s",
        "page-in p99",
        "of link",
        "corrupt"
    ));
    r.say(
        "(pager MB/s: page-ins and page-outs together; of link: its busier direction against the \
         link's rate)",
    );
    let link_bytes = link.rate_bps as f64 / 8.0;
    let a = lat(&alone.rpc_us);
    let mut shares = Vec::new();
    let mut cdf = Vec::new();
    for (way, run) in [
        (Way::Alone, &alone),
        (Way::Unprotected, &unprot),
        (Way::Mtrdma, &ours),
    ] {
        let l = lat(&run.rpc_us);
        let (p50, p99, p999) = cells(&l);
        let (mbps, p99_in, share, corrupt) = match run.pager {
            Some((ins, outs, p99_in, corrupt)) => (
                format!("{:.2}", (ins + outs) * PAGE / 1_048_576.0),
                format!("{p99_in:.0}"),
                format!("{:.1}%", 100.0 * ins.max(outs) * PAGE / link_bytes),
                format!("{corrupt:.0}"),
            ),
            None => ("-".into(), "-".into(), "-".into(), "-".into()),
        };
        r.say(format!(
            "{:<12} {p50:>9} {p99:>9} {p999:>10} {:>9.0} {:>6.0} {mbps:>11} {p99_in:>12} {share:>8} {corrupt:>8}",
            way.name(),
            run.rpc_rps,
            run.rpc_lost
        ));
        latency_figures(r, "apps", way, "rpc", &l);
        r.figure("apps", way, "rpc", "rpc", "rps", run.rpc_rps);
        r.keep_samples("apps", way, "rpc", &run.rpc_us);
        if let Some((ins, outs, p99_in, corrupt)) = run.pager {
            let share = ins.max(outs) * PAGE / link_bytes;
            r.figure("apps", way, "pager", "pager", "page_ins_per_s", ins);
            r.figure("apps", way, "pager", "pager", "page_outs_per_s", outs);
            r.figure("apps", way, "pager", "pager", "page_in_p99_us", p99_in);
            r.figure("apps", way, "pager", "pager", "link_share", share);
            r.figure("apps", way, "pager", "pager", "corrupt", corrupt);
            shares.push((ins + outs, share, corrupt));
        }
        cdf.push(LatencySeries {
            label: way.name().into(),
            samples_us: run.rpc_us.clone(),
        });
    }
    let (u, m) = (lat(&unprot.rpc_us), lat(&ours.rpc_us));
    let bound = a.p99 + link.us_for_16k();
    r.figure("apps", Way::Mtrdma, "rpc", "rpc", "bound_us", bound);
    let [(unprot_moved, _, c1), (ours_moved, share, c2)] = shares[..] else {
        unreachable!("two runs with the pager");
    };
    r.say(format!(
        "  apps: RPC p99 with mtrdma {:.0} us vs bound {bound:.0} us (alone + 16 KiB at the link rate): {}; \
         unprotected/mtrdma p99 {:.1}x (target 10x): {}; the pager with mtrdma moves {:.0}% of the link \
         in its busier direction (target 80%): {}, {:.2} of what it moves unprotected; pages read back \
         corrupt: {} (target 0): {}",
        m.p99,
        verdict(m.p99 <= bound),
        u.p99 / m.p99,
        verdict(u.p99 >= 10.0 * m.p99),
        100.0 * share,
        verdict(share >= 0.8),
        ours_moved / unprot_moved,
        c1 + c2,
        verdict(c1 + c2 == 0.0)
    ));
    if let Some(posted) = ours.pager_posted {
        r.say(format!(
            "  apps: with mtrdma the pager, started {} the service, posted {:.2} MB/s while the service was measured (from the quota table's counters; page-ins and page-outs together)",
            if pager_first { "before" } else { "after" },
            posted / 1_048_576.0
        ));
        r.figure(
            "apps",
            Way::Mtrdma,
            "pager",
            "pager",
            if pager_first {
                "posted_mbps_started_first"
            } else {
                "posted_mbps"
            },
            posted / 1_048_576.0,
        );
    }
    plot::latency_cdf(
        &site.args.out.join("apps_rpc_cdf"),
        "RPC service on the shared link next to a pager: CDF of request latency",
        &cdf,
    )
}
