//! mtrdma: multi-tenant RDMA performance isolation.
//!
//! Applications use mtrdma's safe verbs API instead of raw verbs. Every
//! `post_send` goes through a per-tenant scheduler and every queue pair
//! creation or memory registration is checked against the tenant's quota.
//!
//! This facade re-exports the member crates:
//! - [`verbs`]: safe verbs (devices, ports, GIDs, and the scheduled data path);
//! - [`sched`]: the pure scheduling algorithms and the types every crate
//!   speaks in (tenant ids, traffic classes, rate limits);
//! - [`core`]: tenants, policies, and the shared-memory quota table.
//!
//! # Example
//!
#![doc = include_str!("../docs/using-from-rust.md")]

#[doc(inline)]
pub use mtrdma_core as core;
#[doc(inline)]
pub use mtrdma_sched as sched;
#[doc(inline)]
pub use mtrdma_verbs as verbs;

pub use mtrdma_sched::{TenantId, TrafficClass};
pub use mtrdma_verbs::{Context, Error};
