//! An HRD-style request/response service over UD, as a tenant.
//!
//! `rpc server` runs one UD queue pair per server thread; each serves many
//! clients, answering every request to the queue pair number and GID it
//! came from (taken from the receive's completion and its GRH), as HERD's
//! and rdma-dpdk's servers do. All the server's queue pairs take their
//! receives from one shared receive queue: the server posts receive
//! buffers for its clients once, not once per thread. A request's buffer
//! goes back to the queue's reserve once it is answered, and the reserve
//! is posted as one list when the queue's limit event says it runs low. `rpc client` runs client threads, one UD
//! queue pair each, client `i` talking to server thread `i % threads`.
//! Servers and clients find each other through a registry
//! (`mtrdma::verbs::registry`): a memcached (`--registry HOST:PORT`), or,
//! with no memcached, one the server hosts itself (`--host-registry
//! ADDR`). Every endpoint is published under the service's name:
//! `NAME/threads`, `NAME/server-T`, `NAME/client-I`. The server waits for
//! its clients' names with a deadline (as HRD's do) and answers only the
//! queue pairs they published: a datagram from anyone else is counted,
//! never answered.
//!
//! Each client keeps one request out at a time: it sends, waits for the
//! answer carrying the same sequence number, and with `--interval US`
//! sends its requests that far apart (closed loop otherwise). It reports
//! requests per second and latency percentiles; `--samples FILE` writes
//! every latency (us, one per line) and `--csv FILE` one row of figures.
//! With `--start-file FILE` the clients send at the same pace, uncounted,
//! until FILE exists, and measure from then on: the service is already
//! running when whatever it is measured next to starts.
//!
//! With `--path mtrdma` every queue pair posts through
//! `ScheduledUdQueuePair`, scheduled as its tenant (`--coordinator SOCKET`:
//! the tenant a running `examples/coordinator` decides for this process,
//! whose queue pairs and buffers are admitted against its quota; without
//! it, the tenant the environment names, as for the preload library:
//! `MTRDMA_COORDINATOR`, or `MTRDMA_POLICY` and `MTRDMA_TENANT`). It joins
//! through [`mtrdma::Tenant::join`].
//!
//! ```text
//! rpc server --device rxe0 --host-registry 127.0.0.1:7700 --clients 8
//! rpc client --device rxe0 --registry 127.0.0.1:7700 --clients 8 --seconds 5
//! ```

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use mtrdma::core::TrafficClass;
use mtrdma::verbs::asynchronous::{AsyncQueue, AsyncQueuePair};
use mtrdma::verbs::registry::{Registry, RegistryHost};
use mtrdma::verbs::PollCompletions;
use mtrdma::verbs::{
    Access, AddressHandle, Context, MemoryRegion, Opcode, PostError, ProtectionDomain,
    ScheduleConfig, ScheduledUdQueuePair, SharedReceiveQueue, UdCompletion, UdEndpoint,
    UdQueuePair, DEFAULT_QKEY,
};
use mtrdma::{Tenant, TenantSource};

#[path = "shared/args.rs"]
mod args;
#[path = "shared/tenant.rs"]
mod tenant;
use args::Token;

/// Bytes of a message's header: kind (1), 3 unused, client (4), sequence (8).
const HEADER: usize = 16;
const REQUEST: u8 = 1;
const BYE: u8 = 2;
const RESPONSE: u8 = 3;
/// Receives the server's shared receive queue holds at least: a burst from
/// all its clients at once (it holds four per client when that is more).
const SERVER_RECVS: u32 = 256;
const CLIENT_RECVS: u32 = 8;
/// Times a client sends its bye while no answer comes.
const BYE_TRIES: u32 = 10;
/// Requests each client sends before it starts counting (the server may
/// still be waiting for other clients' names; queue pairs warm up).
const WARMUP: u64 = 20;
/// How long a client waits for one answer before it counts the request
/// lost (UD does not resend) and sends the next.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(1);
/// Whether to spin on `poll` rather than sleep on completion events.
static BUSY_POLL: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
/// Send buffers a server thread keeps for answers in flight.
const SERVER_SEND_POOL: usize = 64;
/// The context of the async server's answers (its receives carry 1).
const ANSWER: u64 = 2;
/// The most completions the async server takes from one wake.
const INCOMING_AT_ONCE: usize = 256;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum PathKind {
    Raw,
    Mtrdma,
}

#[derive(Debug)]
struct Opts {
    server: bool,
    device: String,
    registry: Option<String>,
    host_registry: Option<String>,
    name: String,
    threads: u32,
    clients: u32,
    first: u32,
    seconds: f64,
    interval_us: u64,
    size: usize,
    path: PathKind,
    coordinator: Option<PathBuf>,
    samples: Option<PathBuf>,
    csv: Option<PathBuf>,
    wait: Duration,
    start_file: Option<PathBuf>,
    /// Server: each thread serves its clients as one task on a tokio
    /// runtime of its own (`AsyncQueuePair`), not in a blocking loop.
    asynchronous: bool,
}

const USAGE: &str = "\
usage: rpc server --device DEV (--registry HOST:PORT | --host-registry ADDR) [options]
       rpc client --device DEV --registry HOST:PORT [options]
