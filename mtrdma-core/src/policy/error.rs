//! Why a policy was refused.

use std::fmt;
use std::path::PathBuf;

use crate::TenantId;

/// Which tenant a [`PolicyError`] is about, as precisely as the policy allows.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum TenantRef {
    /// The tenant with this name.
    Name(String),
    /// The tenant with this id (its name is missing or is the problem).
    Id(TenantId),
    /// The tenant at this position in the file, counting from 1 (it has
    /// neither a usable name nor id).
    Position(usize),
}

impl fmt::Display for TenantRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TenantRef::Name(name) => write!(f, "{name:?}"),
            TenantRef::Id(id) => write!(f, "with id {}", id.0),
            TenantRef::Position(n) => write!(f, "#{n}"),
        }
    }
}

/// Why no tenant of a policy could be chosen by name
/// ([`Policy::tenant_named`](crate::Policy::tenant_named)).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TenantChoiceError {
    /// No tenant has that name.
    #[error("the policy has no tenant {name:?}; it has: {}", .tenants.join(", "))]
    NoSuchTenant {
        /// The name asked for.
        name: String,
        /// The names the policy has, in file order.
        tenants: Vec<String>,
    },
    /// No name was given, and the policy has more than one tenant.
    #[error("the policy has several tenants ({}); choose one by name", .tenants.join(", "))]
    NotChosen {
        /// The names the policy has, in file order.
        tenants: Vec<String>,
    },
}

/// Why a policy could not be read or was refused.
///
/// Every message is a sentence naming what is wrong and where: the tenant,
/// the field (as written in the file: `rate.burst`, `match[2].cgroup`, with
/// list positions counted from 1) and the problem, e.g.
/// `tenant "kv-latency": field rate.burst: "64XB" is not a size (use e.g. 64KiB, 1MB, 4096)`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PolicyError {
    /// The text is not TOML.
    #[error("the policy is not valid TOML: line {line}, column {column}: {message}")]
    Syntax {
        /// Line of the mistake, counting from 1.
        line: usize,
        /// Column (in characters) of the mistake, counting from 1.
        column: usize,
        /// What the TOML parser expected.
        message: String,
    },
    /// The text is TOML, but a field is unknown, missing, of the wrong type,
    /// or holds a value the policy rules refuse.
    #[error("{}field {field}: {problem}", tenant_prefix(.tenant.as_ref()))]
    Invalid {
        /// The tenant the field belongs to; `None` for the `[link]` section
        /// and the file as a whole.
        tenant: Option<TenantRef>,
        /// The field, as written in the file, e.g. `rate.burst`.
        field: String,
        /// What is wrong and how to fix it.
        problem: String,
    },
    /// The bytes are not UTF-8 text.
    #[error(
        "the policy is not UTF-8 text (invalid byte at offset {valid_up_to}); save it as UTF-8"
    )]
    NotUtf8 {
        /// Length of the valid UTF-8 prefix.
        valid_up_to: usize,
    },
    /// The policy file could not be read.
    #[error("cannot read policy file {}: {source}", .path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The operating system's reason.
        source: std::io::Error,
    },
    /// The policy file was read but its contents were refused.
    #[error("policy file {}: {source}", .path.display())]
    File {
        /// The file.
        path: PathBuf,
        /// What is wrong with its contents.
        source: Box<PolicyError>,
    },
}

fn tenant_prefix(tenant: Option<&TenantRef>) -> String {
    match tenant {
        Some(t) => format!("tenant {t}: "),
        None => String::new(),
    }
}

impl PolicyError {
    /// An [`Invalid`](PolicyError::Invalid) error.
    pub(crate) fn invalid(
        tenant: Option<&TenantRef>,
        field: impl Into<String>,
        problem: impl Into<String>,
    ) -> PolicyError {
        PolicyError::Invalid {
            tenant: tenant.cloned(),
            field: field.into(),
            problem: problem.into(),
        }
    }
}

/// `text` quoted for a message, shortened if long (it is untrusted input).
pub(super) fn quote(text: &str) -> String {
    const MAX: usize = 40;
    match text.char_indices().nth(MAX) {
        Some((cut, _)) => format!("{:?}...", &text[..cut]),
        None => format!("{text:?}"),
    }
}
