//! What an operator runs against the cluster's etcd: putting a policy
//! file into it ([`put_policy`]), and every host's report with the shares
//! that follow from them ([`hosts`]).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Client, GetOptions};

use super::{connect_any, hosts_prefix, policy_key, read_prefix, EtcdError};
use crate::cluster::{host_shares, HostReport};
use crate::policy::{ClusterPolicy, Policy};

/// A runtime for one of the commands below (and [`super::LocalEtcd`]'s
/// checks).
pub(super) fn runtime() -> Result<tokio::runtime::Runtime, EtcdError> {
    Ok(tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?)
}

/// Checks `text` as a policy and writes it as the cluster's policy under
/// `prefix`: every coordinator watching applies it. Returns the revision
/// written.
///
/// # Errors
/// [`EtcdError::Policy`] for a policy that is not valid (nothing is
/// written); [`EtcdError::Etcd`] when etcd cannot be reached.
pub fn put_policy(endpoints: &[String], prefix: &str, text: &str) -> Result<i64, EtcdError> {
    Policy::from_toml_str(text)?;
    let key = policy_key(prefix);
    runtime()?.block_on(patiently(endpoints, |mut client| {
        let key = key.clone();
        async move {
            let put = client.put(key, text, None).await?;
            Ok(put.header().map_or(0, |h| h.revision()))
        }
    }))
}

/// How long a command goes on trying: long enough for the cluster to elect
/// a new leader after one stopped.
const COMMAND_PATIENCE: Duration = Duration::from_secs(10);

/// `op` on a client of the first member that answers, tried again (each
/// time from the next member) until it succeeds or
/// [`COMMAND_PATIENCE`] has passed: a write while the cluster elects a new
/// leader waits for it.
async fn patiently<T, F, Fut>(endpoints: &[String], mut op: F) -> Result<T, EtcdError>
where
    F: FnMut(Client) -> Fut,
    Fut: std::future::Future<Output = Result<T, etcd_client::Error>>,
{
    let deadline = tokio::time::Instant::now() + COMMAND_PATIENCE;
    let mut attempt = 0;
    loop {
        let result = match connect_any(endpoints, attempt).await {
            Ok(client) => op(client).await,
            Err(e) => Err(e),
        };
        attempt += 1;
        match result {
            Ok(v) => return Ok(v),
            Err(e) if tokio::time::Instant::now() >= deadline => return Err(e.into()),
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

/// What an operator sees of the cluster ([`hosts`]): every host's report,
/// and the policy in etcd, from which each host's shares follow.
#[derive(Debug, Clone)]
pub struct HostsView {
    /// Every host's report, in name order.
    pub reports: Vec<HostReport>,
    /// Why the other keys under `hosts/` could not be read.
    pub unreadable: Vec<String>,
    /// The cluster's policy in etcd: its revision, and its limits across
    /// hosts, or why it is not a valid policy. `None`: no policy in etcd
    /// (each coordinator applies its own file).
    pub policy: Option<(i64, Result<Arc<ClusterPolicy>, String>)>,
}

impl HostsView {
    /// `host`'s shares (bytes per second by tenant id) as it computes them
    /// from these reports under the policy in etcd: every host computes
    /// the same from the same reports. `None` without a valid policy in
    /// etcd, or for a host with no report.
    pub fn shares(&self, host: &str) -> Option<BTreeMap<u32, u64>> {
        let (_, Ok(cluster)) = self.policy.as_ref()? else {
            return None;
        };
        let me = self.reports.iter().find(|r| r.host == host)?;
        let all: Vec<&HostReport> = self.reports.iter().collect();
        Some(host_shares(cluster, host, &me.demands, &all))
    }
}

/// Every host's report under `prefix`, and the policy in etcd: what an
/// operator's view of the cluster needs.
///
/// # Errors
/// [`EtcdError::Etcd`] when etcd cannot be reached.
pub fn hosts(endpoints: &[String], prefix: &str) -> Result<HostsView, EtcdError> {
    let owned = prefix.to_string();
    let got = runtime()?.block_on(patiently(endpoints, |mut client| {
        let prefix = owned.clone();
        async move {
            client
                .get(prefix, Some(GetOptions::new().with_prefix()))
                .await
        }
    }))?;
    let (policy, mut reports, unreadable) =
        read_prefix(got.kvs(), &policy_key(prefix), &hosts_prefix(prefix));
    reports.sort_by(|a, b| a.host.cmp(&b.host));
    let policy = policy.map(|(revision, text)| {
        let read = Policy::from_toml_str(&text)
            .map(|p| p.cluster)
            .map_err(|e| e.to_string());
        (revision, read)
    });
    Ok(HostsView {
        reports,
        unreadable,
        policy,
    })
}
