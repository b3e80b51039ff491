//! Coordinators sharing through a real etcd: a three-member etcd cluster on
//! loopback, started by each test (`etcd` from Debian's etcd-server, which
//! `cargo xtask deps` installs), with members stopped under it.
//!
//! Run with `cargo test -p mtrdma-core --features etcd --test etcd`.

use std::collections::BTreeMap;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mtrdma_core::cluster::etcd::{self, Cluster, ClusterNews, EtcdConfig, EtcdError, LocalEtcd};
use mtrdma_core::cluster::ALL;
use mtrdma_core::coordinator::Coordinator;
use mtrdma_core::{ClusterPolicy, ClusterTenant, TenantId};

/// A three-member etcd cluster for test `tag`.
fn etcd(tag: &str) -> LocalEtcd {
    let dir = std::env::temp_dir().join(format!("mtrdma-etcd-{tag}-{}", std::process::id()));
    LocalEtcd::start(&dir, tag).unwrap()
}

/// `etcdctl` (v3 API) against `endpoints`: its output, or why it failed.
fn etcdctl(endpoints: &[String], args: &[&str]) -> Result<String, String> {
    let out = Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={}", endpoints.join(",")))
        .arg("--dial-timeout=1s")
        .args(args)
        .output()
        .map_err(|e| format!("etcdctl: {e}; install Debian's etcd-client: cargo xtask deps"))?;
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    out.status.success().then_some(text.clone()).ok_or(text)
}

fn config(etcd: &LocalEtcd, prefix: &str, host: &str) -> EtcdConfig {
    EtcdConfig {
        endpoints: etcd.endpoints(),
        prefix: prefix.into(),
        host: host.into(),
        ttl_secs: 2,
        cache: None,
    }
}

const MB: u64 = 1_000_000;

/// A policy whose tenant 1 may hold `max_qps` queue pairs.
fn policy(max_qps: u32) -> String {
    format!(
        "[link]\ncapacity = 1000000000\n\n[[tenant]]\nid = 1\nname = \"kv\"\nmax_qps = {max_qps}\n"
    )
}

#[path = "common/setup.rs"]
mod setup;
use setup::Setup;

