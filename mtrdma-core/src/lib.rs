//! Tenants, policies and everything of mtrdma that crosses a process boundary.
//!
//! This crate holds the types every other mtrdma crate speaks in: who a
//! tenant is ([`TenantId`]) and which traffic class a work request belongs to
//! ([`TrafficClass`]).

pub mod clock;
pub mod coordinator;
mod fairshare;
mod gcra;
mod link_observer;
pub mod policy;
pub mod procinfo;
pub mod table;
mod tenant;

pub use fairshare::{weighted_max_min, Demand};
pub use gcra::{gcra_decide, gcra_shared, EmissionInterval};
pub use policy::{
    LinkConfig, MatchRule, PeerCredentials, Policy, PolicyError, RateCap, TenantPolicy, TenantRef,
};
pub use table::{AdmissionError, QuotaTable, TableError, TenantHandle};
pub use tenant::{TenantId, TrafficClass};
