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
use std::sync::{Mutex, OnceLock};

use mtrdma_core::tenant::{Tenant, TenantSource};
pub use mtrdma_core::tenant::{ENV_COORDINATOR, ENV_POLICY, ENV_TENANT};
use mtrdma_core::TenantHandle;

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

/// Joins the tenant `source` names, through the same front door as a
/// program written against the crate ([`Tenant::join`]); the reason it
/// could not names the variable that asked for it.
pub(crate) fn join(source: &TenantSource) -> Result<TenantHandle, String> {
    Tenant::join(source)
        .map(Tenant::into_handle)
        .map_err(|e| match source {
            TenantSource::Coordinator(_) => format!("{e} (from {ENV_COORDINATOR})"),
            _ => format!("{e} (from {ENV_POLICY})"),
        })
}

/// The process's tenancy, found at the first call.
pub(crate) fn tenancy() -> &'static Tenancy {
    static TENANCY: OnceLock<Tenancy> = OnceLock::new();
    TENANCY.get_or_init(|| {
        let Some(source) = TenantSource::from_env() else {
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
        let handle = join(&TenantSource::policy_file(&file, Some("bulk"))).unwrap();
        assert_eq!(handle.name(), "bulk");
        let err = join(&TenantSource::policy_file(&file, None)).unwrap_err();
        assert!(
            err.contains("lat, bulk") && err.contains(ENV_TENANT) && err.contains(ENV_POLICY),
            "{err}"
        );
        let err = join(&TenantSource::policy_file(&file, Some("nope"))).unwrap_err();
        assert!(err.contains("no tenant \"nope\""), "{err}");
        let err = join(&TenantSource::coordinator(dir.join("no-socket"))).unwrap_err();
        assert!(err.contains(ENV_COORDINATOR), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
