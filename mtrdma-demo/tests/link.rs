//! Protection across processes on the VM's shared link (`cargo xtask vm
//! --link RATE`): a latency tenant and bulk tenants, each an `perf`
//! process of its own, senders on the link's sender device and servers on
//! its receiver. Unprotected, the bulk tenants' WRITEs fill the link's
//! queue; with delay windows the latency tenant's p99 is several times
//! lower. The latency tenant runs at real-time CPU priority, as in the
//! link demo, so that its tail is the link's queue and not its wait for
//! one of the emulated host's two CPUs. Ignored on a plain `cargo test`; `cargo xtask test` runs it in
//! the SoftRoCE VM, where the link is set up.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

// Not every test file uses all of what the tests share.
mod common;
use common::{demo_run, result_row, ISOLATION, PERF};
use mtrdma_demo::{probe_realtime_works, PROBE_PRIORITY};

/// The link's sender and receiver devices, or `None` (said on stderr)
/// outside the VM when no link is set up (a real host has no such pair).
fn link() -> Option<(String, String)> {
    match (
        std::env::var("MTRDMA_LINK_SENDER"),
        std::env::var("MTRDMA_LINK_RECEIVER"),
    ) {
        (Ok(s), Ok(r)) => Some((s, r)),
        _ => {
            assert!(
                std::env::var_os("MTRDMA_VM").is_none(),
                "inside the VM the device tests run with `--link`: MTRDMA_LINK_SENDER/RECEIVER are missing"
            );
            eprintln!(
                "no shared link (MTRDMA_LINK_SENDER/RECEIVER): nothing to measure on this host"
            );
            None
        }
    }
}

fn perf(args: &[&str]) -> Command {
    let mut cmd = Command::new(PERF);
    cmd.args(args);
    cmd
}

fn spawn(cmd: &mut Command) -> Child {
    cmd.stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start perf")
}

