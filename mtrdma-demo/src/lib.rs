//! What mtrdma's demo and measurement harnesses share: the `isolation`
//! demo, `perf` (perftest's measurements, through mtrdma or straight on
//! the verbs) and `remote_memory` (a pager on remote memory nodes), the
//! binaries of this package. Not published: these programs measure and
//! show mtrdma; `examples/` shows how to use it.

// Shared with the examples that read a command line or run as tenants
// (each of them includes the file as a module of its own).
#[path = "../../examples/shared/args.rs"]
pub mod args;
#[path = "../../examples/shared/lane.rs"]
pub mod lane;
pub mod qp;
#[path = "../../examples/shared/tenant.rs"]
pub mod tenant;

/// The RDMA device `name`, or without a name the first active one.
pub fn open_device(name: Option<&str>) -> Result<mtrdma::verbs::Context, String> {
    use mtrdma::verbs::Context;
    match name {
        Some(n) => Context::open(n),
        None => Context::open_first_active(),
    }
    .map_err(|e| format!("opening the RDMA device: {e}"))
}
