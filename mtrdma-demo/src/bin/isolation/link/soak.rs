//! The soak on the shared link (`--scenarios soak`, `cargo xtask soak
//! --minutes N`): churn for `--soak-seconds` (rounds start until that
//! time has passed, at least three), each round about [`ROUND_SECS`] in
//! the release build, and after every round a check that nothing leaked.
//!
//! Each round starts three bulk tenants with mtrdma (perf processes
//! registered with the coordinator, 64 KiB, 256 KiB and 1 MiB WRITEs; the
//! tenants come and go with the round). Then, by round:
//! - every other round SIGKILLs one of them part-way (its queue pairs and
//!   regions are the kernel's to free, its process slot the
//!   coordinator's to reclaim);
//! - the other rounds run the control-path storm next to them;
//! - every third round rewrites the policy file (a bulk tenant's weight
//!   between 1 and 2), which the coordinator reloads;
//! - in the first rounds to start a third and two thirds of the way
//!   through, the coordinator itself is SIGKILLed part-way and started
//!   again: it takes the table over and the tenants running carry on.
//!
//! What must hold, checked after every round once its tenants are gone:
//! - every tenant's queue pairs, region bytes, outstanding requests,
//!   backlog and processes in the table are back to zero;
//! - every tenant that was not killed finished its run and exited
//!   cleanly: none of its requests was lost (perf waits for every
//!   completion, and one that never came would hold it past its
//!   deadline);
//! - over each coordinator's life, its open file descriptors do not grow
//!   and its own memory (its private resident pages, `RssAnon`: heap and
//!   stacks) stays flat; the quota table's shared pages it has touched
//!   (`RssShmem`) are shown beside it, not judged: they grow as slots of
//!   the table come into use, up to the table's size;
//! - the coordinator reloaded the policy at every rewrite.

use super::*;

/// About how long a round takes in the release build: the tenants' run
/// ([`TENANT_SECS`]) and their start, exit and the check after them (7.4 s
/// measured over an hour; about the same in the debug build). Only the
/// progress's estimate uses it.
const ROUND_SECS: f64 = 7.5;
/// How long each round's bulk tenants send.
const TENANT_SECS: f64 = 6.0;
/// Message sizes of a round's bulk tenants (each a tenant of its own).
const SIZES: [usize; 3] = [64 << 10, 256 << 10, 1 << 20];
/// When, into a round, a tenant is killed, the policy rewritten and the
/// coordinator killed (after the tenants registered and are sending).
const KILL_TENANT_AT: Duration = Duration::from_millis(2_500);
const REWRITE_AT: Duration = Duration::from_millis(3_000);
const KILL_COORDINATOR_AT: Duration = Duration::from_millis(3_500);
/// How long a round's tenants may take beyond their run (connection,
/// registration, draining) before the one that has not exited counts as
/// having lost a request.
const EXIT_GRACE: Duration = Duration::from_secs(30);
/// How long the coordinator has, after a round, to reclaim what the
/// round's tenants held (its housekeeping runs every 250 ms).
const SETTLE: Duration = Duration::from_secs(5);
/// How much a coordinator's private resident pages may grow over its
/// life: a twentieth, and 256 KiB for the allocator's own rounding.
const RSS_SLACK: f64 = 0.05;
const RSS_SLACK_KIB: u64 = 256;

/// About how many rounds a soak of `secs` runs (at least three: one for
/// each coordinator's life).
pub(super) fn rounds(secs: f64) -> usize {
    ((secs / ROUND_SECS).ceil() as usize).max(3)
}

/// Whether the round starting `elapsed` into a soak of `secs`, with
/// `life` restarts so far, kills and restarts the coordinator: the first
/// round to start a third of the way through, and the first two thirds of
/// the way (never round 0, and never two restarts in one round).
fn restarts_coordinator(round: usize, elapsed: Duration, secs: f64, life: usize) -> bool {
    round > 0 && life < 2 && elapsed.as_secs_f64() >= secs * (life + 1) as f64 / 3.0
}