options:
  --name NAME            the service's name in the registry (default rpc)
  --threads T            server threads, one UD queue pair each (server; default 1)
  --clients N            clients in all (server: the names it waits for; client:
                         the client threads of this process; default 8)
  --first I              this process's first client index (client; default 0)
  --seconds S            client: how long to measure (default 5); server: the
                         longest it serves before giving up on clients (default 600)
  --interval US          a client's requests this far apart (default 0: closed loop)
  --size B               request and answer bytes, 16 to the MTU (default 32)
  --path raw|mtrdma      post straight, or through mtrdma's scheduler (default raw)
  --coordinator SOCKET   register with a running coordinator as this process's tenant
                         (without it: the tenant MTRDMA_COORDINATOR or MTRDMA_POLICY names)
  --wait S               how long to wait for names in the registry, and a
                         client for its first answer (default 60)
  --samples FILE         client: every latency in us, one per line
  --csv FILE             client: one row of figures
  --start-file FILE      client: send at the same pace, uncounted, until FILE
                         exists, then measure for --seconds
  --async                server: each thread serves as one task on tokio
                         (mtrdma's AsyncQueuePair), not in a blocking loop";

fn parse(mut a: args::Args) -> Result<Opts, String> {
    let mode = match a.next()? {
        Some(Token::Value(v)) if v == "server" => true,
        Some(Token::Value(v)) if v == "client" => false,
        Some(Token::Flag(f)) if f == "--help" || f == "-h" => return Err(USAGE.into()),
        _ => return Err(format!("say `server` or `client` first\n{USAGE}")),
    };
    let mut o = Opts {
        server: mode,
        device: String::new(),
        registry: None,
        host_registry: None,
        name: "rpc".into(),
        threads: 1,
        clients: 8,
        first: 0,
        seconds: if mode { 600.0 } else { 5.0 },
        interval_us: 0,
        size: 32,
        path: PathKind::Raw,
        coordinator: None,
        samples: None,
        csv: None,
        wait: Duration::from_secs(60),
        start_file: None,
        asynchronous: false,
    };
    while let Some(t) = a.next()? {
        let Token::Flag(f) = t else {
            return Err(format!("unexpected argument\n{USAGE}"));
        };
        match f.as_str() {
            "--device" | "-d" => o.device = a.value(&f)?,
            "--registry" => o.registry = Some(a.value(&f)?),
            "--host-registry" => o.host_registry = Some(a.value(&f)?),
            "--name" => o.name = a.value(&f)?,
            "--threads" => o.threads = a.parse(&f)?,
            "--clients" => o.clients = a.parse(&f)?,
            "--first" => o.first = a.parse(&f)?,
            "--seconds" | "-D" => o.seconds = a.parse(&f)?,
            "--interval" => o.interval_us = a.parse(&f)?,
            "--size" | "-s" => o.size = a.parse(&f)?,
            "--path" => {
                o.path = match a.value(&f)?.as_str() {
                    "raw" => PathKind::Raw,
                    "mtrdma" => PathKind::Mtrdma,
                    p => return Err(format!("--path {p}: say raw or mtrdma")),
                }
            }
            "--coordinator" => o.coordinator = Some(a.value(&f)?.into()),
            "--wait" => o.wait = Duration::from_secs_f64(a.parse(&f)?),
            "--samples" => o.samples = Some(a.value(&f)?.into()),
            "--csv" => o.csv = Some(a.value(&f)?.into()),
            "--start-file" => o.start_file = Some(a.value(&f)?.into()),
            "--busy-poll" => BUSY_POLL.store(true, std::sync::atomic::Ordering::Relaxed),
            "--async" => o.asynchronous = true,
            "--help" | "-h" => return Err(USAGE.into()),
            _ => return Err(format!("unknown flag {f}\n{USAGE}")),
        }
    }
    if o.device.is_empty() {
        return Err("--device DEV is needed".into());
    }
    if o.threads == 0 || o.clients == 0 {
        return Err("--threads and --clients must be at least 1".into());
    }
    if !(o.seconds.is_finite() && o.seconds > 0.0) {
        return Err(format!("--seconds {}: must be above 0", o.seconds));
    }
    if o.size < HEADER {
        return Err(format!("--size {}: at least {HEADER} bytes", o.size));
    }
    match (o.server, &o.registry, &o.host_registry) {
        (_, Some(_), Some(_)) => return Err("give --registry or --host-registry, not both".into()),
        (true, None, None) => {
            return Err("the server needs --registry HOST:PORT or --host-registry ADDR".into())
        }
        (false, None, _) => return Err("the client needs --registry HOST:PORT".into()),
        _ => {}
    }
    if o.name.is_empty() || o.name.len() > 200 || o.name.bytes().any(|b| b <= b' ') {
        return Err(format!(
            "--name {:?}: 1 to 200 characters, no spaces",
            o.name
        ));
    }
    Ok(o)
}

/// One UD queue pair, posting straight or through mtrdma's scheduler.
enum Ud {
    Raw(Box<UdQueuePair>),
    Sched(Box<ScheduledUdQueuePair>),
}

impl Ud {
    fn endpoint(&self) -> UdEndpoint {
        match self {
            Ud::Raw(q) => q.endpoint(),
            Ud::Sched(q) => q.endpoint(),
        }
    }

    fn mtu(&self) -> u32 {
        match self {
            Ud::Raw(q) => q.mtu(),
            Ud::Sched(q) => q.mtu(),
        }
    }

    /// The queue pair, to answer (or ask) on.
    fn answers(&mut self) -> &mut dyn Answers {
        match self {
            Ud::Raw(q) => &mut **q,
            Ud::Sched(q) => &mut **q,
        }
    }

    fn recv(&mut self, mr: MemoryRegion) -> Result<(), String> {
        let len = mr.len();
        match self {
            Ud::Raw(q) => q.post_recv(mr, 0..len, 1),
            Ud::Sched(q) => q.post_recv(mr, 0..len, 1),
        }
        .map_err(|e| format!("posting a receive: {e}"))
    }

    fn wait(&mut self, out: &mut Vec<UdCompletion>, timeout: Duration) -> Result<usize, String> {
        if BUSY_POLL.load(std::sync::atomic::Ordering::Relaxed) {
            let start = Instant::now();
            loop {
                let n = match self {
                    Ud::Raw(q) => q.poll(out),
                    Ud::Sched(q) => q.poll(out),
                }
                .map_err(|e| format!("polling: {e}"))?;
                if n > 0 || start.elapsed() >= timeout {
                    return Ok(n);
                }
                std::thread::yield_now();
            }
        }
        match self {
            Ud::Raw(q) => q.poll_wait(out, timeout),
            Ud::Sched(q) => q.poll_wait(out, timeout),
        }
        .map_err(|e| format!("waiting for completions: {e}"))
    }
}

/// What every thread of the process shares: the device, the tenant.
struct Site {
    pd: ProtectionDomain,
    tenant: Option<Tenant>,
    path: PathKind,
}

impl Site {
    fn open(o: &Opts) -> Result<Site, String> {
        let source = match &o.coordinator {
            Some(socket) => Some(TenantSource::coordinator(socket)),
            None => TenantSource::from_env(),
        };
        let tenant = source
            .map(|source| Tenant::join(&source))
            .transpose()
            .map_err(|e| e.to_string())?;
        let ctx = Context::open(&o.device).map_err(|e| format!("opening {}: {e}", o.device))?;
        let pd = ctx
            .alloc_pd()
            .map_err(|e| format!("a protection domain: {e}"))?;
        Ok(Site {
            pd,
            tenant,
            path: o.path,
        })
    }

    fn describe(&self) -> String {
        match &self.tenant {
            Some(t) => t.to_string(),
            None => "no tenant".into(),
        }
    }

    fn buffer(&self, len: usize) -> Result<MemoryRegion, String> {
        match &self.tenant {
            Some(t) => self.pd.register_for(t, vec![0u8; len], Access::LOCAL),
            None => self.pd.allocate(len, Access::LOCAL),
        }
        .map_err(|e| format!("registering a {len}-byte buffer: {e}"))
    }

    /// A UD queue pair with `recvs` receives of its own, or taking them
    /// from `srq`.
    fn queue_pair(
        &self,
        recvs: u32,
        sends: u32,
        srq: Option<&SharedReceiveQueue>,
    ) -> Result<Ud, String> {
        let mut b = self
            .pd
            .ud_queue_pair()
            .max_recv_wr(recvs)
            .max_send_wr(sends)
            .completion_events(true);
        if let Some(t) = &self.tenant {
            b = b.tenant(t);
        }
        if let Some(srq) = srq {
            b = b.srq(srq);
        }
        let qp = b.build().map_err(|e| format!("a UD queue pair: {e}"))?;
        Ok(match self.path {
            PathKind::Raw => Ud::Raw(Box::new(qp)),
            PathKind::Mtrdma => {
                let config = ScheduleConfig {
                    tenant: tenant::tenancy(self.tenant.as_deref(), TrafficClass::Latency),
                    ..ScheduleConfig::default()
                };
                Ud::Sched(Box::new(
                    qp.scheduled(config)
                        .map_err(|e| format!("setting up the scheduled path: {e}"))?,
                ))
            }
        })
    }
}

fn header(mr: &mut MemoryRegion, kind: u8, client: u32, seq: u64) -> Result<(), String> {
    let mut h = [0u8; HEADER];
    h[0] = kind;
    h[4..8].copy_from_slice(&client.to_le_bytes());
    h[8..16].copy_from_slice(&seq.to_le_bytes());
    mr.write_at(0, &h)
        .map_err(|e| format!("writing a message: {e}"))
}

/// (kind, client, sequence) of a received message, if it has a header.
fn read_header(c: &UdCompletion) -> Option<(u8, u32, u64)> {
    if (c.byte_len as usize) < HEADER {
        return None;
    }
    let mut h = [0u8; HEADER];
    c.region.read_into(0, &mut h).ok()?;
    Some((
        h[0],
        u32::from_le_bytes(h[4..8].try_into().ok()?),
        u64::from_le_bytes(h[8..16].try_into().ok()?),
    ))
}

fn connect_registry(o: &Opts, host: Option<&RegistryHost>) -> Result<Registry, String> {
    let addr = match (host, &o.registry) {
        (Some(h), _) => h.addr().to_string(),
        (None, Some(a)) => a.clone(),
        (None, None) => unreachable!("checked in parse"),
    };
    Registry::connect(&addr).map_err(|e| e.to_string())
}

// ---------------------------------------------------------------- server

/// What one server thread did.
#[derive(Default)]
struct Served {
    answered: u64,
    strangers: u64,
    byes: u32,
}

/// A message to answer, a request or a bye: from client `k` (its place
/// in the server's list), answered at `to`, with its own client number
/// and sequence.
struct Request {
    k: usize,
    to: UdEndpoint,
    client: u32,
    seq: u64,
    /// A bye: answered as a request is, but not counted as one.
    bye: bool,
}

impl Served {
    /// Takes a received message: its region, to go back to the receive
    /// queue, and what to answer, if anything: a request, or a bye (counted
    /// once per client, answered each time, so that a client sends its bye
    /// again only while no answer came). A message from a queue pair no
    /// client published is a stranger's.
    fn take(
        &mut self,
        c: UdCompletion,
        clients: &[UdEndpoint],
        said_bye: &mut [bool],
    ) -> Result<(MemoryRegion, Option<Request>), String> {
        if !c.status.is_success() {
            return Err(format!("a receive failed: {:?}", c.status));
        }
        let head = read_header(&c);
        // A client is the queue pair it published: its QPN and GID.
        let Some((k, src)) = c.source.and_then(|src| {
            clients
                .iter()
                .position(|e| e.qpn == src.qpn && src.gid.is_some_and(|g| g.0 == e.gid))
                .map(|k| (k, src))
        }) else {
            self.strangers += 1;
            return Ok((c.region, None));
        };
        let (kind, client, seq) = match head {
            Some(head @ (REQUEST | BYE, _, _)) => head,
            _ => {
                self.strangers += 1;
                return Ok((c.region, None));
            }
        };
        let bye = kind == BYE;
        if bye && !said_bye[k] {
            said_bye[k] = true;
            self.byes += 1;
        }
        // The route back is the message's own source: the QPN from its
        // completion, the GID from its GRH.
        let request = Request {
            k,
            to: UdEndpoint {
                qpn: src.qpn,
                qkey: DEFAULT_QKEY,
                gid: src.gid.map(|g| g.0).unwrap_or_default(),
                lid: 0,
            },
            client,
            seq,
            bye,
        };
        Ok((c.region, Some(request)))
    }
}

fn server(o: &Opts) -> Result<(), String> {
    let host = match &o.host_registry {
        Some(addr) => Some(
            RegistryHost::bind(addr.as_str())
                .map_err(|e| format!("hosting a registry on {addr}: {e}"))?,
        ),
        None => None,
    };
    let mut registry = connect_registry(o, host.as_ref())?;
    let site = Site::open(o)?;
    // One receive queue for every thread's queue pair. Its limit is half
    // its depth, at least twice the clients: each client has one request
    // out at a time, so the queue still holds receives for all of them
    // when its limit event comes.
    let depth = SERVER_RECVS.max(o.clients.saturating_mul(4));
    let srq = site
        .pd
        .shared_receive_queue()
        .max_wr(depth)
        .limit(depth / 2)
        .datagrams(true)
        .build()
        .map_err(|e| format!("a shared receive queue of {depth} receives: {e}"))?;
    let mut qps = Vec::new();
    for t in 0..o.threads {
        let qp = site.queue_pair(0, SERVER_SEND_POOL as u32, Some(&srq))?;
        // Receives go up before the first endpoint is published: a
        // datagram to a UD queue pair with none posted is dropped.
        let mtu = qp.mtu() as usize;
        if t == 0 {
            for _ in 0..depth {
                let buf = site.buffer(mtu)?;
                srq.post_recv(buf, 0..mtu, 1)
                    .map_err(|e| format!("posting a receive: {e}"))?;
            }
        }
        registry
            .publish_json(&format!("{}/server-{t}", o.name), &qp.endpoint())
            .map_err(|e| e.to_string())?;
        qps.push(qp);
    }
    registry
        .publish_json(&format!("{}/threads", o.name), &o.threads)
        .map_err(|e| e.to_string())?;
    println!(
        "rpc server: {} thread(s), one UD queue pair each (qpn {}), {depth} receives shared, on {}, path {:?}, {}; registry {}",
        o.threads,
        qps.iter()
            .map(|q| q.endpoint().qpn.to_string())
            .collect::<Vec<_>>()
            .join(","),
        o.device,
        o.path,
        site.describe(),
        registry.server()
    );
    // The clients this server answers: their published queue pairs.
    let mut clients: Vec<UdEndpoint> = Vec::new();
    for i in 0..o.clients {
        let name = format!("{}/client-{i}", o.name);
        clients.push(
            registry
                .wait_for_json(&name, o.wait)
                .map_err(|e| format!("waiting for client {i}: {e}"))?,
        );
    }
    println!("rpc server: all {} clients published", o.clients);
    let deadline = Instant::now() + Duration::from_secs_f64(o.seconds);
    let site = Arc::new(site);
    let cpu_before = process_cpu();
    let results: Vec<Result<Served, String>> = std::thread::scope(|s| {
        let handles: Vec<_> = qps
            .into_iter()
            .enumerate()
            .map(|(t, qp)| {
                // Client i talks to server thread i % threads.
                let mine: Vec<UdEndpoint> = clients
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| *i as u32 % o.threads == t as u32)
                    .map(|(_, c)| *c)
                    .collect();
                let (site, srq) = (site.clone(), srq.clone());
                let asynchronous = o.asynchronous;
                s.spawn(move || {
                    if asynchronous {
                        serve_async(&site, qp, &srq, &mine, o.size, deadline)
                    } else {
                        serve(&site, qp, &srq, &mine, o.size, deadline)
                    }
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err("a server thread panicked".into()))
            })
            .collect()
    });
    let cpu = process_cpu().saturating_sub(cpu_before);
    for t in 0..o.threads {
        let _ = registry.remove(&format!("{}/server-{t}", o.name));
    }
    let _ = registry.remove(&format!("{}/threads", o.name));
    let mut total = Served::default();
    let mut per_qp = Vec::new();
    for r in results {
        let r = r?;
        per_qp.push(r.answered.to_string());
        total.answered += r.answered;
        total.strangers += r.strangers;
        total.byes += r.byes;
    }
    println!(
        "rpc server: answered {} requests (per queue pair: {}); {} of {} clients said bye; strangers {}; receive queue refilled {} times ({} limit events)",
        total.answered,
        per_qp.join(" "),
        total.byes,
        o.clients,
        total.strangers,
        srq.refills(),
        srq.limit_events()
    );
    // What serving cost the server's CPU: a figure of the server alone,
    // whatever the clients beside it on the same CPUs leave it.
    println!(
        "rpc server: CPU {:.3} s while serving, {:.1} us per answer",
        cpu.as_secs_f64(),
        cpu.as_secs_f64() * 1e6 / total.answered.max(1) as f64
    );
    if total.byes < o.clients {
        return Err(format!(
            "only {} of {} clients finished before the server's {} s ran out",
            total.byes, o.clients, o.seconds
        ));
    }
    Ok(())
}

/// One server thread: answers `clients` on `qp` until each said bye or
/// `deadline` passes; each request's buffer goes back to `srq`'s reserve.
fn serve(
    site: &Site,
    mut qp: Ud,
    srq: &SharedReceiveQueue,
    clients: &[UdEndpoint],
    size: usize,
    deadline: Instant,
) -> Result<Served, String> {
    let mut desk = Desk::new(site, clients.len(), size)?;
    // Completions not handled yet, oldest first.
    let mut backlog: VecDeque<UdCompletion> = VecDeque::new();
    let mut more = Vec::new();
    while desk.served.byes < clients.len() as u32 {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        if backlog.is_empty() {
            qp.wait(&mut more, left.min(Duration::from_millis(200)))?;
            backlog.extend(more.drain(..));
            continue;
        }
        // Everything one wait found is answered together: one batch.
        while let Some(c) = backlog.pop_front() {
            if c.opcode != Opcode::Recv {
                desk.pool.push(sent_back(c)?);
                continue;
            }
            let handle_to = |to: &UdEndpoint| qp.answers().handle_to(to);
            let Some(request) = desk.take(c, clients, srq, handle_to)? else {
                continue;
            };
            if desk.pool.is_empty() {
                // Every answer buffer is in flight or waits here: post the
                // waiting ones, then take sent ones back, keeping the
                // requests for their turn.
                desk.post(qp.answers(), 0)?;
                while desk.pool.is_empty() {
                    qp.wait(&mut more, Duration::from_millis(100))?;
                    for m in more.drain(..) {
                        if m.opcode == Opcode::Recv {
                            backlog.push_back(m);
                        } else {
                            desk.pool.push(sent_back(m)?);
                        }
                    }
                }
            }
            desk.answer(&request)?;
        }
        desk.post(qp.answers(), 0)?;
    }
    Ok(desk.served)
}

/// What a server thread keeps while it answers: its answer buffers, the
/// clients' address handles, the answers of this wake, and what it
/// served.
struct Desk {
    /// Answer buffers not in flight.
    pool: Vec<MemoryRegion>,
    /// An address handle per client, made from the GID and QPN of its
    /// first request (its published endpoint says which are clients).
    handles: Vec<Option<AddressHandle>>,
    /// Answers written and waiting to go out with the others of their
    /// wake.
    answers: Vec<Answer>,
    served: Served,
    said_bye: Vec<bool>,
    size: usize,
}

impl Desk {
    /// A desk for `clients` clients, with its answer buffers of `size`
    /// bytes.
    fn new(site: &Site, clients: usize, size: usize) -> Result<Desk, String> {
        Ok(Desk {
            pool: (0..SERVER_SEND_POOL)
                .map(|_| site.buffer(size))
                .collect::<Result<Vec<_>, _>>()?,
            handles: vec![None; clients],
            answers: Vec::new(),
            served: Served::default(),
            said_bye: vec![false; clients],
            size,
        })
    }

    /// A received message: its buffer goes back to the receive queue's
    /// reserve (posted with the rest of the reserve, one doorbell, once
    /// the queue runs below its limit, which the queue pair's polls
    /// notice), a new client gets its address handle (made by
    /// `handle_to`), and the request to answer, if any, comes back.
    fn take(
        &mut self,
        c: UdCompletion,
        clients: &[UdEndpoint],
        srq: &SharedReceiveQueue,
        handle_to: impl FnOnce(&UdEndpoint) -> Result<AddressHandle, String>,
    ) -> Result<Option<Request>, String> {
        let (region, request) = self.served.take(c, clients, &mut self.said_bye)?;
        let len = region.len();
        srq.stock(region, 0..len, 1)
            .map_err(|e| format!("giving a receive back: {e}"))?;
        let Some(request) = request else {
            return Ok(None);
        };
        if self.handles[request.k].is_none() {
            self.handles[request.k] = Some(handle_to(&request.to)?);
        }
        Ok(Some(request))
    }

    /// Writes the answer to `request` into a free buffer (the pool must
    /// have one), to go out with the wake's others.
    fn answer(&mut self, request: &Request) -> Result<(), String> {
        let mr = self.pool.pop().expect("a free answer buffer");
        self.answers.push(Answer::new(request, mr)?);
        self.served.answered += u64::from(!request.bye);
        Ok(())
    }

    /// Posts the answers written so far on `qp` (see
    /// [`Answers::post_answers`]), completing with context `id`.
    fn post<A: Answers + ?Sized>(&mut self, qp: &mut A, id: u64) -> Result<(), String> {
        qp.post_answers(&self.handles, &mut self.answers, self.size, id)
    }
}

/// An answer's buffer, back from its completion.
fn sent_back(c: UdCompletion) -> Result<MemoryRegion, String> {
    if !c.status.is_success() {
        return Err(format!("an answer failed: {:?}", c.status));
    }
    Ok(c.region)
}

/// An answer written and waiting to be posted with the others of its
/// wake.
struct Answer {
    /// The client's place (its address handle's).
    k: usize,
    to: UdEndpoint,
    client: u32,
    mr: MemoryRegion,
}

impl Answer {
    /// The answer to `request` in `mr`.
    fn new(request: &Request, mut mr: MemoryRegion) -> Result<Answer, String> {
        header(&mut mr, RESPONSE, request.client, request.seq)?;
        Ok(Answer {
            k: request.k,
            to: request.to,
            client: request.client,
            mr,
        })
    }
}

/// The CPU time this process has used (every thread's).
fn process_cpu() -> Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

/// A UD queue pair the servers answer on (and the clients ask on):
/// straight or scheduled.
trait Answers {
    /// An address handle to `to`.
    fn handle_to(&mut self, to: &UdEndpoint) -> Result<AddressHandle, String>;

    fn answer(
        &mut self,
        ah: &AddressHandle,
        to: &UdEndpoint,
        mr: MemoryRegion,
        len: usize,
        id: u64,
    ) -> Result<(), PostError>;

    /// Posts `answers` (`len` bytes each, completing with context `id`),
    /// each to its client's handle in `handles`, and empties it: one at a
    /// time here; as one batch (one doorbell) where the queue pair has
    /// batches.
    fn post_answers(
        &mut self,
        handles: &[Option<AddressHandle>],
        answers: &mut Vec<Answer>,
        len: usize,
        id: u64,
    ) -> Result<(), String> {
        for a in answers.drain(..) {
            let ah = handles[a.k].as_ref().expect("made with the request");
            self.answer(ah, &a.to, a.mr, len, id)
                .map_err(|e| format!("answering client {}: {e}", a.client))?;
        }
        Ok(())
    }
}

/// Writes [`Answers`] for a queue pair type with the methods of that
/// name, and the `extra` methods given.
macro_rules! answers {
    ($ty:ty { $($extra:item)* }) => {
        impl Answers for $ty {
            fn handle_to(&mut self, to: &UdEndpoint) -> Result<AddressHandle, String> {
                self.address_handle(to)
                    .map_err(|e| format!("an address handle for queue pair {}: {e}", to.qpn))
            }

            fn answer(
                &mut self,
                ah: &AddressHandle,
                to: &UdEndpoint,
                mr: MemoryRegion,
                len: usize,
                id: u64,
            ) -> Result<(), PostError> {
                self.post_send(ah, to.qpn, to.qkey, mr, 0..len, id)
            }

            $($extra)*
        }
    };
}

answers!(ScheduledUdQueuePair {});

answers!(UdQueuePair {
    fn post_answers(
        &mut self,
        handles: &[Option<AddressHandle>],
        answers: &mut Vec<Answer>,
        len: usize,
        id: u64,
    ) -> Result<(), String> {
        if answers.is_empty() {
            return Ok(());
        }
        let n = answers.len();
        let mut batch = self.batch();
        for a in answers.drain(..) {
            let ah = handles[a.k].as_ref().expect("made with the request");
            batch
                .post_send(ah, a.to.qpn, a.to.qkey, a.mr, 0..len, id)
                .map_err(|e| format!("answering client {}: {e}", a.client))?;
        }
        batch
            .submit()
            .map_err(|e| format!("posting {n} answers: {e}"))
    }
});

/// A queue pair the async server answers on.
trait AnswerOn: AsyncQueue<Completion = UdCompletion> + Answers {}

impl<Q: AsyncQueue<Completion = UdCompletion> + Answers> AnswerOn for Q {}

/// [`serve`], as one task on a tokio runtime of this thread's own: the
/// requests come as the queue pair's incoming completions (the shared
/// receive queue's), and so do the answers' (posted with the context
/// `ANSWER`), which hand their buffers back to the pool.
fn serve_async(
    site: &Site,
    qp: Ud,
    srq: &SharedReceiveQueue,
    clients: &[UdEndpoint],
    size: usize,
    deadline: Instant,
) -> Result<Served, String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("a tokio runtime: {e}"))?;
    match qp {
        Ud::Raw(q) => rt.block_on(answer_all(site, *q, srq, clients, size, deadline)),
        Ud::Sched(q) => rt.block_on(answer_all(site, *q, srq, clients, size, deadline)),
    }
}

