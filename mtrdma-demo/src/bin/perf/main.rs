//! perftest-style bandwidth and latency tools on mtrdma, to compare with
//! `ib_write_bw`, `ib_write_lat` and friends directly.
//!
//! One binary runs six tests over one reliable-connected queue pair:
//! `write_bw`, `read_bw`, `send_bw` (keep `--tx-depth` requests
//! outstanding, report bandwidth and message rate) and `write_lat`,
//! `read_lat`, `send_lat` (one request at a time, report latency
//! percentiles). Sends go either through mtrdma's scheduled path
//! ([`ScheduledQueuePair`], `--path mtrdma`, the default) or straight to
//! [`QueuePair::post_send`] (`--path raw`), so the scheduler's overhead can
//! be measured against the plain verbs path on the same machine.
//!
//! ```text
//! # server, then client (like ib_write_bw / ib_write_bw HOST)
//! perf --server --test write_bw -s 65536
//! perf --connect HOST --test write_bw -s 65536 -n 1000
//!
//! # both sides in one process, over 127.0.0.1
//! perf --loopback --test write_lat -s 16 -n 2000
//! perf --loopback --test write_lat -s 16 -n 2000 --path raw
//!
//! # sweep 2 B .. 8 MiB, append every line to a CSV file
//! perf --loopback --test write_bw -a -n 200 --csv results.csv
//!
//! # as a tenant of a policy file, or with a byte-rate cap of 10 MB/sec
//! perf --loopback --test write_bw -s 65536 --policy examples/policy.toml --tenant backup
//! perf --loopback --test write_bw -s 65536 --cap-mbps 10
//!
//! # in the SoftRoCE VM
//! cargo build --release -p mtrdma-demo --bin perf
//! cargo xtask vm -- target/release/perf --loopback --test write_lat -s 16
//! ```
//!
//! Units are perftest's: BW in MB/sec with MB = 2^20 bytes (perftest's
//! default `MBS` report format), message rate in millions of messages per
//! second, latency in microseconds. Latencies of `write_lat` and `send_lat`
//! are ping-pong round trips halved; `read_lat` reports the time from
//! posting a READ to its completion. As in perftest, the two largest latency
//! samples are dropped before the statistics, and `t_typical` is the median.
//! After each bandwidth size the client prints what its process used of the
//! CPU over the run (from `/proc/self`): user and system time per work
//! request posted (a piece of the scheduler's chunk, or a message on the
//! plain path), and per request its sleeps, preemptions and system calls.
//! On a software NIC every post is a system call and the NIC's work is the
//! host's, so this is what decides how much of a link small pieces fill.
//!
//! The client sends the test parameters to the server over the TCP control
//! connection; a server given explicit flags refuses a client that asks for
//! something else. Endpoints and remote regions are swapped with
//! [`mtrdma::verbs::exchange`] on a second, short-lived TCP connection per
//! message size (a fresh queue pair for every size, so receives posted for
//! one size never meet the next).

mod cli;
mod conn;
mod ctrl;
mod measure;
mod params;
mod report;
mod tenant;

use std::fmt::Write as _;
use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use mtrdma::core::{
    LinkConfig, Policy, QuotaTable, RateLimit, TenantEntry, TenantHandle, TenantId, TrafficClass,
};
use mtrdma::sched::{DelayWindowConfig, Nanos};
use mtrdma::verbs::exchange::{exchange, Handshake};
use mtrdma::verbs::{
    Access, Completion, Context, Endpoint, Gid, GidSelection, MemoryRegion, PreparedQueuePair,
    ProtectionDomain, RemoteRegion, ScheduleConfig, SendOp,
};
use mtrdma::{admitted_within, Tenant, TenantSource};
use mtrdma_demo::qp::{PathKind, Qp};
use mtrdma_demo::tenant::tenancy;
use mtrdma_demo::{args, open_device};

use cli::*;
use conn::*;
use ctrl::*;
use measure::*;
use params::*;
use report::*;
use tenant::*;

