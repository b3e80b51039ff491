//! The pager: a page cache of `C` pages in front of a working set of `W`
//! pages that live on memory nodes, paged over RC queue pairs with RDMA
//! READ (page-in) and WRITE (page-out).
//!
//! Pages are placed, cached and moved in clusters of `K` pages
//! (`--cluster`, as swap's page-cluster): cluster `g = p / K` lives on
//! node `g % nodes`, its pages contiguous from slot `(g / nodes) * K`; a
//! cache frame holds one cluster in one buffer of `K` pages; a miss on any
//! page reads its whole cluster with one READ, and a dirty frame is written
//! back with one WRITE of the whole cluster. Versions stay per page: a
//! write bumps its page's version and dirties the frame, a page-out encodes
//! every page of the cluster at its own version, and a page-in checks every
//! page against its own. With `K = 1` a cluster is a page.
//!
//! The workload is `D` faulting workers (as `D` threads of an application
//! would be): each makes uniform random accesses over the working set, a
//! share of them writes; a hit is served from the cache, a miss blocks the
//! worker until its page is in. So up to `D` misses are in flight, which is
//! what lets one pager fill a link.
//!
//! Eviction is the clock (second-chance) algorithm over the `C / K`
//! frames: a frame touched since the hand last passed gets another round;
//! frames whose page-in is still in flight are skipped. A dirty victim is
//! written out (its frame's buffer goes with the WRITE), and the wanted
//! cluster is read into a spare buffer: there are `C / K + D` cluster
//! buffers, so a buffer is free whenever a miss may start (at most
//! `C / K - 1` frames hold one while a frame is being refilled, at most `D`
//! page-outs are in flight).
//!
//! Ordering, and what the code relies on: a cluster whose page-out is in
//! flight is not read back until that WRITE has completed (the worker that
//! wants a page of it waits), so nothing depends on RC executing a READ after an
//! earlier WRITE on the same queue pair (RC does; the scheduled path keeps
//! a queue pair's requests in order too, but a pager that waited for
//! nothing would be relying on both). What it does rely on is that a
//! successful WRITE completion means the responder has the data, so a
//! later READ of the cluster sees it. A page is handed to a worker only
//! once its cluster's READ has completed successfully; a READ that failed, or that comes
//! back from a node already declared lost, is never taken as data.
//!
//! A node is lost when one of its requests completes in error (retries
//! exceeded, flushed) or its TCP connection closes (the node process is
//! gone). Its pages are then all LOST, dropped from the cache too (they
//! could never be written out again), nothing more is posted to it, and
//! later accesses to them are counted, not served; the other nodes' pages
//! go on.

use std::io::{ErrorKind, Read};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use mtrdma::core::{TenantHandle, TrafficClass};
use mtrdma::sched::DelayWindowConfig;
use mtrdma::verbs::exchange::{exchange_within, Handshake};
use mtrdma::verbs::{
    Access, Completion, MemoryRegion, ProtectionDomain, RemoteRegion, ScheduleConfig, SendOp,
};

use crate::cli::{ClientArgs, NodeAddr};
use crate::page::{encode, verify, Rng, PAGE};
use crate::report::Results;
use crate::tenant::tenancy;
use crate::{open_device, HELLO};
use mtrdma::verbs::PollCompletions;
use mtrdma::{admitted_within, Tenant, TenantSource};
use mtrdma_demo::qp::Qp;

/// Local ACK timeout exponent: 4.096 us x 2^14, about 67 ms.
const ACK_TIMEOUT: u8 = 14;
/// Retries after an ACK timeout: a dead node fails a request after
/// (7 + 1) x 67 ms, about half a second.
const RETRY_COUNT: u8 = 7;
/// The longest one sleep on a completion channel lasts.
const WAIT_SLICE: Duration = Duration::from_millis(20);
/// The sleep when other nodes have requests out too: their completions
/// raise no event on this channel.
const SHORT_SLICE: Duration = Duration::from_millis(1);
/// How often the nodes' TCP connections are looked at for end of stream.
const TCP_CHECK: Duration = Duration::from_millis(10);
/// Setup (connecting, greeting, handshake) waits this long for a node.
const SETUP: Duration = Duration::from_secs(30);
/// After the run, requests still out get this long to come back.
const DRAIN: Duration = Duration::from_secs(5);
/// Accesses a worker makes in a row before completions are looked at.
const BURST: usize = 32;
/// Corrupt pages described on stderr (the count goes on).
const SHOW_CORRUPT: u64 = 10;

