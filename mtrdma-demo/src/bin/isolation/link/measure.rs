//! One measurement of the link demo: who runs in it ([`Run`]), starting
//! and stopping its processes, and what they reported ([`Measured`]).

use super::*;

impl Site<'_> {
    /// One measurement: the latency probe (if `probe`), next to `bulk`
    /// (tenant cgroup, way) perf senders, `hogs` ib_write_bw senders and
    /// the storm (if `storm`, with or without mtrdma).
    pub(super) fn measure(&mut self, tag: &str, run: &Run) -> Result<Measured, String> {
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
        let ports = probe_port.iter().chain(&bulk_ports);
        for (server, &port) in servers.iter_mut().zip(ports) {
            wait_listening(port, Some(server))?;
        }
        for (server, port) in &mut hog_servers {
            wait_listening(*port, Some(server))?;
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
                let (mut server, port) = self.server("attacker")?;
                wait_listening(port, Some(&mut server))?;
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
pub(super) fn posted_between(
    before: &[(String, u64)],
    after: &[(String, u64)],
    name: &str,
) -> Option<u64> {
    let of = |posted: &[(String, u64)]| posted.iter().find(|(n, _)| n == name).map(|&(_, b)| b);
    Some(of(after)?.saturating_sub(of(before)?))
}

impl Site<'_> {
    /// Bytes each registered tenant has posted so far, by name, from the
    /// coordinator's quota table (none if it cannot be read).
    pub(super) fn posted(&self) -> Vec<(String, u64)> {
        posted_in(&self.table)
    }
}

/// Bytes each registered tenant of quota table `table` has posted so far,
/// by name (none if it cannot be read).
pub(super) fn posted_in(table: &str) -> Vec<(String, u64)> {
    mtrdma::core::QuotaTable::open(table)
        .and_then(|t| t.usage())
        .map(|usage| {
            usage
                .into_iter()
                .map(|u| (u.name, u.bytes_posted))
                .collect()
        })
        .unwrap_or_default()
}

/// What a flooding attacker posts: 8-byte RDMA WRITEs, READs or atomic
/// fetch-and-adds, as many as it can keep outstanding.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Flood {
    Writes,
    Reads,
    Atomics,
}

impl Flood {
    pub(super) fn test(self) -> &'static str {
        match self {
            Flood::Writes => "write_bw",
            Flood::Reads => "read_bw",
            Flood::Atomics => "atomic_bw",
        }
    }
}

#[derive(Default)]
pub(super) struct Measured {
    pub(super) probe_us: Vec<f64>,
    /// (tenant, MB/s with MB = 2^20 bytes) per bulk sender: its own
    /// average over its run (perf's `bw_avg`).
    pub(super) bulk: Vec<(String, f64)>,
    /// (tenant, MB/s) per bulk sender registered with the coordinator:
    /// what it posted in the measured window (after the bulk senders'
    /// start, while the probe ran), from the quota table's counters. All
    /// the tenants over the same seconds, unlike their own averages, whose
    /// runs start one after another.
    pub(super) bulk_window: Vec<(String, f64)>,
    /// (operations done, refused, seconds) of the storm.
    pub(super) storm: Option<(u64, u64, f64)>,
    /// The flooding attacker's requests per second (its own average).
    pub(super) flood_ops: Option<f64>,
    /// What left the sender's network device while the probe ran (MB/s,
    /// headers included).
    pub(super) link_mbps: f64,
    /// Packets that left it then, per second.
    pub(super) link_pps: f64,
    /// How late the probe's sleeps between requests ended, p99 (us):
    /// the share of its latency that is the host's CPUs, not the link
    /// (perf says it on stderr).
    pub(super) probe_late_p99_us: Option<f64>,
}

/// The p99 of how late a perf probe's sleeps ended, from its stderr
/// ("perf: N sleeps between requests ended late by p50 X us, p99 Y us").
pub(super) fn late_p99_us(stderr: &str) -> Option<f64> {
    let line = stderr
        .lines()
        .find(|l| l.contains("sleeps between requests ended late by"))?;
    let (_, rest) = line.split_once("p99 ")?;
    rest.split_whitespace().next()?.parse().ok()
}

impl Measured {
    /// The bulk senders' own averages over their runs, added up.
    pub(super) fn bulk_total(&self) -> f64 {
        self.bulk.iter().map(|(_, v)| v).sum()
    }

    /// (tenant, MB/s) of the `n` bulk senders: what each posted while the
    /// probe ran, from the quota table's counters, if all of them are
    /// registered ([`bulk_window`](Self::bulk_window)), else their own
    /// averages over their runs ([`bulk`](Self::bulk)).
    pub(super) fn bulk_rates(&self, n: usize) -> &[(String, f64)] {
        if n > 0 && self.bulk_window.len() == n {
            &self.bulk_window
        } else {
            &self.bulk
        }
    }

    /// What the `n` bulk senders moved together while the probe ran (see
    /// [`bulk_rates`](Self::bulk_rates)).
    pub(super) fn bulk_rate(&self, n: usize) -> f64 {
        self.bulk_rates(n).iter().map(|(_, v)| v).sum()
    }
}

pub(super) fn read_samples(path: &Path) -> Result<Vec<f64>, String> {
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
pub(super) fn bw_avg(path: &Path) -> Result<f64, String> {
    csv_field(path, "bw_avg_MBps")
}

/// Column `name` of the last data row of a CSV file (perf appends a row
/// a run; the pager and the RPC service write one).
pub(super) fn csv_field(path: &Path, name: &str) -> Result<f64, String> {
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
pub(super) fn perftest_bw(out: &str) -> Result<f64, String> {
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
pub(super) fn parse_storm(out: &str) -> Result<(u64, u64, f64), String> {
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
pub(super) fn cells(l: &Lat) -> (String, String, String) {
    (
        format!("{:.1}", l.p50),
        format!("{:.1}", l.p99),
        l.p999_cell(),
    )
}

pub(super) fn latency_figures(r: &mut Report, scenario: &str, way: Way, case: &str, l: &Lat) {
    for (k, v) in l.figures() {
        r.figure(scenario, way, case, "latency", k, v);
    }
    r.figure(scenario, way, case, "latency", "samples", l.n as f64);
}

/// A target's verdict line.
pub(super) fn verdict(ok: bool) -> &'static str {
    if ok {
        "met"
    } else {
        "NOT met"
    }
}

/// What the coordinator's kernel monitor said over the run, from its log:
/// the tenants it found holding more than mtrdma admitted (the
/// unprotected runs' processes, which never register), the processes of
/// no tenant, and the fastest creation of queue pairs it saw per tenant
/// (the storm's).
pub(super) fn monitor_summary(log: &std::path::Path) -> String {
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