/// Ticks the coordinator and steps its cluster until `done` holds of what
/// a step said (each step's news goes to `seen` too), for at most
/// `patience`: how long it took.
fn until(
    c: &mut Coordinator,
    cluster: &mut Cluster,
    patience: Duration,
    seen: &mut Vec<ClusterNews>,
    mut done: impl FnMut(&ClusterNews) -> bool,
) -> Duration {
    let start = Instant::now();
    loop {
        let now = c.table().now_ns();
        c.tick(now);
        let news = cluster.step(c, now);
        let hit = done(&news);
        seen.push(news);
        if hit {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < patience,
            "not within {patience:?}: {seen:#?}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn a_coordinator_applies_the_clusters_policy_within_a_second_and_keeps_it_while_etcd_is_away() {
    let mut etcd = etcd("policy");
    let s = Setup::new("etcd-policy", &policy(2));
    let mut c = Coordinator::start(s.config.clone()).unwrap();
    let cache = s.dir.join("from-etcd.toml");
    let mut kept = config(&etcd, "/p/", "a");
    kept.cache = Some(cache.clone());
    let mut cluster = Cluster::start(kept).unwrap();
    let tenant = c.table().attach(TenantId(1)).unwrap();
    let mut held: Vec<_> = (0..2).map(|_| tenant.acquire_qp().unwrap()).collect();
    assert!(tenant.acquire_qp().is_err(), "the file's quota");
    let mut seen = Vec::new();
    let long = Duration::from_secs(10);
    until(&mut c, &mut cluster, long, &mut seen, |n| n.connected);

    // A policy put into etcd applies within a second.
    let endpoints = etcd.endpoints();
    etcd::put_policy(&endpoints, "/p/", &policy(3)).unwrap();
    let took = until(&mut c, &mut cluster, long, &mut seen, |n| {
        n.policy_applied.is_some()
    });
    eprintln!("policy applied {took:?} after it was put");
    assert!(took < Duration::from_secs(1), "applied after {took:?}");
    held.push(tenant.acquire_qp().expect("etcd's policy raised the quota"));
    assert!(tenant.acquire_qp().is_err());
    // The file no longer counts.
    std::fs::write(&s.config.policy_path, policy(9)).unwrap();

    // A policy that is not one is refused by put_policy, and by the
    // coordinator when written past it: the last one stays.
    assert!(matches!(
        etcd::put_policy(&endpoints, "/p/", "[link]\ncapacity = \"fast\"\n"),
        Err(EtcdError::Policy(_))
    ));
    etcdctl(&endpoints, &["put", "/p/policy", "[[tenant]]\nid = \"x\""]).unwrap();
    until(&mut c, &mut cluster, long, &mut seen, |n| {
        n.policy_refused.is_some()
    });
    assert!(
        tenant.acquire_qp().is_err(),
        "still etcd's last good policy"
    );

    // One member stopped: nothing changes; a new policy still applies.
    etcd.stop(0);
    etcd::put_policy(&endpoints, "/p/", &policy(4)).unwrap();
    let before = seen.len();
    until(&mut c, &mut cluster, long, &mut seen, |n| {
        n.policy_applied.is_some()
    });
    held.push(
        tenant
            .acquire_qp()
            .expect("the policy written with a member down"),
    );
    assert!(
        seen[before..].iter().all(|n| n.lost.is_none()),
        "a member stopped is not etcd lost: {:#?}",
        &seen[before..]
    );

    // All stopped: said, and the last policy holds; the coordinator goes
    // on serving.
    etcd.stop(1);
    etcd.stop(2);
    let lost = until(&mut c, &mut cluster, long, &mut seen, |n| n.lost.is_some());
    eprintln!("etcd's loss said {lost:?} after its last member stopped");
    assert!(lost < Duration::from_secs(5), "lost said after {lost:?}");
    for _ in 0..50 {
        let now = c.table().now_ns();
        c.tick(now);
        cluster.step(&mut c, now);
    }
    assert_eq!(c.policy().tenants[0].max_qps, 4);
    assert!(tenant.acquire_qp().is_err(), "no limit lifted without etcd");

    // A coordinator started now, on its own file's policy, starts from
    // the policy etcd last gave (kept in the cache file).
    let (revision, kept) = etcd::cached_policy(&cache).expect("the last policy applied is kept");
    assert_eq!(
        (revision, &kept),
        (
            cluster.policy_revision(),
            &mtrdma_core::Policy::from_toml_str(&policy(4)).unwrap()
        )
    );
    let again = Setup::new("etcd-restarted", &policy(2));
    let mut restarted = Coordinator::start(again.config.clone()).unwrap();
    let mut rejoined = config(&etcd, "/p/", "a2");
    rejoined.cache = Some(cache.clone());
    let mut rejoined = Cluster::start(rejoined).unwrap();
    assert_eq!(
        rejoined.policy_revision(),
        revision,
        "etcd's copy is not applied again"
    );
    let kept = rejoined.take_kept_policy().expect("the kept policy, once");
    assert_eq!(rejoined.take_kept_policy(), None);
    restarted.apply_policy(kept).unwrap();
    assert_eq!(restarted.policy().tenants[0].max_qps, 4);
    rejoined.leave();
    restarted.shutdown(true).unwrap();
    // A kept file that is not a policy is not one.
    std::fs::write(
        &cache,
        "# mtrdma: the cluster's policy from etcd, revision 9\n[link]\n",
    )
    .unwrap();
    assert_eq!(etcd::cached_policy(&cache), None);

    // Back: the coordinator reconnects on its own and hears what changed.
    etcd.resume(&[0, 1, 2]).unwrap();
    until(&mut c, &mut cluster, long, &mut seen, |n| n.connected);
    etcd::put_policy(&endpoints, "/p/", &policy(5)).unwrap();
    until(&mut c, &mut cluster, long, &mut seen, |n| {
        n.policy_applied.is_some()
    });
    held.push(
        tenant
            .acquire_qp()
            .expect("the policy put after etcd came back"),
    );
    drop(held);
    cluster.leave();
}

/// Steps both hosts, each wanting its demand of tenant 1, until `done`
/// holds of their shares: how long it took.
fn shares_until(
    hosts: &mut [(&mut Cluster, u64)],
    cluster_policy: &Arc<ClusterPolicy>,
    patience: Duration,
    mut done: impl FnMut(&[u64]) -> bool,
) -> Duration {
    let start = Instant::now();
    let mut last = Vec::new();
    loop {
        let now = 1 + start.elapsed().as_nanos() as u64;
        last.clear();
        for (cluster, demand) in hosts.iter_mut() {
            cluster.hear(|_| Ok(()));
            let want: BTreeMap<u32, u64> = [(1, *demand)].into_iter().collect();
            cluster.share(cluster_policy, &want, now);
            last.push(cluster.member().current_shares()[&1]);
        }
        if done(&last) {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < patience,
            "not within {patience:?}: {last:?}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn hosts_share_a_cluster_cap_by_demand_and_a_dead_hosts_share_goes_to_the_others() {
    let mut etcd = etcd("shares");
    let cap = Arc::new(ClusterPolicy {
        capacity: None,
        tenants: vec![ClusterTenant {
            id: TenantId(1),
            cap: Some(100 * MB),
            weight: 1,
        }],
    });
    let mut a = Cluster::start(config(&etcd, "/s/", "a")).unwrap();
    let mut b = Cluster::start(config(&etcd, "/s/", "b")).unwrap();
    let second = Duration::from_secs(1);
    let long = Duration::from_secs(10);
    shares_until(&mut [(&mut a, ALL), (&mut b, ALL)], &cap, long, |s| {
        s == [50 * MB, 50 * MB]
    });
    // b wants 20 MB/s: a has the rest within a second.
    let took = shares_until(&mut [(&mut a, ALL), (&mut b, 20 * MB)], &cap, long, |s| {
        s == [80 * MB, 20 * MB]
    });
    eprintln!("shares converged {took:?} after a demand change");
    assert!(took < second, "converged after {took:?}");
    // What every host reports, as an operator sees it: without a policy
    // in etcd, the demands only; with the same limits in etcd's policy,
    // each host's shares as the hosts themselves computed them.
    let view = etcd::hosts(&etcd.endpoints(), "/s/").unwrap();
    assert!(view.unreadable.is_empty() && view.policy.is_none());
    let hosts: Vec<&str> = view.reports.iter().map(|r| r.host.as_str()).collect();
    assert_eq!(hosts, ["a", "b"]);
    assert_eq!(view.reports[1].demands[&1], 20 * MB);
    assert_eq!(view.shares("a"), None);
    let policy = "[link]\ncapacity = \"100Gbit\"\n\
                  [[tenant]]\nid = 1\nname = \"spread\"\ncluster_cap = \"800Mbit\"\n";
    let revision = etcd::put_policy(&etcd.endpoints(), "/s/", policy).unwrap();
    let view = etcd::hosts(&etcd.endpoints(), "/s/").unwrap();
    assert!(matches!(&view.policy, Some((r, Ok(c))) if *r == revision && **c == *cap));
    for (host, share) in [("a", 80 * MB), ("b", 20 * MB)] {
        assert_eq!(
            view.shares(host),
            Some([(1, share)].into_iter().collect()),
            "{host}'s share as the operator sees it"
        );
    }
    assert_eq!(view.shares("nobody"), None);

    // b's coordinator dies: its lease runs out and a has the whole cap.
    b.abandon();
    let took = shares_until(&mut [(&mut a, ALL)], &cap, long, |s| s == [100 * MB]);
    eprintln!("a dead host's share reassigned {took:?} after it died (lease 2 s)");
    assert!(
        took < Duration::from_secs(2 + 1),
        "b's share went to a after {took:?}"
    );

    // One member stopped: nothing changes, and a host that joins is heard.
    etcd.stop(2);
    let mut c = Cluster::start(config(&etcd, "/s/", "c")).unwrap();
    shares_until(&mut [(&mut a, ALL), (&mut c, ALL)], &cap, long, |s| {
        s == [50 * MB, 50 * MB]
    });

    // All stopped: each host keeps its last shares, whatever its demand.
    etcd.stop(0);
    etcd.stop(1);
    let start = Instant::now();
    while a.member().is_connected() || c.member().is_connected() {
        a.hear(|_| Ok(()));
        c.hear(|_| Ok(()));
        assert!(start.elapsed() < long, "etcd's loss not heard");
        std::thread::sleep(Duration::from_millis(10));
    }
    shares_until(&mut [(&mut a, ALL), (&mut c, 0)], &cap, second, |s| {
        s == [50 * MB, 50 * MB]
    });
    a.leave();
    c.leave();
}

#[test]
fn a_leaving_host_gives_its_share_back_at_once() {
    let etcd = etcd("leave");
    let cap = Arc::new(ClusterPolicy {
        capacity: Some(300 * MB),
        tenants: vec![ClusterTenant {
            id: TenantId(1),
            cap: None,
            weight: 1,
        }],
    });
    let mut a = Cluster::start(config(&etcd, "/l/", "a")).unwrap();
    let mut b = Cluster::start(config(&etcd, "/l/", "b")).unwrap();
    let long = Duration::from_secs(10);
    shares_until(&mut [(&mut a, ALL), (&mut b, ALL)], &cap, long, |s| {
        s == [150 * MB, 150 * MB]
    });
    b.leave();
    let took = shares_until(&mut [(&mut a, ALL)], &cap, long, |s| s == [300 * MB]);
    eprintln!("a leaving host's share given back {took:?} after it left");
    assert!(took < Duration::from_secs(1), "given back after {took:?}");
    a.leave();
}
