//! The pager: a page cache of `C` frames in front of a working set of `W`
//! pages that live on memory nodes, paged over RC queue pairs with RDMA
//! READ (page-in) and WRITE (page-out).
//!
//! The workload is `D` faulting workers (as `D` threads of an application
//! would be): each makes uniform random accesses over the working set, a
//! share of them writes; a hit is served from the cache, a miss blocks the
//! worker until its page is in. So up to `D` misses are in flight, which is
//! what lets one pager fill a link.
//!
//! Eviction is the clock (second-chance) algorithm over the `C` frames: a
//! frame touched since the hand last passed gets another round; frames
//! whose page-in is still in flight are skipped. A dirty victim is written
//! out (its frame's buffer goes with the WRITE), and the wanted page is read
//! into a spare buffer: there are `C + D` page buffers, so a buffer is free
//! whenever a miss may start (at most `C - 1` frames hold one while a frame
//! is being refilled, at most `D` page-outs are in flight).
//!
//! Ordering, and what the code relies on: a page whose page-out is in
//! flight is not read back until that WRITE has completed (the worker that
//! wants it waits), so nothing depends on RC executing a READ after an
//! earlier WRITE on the same queue pair (RC does; the scheduled path keeps
//! a queue pair's requests in order too, but a pager that waited for
//! nothing would be relying on both). What it does rely on is that a
//! successful WRITE completion means the responder has the data, so a
//! later READ of the page sees it. A page is handed to a worker only once
//! its READ has completed successfully; a READ that failed, or that comes
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

use mtrdma::core::coordinator::register;
use mtrdma::core::{AdmissionError, TenantHandle, TenantId, TrafficClass};
use mtrdma::sched::DelayWindowConfig;
use mtrdma::verbs::exchange::{exchange_within, Handshake};
use mtrdma::verbs::{
    Access, Completion, MemoryRegion, PostError, ProtectionDomain, QueuePair, RemoteRegion,
    ScheduleConfig, ScheduledQueuePair, SendOp, Tenancy,
};

use crate::cli::{ClientArgs, NodeAddr, PathKind};
use crate::page::{encode, verify, Rng, PAGE};
use crate::report::Results;
use crate::{open_device, HELLO};

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

/// A queue pair the pager posts on: straight, or through the scheduler.
enum Qp {
    Raw(QueuePair),
    Sched(Box<ScheduledQueuePair>),
}

impl Qp {
    fn post(&mut self, op: SendOp, region: MemoryRegion, context: u64) -> Result<(), PostError> {
        match self {
            Qp::Raw(q) => q.post_send(op, region, 0..PAGE, context),
            Qp::Sched(q) => q.post_send(op, region, 0..PAGE, context),
        }
    }

    fn poll(&mut self, out: &mut Vec<Completion>) -> Result<usize, mtrdma::Error> {
        match self {
            Qp::Raw(q) => q.poll(out),
            Qp::Sched(q) => q.poll(out),
        }
    }

    fn poll_wait(
        &mut self,
        out: &mut Vec<Completion>,
        timeout: Duration,
    ) -> Result<usize, mtrdma::Error> {
        match self {
            Qp::Raw(q) => q.poll_wait(out, timeout),
            Qp::Sched(q) => q.poll_wait(out, timeout),
        }
    }
}

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

/// Where a page is.
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

#[derive(Debug, Clone, Copy)]
struct PageEntry {
    /// The version last written (what the node holds once the page is
    /// clean, and what a page-in must find).
    version: u64,
    state: State,
}

