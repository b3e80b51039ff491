//! Tenants' policies, the shared-memory quota table and the coordinator:
//! everything of mtrdma that crosses a process boundary.
//!
//! The pure types every mtrdma crate speaks in (who a tenant is,
//! [`TenantId`]; the class of a work request, [`TrafficClass`]; rates,
//! [`RateLimit`]; how a tenant is scheduled, [`TenantPolicy`]; the GCRA
//! step) are `mtrdma-sched`'s, re-exported here.

pub mod clock;
pub mod cluster;
pub mod coordinator;
mod fairshare;
mod link_observer;
pub mod monitor;
pub mod policy;
pub mod procinfo;
pub mod registry;
pub mod table;
pub mod tenant;

pub use fairshare::{weighted_max_min, Demand};
pub use mtrdma_sched::{
    gcra_decide, gcra_shared, EmissionInterval, RateLimit, TenantId, TenantPolicy, TrafficClass,
    MAX_WEIGHT,
};
pub use policy::{
    ClusterPolicy, ClusterTenant, LinkConfig, MatchRule, PeerCredentials, Policy, PolicyError,
    TenantChoiceError, TenantEntry, TenantRef,
};
pub use table::{AdmissionError, QuotaTable, TableError, TableOwner, TenantHandle};
