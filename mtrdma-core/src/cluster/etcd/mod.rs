//! The cluster's policy and the hosts' reports through etcd.
//!
//! Under a prefix (default [`DEFAULT_PREFIX`]) etcd holds:
//! - `policy`: the cluster's policy, the same TOML as a policy file
//!   ([`put_policy`] checks and writes it);
//! - `hosts/NAME`: each host's [`HostReport`] (JSON), under a lease of the
//!   host's coordinator: when the coordinator stops or dies and its
//!   keep-alives end, etcd removes the report within the lease's time to
//!   live, and the other hosts take its share.
//!
//! [`EtcdLink`] runs the client on a thread of its own (etcd's client is on
//! tokio; the coordinator's loop is not): it watches the prefix and says
//! what it hears as [`Heard`], and writes this host's report when asked.
//! [`Cluster`] joins it to a [`Coordinator`]: it applies the policy etcd
//! holds, feeds the coordinator this host's shares of the cluster-wide
//! limits and publishes the host's demands.
//!
//! **Fail-static.** While etcd cannot be reached, the coordinator keeps
//! the last policy it applied and every share as it was (no tenant is
//! stopped, no limit lifted), says so ([`ClusterNews::lost`]), and tries
//! again every second. Back, it reads the whole prefix afresh. With a
//! cache file ([`EtcdConfig::cache`]) the last policy applied also
//! outlives the coordinator: one started while etcd is away starts from
//! it ([`Cluster::take_kept_policy`]).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::Duration;

use etcd_client::{Client, ConnectOptions, EventType, GetOptions, PutOptions, WatchOptions};
use tokio::sync::{mpsc as tmpsc, oneshot};

use super::{HostReport, Member};

mod cache;
mod commands;
mod local;
use crate::coordinator::Coordinator;
use crate::policy::{ClusterPolicy, Policy};
pub use cache::cached_policy;
use cache::keep_policy;
pub use commands::{hosts, put_policy, HostsView};
pub use local::{first_ephemeral_port, LocalEtcd};

/// The prefix of mtrdma's keys when none is given.
pub const DEFAULT_PREFIX: &str = "/mtrdma/";

/// The lease of a host's report when none is given, seconds: a dead
/// coordinator's share goes to the others within this time (and the
/// watch's delivery) after its last keep-alive.
pub const DEFAULT_TTL_SECS: i64 = 5;

/// How long a connection attempt or a request may take before etcd counts
/// as unreachable.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

/// How long to wait between connection attempts while etcd is unreachable.
const RETRY: Duration = Duration::from_secs(1);

/// Where and as whom to reach etcd.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdConfig {
    /// etcd's client URLs (`http://127.0.0.1:2379`, ...).
    pub endpoints: Vec<String>,
    /// The prefix of mtrdma's keys (ends with `/`).
    pub prefix: String,
    /// This host's name, unique in the cluster (the key of its report).
    pub host: String,
    /// The time to live of the host's report's lease, seconds (at least 2).
    pub ttl_secs: i64,
    /// A file that keeps the last policy applied from etcd, so that a
    /// coordinator started while etcd is away starts from it
    /// ([`cached_policy`]) rather than from its own file (`None`: none).
    pub cache: Option<PathBuf>,
}

impl EtcdConfig {
    /// A configuration for `host` at `endpoints` (comma-separated, as
    /// `--etcd` takes them), with the default prefix and lease.
    pub fn new(endpoints: &str, host: impl Into<String>) -> EtcdConfig {
        EtcdConfig {
            endpoints: split_endpoints(endpoints),
            prefix: DEFAULT_PREFIX.into(),
            host: host.into(),
            ttl_secs: DEFAULT_TTL_SECS,
            cache: None,
        }
    }

    fn policy_key(&self) -> String {
        policy_key(&self.prefix)
    }

    fn host_key(&self) -> String {
        format!("{}{}", hosts_prefix(&self.prefix), self.host)
    }

