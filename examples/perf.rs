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
//! cargo build --release --example perf
//! cargo xtask vm -- target/release/examples/perf --loopback --test write_lat -s 16
//! ```
//!
//! Units are perftest's: BW in MB/sec with MB = 2^20 bytes (perftest's
//! default `MBS` report format), message rate in millions of messages per
//! second, latency in microseconds. Latencies of `write_lat` and `send_lat`
//! are ping-pong round trips halved; `read_lat` reports the time from
//! posting a READ to its completion. As in perftest, the two largest latency
//! samples are dropped before the statistics, and `t_typical` is the median.
//!
//! The client sends the test parameters to the server over the TCP control
//! connection; a server given explicit flags refuses a client that asks for
//! something else. Endpoints and remote regions are swapped with
//! [`mtrdma::verbs::exchange`] on a second, short-lived TCP connection per
//! message size (a fresh queue pair for every size, so receives posted for
//! one size never meet the next).

#[path = "shared/args.rs"]
mod args;

use std::fmt::Write as _;
use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use mtrdma::core::coordinator::register;
use mtrdma::core::{
    AdmissionError, LinkConfig, Policy, QuotaTable, RateLimit, TenantEntry, TenantHandle, TenantId,
    TrafficClass,
};
use mtrdma::sched::{DelayWindowConfig, Nanos};
use mtrdma::verbs::exchange::{exchange, Handshake};
use mtrdma::verbs::{
    Access, Completion, Context, Endpoint, Gid, GidSelection, MemoryRegion, PreparedQueuePair,
    ProtectionDomain, QueuePair, RemoteRegion, ScheduleConfig, ScheduledQueuePair, SendOp, Tenancy,
};

const HELP: &str = "\
perf: perftest-style RDMA bandwidth and latency tests on mtrdma

USAGE:
    perf --server [OPTIONS]              wait for one client
    perf --connect HOST [OPTIONS]        run against a server (or: perf [OPTIONS] HOST)
    perf --loopback [OPTIONS]            both sides in this process, over 127.0.0.1

