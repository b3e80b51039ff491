//! Tenant policies: who a tenant is, what it may use, and how its processes
//! are recognised; read from a TOML policy file and validated.
//!
//! A policy is either built in code ([`Policy::new`], [`TenantEntry::new`]
//! and its `with_*` methods, then [`Policy::validate`]) or read from a file
//! ([`Policy::from_file`], [`Policy::from_toml_str`]), which validates it.
//!
//! # The policy file
//!
//! ```toml
//! [link]
//! capacity = "100Gbit"            # shared by the fair rates; or bytes/s as an integer
//! recompute_interval_ms = 5       # 1..=1000, default 5
//! latency_bound = "16KiB"         # bytes a latency request may find queued
//!                                 # ahead of it; left out: no protection
//! exempt = ["backup"]             # bulk tenants, by name, the bound does not hold
//!
//! [[tenant]]
//! id = 1                          # required, unique
//! name = "kv-latency"             # required, unique, 1..=31 of [A-Za-z0-9_.-]
//! class = "latency"               # "latency" | "bulk" (default)
//! weight = 4                      # 1..=1000000, default 1
//! rate = { rate = "10Gbit", burst = "64KiB" }   # byte rate cap; burst default 0
//! wr_rate = { rate = 1000000, burst = 64 }       # work requests/s cap
//! max_qps = 64                    # default 1024
//! max_mr_bytes = "4GiB"           # default 1GiB
//! max_outstanding_wr = 1024       # default 4096
//! qp_create_rate = { rate = 100, burst = 10 }    # QP creations/s
//! mr_reg_rate = { rate = 1000, burst = 100 }     # MR registrations/s
//! [[tenant.match]]                # which processes belong to this tenant
//! uid = 1000
//! ```
//!
//! Sizes and byte rates are integers (bytes, bytes/s) or strings with a unit:
//! `"64KiB"`, `"1MB"`, `"1.5GiB"`, `"10Gbit"`, `"10Gbps"`, `"1.25GB/s"`,
//! `"500MiB/s"`. `KB`, `MB`, `GB`, `TB` and `Kbit`... `Tbit` are powers of
//! 1000, `KiB`... `TiB` powers of 1024; eight bits make a byte; fractions are
//! rounded to the nearest byte; values above `u64::MAX` are refused. Counts
//! (ids, weights, work requests, operations per second) are plain integers.
//! Unknown settings are refused, so a misspelt limit never goes unnoticed.
//!
//! ```
//! use mtrdma_core::{Policy, TenantId, TrafficClass};
//!
//! let policy = Policy::from_toml_str(r#"
//!     [link]
//!     capacity = "100Gbit"
//!
//!     [[tenant]]
//!     id = 1
//!     name = "kv-latency"
//!     class = "latency"
//!     rate = { rate = "10Gbit", burst = "64KiB" }
//! "#)?;
//! let kv = policy.tenant(TenantId(1)).unwrap();
//! assert_eq!(kv.class, TrafficClass::Latency);
//! assert_eq!(kv.schedule.byte_cap.unwrap().per_second, 1_250_000_000);
//! assert_eq!(policy.link.capacity_bytes_per_sec, 12_500_000_000);
//! # Ok::<(), mtrdma_core::PolicyError>(())
//! ```

mod error;
mod file;
mod units;
mod validate;

use std::path::Path;
use std::sync::Arc;

use crate::{RateLimit, TenantId, TenantPolicy, TrafficClass};

pub use error::{PolicyError, TenantChoiceError, TenantRef};

/// A whole policy: the link the tenants share and every tenant's limits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    /// The link whose capacity the fair rates divide.
    pub link: LinkConfig,
    /// The tenants, in file order (which decides [`Policy::tenant_for_peer`]).
    pub tenants: Vec<TenantEntry>,
    /// Names of the bulk tenants that [`LinkConfig::latency_bound`] does
    /// not hold (`[link] exempt` in the file): the operator exempts a
    /// tenant by naming it here, and nowhere else can.
    pub exempt: Vec<String>,
    /// Limits that hold across hosts (`[cluster]`, and the tenants'
    /// `cluster_cap` and `cluster_weight`): read by coordinators that
    /// share through etcd ([`crate::cluster`]); a coordinator alone holds
    /// only its host's limits. Shared, so that a coordinator's cluster
    /// member sees at once (the same allocation) that the policy it last
    /// computed shares from has not changed.
    pub cluster: Arc<ClusterPolicy>,
}