/// Whether another round starts `elapsed` into a soak of `secs`, after
/// `rounds` (at least three run).
fn another_round(rounds: usize, elapsed: Duration, secs: f64) -> bool {
    rounds < 3 || elapsed.as_secs_f64() < secs
}

/// What one round left behind.
struct Checkpoint {
    round: usize,
    at: Duration,
    /// Which coordinator (0 for the first, 1 after its first restart..).
    life: usize,
    pid: u32,
    fds: usize,
    /// Its private resident pages (`RssAnon`), and the shared ones
    /// (`RssShmem`: the table's pages it has touched), in KiB.
    anon_kib: u64,
    shmem_kib: u64,
    killed: usize,
    storm: bool,
    /// Counters not back to zero ("" when all are).
    left: String,
}

pub(super) fn scenario_soak(site: &mut Site<'_>, r: &mut Report) -> Result<(), String> {
    let secs = site.args.soak_seconds;
    r.say(format!(
        "\n== soak: {secs:.0} s of churn on the link in rounds: bulk tenants that come and go \
         (64 KiB to 1 MiB WRITEs), one SIGKILLed every other round, the control-path storm in the \
         others, the policy rewritten every third round, the coordinator SIGKILLed and restarted \
         a third and two thirds of the way through =="
    ));
    r.say(format!(
        "{:>5} {:>7} {:>11} {:>8} {:>5} {:>8} {:>9} {:>13} {:>6}  counters after the round",
        "round",
        "at s",
        "coordinator",
        "pid",
        "fds",
        "anon KiB",
        "shmem KiB",
        "tenants/kill",
        "storm"
    ));
    let started = Instant::now();
    let mut life = 0;
    let mut rewrites = 0;
    let mut problems = Vec::new();
    let mut checkpoints: Vec<Checkpoint> = Vec::new();
    let mut round = 0;
    while another_round(round, started.elapsed(), secs) {
        println!(
            "{}",
            site.progress
                .borrow_mut()
                .measurement(&format!("soak-{round}"))
        );
        let logs = site.args.out.join("logs").join(format!("soak-{round}"));
        std::fs::create_dir_all(&logs).map_err(|e| format!("{}: {e}", logs.display()))?;
        site.logs = logs;
        let kill_tenant = round % 2 == 0;
        let storm = !kill_tenant;
        let rewrite = round % 3 == 1;
        let restart = restarts_coordinator(round, started.elapsed(), secs, life);

        let mut servers = Vec::new();
        for (i, _) in SIZES.iter().enumerate() {
            servers.push(site.server(&format!("bulk{i}"))?);
        }
        for (server, port) in &mut servers {
            wait_listening(*port, Some(server))?;
        }
        let mut tenants = Vec::new();
        for (i, ((_, port), size)) in servers.iter().zip(SIZES).enumerate() {
            let a: Vec<String> = [
                "--test",
                "write_bw",
                "-s",
                &size.to_string(),
                "-D",
                &format!("{TENANT_SECS}"),
                "--wait",
                "--ack-timeout",
                ACK_TIMEOUT,
                "--path",
                "mtrdma",
                "--pool-mib",
                &(2 * size).div_ceil(1 << 20).to_string(),
                "--coordinator",
                &site.socket.display().to_string(),
            ]
            .map(String::from)
            .to_vec();
            tenants.push(site.client(&format!("bulk{i}"), *port, &a)?);
        }
        let storm_tenant = if storm {
            let mut cmd = Command::new(site.program("isolation")?);
            cmd.args(["--storm-tenant", "--device", &site.link.sender, "--seconds"])
                .arg(format!("{}", TENANT_SECS - 1.0))
                .arg("--coordinator")
                .arg(&site.socket);
            Some(site.spawn("storm", Some("storm"), cmd)?)
        } else {
            None
        };

        // The round's faults, in their order.
        let round_start = Instant::now();
        let until = |at: Duration| {
            if let Some(left) = at.checked_sub(round_start.elapsed()) {
                std::thread::sleep(left);
            }
        };
        let mut killed = None;
        if kill_tenant {
            until(KILL_TENANT_AT);
            let victim = &mut tenants[round % SIZES.len()];
            victim
                .child
                .kill()
                .map_err(|e| format!("killing {}: {e}", victim.name))?;
            killed = Some(round % SIZES.len());
        }
        if rewrite {
            until(REWRITE_AT);
            rewrites += 1;
            site.rewrite_policy(rewrites)?;
        }
        if restart {
            until(KILL_COORDINATOR_AT);
            site.coordinator
                .kill()
                .map_err(|e| format!("killing the coordinator: {e}"))?;
            let _ = site.coordinator.wait();
            life += 1;
            site.start_coordinator(&format!("coordinator-{life}.log"))?;
        }

        // Every tenant not killed runs to its end.
        let deadline = round_start + Duration::from_secs_f64(TENANT_SECS) + EXIT_GRACE;
        for (i, tenant) in tenants.into_iter().enumerate() {
            if killed == Some(i) {
                drop(tenant);
                continue;
            }
            if let Err(e) = tenant.wait_until(deadline) {
                problems.push(format!("round {round}: {e}"));
            }
        }
        if let Some(s) = storm_tenant {
            if let Err(e) = s.wait_until(deadline) {
                problems.push(format!("round {round}: {e}"));
            }
        }
        // The killed tenant's server lost its peer: it may fail or hang,
        // and is stopped. The others finish with their clients.
        for (i, (server, _)) in servers.into_iter().enumerate() {
            if killed == Some(i) {
                drop(server);
            } else if let Err(e) = server.wait_until(deadline + Duration::from_secs(5)) {
                problems.push(format!("round {round}: {e}"));
            }
        }

        // Nothing the round's tenants held is left.
        let left = site.settle(SETTLE);
        if !left.is_empty() {
            problems.push(format!(
                "round {round}: {} after its tenants were gone: {left}",
                SETTLE.as_secs()
            ));
        }
        let pid = site.coordinator.id();
        let c = Checkpoint {
            round,
            at: started.elapsed(),
            life,
            pid,
            fds: open_fds(pid)?,
            anon_kib: status_kib(pid, "RssAnon:")?,
            shmem_kib: status_kib(pid, "RssShmem:")?,
            killed: usize::from(killed.is_some()),
            storm,
            left,
        };
        r.say(format!(
            "{:>5} {:>7.1} {:>11} {:>8} {:>5} {:>8} {:>9} {:>13} {:>6}  {}",
            c.round,
            c.at.as_secs_f64(),
            if c.life == 0 {
                "first".to_string()
            } else {
                format!("restart {}", c.life)
            },
            c.pid,
            c.fds,
            c.anon_kib,
            c.shmem_kib,
            format!("{}/{}", SIZES.len(), c.killed),
            if c.storm { "yes" } else { "no" },
            if c.left.is_empty() {
                "all zero"
            } else {
                &c.left
            }
        ));
        r.figure(
            "link_soak",
            Way::Mtrdma,
            &format!("round{round}"),
            "coordinator",
            "fds",
            c.fds as f64,
        );
        r.figure(
            "link_soak",
            Way::Mtrdma,
            &format!("round{round}"),
            "coordinator",
            "anon_kib",
            c.anon_kib as f64,
        );
        r.figure(
            "link_soak",
            Way::Mtrdma,
            &format!("round{round}"),
            "coordinator",
            "shmem_kib",
            c.shmem_kib as f64,
        );
        checkpoints.push(c);
        round += 1;
    }
    site.progress.borrow_mut().replan(round);
    let rounds = round;

    // Each coordinator's life: descriptors and memory from its first
    // round's check to its last.
    for l in 0..=life {
        let of_life: Vec<&Checkpoint> = checkpoints.iter().filter(|c| c.life == l).collect();
        let (Some(first), Some(last)) = (of_life.first(), of_life.last()) else {
            continue;
        };
        let anon_limit =
            first.anon_kib + (first.anon_kib as f64 * RSS_SLACK) as u64 + RSS_SLACK_KIB;
        let fds_ok = last.fds <= first.fds;
        let anon_ok = last.anon_kib <= anon_limit;
        r.say(format!(
            "coordinator {} (rounds {} to {}): open descriptors {} -> {} ({}), private resident pages {} -> {} KiB \
             (at most {anon_limit}: {})",
            if l == 0 { "first".to_string() } else { format!("restart {l}") },
            first.round,
            last.round,
            first.fds,
            last.fds,
            verdict(fds_ok),
            first.anon_kib,
            last.anon_kib,
            verdict(anon_ok)
        ));
        if !fds_ok {
            problems.push(format!(
                "coordinator {l}: its open descriptors grew from {} to {}",
                first.fds, last.fds
            ));
        }
        if !anon_ok {
            problems.push(format!(
                "coordinator {l}: its private resident pages grew from {} to {} KiB",
                first.anon_kib, last.anon_kib
            ));
        }
    }
    let reloads = site.coordinator_log_lines("policy reloaded")?;
    r.say(format!(
        "policy rewritten {rewrites} times, reloaded {reloads} times ({})",
        verdict(reloads >= rewrites)
    ));
    if reloads < rewrites {
        problems.push(format!(
            "the policy was rewritten {rewrites} times and reloaded {reloads} times"
        ));
    }
    let zero = checkpoints.iter().filter(|c| c.left.is_empty()).count();
    r.say(format!(
        "counters back to zero after {zero} of {rounds} rounds; {} problems",
        problems.len()
    ));
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems.join("\n"))
    }
}

