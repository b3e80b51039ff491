//! The command line: flags, their checks and the help text.

use super::*;

pub(crate) const HELP: &str = "\
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

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Test {
    WriteBw,
    ReadBw,
    SendBw,
    WriteLat,
    ReadLat,
    SendLat,
    WriteCompLat,
    AtomicBw,
}

impl Test {
    const ALL: [Test; 8] = [
        Test::WriteBw,
        Test::ReadBw,
        Test::SendBw,
        Test::WriteLat,
        Test::ReadLat,
        Test::SendLat,
        Test::WriteCompLat,
        Test::AtomicBw,
    ];

    pub(crate) fn name(self) -> &'static str {
        match self {
            Test::WriteBw => "write_bw",
            Test::ReadBw => "read_bw",
            Test::SendBw => "send_bw",
            Test::WriteLat => "write_lat",
            Test::ReadLat => "read_lat",
            Test::SendLat => "send_lat",
            Test::WriteCompLat => "write_comp_lat",
            Test::AtomicBw => "atomic_bw",
        }
    }

    pub(crate) fn parse(s: &str) -> Result<Test, String> {
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

    pub(crate) fn is_bw(self) -> bool {
        matches!(
            self,
            Test::WriteBw | Test::ReadBw | Test::SendBw | Test::AtomicBw
        )
    }

    /// perftest's title line.
    pub(crate) fn title(self) -> &'static str {
        match self {
            Test::WriteBw => "RDMA_Write BW Test",
            Test::ReadBw => "RDMA_Read BW Test",
            Test::SendBw => "Send BW Test",
            Test::WriteLat => "RDMA_Write Latency Test",
            Test::ReadLat => "RDMA_Read Latency Test",
            Test::SendLat => "Send Latency Test",
            Test::WriteCompLat => "RDMA_Write Completion Latency Test",
            Test::AtomicBw => "Atomic FETCH_AND_ADD BW Test",
        }
    }

    pub(crate) fn verb(self) -> &'static str {
        match self {
            Test::WriteBw | Test::WriteLat | Test::WriteCompLat => "RDMA WRITE",
            Test::ReadBw | Test::ReadLat => "RDMA READ",
            Test::SendBw | Test::SendLat => "SEND",
            Test::AtomicBw => "ATOMIC FETCH_AND_ADD",
        }
    }
}

pub(crate) fn parse_path(s: &str) -> Result<PathKind, String> {
    PathKind::from_name(s).ok_or_else(|| format!("unknown path {s:?}; expected mtrdma or raw"))
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Mode {
    Server,
    Client(String),
    Loopback,
}

/// The command line as given (`None`: not given, so a server may take the
/// client's value).
#[derive(Debug, Clone, Default)]
pub(crate) struct Args {
    pub(crate) test: Option<Test>,
    pub(crate) path: Option<PathKind>,
    pub(crate) size: Option<usize>,
    pub(crate) all: bool,
    pub(crate) iters: Option<u64>,
    pub(crate) duration: Option<Duration>,
    pub(crate) tx_depth: Option<u32>,
    pub(crate) chunk: Option<u64>,
    pub(crate) pieces: Option<u32>,
    pub(crate) inline: Option<u32>,
    pub(crate) pool_mib: Option<u64>,
    pub(crate) policy: Option<PathBuf>,
    pub(crate) tenant: Option<String>,
    pub(crate) cap_mbps: Option<f64>,
    pub(crate) mode: Option<Mode>,
    pub(crate) port: Option<u16>,
    pub(crate) csv: Option<PathBuf>,
    pub(crate) samples: Option<PathBuf>,
    pub(crate) device: Option<String>,
    pub(crate) qp_flags: QpFlags,
    pub(crate) coordinator: Option<PathBuf>,
    pub(crate) interval: Option<Duration>,
}

/// How this side builds and drives its queue pairs (`--window*`,
/// `--class`, `--ack-timeout`, `--wait`): kept as given, for each
/// connection [`Side::connect`] makes.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct QpFlags {
    pub(crate) window: bool,
    pub(crate) window_target_ppm: Option<u32>,
    pub(crate) window_floor: Option<Nanos>,
    pub(crate) window_queue: Option<u64>,
    pub(crate) class: Option<TrafficClass>,
    pub(crate) ack_timeout: Option<u8>,
    pub(crate) wait: bool,
}

pub(crate) enum Parsed {
    Help,
    Run(Box<Args>),
}

/// A size in bytes: `65536`, `64K`, `64KiB`, `1M`, `1MiB` (K and M are
/// powers of 1024, as perftest's sizes are).
pub(crate) fn parse_size(flag: &str, s: &str) -> Result<usize, String> {
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

pub(crate) fn parse_num<T: std::str::FromStr>(
    flag: &str,
    s: &str,
    what: &str,
) -> Result<T, String> {
    s.trim()
        .parse()
        .map_err(|_| format!("{flag}: cannot read {s:?} as {what}"))
}

pub(crate) fn parse_args(raw: impl IntoIterator<Item = String>) -> Result<Parsed, String> {
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
            "--path" => a.path = Some(parse_path(&value()?)?),
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
            "--window" => a.qp_flags.window = true,
            "--window-target" => {
                let ppm: u32 = parse_num(&flag, &value()?, "parts per million")?;
                if !(1..=100_000_000).contains(&ppm) {
                    return Err(format!("{flag}: give 1 <= PPM <= 100000000"));
                }
                a.qp_flags.window_target_ppm = Some(ppm);
            }
            "--window-floor" => {
                let us: u64 = parse_num(&flag, &value()?, "microseconds")?;
                if us > 10_000_000 {
                    return Err(format!("{flag}: give at most 10000000 us (10 s)"));
                }
                a.qp_flags.window_floor = Some(Nanos::from_micros(us));
            }
            "--window-queue" => {
                let bytes = parse_size(&flag, &value()?)? as u64;
                if bytes == 0 {
                    return Err(format!("{flag} must be at least 1 byte"));
                }
                a.qp_flags.window_queue = Some(bytes);
            }
            "--wait" => a.qp_flags.wait = true,
            "--interval" => {
                let us: u64 = parse_num(&flag, &value()?, "microseconds")?;
                if !(1..=10_000_000).contains(&us) {
                    return Err(format!("{flag} {us}: 1 ..= 10000000 microseconds"));
                }
                a.interval = Some(Duration::from_micros(us));
            }
            "--coordinator" => a.coordinator = Some(PathBuf::from(value()?)),
            "--class" => {
                a.qp_flags.class = Some(match value()?.as_str() {
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
                a.qp_flags.ack_timeout = Some(exp);
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

pub(crate) fn check_args(a: &Args) -> Result<(), String> {
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
    if a.test == Some(Test::AtomicBw) && (a.all || a.size != Some(8)) {
        return Err("atomic_bw works on one 8-byte word: give -s 8".into());
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