const DEFAULT_PORT: u16 = 18516;
const MIB: f64 = 1_048_576.0;
const PROTOCOL: &str = "mtrdma-perf/1";
/// perftest's inline size for WRITE and SEND latency tests.
const DEFAULT_INLINE: u32 = 220;
/// Control messages wait this long for the peer (setup, not the test itself).
const SETUP_TIMEOUT: Duration = Duration::from_secs(60);
/// A client with requests in flight and no completion for this long gives up.
const STALL: Duration = Duration::from_secs(60);
/// Receives each side keeps posted in send_lat.
const LAT_RECVS: usize = 4;
/// Receives the server keeps posted in send_bw (perftest's rx-depth).
const BW_RECVS: usize = 512;
/// The longest one sleep on the completion channel lasts (`--wait`), so the
/// control connection and deadlines are still looked at.
const WAIT_SLICE: Duration = Duration::from_millis(20);
/// Completion contexts.
const SEND_CTX: u64 = 0;
const RECV_CTX: u64 = 1;

// ---------------------------------------------------------------------------
// Client and server
// ---------------------------------------------------------------------------

fn connect_tcp(host: &str, port: u16) -> Result<TcpStream, String> {
    let addrs: Vec<SocketAddr> = (host, port)
        .to_socket_addrs()
        .map_err(|e| format!("cannot resolve {host}: {e}"))?
        .collect();
    let mut last = None;
    for addr in &addrs {
        match TcpStream::connect_timeout(addr, Duration::from_secs(5)) {
            Ok(s) => {
                let _ = s.set_nodelay(true);
                return Ok(s);
            }
            Err(e) => last = Some(e),
        }
    }
    Err(match last {
        Some(e) => {
            format!("cannot connect to {host}:{port}: {e} (is `perf --server` running there?)")
        }
        None => format!("{host} resolves to no address"),
    })
}

fn client(a: &Args, host: &str, port: u16) -> Result<(), String> {
    let p = Params::from_args(a);
    let side = Side::open(a, p.chunk, true)?;
    let peer = format!("the server at {host}:{port}");
    let mut ctrl = Ctrl::new(connect_tcp(host, port)?, peer);
    ctrl.send(&p.encode())?;
    ctrl.expect("OK", Some(SETUP_TIMEOUT))?;
    let tenant_name = side
        .tenant
        .as_ref()
        .map(|(t, _)| t.name())
        .unwrap_or_default();
    let limited = p
        .sizes
        .iter()
        .map(|&s| (s, side.outstanding(&p, s)))
        .find(|&(_, n)| p.test.is_bw() && n < p.tx_depth as usize);
    for (k, &size) in p.sizes.iter().enumerate() {
        ctrl.send(&format!("SIZE {size}"))?;
        let mut hs = connect_tcp(host, port)?;
        let _ = hs.set_read_timeout(Some(SETUP_TIMEOUT));
        let mut conn = match side.connect(&p, size, &mut hs) {
            Ok(c) => c,
            Err(e) => {
                let _ = ctrl.send(&format!("ERR client: {e}"));
                return Err(e);
            }
        };
        drop(hs);
        ctrl.expect("READY", Some(SETUP_TIMEOUT))?;
        if k == 0 {
            print_header(&side, &p, &conn, limited);
        }
        let cpu_before = CpuUse::now();
        let run = if p.test.is_bw() {
            client_bw(&mut conn, &p).map(|r| r.map(Outcome::Bw))
        } else {
            let factor = if matches!(p.test, Test::ReadLat | Test::WriteCompLat) {
                1.0
            } else {
                2.0
            };
            client_lat(&mut conn, &p, &mut ctrl, a.interval).and_then(|s| {
                if let Some(path) = &a.samples {
                    write_samples(path, size, &s, factor)?;
                }
                Ok(lat_result(size, s, factor).map(Outcome::Lat))
            })
        };
        let outcome = match run {
            Ok(o) => o,
            Err(e) => {
                let e = with_peer_error(&mut ctrl, format!("{size} B: {e}"));
                let _ = ctrl.send(&format!("ERR client: {e}"));
                return Err(e);
            }
        };
        let cpu_after = CpuUse::now();
        ctrl.send("DONE")?;
        ctrl.expect("FIN", Some(SETUP_TIMEOUT))?;
        let pieces_per_message = match &conn.qp {
            Qp::Sched(_) => (size as u64).div_ceil(p.chunk.max(1)).max(1),
            Qp::Raw(_) => 1,
        };
        let window = match &conn.qp {
            Qp::Sched(q) => q.window(),
            Qp::Raw(_) => None,
        };
        let sampled = conn.window_samples.summary();
        drop(conn);
        let Some(outcome) = outcome else {
            println!(" {size:<10} (no iteration completed)");
            continue;
        };
        print_outcome(&outcome);
        if let Some(w) = window {
            let us = |d: Option<mtrdma::sched::Nanos>| {
                d.map_or_else(|| "-".to_string(), |d| format!("{:.1}", d.0 as f64 / 1e3))
            };
            println!(
                " window at the end: {} B (path delay {} us, smoothed {} us, target {} us)",
                w.window_bytes,
                us(w.base_delay),
                us(w.smoothed_delay),
                us(w.target_delay)
            );
        }
        if let Some(line) = sampled {
            println!("{line}");
        }
        if let (Outcome::Bw(bw), Some(a), Some(b)) = (&outcome, cpu_before, cpu_after) {
            println!("{}", CpuUse::line(a, b, bw.iters * pieces_per_message));
        }
        if let Some(csv) = &a.csv {
            append_csv(csv, &csv_line(&p, side.ctx.name(), &tenant_name, &outcome))?;
        }
    }
    println!("{LINE}");
    Ok(())
}