/// Packets `device` has sent (SoftRoCE's `sent_pkts` counter), if the
/// provider keeps that counter.
fn sent_packets(device: &str) -> Option<u64> {
    let path = format!("/sys/class/infiniband/{device}/ports/1/hw_counters/sent_pkts");
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// Waits until the bulk tenants are moving (at least a second, and until
/// `sender` sends 64 packets or more in a quarter of a second): on a busy
/// emulated host they may take seconds to start and connect, and a probe
/// that starts before them measures an idle link.
fn wait_for_bulk(sender: &str) {
    let start = std::time::Instant::now();
    let Some(mut before) = sent_packets(sender) else {
        std::thread::sleep(Duration::from_secs(1));
        return;
    };
    loop {
        std::thread::sleep(Duration::from_millis(250));
        let now = sent_packets(sender).unwrap_or(before);
        let moving = now.saturating_sub(before) >= 64;
        if moving && start.elapsed() >= Duration::from_secs(1) {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the bulk tenants sent {} packets in the last 250 ms after 20 s: they did not start",
            now.saturating_sub(before)
        );
        before = now;
    }
}

/// The latency tenant's p99 (us) next to unprotected bulk tenants (raw
/// 1 MiB WRITEs): the baseline of the tests below, measured once in a
/// test process (on ports 28,000 and up, below the ephemeral ports, as
/// `mtrdma_demo::SERVER_PORTS`).
fn unprotected_p99(sender: &str, receiver: &str) -> f64 {
    static P99: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    let port = 28_000 + (std::process::id() % 1_000) as u16 * 4;
    *P99.get_or_init(|| p99_next_to_bulk(sender, receiver, port, &["-s", "1M", "--path", "raw"]))
}

/// `perf`, at [`PROBE_PRIORITY`] when `chrt` works here (it does in the
/// VM, as root), else at normal priority, said once on stderr.
fn probe_perf() -> Command {
    static REALTIME: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    if *REALTIME.get_or_init(|| probe_realtime_works("link tests")) {
        let mut chrt = Command::new("chrt");
        chrt.args(["-f", PROBE_PRIORITY, PERF]);
        chrt
    } else {
        Command::new(PERF)
    }
}

/// The latency tenant's p99 (us) next to `bulk` tenants run with `way`.
fn p99_next_to_bulk(sender: &str, receiver: &str, port: u16, way: &[&str]) -> f64 {
    let bulk = 2u16;
    let mut children = Vec::new();
    for i in 0..=bulk {
        let p = (port + i).to_string();
        children.push(spawn(&mut perf(&[
            "--server", "--device", receiver, "-p", &p,
        ])));
    }
    for (i, server) in (0..).zip(children.iter_mut()) {
        common::wait_listening(server, port + i, "a perf server");
    }
    // A client of the server on `port`, on the sender device.
    let client = |mut cmd: Command, port: u16, args: &[&str]| {
        cmd.args(["--connect", "127.0.0.1", "--device", sender])
            .args(["-p", &port.to_string()])
            .args(args);
        cmd
    };
    for i in 1..=bulk {
        let mut bulk_args = vec![
            "--test",
            "write_bw",
            "-D",
            "6",
            "--wait",
            "--ack-timeout",
            "20",
        ];
        bulk_args.extend_from_slice(way);
        children.push(spawn(&mut client(perf(&[]), port + i, &bulk_args)));
    }
    wait_for_bulk(sender);
    let out = client(
        probe_perf(),
        port,
        &[
            "--test",
            "write_comp_lat",
            "-s",
            "16",
            "-D",
            "3",
            "--path",
            "raw",
            // An open-loop probe (a request every 500 us, sleeping between
            // them): back-to-back requests would sample stalls once each
            // however long they last.
            "--wait",
            "--interval",
            "500",
        ],
    )
    .output()
    .expect("run the latency tenant");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    for child in children {
        let done = child.wait_with_output().expect("a tenant process");
        assert!(
            done.status.success(),
            "a tenant failed: {}\n{}",
            String::from_utf8_lossy(&done.stdout),
            String::from_utf8_lossy(&done.stderr)
        );
    }
    assert!(out.status.success(), "the latency tenant failed:\n{text}");
    // bytes iters t_min t_max t_typical t_avg t_stdev p99 p99.9
    let row = result_row(&text);
    row[7]
}

#[test]
#[ignore = "needs the VM's shared link (cargo xtask vm --link RATE)"]
fn delay_windows_keep_the_latency_tenant_s_p99_far_below_unprotected() {
    let Some((sender, receiver)) = link() else {
        return;
    };
    let base = 20_000 + (std::process::id() % 1_000) as u16 * 8;
    let unprotected = unprotected_p99(&sender, &receiver);
    let windowed = p99_next_to_bulk(
        &sender,
        &receiver,
        base + 4,
        &[
            "-s",
            "64K",
            "--path",
            "mtrdma",
            "--window",
            "--chunk",
            "2048",
            "--pieces",
            "64",
            // 16 requests out: what is in flight when the test ends drains
            // in moments even at a small window.
            "--pool-mib",
            "1",
        ],
    );
    eprintln!("latency tenant p99: {unprotected:.1} us unprotected, {windowed:.1} us with windows");
    assert!(
        windowed * 5.0 < unprotected,
        "p99 {windowed:.1} us with windows is not several times below {unprotected:.1} us unprotected"
    );
}

/// Protection is the operator's: bulk tenants on `ScheduleConfig`'s
/// defaults (what the README's example runs: a queue pair of the tenant,
/// `scheduled(ScheduleConfig::default())`), and bulk tenants whose code
/// asks for no window and 1 MiB pieces, are held to the policy's
/// `latency_bound` all the same. Each bulk tenant is an `perf`
/// process on an embedded quota table of a policy with a 16 KiB bound,
/// sending 1 MiB WRITEs; nothing on its command line asks for protection.
#[test]
#[ignore = "needs the VM's shared link (cargo xtask vm --link RATE)"]
fn a_latency_bound_in_the_policy_protects_tenants_that_did_not_ask_for_it() {
    let Some((sender, receiver)) = link() else {
        return;
    };
    let dir = std::env::temp_dir().join(format!("mtrdma-bound-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let policy = dir.join("policy.toml");
    std::fs::write(
        &policy,
        "[link]\ncapacity = \"100Gbit\"\nlatency_bound = \"16KiB\"\n\
         [[tenant]]\nid = 1\nname = \"bulk\"\n",
    )
    .unwrap();
    let policy = policy.display().to_string();
    let base = 24_000 + (std::process::id() % 1_000) as u16 * 8;
    let unprotected = unprotected_p99(&sender, &receiver);
    let tenant = [
        "-s", "1M", "--path", "mtrdma", "--policy", &policy, "--tenant", "bulk",
    ];
    let defaults = p99_next_to_bulk(&sender, &receiver, base + 4, &tenant);
    let mut loose = tenant.to_vec();
    loose.extend(["--chunk", "1M", "--pieces", "64"]);
    let loosened = p99_next_to_bulk(&sender, &receiver, base + 8, &loose);
    eprintln!(
        "latency tenant p99: {unprotected:.1} us unprotected, {defaults:.1} us next to tenants \
         on their defaults, {loosened:.1} us next to tenants asking for no window and 1 MiB pieces"
    );
    for (what, p99) in [
        ("on their defaults", defaults),
        ("asking for less", loosened),
    ] {
        assert!(
            p99 * 5.0 < unprotected,
            "p99 {p99:.1} us next to bulk tenants {what} under a 16 KiB bound is not several \
             times below {unprotected:.1} us unprotected"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The link demo's `scenario`: its section of the report (from the line
/// starting with `header` to the next section), and the directory the
/// run wrote its files in. In `cargo xtask test`'s boot the demo's short
/// form has run every scenario already (`MTRDMA_DEMO_SHORT` names its
/// output directory), and that run is what is checked; elsewhere
/// `isolation --link --scenarios SCENARIO --seconds 2` runs here.
/// Fails the test if the scenario did not run.
fn isolation(scenario: &str, header: &str) -> (String, std::path::PathBuf) {
    let (text, out_dir) = demo_run(
        "link",
        |out_dir| {
            let record = std::fs::read_to_string(out_dir.join("scenarios.tsv"))
                .expect("the demo's short form recorded its scenarios");
            let line = record
                .lines()
                .find(|l| l.split('\t').next() == Some(scenario))
                .unwrap_or_else(|| panic!("the demo's short form has no {scenario}:\n{record}"));
            assert_eq!(
                line,
                format!("{scenario}\tran"),
                "the demo's short form ran {scenario}"
            );
        },
        format!("mtrdma-{scenario}-{}", std::process::id()),
        |out_dir| run_isolation(scenario, "2", out_dir),
    );
    let section: Vec<&str> = text
        .lines()
        .skip_while(|l| !l.starts_with(header))
        .enumerate()
        .take_while(|(i, l)| *i == 0 || !(l.starts_with("== ") || l.starts_with("scenarios: ")))
        .map(|(_, l)| l)
        .collect();
    assert!(!section.is_empty(), "no section {header:?} in:\n{text}");
    (section.join("\n"), out_dir)
}

/// `isolation --link --scenarios SCENARIO --seconds SECS --out OUT_DIR`:
/// what it printed, which must be a success.
fn run_isolation(scenario: &str, secs: &str, out_dir: &std::path::Path) -> String {
    let out = Command::new(ISOLATION)
        .args([
            "--link",
            "--scenarios",
            scenario,
            "--seconds",
            secs,
            "--out",
        ])
        .arg(out_dir)
        .output()
        .expect("start isolation");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "isolation failed:\n{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

/// [`isolation`]'s `scenario` on the VM's shared link, or `None` on a
/// host without one.
fn isolation_on_link(scenario: &str, header: &str) -> Option<(String, std::path::PathBuf)> {
    link()?;
    Some(isolation(scenario, header))
}

/// The adversarial table, in short (`isolation --link --scenarios
/// attack`): a victim tenant next to each attacker, unprotected and with
/// mtrdma. Every attacker gets a verdict both ways; with mtrdma the
/// flooding attacker is held to its policy's 1,000 work requests/s, where
/// unprotected it posts several times as many.
#[test]
#[ignore = "needs the VM's shared link (cargo xtask vm --link RATE)"]
fn the_adversarial_table_holds_each_attacker_to_its_policy() {
    let Some((text, out_dir)) = isolation_on_link("attack", "== adversarial") else {
        return;
    };
    // (way, attacker op/s, verdict) of an attacker's rows.
    let rows = |label: &str| -> Vec<(String, f64, String)> {
        text.lines()
            .filter_map(|l| l.strip_prefix(label))
            .map(|rest| {
                let w: Vec<&str> = rest.split_whitespace().collect();
                assert_eq!(w.len(), 7, "a row of {label}: {rest}");
                (
                    w[0].to_string(),
                    w[3].parse().expect("op/s"),
                    w[6].to_string(),
                )
            })
            .collect()
    };
    for label in [
        "8 B WRITE flood",
        "8 B READ flood",
        "8 B atomic flood",
        "UD flood",
        "QP/MR storm",
        "MR 1K-64M storm",
        "RNR storm",
    ] {
        let r = rows(label);
        let ways: Vec<&str> = r.iter().map(|(w, _, _)| w.as_str()).collect();
        assert_eq!(ways, ["unprotected", "mtrdma"], "{label}:\n{text}");
        assert!(
            r.iter().all(|(_, _, v)| v == "pass" || v == "FAIL"),
            "{label}: {r:?}"
        );
    }
    // The policy's cap, as the table's header says it.
    let cap: f64 = text
        .split("the flooding attackers ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("the header names the flooding attackers' cap:\n{text}"));
    let writes = rows("8 B WRITE flood");
    assert!(
        writes[1].1 <= 1.2 * cap,
        "with mtrdma the flood keeps to its {cap} requests/s: {writes:?}"
    );
    assert!(
        writes[0].1 > 2.0 * writes[1].1,
        "unprotected, the flood posts far more: {writes:?}"
    );
    let atomics = rows("8 B atomic flood");
    assert!(
        atomics[1].1 <= 1.2 * cap,
        "with mtrdma the atomic flood keeps to its {cap} requests/s: {atomics:?}"
    );
    let ud = rows("UD flood");
    assert!(
        ud[1].1 <= 1.2 * cap,
        "with mtrdma the UD flood keeps to its {cap} requests/s: {ud:?}"
    );
    assert!(text.contains("not reproducible on rxe"), "{text}");
    if std::env::var_os("MTRDMA_DEMO_SHORT").is_none() {
        std::fs::remove_dir_all(&out_dir).ok();
    }
}

/// The applications scenario, in short (`isolation --link
/// --scenarios apps`): the RPC service alone, next to the pager
/// unprotected and with mtrdma. Every run answers the RPC service's
/// requests, the pager moves pages in both runs, and no page comes back
/// corrupt.
#[test]
#[ignore = "needs the VM's shared link (cargo xtask vm --link RATE)"]
fn the_applications_scenario_serves_the_rpc_and_pages_without_corruption() {
    let Some((text, out_dir)) = isolation_on_link("apps", "== applications") else {
        return;
    };
    // way p50 p99 p99.9 req/s lost pager-MB/s page-in-p99 of-link corrupt
    let row = |way: &str| -> Vec<String> {
        text.lines()
            .map(|l| l.split_whitespace().map(String::from).collect::<Vec<_>>())
            .find(|w| w.len() == 10 && w[0] == way)
            .unwrap_or_else(|| panic!("no {way} row:\n{text}"))
    };
    for way in ["alone", "unprotected", "mtrdma"] {
        let w = row(way);
        let rps: f64 = w[4].parse().expect("req/s");
        assert!(rps > 10.0, "the RPC service ran {way}: {w:?}");
        if way != "alone" {
            let moved: f64 = w[6].parse().expect("pager MB/s");
            assert!(moved > 0.5, "the pager ran {way}: {w:?}");
            assert_eq!(w[9], "0", "no page read back corrupt {way}: {w:?}");
        }
    }
    assert!(
        text.contains("pages read back corrupt: 0 (target 0): met"),
        "{text}"
    );
    assert!(out_dir.join("apps_rpc_cdf.png").exists() || out_dir.join("apps_rpc_cdf.svg").exists());
}

/// The one-piece floor end to end (`mtrdma::sched::piece_floor`): in the
/// latency scenario the probe posts through mtrdma as the latency
/// tenant's scheduled queue pair, its engine reports its delays with and
/// without the floor to the coordinator through the quota table, and the
/// coordinator, once it has the probe's reference, gives the floor to the
/// bulk tenants' windows (its log says so, `one-piece floor: given to N
/// of M windowed tenants`). The scenario's verdicts on the bound are the
/// demo's own, checked in its report.
#[test]
#[ignore = "needs the VM's shared link (cargo xtask vm --link RATE)"]
fn the_latency_tenant_s_delays_give_the_bulk_tenants_the_one_piece_floor() {
    let Some((text, out_dir)) = isolation_on_link("latency", "== latency tenant") else {
        return;
    };
    assert!(
        text.contains("mtrdma"),
        "the latency scenario ran no tenants with mtrdma:\n{text}"
    );
    let log = std::fs::read_to_string(out_dir.join("logs").join("coordinator.log"))
        .expect("the demo keeps the coordinator's log");
    let given: Vec<(u32, u32)> = log
        .lines()
        .filter_map(|l| {
            let rest = l.strip_prefix("one-piece floor: given to ")?;
            let mut words = rest.split_whitespace();
            let n = words.next()?.parse().ok()?;
            let of = words.nth(1)?.parse().ok()?;
            Some((n, of))
        })
        .collect();
    assert!(
        given.iter().any(|&(n, of)| n >= 1 && n <= of),
        "the coordinator never gave a bulk tenant the floor; its floor lines: {given:?}"
    );
}

/// Cluster-wide shares on the link (`isolation --link --scenarios
/// cluster`): each end of the link a host with its own coordinator, joined
/// through a three-member etcd. A tenant's one sender has the whole
/// cluster-wide cap, two senders on the two hosts split it, two tenants of
/// equal cluster weight share the cluster's capacity evenly, and a lost
/// host's share goes to the other host once its lease runs out. The demo's report gives
/// the figures against the targets (within 2% of the cap, Jain 0.99);
/// here, bounds a broken split cannot meet on a noisy emulated host.
#[test]
#[ignore = "needs the VM's shared link (cargo xtask vm --link RATE)"]
fn cluster_wide_caps_and_weights_hold_across_the_links_two_hosts() {
    if link().is_none() {
        return;
    }
    let out_dir = std::env::temp_dir().join(format!("mtrdma-cluster-{}", std::process::id()));
    let text = run_isolation("cluster", "3", &out_dir);
    // rxa MB/s, rxb MB/s, sum / cap of the row starting with `case`.
    let row = |case: &str| -> (f64, f64, f64) {
        let line = text
            .lines()
            .find(|l| l.starts_with(case))
            .unwrap_or_else(|| panic!("no row {case:?} in:\n{text}"));
        // The case's words, then its four numbers.
        let w: Vec<f64> = line[case.len()..]
            .split_whitespace()
            .filter_map(|v| v.parse().ok())
            .take(4)
            .collect();
        assert_eq!(w.len(), 4, "four numbers in {line:?}");
        (w[0], w[1], w[3])
    };
    // What two senders move depends on the emulated CPUs they share
    // with their servers and the host's other work: the cap is never
    // exceeded and the split is even, whatever they reach.
    let (_, alone, alone_of_cap) = row("cap, rxb's sender alone");
    assert!(
        (0.8..=1.1).contains(&alone_of_cap),
        "alone: {alone_of_cap} of the cap\n{text}"
    );
    let (a, b, both_of_cap) = row("cap, a sender on each host");
    assert!(
        (0.6..=1.1).contains(&both_of_cap),
        "both: {both_of_cap} of the cap\n{text}"
    );
    for host in [a, b] {
        assert!(
            (0.35 * (a + b)..=0.65 * (a + b)).contains(&host),
            "each host about half: {a} and {b} MB/s (alone {alone})\n{text}"
        );
    }
    let (one, two, weights_of_cap) = row("capacity, tenant one on rxa, two on rxb");
    assert!(
        weights_of_cap <= 1.1,
        "equal weights: {weights_of_cap} of the capacity\n{text}"
    );
    let jain = mtrdma::sched::stats::jain_index(&[one, two]);
    assert!(
        jain >= 0.95,
        "equal weights across hosts: {one} and {two} MB/s\n{text}"
    );
    let (alive, _, alive_of_cap) = row("cap, rxb's host lost");
    assert!(
        (0.75..=1.1).contains(&alive_of_cap),
        "the surviving host takes more than its half, up to the cap: {alive} MB/s, {alive_of_cap} of it\n{text}"
    );
    let _ = std::fs::remove_dir_all(&out_dir);
}