/// One memory node as the pager sees it.
struct Node {
    addr: NodeAddr,
    /// The setup connection, kept open: its end means the node is gone,
    /// and closing it tells the node the pager is done.
    stream: TcpStream,
    remote: RemoteRegion,
    qp: Qp,
    reads: usize,
    writes: usize,
    /// Why it was declared lost.
    lost: Option<String>,
}

impl Node {
    fn in_flight(&self) -> usize {
        self.reads + self.writes
    }
}

/// Where a cluster is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// On its node only.
    Remote,
    /// In a cache frame.
    Cached(u32),
    /// Being read into a frame.
    Reading(u32),
    /// Being written out; read back only after the WRITE completes.
    WritingOut,
    /// Its node is gone.
    Lost,
}

/// A cache frame: one cluster.
struct Frame {
    cluster: u64,
    /// The cluster's bytes; `None` while its page-in is in flight.
    buf: Option<MemoryRegion>,
    dirty: bool,
    /// Touched since the clock hand last passed.
    referenced: bool,
    /// When its READ was posted, while it is in flight.
    posted: Option<Instant>,
}

/// Outcome of one access.
enum Outcome {
    Done,
    Blocked,
}

/// A completion context: the cluster, and whether it was a WRITE.
fn context(cluster: u64, write: bool) -> u64 {
    (cluster << 1) | u64::from(write)
}

/// The pager's whole state.
struct Pager {
    nodes: Vec<Node>,
    /// Pages per cluster.
    k: u64,
    /// Per page: the version last written (what the node holds once the
    /// page's cluster is clean, and what a page-in must find).
    versions: Vec<u64>,
    /// Per cluster: where it is.
    clusters: Vec<State>,
    frames: Vec<Option<Frame>>,
    empty_frames: Vec<u32>,
    hand: usize,
    free: Vec<MemoryRegion>,
    depth: usize,
    filling: bool,
    r: Results,
    started: Instant,
    first_loss: Option<Instant>,
    out: Vec<Completion>,
}

/// Connects to a node and reads its greeting: its capacity in pages.
fn greet(addr: &NodeAddr) -> Result<(TcpStream, u64), String> {
    let addrs: Vec<SocketAddr> = (addr.host.as_str(), addr.port)
        .to_socket_addrs()
        .map_err(|e| format!("node {addr}: cannot resolve {}: {e}", addr.host))?
        .collect();
    let mut last = None;
    let mut stream = None;
    for a in &addrs {
        match TcpStream::connect_timeout(a, Duration::from_secs(5)) {
            Ok(s) => {
                stream = Some(s);
                break;
            }
            Err(e) => last = Some(e),
        }
    }
    let mut stream = stream.ok_or_else(|| match last {
        Some(e) => {
            format!("cannot connect to node {addr}: {e} (is `remote_memory node` running there?)")
        }
        None => format!("node {addr}: {} resolves to no address", addr.host),
    })?;
    let _ = stream.set_nodelay(true);
    let _ = stream.set_read_timeout(Some(SETUP));
    // One line, a byte at a time, so the handshake that follows is left
    // on the stream.
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    loop {
        match stream.read(&mut byte) {
            Ok(0) => {
                return Err(format!(
                "node {addr} closed the connection before greeting (is it a remote_memory node?)"
            ))
            }
            Ok(_) if byte[0] == b'\n' => break,
            Ok(_) if line.len() < 256 => line.push(byte[0]),
            Ok(_) => return Err(format!("node {addr}: its greeting is too long")),
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(format!("node {addr}: reading its greeting: {e}")),
        }
    }
    let line = String::from_utf8_lossy(&line).into_owned();
    let capacity = line
        .strip_prefix(HELLO)
        .and_then(|rest| rest.trim().strip_prefix("pages "))
        .and_then(|n| n.trim().parse::<u64>().ok())
        .ok_or_else(|| {
            format!("node {addr} greeted with {line:?}, not as a remote_memory node ({HELLO})")
        })?;
    Ok((stream, capacity))
}