/// What a policy limits across hosts ([`Policy::cluster`]). Each host's
/// coordinator gives its host a share of every limit here, by the demand
/// every host reports ([`crate::cluster::host_shares`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClusterPolicy {
    /// Bytes per second that the cluster-wide tenants share together,
    /// weighted max-min fair by their cluster weights (`[cluster]
    /// capacity`); `None`: each holds its own cap, and no more.
    pub capacity: Option<u64>,
    /// The tenants limited across hosts, in file order.
    pub tenants: Vec<ClusterTenant>,
}

/// One tenant's limits across hosts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClusterTenant {
    /// The tenant (of [`Policy::tenants`]).
    pub id: TenantId,
    /// Bytes per second it may move on all hosts together
    /// (`cluster_cap`).
    pub cap: Option<u64>,
    /// Its share of [`ClusterPolicy::capacity`] against the other
    /// cluster-wide tenants (`cluster_weight`; default its weight).
    pub weight: u32,
}

/// The link shared by all tenants.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinkConfig {
    /// The link capacity that weighted max-min fair rates divide, in bytes/s;
    /// greater than 0.
    pub capacity_bytes_per_sec: u64,
    /// How often the coordinator recomputes fair rates, in milliseconds;
    /// 1 to 1000, default [`LinkConfig::DEFAULT_RECOMPUTE_INTERVAL_MS`].
    pub recompute_interval_ms: u32,
    /// The bytes that may be queued ahead of a latency request at the port
    /// (`latency_bound` in the file; between
    /// [`Protection::MIN_BOUND`](mtrdma_sched::Protection::MIN_BOUND) and
    /// [`Protection::MAX_BOUND`](mtrdma_sched::Protection::MAX_BOUND)).
    /// With a bound, every bulk tenant's scheduled queue pairs, in every
    /// process, post pieces of at most a quarter of it and keep a delay
    /// window whose queue allowance fits in it
    /// ([`Protection::for_bound`](mtrdma_sched::Protection::for_bound)),
    /// whatever their own code asks for, unless [`Policy::exempt`] names
    /// the tenant. `None` (the default): no protection across processes;
    /// each tenant's code decides its own pieces and window.
    pub latency_bound: Option<u64>,
}

impl LinkConfig {
    /// The default fair-rate recomputation period: 5 ms.
    pub const DEFAULT_RECOMPUTE_INTERVAL_MS: u32 = 5;
    /// The shortest allowed recomputation period, in ms.
    pub const MIN_RECOMPUTE_INTERVAL_MS: u32 = 1;
    /// The longest allowed recomputation period, in ms.
    pub const MAX_RECOMPUTE_INTERVAL_MS: u32 = 1000;

    /// A link of `capacity_bytes_per_sec` with the default recomputation
    /// period.
    pub const fn new(capacity_bytes_per_sec: u64) -> LinkConfig {
        LinkConfig {
            capacity_bytes_per_sec,
            recompute_interval_ms: LinkConfig::DEFAULT_RECOMPUTE_INTERVAL_MS,
            latency_bound: None,
        }
    }

    /// The same link with a latency bound of `bytes`
    /// ([`latency_bound`](Self::latency_bound)).
    pub const fn with_latency_bound(self, bytes: u64) -> LinkConfig {
        LinkConfig {
            latency_bound: Some(bytes),
            ..self
        }
    }

    /// The same link with another recomputation period.
    pub const fn with_recompute_interval_ms(self, ms: u32) -> LinkConfig {
        LinkConfig {
            recompute_interval_ms: ms,
            ..self
        }
    }
}