/// A cache frame.
struct Frame {
    page: u64,
    /// The page's bytes; `None` while its page-in is in flight.
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

/// A completion context: the page, and whether it was a WRITE.
fn context(page: u64, write: bool) -> u64 {
    (page << 1) | u64::from(write)
}

/// The pager's whole state.
struct Pager {
    nodes: Vec<Node>,
    pages: Vec<PageEntry>,
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

/// Pages of a working set of `w` pages that node `i` of `n` holds.
pub(crate) fn pages_on(w: u64, n: u64, i: u64) -> u64 {
    if w > i {
        (w - i).div_ceil(n)
    } else {
        0
    }
}

/// Refuses a working set the nodes cannot hold.
pub(crate) fn check_capacity(w: u64, nodes: &[(NodeAddr, u64)]) -> Result<(), String> {
    let n = nodes.len() as u64;
    let total: u64 = nodes.iter().map(|(_, c)| c).sum();
    for (i, (addr, cap)) in nodes.iter().enumerate() {
        let need = pages_on(w, n, i as u64);
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

/// What `create` gives, waiting out the tenant's control-path rate limit
/// for up to `patience`.
fn admitted<T>(
    patience: Duration,
    mut create: impl FnMut() -> Result<T, mtrdma::Error>,
) -> Result<T, mtrdma::Error> {
    let deadline = Instant::now() + patience;
    loop {
        match create() {
            Err(mtrdma::Error::Admission(AdmissionError::RateLimited {
                retry_after_ns, ..
            })) if Instant::now() < deadline => std::thread::sleep(Duration::from_nanos(
                retry_after_ns.clamp(1_000_000, 1_000_000_000),
            )),
            other => return other,
        }
    }
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
    check_capacity(a.working_set, &caps)?;

    let ctx = open_device(a.device.as_deref())?;
    let pd = ctx
        .alloc_pd()
        .map_err(|e| format!("allocating a protection domain on {}: {e}", ctx.name()))?;
    let tenant = match &a.coordinator {
        Some(socket) => Some(register(socket).map_err(|e| {
            format!(
                "registering with the coordinator at {}: {e}",
                socket.display()
            )
        })?),
        None => None,
    };
    let depth = a.depth as usize;
    let n_bufs = a.cache as usize + depth;
    let bufs = allocate(&pd, tenant.as_ref(), n_bufs)?;
    // Page-ins and page-outs of a node: at most `depth` of each.
    let sq = u32::try_from(2 * depth + 2).unwrap_or(u32::MAX).max(16);

    println!(
        "remote_memory client: path {}, device {}, {} node(s) ({}), working set {} pages \
         ({:.1} MiB), cache {} pages, depth {}, write share {:.2}, {:.1} s, seed {}{}",
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
        let prepared = admitted(Duration::from_secs(10), || {
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
        let qp = match a.path {
            PathKind::Raw => Qp::Raw(qp),
            PathKind::Mtrdma => Qp::Sched(Box::new(
                qp.scheduled(ScheduleConfig {
                    chunk_bytes: a.chunk,
                    max_pieces_in_flight: a.pieces,
                    // The tenant the queue pair was built for, or without a
                    // coordinator tenant 0 of this process.
                    tenant: match &tenant {
                        Some(_) => Tenancy::OfQueuePair,
                        None => Tenancy::Local {
                            id: TenantId(0),
                            class: TrafficClass::Bulk,
                        },
                    },
                    window: Some(DelayWindowConfig::for_piece(a.chunk)),
                })
                .map_err(|e| format!("setting up the scheduled path to node {addr}: {e}"))?,
            )),
        };
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
        pages: vec![
            PageEntry {
                version: 1,
                state: State::Remote,
            };
            a.working_set as usize
        ],
        frames: (0..a.cache).map(|_| None).collect(),
        empty_frames: (0..a.cache as u32).rev().collect(),
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

/// `count` page buffers, pieces of one registration (for the tenant, if
/// there is one).
fn allocate(
    pd: &ProtectionDomain,
    tenant: Option<&TenantHandle>,
    count: usize,
) -> Result<Vec<MemoryRegion>, String> {
    let total = count
        .checked_mul(PAGE)
        .ok_or_else(|| format!("{count} page buffers do not fit in memory"))?;
    let region = admitted(Duration::from_secs(30), || match tenant {
        Some(t) => pd.register_for(t, vec![0u8; total], Access::LOCAL),
        None => pd.allocate(total, Access::LOCAL),
    })
    .map_err(|e| format!("registering the page cache ({total} bytes): {e}"))?;
    region
        .into_pieces(PAGE)
        .map_err(|e| format!("splitting the page cache into pages: {e}"))
}

impl Pager {
    fn node_of(&self, page: u64) -> usize {
        (page % self.nodes.len() as u64) as usize
    }

    /// The page's 4 KiB on its node.
    fn remote_of(&self, page: u64) -> RemoteRegion {
        let node = &self.nodes[self.node_of(page)];
        let slot = page / self.nodes.len() as u64;
        node.remote
            .slice(slot * PAGE as u64, PAGE as u64)
            .expect("the capacity check keeps every slot inside the node's region")
    }

    fn reads_alive(&self) -> usize {
        self.nodes
            .iter()
            .filter(|n| n.lost.is_none())
            .map(|n| n.reads)
            .sum()
    }

    fn writes_alive(&self) -> usize {
        self.nodes
            .iter()
            .filter(|n| n.lost.is_none())
            .map(|n| n.writes)
            .sum()
    }

    /// Requests out on nodes not lost: what the end of the run waits for.
    fn in_flight_alive(&self) -> usize {
        self.nodes
            .iter()
            .filter(|n| n.lost.is_none())
            .map(Node::in_flight)
            .sum()
    }

    /// Declares node `i` lost: every page of it LOST, its frames freed,
    /// nothing more posted to it.
    fn lose(&mut self, i: usize, why: String) {
        if self.nodes[i].lost.is_some() {
            return;
        }
        let n = self.nodes.len();
        let mut count = 0u64;
        for p in (i..self.pages.len()).step_by(n) {
            match self.pages[p].state {
                State::Cached(f) => {
                    if let Some(buf) = self.frames[f as usize].take().and_then(|fr| fr.buf) {
                        self.free.push(buf);
                    }
                    self.empty_frames.push(f);
                }
                // Its buffer comes back with the failed (or discarded)
                // READ's completion.
                State::Reading(f) => {
                    self.frames[f as usize] = None;
                    self.empty_frames.push(f);
                }
                State::Remote | State::WritingOut | State::Lost => {}
            }
            self.pages[p].state = State::Lost;
            count += 1;
        }
        println!("lost: {count} pages on node {} ({why})", self.nodes[i].addr);
        self.r.lost_pages += count;
        self.nodes[i].lost = Some(why);
        // Its requests still out are flushed back at once on the plain
        // path (their buffers return); a scheduled queue pair keeps them
        // until its retries run out. Either way the pager no longer waits
        // for them.
        if let Qp::Raw(q) = &self.nodes[i].qp {
            let _ = q.set_error();
        }
        self.first_loss.get_or_insert_with(Instant::now);
    }

    /// Looks at every node's connection: end of stream means the node is
    /// gone.
    fn check_connections(&mut self) {
        for i in 0..self.nodes.len() {
            if self.nodes[i].lost.is_some() {
                continue;
            }
            let mut b = [0u8; 16];
            let why = match (&self.nodes[i].stream).read(&mut b) {
                Ok(0) => Some("the node closed its connection".to_string()),
                Ok(_) => None,
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted) => {
                    None
                }
                Err(e) => Some(format!("its connection failed: {e}")),
            };
            if let Some(why) = why {
                self.lose(i, why);
            }
        }
    }

    /// Posts `op` of `buf` for `page` on its node; a refusal loses the
    /// node and hands the buffer back to the free list.
    fn post(&mut self, page: u64, write: bool, buf: MemoryRegion) -> bool {
        let i = self.node_of(page);
        let remote = self.remote_of(page);
        let op = if write {
            SendOp::Write(remote)
        } else {
            SendOp::Read(remote)
        };
        match self.nodes[i].qp.post(op, buf, context(page, write)) {
            Ok(()) => {
                if write {
                    self.nodes[i].writes += 1;
                } else {
                    self.nodes[i].reads += 1;
                }
                true
            }
            Err(e) => {
                let why = format!(
                    "posting a {} failed: {}",
                    if write { "WRITE" } else { "READ" },
                    e.error
                );
                self.free.push(e.region);
                self.lose(i, why);
                false
            }
        }
    }

    /// Writes every page out once at version 1, so that every page-in has
    /// something to check.
    fn fill(&mut self, spin: bool) -> Result<(), String> {
        let w = self.pages.len() as u64;
        let per_node = self.depth.max(8);
        let mut next = 0u64;
        let mut last_check = Instant::now();
        while next < w || self.in_flight_alive() > 0 {
            if last_check.elapsed() >= TCP_CHECK {
                last_check = Instant::now();
                self.check_connections();
            }
            let mut posted = false;
            while next < w {
                let i = self.node_of(next);
                if self.nodes[i].lost.is_some() {
                    next += 1;
                    continue;
                }
                if self.nodes[i].writes >= per_node {
                    break;
                }
                let Some(mut buf) = self.free.pop() else {
                    break;
                };
                if let Some(bytes) = buf.as_mut_slice() {
                    encode(bytes, next, 1);
                }
                if self.post(next, true, buf) {
                    self.r.filled += 1;
                }
                posted = true;
                next += 1;
            }
            self.progress(spin, !posted)?;
        }
        Ok(())
    }

    /// Reaps completions of every node; if there were none and `block`,
    /// sleeps on the busiest node's completion channel first. Returns how
    /// many completions it handled.
    fn progress(&mut self, spin: bool, block: bool) -> Result<usize, String> {
        let mut handled = 0;
        for i in 0..self.nodes.len() {
            if self.nodes[i].in_flight() == 0 {
                continue;
            }
            handled += self.reap(i, None)?;
        }
        if handled == 0 && block && !spin {
            let busy: Vec<usize> = (0..self.nodes.len())
                .filter(|&i| self.nodes[i].in_flight() > 0)
                .collect();
            if let Some(&i) = busy.iter().max_by_key(|&&i| self.nodes[i].in_flight()) {
                let slice = if busy.len() > 1 {
                    SHORT_SLICE
                } else {
                    WAIT_SLICE
                };
                handled += self.reap(i, Some(slice))?;
            }
        }
        Ok(handled)
    }

    /// Polls node `i` once (sleeping up to `wait` if given) and handles
    /// what completed.
    fn reap(&mut self, i: usize, wait: Option<Duration>) -> Result<usize, String> {
        let mut out = std::mem::take(&mut self.out);
        let polled = match wait {
            Some(t) => self.nodes[i].qp.poll_wait(&mut out, t),
            None => self.nodes[i].qp.poll(&mut out),
        };
        if let Err(e) = polled {
            // A queue pair that cannot be polled is as good as gone.
            self.lose(i, format!("polling its queue pair failed: {e}"));
        }
        let n = out.len();
        for c in out.drain(..) {
            self.complete(i, c);
        }
        self.out = out;
        Ok(n)
    }

    /// One finished READ or WRITE of node `i`.
    fn complete(&mut self, i: usize, c: Completion) {
        let page = c.context >> 1;
        let write = c.context & 1 == 1;
        let ok = c.status.is_success();
        if write {
            self.nodes[i].writes = self.nodes[i].writes.saturating_sub(1);
        } else {
            self.nodes[i].reads = self.nodes[i].reads.saturating_sub(1);
        }
        if !ok {
            self.lose(
                i,
                format!(
                    "a {} completed with {}",
                    if write { "WRITE" } else { "READ" },
                    c.status
                ),
            );
        }
        let Some(entry) = self.pages.get(page as usize).copied() else {
            self.free.push(c.region);
            return;
        };
        if write {
            self.free.push(c.region);
            if ok && !self.filling && entry.state == State::WritingOut {
                self.r.page_outs += 1;
                self.pages[page as usize].state = State::Remote;
            }
            return;
        }
        // A READ: data only if it succeeded, from a node still alive, for a
        // page still waiting for it.
        let State::Reading(f) = entry.state else {
            self.free.push(c.region);
            return;
        };
        if !ok || self.nodes[i].lost.is_some() {
            self.free.push(c.region);
            return;
        }
        let latency = self.frames[f as usize]
            .as_ref()
            .and_then(|fr| fr.posted)
            .map(|t| t.elapsed());
        if let Some(l) = latency {
            self.r.latencies_ns.push(l.as_nanos() as u64);
        }
        self.r.page_ins += 1;
        if self.first_loss.is_some() {
            self.r.page_ins_after_loss += 1;
        }
        match c.region.as_slice().map(|b| verify(b, page, entry.version)) {
            Some(Ok(())) => self.r.verified += 1,
            Some(Err(e)) => {
                self.r.corrupt += 1;
                if self.r.corrupt <= SHOW_CORRUPT {
                    eprintln!(
                        "CORRUPT: page {page} from node {} (expected version {}): {e}",
                        self.nodes[i].addr, entry.version
                    );
                }
            }
            None => {
                self.r.corrupt += 1;
                eprintln!("CORRUPT: page {page}: its buffer cannot be read");
            }
        }
        if let Some(fr) = self.frames[f as usize].as_mut() {
            fr.buf = Some(c.region);
            fr.posted = None;
        }
        self.pages[page as usize].state = State::Cached(f);
    }

    /// A frame to fill: an empty one, or the clock's victim (written out
    /// first if dirty). `None` if none can be had now.
    fn take_frame(&mut self) -> Option<u32> {
        if let Some(f) = self.empty_frames.pop() {
            return Some(f);
        }
        let n = self.frames.len();
        for _ in 0..2 * n {
            let f = self.hand;
            self.hand = (self.hand + 1) % n;
            let Some(fr) = self.frames[f].as_mut() else {
                continue;
            };
            if fr.posted.is_some() {
                continue; // its page-in is in flight
            }
            if fr.referenced {
                fr.referenced = false;
                continue;
            }
            // A dirty victim needs a page-out slot and a spare buffer for
            // the page coming in.
            if fr.dirty && (self.writes_alive() >= self.depth || self.free.is_empty()) {
                return None;
            }
            let fr = self.frames[f].take().expect("looked at above");
            let buf = fr.buf.expect("a frame not being read holds its page");
            let victim = fr.page;
            if fr.dirty {
                let version = self.pages[victim as usize].version;
                let mut buf = buf;
                if let Some(bytes) = buf.as_mut_slice() {
                    encode(bytes, victim, version);
                }
                self.pages[victim as usize].state = State::WritingOut;
                if !self.post(victim, true, buf) {
                    // Its node is lost now (and the page with it).
                    self.pages[victim as usize].state = State::Lost;
                }
            } else {
                self.free.push(buf);
                self.pages[victim as usize].state = State::Remote;
            }
            return Some(f as u32);
        }
        None
    }

    /// Starts reading `page` in; false if it cannot start now.
    fn start_miss(&mut self, page: u64) -> bool {
        if self.reads_alive() >= self.depth {
            return false;
        }
        let Some(f) = self.take_frame() else {
            return false;
        };
        let Some(buf) = self.free.pop() else {
            // Cannot happen with C + D buffers; give the frame back.
            self.empty_frames.push(f);
            return false;
        };
        self.frames[f as usize] = Some(Frame {
            page,
            buf: None,
            dirty: false,
            referenced: true,
            posted: Some(Instant::now()),
        });
        self.pages[page as usize].state = State::Reading(f);
        if !self.post(page, false, buf) {
            // `post` lost the node, which emptied the frame and marked the
            // page lost.
            return false;
        }
        self.r.faults += 1;
        true
    }

    /// One access to `page`: served, or the worker waits.
    fn access(&mut self, page: u64, write: bool) -> Outcome {
        match self.pages[page as usize].state {
            State::Lost => {
                self.r.lost_accesses += 1;
                self.r.accesses += 1;
                Outcome::Done
            }
            State::Cached(f) => {
                if let Some(fr) = self.frames[f as usize].as_mut() {
                    fr.referenced = true;
                    if write {
                        // The store: the page's next version, written into
                        // its bytes when it is paged out.
                        fr.dirty = true;
                        self.pages[page as usize].version += 1;
                        self.r.writes += 1;
                    }
                }
                self.r.accesses += 1;
                Outcome::Done
            }
            State::Reading(_) | State::WritingOut => Outcome::Blocked,
            State::Remote => {
                self.start_miss(page);
                Outcome::Blocked
            }
        }
    }

    /// The timed run, then the drain of what is still in flight.
    fn timed(&mut self, a: &ClientArgs) -> Result<(), String> {
        let mut rng = Rng::new(a.seed);
        let w = self.pages.len() as u64;
        let mut workers: Vec<Option<(u64, bool)>> = vec![None; self.depth];
        self.started = Instant::now();
        let deadline = self.started + a.duration;
        let mut last_check = Instant::now();
        loop {
            let now = Instant::now();
            let running = now < deadline;
            if !running && self.in_flight_alive() == 0 {
                break;
            }
            if !running && now >= deadline + DRAIN {
                eprintln!(
                    "remote_memory: {} request(s) still out {DRAIN:?} after the run; not waiting longer",
                    self.in_flight_alive()
                );
                break;
            }
            let mut moved = false;
            if running {
                for wk in workers.iter_mut() {
                    for _ in 0..BURST {
                        let (page, write) =
                            *wk.get_or_insert_with(|| (rng.below(w), rng.chance(a.write_share)));
                        match self.access(page, write) {
                            Outcome::Done => {
                                *wk = None;
                                moved = true;
                            }
                            Outcome::Blocked => break,
                        }
                    }
                }
            }
            if now.duration_since(last_check) >= TCP_CHECK {
                last_check = now;
                self.check_connections();
            }
            let block = !moved;
            self.progress(a.spin, block)?;
        }
        self.r.elapsed = self.started.elapsed();
        Ok(())
    }
}
