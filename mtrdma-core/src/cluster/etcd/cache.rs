//! The last policy applied from etcd, kept in a file
//! ([`super::EtcdConfig::cache`]) so that it outlives the coordinator.

use std::path::Path;

use crate::policy::Policy;

/// The first line of a kept policy: its etcd revision.
const CACHE_HEADER: &str = "# mtrdma: the cluster's policy from etcd, revision ";

/// Keeps `text`, etcd's policy at `revision`, in `path` (written whole
/// beside it, then renamed over it).
pub(super) fn keep_policy(path: &Path, revision: i64, text: &str) -> std::io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".new");
    std::fs::write(&tmp, format!("{CACHE_HEADER}{revision}\n{text}"))?;
    std::fs::rename(&tmp, path)
}

/// The policy a [`super::Cluster`] kept in `path` (its etcd revision and text),
/// if there is one and it is a valid policy: what a coordinator started
/// while etcd is away applies, so that it holds the limits etcd last gave
/// rather than its own file's.
pub fn cached_policy(path: &Path) -> Option<(i64, Policy)> {
    let text = std::fs::read_to_string(path).ok()?;
    let (first, policy) = text.split_once('\n')?;
    let revision = first.strip_prefix(CACHE_HEADER)?.trim().parse().ok()?;
    Some((revision, Policy::from_toml_str(policy).ok()?))
}