async fn answer_all<Q: AnswerOn>(
    site: &Site,
    qp: Q,
    srq: &SharedReceiveQueue,
    clients: &[UdEndpoint],
    size: usize,
    deadline: Instant,
) -> Result<Served, String> {
    let qp = AsyncQueuePair::new(qp).map_err(|e| format!("the async queue pair: {e}"))?;
    let mut desk = Desk::new(site, clients.len(), size)?;
    // Completions not handled yet, oldest first.
    let mut backlog: VecDeque<UdCompletion> = VecDeque::new();
    let mut found = Vec::new();
    // One timer for the whole run, not one per request.
    let end = tokio::time::sleep_until(tokio::time::Instant::from_std(deadline));
    tokio::pin!(end);
    while desk.served.byes < clients.len() as u32 {
        if backlog.is_empty() {
            // Every completion one wake found: the requests' answers go
            // out together, one batch.
            tokio::select! {
                n = qp.incoming_many(&mut found, INCOMING_AT_ONCE) => {
                    n.map_err(|e| format!("waiting for requests: {e}"))?;
                }
                _ = &mut end => break,
            }
            backlog.extend(found.drain(..));
        }
        while let Some(c) = backlog.pop_front() {
            if c.context == ANSWER {
                desk.pool.push(sent_back(c)?);
                continue;
            }
            let handle_to = |to: &UdEndpoint| qp.with(|q| q.handle_to(to));
            let Some(request) = desk.take(c, clients, srq, handle_to)? else {
                continue;
            };
            if desk.pool.is_empty() {
                // Every answer buffer is out or waits here: post the
                // waiting ones, then take completions until one is back,
                // keeping the requests for their turn.
                qp.with(|q| desk.post(q, ANSWER))?;
                while desk.pool.is_empty() {
                    qp.incoming_many(&mut found, INCOMING_AT_ONCE)
                        .await
                        .map_err(|e| format!("waiting for answers: {e}"))?;
                    for c in found.drain(..) {
                        if c.context == ANSWER {
                            desk.pool.push(sent_back(c)?);
                        } else {
                            backlog.push_back(c);
                        }
                    }
                }
            }
            desk.answer(&request)?;
        }
        // Posted with a context of this server's own: the completions
        // come through `incoming`, as the requests do, with no future or
        // task per answer.
        qp.with(|q| desk.post(q, ANSWER))?;
    }
    // The last answers go out before the queue pair does.
    let settle = tokio::time::Instant::now() + Duration::from_secs(1);
    while desk.pool.len() < SERVER_SEND_POOL {
        let c = tokio::select! {
            c = qp.incoming() => c.map_err(|e| format!("waiting for answers: {e}"))?,
            _ = tokio::time::sleep_until(settle) => break,
        };
        if c.context == ANSWER {
            desk.pool.push(sent_back(c)?);
        }
    }
    Ok(desk.served)
}

