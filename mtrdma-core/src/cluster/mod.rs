//! Limits that hold across hosts: each host's coordinator gives its host a
//! share of every cluster-wide limit of the policy ([`ClusterPolicy`]), by
//! what every host reports its tenants want.
//!
//! The decisions are here, apart from how the reports travel, so that they
//! run in tests without a store: [`host_shares`] computes a host's shares
//! from every host's report, [`Member`] keeps the other hosts' reports and
//! decides when this host's report is worth publishing again. With the
//! `etcd` feature, [`etcd`] carries the reports and the policy through an
//! etcd cluster, each host's report under a lease that ends with its
//! coordinator.
//!
//! **How a limit is shared.** A tenant's demand across the cluster is the
//! sum of what each host reports for it (each within the tenant's own cap).
//! With `[cluster] capacity`, the cluster-wide tenants share it weighted
//! max-min fair by their cluster weights and those demands; each tenant's
//! part is at most its `cluster_cap`. Without it, each tenant's part is
//! its `cluster_cap`. A tenant's part is then split among the hosts that
//! report it, max-min fair by their demands (an idle host's share goes to
//! busy ones), and what no host wants is spread evenly over them all so
//! that a host whose demand grows has room at once. The shares of a
//! tenant add up to its part, never more, whatever the hosts want: every
//! host computes the same split from the same reports.
//!
//! A host reports the cluster-wide tenants that have processes on it. A
//! host new to a tenant counts itself at once; the others count it once
//! its report reaches them (it is written at most [`MIN_PUBLISH_INTERVAL_NS`]
//! after the last, and etcd's watch delivers it), so for that long the
//! tenant's shares may add up to more than its part.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use crate::fairshare::{weighted_max_min, Demand};
use crate::policy::{ClusterPolicy, ClusterTenant};

#[cfg(feature = "etcd")]
pub mod etcd;

/// A demand that means "all it can get" (a tenant with work waiting).
pub const ALL: u64 = u64::MAX;

/// What one host reports: its tenants' demands. Its shares are not in it:
/// every host computes every host's shares from the same reports (and an
/// operator's view does too, [`host_shares`]), so a host's report changes,
/// and is written, only when its own demands do, not when another host's
/// demand moves its shares.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct HostReport {
    /// The host's name (unique in the cluster).
    pub host: String,
    /// Per cluster-wide tenant (by id), bytes per second it wants on this
    /// host ([`ALL`]: all it can get).
    pub demands: BTreeMap<u32, u64>,
    /// The revision of the policy the host applies (0: its own file).
    pub policy_revision: i64,
}

impl HostReport {
    /// The report as stored: JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// A stored report, checked: the name must be the key's, and every
    /// number must be a number.
    ///
    /// # Errors
    /// What is wrong with it, for a log line: the report is then left out.
    pub fn from_json(host: &str, bytes: &[u8]) -> Result<HostReport, String> {
        let report: HostReport =
            serde_json::from_slice(bytes).map_err(|e| format!("host {host}'s report: {e}"))?;
        if report.host != host {
            return Err(format!(
                "host {host}'s report names another host, {:?}",
                report.host
            ));
        }
        Ok(report)
    }
}

/// This host's share of the limit of each cluster-wide tenant in `own`
/// (this host's demands, bytes per second by tenant id: the tenants with
/// processes here), from `own` and `others` (the reports of the other
/// hosts; one of `me`'s own name is ignored, and of two of one name the
/// first counts). See the module docs for the rule. A tenant is split
/// among the hosts that report it; a tenant in `own` that the policy does
/// not limit across hosts gets no share.
pub fn host_shares(
    cluster: &ClusterPolicy,
    me: &str,
    own: &BTreeMap<u32, u64>,
    others: &[&HostReport],
) -> BTreeMap<u32, u64> {
    let mut hosts: BTreeMap<&str, &HostReport> = BTreeMap::new();
    for r in others {
        if r.host != me {
            hosts.entry(r.host.as_str()).or_insert(r);
        }
    }
    let mut index = DemandIndex::default();
    index.rebuild(DemandIndex::wanted(cluster, own), hosts.values().copied());
    index.shares(cluster, &Limits::of(cluster), me, own)
}

/// The cluster-wide tenants of a policy by id.
#[derive(Debug, Default)]
struct Limits(HashMap<u32, ClusterTenant>);

impl Limits {
    fn of(cluster: &ClusterPolicy) -> Limits {
        Limits(cluster.tenants.iter().map(|t| (t.id.0, *t)).collect())
    }
}