/// Where page `page` lives with clusters of `k` pages over `n` nodes:
/// (node, slot). Cluster `g = page / k` is on node `g % n`, its pages
/// contiguous from slot `(g / n) * k`; with `k = 1`, page p is on node
/// p % n at slot p / n.
pub(crate) fn place(page: u64, k: u64, n: u64) -> (u64, u64) {
    let g = page / k;
    (g % n, (g / n) * k + page % k)
}

/// Pages of a working set of `w` pages (a multiple of `k`) that node `i`
/// of `n` holds: its share of the `w / k` clusters, `k` pages each.
pub(crate) fn pages_on(w: u64, k: u64, n: u64, i: u64) -> u64 {
    let clusters = w / k;
    if clusters > i {
        (clusters - i).div_ceil(n) * k
    } else {
        0
    }
}

/// Refuses a working set the nodes cannot hold (clusters of `k` pages).
pub(crate) fn check_capacity(w: u64, k: u64, nodes: &[(NodeAddr, u64)]) -> Result<(), String> {
    let n = nodes.len() as u64;
    let total: u64 = nodes.iter().map(|(_, c)| c).sum();
    for (i, (addr, cap)) in nodes.iter().enumerate() {
        let need = pages_on(w, k, n, i as u64);
        if need > *cap {
            return Err(format!(
                "the working set of {w} pages needs {need} pages on node {addr}, which lends \
                 only {cap} ({total} on all {n} node(s)); give a smaller --working-set, \
                 larger nodes (--pages) or more nodes"
            ));
        }
    }
    Ok(())
}

