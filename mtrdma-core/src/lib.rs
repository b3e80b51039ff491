//! Tenants, policies and everything of mtrdma that crosses a process boundary.
//!
//! This crate holds the types every other mtrdma crate speaks in: who a
//! tenant is ([`TenantId`]) and which traffic class a work request belongs to
//! ([`TrafficClass`]).

mod tenant;

pub use tenant::{TenantId, TrafficClass};
