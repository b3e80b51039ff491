//! Cluster-wide shares at scale: many hosts' members
//! (`mtrdma::core::cluster::etcd::Cluster`, each with its own etcd client)
//! in one process, against a real three-member etcd on loopback
//! (`LocalEtcd`), each tenant with a cluster-wide cap and processes on a
//! few hosts. It measures what the cluster costs etcd and how well the
//! caps hold:
//!
//! 1. every tenant wants all it can get on each of its hosts: the time
//!    until every host's shares are the even split, and each cap's error
//!    (its hosts' shares added up, against the cap);
//! 2. steady: the writes etcd takes while no demand moves (etcd's own
//!    count, `etcd_mvcc_put_total`), a second after the last step;
//! 3. about one tenant in a hundred wants a tenth of its cap on its first
//!    host:
//!    the time until every host's shares follow, the writes it took, and
//!    the members' CPU time until then (per host: what one host's
//!    coordinator spends on it, where the simulation spends it 200 times
//!    over on two CPUs);
//! 4. one host's member stops without a word (its lease runs out): the
//!    time until its tenants' other hosts take its shares.
//!
//! ```text
//! cargo run --release -p mtrdma-demo --bin cluster_scale -- \
//!     [--hosts 200] [--tenants 10000] [--per-tenant 3] [--ttl 5] [--steady 5]
//! ```
//!
//! The members are stepped in turn by one thread, as each host's
//! coordinator would step its own after every tick; a round of all of them
//! is timed too, so that what the simulation itself costs is seen.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mtrdma::core::cluster::etcd::{Cluster, EtcdConfig, LocalEtcd};
use mtrdma::core::cluster::ALL;
use mtrdma::core::{ClusterPolicy, ClusterTenant, TenantId};
use mtrdma_demo::args::Args;

/// Every tenant's cluster-wide cap: 100 MB/s.
const CAP: u64 = 100_000_000;

struct Options {
    hosts: usize,
    tenants: u32,
    per_tenant: usize,
    ttl: i64,
    /// How long the steady step counts etcd's writes.
    steady: Duration,
}

fn parse() -> Result<Options, String> {
    let mut o = Options {
        hosts: 200,
        tenants: 10_000,
        per_tenant: 3,
        ttl: 5,
        steady: Duration::from_secs(5),
    };
    let mut it = Args::from_env();
    while let Some(flag) = it.next_flag(|v| format!("unexpected argument {v}"))? {
        match flag.as_str() {
            "--hosts" => o.hosts = it.parse(&flag)?,
            "--tenants" => o.tenants = it.parse(&flag)?,
            "--per-tenant" => o.per_tenant = it.parse(&flag)?,
            "--ttl" => o.ttl = it.parse(&flag)?,
            "--steady" => {
                o.steady = Duration::try_from_secs_f64(it.parse(&flag)?)
                    .map_err(|e| format!("--steady: {e}"))?
            }
            other => return Err(format!("unknown flag {other}")),
        }
    }
    if o.hosts < 2 || o.per_tenant < 2 || o.per_tenant > o.hosts || o.tenants == 0 {
        return Err("give at least 2 hosts, 2 to --hosts hosts per tenant, and a tenant".into());
    }
    Ok(o)
}

/// Whether tenant `t` is one of those whose demand moves (about one in a
/// hundred, their first hosts spread over the cluster).
fn moves(t: u32) -> bool {
    t % 97 == 0
}

/// The hosts of tenant `t`: `per` of them, spread over `hosts`.
fn hosts_of(t: u32, hosts: usize, per: usize) -> Vec<usize> {
    (0..per)
        .map(|j| (t as usize + j * (hosts / per)) % hosts)
        .collect()
}

/// One etcd member's count of applied puts, from its metrics.
fn puts(endpoint: &str) -> Result<u64, String> {
    let addr = endpoint.trim_start_matches("http://");
    let mut s = std::net::TcpStream::connect(addr).map_err(|e| e.to_string())?;
    write!(s, "GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n").map_err(|e| e.to_string())?;
    let mut body = String::new();
    s.read_to_string(&mut body).map_err(|e| e.to_string())?;
    body.lines()
        .find_map(|l| l.strip_prefix("etcd_mvcc_put_total "))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map(|v| v as u64)
        .ok_or_else(|| "no etcd_mvcc_put_total in the metrics".into())
}

/// The CPU time this process (every member's thread) has used so far.
fn cpu_seconds() -> f64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    t.tv_sec as f64 + t.tv_nsec as f64 * 1e-9
}

/// The members, what each host wants, and what each was last given.
struct Sim {
    members: Vec<Option<Cluster>>,
    demands: Vec<BTreeMap<u32, u64>>,
    shares: Vec<BTreeMap<u32, u64>>,
    policy: Arc<ClusterPolicy>,
    start: Instant,
    /// Reports written by the members so far.
    published: u64,
    /// The slowest round of all members so far.
    slowest_round: Duration,
    /// Rounds so far, and their time added up.
    rounds: u32,
    round_time: Duration,
}