/// Runs the pager; returns its results (the caller decides the exit
/// status from the corrupt count).
pub(crate) fn run(a: &ClientArgs) -> Result<Results, String> {
    // The nodes first: a working set they cannot hold is refused before
    // the device is opened.
    let mut greeted = Vec::new();
    for addr in &a.nodes {
        let (stream, capacity) = greet(addr)?;
        greeted.push((addr.clone(), stream, capacity));
    }
    let caps: Vec<(NodeAddr, u64)> = greeted.iter().map(|(a, _, c)| (a.clone(), *c)).collect();
    check_capacity(a.working_set, a.cluster, &caps)?;

    let ctx = open_device(a.device.as_deref())?;
    let pd = ctx
        .alloc_pd()
        .map_err(|e| format!("allocating a protection domain on {}: {e}", ctx.name()))?;
    let tenant = a
        .coordinator
        .as_deref()
        .map(|socket| Tenant::join(&TenantSource::coordinator(socket)).map(Tenant::into_handle))
        .transpose()
        .map_err(|e| e.to_string())?;
    let depth = a.depth as usize;
    let k = a.cluster;
    let n_frames = a.cache / k;
    let cluster_bytes = usize::try_from(k)
        .ok()
        .and_then(|k| k.checked_mul(PAGE))
        .ok_or_else(|| format!("clusters of {k} pages do not fit in memory"))?;
    let n_bufs = usize::try_from(n_frames)
        .ok()
        .and_then(|f| f.checked_add(depth))
        .ok_or_else(|| format!("{n_frames} frames do not fit in memory"))?;
    let bufs = allocate(&pd, tenant.as_ref(), n_bufs, cluster_bytes)?;
    // Page-ins and page-outs of a node: at most `depth` of each.
    let sq = u32::try_from(2 * depth + 2).unwrap_or(u32::MAX).max(16);

    println!(
        "remote_memory client: path {}, device {}, {} node(s) ({}), working set {} pages \
         ({:.1} MiB), cache {} pages, cluster {} pages, depth {}, write share {:.2}, {:.1} s, seed {}{}",
        a.path.name(),
        ctx.name(),
        a.nodes.len(),
        a.nodes
            .iter()
            .map(|n| n.to_string())
            .collect::<Vec<_>>()
            .join(", "),
        a.working_set,
        a.working_set as f64 * PAGE as f64 / 1_048_576.0,
        a.cache,
        a.cluster,
        a.depth,
        a.write_share,
        a.duration.as_secs_f64(),
        a.seed,
        if a.spin { ", spinning" } else { "" },
    );
    if let Some(t) = &tenant {
        println!(
            "tenant: {} (id {}, {:?} class, from the coordinator)",
            t.name(),
            t.tenant().0,
            t.class()
        );
    }

    let mut nodes = Vec::new();
    for (addr, mut stream, capacity) in greeted {
        let prepared = admitted_within(Duration::from_secs(10), || {
            let mut b = pd
                .queue_pair()
                .max_send_wr(sq)
                .max_recv_wr(1)
                .ack_timeout(ACK_TIMEOUT)
                .retry_count(RETRY_COUNT)
                .completion_events(!a.spin);
            if let Some(t) = &tenant {
                b = b.tenant(t);
            }
            b.build()
        })
        .map_err(|e| format!("creating the queue pair to node {addr}: {e}"))?;
        let peer = exchange_within(
            &mut stream,
            &Handshake {
                endpoint: prepared.endpoint(),
                regions: Vec::new(),
            },
            SETUP,
        )
        .map_err(|e| format!("node {addr}: exchanging endpoints: {e}"))?;
        let remote = peer
            .regions
            .first()
            .copied()
            .filter(|r| r.len >= capacity.saturating_mul(PAGE as u64))
            .ok_or_else(|| {
                format!("node {addr} offers no region of the {capacity} pages it greeted with")
            })?;
        let qp = prepared
            .connect(&peer.endpoint)
            .map_err(|e| format!("connecting to node {addr}: {e}"))?;
        let qp = Qp::on_path(qp, a.path, || ScheduleConfig {
            chunk_bytes: a.chunk,
            max_pieces_in_flight: a.pieces,
            tenant: tenancy(tenant.as_ref(), TrafficClass::Bulk),
            window: Some(std::sync::Arc::new(DelayWindowConfig::for_piece(a.chunk))),
        })
        .map_err(|e| format!("setting up the scheduled path to node {addr}: {e}"))?;
        stream
            .set_nonblocking(true)
            .map_err(|e| format!("node {addr}: connection: {e}"))?;
        nodes.push(Node {
            addr,
            stream,
            remote,
            qp,
            reads: 0,
            writes: 0,
            lost: None,
        });
    }

    let mut pager = Pager {
        nodes,
        k,
        versions: vec![1; a.working_set as usize],
        clusters: vec![State::Remote; (a.working_set / k) as usize],
        frames: (0..n_frames).map(|_| None).collect(),
        empty_frames: (0..n_frames as u32).rev().collect(),
        hand: 0,
        free: bufs,
        depth,
        filling: true,
        r: Results::new(a),
        started: Instant::now(),
        first_loss: None,
        out: Vec::new(),
    };
    let fill_start = Instant::now();
    pager.fill(a.spin)?;
    println!(
        "initial fill: {} pages written (version 1) in {:.0} ms",
        pager.r.filled,
        fill_start.elapsed().as_secs_f64() * 1e3
    );
    pager.filling = false;
    pager.timed(a)?;
    // Closing the connections tells the nodes the pager is done.
    for n in &pager.nodes {
        let _ = n.stream.shutdown(std::net::Shutdown::Both);
    }
    Ok(pager.r)
}

/// `count` buffers of `size` bytes (one cluster each), pieces of one
/// registration (for the tenant, if there is one).
fn allocate(
    pd: &ProtectionDomain,
    tenant: Option<&TenantHandle>,
    count: usize,
    size: usize,
) -> Result<Vec<MemoryRegion>, String> {
    let total = count
        .checked_mul(size)
        .ok_or_else(|| format!("{count} cluster buffers do not fit in memory"))?;
    let region = admitted_within(Duration::from_secs(30), || match tenant {
        Some(t) => pd.register_for(t, vec![0u8; total], Access::LOCAL),
        None => pd.allocate(total, Access::LOCAL),
    })
    .map_err(|e| format!("registering the page cache ({total} bytes): {e}"))?;
    region
        .into_pieces(size)
        .map_err(|e| format!("splitting the page cache into clusters: {e}"))
}

mod engine;
#[cfg(test)]
mod tests;