/// A rule that recognises a tenant's processes by their credentials.
///
/// A rule matches a peer when every condition it sets holds; a valid rule
/// sets at least one. `cgroup` is a path prefix that matches whole path
/// components: `/kubepods/pod1` matches a peer in `/kubepods/pod1` or
/// `/kubepods/pod1/c2`, not one in `/kubepods/pod10`.
///
/// ```
/// use mtrdma_core::{MatchRule, PeerCredentials};
/// let rule = MatchRule::default().with_uid(1000).with_cgroup("/kubepods/pod1");
/// let peer = PeerCredentials {
///     pid: 42,
///     uid: 1000,
///     gid: 1000,
///     cgroup: Some("/kubepods/pod1/c2".into()),
/// };
/// assert!(rule.matches(&peer));
/// assert!(!rule.matches(&PeerCredentials { cgroup: None, ..peer }));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct MatchRule {
    /// The peer's user id must be this.
    pub uid: Option<u32>,
    /// The peer's group id must be this.
    pub gid: Option<u32>,
    /// The peer's cgroup path must be this path or below it; starts with `/`.
    pub cgroup: Option<String>,
}

impl MatchRule {
    /// The same rule, also requiring user id `uid`.
    pub fn with_uid(self, uid: u32) -> MatchRule {
        MatchRule {
            uid: Some(uid),
            ..self
        }
    }

    /// The same rule, also requiring group id `gid`.
    pub fn with_gid(self, gid: u32) -> MatchRule {
        MatchRule {
            gid: Some(gid),
            ..self
        }
    }

    /// The same rule, also requiring the cgroup `prefix` or one below it.
    pub fn with_cgroup(self, prefix: impl Into<String>) -> MatchRule {
        MatchRule {
            cgroup: Some(prefix.into()),
            ..self
        }
    }

    /// Whether this rule sets no condition at all (which validation refuses).
    pub fn is_empty(&self) -> bool {
        self.uid.is_none() && self.gid.is_none() && self.cgroup.is_none()
    }

    /// Whether `peer` satisfies every condition of this rule. An empty rule
    /// matches nothing.
    pub fn matches(&self, peer: &PeerCredentials) -> bool {
        if self.is_empty() {
            return false;
        }
        self.uid.is_none_or(|uid| uid == peer.uid)
            && self.gid.is_none_or(|gid| gid == peer.gid)
            && self.cgroup.as_deref().is_none_or(|prefix| {
                peer.cgroup
                    .as_deref()
                    .is_some_and(|path| cgroup_within(path, prefix))
            })
    }
}

/// Whether cgroup `path` is `prefix` or lies below it, comparing whole path
/// components (a trailing `/` on the prefix is ignored).
fn cgroup_within(path: &str, prefix: &str) -> bool {
    let prefix = prefix.trim_end_matches('/');
    if prefix.is_empty() {
        return path.starts_with('/');
    }
    match path.strip_prefix(prefix) {
        Some(rest) => rest.is_empty() || rest.starts_with('/'),
        None => false,
    }
}

/// Who is on the other end of a coordinator's Unix socket, as the kernel
/// reports it (`SO_PEERCRED`, and `/proc/<pid>/cgroup` where available).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PeerCredentials {
    /// Process id.
    pub pid: u32,
    /// User id.
    pub uid: u32,
    /// Group id.
    pub gid: u32,
    /// The cgroup (v2) path, such as `/system.slice/app.service`, if known.
    pub cgroup: Option<String>,
}