impl Sim {
    /// One round: every member hears etcd and takes its shares.
    fn round(&mut self) {
        let began = Instant::now();
        let now = 1 + self.start.elapsed().as_nanos() as u64;
        for (h, member) in self.members.iter_mut().enumerate() {
            let Some(m) = member else { continue };
            m.hear(|_| Ok(()));
            let (shares, published) = m.share(&self.policy, &self.demands[h], now);
            if let Some(shares) = shares {
                self.shares[h] = shares;
            }
            self.published += u64::from(published);
        }
        self.slowest_round = self.slowest_round.max(began.elapsed());
        self.rounds += 1;
        self.round_time += began.elapsed();
        std::thread::sleep(Duration::from_millis(2));
    }

    /// Rounds until `expected(tenant, host)` holds of every live host's
    /// share of every tenant it hosts, for at most `patience`: how long
    /// it took.
    fn until(
        &mut self,
        patience: Duration,
        expected: impl Fn(u32, usize) -> u64,
    ) -> Result<Duration, String> {
        let start = Instant::now();
        loop {
            self.round();
            let off = (0..self.members.len())
                .filter(|&h| self.members[h].is_some())
                .flat_map(|h| self.demands[h].keys().map(move |&t| (t, h)))
                .find(|&(t, h)| {
                    let got = self.shares[h].get(&t).copied().unwrap_or(0);
                    got.abs_diff(expected(t, h)) > 1
                });
            match off {
                None => return Ok(start.elapsed()),
                Some((t, h)) if start.elapsed() > patience => {
                    return Err(format!(
                        "not within {patience:?}: tenant {t} on host {h} has {:?}, wants {}",
                        self.shares[h].get(&t),
                        expected(t, h)
                    ))
                }
                Some(_) => {}
            }
        }
    }

