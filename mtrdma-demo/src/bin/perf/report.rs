//! Results: bandwidth and latency figures, the printed table and the CSV.

use super::*;

#[derive(Debug, Clone)]
pub(crate) struct BwResult {
    pub(crate) size: usize,
    pub(crate) iters: u64,
    pub(crate) peak: f64,
    pub(crate) avg: f64,
    pub(crate) msg_rate: f64,
}

#[derive(Debug, Clone)]
pub(crate) struct LatResult {
    pub(crate) size: usize,
    pub(crate) iters: u64,
    pub(crate) min: f64,
    pub(crate) max: f64,
    pub(crate) typical: f64,
    pub(crate) avg: f64,
    pub(crate) stdev: f64,
    pub(crate) p99: f64,
    pub(crate) p999: f64,
}

pub(crate) enum Outcome {
    Bw(BwResult),
    Lat(LatResult),
}

/// perftest's figures from post times `tp` and completion times `tc` (ns):
/// average over first post to last completion; peak as perftest's best
/// `(tc[j] - tp[i]) / (j - i + 1)` (sampled on a grid of at most ~1000x1000
/// points for long runs).
pub(crate) fn bw_result(size: usize, tp: &[u64], tc: &[u64]) -> Option<BwResult> {
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
pub(crate) fn lat_result(size: usize, mut samples: Vec<u64>, factor: f64) -> Option<LatResult> {
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

pub(crate) const LINE: &str =
    "---------------------------------------------------------------------------------------";

/// The table's columns, perftest's: name and width (0: the last, not
/// padded).
fn columns(bw: bool) -> &'static [(&'static str, usize)] {
    if bw {
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
    }
}

pub(crate) fn print_columns(test: Test) {
    let mut line = String::new();
    for (name, width) in columns(test.is_bw()) {
        let _ = write!(line, " {name:<width$}");
    }
    println!("{}", line.trim_end());
}

impl Outcome {
    /// The message size, the iterations and the figures measured, in the
    /// columns' order: bandwidth peak and average (MB/sec) and message
    /// rate (Mpps), or latency min, max, typical, average, stdev, 99% and
    /// 99.9% percentiles (usec).
    fn row(&self) -> (usize, u64, Vec<f64>) {
        match self {
            Outcome::Bw(r) => (r.size, r.iters, vec![r.peak, r.avg, r.msg_rate]),
            Outcome::Lat(r) => (
                r.size,
                r.iters,
                vec![r.min, r.max, r.typical, r.avg, r.stdev, r.p99, r.p999],
            ),
        }
    }

    fn is_bw(&self) -> bool {
        matches!(self, Outcome::Bw(_))
    }
}

pub(crate) fn print_outcome(o: &Outcome) {
    let (size, iters, figures) = o.row();
    let columns = columns(o.is_bw());
    let (w_size, w_iters) = (columns[0].1, columns[1].1);
    let mut line = format!(" {size:<w_size$} {iters:<w_iters$}");
    for (x, &(_, width)) in figures.iter().zip(&columns[2..]) {
        // perftest's message rate has 6 decimals, all else 2.
        let decimals = if o.is_bw() && width == 0 { 6 } else { 2 };
        let _ = write!(line, " {x:<width$.decimals$}");
    }
    println!("{line}");
}

pub(crate) const CSV_HEADER: &str =
    "test,path,device,tenant,tx_depth,chunk_bytes,pieces,bytes,iterations,\
bw_peak_MBps,bw_avg_MBps,msg_rate_Mpps,t_min_us,t_max_us,t_typical_us,t_avg_us,t_stdev_us,\
t_p99_us,t_p99_9_us";