/// Open file descriptors of process `pid`.
fn open_fds(pid: u32) -> Result<usize, String> {
    let dir = format!("/proc/{pid}/fd");
    Ok(std::fs::read_dir(&dir)
        .map_err(|e| format!("{dir}: {e}"))?
        .count())
}

/// The field `field` (`RssAnon:`, `VmRSS:`..) of process `pid`'s
/// `/proc/PID/status`, in KiB.
fn status_kib(pid: u32, field: &str) -> Result<u64, String> {
    let path = format!("/proc/{pid}/status");
    let status = std::fs::read_to_string(&path).map_err(|e| format!("{path}: {e}"))?;
    kib_of(&status, field).ok_or_else(|| format!("{path}: no {field} line"))
}

/// A `/proc/PID/status` text's `field`, in KiB.
fn kib_of(status: &str, field: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with(field))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// What a tenant still holds in the table, as "name: counter N, ..."
/// ("" when nothing).
fn held(usage: &[mtrdma::core::table::TenantUsage]) -> String {
    let mut left = Vec::new();
    for u in usage {
        for (what, n) in [
            ("queue pairs", u.qps.0),
            ("region bytes", u.mr_bytes.0),
            ("outstanding requests", u.outstanding_wr),
            ("backlog bytes", u.backlog_bytes),
            ("processes", u64::from(u.processes)),
        ] {
            if n != 0 {
                left.push(format!("{} {what} {n}", u.name));
            }
        }
    }
    left.join(", ")
}