    /// The largest error of any cap: its live hosts' shares added up,
    /// against the cap, as a share of it.
    fn worst_cap_error(&self) -> f64 {
        let mut sums: BTreeMap<u32, u64> = BTreeMap::new();
        for (h, shares) in self.shares.iter().enumerate() {
            if self.members[h].is_some() {
                for (&t, &s) in shares {
                    *sums.entry(t).or_default() += s;
                }
            }
        }
        sums.values()
            .map(|&s| s.abs_diff(CAP) as f64 / CAP as f64)
            .fold(0.0, f64::max)
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let o = parse()?;
    let dir = std::env::temp_dir().join(format!("mtrdma-cluster-scale-{}", std::process::id()));
    let etcd = LocalEtcd::start(&dir, "scale")?;
    let endpoints = etcd.endpoints();
    let policy = Arc::new(ClusterPolicy {
        capacity: None,
        tenants: (1..=o.tenants)
            .map(|t| ClusterTenant {
                id: TenantId(t),
                cap: Some(CAP),
                weight: 1,
            })
            .collect(),
    });
    let mut demands = vec![BTreeMap::new(); o.hosts];
    for t in 1..=o.tenants {
        for h in hosts_of(t, o.hosts, o.per_tenant) {
            demands[h].insert(t, ALL);
        }
    }
    println!(
        "{} hosts, {} tenants on {} hosts each ({} to {} tenants a host), one etcd of 3 members on loopback",
        o.hosts,
        o.tenants,
        o.per_tenant,
        demands.iter().map(BTreeMap::len).min().unwrap_or(0),
        demands.iter().map(BTreeMap::len).max().unwrap_or(0),
    );
    let joined = Instant::now();
    let members = (0..o.hosts)
        .map(|h| {
            let mut config = EtcdConfig::new(&endpoints.join(","), format!("h{h:04}"));
            config.ttl_secs = o.ttl;
            Cluster::start(config).map(Some)
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut sim = Sim {
        members,
        shares: vec![BTreeMap::new(); o.hosts],
        demands,
        policy,
        start: Instant::now(),
        published: 0,
        slowest_round: Duration::ZERO,
        rounds: 0,
        round_time: Duration::ZERO,
    };
    let per = o.per_tenant as u64;
    // The even split, within a byte: the first hosts in name order carry
    // the remainder's odd bytes.
    let even_or_less = |t: u32, h: usize| {
        let hosts = hosts_of(t, o.hosts, o.per_tenant);
        let mut sorted = hosts.clone();
        sorted.sort_unstable();
        let rank = sorted.iter().position(|&x| x == h).unwrap_or(0) as u64;
        CAP / per + u64::from(rank < CAP % per)
    };
    let took = sim.until(Duration::from_secs(120), even_or_less)?;
    println!(
        "1. all joined and even: {:.2} s after the first member started ({:.2} s of rounds); cap error {:.4}%",
        joined.elapsed().as_secs_f64(),
        took.as_secs_f64(),
        100.0 * sim.worst_cap_error()
    );

    // 2. Steady, once the reports written while the hosts heard each
    // other have gone out (each host writes at most every 200 ms).
    let settle = Instant::now();
    while settle.elapsed() < Duration::from_secs(1) {
        sim.round();
    }
    let puts_before = puts(&endpoints[0])?;
    let published_before = sim.published;
    let steady = Instant::now();
    while steady.elapsed() < o.steady {
        sim.round();
    }
    let secs = steady.elapsed().as_secs_f64();
    println!(
        "2. steady for {secs:.1} s: {:.1} writes/s to etcd ({} reports written)",
        (puts(&endpoints[0])? - puts_before) as f64 / secs,
        sim.published - published_before
    );

    // 3. One tenant in a hundred wants a tenth of its cap on its first host.
    let changed: Vec<u32> = (1..=o.tenants).filter(|&t| moves(t)).collect();
    for &t in &changed {
        let first = hosts_of(t, o.hosts, o.per_tenant)[0];
        sim.demands[first].insert(t, CAP / 10);
    }
    let puts_before = puts(&endpoints[0])?;
    let published_before = sim.published;
    let cpu_before = cpu_seconds();
    let hosts_cfg = (o.hosts, o.per_tenant);
    let after_change = move |t: u32, h: usize| {
        let hosts = hosts_of(t, hosts_cfg.0, hosts_cfg.1);
        if !moves(t) {
            return even_or_less(t, h);
        }
        if h == hosts[0] {
            return CAP / 10;
        }
        // The rest, evenly among the others, the odd bytes to the first
        // in name order.
        let mut others: Vec<usize> = hosts[1..].to_vec();
        others.sort_unstable();
        let rest = CAP - CAP / 10;
        let n = others.len() as u64;
        let rank = others.iter().position(|&x| x == h).unwrap_or(0) as u64;
        rest / n + u64::from(rank < rest % n)
    };
    let took = sim.until(Duration::from_secs(60), after_change)?;
    let cpu = cpu_seconds() - cpu_before;
    println!(
        "3. {} tenants' demand moved on one host each: every host followed in {:.3} s; {} writes to etcd ({} reports); cap error {:.4}%",
        changed.len(),
        took.as_secs_f64(),
        puts(&endpoints[0])? - puts_before,
        sim.published - published_before,
        100.0 * sim.worst_cap_error()
    );
    println!(
        "   the members' CPU time until then: {cpu:.2} s in all (etcd's own not counted), {:.1} ms a host: what one host's coordinator spends on the change",
        cpu * 1e3 / o.hosts as f64
    );

    // 4. Host 0's member stops without revoking its lease.
    if let Some(m) = sim.members[0].take() {
        m.abandon();
    }
    let died = Instant::now();
    let gone = move |t: u32, h: usize| {
        let hosts = hosts_of(t, hosts_cfg.0, hosts_cfg.1);
        if !hosts.contains(&0) {
            return after_change(t, h);
        }
        let live: Vec<usize> = {
            let mut v: Vec<usize> = hosts.iter().copied().filter(|&x| x != 0).collect();
            v.sort_unstable();
            v
        };
        let wanted = |x: usize| {
            if moves(t) && x == hosts[0] {
                CAP / 10
            } else {
                ALL
            }
        };
        // Max-min among the live hosts, then what is left evenly.
        let modest: Vec<usize> = live.iter().copied().filter(|&x| wanted(x) != ALL).collect();
        let busy: Vec<usize> = live.iter().copied().filter(|&x| wanted(x) == ALL).collect();
        if modest.contains(&h) {
            return CAP / 10;
        }
        let rest = CAP - CAP / 10 * modest.len() as u64;
        let n = busy.len() as u64;
        let rank = busy.iter().position(|&x| x == h).unwrap_or(0) as u64;
        rest / n + u64::from(rank < rest % n)
    };
    let took = sim.until(Duration::from_secs(o.ttl as u64 + 30), gone)?;
    println!(
        "4. a host's member stopped without a word: its tenants' other hosts took its shares {:.2} s later (lease {} s); cap error {:.4}%",
        died.elapsed().as_secs_f64().min(took.as_secs_f64()),
        o.ttl,
        100.0 * sim.worst_cap_error()
    );
    println!(
        "a round of all {} members took {:.1} ms on average, {:.1} ms at the slowest (the simulation's own time, part of the times above)",
        o.hosts,
        sim.round_time.as_secs_f64() * 1e3 / f64::from(sim.rounds.max(1)),
        sim.slowest_round.as_secs_f64() * 1e3
    );
    for m in sim.members.into_iter().flatten() {
        m.leave();
    }
    drop(etcd);
    Ok(())
}