    /// The configuration's mistakes, for the user.
    fn check(&self) -> Result<(), EtcdError> {
        if self.endpoints.is_empty() {
            return Err(EtcdError::Config("no etcd endpoint given".into()));
        }
        if self.host.is_empty() || self.host.contains('/') {
            return Err(EtcdError::Config(format!(
                "the host name {:?} must be non-empty and without '/'",
                self.host
            )));
        }
        if !self.prefix.ends_with('/') {
            return Err(EtcdError::Config(format!(
                "the prefix {:?} must end with '/'",
                self.prefix
            )));
        }
        if self.ttl_secs < 2 {
            return Err(EtcdError::Config(format!(
                "a lease of {} s is too short; give at least 2",
                self.ttl_secs
            )));
        }
        Ok(())
    }
}

/// `a,b,c` as a list, blanks left out.
pub fn split_endpoints(endpoints: &str) -> Vec<String> {
    endpoints
        .split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .map(str::to_string)
        .collect()
}

fn policy_key(prefix: &str) -> String {
    format!("{prefix}policy")
}

fn hosts_prefix(prefix: &str) -> String {
    format!("{prefix}hosts/")
}

/// What went wrong with etcd.
#[derive(Debug, thiserror::Error)]
pub enum EtcdError {
    /// The configuration cannot work.
    #[error("etcd configuration: {0}")]
    Config(String),
    /// etcd could not be reached, or refused a request.
    #[error("etcd: {0}")]
    Etcd(Box<etcd_client::Error>),
    /// The policy given is not a valid policy.
    #[error(transparent)]
    Policy(#[from] crate::policy::PolicyError),
    /// The client's thread or runtime could not start.
    #[error("etcd client thread: {0}")]
    Thread(#[from] std::io::Error),
}

impl From<etcd_client::Error> for EtcdError {
    fn from(e: etcd_client::Error) -> EtcdError {
        EtcdError::Etcd(Box::new(e))
    }
}

/// What the link heard from etcd.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Heard {
    /// Connected (or connected again): the policy etcd holds (its revision
    /// and text; `None`: none) and every host's report.
    Connected {
        /// The policy key's modification revision and its text.
        policy: Option<(i64, String)>,
        /// The reports under the hosts prefix that could be read.
        reports: Vec<HostReport>,
    },
    /// The policy was written: its revision and text.
    Policy(i64, String),
    /// The policy key was deleted (the last policy applied stays).
    PolicyDeleted,
    /// A host's report, new or changed.
    Report(HostReport),
    /// A host's report is gone: its lease ended or it stopped.
    Gone(String),
    /// etcd cannot be reached: why. The link tries again every second.
    Lost(String),
    /// Something under the prefix could not be read: what, for a log.
    Unreadable(String),
}

/// The client thread: events out, reports in.
#[derive(Debug)]
pub struct EtcdLink {
    heard: mpsc::Receiver<Heard>,
    reports: tmpsc::UnboundedSender<String>,
    stop: Option<oneshot::Sender<bool>>,
    thread: Option<JoinHandle<()>>,
}

impl EtcdLink {
    /// Starts the client's thread: it connects, then watches the prefix.
    ///
    /// # Errors
    /// A configuration that cannot work, or a thread that cannot start.
    /// etcd being unreachable is not an error: it is [`Heard::Lost`].
    pub fn start(config: EtcdConfig) -> Result<EtcdLink, EtcdError> {
        config.check()?;
        let (heard_tx, heard) = mpsc::channel();
        let (reports, reports_rx) = tmpsc::unbounded_channel();
        let (stop, stop_rx) = oneshot::channel();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let thread = std::thread::Builder::new()
            .name("mtrdma-etcd".into())
            .spawn(move || runtime.block_on(run(config, heard_tx, reports_rx, stop_rx)))?;
        Ok(EtcdLink {
            heard,
            reports,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// The next thing heard, without waiting.
    pub fn try_heard(&self) -> Option<Heard> {
        self.heard.try_recv().ok()
    }

    /// The next thing heard, waiting up to `timeout`.
    pub fn heard_within(&self, timeout: Duration) -> Option<Heard> {
        self.heard.recv_timeout(timeout).ok()
    }

    /// Writes this host's report under its lease (dropped while etcd is
    /// unreachable: a report is written afresh on reconnecting).
    pub fn publish(&self, report: &HostReport) {
        let _ = self.reports.send(report.to_json());
    }

    /// Stops: revokes the lease, so that the other hosts take this one's
    /// shares at once.
    pub fn stop(mut self) {
        self.finish(true);
    }

    /// Stops without revoking the lease, as a coordinator that dies does:
    /// the report stays until the lease's time to live runs out.
    pub fn abandon(mut self) {
        self.finish(false);
    }

    fn finish(&mut self, revoke: bool) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(revoke);
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for EtcdLink {
    fn drop(&mut self) {
        self.finish(true);
    }
}

/// The client thread's life: sessions, one after another, until stopped.
async fn run(
    config: EtcdConfig,
    heard: mpsc::Sender<Heard>,
    mut reports: tmpsc::UnboundedReceiver<String>,
    mut stop: oneshot::Receiver<bool>,
) {
    // Whether the last session got as far as its snapshot: when one that
    // did ends, the next is tried at once and etcd counts as lost only if
    // it fails (a member that stops moves the client to another).
    let mut was_up = false;
    // Hosts start at members of their own (by their name), so that a
    // cluster's hosts spread over etcd's members.
    let mut attempt = config.host.bytes().fold(0usize, |h, b| {
        h.wrapping_mul(31).wrapping_add(usize::from(b))
    });
    loop {
        attempt = attempt.wrapping_add(1);
        let ended = session(
            &config,
            attempt,
            &heard,
            &mut reports,
            &mut stop,
            &mut was_up,
        )
        .await;
        let why = match ended {
            Ended::Stopped => return,
            Ended::Failed(why) => why,
        };
        if was_up {
            was_up = false;
            continue;
        }
        if heard.send(Heard::Lost(why)).is_err() {
            return;
        }
        tokio::select! {
            _ = tokio::time::sleep(RETRY) => {}
            _ = &mut stop => return,
        }
    }
}

enum Ended {
    Stopped,
    Failed(String),
}

impl From<etcd_client::Error> for Ended {
    fn from(e: etcd_client::Error) -> Ended {
        Ended::Failed(e.to_string())
    }
}

fn options() -> ConnectOptions {
    ConnectOptions::new()
        .with_connect_timeout(REQUEST_TIMEOUT)
        .with_timeout(REQUEST_TIMEOUT)
        .with_keep_alive(Duration::from_secs(1), REQUEST_TIMEOUT)
}

/// A client of the first of `endpoints` that answers, trying them in turn
/// from the `start`th: one member at a time, so that a stopped member is
/// passed over at once (a client of them all may send a request to it and
/// wait out the timeout), and a session whose member stops moves on to
/// the next.
async fn connect_any(endpoints: &[String], start: usize) -> Result<Client, etcd_client::Error> {
    let mut last = etcd_client::Error::InvalidArgs("no etcd endpoint given".into());
    for i in 0..endpoints.len() {
        let endpoint = &endpoints[start.wrapping_add(i) % endpoints.len()];
        let attempt = async {
            let mut client = Client::connect([endpoint], Some(options())).await?;
            client.status().await?;
            Ok::<_, etcd_client::Error>(client)
        };
        match attempt.await {
            Ok(client) => return Ok(client),
            Err(e) => last = e,
        }
    }
    Err(last)
}

/// One connection: the lease, a snapshot of the prefix, then the watch,
/// the keep-alives and the writes, until something fails or a stop.
async fn session(
    config: &EtcdConfig,
    attempt: usize,
    heard: &mpsc::Sender<Heard>,
    reports: &mut tmpsc::UnboundedReceiver<String>,
    stop: &mut oneshot::Receiver<bool>,
    was_up: &mut bool,
) -> Ended {
    let connecting = async {
        let mut client = connect_any(&config.endpoints, attempt).await?;
        let lease = client.lease_grant(config.ttl_secs, None).await?.id();
        let keeper = client.lease_keep_alive(lease).await?;
        let snapshot = client
            .get(
                config.prefix.as_str(),
                Some(GetOptions::new().with_prefix()),
            )
            .await?;
        Ok::<_, etcd_client::Error>((client, lease, keeper, snapshot))
    };
    let (mut client, lease, (mut keeper, mut kept), snapshot) = tokio::select! {
        c = connecting => match c {
            Ok(c) => c,
            Err(e) => return e.into(),
        },
        _ = &mut *stop => return Ended::Stopped,
    };
    let revision = snapshot.header().map_or(0, |h| h.revision());
    let policy_key = config.policy_key();
    let hosts = hosts_prefix(&config.prefix);
    let (policy, found, unreadable) = read_prefix(snapshot.kvs(), &policy_key, &hosts);
    for why in unreadable {
        let _ = heard.send(Heard::Unreadable(why));
    }
    // Reports queued while disconnected are stale: the member publishes
    // afresh once it hears of the connection.
    while reports.try_recv().is_ok() {}
    if heard
        .send(Heard::Connected {
            policy,
            reports: found,
        })
        .is_err()
    {
        return Ended::Stopped;
    }
    *was_up = true;
    let watching = client
        .watch(
            config.prefix.as_str(),
            Some(
                WatchOptions::new()
                    .with_prefix()
                    .with_start_revision(revision + 1),
            ),
        )
        .await;
    let (_watcher, mut stream) = match watching {
        Ok(w) => w,
        Err(e) => return e.into(),
    };
    let host_key = config.host_key();
    let mut keep_alive =
        tokio::time::interval(Duration::from_millis(config.ttl_secs as u64 * 1000 / 3));
    loop {
        tokio::select! {
            message = stream.message() => {
                let response = match message {
                    Ok(Some(r)) => r,
                    Ok(None) => return Ended::Failed("etcd ended the watch".into()),
                    Err(e) => return e.into(),
                };
                if response.canceled() {
                    return Ended::Failed(format!(
                        "etcd cancelled the watch: {}",
                        response.cancel_reason()
                    ));
                }
                for event in response.events() {
                    let Some(kv) = event.kv() else { continue };
                    let put = event.event_type() == EventType::Put;
                    let news = match (classify(kv.key(), &policy_key, &hosts), put) {
                        (Key::Policy, true) => Heard::Policy(kv.mod_revision(), text(kv.value())),
                        (Key::Policy, false) => Heard::PolicyDeleted,
                        (Key::Host(name), true) => match HostReport::from_json(name, kv.value()) {
                            Ok(r) => Heard::Report(r),
                            Err(why) => Heard::Unreadable(why),
                        },
                        (Key::Host(name), false) => Heard::Gone(name.to_string()),
                        (Key::Other, _) => continue,
                    };
                    if heard.send(news).is_err() {
                        return Ended::Stopped;
                    }
                }
            }
            report = reports.recv() => {
                let Some(report) = report else { return Ended::Stopped };
                let put = PutOptions::new().with_lease(lease);
                if let Err(e) = client.put(host_key.as_str(), report, Some(put)).await {
                    return e.into();
                }
            }
            _ = keep_alive.tick() => {
                if let Err(e) = keeper.keep_alive().await {
                    return e.into();
                }
            }
            answer = kept.message() => match answer {
                Ok(Some(a)) if a.ttl() <= 0 => {
                    return Ended::Failed("the host's lease ran out".into());
                }
                Ok(Some(_)) => {}
                Ok(None) => return Ended::Failed("etcd ended the lease's keep-alives".into()),
                Err(e) => return e.into(),
            },
            revoke = &mut *stop => {
                if revoke.unwrap_or(true) {
                    let _ = client.lease_revoke(lease).await;
                }
                return Ended::Stopped;
            }
        }
    }
}

/// What a key under the prefix is.
enum Key<'a> {
    Policy,
    Host(&'a str),
    Other,
}

fn classify<'a>(key: &'a [u8], policy_key: &str, hosts: &str) -> Key<'a> {
    if key == policy_key.as_bytes() {
        return Key::Policy;
    }
    match key.strip_prefix(hosts.as_bytes()).map(std::str::from_utf8) {
        Some(Ok(name)) if !name.is_empty() && !name.contains('/') => Key::Host(name),
        _ => Key::Other,
    }
}

/// What `kvs` (read under the prefix) hold: the policy (its revision and
/// text), the hosts' reports that could be read, and why the others could
/// not.
type PrefixRead = (Option<(i64, String)>, Vec<HostReport>, Vec<String>);

fn read_prefix(kvs: &[etcd_client::KeyValue], policy_key: &str, hosts: &str) -> PrefixRead {
    let (mut policy, mut reports, mut unreadable) = (None, Vec::new(), Vec::new());
    for kv in kvs {
        match classify(kv.key(), policy_key, hosts) {
            Key::Policy => policy = Some((kv.mod_revision(), text(kv.value()))),
            Key::Host(name) => match HostReport::from_json(name, kv.value()) {
                Ok(r) => reports.push(r),
                Err(why) => unreadable.push(why),
            },
            Key::Other => {}
        }
    }
    (policy, reports, unreadable)
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// What one [`Cluster::step`] did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ClusterNews {
    /// etcd was reached (again).
    pub connected: bool,
    /// etcd was lost: why. The policy and the shares hold as they were.
    pub lost: Option<String>,
    /// The revision of a policy from etcd now applied.
    pub policy_applied: Option<i64>,
    /// A policy from etcd that was not applied: why (the last stays).
    pub policy_refused: Option<String>,
    /// Hosts whose report came, changed or went.
    pub hosts_changed: Vec<String>,
    /// Things under the prefix that could not be read.
    pub unreadable: Vec<String>,
    /// The policy applied could not be kept in the cache file: why.
    pub cache_failed: Option<String>,
    /// Whether this host's report was written.
    pub published: bool,
}

/// A coordinator's membership in the cluster: the policy from etcd, and its
/// host's shares of the cluster-wide limits from every host's demand.
#[derive(Debug)]
pub struct Cluster {
    link: EtcdLink,
    member: Member,
    /// The revision of the policy applied from etcd (0: the file's).
    policy_revision: i64,
    /// Where the last policy applied from etcd is kept.
    cache: Option<PathBuf>,
    /// The policy found kept there at the start, until taken.
    kept: Option<Policy>,
    /// The shares last handed out by [`Cluster::share`], by
    /// [`Member::share_changes`] (`None`: none yet).
    shares_given: Option<u64>,
}

impl Cluster {
    /// Joins through etcd as `config.host`.
    ///
    /// # Errors
    /// As [`EtcdLink::start`].
    pub fn start(config: EtcdConfig) -> Result<Cluster, EtcdError> {
        let member = Member::new(config.host.clone());
        let cache = config.cache.clone();
        // A cached policy is the one a coordinator starts from: etcd's
        // copy of the same revision is not applied again.
        let kept = cache.as_deref().and_then(cached_policy);
        Ok(Cluster {
            link: EtcdLink::start(config)?,
            member,
            policy_revision: kept.as_ref().map_or(0, |(revision, _)| *revision),
            cache,
            kept: kept.map(|(_, policy)| policy),
            shares_given: None,
        })
    }

    /// The policy kept in the cache file when this member started (see
    /// [`EtcdConfig::cache`]), once: what a coordinator started while etcd
    /// is away applies until etcd answers. Its revision is
    /// [`Cluster::policy_revision`].
    pub fn take_kept_policy(&mut self) -> Option<Policy> {
        self.kept.take()
    }

    /// The other hosts and what they reported.
    pub fn member(&self) -> &Member {
        &self.member
    }

    /// The revision of the policy applied from etcd (0: none yet).
    pub fn policy_revision(&self) -> i64 {
        self.policy_revision
    }

    /// One round, after the coordinator's tick at `now_ns`: applies what
    /// etcd said (a policy, other hosts' reports, a lost connection), gives
    /// the coordinator this host's shares of the cluster-wide limits and
    /// publishes this host's demands when they moved.
    pub fn step(&mut self, coordinator: &mut Coordinator, now_ns: u64) -> ClusterNews {
        let mut news =
            self.hear(|policy| coordinator.apply_policy(policy).map_err(|e| e.to_string()));
        let demand = coordinator.cluster_demand();
        let cluster = Arc::clone(&coordinator.policy().cluster);
        let (shares, published) = self.share(&cluster, &demand, now_ns);
        if let Some(shares) = shares {
            coordinator.set_cluster_shares(shares);
        }
        news.published = published;
        news
    }

    /// What etcd said since the last call: a policy (given to `apply`,
    /// which says why it refuses one), other hosts' reports, a lost or
    /// regained connection.
    pub fn hear(&mut self, mut apply: impl FnMut(Policy) -> Result<(), String>) -> ClusterNews {
        let mut news = ClusterNews::default();
        while let Some(heard) = self.link.try_heard() {
            match heard {
                Heard::Connected { policy, reports } => {
                    news.connected = true;
                    news.lost = None;
                    news.hosts_changed
                        .extend(reports.iter().map(|r| r.host.clone()));
                    self.member.connected(reports);
                    if let Some((revision, text)) = policy {
                        self.apply(&mut apply, revision, &text, &mut news);
                    }
                }
                Heard::Policy(revision, text) => {
                    self.apply(&mut apply, revision, &text, &mut news);
                }
                Heard::PolicyDeleted => {
                    news.policy_refused = Some(
                        "the cluster's policy was deleted from etcd; the last one stays".into(),
                    );
                }
                Heard::Report(r) => {
                    news.hosts_changed.push(r.host.clone());
                    self.member.heard(r);
                }
                Heard::Gone(host) => {
                    self.member.gone(&host);
                    news.hosts_changed.push(host);
                }
                Heard::Lost(why) => {
                    self.member.disconnected();
                    news.connected = false;
                    news.lost = Some(why);
                }
                Heard::Unreadable(why) => news.unreadable.push(why),
            }
        }
        news
    }

    /// This host's shares of `cluster`'s limits at `now_ns`, this host
    /// wanting `demand` (bytes per second by tenant id), if they changed
    /// since the last call (the first call gives them); publishes the
    /// demand when it moved enough (the second value: whether it did).
    pub fn share(
        &mut self,
        cluster: &Arc<ClusterPolicy>,
        demand: &BTreeMap<u32, u64>,
        now_ns: u64,
    ) -> (Option<BTreeMap<u32, u64>>, bool) {
        self.member.shares(cluster, demand);
        let changes = self.member.share_changes();
        let shares =
            (self.shares_given != Some(changes)).then(|| self.member.current_shares().clone());
        self.shares_given = Some(changes);
        let report = self.member.to_publish(now_ns, demand, self.policy_revision);
        if let Some(report) = &report {
            self.link.publish(report);
        }
        (shares, report.is_some())
    }

    fn apply(
        &mut self,
        apply: &mut impl FnMut(Policy) -> Result<(), String>,
        revision: i64,
        text: &str,
        news: &mut ClusterNews,
    ) {
        if revision == self.policy_revision {
            return;
        }
        match Policy::from_toml_str(text)
            .map_err(|e| e.to_string())
            .and_then(&mut *apply)
        {
            Ok(()) => {
                self.policy_revision = revision;
                news.policy_applied = Some(revision);
                if let Some(path) = &self.cache {
                    if let Err(e) = keep_policy(path, revision, text) {
                        news.cache_failed = Some(format!(
                            "the policy applied was not kept in {}: {e}",
                            path.display()
                        ));
                    }
                }
            }
            Err(why) => {
                news.policy_refused = Some(format!(
                    "the cluster's policy at revision {revision} is not applied, the last one stays: {why}"
                ));
            }
        }
    }

    /// Leaves: this host's report goes at once (its lease is revoked).
    pub fn leave(self) {
        self.link.stop();
    }

    /// Stops without revoking, as a coordinator that dies: its report
    /// stays until its lease runs out.
    pub fn abandon(self) {
        self.link.abandon();
    }
}
