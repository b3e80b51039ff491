//! The command line.

use super::*;

pub(crate) struct Args {
    pub(crate) device: Option<String>,
    /// The receiving queue pairs' device (default: `device`, loopback).
    pub(crate) peer_device: Option<String>,
    /// The demo on the VM's shared link, tenants as processes.
    pub(crate) link: bool,
    /// Run as the control-path storm tenant (a process of the link demo).
    pub(crate) storm_tenant: bool,
    /// With `storm_tenant`: an RNR storm towards `peer_device`.
    pub(crate) rnr: bool,
    /// With `storm_tenant`: registrations of 1 KiB to 64 MiB in turn, each
    /// in a protection domain of its own.
    pub(crate) mr_sweep: bool,
    /// With `storm_tenant`: a UD flood towards `peer_device`.
    pub(crate) ud: bool,
    pub(crate) coordinator: Option<PathBuf>,
    /// The capped tenant's cap on the link, as a share of its rate.
    pub(crate) cap_share: f64,
    pub(crate) out: PathBuf,
    pub(crate) seconds: f64,
    /// How long the tenants run before a measurement begins (on the link:
    /// the bulk senders' lead before the probe, and their tail after it).
    pub(crate) warmup: Duration,
    pub(crate) bulk: Vec<usize>,
    pub(crate) scenarios: Vec<String>,
    pub(crate) msg: usize,
    pub(crate) depth: usize,
    pub(crate) chunk: u64,
    /// On the link: whether `--chunk` was given, so that the mtrdma bulk
    /// tenants are asked for it (tighter than the bound's, or held to it);
    /// without it they run on their defaults.
    pub(crate) chunk_given: bool,
    /// On the link: the policy's `latency_bound` in bytes (the bytes a
    /// latency request may find queued ahead of it), which every mtrdma
    /// bulk tenant is held to; `None` (`--latency-bound none`): no bound,
    /// and the mtrdma bulk tenants opt in themselves as before the bound
    /// existed (`--window --chunk C --pieces 64`, the preload library's
    /// `MTRDMA_WINDOW=1`): the control the bound's figures compare with.
    pub(crate) latency_bound: Option<u64>,
    pub(crate) budget: u64,
    /// On the link: the weights scenario's tenants' weights (default
    /// 1,2,4; at most 16 tenants).
    pub(crate) weights: Vec<u32>,
    /// On the link: the latency probe at normal CPU priority
    /// (`--probe-priority normal`) rather than real-time.
    pub(crate) probe_normal: bool,
    pub(crate) cap_mbps: f64,
    /// On the link: the windows' queue allowance as a share of the path's
    /// delay (perf's `--window-target`), if not the window's default.
    pub(crate) window_target: Option<u32>,
    /// On the link: the windows' least queue allowance in microseconds
    /// (perf's `--window-floor`), if not the window's default.
    pub(crate) window_floor_us: Option<u64>,
    /// On the link: the windows' queue allowance in bytes at the measured
    /// link rate (perf's `--window-queue`), if not the window's default.
    pub(crate) window_queue: Option<u64>,
    /// On the link: whether the coordinator sets gains on the windows'
    /// growth (coordinator's `--no-window-gains` when not).
    pub(crate) window_gains: bool,
    /// On the link: whether the coordinator runs the one-piece floor
    /// (coordinator's `--no-piece-floor` when not).
    pub(crate) piece_floor: bool,
    /// On the link: the coordinator prints its view (each tenant's rate
    /// and gain, every second) into `logs/coordinator.log`.
    pub(crate) coordinator_view: bool,
    /// On the link: the coordinator runs its kernel monitor (`--monitor`)
    /// and the report sums up what it flagged.
    pub(crate) coordinator_monitor: bool,
    /// On the link: microseconds between the latency probe's requests.
    pub(crate) probe_interval_us: u32,
    /// On the link, the latency scenario's control: plain senders of the
    /// bulk tenants' piece size, this many requests outstanding each
    /// (0: no control run).
    pub(crate) control_depth: u32,
    /// On the link, the applications scenario: the pager starts before
    /// the RPC service in the mtrdma run (by default after it).
    pub(crate) pager_first: bool,
    /// On the link, the soak (`--scenarios soak`): how long it churns.
    pub(crate) soak_seconds: f64,
}

pub(crate) const USAGE: &str = "usage: isolation [--device NAME] [--peer-device NAME] [--out DIR] [--seconds S] [--warmup-ms MS]
    [--bulk 1,4,8] [--scenarios latency,weights,cap,storm] [--msg BYTES] [--depth N]
    [--chunk BYTES] [--budget BYTES] [--cap-mbps MB/s]