// ---------------------------------------------------------------- client

/// What one client thread measured.
#[derive(Default)]
struct Measured {
    latencies_us: Vec<f64>,
    lost: u64,
    late: u64,
}

fn client(o: &Opts) -> Result<(), String> {
    let site = Arc::new(Site::open(o)?);
    let mut registry = connect_registry(o, None)?;
    let threads: u32 = registry
        .wait_for_json(&format!("{}/threads", o.name), o.wait)
        .map_err(|e| format!("waiting for the server: {e}"))?;
    if threads == 0 {
        return Err(format!("{}/threads says 0 server threads", o.name));
    }
    let mut qps = Vec::new();
    for i in o.first..o.first + o.clients {
        let mut qp = site.queue_pair(CLIENT_RECVS, 4, None)?;
        let mtu = qp.mtu() as usize;
        if o.size > mtu {
            return Err(format!("--size {}: above the port's MTU, {mtu}", o.size));
        }
        for _ in 0..CLIENT_RECVS {
            qp.recv(site.buffer(mtu)?)?;
        }
        registry
            .publish_json(&format!("{}/client-{i}", o.name), &qp.endpoint())
            .map_err(|e| e.to_string())?;
        let server: UdEndpoint = registry
            .wait_for_json(&format!("{}/server-{}", o.name, i % threads), o.wait)
            .map_err(|e| format!("client {i} waiting for its server: {e}"))?;
        qps.push((i, qp, server));
    }
    println!(
        "rpc client: {} client(s) ({}..{}) on {} server queue pair(s), {} B messages, {}, on {}, path {:?}, {}",
        o.clients,
        o.first,
        o.first + o.clients - 1,
        threads.min(o.clients),
        o.size,
        if o.interval_us > 0 {
            format!("one request every {} us each", o.interval_us)
        } else {
            "closed loop".into()
        },
        o.device,
        o.path,
        site.describe()
    );
    let start_line = Arc::new(Barrier::new(qps.len()));
    let results: Vec<Result<(Measured, f64), String>> = std::thread::scope(|s| {
        let handles: Vec<_> = qps
            .into_iter()
            .map(|(i, qp, server)| {
                let (site, start_line) = (site.clone(), start_line.clone());
                s.spawn(move || ask(&site, qp, i, &server, o, &start_line))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err("a client thread panicked".into()))
            })
            .collect()
    });
    for i in o.first..o.first + o.clients {
        let _ = registry.remove(&format!("{}/client-{i}", o.name));
    }
    let mut all = Measured::default();
    let mut secs: f64 = 0.0;
    for r in results {
        let (m, s) = r?;
        all.latencies_us.extend(m.latencies_us);
        all.lost += m.lost;
        all.late += m.late;
        secs = secs.max(s);
    }
    report(o, &all, secs)
}