TEST:
    --test NAME          write_bw | read_bw | send_bw | write_lat | read_lat | send_lat |
                         write_comp_lat (a WRITE from post to its completion, the
                         responder's ACK: the round trip through the link, with no
                         process spinning on the far side)
                         (client default write_bw; a server takes the client's)
    --path PATH          mtrdma: sends go through ScheduledQueuePair (default)
                         raw: plain QueuePair::post_send
    -s, --size BYTES     message size (default 65536 for bw, 2 for lat; 4K, 64KiB, 1M accepted)
    -a, --all            sweep 2 B .. 8 MiB by powers of two
    -n, --iters N        iterations per size (default 5000 for bw, 1000 for lat)
    -D, --duration SECS  run each size for SECS seconds instead of -n
    -t, --tx-depth N     outstanding requests in bw tests (default 128)
    --chunk BYTES        scheduled path: WRITE/READ chunk size (default 65536)
    --pieces N           scheduled path: pieces in the NIC at once (default 4,
                         the library default)
    --window             scheduled path: this side's bulk pieces follow a delay-based
                         window (protects latency tenants in other processes on the
                         same port; use a --chunk of one or a few MTUs)
    --window-target PPM  with --window: the queue the window allows, as a share of
                         the path's own delay in parts per million (default
                         1000000; at least the floor, --window-floor)
    --window-floor USEC  with --window: the least queue the window allows, in
                         microseconds (default 800: a sender woken by completion
                         events sees that much noise on a busy host); used while
                         no link rate is measured
    --window-queue BYTES with --window and --coordinator: the queue the window
                         allows in bytes at the link rate the coordinator measures
                         (default 10240), in place of the floor
    --class CLASS        scheduled path: latency | bulk (default: the tenant's class
                         from --policy, else bulk)
    --wait               sleep on the completion channel while no buffer is free,
                         and in read_lat and write_comp_lat while the request is
                         out (instead of spinning on the completion queue): many
                         tenant processes can then share a few CPUs
    --interval USEC      latency tests: start one request every USEC microseconds
                         (an open-loop probe, as a service's requests arrive)
                         instead of back to back; the samples are the same
    --ack-timeout EXP    local ACK timeout 4.096 us x 2^EXP (default 14, ~67 ms): a
                         bulk sender with long queues ahead of it needs more
    -I, --inline-size N  sends up to N bytes go inline (default 220 for write_lat and
                         send_lat, like perftest; 0 otherwise)
    --pool-mib N         memory for outstanding buffers, per pool (default 64):
                         a bw test keeps min(tx-depth, pool / size) requests out

TENANT (scheduled path rate limits; QP creation admitted on both paths):
    --policy FILE        an mtrdma policy file (TOML), opened as an embedded quota table
    --tenant NAME        the tenant of FILE to attach as (optional if FILE has one tenant)
    --cap-mbps X         byte-rate cap of X MB/sec (MB = 2^20 bytes, the report's unit):
                         alone, a one-tenant policy; with --policy, overrides the tenant's cap
    --coordinator SOCKET join the coordinator listening on SOCKET: it decides this
                         process's tenant from its credentials (uid, gid, cgroup), and
                         the tenant's quotas, rates and class come from its table

CONNECTION:
    --port P             TCP port (default 18516)
    --device NAME        RDMA device (default: first active)

OUTPUT:
    --csv FILE           append one line per size with every column
    --samples FILE       latency tests: write every sample (usec, as reported: halved
                         round trips for write_lat/send_lat), one per line, each size
                         after a line `# SIZE B`
    -h, --help           this text

Reports use perftest's units: MB/sec with MB = 2^20 bytes, MsgRate in 10^6
messages/s, latency in usec (write_lat/send_lat: round trip / 2).
";

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
// Command line
// ---------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Test {
    WriteBw,
    ReadBw,
    SendBw,
    WriteLat,
    ReadLat,
    SendLat,
    WriteCompLat,
}

impl Test {
    const ALL: [Test; 7] = [
        Test::WriteBw,
        Test::ReadBw,
        Test::SendBw,
        Test::WriteLat,
        Test::ReadLat,
        Test::SendLat,
        Test::WriteCompLat,
    ];

    fn name(self) -> &'static str {
        match self {
            Test::WriteBw => "write_bw",
            Test::ReadBw => "read_bw",
            Test::SendBw => "send_bw",
            Test::WriteLat => "write_lat",
            Test::ReadLat => "read_lat",
            Test::SendLat => "send_lat",
            Test::WriteCompLat => "write_comp_lat",
        }
    }

    fn parse(s: &str) -> Result<Test, String> {
        Test::ALL
            .into_iter()
            .find(|t| t.name() == s)
            .ok_or_else(|| {
                format!(
                    "unknown test {s:?}; expected one of: {}",
                    Test::ALL.map(Test::name).join(", ")
                )
            })
    }

    fn is_bw(self) -> bool {
        matches!(self, Test::WriteBw | Test::ReadBw | Test::SendBw)
    }

    /// perftest's title line.
    fn title(self) -> &'static str {
        match self {
            Test::WriteBw => "RDMA_Write BW Test",
            Test::ReadBw => "RDMA_Read BW Test",
            Test::SendBw => "Send BW Test",
            Test::WriteLat => "RDMA_Write Latency Test",
            Test::ReadLat => "RDMA_Read Latency Test",
            Test::SendLat => "Send Latency Test",
            Test::WriteCompLat => "RDMA_Write Completion Latency Test",
        }
    }

    fn verb(self) -> &'static str {
        match self {
            Test::WriteBw | Test::WriteLat | Test::WriteCompLat => "RDMA WRITE",
            Test::ReadBw | Test::ReadLat => "RDMA READ",
            Test::SendBw | Test::SendLat => "SEND",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PathKind {
    Mtrdma,
    Raw,
}

impl PathKind {
    fn name(self) -> &'static str {
        match self {
            PathKind::Mtrdma => "mtrdma",
            PathKind::Raw => "raw",
        }
    }

    fn parse(s: &str) -> Result<PathKind, String> {
        match s {
            "mtrdma" | "scheduled" => Ok(PathKind::Mtrdma),
            "raw" => Ok(PathKind::Raw),
            _ => Err(format!("unknown path {s:?}; expected mtrdma or raw")),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Mode {
    Server,
    Client(String),
    Loopback,
}

/// The command line as given (`None`: not given, so a server may take the
/// client's value).
#[derive(Debug, Clone, Default)]
struct Args {
    test: Option<Test>,
    path: Option<PathKind>,
    size: Option<usize>,
    all: bool,
    iters: Option<u64>,
    duration: Option<Duration>,
    tx_depth: Option<u32>,
    chunk: Option<u64>,
    pieces: Option<u32>,
    inline: Option<u32>,
    pool_mib: Option<u64>,
    policy: Option<PathBuf>,
    tenant: Option<String>,
    cap_mbps: Option<f64>,
    mode: Option<Mode>,
    port: Option<u16>,
    csv: Option<PathBuf>,
    samples: Option<PathBuf>,
    device: Option<String>,
    window: bool,
    window_target_ppm: Option<u32>,
    window_floor: Option<Nanos>,
    window_queue: Option<u64>,
    class: Option<TrafficClass>,
    ack_timeout: Option<u8>,
    coordinator: Option<PathBuf>,
    wait: bool,
    interval: Option<Duration>,
}

enum Parsed {
    Help,
    Run(Box<Args>),
}

/// A size in bytes: `65536`, `64K`, `64KiB`, `1M`, `1MiB` (K and M are
/// powers of 1024, as perftest's sizes are).
fn parse_size(flag: &str, s: &str) -> Result<usize, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let mult: usize = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        _ => {
            return Err(format!(
                "{flag}: cannot read {s:?} as a size (e.g. 65536, 64K, 1M)"
            ))
        }
    };
    let n: usize = num
        .parse()
        .map_err(|_| format!("{flag}: cannot read {s:?} as a size (e.g. 65536, 64K, 1M)"))?;
    n.checked_mul(mult)
        .ok_or_else(|| format!("{flag}: {s:?} is too large"))
}

fn parse_num<T: std::str::FromStr>(flag: &str, s: &str, what: &str) -> Result<T, String> {
    s.trim()
        .parse()
        .map_err(|_| format!("{flag}: cannot read {s:?} as {what}"))
}

fn parse_args(raw: impl IntoIterator<Item = String>) -> Result<Parsed, String> {
    let mut a = Args::default();
    let mut it = args::Args::from_args(raw);
    let set_mode = |a: &mut Args, m: Mode| -> Result<(), String> {
        if let Some(old) = &a.mode {
            if *old != m {
                return Err(
                    "choose one of --server, --connect HOST (or a HOST argument) and --loopback"
                        .into(),
                );
            }
        }
        a.mode = Some(m);
        Ok(())
    };
    while let Some(token) = it.next()? {
        let flag = match token {
            args::Token::Flag(flag) => flag,
            // A plain argument is the server to connect to.
            args::Token::Value(host) => {
                set_mode(&mut a, Mode::Client(host))?;
                continue;
            }
        };
        let mut value = || it.value(&flag);
        match flag.as_str() {
            "-h" | "--help" => return Ok(Parsed::Help),
            "--test" => a.test = Some(Test::parse(&value()?)?),
            "--path" => a.path = Some(PathKind::parse(&value()?)?),
            "-s" | "--size" => a.size = Some(parse_size(&flag, &value()?)?),
            "-a" | "--all" => a.all = true,
            "-n" | "--iters" => a.iters = Some(parse_num(&flag, &value()?, "a count")?),
            "-D" | "--duration" => {
                let secs: f64 = parse_num(&flag, &value()?, "seconds")?;
                if !(secs.is_finite() && secs > 0.0 && secs <= 86_400.0) {
                    return Err(format!("{flag}: give 0 < SECS <= 86400"));
                }
                a.duration = Some(Duration::from_secs_f64(secs));
            }
            "-t" | "--tx-depth" => a.tx_depth = Some(parse_num(&flag, &value()?, "a count")?),
            "--chunk" => a.chunk = Some(parse_size(&flag, &value()?)? as u64),
            "--pieces" => a.pieces = Some(parse_num(&flag, &value()?, "a count")?),
            "--window" => a.window = true,
            "--window-target" => {
                let ppm: u32 = parse_num(&flag, &value()?, "parts per million")?;
                if !(1..=100_000_000).contains(&ppm) {
                    return Err(format!("{flag}: give 1 <= PPM <= 100000000"));
                }
                a.window_target_ppm = Some(ppm);
            }
            "--window-floor" => {
                let us: u64 = parse_num(&flag, &value()?, "microseconds")?;
                if us > 10_000_000 {
                    return Err(format!("{flag}: give at most 10000000 us (10 s)"));
                }
                a.window_floor = Some(Nanos::from_micros(us));
            }
            "--window-queue" => {
                let bytes = parse_size(&flag, &value()?)? as u64;
                if bytes == 0 {
                    return Err(format!("{flag} must be at least 1 byte"));
                }
                a.window_queue = Some(bytes);
            }
            "--wait" => a.wait = true,
            "--interval" => {
                let us: u64 = parse_num(&flag, &value()?, "microseconds")?;
                if !(1..=10_000_000).contains(&us) {
                    return Err(format!("{flag} {us}: 1 ..= 10000000 microseconds"));
                }
                a.interval = Some(Duration::from_micros(us));
            }
            "--coordinator" => a.coordinator = Some(PathBuf::from(value()?)),
            "--class" => {
                a.class = Some(match value()?.as_str() {
                    "latency" => TrafficClass::Latency,
                    "bulk" => TrafficClass::Bulk,
                    other => return Err(format!("--class {other}: latency or bulk")),
                })
            }
            "--ack-timeout" => {
                let exp: u8 = parse_num(&flag, &value()?, "an exponent 0 ..= 31")?;
                if exp > 31 {
                    return Err(format!("--ack-timeout {exp}: at most 31"));
                }
                a.ack_timeout = Some(exp);
            }
            "-I" | "--inline-size" => a.inline = Some(parse_num(&flag, &value()?, "a size")?),
            "--pool-mib" => a.pool_mib = Some(parse_num(&flag, &value()?, "MiB")?),
            "--policy" => a.policy = Some(PathBuf::from(value()?)),
            "--tenant" => a.tenant = Some(value()?),
            "--cap-mbps" => {
                let x: f64 = parse_num(&flag, &value()?, "MB/sec")?;
                if !(x.is_finite() && x > 0.0 && x * MIB < 1e18) {
                    return Err(format!("{flag}: give a positive rate in MB/sec"));
                }
                a.cap_mbps = Some(x);
            }
            "--server" => set_mode(&mut a, Mode::Server)?,
            "--connect" => {
                let host = value()?;
                set_mode(&mut a, Mode::Client(host))?
            }
            "--loopback" => set_mode(&mut a, Mode::Loopback)?,
            "-p" | "--port" => a.port = Some(parse_num(&flag, &value()?, "a TCP port")?),
            "--csv" => a.csv = Some(PathBuf::from(value()?)),
            "--samples" => a.samples = Some(PathBuf::from(value()?)),
            "-d" | "--device" | "--ib-dev" => a.device = Some(value()?),
            f => return Err(format!("unknown flag {f} (see --help)")),
        }
    }
    check_args(&a)?;
    Ok(Parsed::Run(Box::new(a)))
}

fn check_args(a: &Args) -> Result<(), String> {
    if a.mode.is_none() {
        return Err(
            "choose a mode: --server, --connect HOST (or a HOST argument) or --loopback (see --help)"
                .into(),
        );
    }
    if a.size.is_some() && a.all {
        return Err("give either -s/--size or -a/--all, not both".into());
    }
    if a.iters.is_some() && a.duration.is_some() {
        return Err("give either -n/--iters or -D/--duration, not both".into());
    }
    if let Some(s) = a.size {
        if s == 0 || s > u32::MAX as usize {
            return Err(format!("-s/--size must be 1 ..= {} bytes", u32::MAX));
        }
    }
    if a.iters == Some(0) {
        return Err("-n/--iters must be at least 1".into());
    }
    if let Some(t) = a.tx_depth {
        if !(1..=16_384).contains(&t) {
            return Err("-t/--tx-depth must be 1 ..= 16384".into());
        }
    }
    if a.chunk == Some(0) {
        return Err("--chunk must be at least 1 byte".into());
    }
    if a.pieces == Some(0) {
        return Err("--pieces must be at least 1".into());
    }
    if let Some(m) = a.pool_mib {
        if !(1..=65_536).contains(&m) {
            return Err("--pool-mib must be 1 ..= 65536".into());
        }
    }
    if a.coordinator.is_some() && (a.policy.is_some() || a.tenant.is_some() || a.cap_mbps.is_some())
    {
        return Err(
            "--coordinator decides the tenant and its limits: leave out --policy, --tenant and --cap-mbps"
                .into(),
        );
    }
    if a.tenant.is_some() && a.policy.is_none() {
        return Err("--tenant needs --policy FILE (or use --cap-mbps alone)".into());
    }
    if a.port == Some(0) && a.mode != Some(Mode::Loopback) {
        return Err("--port must be 1 ..= 65535".into());
    }
    if matches!(a.mode, Some(Mode::Server)) && (a.csv.is_some() || a.samples.is_some()) {
        return Err("--csv and --samples are for the client (it is the side that reports)".into());
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Parameters both sides agree on
// ---------------------------------------------------------------------------

#[derive(Debug, Clone, PartialEq)]
struct Params {
    test: Test,
    path: PathKind,
    sizes: Vec<usize>,
    iters: u64,
    /// 0: run `iters` iterations; otherwise milliseconds per size.
    duration_ms: u64,
    tx_depth: u32,
    chunk: u64,
    pieces: u32,
    /// Sends up to this many bytes go inline.
    inline: u32,
}

fn all_sizes() -> Vec<usize> {
    (1..=23).map(|p| 1usize << p).collect()
}

impl Params {
    fn from_args(a: &Args) -> Params {
        let test = a.test.unwrap_or(Test::WriteBw);
        let sizes = if a.all {
            all_sizes()
        } else {
            vec![a.size.unwrap_or(if test.is_bw() { 65_536 } else { 2 })]
        };
        Params {
            test,
            path: a.path.unwrap_or(PathKind::Mtrdma),
            sizes,
            iters: a.iters.unwrap_or(if test.is_bw() { 5000 } else { 1000 }),
            duration_ms: a.duration.map_or(0, |d| d.as_millis().max(1) as u64),
            tx_depth: a.tx_depth.unwrap_or(128),
            chunk: a.chunk.unwrap_or(ScheduleConfig::default().chunk_bytes),
            pieces: a
                .pieces
                .unwrap_or(ScheduleConfig::default().max_pieces_in_flight),
            // perftest's default: 220 B inline for WRITE and SEND latency.
            inline: a.inline.unwrap_or(match test {
                Test::WriteLat | Test::SendLat | Test::WriteCompLat => DEFAULT_INLINE,
                _ => 0,
            }),
        }
    }

    fn duration(&self) -> Option<Duration> {
        (self.duration_ms > 0).then(|| Duration::from_millis(self.duration_ms))
    }

    fn encode(&self) -> String {
        let sizes: Vec<String> = self.sizes.iter().map(|s| s.to_string()).collect();
        format!(
            "{PROTOCOL} test={} path={} sizes={} iters={} duration_ms={} tx_depth={} chunk={} pieces={} inline={}",
            self.test.name(),
            self.path.name(),
            sizes.join(","),
            self.iters,
            self.duration_ms,
            self.tx_depth,
            self.chunk,
            self.pieces,
            self.inline
        )
    }

    fn decode(line: &str) -> Result<Params, String> {
        let mut words = line.split_whitespace();
        match words.next() {
            Some(PROTOCOL) => {}
            Some(p) if p.starts_with("mtrdma-perf/") => {
                return Err(format!(
                "the client speaks {p}, this server {PROTOCOL}: use the same build on both sides"
            ))
            }
            _ => return Err("the peer is not an mtrdma perf client".into()),
        }
        let mut p = Params {
            test: Test::WriteBw,
            path: PathKind::Mtrdma,
            sizes: Vec::new(),
            iters: 0,
            duration_ms: 0,
            tx_depth: 0,
            chunk: 0,
            pieces: 0,
            inline: 0,
        };
        let bad = |k: &str, v: &str| format!("the client sent a bad parameter {k}={v:?}");
        for w in words {
            let (k, v) = w
                .split_once('=')
                .ok_or_else(|| format!("the client sent a bad parameter {w:?}"))?;
            match k {
                "test" => p.test = Test::parse(v)?,
                "path" => p.path = PathKind::parse(v)?,
                "sizes" => {
                    p.sizes = v
                        .split(',')
                        .map(|s| s.parse::<usize>())
                        .collect::<Result<_, _>>()
                        .map_err(|_| bad(k, v))?
                }
                "iters" => p.iters = v.parse().map_err(|_| bad(k, v))?,
                "duration_ms" => p.duration_ms = v.parse().map_err(|_| bad(k, v))?,
                "tx_depth" => p.tx_depth = v.parse().map_err(|_| bad(k, v))?,
                "chunk" => p.chunk = v.parse().map_err(|_| bad(k, v))?,
                "pieces" => p.pieces = v.parse().map_err(|_| bad(k, v))?,
                "inline" => p.inline = v.parse().map_err(|_| bad(k, v))?,
                _ => {} // a newer client's extra setting: ignored
            }
        }
        let sizes_ok = !p.sizes.is_empty()
            && p.sizes.len() <= 64
            && p.sizes.iter().all(|&s| s >= 1 && s <= u32::MAX as usize);
        if !sizes_ok
            || (p.iters == 0 && p.duration_ms == 0)
            || !(1..=16_384).contains(&p.tx_depth)
            || p.chunk == 0
            || p.pieces == 0
        {
            return Err(format!("the client sent invalid parameters: {line}"));
        }
        Ok(p)
    }

    /// The parameters a server runs with: the client's, unless the server
    /// was given a different value explicitly.
    fn agree(server: &Args, client: Params) -> Result<Params, String> {
        let mut diffs = Vec::new();
        let mut check = |what: &str, mine: Option<String>, theirs: String| {
            if let Some(m) = mine {
                if m != theirs {
                    diffs.push(format!("{what}: server {m}, client {theirs}"));
                }
            }
        };
        check(
            "test",
            server.test.map(|t| t.name().to_string()),
            client.test.name().to_string(),
        );
        check(
            "path",
            server.path.map(|p| p.name().to_string()),
            client.path.name().to_string(),
        );
        let sizes = |v: &[usize]| {
            v.iter()
                .map(|s| s.to_string())
                .collect::<Vec<_>>()
                .join(",")
        };
        let my_sizes = if server.all {
            Some(sizes(&all_sizes()))
        } else {
            server.size.map(|s| s.to_string())
        };
        check("sizes", my_sizes, sizes(&client.sizes));
        let client_run = if client.duration_ms > 0 {
            format!("{} ms", client.duration_ms)
        } else {
            format!("{} iterations", client.iters)
        };
        let my_run = match (server.iters, server.duration) {
            (Some(n), _) => Some(format!("{n} iterations")),
            (_, Some(d)) => Some(format!("{} ms", d.as_millis().max(1))),
            _ => None,
        };
        check("length", my_run, client_run);
        check(
            "tx depth",
            server.tx_depth.map(|t| t.to_string()),
            client.tx_depth.to_string(),
        );
        check(
            "chunk",
            server.chunk.map(|c| c.to_string()),
            client.chunk.to_string(),
        );
        check(
            "pieces",
            server.pieces.map(|c| c.to_string()),
            client.pieces.to_string(),
        );
        check(
            "inline size",
            server.inline.map(|c| c.to_string()),
            client.inline.to_string(),
        );
        if diffs.is_empty() {
            Ok(client)
        } else {
            Err(format!(
                "server and client disagree ({}); give the same flags on both sides, or none on the server",
                diffs.join("; ")
            ))
        }
    }
}

// ---------------------------------------------------------------------------
// Tenant
// ---------------------------------------------------------------------------

/// The tenant handle (if any) and a description for the header.
fn tenant_handle(a: &Args, chunk: u64) -> Result<Option<(TenantHandle, String)>, String> {
    if let Some(socket) = &a.coordinator {
        let handle = register(socket).map_err(|e| {
            format!(
                "registering with the coordinator at {}: {e}",
                socket.display()
            )
        })?;
        let desc = format!(
            "{} (id {}, {:?} class, decided by the coordinator at {})",
            handle.name(),
            handle.tenant().0,
            handle.class(),
            socket.display()
        );
        return Ok(Some((handle, desc)));
    }
    let cap = a.cap_mbps.map(|x| {
        RateLimit::new(
            (x * MIB).round().max(1.0) as u64,
            chunk.max(64 << 10), // one chunk may go back-to-back
        )
    });
    let (policy, id) = match (&a.policy, cap) {
        (None, None) => return Ok(None),
        (None, Some(cap)) => {
            let policy = Policy::new(
                LinkConfig::new(12_500_000_000), // 100 Gbit/s: only the cap binds
                vec![TenantEntry::new(TenantId(1), "perf").with_rate(cap)],
            );
            (policy, TenantId(1))
        }
        (Some(file), cap) => {
            let mut policy =
                Policy::from_file(file).map_err(|e| format!("policy {}: {e}", file.display()))?;
            let names = || {
                policy
                    .tenants
                    .iter()
                    .map(|t| t.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            let index = match &a.tenant {
                Some(name) => policy
                    .tenants
                    .iter()
                    .position(|t| &t.name == name)
                    .ok_or_else(|| {
                        format!(
                            "policy {} has no tenant {name:?}; it has: {}",
                            file.display(),
                            names()
                        )
                    })?,
                None if policy.tenants.len() == 1 => 0,
                None => {
                    return Err(format!(
                        "policy {} has several tenants ({}); choose one with --tenant NAME",
                        file.display(),
                        names()
                    ))
                }
            };
            if let Some(cap) = cap {
                policy.tenants[index].schedule.byte_cap = Some(cap);
            }
            let id = policy.tenants[index].id;
            (policy, id)
        }
    };
    let table = QuotaTable::embedded(&policy).map_err(|e| format!("quota table: {e}"))?;
    let handle = table
        .attach(id)
        .map_err(|e| format!("attaching as tenant {}: {e}", id.0))?;
    let t = policy.tenant(id).cloned().unwrap_or_else(|| {
        // `attach` found it, so the policy has it; keep a sane fallback.
        TenantEntry::new(id, "?")
    });
    let mut desc = format!(
        "{} (id {}, {:?} class, weight {}",
        t.name, id.0, t.class, t.schedule.weight
    );
    match t.schedule.byte_cap {
        Some(r) => {
            let _ = write!(
                desc,
                ", cap {:.2} MB/sec, burst {} B",
                r.per_second as f64 / MIB,
                r.burst
            );
        }
        None => desc.push_str(", no byte-rate cap"),
    }
    if let Some(r) = t.schedule.wr_cap {
        let _ = write!(desc, ", {} WR/s cap", r.per_second);
    }
    desc.push(')');
    Ok(Some((handle, desc)))
}

// ---------------------------------------------------------------------------
// Control connection: short text lines, read without buffering ahead
// ---------------------------------------------------------------------------

struct Ctrl {
    stream: TcpStream,
    partial: Vec<u8>,
    nonblocking: bool,
    peer: String,
}

impl Ctrl {
    fn new(stream: TcpStream, peer: String) -> Ctrl {
        let _ = stream.set_nodelay(true);
        Ctrl {
            stream,
            partial: Vec::new(),
            nonblocking: false,
            peer,
        }
    }

    fn send(&mut self, line: &str) -> Result<(), String> {
        self.set_nonblocking(false)?;
        self.stream
            .write_all(format!("{line}\n").as_bytes())
            .map_err(|e| format!("sending to {}: {e}", self.peer))
    }

    fn set_nonblocking(&mut self, on: bool) -> Result<(), String> {
        if self.nonblocking != on {
            self.stream
                .set_nonblocking(on)
                .map_err(|e| format!("control connection: {e}"))?;
            self.nonblocking = on;
        }
        Ok(())
    }

    /// Reads what has arrived; a whole line if there is one.
    fn read_some(&mut self) -> Result<Option<String>, std::io::Error> {
        let mut byte = [0u8; 1];
        loop {
            match self.stream.read(&mut byte) {
                Ok(0) => {
                    return Err(std::io::Error::new(
                        ErrorKind::UnexpectedEof,
                        "the peer closed the connection",
                    ))
                }
                Ok(_) if byte[0] == b'\n' => {
                    let line = String::from_utf8_lossy(&self.partial).trim().to_string();
                    self.partial.clear();
                    return Ok(Some(line));
                }
                Ok(_) => {
                    if self.partial.len() >= 4096 {
                        return Err(std::io::Error::new(
                            ErrorKind::InvalidData,
                            "the peer sent a line longer than 4096 bytes",
                        ));
                    }
                    self.partial.push(byte[0]);
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// A whole line, waiting at most `timeout` (`None`: forever).
    fn recv(&mut self, timeout: Option<Duration>) -> Result<String, String> {
        self.set_nonblocking(false)?;
        self.stream
            .set_read_timeout(timeout)
            .map_err(|e| format!("control connection: {e}"))?;
        match self.read_some() {
            Ok(Some(line)) => Ok(line),
            Ok(None) => Err(format!("no message from {}", self.peer)),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => Err(
                format!("timed out after {timeout:?} waiting for {}", self.peer),
            ),
            Err(e) => Err(format!("control connection to {}: {e}", self.peer)),
        }
    }

    /// A line if one has arrived, without waiting.
    fn try_recv(&mut self) -> Result<Option<String>, String> {
        self.set_nonblocking(true)?;
        match self.read_some() {
            Ok(line) => Ok(line),
            Err(e) if e.kind() == ErrorKind::WouldBlock => Ok(None),
            Err(e) => Err(format!("control connection to {}: {e}", self.peer)),
        }
    }

    /// Waits for `word`; an `ERR ...` line from the peer becomes the error.
    fn expect(&mut self, word: &str, timeout: Option<Duration>) -> Result<String, String> {
        let line = self.recv(timeout)?;
        check_line(&line, word, &self.peer)?;
        Ok(line)
    }
}

/// `Ok` if `line` starts with `word`; the peer's error if it is `ERR ...`.
fn check_line(line: &str, word: &str, peer: &str) -> Result<(), String> {
    if let Some(msg) = line.strip_prefix("ERR ") {
        return Err(format!("{peer} reported: {msg}"));
    }
    if line.split_whitespace().next() == Some(word) {
        Ok(())
    } else {
        Err(format!(
            "protocol error: expected {word} from {peer}, got {line:?}"
        ))
    }
}

// ---------------------------------------------------------------------------
// Queue pairs: the two paths behind one interface
// ---------------------------------------------------------------------------

enum Qp {
    Raw(QueuePair),
    Sched(Box<ScheduledQueuePair>),
}

impl Qp {
    fn post_send(
        &mut self,
        op: SendOp,
        region: MemoryRegion,
        len: usize,
        context: u64,
    ) -> Result<(), String> {
        let r = match self {
            Qp::Raw(q) => q.post_send(op, region, 0..len, context),
            Qp::Sched(q) => q.post_send(op, region, 0..len, context),
        };
        r.map_err(|e| format!("posting {}: {e}", op_verb(op)))
    }

    fn post_recv(&mut self, region: MemoryRegion, len: usize) -> Result<(), String> {
        let r = match self {
            Qp::Raw(q) => q.post_recv(region, 0..len, RECV_CTX),
            Qp::Sched(q) => q.post_recv(region, 0..len, RECV_CTX),
        };
        r.map_err(|e| format!("posting a receive: {e}"))
    }

    fn poll(&mut self, out: &mut Vec<Completion>) -> Result<usize, String> {
        let r = match self {
            Qp::Raw(q) => q.poll(out),
            Qp::Sched(q) => q.poll(out),
        };
        r.map_err(|e| format!("polling the completion queue: {e}"))
    }

    fn poll_wait(&mut self, out: &mut Vec<Completion>, timeout: Duration) -> Result<usize, String> {
        let r = match self {
            Qp::Raw(q) => q.poll_wait(out, timeout),
            Qp::Sched(q) => q.poll_wait(out, timeout),
        };
        r.map_err(|e| format!("waiting for completions: {e}"))
    }
}

fn op_verb(op: SendOp) -> &'static str {
    match op {
        SendOp::Send | SendOp::SendWithImm(_) => "a SEND",
        SendOp::Write(_) | SendOp::WriteWithImm(..) => "an RDMA WRITE",
        SendOp::Read(_) => "an RDMA READ",
    }
}

/// One connected queue pair and its buffers, for one message size.
struct Conn {
    qp: Qp,
    /// Our region the peer WRITEs into or READs from.
    target: MemoryRegion,
    /// The peer's region of `size` bytes.
    remote: RemoteRegion,
    /// Buffers not posted: sends (and READ destinations) take them.
    pool: Vec<MemoryRegion>,
    /// Receive completions seen (each receive is posted again).
    recvs: u64,
    size: usize,
    local: Endpoint,
    peer: Endpoint,
    out: Vec<Completion>,
    /// Sleep on the completion channel while no buffer is free.
    wait: bool,
    /// The window, sampled during a bandwidth run.
    window_samples: WindowSamples,
}

/// A scheduled queue pair's window sampled every [`WINDOW_SAMPLE_NS`]
/// during a bandwidth run: what it averaged, not only where it ended.
#[derive(Debug, Default)]
struct WindowSamples {
    n: u64,
    window: u64,
    in_flight: u64,
    /// Samples whose bytes in flight left no room for another piece.
    bound: u64,
    /// Sum of the smoothed delays (ns) of the samples that had one.
    smoothed: u64,
    with_delay: u64,
    last_ns: u64,
}

/// How often a bandwidth run samples its window.
const WINDOW_SAMPLE_NS: u64 = 5_000_000;

impl WindowSamples {
    /// Samples `w` if [`WINDOW_SAMPLE_NS`] passed since the last sample
    /// (`now_ns` since the run's start), for pieces of `piece` bytes.
    fn sample(&mut self, now_ns: u64, w: Option<mtrdma::verbs::WindowState>, piece: u64) {
        let Some(w) = w else { return };
        if self.n > 0 && now_ns < self.last_ns + WINDOW_SAMPLE_NS {
            return;
        }
        self.last_ns = now_ns;
        self.n += 1;
        self.window += w.window_bytes;
        self.in_flight += w.in_flight_bytes;
        if w.in_flight_bytes + piece > w.window_bytes {
            self.bound += 1;
        }
        if let Some(d) = w.smoothed_delay {
            self.smoothed += d.0;
            self.with_delay += 1;
        }
    }

    /// One line for the report, or none without samples.
    fn summary(&self) -> Option<String> {
        if self.n == 0 {
            return None;
        }
        let n = self.n as f64;
        let delay = if self.with_delay == 0 {
            "-".to_string()
        } else {
            format!("{:.1}", self.smoothed as f64 / self.with_delay as f64 / 1e3)
        };
        Some(format!(
            " window over the run ({} samples): mean {:.0} B, in flight mean {:.0} B, no room for a piece in {:.0}% of samples, smoothed delay mean {delay} us",
            self.n,
            self.window as f64 / n,
            self.in_flight as f64 / n,
            100.0 * self.bound as f64 / n,
        ))
    }
}

impl Conn {
    /// Polls once: send buffers go back to the pool, receives are posted
    /// again. Returns the number of send-side completions. With `wait`
    /// and no buffer free, sleeps until a completion comes (at most
    /// [`WAIT_SLICE`]) rather than spinning.
    fn progress(&mut self, test: Test) -> Result<usize, String> {
        let block = self.wait && self.pool.is_empty();
        self.progress_blocking(test, block)
    }

    /// [`Conn::progress`], sleeping on the completion channel (at most
    /// [`WAIT_SLICE`]) if `block`.
    fn progress_blocking(&mut self, test: Test, block: bool) -> Result<usize, String> {
        let mut out = std::mem::take(&mut self.out);
        if block {
            self.qp.poll_wait(&mut out, WAIT_SLICE)?;
        } else {
            self.qp.poll(&mut out)?;
        }
        let mut sends = 0;
        for c in out.drain(..) {
            if !c.status.is_success() {
                let what = if c.context == RECV_CTX {
                    "a receive"
                } else {
                    test.verb()
                };
                return Err(format!("{what} failed: {}", c.status));
            }
            if c.context == RECV_CTX {
                self.recvs += 1;
                self.qp.post_recv(c.region, self.size)?;
            } else {
                sends += 1;
                self.pool.push(c.region);
            }
        }
        self.out = out;
        Ok(sends)
    }

    /// A pool buffer, polling until one comes back.
    fn take_buffer(&mut self, test: Test) -> Result<MemoryRegion, String> {
        let start = Instant::now();
        loop {
            if let Some(r) = self.pool.pop() {
                return Ok(r);
            }
            self.progress(test)?;
            if start.elapsed() > STALL {
                return Err(format!("no {} completed for {STALL:?}", test.verb()));
            }
        }
    }
}

/// What each side sets up; the same code runs on both.
struct Side {
    ctx: Context,
    pd: ProtectionDomain,
    tenant: Option<(TenantHandle, String)>,
    pool_bytes: u64,
    is_client: bool,
    window: bool,
    window_target_ppm: Option<u32>,
    window_floor: Option<Nanos>,
    window_queue: Option<u64>,
    class: Option<TrafficClass>,
    ack_timeout: Option<u8>,
    wait: bool,
}

impl Side {
    fn open(a: &Args, chunk: u64, is_client: bool) -> Result<Side, String> {
        let ctx = match &a.device {
            Some(name) => Context::open(name),
            None => Context::open_first_active(),
        }
        .map_err(|e| format!("opening the RDMA device: {e}"))?;
        let pd = ctx
            .alloc_pd()
            .map_err(|e| format!("allocating a protection domain on {}: {e}", ctx.name()))?;
        let tenant = tenant_handle(a, chunk)?;
        Ok(Side {
            ctx,
            pd,
            tenant,
            pool_bytes: a.pool_mib.unwrap_or(64) << 20,
            is_client,
            window: a.window,
            window_target_ppm: a.window_target_ppm,
            window_floor: a.window_floor,
            window_queue: a.window_queue,
            class: a.class,
            ack_timeout: a.ack_timeout,
            wait: a.wait,
        })
    }

    /// Buffers of `size` bytes that fit the pool memory, at most `want`.
    fn pool_count(&self, size: usize, want: usize) -> usize {
        want.min((self.pool_bytes / size as u64).max(1) as usize)
            .max(1)
    }

    fn outstanding(&self, p: &Params, size: usize) -> usize {
        if p.test.is_bw() {
            self.pool_count(size, p.tx_depth as usize)
        } else {
            2
        }
    }

    fn build_qp(&self, sq: u32, rq: u32, inline: u32) -> Result<PreparedQueuePair, String> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let mut b = self
                .pd
                .queue_pair()
                .max_send_wr(sq)
                .max_recv_wr(rq)
                .max_inline_data(inline)
                .completion_events(self.wait);
            if let Some(exp) = self.ack_timeout {
                b = b.ack_timeout(exp);
            }
            if let Some((t, _)) = &self.tenant {
                b = b.tenant(t);
            }
            match b.build() {
                Ok(q) => return Ok(q),
                // The tenant's QP creation rate: wait for it, as an
                // application would, rather than fail the sweep.
                Err(mtrdma::Error::Admission(AdmissionError::RateLimited {
                    retry_after_ns,
                    ..
                })) if Instant::now() < deadline => std::thread::sleep(Duration::from_nanos(
                    retry_after_ns.clamp(1_000_000, 1_000_000_000),
                )),
                Err(e) => return Err(format!("creating the queue pair: {e}")),
            }
        }
    }

    fn allocate(&self, size: usize, access: Access) -> Result<MemoryRegion, String> {
        self.pd
            .allocate(size, access)
            .map_err(|e| format!("registering {size} bytes: {e}"))
    }

    /// `count` buffers of `size` bytes, pieces of one registration: one
    /// region per side, posted as many requests at once.
    fn buffers(
        &self,
        size: usize,
        count: usize,
        access: Access,
    ) -> Result<Vec<MemoryRegion>, String> {
        if count == 0 {
            return Ok(Vec::new());
        }
        let total = size
            .checked_mul(count)
            .ok_or_else(|| format!("{count} buffers of {size} bytes do not fit in memory"))?;
        self.allocate(total, access)?
            .into_pieces(size)
            .map_err(|e| format!("splitting {total} bytes into {size}-byte buffers: {e}"))
    }

    /// Creates the queue pair and buffers for `size`, swaps endpoints over
    /// `hs`, connects.
    fn connect(&self, p: &Params, size: usize, hs: &mut TcpStream) -> Result<Conn, String> {
        let test = p.test;
        let recvs = match test {
            Test::SendBw if !self.is_client => self.pool_count(size, BW_RECVS),
            Test::SendLat => LAT_RECVS,
            _ => 0,
        };
        let sends = if self.is_client || !test.is_bw() {
            self.outstanding(p, size)
        } else {
            0
        };
        let sq = if test.is_bw() { p.tx_depth.max(4) } else { 4 };
        let rq = u32::try_from(recvs).unwrap_or(u32::MAX).max(1);
        let mut prepared = self.build_qp(sq, rq, p.inline)?;
        let target = self.allocate(size, Access::REMOTE_READ_WRITE)?;
        let mine = target
            .remote()
            .ok_or("a region with remote access has no remote descriptor")?;
        // Receives go in before connecting, so the first SEND finds one.
        for r in self.buffers(size, recvs, Access::LOCAL)? {
            prepared
                .post_recv(r, 0..size, RECV_CTX)
                .map_err(|e| format!("posting a receive: {e}"))?;
        }
        let pool = self.buffers(size, sends, Access::LOCAL)?;
        let local = prepared.endpoint();
        let peer = exchange(
            hs,
            &Handshake {
                endpoint: local,
                regions: vec![mine],
            },
        )
        .map_err(|e| format!("exchanging endpoints: {e}"))?;
        let remote = peer
            .regions
            .first()
            .and_then(|r| r.slice(0, size as u64))
            .ok_or_else(|| {
                format!(
                    "the peer's region is smaller than the {size} bytes agreed on: {:?}",
                    peer.regions
                )
            })?;
        let qp = prepared
            .connect(&peer.endpoint)
            .map_err(|e| format!("connecting to the peer: {e}"))?;
        let qp = match p.path {
            PathKind::Raw => Qp::Raw(qp),
            PathKind::Mtrdma => Qp::Sched(Box::new(
                qp.scheduled(ScheduleConfig {
                    chunk_bytes: p.chunk,
                    max_pieces_in_flight: p.pieces,
                    // The queue pair's own tenant (it was built with it),
                    // or, without a quota table, tenant 0 of this process.
                    tenant: match &self.tenant {
                        Some(_) => Tenancy::OfQueuePair,
                        None => Tenancy::Local {
                            id: TenantId(0),
                            class: self.class.unwrap_or(TrafficClass::Bulk),
                        },
                    },
                    window: self.window.then(|| {
                        let window = DelayWindowConfig::for_piece(p.chunk);
                        DelayWindowConfig {
                            target_ratio_ppm: self
                                .window_target_ppm
                                .unwrap_or(window.target_ratio_ppm),
                            target_floor: self.window_floor.unwrap_or(window.target_floor),
                            queue_bytes: self.window_queue.unwrap_or(window.queue_bytes),
                            ..window
                        }
                    }),
                })
                .map_err(|e| format!("setting up the scheduled path: {e}"))?,
            )),
        };
        Ok(Conn {
            qp,
            target,
            remote,
            pool,
            recvs: 0,
            size,
            local,
            peer: peer.endpoint,
            out: Vec::new(),
            wait: self.wait,
            window_samples: WindowSamples::default(),
        })
    }
}

// ---------------------------------------------------------------------------
// Results
// ---------------------------------------------------------------------------

#[derive(Debug, Clone)]
struct BwResult {
    size: usize,
    iters: u64,
    peak: f64,
    avg: f64,
    msg_rate: f64,
}

#[derive(Debug, Clone)]
struct LatResult {
    size: usize,
    iters: u64,
    min: f64,
    max: f64,
    typical: f64,
    avg: f64,
    stdev: f64,
    p99: f64,
    p999: f64,
}

enum Outcome {
    Bw(BwResult),
    Lat(LatResult),
}

/// perftest's figures from post times `tp` and completion times `tc` (ns):
/// average over first post to last completion; peak as perftest's best
/// `(tc[j] - tp[i]) / (j - i + 1)` (sampled on a grid of at most ~1000x1000
/// points for long runs).
fn bw_result(size: usize, tp: &[u64], tc: &[u64]) -> Option<BwResult> {
    let n = tc.len().min(tp.len());
    if n == 0 {
        return None;
    }
    let secs = tc[n - 1].saturating_sub(tp[0]).max(1) as f64 / 1e9;
    let mut best = f64::MAX;
    let step = (n / 1000).max(1);
    let mut i = 0;
    while i < n {
        let mut j = i;
        loop {
            let t = tc[j].saturating_sub(tp[i]).max(1) as f64 / (j - i + 1) as f64;
            best = best.min(t);
            if j == n - 1 {
                break;
            }
            j = (j + step).min(n - 1);
        }
        i += step;
    }
    Some(BwResult {
        size,
        iters: n as u64,
        peak: size as f64 / (best / 1e9) / MIB,
        avg: size as f64 * n as f64 / secs / MIB,
        msg_rate: n as f64 / secs / 1e6,
    })
}

/// perftest's latency statistics: samples (ns) divided by `factor` (2 for
/// round trips), the two largest dropped, median as `t_typical`.
fn lat_result(size: usize, mut samples: Vec<u64>, factor: f64) -> Option<LatResult> {
    let n = samples.len();
    if n == 0 {
        return None;
    }
    samples.sort_unstable();
    let cnt = if n > 2 { n - 2 } else { n };
    let us = |ns: u64| ns as f64 / 1e3 / factor;
    let kept = &samples[..cnt];
    let median = if cnt % 2 == 0 {
        (us(kept[cnt / 2 - 1]) + us(kept[cnt / 2])) / 2.0
    } else {
        us(kept[cnt / 2])
    };
    let avg = kept.iter().map(|&s| us(s)).sum::<f64>() / cnt as f64;
    let var = kept.iter().map(|&s| (us(s) - avg).powi(2)).sum::<f64>() / cnt as f64;
    let at = |q: f64| us(samples[((cnt as f64 * q).ceil() as usize).min(n - 1)]);
    Some(LatResult {
        size,
        iters: n as u64,
        min: us(samples[0]),
        max: us(samples[cnt.min(n - 1)]),
        typical: median,
        avg,
        stdev: var.sqrt(),
        p99: at(0.99),
        p999: at(0.999),
    })
}

const LINE: &str =
    "---------------------------------------------------------------------------------------";

fn print_columns(test: Test) {
    let columns: &[(&str, usize)] = if test.is_bw() {
        &[
            ("#bytes", 10),
            ("#iterations", 14),
            ("BW peak[MB/sec]", 18),
            ("BW average[MB/sec]", 20),
            ("MsgRate[Mpps]", 0),
        ]
    } else {
        &[
            ("#bytes", 10),
            ("#iterations", 12),
            ("t_min[usec]", 12),
            ("t_max[usec]", 12),
            ("t_typical[usec]", 16),
            ("t_avg[usec]", 12),
            ("t_stdev[usec]", 14),
            ("99% percentile[usec]", 22),
            ("99.9% percentile[usec]", 0),
        ]
    };
    let mut line = String::new();
    for (name, width) in columns {
        let _ = write!(line, " {name:<width$}");
    }
    println!("{}", line.trim_end());
}

fn print_outcome(o: &Outcome) {
    match o {
        Outcome::Bw(r) => println!(
            " {:<10} {:<14} {:<18.2} {:<20.2} {:.6}",
            r.size, r.iters, r.peak, r.avg, r.msg_rate
        ),
        Outcome::Lat(r) => println!(
            " {:<10} {:<12} {:<12.2} {:<12.2} {:<16.2} {:<12.2} {:<14.2} {:<22.2} {:.2}",
            r.size, r.iters, r.min, r.max, r.typical, r.avg, r.stdev, r.p99, r.p999
        ),
    }
}

const CSV_HEADER: &str = "test,path,device,tenant,tx_depth,chunk_bytes,pieces,bytes,iterations,\
bw_peak_MBps,bw_avg_MBps,msg_rate_Mpps,t_min_us,t_max_us,t_typical_us,t_avg_us,t_stdev_us,\
t_p99_us,t_p99_9_us";

fn csv_line(p: &Params, device: &str, tenant: &str, o: &Outcome) -> String {
    let pre = format!(
        "{},{},{},{},{},{},{}",
        p.test.name(),
        p.path.name(),
        device,
        tenant,
        if p.test.is_bw() { p.tx_depth } else { 1 },
        p.chunk,
        p.pieces
    );
    match o {
        Outcome::Bw(r) => format!(
            "{pre},{},{},{:.4},{:.4},{:.6},,,,,,,",
            r.size, r.iters, r.peak, r.avg, r.msg_rate
        ),
        Outcome::Lat(r) => format!(
            "{pre},{},{},,,,{:.3},{:.3},{:.3},{:.3},{:.3},{:.3},{:.3}",
            r.size, r.iters, r.min, r.max, r.typical, r.avg, r.stdev, r.p99, r.p999
        ),
    }
}

/// Appends `samples` (ns) divided by `factor`, in usec, one per line,
/// after a line naming the size.
fn write_samples(path: &PathBuf, size: usize, samples: &[u64], factor: f64) -> Result<(), String> {
    let mut text = format!("# {size} B\n");
    for s in samples {
        let _ = writeln!(text, "{:.3}", *s as f64 / 1e3 / factor);
    }
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .and_then(|mut f| f.write_all(text.as_bytes()))
        .map_err(|e| format!("--samples {}: {e}", path.display()))
}

fn append_csv(path: &PathBuf, line: &str) -> Result<(), String> {
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|e| format!("--csv {}: {e}", path.display()))?;
    let empty = f.metadata().map(|m| m.len() == 0).unwrap_or(true);
    let text = if empty {
        format!("{CSV_HEADER}\n{line}\n")
    } else {
        format!("{line}\n")
    };
    f.write_all(text.as_bytes())
        .map_err(|e| format!("--csv {}: {e}", path.display()))
}

fn print_header(side: &Side, p: &Params, conn: &Conn, limited: Option<(usize, usize)>) {
    let ctx = &side.ctx;
    let port = ctx.port(1).ok();
    let gid = ctx.select_gid(1, GidSelection::Auto).ok();
    println!("{LINE}");
    println!("                    {} (mtrdma perf)", p.test.title());
    println!(" Device          : {}", ctx.name());
    match p.path {
        PathKind::Mtrdma => println!(
            " Path            : mtrdma (ScheduledQueuePair; chunk {} B, {} pieces in flight)",
            p.chunk, p.pieces
        ),
        PathKind::Raw => println!(" Path            : raw (QueuePair::post_send)"),
    }
    match &side.tenant {
        Some((_, desc)) if p.path == PathKind::Raw => {
            println!(" Tenant          : {desc}; raw path: QP admission only, no rate limits")
        }
        Some((_, desc)) => println!(" Tenant          : {desc}"),
        None => println!(" Tenant          : none"),
    }
    println!(" Number of qps   : 1\t\tTransport type : IB");
    println!(" Connection type : RC\t\tUsing SRQ      : OFF");
    println!(" Max inline data : {}[B]", p.inline);
    if p.test.is_bw() {
        println!(" TX depth        : {}", p.tx_depth);
        if let Some((size, n)) = limited {
            println!(
                " Outstanding     : {n} from {size} B up (--pool-mib {} limits buffers)",
                side.pool_bytes >> 20
            );
        }
    } else {
        println!(" TX depth        : 1");
    }
    println!(
        " Mtu             : {}[B]",
        conn.local.mtu.min(conn.peer.mtu)
    );
    if let Some(port) = port {
        println!(" Link type       : {}", port.link_layer);
    }
    match gid {
        Some(g) => println!(" GID index       : {}", g.index),
        None => println!(" GID index       : ?"),
    }
    println!(" Data ex. method : Ethernet (TCP, mtrdma::verbs::exchange)");
    match p.duration() {
        Some(d) => println!(" Duration        : {:.1} s per size", d.as_secs_f64()),
        None => println!(" Iterations      : {} per size", p.iters),
    }
    if p.test.is_bw() {
        println!(" Units           : MB = 2^20 bytes (as perftest), Mpps = 10^6 msg/s");
    } else {
        println!(
            " Units           : usec; {}",
            if p.test == Test::ReadLat {
                "READ post to completion"
            } else if p.test == Test::WriteCompLat {
                "WRITE post to completion"
            } else {
                "ping-pong round trip / 2"
            }
        );
    }
    println!("{LINE}");
    for (name, ep) in [("local", conn.local), ("remote", conn.peer)] {
        println!(
            " {name} address: LID {:#06x} QPN {:#06x} PSN {:#08x} GID: {}",
            ep.lid,
            ep.qpn,
            ep.psn,
            Gid(ep.gid)
        );
    }
    println!("{LINE}");
    print_columns(p.test);
}

// ---------------------------------------------------------------------------
// The tests
// ---------------------------------------------------------------------------

fn ns_since(start: Instant) -> u64 {
    start.elapsed().as_nanos() as u64
}

/// On an error during a run, the peer's own error (if it sent one) says more.
fn with_peer_error(ctrl: &mut Ctrl, e: String) -> String {
    let deadline = Instant::now() + Duration::from_millis(200);
    while Instant::now() < deadline {
        match ctrl.try_recv() {
            Ok(Some(line)) => {
                if let Some(msg) = line.strip_prefix("ERR ") {
                    return format!("{e} (the peer reported: {msg})");
                }
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(5)),
            Err(_) => return format!("{e} (the peer closed the control connection)"),
        }
    }
    e
}

/// Client side of a bw test: keep the pool's buffers posted.
fn client_bw(conn: &mut Conn, p: &Params) -> Result<Option<BwResult>, String> {
    let size = conn.size;
    let op = match p.test {
        Test::WriteBw => SendOp::Write(conn.remote),
        Test::ReadBw => SendOp::Read(conn.remote),
        _ => SendOp::Send,
    };
    let mut limit = match p.duration() {
        Some(_) => u64::MAX,
        None => p.iters,
    };
    let cap = limit.min(1 << 22) as usize;
    let (mut tp, mut tc) = (Vec::with_capacity(cap), Vec::with_capacity(cap));
    let start = Instant::now();
    let deadline = p.duration().map(|d| start + d);
    let (mut posted, mut done) = (0u64, 0u64);
    let mut last = Instant::now();
    let mut spins = 0u32;
    while done < limit {
        while posted < limit {
            let Some(r) = conn.pool.pop() else { break };
            // Stamped before posting, as perftest does: a software
            // provider may do the whole transfer inside the post call.
            tp.push(ns_since(start));
            conn.qp.post_send(op, r, size, SEND_CTX)?;
            posted += 1;
        }
        let n = conn.progress(p.test)?;
        if let Qp::Sched(q) = &conn.qp {
            let piece = p.chunk.min(size as u64);
            conn.window_samples
                .sample(ns_since(start), q.window(), piece);
        }
        if n > 0 {
            let now = ns_since(start);
            tc.extend(std::iter::repeat_n(now, n));
            done += n as u64;
            last = Instant::now();
        }
        spins = spins.wrapping_add(1);
        if spins % 1024 == 0 {
            if let Some(d) = deadline {
                if limit == u64::MAX && Instant::now() >= d {
                    limit = posted;
                }
            }
            if last.elapsed() > STALL {
                return Err(format!(
                    "{done} of {posted} requests completed and nothing more for {STALL:?}"
                ));
            }
        }
    }
    Ok(bw_result(size, &tp, &tc))
}

/// Waits for the peer's `marker` in the last byte of our target (write_lat),
/// or for its next message (send_lat). Returns false when the control
/// connection says `DONE` instead (server side).
fn wait_peer(
    conn: &mut Conn,
    test: Test,
    marker: u8,
    recvs_before: u64,
    ctrl: &mut Ctrl,
    is_client: bool,
) -> Result<bool, String> {
    let mut byte = [0u8; 1];
    let mut spins = 0u32;
    let start = Instant::now();
    loop {
        let arrived = match test {
            // Like perftest, watch the byte; our own WRITE's completion is
            // reaped now and then (the next ping has a spare buffer).
            Test::WriteLat => {
                if spins % 64 == 63 {
                    conn.progress(test)?;
                }
                conn.target
                    .read_into(conn.size - 1, &mut byte)
                    .map_err(|e| e.to_string())?;
                byte[0] == marker
            }
            _ => {
                conn.progress(test)?;
                conn.recvs > recvs_before
            }
        };
        if arrived {
            return Ok(true);
        }
        spins = spins.wrapping_add(1);
        if spins % 1024 == 0 {
            if let Some(line) = ctrl.try_recv()? {
                if !is_client && line == "DONE" {
                    return Ok(false);
                }
                check_line(&line, "DONE", &ctrl.peer.clone())?;
                return Err(format!("unexpected message from {}: {line:?}", ctrl.peer));
            }
            if is_client && start.elapsed() > STALL {
                return Err(format!("no answer from the peer for {STALL:?}"));
            }
        }
    }
}

fn marker(i: u64) -> u8 {
    (i % 255) as u8 + 1
}

/// Posts our ping (write_lat: WRITE with `marker` in the last byte;
/// send_lat: SEND).
fn post_ping(conn: &mut Conn, test: Test, marker: u8) -> Result<(), String> {
    let size = conn.size;
    let mut r = conn.take_buffer(test)?;
    let op = if test == Test::WriteLat {
        if let Some(buf) = r.as_mut_slice() {
            buf[size - 1] = marker;
        }
        SendOp::Write(conn.remote)
    } else {
        SendOp::Send
    };
    conn.qp.post_send(op, r, size, SEND_CTX)
}

/// Client side of a latency test: per-iteration samples in ns.
fn client_lat(
    conn: &mut Conn,
    p: &Params,
    ctrl: &mut Ctrl,
    interval: Option<Duration>,
) -> Result<Vec<u64>, String> {
    let deadline = p.duration().map(|d| Instant::now() + d);
    let mut samples = Vec::with_capacity(p.iters.min(1 << 22) as usize);
    // How late each sleep between requests ended (ns): a busy host shows
    // here, apart from the link's queue.
    let mut late = Vec::new();
    let mut i = 0u64;
    loop {
        match deadline {
            Some(d) if Instant::now() >= d => break,
            None if i >= p.iters => break,
            _ => {}
        }
        let t0 = Instant::now();
        match p.test {
            Test::ReadLat | Test::WriteCompLat => {
                let r = conn.take_buffer(p.test)?;
                let op = if p.test == Test::ReadLat {
                    SendOp::Read(conn.remote)
                } else {
                    SendOp::Write(conn.remote)
                };
                conn.qp.post_send(op, r, conn.size, SEND_CTX)?;
                let spin_start = Instant::now();
                // With --wait the probe sleeps while its request is out:
                // a process that spins for its completion is, on a host
                // with more runnable processes than CPUs, the one taken
                // off the CPU for a whole scheduling period.
                let block = conn.wait;
                while conn.progress_blocking(p.test, block)? == 0 {
                    if spin_start.elapsed() > STALL {
                        return Err(format!("no {} completion for {STALL:?}", p.test.verb()));
                    }
                }
            }
            test => {
                let m = marker(i);
                let recvs = conn.recvs;
                post_ping(conn, test, m)?;
                wait_peer(conn, test, m, recvs, ctrl, true)?;
            }
        }
        samples.push(t0.elapsed().as_nanos() as u64);
        i += 1;
        if let Some(gap) = interval {
            // The next request starts one interval after this one did
            // (sleeping, so the probe leaves the CPUs to the others).
            let next = t0 + gap;
            let now = Instant::now();
            if next > now {
                std::thread::sleep(next - now);
                late.push(next.elapsed().as_nanos() as u64);
            }
        }
    }
    if let Some(l) = lat_result(0, late, 1.0) {
        eprintln!(
            "perf: {} sleeps between requests ended late by p50 {:.0} us, p99 {:.0} us (the host's CPUs, not the link)",
            l.iters, l.typical, l.p99
        );
    }
    Ok(samples)
}

/// Server side of write_lat / send_lat: answer every ping until `DONE`.
fn server_pong(conn: &mut Conn, test: Test, ctrl: &mut Ctrl) -> Result<(), String> {
    let mut i = 0u64;
    loop {
        let m = marker(i);
        let recvs = conn.recvs;
        if !wait_peer(conn, test, m, recvs, ctrl, false)? {
            return Ok(());
        }
        post_ping(conn, test, m)?;
        i += 1;
    }
}

/// Server side of send_bw: keep receives posted until `DONE`.
fn server_recv(conn: &mut Conn, test: Test, ctrl: &mut Ctrl) -> Result<(), String> {
    let mut spins = 0u32;
    loop {
        conn.progress(test)?;
        spins = spins.wrapping_add(1);
        if spins % 256 == 0 {
            if let Some(line) = ctrl.try_recv()? {
                let peer = ctrl.peer.clone();
                return check_line(&line, "DONE", &peer);
            }
        }
    }
}

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
        ctrl.send("DONE")?;
        ctrl.expect("FIN", Some(SETUP_TIMEOUT))?;
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
            Test::WriteBw | Test::ReadBw | Test::ReadLat | Test::WriteCompLat => {
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