/// Accepts a connection from `from` within `timeout`.
fn accept_from(
    listener: &TcpListener,
    from: IpAddr,
    timeout: Duration,
) -> Result<TcpStream, String> {
    listener
        .set_nonblocking(true)
        .map_err(|e| format!("listening socket: {e}"))?;
    let deadline = Instant::now() + timeout;
    loop {
        match listener.accept() {
            Ok((s, addr)) if addr.ip() == from => {
                s.set_nonblocking(false)
                    .map_err(|e| format!("accepted socket: {e}"))?;
                let _ = s.set_nodelay(true);
                return Ok(s);
            }
            Ok(_) => {} // someone else: not our client
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    return Err(format!(
                        "the client did not open its handshake connection within {timeout:?}"
                    ));
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(e) => return Err(format!("accepting a connection: {e}")),
        }
    }
}

fn server(a: &Args, listener: TcpListener, quiet: bool) -> Result<(), String> {
    let local = listener
        .local_addr()
        .map_err(|e| format!("listening socket: {e}"))?;
    if !quiet {
        println!("{LINE}");
        println!(
            " perf server: waiting for a client on port {}",
            local.port()
        );
        println!("{LINE}");
    }
    let (stream, addr) = listener
        .accept()
        .map_err(|e| format!("accepting the client: {e}"))?;
    let mut ctrl = Ctrl::new(stream, format!("the client at {addr}"));
    let line = ctrl.recv(Some(SETUP_TIMEOUT)).map_err(|e| {
        format!("{e}, before sending its test parameters (is it an mtrdma perf client?)")
    })?;
    let p = match Params::decode(&line).and_then(|p| Params::agree(a, p)) {
        Ok(p) => p,
        Err(e) => {
            let _ = ctrl.send(&format!("ERR server: {e}"));
            return Err(e);
        }
    };
    let side = match Side::open(a, p.chunk, false) {
        Ok(s) => s,
        Err(e) => {
            let _ = ctrl.send(&format!("ERR server: {e}"));
            return Err(e);
        }
    };
    ctrl.send("OK")?;
    if !quiet {
        println!(
            " client {addr}: {} on {} path, {} size(s), device {}",
            p.test.name(),
            p.path.name(),
            p.sizes.len(),
            side.ctx.name()
        );
        if let Some((_, desc)) = &side.tenant {
            println!(" tenant: {desc}");
        }
    }
    for &size in &p.sizes {
        let line = ctrl.expect("SIZE", None)?;
        if line != format!("SIZE {size}") {
            let e = format!("protocol error: expected SIZE {size}, got {line:?}");
            let _ = ctrl.send(&format!("ERR server: {e}"));
            return Err(e);
        }
        let result = (|| -> Result<Conn, String> {
            let mut hs = accept_from(&listener, addr.ip(), SETUP_TIMEOUT)?;
            let _ = hs.set_read_timeout(Some(SETUP_TIMEOUT));
            side.connect(&p, size, &mut hs)
        })();
        let mut conn = match result {
            Ok(c) => c,
            Err(e) => {
                let e = format!("{size} B: {e}");
                let _ = ctrl.send(&format!("ERR server: {e}"));
                return Err(e);
            }
        };
        ctrl.send("READY")?;
        let run = match p.test {
            Test::WriteBw | Test::ReadBw | Test::ReadLat | Test::WriteCompLat | Test::AtomicBw => {
                ctrl.expect("DONE", None).map(|_| ())
            }
            Test::SendBw => server_recv(&mut conn, p.test, &mut ctrl),
            Test::WriteLat | Test::SendLat => server_pong(&mut conn, p.test, &mut ctrl),
        };
        if let Err(e) = run {
            let e = format!("{size} B: {e}");
            let _ = ctrl.send(&format!("ERR server: {e}"));
            return Err(e);
        }
        drop(conn);
        ctrl.send("FIN")?;
    }
    if !quiet {
        println!(" done: {} size(s) served", p.sizes.len());
        println!("{LINE}");
    }
    Ok(())
}

