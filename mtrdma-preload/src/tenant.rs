//! Who the program runs as: the tenant named by its environment, found
//! once, at its first verbs call that needs it.
//!
//! - `MTRDMA_COORDINATOR=<socket>`: registers with a running coordinator,
//!   which decides the tenant from the process's credentials (its cgroup,
//!   uid or gid), as for programs using the Rust API.
//! - `MTRDMA_POLICY=<file>` (and `MTRDMA_TENANT=<name>` when the policy has
//!   several tenants): an embedded quota table of that policy in this
//!   process alone.
//! - Neither: verbs pass through unchanged (said once on stderr).
//!
//! A program told to run under a tenant that cannot join (no coordinator
//! at the socket, a bad policy file, an unknown tenant) is refused every
//! queue pair and memory region rather than run unisolated; the reason is
//! said once on stderr.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::{Mutex, OnceLock};

use mtrdma_core::coordinator::register;
use mtrdma_core::{Policy, QuotaTable, TenantHandle};

/// The environment variable naming a coordinator's registration socket.
pub const ENV_COORDINATOR: &str = "MTRDMA_COORDINATOR";
/// The environment variable naming a policy file for an embedded table.
pub const ENV_POLICY: &str = "MTRDMA_POLICY";
/// The environment variable naming the tenant in `MTRDMA_POLICY`.
pub const ENV_TENANT: &str = "MTRDMA_TENANT";

/// What the environment asked for, and what came of it.
#[derive(Debug)]
pub(crate) enum Tenancy {
    /// No tenant asked for: verbs pass through.
    Off,
    /// Running as this tenant.
    Joined(TenantHandle),
    /// A tenant was asked for and could not be joined: why.
    Failed(String),
}

/// Where the tenant comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Source {
    /// `MTRDMA_COORDINATOR`.
    Coordinator(PathBuf),
    /// `MTRDMA_POLICY` and `MTRDMA_TENANT`.
    Policy {
        file: PathBuf,
        tenant: Option<String>,
    },
}

/// The source the environment names, if any (`MTRDMA_COORDINATOR` first).
pub(crate) fn source_from(get: impl Fn(&str) -> Option<String>) -> Option<Source> {
    let set = |name: &str| get(name).filter(|v| !v.is_empty());
    if let Some(socket) = set(ENV_COORDINATOR) {
        return Some(Source::Coordinator(PathBuf::from(socket)));
    }
    set(ENV_POLICY).map(|file| Source::Policy {
        file: PathBuf::from(file),
        tenant: set(ENV_TENANT),
    })
}

/// Joins the tenant `source` names.
pub(crate) fn join(source: &Source) -> Result<TenantHandle, String> {
    match source {
        Source::Coordinator(socket) => register(socket).map_err(|e| {
            format!(
                "registering with the coordinator at {} ({ENV_COORDINATOR}): {e}",
                socket.display()
            )
        }),
        Source::Policy { file, tenant } => {
            let policy = Policy::from_file(file).map_err(|e| format!("{ENV_POLICY}: {e}"))?;
            let id = policy
                .tenant_named(tenant.as_deref())
                .map_err(|e| format!("{ENV_POLICY} {}: {e} (set {ENV_TENANT})", file.display()))?
                .id;
            let table = QuotaTable::embedded(&policy)
                .map_err(|e| format!("the quota table of {}: {e}", file.display()))?;
            table
                .attach(id)
                .map_err(|e| format!("attaching as tenant {}: {e}", id.0))
        }
    }
}

/// The process's tenancy, found at the first call.
pub(crate) fn tenancy() -> &'static Tenancy {
    static TENANCY: OnceLock<Tenancy> = OnceLock::new();
    TENANCY.get_or_init(|| {
        let Some(source) = source_from(|name| std::env::var(name).ok()) else {
            say_once(
                "off",
                &format!(
                    "neither {ENV_COORDINATOR} nor {ENV_POLICY} is set: verbs pass through \
                     without quotas or scheduling"
                ),
            );
            return Tenancy::Off;
        };
        match join(&source) {
            Ok(handle) => Tenancy::Joined(handle),
            Err(why) => {
                say_once(
                    "join",
                    &format!("{why}; every queue pair and memory region will be refused"),
                );
                Tenancy::Failed(why)
            }
        }
    })
}

/// Writes `message` to stderr the first time `key` is said in this
/// process.
pub(crate) fn say_once(key: &str, message: &str) {
    static SAID: Mutex<Option<HashSet<String>>> = Mutex::new(None);
    let mut said = SAID.lock().unwrap_or_else(|e| e.into_inner());
    if said
        .get_or_insert_with(HashSet::new)
        .insert(key.to_string())
    {
        eprintln!("mtrdma-preload: {message}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |name| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn the_coordinator_comes_before_a_policy_file_and_empty_means_unset() {
        assert_eq!(source_from(env(&[])), None);
        assert_eq!(source_from(env(&[(ENV_POLICY, "")])), None);
        assert_eq!(
            source_from(env(&[(ENV_POLICY, "/p.toml"), (ENV_COORDINATOR, "/s")])),
            Some(Source::Coordinator(PathBuf::from("/s")))
        );
        assert_eq!(
            source_from(env(&[(ENV_POLICY, "/p.toml"), (ENV_TENANT, "bulk")])),
            Some(Source::Policy {
                file: PathBuf::from("/p.toml"),
                tenant: Some("bulk".into())
            })
        );
    }

    #[test]
    fn a_policy_file_names_its_tenant_or_says_which_there_are() {
        let dir = std::env::temp_dir().join(format!("mtrdma-preload-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("p.toml");
        std::fs::write(
            &file,
            "[link]\ncapacity = \"100Gbit\"\n\n[[tenant]]\nid = 1\nname = \"lat\"\n\
             class = \"latency\"\n\n[[tenant]]\nid = 2\nname = \"bulk\"\nmax_qps = 1\n",
        )
        .unwrap();
        let handle = join(&Source::Policy {
            file: file.clone(),
            tenant: Some("bulk".into()),
        })
        .unwrap();
        assert_eq!(handle.name(), "bulk");
        let err = join(&Source::Policy {
            file: file.clone(),
            tenant: None,
        })
        .unwrap_err();
        assert!(
            err.contains("lat, bulk") && err.contains(ENV_TENANT),
            "{err}"
        );
        let err = join(&Source::Policy {
            file: file.clone(),
            tenant: Some("nope".into()),
        })
        .unwrap_err();
        assert!(err.contains("no tenant \"nope\""), "{err}");
        let err = join(&Source::Coordinator(dir.join("no-socket"))).unwrap_err();
        assert!(err.contains(ENV_COORDINATOR), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