impl Site<'_> {
    /// Waits up to `limit` for every tenant's holdings in the table to be
    /// back to zero; what is still held then ("" if nothing).
    fn settle(&self, limit: Duration) -> String {
        let start = Instant::now();
        loop {
            let left = match mtrdma::core::QuotaTable::open(&self.table).and_then(|t| t.usage()) {
                Ok(usage) => held(&usage),
                Err(e) => format!("the table could not be read: {e}"),
            };
            if left.is_empty() || start.elapsed() >= limit {
                return left;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Rewrites the policy file with the `n`th variation: tenant `bulk1`'s
    /// weight 2 when `n` is odd, 1 when even. The coordinator sees the
    /// file change and reloads it.
    fn rewrite_policy(&self, n: usize) -> Result<(), String> {
        let text = std::fs::read_to_string(&self.policy)
            .map_err(|e| format!("{}: {e}", self.policy.display()))?;
        let marker = "name = \"bulk1\"\n";
        let weight = if n % 2 == 1 { "weight = 2\n" } else { "" };
        let mut out = String::new();
        let mut skip_weight = false;
        for line in text.split_inclusive('\n') {
            if skip_weight {
                skip_weight = false;
                if line.starts_with("weight = ") {
                    continue;
                }
            }
            out.push_str(line);
            if line == marker {
                out.push_str(weight);
                skip_weight = true;
            }
        }
        if !text.contains(marker) {
            return Err(format!("{}: no tenant bulk1", self.policy.display()));
        }
        std::fs::write(&self.policy, out).map_err(|e| format!("{}: {e}", self.policy.display()))
    }

    /// Lines of every coordinator's log (the first's and each restarted
    /// one's) that contain `text`.
    fn coordinator_log_lines(&self, text: &str) -> Result<usize, String> {
        let dir = self.args.out.join("logs");
        let mut n = 0;
        for entry in std::fs::read_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))? {
            let path = entry.map_err(|e| e.to_string())?.path();
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if name.starts_with("coordinator") && name.ends_with(".log") {
                let log = std::fs::read_to_string(&path).unwrap_or_default();
                n += log.lines().filter(|l| l.contains(text)).count();
            }
        }
        Ok(n)
    }
}