on the VM's shared link (cargo xtask vm --link RATE), tenants as processes:
       isolation --link [--out DIR] [--seconds S (default 9)] [--warmup-ms MS (the bulk senders' lead before the probe, and their tail after it; default 1500)] [--bulk 1,4,8] [--msg BYTES] [--weights W1,W2,.. (default 1,2,4)] [--probe-priority realtime|normal] [--latency-bound BYTES|none (default 16384; none: the tenants opt in themselves)] [--chunk BYTES (a tenant's own pieces; default: the bound's)]
    [--window-target PPM (the windows' queue allowance, see perf --help)] [--window-floor USEC] [--window-queue BYTES]
    [--no-window-gains (the coordinator leaves the windows' growth to their weights)]
    [--no-piece-floor (the coordinator gives no window a floor of one piece)]
    [--coordinator-view (the coordinator's per-second view of every tenant into logs/coordinator.log)]
    [--coordinator-monitor (the coordinator's kernel monitor: what it flagged, and its log)]
    [--probe-interval-us US (between the latency probe's requests, default 500)]
    [--control-depth N (latency: the control's plain senders of the bulk pieces' size keep N requests out each, default 1; 0: no control)]
    [--pager-first (apps: in the mtrdma run the pager starts before the RPC service, not after)]
    [--scenarios latency,hogs,weights,cap,storm,attack,apps] [--cap-share 0.25]
    [--scenarios soak --soak-seconds S (default 60): churn that must leave nothing behind; not among the defaults]
    [--scenarios cluster: a coordinator for each end of the link, joined through etcd: cluster-wide caps and weights; not among the defaults]
the link demo's storm tenant (--rnr: SENDs to a peer on --peer-device that posts no receives;
       isolation --storm-tenant --device NAME --seconds S [--coordinator SOCKET] [--rnr --peer-device NAME]
    [--mr-sweep (registrations of 1 KiB to 64 MiB in turn, each in a protection domain of its own)]
    [--ud --peer-device NAME (a flood of MTU-sized UD datagrams to a peer that posts no receives)]";

pub(crate) const SCENARIOS: [&str; 4] = ["latency", "weights", "cap", "storm"];
pub(crate) const LINK_SCENARIOS: [&str; 7] = [
    "latency", "hogs", "weights", "cap", "storm", "attack", "apps",
];
/// Link scenarios run only when named: the soak (`cargo xtask soak`), and
/// cluster-wide shares through etcd (a coordinator for each end of the
/// link).
pub(crate) const LINK_SCENARIOS_NAMED: [&str; 2] = ["soak", "cluster"];

pub(crate) fn parse() -> Result<Args, String> {
    let mut args = Args {
        device: None,
        peer_device: None,
        link: false,
        storm_tenant: false,
        rnr: false,
        mr_sweep: false,
        ud: false,
        coordinator: None,
        cap_share: 0.25,
        out: PathBuf::from("target/demo"),
        seconds: 3.0,
        warmup: Duration::from_millis(500),
        bulk: vec![1, 4, 8],
        scenarios: Vec::new(),
        msg: 1 << 20,
        depth: 4,
        chunk: 64 << 10,
        chunk_given: false,
        latency_bound: Some(16 << 10),
        weights: vec![1, 2, 4],
        probe_normal: false,
        budget: 128 << 10,
        cap_mbps: 4.0,
        window_target: None,
        window_floor_us: None,
        window_queue: None,
        window_gains: true,
        piece_floor: true,
        coordinator_view: false,
        pager_first: false,
        coordinator_monitor: false,
        probe_interval_us: 500,
        control_depth: 1,
        soak_seconds: 60.0,
    };
    pub(crate) fn num<T: std::str::FromStr>(flag: &str, v: String) -> Result<T, String>
    where
        T::Err: std::fmt::Display,
    {
        v.parse().map_err(|e| format!("{flag} {v}: {e}"))
    }
    let mut it = args::Args::from_env();
    let mut seconds = None;
    let mut warmup = None;
    let mut chunk = None;
    while let Some(flag) = it.next_flag(|v| format!("unexpected argument {v}\n{USAGE}"))? {
        match flag.as_str() {
            "--help" | "-h" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            "--link" => {
                args.link = true;
                continue;
            }
            "--storm-tenant" => {
                args.storm_tenant = true;
                continue;
            }
            "--rnr" => {
                args.rnr = true;
                continue;
            }
            "--mr-sweep" => {
                args.mr_sweep = true;
                continue;
            }
            "--ud" => {
                args.ud = true;
                continue;
            }
            "--no-window-gains" => {
                args.window_gains = false;
                continue;
            }
            "--no-piece-floor" => {
                args.piece_floor = false;
                continue;
            }
            "--pager-first" => {
                args.pager_first = true;
                continue;
            }
            "--coordinator-view" => {
                args.coordinator_view = true;
                continue;
            }
            "--coordinator-monitor" => {
                args.coordinator_monitor = true;
                continue;
            }
            _ => {}
        }
        let v = it.value(&flag)?;
        match flag.as_str() {
            "--device" => args.device = Some(v),
            "--peer-device" => args.peer_device = Some(v),
            "--out" => args.out = PathBuf::from(v),
            "--seconds" => seconds = Some(num(&flag, v)?),
            "--coordinator" => args.coordinator = Some(PathBuf::from(v)),
            "--cap-share" => args.cap_share = num(&flag, v)?,
            "--warmup-ms" => warmup = Some(Duration::from_millis(num(&flag, v)?)),
            "--bulk" => {
                args.bulk = v
                    .split(',')
                    .map(|n| num(&flag, n.to_string()))
                    .collect::<Result<_, _>>()?
            }
            "--scenarios" => args.scenarios = v.split(',').map(String::from).collect(),
            "--msg" => args.msg = num(&flag, v)?,
            "--depth" => args.depth = num(&flag, v)?,
            "--chunk" => chunk = Some(num(&flag, v)?),
            "--weights" => {
                args.weights = v
                    .split(',')
                    .map(|n| num(&flag, n.to_string()))
                    .collect::<Result<_, _>>()?;
                if args.weights.is_empty()
                    || args.weights.len() > 16
                    || args.weights.iter().any(|&w| !(1..=1000).contains(&w))
                {
                    return Err(format!(
                        "{flag} {v}: give 1 to 16 weights from 1 to 1000, e.g. 1,2,4"
                    ));
                }
            }
            "--probe-priority" => {
                args.probe_normal = match v.as_str() {
                    "normal" => true,
                    "realtime" => false,
                    other => {
                        return Err(format!("{flag} {other}: normal or realtime"));
                    }
                }
            }
            "--latency-bound" if v == "none" => args.latency_bound = None,
            "--latency-bound" => args.latency_bound = Some(num(&flag, v)?),
            "--budget" => args.budget = num(&flag, v)?,
            "--cap-mbps" => args.cap_mbps = num(&flag, v)?,
            "--window-target" => args.window_target = Some(num(&flag, v)?),
            "--window-floor" => args.window_floor_us = Some(num(&flag, v)?),
            "--window-queue" => args.window_queue = Some(num(&flag, v)?),
            "--probe-interval-us" => args.probe_interval_us = num(&flag, v)?,
            "--control-depth" => args.control_depth = num(&flag, v)?,
            "--soak-seconds" => args.soak_seconds = num(&flag, v)?,
            other => return Err(format!("unknown flag {other}\n{USAGE}")),
        }
    }
    // The link demo's probe (one request every 500 us, woken late now and
    // then) needs about 8 s for the 10,000 samples a p99.9 is reported
    // over.
    args.seconds = seconds.unwrap_or(if args.link { 9.0 } else { 3.0 });
    // On the link the bulk senders reach their pace (perf's connection,
    // the coordinator's first rates) in about a second and a half.
    args.warmup = warmup.unwrap_or(Duration::from_millis(if args.link { 1500 } else { 500 }));
    // On the link, the bulk tenants' pieces: the policy's latency bound's
    // (a quarter of it: one MTU's worth of the link's default at the
    // default 16 KiB, see link.rs), unless `--chunk` asks for others.
    let bound = args.latency_bound.unwrap_or(16 << 10);
    let protection = mtrdma::sched::Protection::for_bound(bound)
        .map_err(|e| format!("--latency-bound {bound}: {e}"))?;
    args.chunk_given = chunk.is_some();
    args.chunk = chunk.unwrap_or(if args.link {
        protection.piece_bytes
    } else {
        64 << 10
    });
    let known: &[&str] = if args.link {
        &LINK_SCENARIOS
    } else {
        &SCENARIOS
    };
    if args.scenarios.is_empty() {
        args.scenarios = known.iter().map(|s| s.to_string()).collect();
    }
    if !(args.cap_share > 0.0 && args.cap_share < 1.0) {
        return Err("--cap-share must lie between 0 and 1".into());
    }
    if args.link && args.storm_tenant {
        return Err("--link and --storm-tenant are two different runs".into());
    }
    let positive = |x: f64| x.is_finite() && x > 0.0;
    if !positive(args.seconds) || args.msg == 0 || args.depth == 0 || !positive(args.cap_mbps) {
        return Err("--seconds, --msg, --depth and --cap-mbps must be positive".into());
    }
    if args.bulk.iter().any(|&n| n == 0 || n > 64) {
        return Err("--bulk counts must be between 1 and 64".into());
    }
    let named: &[&str] = if args.link {
        &LINK_SCENARIOS_NAMED
    } else {
        &[]
    };
    for s in &args.scenarios {
        if !known.contains(&s.as_str()) && !named.contains(&s.as_str()) {
            let all: Vec<&str> = known.iter().chain(named).copied().collect();
            return Err(format!("unknown scenario {s} ({})", all.join(", ")));
        }
    }
    if !(args.soak_seconds.is_finite() && args.soak_seconds > 0.0) {
        return Err("--soak-seconds must be positive".into());
    }
    Ok(args)
}