fn loopback(a: &Args) -> Result<(), String> {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, a.port.unwrap_or(0)))
        .map_err(|e| format!("listening on 127.0.0.1: {e}"))?;
    let port = listener
        .local_addr()
        .map_err(|e| format!("listening socket: {e}"))?
        .port();
    // The server side takes the client's parameters, as a server started
    // without flags would; it uses the same device and tenant flags.
    let server_args = Args {
        device: a.device.clone(),
        policy: a.policy.clone(),
        tenant: a.tenant.clone(),
        cap_mbps: a.cap_mbps,
        pool_mib: a.pool_mib,
        mode: Some(Mode::Server),
        ..Args::default()
    };
    let server = std::thread::Builder::new()
        .name("perf-server".into())
        .spawn(move || server(&server_args, listener, true))
        .map_err(|e| format!("starting the server thread: {e}"))?;
    // A failed client returns at once: the server thread may be blocked
    // waiting for it, and ends with the process.
    client(a, "127.0.0.1", port)?;
    server
        .join()
        .unwrap_or_else(|_| Err("the server thread panicked".into()))
        .map_err(|e| format!("server side: {e}"))
}

fn run() -> Result<(), String> {
    let a = match parse_args(std::env::args().skip(1))? {
        Parsed::Help => {
            print!("{HELP}");
            return Ok(());
        }
        Parsed::Run(a) => a,
    };
    let port = a.port.unwrap_or(DEFAULT_PORT);
    match a.mode.clone() {
        Some(Mode::Server) => {
            let listener = TcpListener::bind((Ipv4Addr::UNSPECIFIED, port))
                .map_err(|e| format!("listening on port {port}: {e}"))?;
            server(&a, listener, false)
        }
        Some(Mode::Client(host)) => client(&a, &host, port),
        Some(Mode::Loopback) => loopback(&a),
        None => Err("choose a mode (see --help)".into()),
    }
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("perf: error: {e}");
            ExitCode::FAILURE
        }
    }
}
