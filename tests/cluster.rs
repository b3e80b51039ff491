//! The coordinator example on two hosts' worth of coordinators sharing
//! through a real etcd (three members on loopback): `put-policy` makes a
//! policy file the cluster's, both coordinators apply it, `hosts` shows
//! what each reports, and a coordinator killed with SIGKILL leaves its
//! share to the other once its lease runs out.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{example, lines_starting, run};
use mtrdma::core::cluster::etcd::LocalEtcd;
use mtrdma::core::coordinator::register;
use mtrdma::core::QuotaTable;

/// A policy of one tenant, kv, whose processes are this test's user's,
/// with `extra` settings.
fn policy(extra: &str) -> String {
    let uid = rustix::process::getuid().as_raw();
    format!(
        "[link]\ncapacity = \"1Gbit\"\n\n[[tenant]]\nid = 1\nname = \"kv\"\n{extra}\n\
         [[tenant.match]]\nuid = {uid}\n"
    )
}

struct Host {
    child: Child,
    policy_lines: std::sync::mpsc::Receiver<String>,
}

/// Host `host`'s table.
fn table(host: &str) -> String {
    format!("cluster-{host}-{}", std::process::id())
}

fn start(dir: &Path, host: &str, endpoints: &str) -> Host {
    let mut child = Command::new(example("coordinator"))
        .args(["--policy", dir.join("local.toml").to_str().unwrap()])
        .args(["--table", &table(host)])
        .args([
            "--socket",
            dir.join(format!("{host}.sock")).to_str().unwrap(),
        ])
        .args(["--etcd", endpoints, "--etcd-prefix", "/example/"])
        .args(["--host", host, "--etcd-ttl", "2", "--quiet"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("start the coordinator example");
    let (policy_lines, _) = lines_starting(child.stdout.take().unwrap(), "policy from etcd");
    Host {
        child,
        policy_lines,
    }
}

/// `hosts` until its output satisfies `done`, for at most `patience`.
fn hosts_until(endpoints: &str, patience: Duration, done: impl Fn(&str) -> bool) -> String {
    let start = Instant::now();
    loop {
        let out = run(Command::new(example("coordinator")).args([
            "hosts",
            "--etcd",
            endpoints,
            "--etcd-prefix",
            "/example/",
        ]));
        if done(&out) {
            return out;
        }
        assert!(
            start.elapsed() < patience,
            "not within {patience:?}:\n{out}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn coordinators_apply_the_clusters_policy_share_its_cap_and_a_killed_ones_share_goes_to_the_other()
{
    let dir: PathBuf = std::env::temp_dir().join(format!("mtrdma-cluster-{}", std::process::id()));
    let etcd = LocalEtcd::start(&dir.join("etcd"), "example").unwrap();
    let endpoints = etcd.endpoints().join(",");
    // The local policy each coordinator starts on, before etcd's; the
    // cluster's: kv may move 100 Mbit/s on all hosts together.
    std::fs::write(dir.join("local.toml"), policy("")).unwrap();
    std::fs::write(
        dir.join("cluster.toml"),
        policy("cluster_cap = \"100Mbit\""),
    )
    .unwrap();

    // A policy that is not one is refused before it reaches etcd.
    std::fs::write(dir.join("bad.toml"), "[link]\ncapacity = \"fast\"\n").unwrap();
    let refused = Command::new(example("coordinator"))
        .args(["put-policy", dir.join("bad.toml").to_str().unwrap()])
        .args(["--etcd", &endpoints, "--etcd-prefix", "/example/"])
        .output()
        .unwrap();
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("capacity"));

    let put = run(Command::new(example("coordinator"))
        .args(["put-policy", dir.join("cluster.toml").to_str().unwrap()])
        .args(["--etcd", &endpoints, "--etcd-prefix", "/example/"]));
    assert!(put.contains("etcd revision"), "{put}");

    let mut a = start(&dir, "a", &endpoints);
    let mut b = start(&dir, "b", &endpoints);
    for host in [&a, &b] {
        let line = host
            .policy_lines
            .recv_timeout(Duration::from_secs(20))
            .expect("the coordinator applies the cluster's policy");
        assert!(
            line.ends_with("1 tenants, 1 limited across hosts"),
            "{line}"
        );
    }
    // A host reports the tenants with processes there: none yet.
    hosts_until(&endpoints, Duration::from_secs(10), |out| {
        out.matches("policy revision").count() == 2 && !out.contains("tenant 1")
    });
    // This process joins kv on both hosts. Neither wants anything yet:
    // the cap is split evenly.
    let _on_a = register(&dir.join("a.sock")).expect("registered with a");
    let _on_b = register(&dir.join("b.sock")).expect("registered with b");
    let both = hosts_until(&endpoints, Duration::from_secs(10), |out| {
        out.matches("tenant 1: wants 0.0 Mbit/s, share 50.0 Mbit/s")
            .count()
            == 2
    });
    assert!(
        both.contains("host a:") && both.contains("host b:"),
        "{both}"
    );

    // b's coordinator is killed: its report goes with its lease, and a
    // gives its host the whole cap.
    b.child.kill().unwrap();
    b.child.wait().unwrap();
    let alone = hosts_until(&endpoints, Duration::from_secs(2 + 5), |out| {
        !out.contains("host b:") && out.contains("share 100.0 Mbit/s")
    });
    assert!(alone.contains("host a:"), "{alone}");

    // a stopped as an operator stops it: its report goes at once.
    rustix::process::kill_process(
        rustix::process::Pid::from_child(&a.child),
        rustix::process::Signal::TERM,
    )
    .unwrap();
    assert!(a.child.wait().unwrap().success());
    hosts_until(&endpoints, Duration::from_secs(1), |out| {
        out.contains("no host reports")
    });
    drop(etcd);
    // The killed coordinator's table stays, as a crashed one's does.
    QuotaTable::remove(&table("b")).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}
