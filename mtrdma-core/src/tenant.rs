//! Joining as a tenant: one front door for a program, a library or the
//! preload library, whichever way the operator set the tenant up.
//!
//! - A running coordinator ([`TenantSource::Coordinator`]): the process
//!   registers over its socket and the coordinator decides the tenant from
//!   the process's credentials (its cgroup, uid or gid). Isolation then
//!   holds across processes.
//! - A policy ([`TenantSource::PolicyFile`], [`TenantSource::Policy`]): an
//!   embedded quota table of that policy, in this process alone, and the
//!   tenant chosen by name (or the policy's only one).
//!
//! [`TenantSource::from_env`] reads the same environment the preload
//! library does (`MTRDMA_COORDINATOR`, or `MTRDMA_POLICY` and
//! `MTRDMA_TENANT`), so an operator sets a tenant up once for programs
//! written against the crate and for programs run under the preload
//! library alike.
//!
//! ```no_run
//! use mtrdma_core::tenant::{Tenant, TenantSource};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let source = TenantSource::from_env()
//!     .unwrap_or_else(|| TenantSource::coordinator("/run/mtrdma/coordinator.sock"));
//! let tenant = Tenant::join(&source)?;
//! println!("running as tenant {} (id {})", tenant.name(), tenant.tenant().0);
//! # Ok(())
//! # }
//! ```

use std::fmt;
use std::ops::Deref;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::coordinator::{register, CoordinatorError};
use crate::{AdmissionError, Policy, PolicyError, QuotaTable, TableError, TenantChoiceError};
use crate::{TenantHandle, TenantId};

/// The environment variable naming a coordinator's registration socket.
pub const ENV_COORDINATOR: &str = "MTRDMA_COORDINATOR";
/// The environment variable naming a policy file for an embedded table.
pub const ENV_POLICY: &str = "MTRDMA_POLICY";
/// The environment variable naming the tenant in `MTRDMA_POLICY`'s file.
pub const ENV_TENANT: &str = "MTRDMA_TENANT";

/// Where a process's tenant comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum TenantSource {
    /// A running coordinator's registration socket: the coordinator
    /// decides the tenant from the process's credentials.
    Coordinator(PathBuf),
    /// A policy file, read now, and the tenant's name in it (`None`: the
    /// file's only tenant).
    PolicyFile {
        /// The policy file (TOML, as the coordinator reads it).
        file: PathBuf,
        /// The tenant's name.
        tenant: Option<String>,
    },
    /// A policy built in code, and the tenant's name in it (`None`: its
    /// only tenant).
    Policy {
        /// The policy.
        policy: Box<Policy>,
        /// The tenant's name.
        tenant: Option<String>,
    },
}

impl TenantSource {
    /// The coordinator listening at `socket`.
    pub fn coordinator(socket: impl Into<PathBuf>) -> TenantSource {
        TenantSource::Coordinator(socket.into())
    }

    /// The policy file `file` and the tenant named `tenant` in it (`None`:
    /// the file's only tenant).
    pub fn policy_file(file: impl Into<PathBuf>, tenant: Option<&str>) -> TenantSource {
        TenantSource::PolicyFile {
            file: file.into(),
            tenant: tenant.map(str::to_string),
        }
    }

    /// The policy `policy` and the tenant named `tenant` in it (`None`: its
    /// only tenant).
    pub fn policy(policy: Policy, tenant: Option<&str>) -> TenantSource {
        TenantSource::Policy {
            policy: Box::new(policy),
            tenant: tenant.map(str::to_string),
        }
    }

    /// The source this process's environment names, if any:
    /// `MTRDMA_COORDINATOR` (a socket) first, else `MTRDMA_POLICY` (a file)
    /// with `MTRDMA_TENANT` (a name). A variable set to the empty string
    /// counts as unset.
    pub fn from_env() -> Option<TenantSource> {
        TenantSource::from_vars(|name| std::env::var(name).ok())
    }

    /// [`from_env`](Self::from_env), reading the variables through `get`.
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Option<TenantSource> {
        let set = |name: &str| get(name).filter(|v| !v.is_empty());
        if let Some(socket) = set(ENV_COORDINATOR) {
            return Some(TenantSource::Coordinator(PathBuf::from(socket)));
        }
        set(ENV_POLICY).map(|file| TenantSource::PolicyFile {
            file: PathBuf::from(file),
            tenant: set(ENV_TENANT),
        })
    }
}