/// One tenant of a [`Policy`]: its identity, how its work is scheduled
/// (a [`TenantPolicy`], the same the schedulers of `mtrdma-sched` take) and
/// its quotas.
///
/// ```
/// use mtrdma_core::{RateLimit, TenantEntry, TenantId, TrafficClass};
/// let t = TenantEntry::new(TenantId(1), "kv-latency")
///     .with_class(TrafficClass::Latency)
///     .with_weight(4)
///     .with_rate(RateLimit::new(1_250_000_000, 64 << 10));
/// assert_eq!(t.max_qps, TenantEntry::DEFAULT_MAX_QPS);
/// assert_eq!(t.schedule.weight, 4);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantEntry {
    /// The tenant's id; unique within a policy.
    pub id: TenantId,
    /// The tenant's name: 1 to 31 bytes of `A-Z a-z 0-9 _ . -`; unique.
    pub name: String,
    /// The class of the tenant's work requests; default [`TrafficClass::Bulk`].
    pub class: TrafficClass,
    /// How its work is scheduled: its share of the link relative to other
    /// tenants (`weight`, 1 to [`MAX_WEIGHT`](crate::MAX_WEIGHT), default 1), and caps on the
    /// bytes (`byte_cap`, burst in bytes) and work requests (`wr_cap`,
    /// burst in work requests) it posts per second.
    pub schedule: TenantPolicy,
    /// Most queue pairs the tenant may hold at once; default 1024.
    pub max_qps: u32,
    /// Most bytes of memory regions the tenant may hold at once; default 1 GiB.
    pub max_mr_bytes: u64,
    /// Most work requests the tenant may have posted and not yet completed;
    /// default 4096.
    pub max_outstanding_wr: u32,
    /// Cap on queue pair creations per second (against control-path storms).
    pub qp_create_rate: Option<RateLimit>,
    /// Cap on memory region registrations per second.
    pub mr_reg_rate: Option<RateLimit>,
    /// Rules that recognise the tenant's processes when a coordinator assigns
    /// identities; any one matching is enough.
    pub matches: Vec<MatchRule>,
}

impl TenantEntry {
    /// Default [`max_qps`](Self::max_qps).
    pub const DEFAULT_MAX_QPS: u32 = 1024;
    /// Default [`max_mr_bytes`](Self::max_mr_bytes): 1 GiB.
    pub const DEFAULT_MAX_MR_BYTES: u64 = 1 << 30;
    /// Default [`max_outstanding_wr`](Self::max_outstanding_wr).
    pub const DEFAULT_MAX_OUTSTANDING_WR: u32 = 4096;
    /// Longest allowed name, in bytes.
    pub const MAX_NAME_LEN: usize = 31;

    /// A tenant with the defaults: bulk class, weight 1, no rate caps,
    /// 1024 QPs, 1 GiB of memory regions, 4096 outstanding work requests and
    /// no match rules.
    pub fn new(id: TenantId, name: impl Into<String>) -> TenantEntry {
        TenantEntry {
            id,
            name: name.into(),
            class: TrafficClass::default(),
            schedule: TenantPolicy::default(),
            max_qps: TenantEntry::DEFAULT_MAX_QPS,
            max_mr_bytes: TenantEntry::DEFAULT_MAX_MR_BYTES,
            max_outstanding_wr: TenantEntry::DEFAULT_MAX_OUTSTANDING_WR,
            qp_create_rate: None,
            mr_reg_rate: None,
            matches: Vec::new(),
        }
    }

    /// Sets the traffic class.
    pub fn with_class(self, class: TrafficClass) -> TenantEntry {
        TenantEntry { class, ..self }
    }

    /// Sets the weight.
    pub fn with_weight(mut self, weight: u32) -> TenantEntry {
        self.schedule.weight = weight;
        self
    }

    /// Caps the byte rate (bytes/s, burst in bytes).
    pub fn with_rate(mut self, cap: RateLimit) -> TenantEntry {
        self.schedule.byte_cap = Some(cap);
        self
    }

    /// Caps the work request rate (WRs/s, burst in WRs).
    pub fn with_wr_rate(mut self, cap: RateLimit) -> TenantEntry {
        self.schedule.wr_cap = Some(cap);
        self
    }

    /// Sets the most queue pairs held at once.
    pub fn with_max_qps(self, max_qps: u32) -> TenantEntry {
        TenantEntry { max_qps, ..self }
    }

    /// Sets the most memory region bytes held at once.
    pub fn with_max_mr_bytes(self, max_mr_bytes: u64) -> TenantEntry {
        TenantEntry {
            max_mr_bytes,
            ..self
        }
    }