/// The other hosts' demands by tenant: per tenant, each host that reports
/// it and what it wants there, in host name order. Kept as reports come,
/// change and go (a changed report touches only the demands that moved),
/// so that a host's shares are computed from its own tenants' entries,
/// not by reading every report again.
#[derive(Debug, Default)]
struct DemandIndex {
    tenants: HashMap<u32, Vec<(Arc<str>, u64)>>,
    /// The tenants kept: this host's, or (`None`) all, when a cluster
    /// capacity makes every tenant's demand count.
    kept: Option<BTreeSet<u32>>,
}

impl DemandIndex {
    /// The tenants an index must keep to compute shares for `own` under
    /// `cluster`.
    fn wanted(cluster: &ClusterPolicy, own: &BTreeMap<u32, u64>) -> Option<BTreeSet<u32>> {
        cluster
            .capacity
            .is_none()
            .then(|| own.keys().copied().collect())
    }

    /// Whether the index keeps what `wanted` asks for.
    fn keeps(&self, wanted: &Option<BTreeSet<u32>>) -> bool {
        self.kept == *wanted
    }

    /// The index of `reports` (one a host), keeping `kept`.
    fn rebuild<'a>(
        &mut self,
        kept: Option<BTreeSet<u32>>,
        reports: impl Iterator<Item = &'a HostReport>,
    ) {
        self.tenants.clear();
        self.kept = kept;
        for r in reports {
            self.update(&r.host, None, Some(&r.demands));
        }
    }

    /// `host`'s report went from `old` to `new` (`None`: no report).
    fn update(
        &mut self,
        host: &str,
        old: Option<&BTreeMap<u32, u64>>,
        new: Option<&BTreeMap<u32, u64>>,
    ) {
        let empty = BTreeMap::new();
        let (old, new) = (old.unwrap_or(&empty), new.unwrap_or(&empty));
        let mut name: Option<Arc<str>> = None;
        let (mut a, mut b) = (old.iter().peekable(), new.iter().peekable());
        loop {
            // The next tenant of either, and what each says of it.
            let (id, was, now) = match (a.peek(), b.peek()) {
                (None, None) => break,
                (Some(&(&i, &x)), Some(&(&j, &y))) if i == j => {
                    a.next();
                    b.next();
                    (i, Some(x), Some(y))
                }
                (Some(&(&i, &x)), Some(&(&j, _))) if i < j => {
                    a.next();
                    (i, Some(x), None)
                }
                (Some(&(&i, &x)), None) => {
                    a.next();
                    (i, Some(x), None)
                }
                (_, Some(&(&j, &y))) => {
                    b.next();
                    (j, None, Some(y))
                }
            };
            if was == now || self.kept.as_ref().is_some_and(|k| !k.contains(&id)) {
                continue;
            }
            let list = self.tenants.entry(id).or_default();
            let at = list.binary_search_by(|(h, _)| (**h).cmp(host));
            match (at, now) {
                (Ok(i), Some(d)) => list[i].1 = d,
                (Ok(i), None) => {
                    list.remove(i);
                }
                (Err(i), Some(d)) => {
                    let name = name.get_or_insert_with(|| Arc::from(host));
                    list.insert(i, (Arc::clone(name), d));
                }
                (Err(_), None) => {}
            }
            if list.is_empty() {
                self.tenants.remove(&id);
            }
        }
    }

    /// `me`'s shares of `cluster`'s limits (`limits`, by id) for its
    /// tenants `own`, the others wanting what the index holds.
    fn shares(
        &self,
        cluster: &ClusterPolicy,
        limits: &Limits,
        me: &str,
        own: &BTreeMap<u32, u64>,
    ) -> BTreeMap<u32, u64> {
        // Every host that reports tenant `t`, this one included, and what
        // each wants there within the tenant's cap, in host name order.
        let reporting = |t: &ClusterTenant, mine: Option<u64>| -> Vec<(&str, u64)> {
            let within = |d: u64| t.cap.map_or(d, |c| d.min(c));
            let mut hosts: Vec<(&str, u64)> = self
                .tenants
                .get(&t.id.0)
                .map(|l| l.iter().map(|(h, d)| (&**h, within(*d))).collect())
                .unwrap_or_default();
            if let Some(d) = mine {
                let at = hosts.partition_point(|&(h, _)| h < me);
                hosts.insert(at, (me, within(d)));
            }
            hosts
        };
        // Each tenant's part of the cluster: with a capacity, by every
        // cluster-wide tenant's demand.
        let parts: Option<HashMap<u32, u64>> = cluster.capacity.map(|capacity| {
            let totals: Vec<Demand> = cluster
                .tenants
                .iter()
                .map(|t| Demand {
                    weight: t.weight,
                    demand: reporting(t, own.get(&t.id.0).copied())
                        .iter()
                        .fold(0u64, |sum, &(_, d)| sum.saturating_add(d)),
                    cap: t.cap,
                })
                .collect();
            let parts = weighted_max_min(capacity, &totals);
            cluster.tenants.iter().map(|t| t.id.0).zip(parts).collect()
        });
        let mut out = BTreeMap::new();
        for (&id, &d) in own {
            let Some(t) = limits.0.get(&id) else {
                continue;
            };
            let part = match &parts {
                Some(parts) => parts.get(&id).copied().unwrap_or(0),
                None => t.cap.unwrap_or(0),
            };
            out.insert(id, split(part, &reporting(t, Some(d)), me));
        }
        out
    }
}