impl fmt::Display for TenantSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let tenant = |t: &Option<String>| match t {
            Some(name) => format!("tenant {name:?}"),
            None => "its only tenant".to_string(),
        };
        match self {
            TenantSource::Coordinator(socket) => {
                write!(f, "the coordinator at {}", socket.display())
            }
            TenantSource::PolicyFile { file, tenant: t } => {
                write!(f, "the policy file {}, {}", file.display(), tenant(t))
            }
            TenantSource::Policy { tenant: t, .. } => {
                write!(f, "a policy given in code, {}", tenant(t))
            }
        }
    }
}

/// Why a process could not join as a tenant.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum JoinError {
    /// [`Tenant::from_env`]: the environment names no tenant.
    #[error(
        "no tenant is set up: set {ENV_COORDINATOR} to a coordinator's socket, or \
         {ENV_POLICY} to a policy file (and {ENV_TENANT} to a tenant's name in it)"
    )]
    NotSetUp,
    /// The coordinator could not be reached, refused the process, or
    /// handed over a table that could not be used.
    #[error("registering with the coordinator at {}: {source}", .socket.display())]
    Coordinator {
        /// Its socket.
        socket: PathBuf,
        /// What went wrong.
        #[source]
        source: CoordinatorError,
    },
    /// The policy file could not be read or is invalid.
    #[error(transparent)]
    Policy(#[from] PolicyError),
    /// The policy has no such tenant, or several and none was named.
    #[error("{source} (in {place}; name one with {ENV_TENANT})")]
    Tenant {
        /// Where the policy came from.
        place: String,
        /// Which tenants there are.
        #[source]
        source: TenantChoiceError,
    },
    /// The embedded quota table could not be made, or the process could
    /// not take a slot in it.
    #[error("the quota table of tenant {}: {source}", .tenant.0)]
    Table {
        /// The tenant.
        tenant: TenantId,
        /// What went wrong.
        #[source]
        source: TableError,
    },
}

/// This process as a tenant: the handle every queue pair and memory
/// region is created for ([`TenantHandle`], which a `Tenant` derefs to),
/// and where it came from.
///
/// Dropping it (and everything created for it) gives the process's slot
/// back to the table.
#[derive(Debug)]
pub struct Tenant {
    handle: TenantHandle,
    source: TenantSource,
}

impl Tenant {
    /// Joins as the tenant `source` names.
    ///
    /// # Errors
    /// [`JoinError`]: the coordinator unreachable or refusing the process,
    /// the policy file unreadable or invalid, the tenant unknown, or no
    /// slot in the table.
    pub fn join(source: &TenantSource) -> Result<Tenant, JoinError> {
        let handle = match source {
            TenantSource::Coordinator(socket) => {
                register(socket).map_err(|source| JoinError::Coordinator {
                    socket: socket.clone(),
                    source,
                })?
            }
            TenantSource::PolicyFile { file, tenant } => {
                let policy = Policy::from_file(file)?;
                let place = format!("the policy file {}", file.display());
                embedded(&policy, tenant.as_deref(), place)?
            }
            TenantSource::Policy { policy, tenant } => {
                embedded(policy, tenant.as_deref(), "the policy given".into())?
            }
        };
        Ok(Tenant {
            handle,
            source: source.clone(),
        })
    }

    /// Joins as the tenant this process's environment names
    /// ([`TenantSource::from_env`]).
    ///
    /// # Errors
    /// [`JoinError::NotSetUp`] when the environment names none; otherwise
    /// as [`join`](Self::join).
    pub fn from_env() -> Result<Tenant, JoinError> {
        let source = TenantSource::from_env().ok_or(JoinError::NotSetUp)?;
        Tenant::join(&source)
    }

    /// Where the tenant came from.
    pub fn source(&self) -> &TenantSource {
        &self.source
    }

    /// The handle queue pairs and memory regions are created for.
    pub fn handle(&self) -> &TenantHandle {
        &self.handle
    }

    /// The handle, for code that keeps it alone.
    pub fn into_handle(self) -> TenantHandle {
        self.handle
    }
}

impl Deref for Tenant {
    type Target = TenantHandle;

    fn deref(&self) -> &TenantHandle {
        &self.handle
    }
}

impl fmt::Display for Tenant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "tenant {} (id {}, {:?} class), from {}",
            self.handle.name(),
            self.handle.tenant().0,
            self.handle.class(),
            self.source
        )
    }
}