    /// Sets the most outstanding work requests.
    pub fn with_max_outstanding_wr(self, max_outstanding_wr: u32) -> TenantEntry {
        TenantEntry {
            max_outstanding_wr,
            ..self
        }
    }

    /// Caps queue pair creations per second.
    pub fn with_qp_create_rate(self, cap: RateLimit) -> TenantEntry {
        TenantEntry {
            qp_create_rate: Some(cap),
            ..self
        }
    }

    /// Caps memory region registrations per second.
    pub fn with_mr_reg_rate(self, cap: RateLimit) -> TenantEntry {
        TenantEntry {
            mr_reg_rate: Some(cap),
            ..self
        }
    }

    /// Adds a rule recognising the tenant's processes.
    pub fn with_match(mut self, rule: MatchRule) -> TenantEntry {
        self.matches.push(rule);
        self
    }
}

impl Policy {
    /// A policy of `link` shared by `tenants` (not yet validated).
    pub fn new(link: LinkConfig, tenants: Vec<TenantEntry>) -> Policy {
        Policy {
            link,
            tenants,
            exempt: Vec::new(),
            cluster: Arc::default(),
        }
    }

    /// The same policy with `cluster`'s limits across hosts
    /// ([`cluster`](Self::cluster)).
    pub fn with_cluster(mut self, cluster: ClusterPolicy) -> Policy {
        self.cluster = Arc::new(cluster);
        self
    }