/// `me`'s part of `part`, split among `hosts` (name and demand, in name
/// order) max-min fair by demand; what no host wants is spread evenly
/// (the first hosts in name order get the remainder's odd bytes).
fn split(part: u64, hosts: &[(&str, u64)], me: &str) -> u64 {
    let demands: Vec<Demand> = hosts
        .iter()
        .map(|&(_, demand)| Demand {
            weight: 1,
            demand,
            cap: None,
        })
        .collect();
    let mut shares = weighted_max_min(part, &demands);
    let given: u64 = shares.iter().fold(0u64, |s, &x| s.saturating_add(x));
    let left = part.saturating_sub(given);
    let n = shares.len() as u64;
    for (i, s) in shares.iter_mut().enumerate() {
        *s += left / n + u64::from((i as u64) < left % n);
    }
    hosts
        .iter()
        .position(|&(name, _)| name == me)
        .map_or(0, |i| shares[i])
}

/// How much a demand must move before the report is published again: an
/// eighth, either way (and any move to or from 0 or [`ALL`]).
const PUBLISH_CHANGE_DIVISOR: u64 = 8;

/// The least time between two of a host's reports: each host writes at most
/// this often, however fast its demands move.
pub const MIN_PUBLISH_INTERVAL_NS: u64 = 200_000_000;

/// One host's side of sharing the cluster's limits: the other hosts'
/// reports as last heard, this host's demands, and when its report is worth
/// publishing again.
///
/// Writes are bounded: a report goes out when a demand moved by more than
/// an eighth (or to or from idle or "all"), or the policy changed, at
/// most every [`MIN_PUBLISH_INTERVAL_NS`], and once after each
/// (re)connection. Another host's demand moving this host's shares writes
/// nothing here. With steady demands a host writes nothing: its report
/// stays under its lease (kept alive by one keep-alive a third of the
/// lease's time to live). So etcd takes at most 5 writes a second per
/// host, whatever its number of tenants (one report holds them all), and
/// none from hosts whose demands hold still.
#[derive(Debug)]
pub struct Member {
    host: String,
    others: BTreeMap<String, HostReport>,
    /// The others' demands by tenant.
    index: DemandIndex,
    /// The limits of the policy last computed with, by id.
    limits: Limits,
    /// What was last published (`None`: nothing since the last
    /// connection).
    published: Option<HostReport>,
    last_publish_ns: u64,
    /// Whether the store is reachable: while it is not, the shares stay
    /// as they were last computed (no limit is lifted, none tightened).
    connected: bool,
    shares: BTreeMap<u32, u64>,
    /// How many times the shares changed: a caller that keeps a copy
    /// takes a new one only when this moved.
    changes: u64,
    /// What the shares were last computed from (this host's demands and
    /// the policy's limits), and whether a report came or went since:
    /// unchanged, they are not computed again. The policy is held, so
    /// the same allocation is the same policy, known without comparing
    /// its tenants.
    computed_from: Option<(BTreeMap<u32, u64>, Arc<ClusterPolicy>)>,
    heard_since: bool,
}

impl Member {
    /// A member named `host`, not yet connected: until it hears the other
    /// hosts it gives its own host each cluster-wide tenant's whole part
    /// as it computes it alone.
    pub fn new(host: impl Into<String>) -> Member {
        Member {
            host: host.into(),
            others: BTreeMap::new(),
            // Nothing kept until the first shares say which tenants.
            index: DemandIndex {
                kept: Some(BTreeSet::new()),
                ..DemandIndex::default()
            },
            limits: Limits::default(),
            published: None,
            last_publish_ns: 0,
            connected: false,
            shares: BTreeMap::new(),
            changes: 0,
            computed_from: None,
            heard_since: true,
        }
    }

    /// This host's name.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// The store is reachable again, with every host's report as it now
    /// holds them (this host's own, if still there, is ignored): the report
    /// is published afresh.
    pub fn connected(&mut self, reports: Vec<HostReport>) {
        self.connected = true;
        self.heard_since = true;
        self.published = None;
        self.others = reports
            .into_iter()
            .filter(|r| r.host != self.host)
            .map(|r| (r.host.clone(), r))
            .collect();
        let kept = self.index.kept.take();
        self.index.rebuild(kept, self.others.values());
    }

