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
#![doc(test(attr(deny(unused_imports))))]
#![doc = include_str!("../docs/using-from-rust.md")]

#[doc(inline)]
pub use mtrdma_core as core;
#[doc(inline)]
pub use mtrdma_sched as sched;
#[doc(inline)]
pub use mtrdma_verbs as verbs;

mod error;

pub use error::Error;
pub use mtrdma_core::tenant::{admitted_within, JoinError, RateLimited, Tenant, TenantSource};
pub use mtrdma_sched::{TenantId, TrafficClass};
pub use mtrdma_verbs::Context;

/// The book's pages (`docs/`, an mdBook), so that their Rust snippets are
/// compiled (and, unless marked `no_run`, run) as this crate's doctests.
#[cfg(doctest)]
mod book {
    macro_rules! pages {
        ($($name:ident = $path:literal;)*) => {
            $(
                #[doc = include_str!(concat!("../docs/", $path))]
                struct $name;
            )*
        };
    }
    pages! {
        Introduction = "introduction.md";
        Using = "using.md";
        Protection = "protection.md";
        Preload = "preload.md";
        Coordinator = "coordinator.md";
        Applications = "applications.md";
        Kubernetes = "kubernetes.md";
        Cluster = "cluster.md";
        Architecture = "architecture.md";
        Security = "security.md";
        Monitor = "monitor.md";
        DelayWindow = "delay-window.md";
        Layout = "layout.md";
        Commands = "commands.md";
        SoftRoce = "softroce-vm.md";
        Fuzzing = "fuzzing.md";
        Results = "results.md";
        Simulator = "results/simulator.md";
        Benchmarks = "results/benchmarks.md";
        LinkProtection = "results/link-protection.md";
        Weights = "results/weights.md";
        Demo = "results/demo.md";
        ApplicationResults = "results/applications.md";
        LoopbackDemo = "results/loopback-demo.md";
        PostPath = "results/post-path.md";
        Lists = "results/lists.md";
        DeviceCriterion = "results/device-criterion.md";
    }
}

/// The traits whose methods a program calls: `use mtrdma::prelude::*;`.
pub mod prelude {
    pub use mtrdma_verbs::PollCompletions;
}
