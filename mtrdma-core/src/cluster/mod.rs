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

use std::collections::{BTreeMap, HashMap};

use crate::fairshare::{weighted_max_min, Demand};
use crate::policy::{ClusterPolicy, ClusterTenant};

#[cfg(feature = "etcd")]
pub mod etcd;

/// A demand that means "all it can get" (a tenant with work waiting).
pub const ALL: u64 = u64::MAX;

/// What one host reports: its tenants' demands, and the shares it
/// computed from everyone's (for operators; the other hosts use the
/// demands only).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct HostReport {
    /// The host's name (unique in the cluster).
    pub host: String,
    /// Per cluster-wide tenant (by id), bytes per second it wants on this
    /// host ([`ALL`]: all it can get).
    pub demands: BTreeMap<u32, u64>,
    /// Per cluster-wide tenant, the share this host gives it, bytes per
    /// second.
    pub shares: BTreeMap<u32, u64>,
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
/// hosts; one of `me`'s own name is ignored). See the module docs for the
/// rule. A tenant is split among the hosts that report it; a tenant in
/// `own` that the policy does not limit across hosts gets no share.
pub fn host_shares(
    cluster: &ClusterPolicy,
    me: &str,
    own: &BTreeMap<u32, u64>,
    others: &[&HostReport],
) -> BTreeMap<u32, u64> {
    // Only this host's tenants need a share; with a cluster capacity,
    // every cluster-wide tenant's demand decides the parts.
    let all = cluster.capacity.is_some();
    let limits: HashMap<u32, &ClusterTenant> = cluster
        .tenants
        .iter()
        .filter(|t| all || own.contains_key(&t.id.0))
        .map(|t| (t.id.0, t))
        .collect();
    // Every host's demands, this one's included, in name order.
    let mut hosts: Vec<(&str, &BTreeMap<u32, u64>)> = others
        .iter()
        .filter(|r| r.host != me)
        .map(|r| (r.host.as_str(), &r.demands))
        .collect();
    hosts.push((me, own));
    hosts.sort_by(|a, b| a.0.cmp(b.0));
    hosts.dedup_by(|a, b| a.0 == b.0);
    // Per tenant, the hosts that report it and what each wants there
    // (within the tenant's cap), in host name order.
    let mut reporting: HashMap<u32, Vec<(&str, u64)>> = HashMap::with_capacity(limits.len());
    for (name, demands) in &hosts {
        for (&id, &d) in demands.iter() {
            if let Some(t) = limits.get(&id) {
                let d = t.cap.map_or(d, |c| d.min(c));
                reporting.entry(id).or_default().push((name, d));
            }
        }
    }
    // Each tenant's part of the cluster.
    let part_of: HashMap<u32, u64> = match cluster.capacity {
        Some(capacity) => {
            let totals: Vec<Demand> = cluster
                .tenants
                .iter()
                .map(|t| Demand {
                    weight: t.weight,
                    demand: reporting.get(&t.id.0).map_or(0, |hs| {
                        hs.iter().fold(0u64, |sum, &(_, d)| sum.saturating_add(d))
                    }),
                    cap: t.cap,
                })
                .collect();
            let parts = weighted_max_min(capacity, &totals);
            cluster.tenants.iter().map(|t| t.id.0).zip(parts).collect()
        }
        None => limits
            .values()
            .map(|t| (t.id.0, t.cap.unwrap_or(0)))
            .collect(),
    };
    let mut out = BTreeMap::new();
    for &id in own.keys() {
        let (Some(hosts), Some(&part)) = (reporting.get(&id), part_of.get(&id)) else {
            continue;
        };
        out.insert(id, split(part, hosts, me));
    }
    out
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
/// Writes are bounded: a report goes out when a demand or a share moved by
/// more than an eighth (or to or from idle or "all"), or the policy
/// changed, at most every [`MIN_PUBLISH_INTERVAL_NS`], and once after each
/// (re)connection. With steady demands a host writes nothing: its report
/// stays under its lease (kept alive by one keep-alive a third of the
/// lease's time to live). So etcd takes at most 5 writes a second per
/// host, whatever its number of tenants (one report holds them all), and
/// none from hosts whose demands hold still.
#[derive(Debug)]
pub struct Member {
    host: String,
    others: BTreeMap<String, HostReport>,
    /// What was last published (`None`: nothing since the last
    /// connection).
    published: Option<HostReport>,
    last_publish_ns: u64,
    /// Whether the store is reachable: while it is not, the shares stay
    /// as they were last computed (no limit is lifted, none tightened).
    connected: bool,
    shares: BTreeMap<u32, u64>,
    /// What the shares were last computed from (this host's demands and
    /// the policy's limits), and whether a report came or went since:
    /// unchanged, they are not computed again.
    computed_from: Option<(BTreeMap<u32, u64>, ClusterPolicy)>,
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
            published: None,
            last_publish_ns: 0,
            connected: false,
            shares: BTreeMap::new(),
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
        if report.host != self.host {
            self.heard_since = true;
            self.others.insert(report.host.clone(), report);
        }
    }

    /// Another host's report is gone (its lease ended: the host's
    /// coordinator stopped or died).
    pub fn gone(&mut self, host: &str) {
        self.heard_since |= self.others.remove(host).is_some();
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
        cluster: &ClusterPolicy,
        own: &BTreeMap<u32, u64>,
    ) -> &BTreeMap<u32, u64> {
        let same = !self.heard_since
            && self
                .computed_from
                .as_ref()
                .is_some_and(|(d, c)| d == own && c == cluster);
        if same {
            return &self.shares;
        }
        self.heard_since = false;
        self.computed_from = Some((own.clone(), cluster.clone()));
        let others: Vec<&HostReport> = self.others.values().collect();
        let fresh = host_shares(cluster, &self.host, own, &others);
        if self.connected || self.shares.is_empty() {
            self.shares = fresh;
        } else {
            // Frozen: keep the last, for tenants still limited; one new to
            // the policy takes its fresh share.
            let mut kept = fresh;
            for (id, share) in kept.iter_mut() {
                if let Some(&last) = self.shares.get(id) {
                    *share = last;
                }
            }
            self.shares = kept;
        }
        &self.shares
    }

    /// The report to publish at `now_ns`, if it is worth a write: the
    /// demands `own`, the shares last computed, the policy revision
    /// applied. Counts it as published.
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
                    && (last.policy_revision != policy_revision
                        || moved(&last.demands, own)
                        || moved(&last.shares, &self.shares))
            }
        };
        if !due {
            return None;
        }
        let report = HostReport {
            host: self.host.clone(),
            demands: own.clone(),
            shares: self.shares.clone(),
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