/// One client: warms up, then asks for `o.seconds`, then says bye.
/// Returns what it measured and how long it measured.
fn ask(
    site: &Site,
    mut qp: Ud,
    me: u32,
    server: &UdEndpoint,
    o: &Opts,
    start_line: &Barrier,
) -> Result<(Measured, f64), String> {
    let ah = qp.answers().handle_to(server)?;
    let mut send_buf = Some(site.buffer(o.size)?);
    let mut m = Measured::default();
    let mut seq = 0u64;
    let mut done = Vec::new();
    // One message out (a request or a bye) and its answer back; the time
    // it took, or None when no answer came within `timeout`.
    let mut one = |qp: &mut Ud, kind: u8, timeout: Duration, m: &mut Measured| {
        seq += 1;
        let mut mr = send_buf.take().ok_or("the send buffer is still posted")?;
        header(&mut mr, kind, me, seq)?;
        let sent = Instant::now();
        qp.answers()
            .answer(&ah, server, mr, o.size, 0)
            .map_err(|e| format!("client {me} sending: {e}"))?;
        let mut answered = None;
        while send_buf.is_none() || answered.is_none() {
            let left = timeout.saturating_sub(sent.elapsed());
            if left.is_zero() {
                break;
            }
            done.clear();
            qp.wait(&mut done, left)?;
            for c in done.drain(..) {
                if c.opcode != Opcode::Recv {
                    if !c.status.is_success() {
                        return Err(format!("client {me}: a send failed: {:?}", c.status));
                    }
                    send_buf = Some(c.region);
                    continue;
                }
                if !c.status.is_success() {
                    return Err(format!("client {me}: a receive failed: {:?}", c.status));
                }
                match read_header(&c) {
                    Some((RESPONSE, who, s)) if who == me && s == seq => {
                        answered = Some(sent.elapsed());
                    }
                    _ => m.late += 1,
                }
                qp.recv(c.region)?;
            }
        }
        if send_buf.is_none() {
            return Err(format!(
                "client {me}: a send did not complete in {timeout:?}"
            ));
        }
        Ok::<_, String>(answered)
    };
    // The first answer comes once the server has all its clients' names
    // (and never to a queue pair it does not know): ask again each second
    // until then, for as long as names are waited for (a datagram may be
    // lost).
    let first = Instant::now();
    while one(&mut qp, REQUEST, ANSWER_TIMEOUT, &mut m)?.is_none() {
        if first.elapsed() > o.wait {
            return Err(format!(
                "client {me}: no answer from server queue pair {} within {:?} (is this client one the server waits for?)",
                server.qpn, o.wait
            ));
        }
    }
    for _ in 1..WARMUP {
        one(&mut qp, REQUEST, ANSWER_TIMEOUT, &mut m)?;
    }
    let interval = Duration::from_micros(o.interval_us);
    // Requests at the measured pace, not counted, until the start file
    // appears (if one is given): the service is running when whatever it
    // is measured next to starts.
    if let Some(file) = &o.start_file {
        let mut next = Instant::now();
        while !file.exists() {
            pace(&mut next, interval);
            one(&mut qp, REQUEST, ANSWER_TIMEOUT, &mut m)?;
        }
    }
    m.late = 0;
    start_line.wait();
    let start = Instant::now();
    let run = Duration::from_secs_f64(o.seconds);
    let mut next = start;
    while start.elapsed() < run {
        pace(&mut next, interval);
        match one(&mut qp, REQUEST, ANSWER_TIMEOUT, &mut m)? {
            Some(t) => m.latencies_us.push(t.as_secs_f64() * 1e6),
            None => m.lost += 1,
        }
    }
    let secs = start.elapsed().as_secs_f64();
    // The server counts its clients out and answers each bye: a bye is
    // sent again while no answer comes (a datagram may be lost), a few
    // times (a server that heard every bye has stopped answering; one
    // that did not waits out its deadline and says how many it missed).
    for _ in 0..BYE_TRIES {
        if one(&mut qp, BYE, Duration::from_millis(200), &mut m)?.is_some() {
            break;
        }
    }
    Ok((m, secs))
}