impl Proc {
    /// [`Proc::wait`], but a process still running at `deadline` is
    /// killed and reported as stuck.
    fn wait_until(mut self, deadline: Instant) -> Result<String, String> {
        loop {
            match self.child.try_wait() {
                Ok(Some(_)) => return self.wait(),
                Ok(None) if Instant::now() >= deadline => {
                    let _ = self.child.kill();
                    let _ = self.child.wait();
                    return Err(format!(
                        "{} was still running past its deadline (a request that never completed?); its output: {}",
                        self.name,
                        self.stdout.display()
                    ));
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(50)),
                Err(e) => return Err(format!("waiting for {}: {e}", self.name)),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_soak_runs_at_least_a_round_for_each_coordinator_life() {
        assert_eq!(rounds(1.0), 3);
        assert_eq!(rounds(60.0), 8);
        assert_eq!(rounds(3_600.0), 480);
        let s = Duration::from_secs_f64;
        // However short the soak, three rounds, the coordinator restarted
        // in the second and the third.
        assert!(another_round(2, s(5.0), 1.0) && !another_round(3, s(5.0), 1.0));
        assert!(!restarts_coordinator(0, s(5.0), 1.0, 0));
        assert!(restarts_coordinator(1, s(5.0), 1.0, 0));
        assert!(restarts_coordinator(2, s(5.0), 1.0, 1));
        assert!(!restarts_coordinator(3, s(5.0), 1.0, 2));
        // A minute: the first rounds to start after 20 and 40 s.
        assert!(!restarts_coordinator(2, s(14.8), 60.0, 0));
        assert!(restarts_coordinator(3, s(22.2), 60.0, 0));
        assert!(!restarts_coordinator(4, s(29.6), 60.0, 1));
        assert!(restarts_coordinator(6, s(44.4), 60.0, 1));
        assert!(another_round(8, s(59.2), 60.0) && !another_round(9, s(66.6), 60.0));
    }

    #[test]
    fn the_resident_set_is_read_from_proc_status() {
        let status = "Name:\tcoordinator\nVmRSS:\t    5432 kB\nRssAnon:\t    1200 kB\n\
                      RssFile:\t    3000 kB\nRssShmem:\t    1232 kB\nThreads:\t1\n";
        assert_eq!(kib_of(status, "RssAnon:"), Some(1200));
        assert_eq!(kib_of(status, "RssShmem:"), Some(1232));
        assert_eq!(kib_of("Name:\tx\n", "RssAnon:"), None);
    }
}