pub(crate) fn csv_line(p: &Params, device: &str, tenant: &str, o: &Outcome) -> String {
    let (size, iters, figures) = o.row();
    // The three bandwidth cells then the seven latency cells; the other
    // test's are empty.
    let mut cells = vec![String::new(); 10];
    if o.is_bw() {
        for (i, (cell, x)) in cells.iter_mut().zip(&figures).enumerate() {
            *cell = if i < 2 {
                format!("{x:.4}")
            } else {
                format!("{x:.6}")
            };
        }
    } else {
        for (cell, x) in cells[3..].iter_mut().zip(&figures) {
            *cell = format!("{x:.3}");
        }
    }
    format!(
        "{},{},{},{},{},{},{},{size},{iters},{}",
        p.test.name(),
        p.path.name(),
        device,
        tenant,
        if p.test.is_bw() { p.tx_depth } else { 1 },
        p.chunk,
        p.pieces,
        cells.join(",")
    )
}

/// Appends `samples` (ns) divided by `factor`, in usec, one per line,
/// after a line naming the size.
pub(crate) fn write_samples(
    path: &PathBuf,
    size: usize,
    samples: &[u64],
    factor: f64,
) -> Result<(), String> {
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

pub(crate) fn append_csv(path: &PathBuf, line: &str) -> Result<(), String> {
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

pub(crate) fn print_header(side: &Side, p: &Params, conn: &Conn, limited: Option<(usize, usize)>) {
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

/// What this process has used of the CPU so far, from `/proc/self`: the
/// cost of a path in CPU, which on an emulated host decides how much of a
/// link its senders can fill.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct CpuUse {
    /// User and system time, in clock ticks (`/proc` counts in 1/100 s).
    user_ticks: u64,
    system_ticks: u64,
    /// Times the process gave up the CPU to wait (a sleep on a completion
    /// channel, a timer) and times it was preempted.
    voluntary: u64,
    involuntary: u64,
    /// Read- and write-like system calls (`/proc/self/io`).
    reads: u64,
    writes: u64,
}

impl CpuUse {
    /// Now, or `None` where `/proc` does not say (then no CPU line).
    pub(crate) fn now() -> Option<CpuUse> {
        let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
        // The fields after the command name, which is in parentheses and
        // may hold spaces: utime and stime are the 14th and 15th.
        let rest = stat.get(stat.rfind(')')? + 1..)?;
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let field = |file: &str, key: &str| -> Option<u64> {
            file.lines()
                .find_map(|l| l.strip_prefix(key))?
                .trim()
                .parse()
                .ok()
        };
        let status = std::fs::read_to_string("/proc/self/status").ok()?;
        let io = std::fs::read_to_string("/proc/self/io").unwrap_or_default();
        Some(CpuUse {
            user_ticks: fields.get(11)?.parse().ok()?,
            system_ticks: fields.get(12)?.parse().ok()?,
            voluntary: field(&status, "voluntary_ctxt_switches:")?,
            involuntary: field(&status, "nonvoluntary_ctxt_switches:")?,
            reads: field(&io, "syscr:").unwrap_or(0),
            writes: field(&io, "syscw:").unwrap_or(0),
        })
    }

    /// One line on what was used between `before` and `after`, per
    /// `pieces` work requests posted (pieces of the scheduler's chunk, or
    /// the messages of the plain path).
    pub(crate) fn line(before: CpuUse, after: CpuUse, pieces: u64) -> String {
        let d = |a: u64, b: u64| a.saturating_sub(b);
        let user = d(after.user_ticks, before.user_ticks) as f64 / 100.0;
        let system = d(after.system_ticks, before.system_ticks) as f64 / 100.0;
        let per = |n: u64| n as f64 / pieces.max(1) as f64;
        format!(
            " CPU over the run: user {user:.2} s, system {system:.2} s ({:.1} us per work request, {pieces} requests); \
             per request {:.2} sleeps, {:.2} preemptions, {:.2} read and {:.2} write system calls",
            (user + system) * 1e6 / pieces.max(1) as f64,
            per(d(after.voluntary, before.voluntary)),
            per(d(after.involuntary, before.involuntary)),
            per(d(after.reads, before.reads)),
            per(d(after.writes, before.writes)),
        )
    }
}