/// The tenant named `name` in `policy`, in an embedded table of it.
fn embedded(policy: &Policy, name: Option<&str>, place: String) -> Result<TenantHandle, JoinError> {
    let id = policy
        .tenant_named(name)
        .map_err(|source| JoinError::Tenant { place, source })?
        .id;
    let table_err = |source| JoinError::Table { tenant: id, source };
    let table = QuotaTable::embedded(policy).map_err(table_err)?;
    table.attach(id).map_err(table_err)
}

/// An error that may be a control-path rate limit: a queue pair or
/// memory region the tenant may create again after a while
/// ([`AdmissionError::RateLimited`]).
pub trait RateLimited {
    /// How long to wait before trying again, if this is a rate limit.
    fn retry_after(&self) -> Option<Duration>;
}

impl RateLimited for AdmissionError {
    fn retry_after(&self) -> Option<Duration> {
        match self {
            AdmissionError::RateLimited { retry_after_ns, .. } => {
                Some(Duration::from_nanos(*retry_after_ns))
            }
            _ => None,
        }
    }
}

/// What `create` gives, trying again while it is refused by a
/// control-path rate limit and `patience` has not run out, as an
/// application that creates many queue pairs or regions would rather than
/// failing. Between tries it sleeps for what the refusal says (at least 1
/// ms, at most 1 s). Any other error, or a rate limit past `patience`,
/// is returned as it is.
///
/// ```no_run
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use mtrdma_core::tenant::{admitted_within, Tenant};
///
/// let tenant = Tenant::from_env()?;
/// // A thousand admissions at the tenant's creation rate, however low.
/// for _ in 0..1000 {
///     admitted_within(Duration::from_secs(10), || tenant.acquire_qp())?;
/// }
/// # Ok(())
/// # }
/// ```
pub fn admitted_within<T, E: RateLimited>(
    patience: Duration,
    mut create: impl FnMut() -> Result<T, E>,
) -> Result<T, E> {
    let deadline = Instant::now() + patience;
    loop {
        match retry_after(create(), deadline) {
            Ok(answer) => return answer,
            Err(wait) => std::thread::sleep(wait),
        }
    }
}

