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

/// The ports the harnesses' servers listen on: below the kernel's range of
/// ephemeral ports (`net.ipv4.ip_local_port_range`, 32768 and up by
/// default), from which every outgoing TCP connection (etcd's clients,
/// perf's clients, the registry's) takes its local port. A server told a
/// port in that range can find it held by such a connection and fail to
/// bind it.
pub const SERVER_PORTS: std::ops::Range<u16> = 20_000..32_000;

/// The first port of [`SERVER_PORTS`] after `after` (wrapping to its
/// start) that no TCP socket of this host holds, in any state (by
/// `/proc/net/tcp` and `tcp6`).
pub fn next_free_port(after: u16) -> u16 {
    let held = held_ports();
    let span = SERVER_PORTS.end - SERVER_PORTS.start;
    let from = after.saturating_sub(SERVER_PORTS.start) % span;
    (1..=span)
        .map(|i| SERVER_PORTS.start + (from + i) % span)
        .find(|p| !held.contains(p))
        .unwrap_or(SERVER_PORTS.start + (from + 1) % span)
}

/// The local ports of this host's TCP sockets, in any state.
fn held_ports() -> std::collections::HashSet<u16> {
    ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|f| std::fs::read_to_string(f).ok())
        .flat_map(|table| {
            table
                .lines()
                .skip(1)
                .filter_map(local_port)
                .collect::<Vec<_>>()
        })
        .collect()
}

/// The local port of a line of `/proc/net/tcp` (`  0: 0100007F:4E20 ...`).
fn local_port(line: &str) -> Option<u16> {
    let local = line.split_whitespace().nth(1)?;
    u16::from_str_radix(local.rsplit(':').next()?, 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_ports_stay_below_the_ephemeral_range_and_skip_held_ones() {
        // Below this host's ephemeral ports.
        let low = mtrdma::core::cluster::etcd::first_ephemeral_port();
        assert!(SERVER_PORTS.end <= low, "ephemeral ports from {low}");
        assert_eq!(
            local_port("   0: 0100007F:4E21 00000000:0000 0A 00000000:00000000"),
            Some(0x4E21)
        );
        assert_eq!(local_port("  sl  local_address rem_address"), None);
        // Held here: a listener's port is passed over.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let held = listener.local_addr().unwrap().port();
        if SERVER_PORTS.contains(&held) {
            assert_ne!(next_free_port(held - 1), held);
        }
        // Within the range, wrapping at its end, from anywhere.
        for after in [0, 20_000, 25_000, 31_999, 40_000, u16::MAX] {
            let p = next_free_port(after);
            assert!(SERVER_PORTS.contains(&p), "{after} -> {p}");
        }
        assert!(
            next_free_port(31_999) - SERVER_PORTS.start < 100,
            "wraps to the start"
        );
        drop(listener);
    }
}