    /// The store was lost: the shares hold as they are until it is back.
    pub fn disconnected(&mut self) {
        self.connected = false;
        self.heard_since = true;
    }

    /// Whether the store is reachable.
    pub fn is_connected(&self) -> bool {
        self.connected
    }

    /// Another host's report, new or changed.
    pub fn heard(&mut self, report: HostReport) {
        if report.host == self.host {
            return;
        }
        self.heard_since = true;
        let old = self.others.get(&report.host).map(|r| &r.demands);
        self.index.update(&report.host, old, Some(&report.demands));
        self.others.insert(report.host.clone(), report);
    }

    /// Another host's report is gone (its lease ended: the host's
    /// coordinator stopped or died).
    pub fn gone(&mut self, host: &str) {
        if let Some(old) = self.others.remove(host) {
            self.index.update(host, Some(&old.demands), None);
            self.heard_since = true;
        }
    }

    /// The other hosts, as last heard.
    pub fn others(&self) -> impl Iterator<Item = &HostReport> {
        self.others.values()
    }

    /// This host's shares from `own` demands and the others' reports,
    /// under `cluster`; while disconnected, the shares last computed (for
    /// tenants still cluster-wide), and `None` for the others.
    pub fn shares(
        &mut self,
        cluster: &Arc<ClusterPolicy>,
        own: &BTreeMap<u32, u64>,
    ) -> &BTreeMap<u32, u64> {
        if !self.heard_since {
            if let Some((demands, policy)) = &mut self.computed_from {
                if demands == own && (Arc::ptr_eq(policy, cluster) || **policy == **cluster) {
                    // An equal policy in another allocation (a reload of
                    // the same file) is held from now on, so that the
                    // next call knows it at once.
                    *policy = Arc::clone(cluster);
                    return &self.shares;
                }
            }
        }
        self.heard_since = false;
        let same_policy = self
            .computed_from
            .as_ref()
            .is_some_and(|(_, policy)| Arc::ptr_eq(policy, cluster));
        if !same_policy {
            self.limits = Limits::of(cluster);
        }
        let wanted = DemandIndex::wanted(cluster, own);
        if !self.index.keeps(&wanted) {
            self.index.rebuild(wanted, self.others.values());
        }
        self.computed_from = Some((own.clone(), Arc::clone(cluster)));
        let mut fresh = self.index.shares(cluster, &self.limits, &self.host, own);
        if !self.connected && !self.shares.is_empty() {
            // Frozen: keep the last, for tenants still limited; one new to
            // the policy takes its fresh share.
            for (id, share) in fresh.iter_mut() {
                if let Some(&last) = self.shares.get(id) {
                    *share = last;
                }
            }
        }
        if fresh != self.shares {
            self.shares = fresh;
            self.changes += 1;
        }
        &self.shares
    }

    /// The shares as [`Member::shares`] last computed them.
    pub fn current_shares(&self) -> &BTreeMap<u32, u64> {
        &self.shares
    }

    /// How many times [`Member::shares`] changed the shares: the same
    /// count, the same shares.
    pub fn share_changes(&self) -> u64 {
        self.changes
    }

    /// The report to publish at `now_ns`, if it is worth a write: the
    /// demands `own` and the policy revision applied. Counts it as
    /// published.
    pub fn to_publish(
        &mut self,
        now_ns: u64,
        own: &BTreeMap<u32, u64>,
        policy_revision: i64,
    ) -> Option<HostReport> {
        if !self.connected {
            return None;
        }
        let due = match &self.published {
            None => true,
            Some(last) => {
                now_ns.saturating_sub(self.last_publish_ns) >= MIN_PUBLISH_INTERVAL_NS
                    && (last.policy_revision != policy_revision || moved(&last.demands, own))
            }
        };
        if !due {
            return None;
        }
        let report = HostReport {
            host: self.host.clone(),
            demands: own.clone(),
            policy_revision,
        };
        self.published = Some(report.clone());
        self.last_publish_ns = now_ns;
        Some(report)
    }
}

/// Whether any demand moved enough to be published again.
fn moved(last: &BTreeMap<u32, u64>, now: &BTreeMap<u32, u64>) -> bool {
    if last.len() != now.len() || last.keys().ne(now.keys()) {
        return true;
    }
    last.values().zip(now.values()).any(|(&a, &b)| {
        if a == b {
            return false;
        }
        if a == 0 || b == 0 || a == ALL || b == ALL {
            return true;
        }
        a.abs_diff(b) > a / PUBLISH_CHANGE_DIVISOR
    })
}

#[cfg(test)]
mod tests;