/// The step [`admitted_within`] (and its async form in `mtrdma-verbs`)
/// takes after each try: the answer to hand back (`Ok`: admitted, or any
/// error but a rate limit, or a rate limit once `deadline` has passed),
/// or how long to wait before trying again (`Err`: what the refusal says,
/// at least 1 ms, at most 1 s).
pub fn retry_after<T, E: RateLimited>(
    result: Result<T, E>,
    deadline: Instant,
) -> Result<Result<T, E>, Duration> {
    match result {
        Err(e) => match e.retry_after() {
            Some(wait) if Instant::now() < deadline => {
                Err(wait.clamp(Duration::from_millis(1), Duration::from_secs(1)))
            }
            _ => Ok(Err(e)),
        },
        ok => Ok(ok),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{LinkConfig, RateLimit, TenantEntry};

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |name| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn the_coordinator_comes_before_a_policy_file_and_empty_means_unset() {
        assert_eq!(TenantSource::from_vars(env(&[])), None);
        assert_eq!(TenantSource::from_vars(env(&[(ENV_POLICY, "")])), None);
        assert_eq!(
            TenantSource::from_vars(env(&[(ENV_POLICY, "/p.toml"), (ENV_COORDINATOR, "/s")])),
            Some(TenantSource::coordinator("/s"))
        );
        assert_eq!(
            TenantSource::from_vars(env(&[(ENV_POLICY, "/p.toml"), (ENV_TENANT, "bulk")])),
            Some(TenantSource::policy_file("/p.toml", Some("bulk")))
        );
        assert_eq!(
            TenantSource::from_vars(env(&[(ENV_POLICY, "/p.toml"), (ENV_TENANT, "")])),
            Some(TenantSource::policy_file("/p.toml", None))
        );
    }

    fn two_tenants() -> Policy {
        Policy::new(
            LinkConfig::new(12_500_000_000),
            vec![
                TenantEntry::new(TenantId(1), "lat").with_class(crate::TrafficClass::Latency),
                TenantEntry::new(TenantId(2), "bulk"),
            ],
        )
    }

    #[test]
    fn a_policy_names_its_tenant_or_the_error_says_which_there_are() {
        let tenant = Tenant::join(&TenantSource::policy(two_tenants(), Some("bulk"))).unwrap();
        assert_eq!(
            (tenant.name(), tenant.tenant()),
            ("bulk".to_string(), TenantId(2))
        );
        assert!(
            tenant.to_string().contains("a policy given in code"),
            "{tenant}"
        );

        let err = Tenant::join(&TenantSource::policy(two_tenants(), None)).unwrap_err();
        let JoinError::Tenant { source, .. } = &err else {
            panic!("{err:?}")
        };
        assert_eq!(
            source,
            &TenantChoiceError::NotChosen {
                tenants: vec!["lat".into(), "bulk".into()]
            }
        );
        assert!(err.to_string().contains(ENV_TENANT), "{err}");

        let err = Tenant::join(&TenantSource::policy(two_tenants(), Some("nope"))).unwrap_err();
        assert!(
            matches!(&err, JoinError::Tenant { source: TenantChoiceError::NoSuchTenant { name, .. }, .. } if name == "nope"),
            "{err:?}"
        );
    }

    #[test]
    fn a_policy_file_is_read_and_its_mistakes_and_a_missing_socket_are_typed() {
        let dir = std::env::temp_dir().join(format!("mtrdma-tenant-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("p.toml");
        std::fs::write(
            &file,
            "[link]\ncapacity = \"100Gbit\"\n\n[[tenant]]\nid = 7\nname = \"only\"\n",
        )
        .unwrap();
        let tenant = Tenant::join(&TenantSource::policy_file(&file, None)).unwrap();
        assert_eq!(tenant.tenant(), TenantId(7));
        drop(tenant);

        std::fs::write(&file, "[link]\ncapacity = \"fast\"\n").unwrap();
        let err = Tenant::join(&TenantSource::policy_file(&file, None)).unwrap_err();
        assert!(matches!(err, JoinError::Policy(_)), "{err:?}");
        let err =
            Tenant::join(&TenantSource::policy_file(dir.join("none.toml"), None)).unwrap_err();
        assert!(
            matches!(err, JoinError::Policy(PolicyError::Io { .. })),
            "{err:?}"
        );

        let socket = dir.join("no-socket");
        let err = Tenant::join(&TenantSource::coordinator(&socket)).unwrap_err();
        assert!(
            matches!(&err, JoinError::Coordinator { socket: s, .. } if *s == socket),
            "{err:?}"
        );
        assert!(err.to_string().contains("no-socket"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_rate_limited_creation_is_tried_again_until_admitted_or_out_of_patience() {
        // Two queue pairs a second: those the burst allows at once, then
        // refusals that say how long to wait.
        let policy = Policy::new(
            LinkConfig::new(12_500_000_000),
            vec![TenantEntry::new(TenantId(1), "slow").with_qp_create_rate(RateLimit::new(2, 1))],
        );
        let tenant = Tenant::join(&TenantSource::policy(policy, None)).unwrap();
        let mut held = Vec::new();
        let refused = loop {
            match tenant.acquire_qp() {
                Ok(permit) => held.push(permit),
                Err(e) => break e,
            }
            assert!(held.len() < 10, "a rate of 2/s refuses a tenth at once");
        };
        assert!(refused.retry_after().is_some(), "{refused:?}");

        // Out of patience at once: the refusal comes back as it is.
        let mut tries = 0;
        let err = admitted_within(Duration::ZERO, || {
            tries += 1;
            tenant.acquire_qp()
        })
        .unwrap_err();
        assert_eq!(tries, 1);
        assert!(err.retry_after().is_some(), "{err:?}");

        // With patience, it waits as long as the refusals say, and is admitted.
        let start = Instant::now();
        let mut tries = 0;
        held.push(
            admitted_within(Duration::from_secs(5), || {
                tries += 1;
                tenant.acquire_qp()
            })
            .unwrap(),
        );
        assert!(tries > 1, "refused first, then admitted");
        assert!(
            start.elapsed() >= Duration::from_millis(100),
            "{:?}",
            start.elapsed()
        );

        // Any other refusal is not waited on.
        let other = AdmissionError::QuotaExceeded {
            tenant: TenantId(1),
            name: "slow".into(),
            resource: "queue pairs",
            field: "max_qps",
            limit: 1,
            in_use: 1,
            requested: 1,
        };
        assert_eq!(other.retry_after(), None);
    }
}