    /// The same policy with the tenants named in `names` exempt from the
    /// latency bound ([`exempt`](Self::exempt)).
    pub fn with_exempt<I, S>(mut self, names: I) -> Policy
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.exempt.extend(names.into_iter().map(Into::into));
        self
    }

    /// What the latency bound asks of `tenant`'s scheduled queue pairs:
    /// `None` without a bound, for a latency-class tenant, and for a
    /// tenant [`exempt`](Self::exempt) names.
    pub fn protection_for(&self, tenant: &TenantEntry) -> Option<mtrdma_sched::Protection> {
        let bound = self.link.latency_bound?;
        if tenant.class == TrafficClass::Latency || self.exempt.contains(&tenant.name) {
            return None;
        }
        mtrdma_sched::Protection::for_bound(bound).ok()
    }

    /// Reads and validates a policy from TOML text.
    ///
    /// # Errors
    /// [`PolicyError::Syntax`] if the text is not TOML, and
    /// [`PolicyError::Invalid`] naming the tenant, the field and the problem
    /// for anything else: an unknown, missing or mistyped field, a bad unit,
    /// or a value [`validate`](Self::validate) refuses.
    pub fn from_toml_str(text: &str) -> Result<Policy, PolicyError> {
        let policy = file::parse(text)?;
        policy.validate()?;
        Ok(policy)
    }

    /// Like [`from_toml_str`](Self::from_toml_str), for bytes that should be
    /// UTF-8 text.
    ///
    /// # Errors
    /// [`PolicyError::NotUtf8`] if they are not, else as `from_toml_str`.
    pub fn from_toml_bytes(bytes: &[u8]) -> Result<Policy, PolicyError> {
        let text = std::str::from_utf8(bytes).map_err(|e| PolicyError::NotUtf8 {
            valid_up_to: e.valid_up_to(),
        })?;
        Policy::from_toml_str(text)
    }

    /// Reads and validates the policy file at `path`.
    ///
    /// # Errors
    /// [`PolicyError::Io`] if the file cannot be read, and
    /// [`PolicyError::File`] (naming the path, wrapping the problem) if its
    /// contents are not a valid policy.
    pub fn from_file(path: &Path) -> Result<Policy, PolicyError> {
        let bytes = std::fs::read(path).map_err(|source| PolicyError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Policy::from_toml_bytes(&bytes).map_err(|e| PolicyError::File {
            path: path.to_path_buf(),
            source: Box::new(e),
        })
    }

    /// Checks every rule a policy must follow, whether read from a file or
    /// built in code: a link capacity above 0, a recomputation period of 1
    /// to 1000 ms, a latency bound from 1 KiB to 16 MiB, exemptions that
    /// name tenants of the policy, at least one tenant, unique ids and names, well-formed
    /// names, weights from 1 to 1,000,000, rates above 0, and match rules
    /// that set at least one condition with cgroups starting with `/`.
    ///
    /// ```
    /// use mtrdma_core::{LinkConfig, Policy, TenantId, TenantEntry};
    /// let policy = Policy::new(
    ///     LinkConfig::new(12_500_000_000),
    ///     vec![TenantEntry::new(TenantId(1), "a"), TenantEntry::new(TenantId(1), "b")],
    /// );
    /// let err = policy.validate().unwrap_err();
    /// assert_eq!(
    ///     err.to_string(),
    ///     "tenant \"b\": field id: 1 is already the id of tenant \"a\"; give every tenant its own id"
    /// );
    /// ```
    ///
    /// # Errors
    /// [`PolicyError::Invalid`] for the first broken rule, naming the tenant
    /// and the field.
    pub fn validate(&self) -> Result<(), PolicyError> {
        validate::policy(self)
    }

    /// One line on what the latency bound protects, for a coordinator's
    /// view and logs: the bound and what follows from it, and who is
    /// exempt; or that there is no protection across processes.
    ///
    /// ```
    /// use mtrdma_core::{LinkConfig, Policy, TenantEntry, TenantId};
    /// let t = vec![TenantEntry::new(TenantId(1), "bulk")];
    /// let none = Policy::new(LinkConfig::new(1 << 30), t.clone());
    /// assert!(none.protection_summary().starts_with("no latency bound"));
    /// let bound = Policy::new(LinkConfig::new(1 << 30).with_latency_bound(16 << 10), t);
    /// assert_eq!(
    ///     bound.protection_summary(),
    ///     "latency bound 16384 B: every bulk tenant posts pieces of at most 4096 B \
    ///      under a delay window that keeps at most 10240 B queued"
    /// );
    /// ```
    pub fn protection_summary(&self) -> String {
        let Some(p) = self
            .link
            .latency_bound
            .and_then(|b| mtrdma_sched::Protection::for_bound(b).ok())
        else {
            return "no latency bound: no protection across processes, each tenant's code \
                    decides its own pieces and window (set [link] latency_bound)"
                .to_string();
        };
        let mut line = format!(
            "latency bound {} B: every bulk tenant posts pieces of at most {} B under a delay \
             window that keeps at most {} B queued",
            p.bound_bytes, p.piece_bytes, p.queue_bytes
        );
        if !self.exempt.is_empty() {
            line.push_str(&format!(", but {} (exempt)", self.exempt.join(", ")));
        }
        line
    }

    /// The tenant with id `id`, if any.
    pub fn tenant(&self, id: TenantId) -> Option<&TenantEntry> {
        self.tenants.iter().find(|t| t.id == id)
    }

    /// The tenant a process chose by name (`--tenant NAME`,
    /// `MTRDMA_TENANT`), or the only one if it named none.
    ///
    /// # Errors
    /// [`TenantChoiceError`], listing the tenants there are, when the name
    /// is unknown, or when none was named and the policy has several.
    pub fn tenant_named(&self, name: Option<&str>) -> Result<&TenantEntry, TenantChoiceError> {
        let names = || self.tenants.iter().map(|t| t.name.clone()).collect();
        match name {
            Some(name) => self.tenants.iter().find(|t| t.name == name).ok_or_else(|| {
                TenantChoiceError::NoSuchTenant {
                    name: name.to_string(),
                    tenants: names(),
                }
            }),
            None if self.tenants.len() == 1 => Ok(&self.tenants[0]),
            None => Err(TenantChoiceError::NotChosen { tenants: names() }),
        }
    }

    /// The tenant a peer belongs to: the first tenant, in file order, with a
    /// match rule the peer satisfies.
    pub fn tenant_for_peer(&self, peer: &PeerCredentials) -> Option<&TenantEntry> {
        self.tenants
            .iter()
            .find(|t| t.matches.iter().any(|rule| rule.matches(peer)))
    }
}
