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

/// The latency probe's real-time CPU priority (`chrt -f`), the same in
/// every way it is measured (alone, unprotected, with mtrdma), in the link
/// demo and in the link tests. On the emulated host the NIC is software on
/// the same two CPUs as the tenant processes; at normal priority the probe
/// waits for a CPU for milliseconds (its 500 us sleeps ended 0.8 ms late
/// at the median and 9 ms at p99 next to 8 bulk tenants with mtrdma; 2.3
/// to 3.5 ms at p99 next to two debug-build bulk tenants under a bound), so
/// its p99 measured the CPU scheduler, not the link. A latency-critical
/// service on such a host gets a CPU of its own or a priority; the softirq
/// threads that do rxe's work run at the same priority (see the VM's link
/// setup).
pub const PROBE_PRIORITY: &str = "50";

/// Whether `chrt -f PROBE_PRIORITY` works here (as root, or with
/// `CAP_SYS_NICE`). When it does not, says on stderr, as `who`, that the
/// probe's tail then measures the CPU scheduler as much as the link.
pub fn probe_realtime_works(who: &str) -> bool {
    use std::process::{Command, Stdio};
    let works = Command::new("chrt")
        .args(["-f", PROBE_PRIORITY, "true"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !works {
        eprintln!(
            "{who}: warning: cannot run the latency probe at real-time priority (chrt -f \
             {PROBE_PRIORITY}); its tail then measures the CPU scheduler as much as the link"
        );
    }
    works
}