/// Sleeps until `next` (if it is ahead) and moves it on by `interval`
/// (nothing with no interval: closed loop).
fn pace(next: &mut Instant, interval: Duration) {
    if interval.is_zero() {
        return;
    }
    let now = Instant::now();
    if *next > now {
        std::thread::sleep(*next - now);
    }
    *next += interval;
}

fn report(o: &Opts, m: &Measured, secs: f64) -> Result<(), String> {
    let mut sorted = m.latencies_us.clone();
    sorted.sort_by(f64::total_cmp);
    let pct = |p| mtrdma::sched::stats::percentile(&sorted, p).unwrap_or(f64::NAN);
    let n = sorted.len();
    let rps = n as f64 / secs;
    let (p50, p99, p999) = (pct(0.5), pct(0.99), pct(0.999));
    let max = sorted.last().copied().unwrap_or(f64::NAN);
    println!(
        "rpc client: {n} requests answered in {secs:.2} s: {rps:.0} per second; lost {}; late answers {}",
        m.lost, m.late
    );
    println!(
        "rpc client: latency us: p50 {p50:.1} p99 {p99:.1} p99.9 {p999:.1} max {max:.1} ({n} samples)"
    );
    if let Some(path) = &o.samples {
        let mut text = String::with_capacity(n * 8);
        for v in &m.latencies_us {
            let _ = writeln!(text, "{v:.2}");
        }
        std::fs::write(path, text).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    if let Some(path) = &o.csv {
        let text = format!(
            "clients,requests,seconds,rps,lost,late,p50_us,p99_us,p999_us,max_us\n\
             {},{n},{secs:.3},{rps:.1},{},{},{p50:.2},{p99:.2},{p999:.2},{max:.2}\n",
            o.clients, m.lost, m.late
        );
        std::fs::write(path, text).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    if n == 0 {
        return Err("no request was answered".into());
    }
    Ok(())
}

fn main() -> ExitCode {
    let o = match parse(args::Args::from_env()) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let r = if o.server { server(&o) } else { client(&o) };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rpc: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(words: &[&str]) -> Result<Opts, String> {
        parse(args::Args::from_args(words.iter().map(|s| s.to_string())))
    }

    #[test]
    fn command_lines_are_checked() {
        assert!(opts(&["server", "--device", "d", "--host-registry", "127.0.0.1:0"]).is_ok());
        assert!(opts(&["client", "--device", "d", "--registry", "h:1"]).is_ok());
        // A client's required flags, then `extra`.
        let client = |extra: &[&'static str]| -> Vec<&'static str> {
            ["client", "--device", "d", "--registry", "h:1"]
                .iter()
                .chain(extra)
                .copied()
                .collect()
        };
        let bad: Vec<Vec<&str>> = vec![
            vec![],
            vec!["serve"],
            vec!["server", "--device", "d"],
            vec!["client", "--device", "d"],
            vec!["client", "--registry", "h:1"],
            client(&["--size", "8"]),
            client(&["--clients", "0"]),
            client(&["--seconds", "0"]),
            client(&["--path", "x"]),
            client(&["--name", "a b"]),
            vec![
                "server",
                "--device",
                "d",
                "--registry",
                "h:1",
                "--host-registry",
                "h:2",
            ],
        ];
        for words in &bad {
            assert!(opts(words).is_err(), "{words:?} was accepted");
        }
    }
}
