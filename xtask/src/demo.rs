//! `cargo xtask demo`: the isolation demo on a real verbs device inside the
//! SoftRoCE VM, next to perftest's own tools as the reference.
//!
//! One boot, with the shared link set up, runs in order: perftest's `ib_write_lat` (16 B) and
//! `ib_write_bw` (64 KiB) alone, the same two tests with mtrdma's
//! `examples/perf/` on the plain and on the scheduled path (all on
//! `rxe0`), then the link's rate: what rxe carries across it unshaped in
//! this boot is measured, and the link is shaped to half of that (at most
//! 200 Mbit/s; `--link RATE` shapes it to RATE instead), since under
//! emulation the host's speed sets what rxe carries and a faster link is
//! not the bottleneck; then `examples/isolation --link` (tenants as processes across
//! the shaped link; arguments after `--` go to it), then the single-process
//! `SharedScheduler` variant across the same link. Everything lands in
//! `target/demo/`: the tools' outputs, `reference.txt` (mtrdma against
//! perftest, with the ratios), `link/` and `single-process/` (tables, CSV
//! files, pictures and every process's output).

use std::fmt::Write as _;
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context as _, Result};

use crate::{deps, link, proc, vm};

const LAT_ITERS: u32 = 20_000;
const BW_ITERS: u32 = 2_000;
const BW_SIZE: u32 = 65_536;
/// Rounds of plain and preloaded perftest, in turn (medians reported).
const PRELOAD_ROUNDS: u32 = 3;

/// The fastest link the demo chooses by itself (`--link auto`, the
/// default): half of what rxe carries unshaped in the same boot, at most
/// this.
pub(crate) const AUTO_CEILING_BPS: u64 = 200_000_000;

/// `cargo xtask demo [--link RATE] [-- ISOLATION-ARGS...]`.
pub(crate) fn run(rest: &[String]) -> Result<ExitCode> {
    let (ours, theirs) = match rest.iter().position(|a| a == "--") {
        Some(i) => (&rest[..i], &rest[i + 1..]),
        None => (rest, &[][..]),
    };
    let rate = match ours {
        [] => "auto".to_string(),
        [flag, rate] if flag == "--link" => rate.clone(),
        other => anyhow::bail!(
            "`cargo xtask demo` takes [--link RATE|auto] [-- ARGS for examples/isolation --link], not {other:?}"
        ),
    };
    // The boot's link starts at the ceiling; the calibration at the start
    // of the job shapes it to the rate it chooses (or to RATE).
    let (link, fixed) = if rate == "auto" {
        (link::Link::new(&format!("{AUTO_CEILING_BPS}bit"))?, None)
    } else {
        let link = link::Link::new(&rate)?;
        let bps = link.bits_per_second();
        if bps == 0 {
            anyhow::bail!(
                "the demo needs a shaped link (--link RATE such as 100mbit, or auto), not {rate}"
            );
        }
        (link, Some(bps))
    };
    deps::ensure()?;
    proc::check(proc::cargo().args([
        "build",
        "--release",
        "--example",
        "isolation",
        "--example",
        "perf",
        "--example",
        "coordinator",
    ]))?;
    // Unmodified perftest programs as tenants (the link's hogs scenario).
    proc::check(proc::cargo().args(["build", "--release", "-p", "mtrdma-preload"]))?;
    let examples = proc::target_dir().join("release/examples");
    let out = proc::target_dir().join("demo");
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let q = |p: &Path| proc::shell_quote(&p.display().to_string());
    let (perf, isolation, dir) = (
        q(&examples.join("perf")),
        q(&examples.join("isolation")),
        q(&out),
    );
    // perftest needs a server and a client; both run here, over localhost,
    // both with the environment `env` (empty, or the preload library).
    let perftest_env = |env: &str, tool: &str, args: &str, file: &str| {
        format!(
            "echo '== {env}{tool} {args} (perftest, alone) =='\n\
             {env}{tool} -d rxe0 -x 1 {args} > \"$TMPDIR/{file}.server\" 2>&1 &\n\
             sleep 1\n\
             {env}{tool} -d rxe0 -x 1 {args} localhost > {dir}/{file}.txt 2>&1 || status=1\n\
             wait\n\
             cat {dir}/{file}.txt\n"
        )
    };
    let perftest = |tool: &str, args: &str, file: &str| perftest_env("", tool, args, file);
    let ours = |args: &str, file: &str| {
        format!(
            "echo '== perf {args} =='\n\
             {perf} --loopback --device rxe0 {args} > {dir}/{file}.txt 2>&1 || status=1\n\
             cat {dir}/{file}.txt\n"
        )
    };
    let lat = format!("-s 16 -n {LAT_ITERS}");
    let bw = format!("-s {BW_SIZE} -n {BW_ITERS}");
    let mut script = String::from("status=0\n");
    script.push_str(&perftest("ib_write_lat", &lat, "ib_write_lat"));
    script.push_str(&ours(
        &format!("--test write_lat {lat} --path raw"),
        "perf_write_lat_raw",
    ));
    script.push_str(&ours(
        &format!("--test write_lat {lat} --path mtrdma"),
        "perf_write_lat_mtrdma",
    ));
    script.push_str(&perftest("ib_write_bw", &bw, "ib_write_bw"));
    script.push_str(&ours(
        &format!("--test write_bw {bw} --path raw"),
        "perf_write_bw_raw",
    ));
    script.push_str(&ours(
        // The same depth in the NIC as perftest's 128 outstanding.
        &format!("--test write_bw {bw} --path mtrdma --pieces 128"),
        "perf_write_bw_mtrdma",
    ));
    // Unmodified perftest under the preload library, one tenant alone:
    // plain and preloaded in turn, the latency test as a latency tenant,
    // the bandwidth test as a bulk one.
    let preload = q(&proc::target_dir().join("release/libmtrdma_preload.so"));
    for (class, file) in [("latency", "preload-latency"), ("bulk", "preload-bulk")] {
        let _ = writeln!(
            script,
            "printf '[link]\\ncapacity = \"100Gbit\"\\n[[tenant]]\\nid = 1\\nname = \"t\"\\nclass = \"{class}\"\\n' > \"$TMPDIR/{file}.toml\""
        );
    }
    for round in 1..=PRELOAD_ROUNDS {
        for (tool, args, class) in [
            ("ib_write_lat", &lat, "latency"),
            ("ib_write_bw", &bw, "bulk"),
        ] {
            script.push_str(&perftest(
                tool,
                args,
                &format!("preload_{tool}_plain_{round}"),
            ));
            let env =
                format!("LD_PRELOAD={preload} MTRDMA_POLICY=\"$TMPDIR/preload-{class}.toml\" ");
            script.push_str(&perftest_env(
                &env,
                tool,
                args,
                &format!("preload_{tool}_lib_{round}"),
            ));
        }
    }
    script.push_str(
        "echo '== the link: what rxe carries unshaped, and the rate it is shaped to =='\n",
    );
    script.push_str(&link.calibration_script(
        &perf,
        fixed,
        AUTO_CEILING_BPS,
        &format!("{dir}/link-rate.txt"),
    ));
    let extra: Vec<String> = theirs.iter().map(|a| proc::shell_quote(a)).collect();
    // The single-process variant bounds the bulk bytes in the NIC to one
    // budget: 16 KiB, what a latency request may find ahead of it.
    let _ = writeln!(
        script,
        "echo '== examples/isolation --link (tenants as processes on the shared link) =='\n\
         {isolation} --link --out {dir}/link {} || status=1\n\
         echo '== examples/isolation, one process (SharedScheduler), rxa -> rxb =='\n\
         {isolation} --device \"$MTRDMA_LINK_SENDER\" --peer-device \"$MTRDMA_LINK_RECEIVER\" \
         --chunk 4096 --budget 16384 --out {dir}/single-process || status=1\nexit $status",
        extra.join(" ")
    );
    let opts = vm::Options {
        timeout: Duration::from_secs(30 * 60),
        rw_shares: vec![out.clone()],
        link: Some(link),
        ..vm::Options::default()
    };
    let outcome = vm::run(&opts, &vm::Job::script(script))?;
    let reference = reference(&out)?;
    println!("\n{reference}");
    std::fs::write(out.join("reference.txt"), &reference)
        .with_context(|| format!("writing {}", out.join("reference.txt").display()))?;
    println!("results, CSV and pictures: {}", out.display());
    Ok(ExitCode::from(u8::try_from(outcome.exit_code).unwrap_or(1)))
}

/// The first result row under perftest's `#bytes` header, as numbers.
fn result_row(text: &str) -> Option<Vec<f64>> {
    let mut lines = text.lines().skip_while(|l| !l.contains("#bytes"));
    lines.next()?;
    lines
        .map(|l| {
            l.split_whitespace()
                .map(str::parse::<f64>)
                .collect::<Result<Vec<_>, _>>()
        })
        .find_map(|row| row.ok().filter(|r| r.len() >= 5))
}

/// mtrdma's perf against perftest, from the files the VM wrote.
fn reference(out: &Path) -> Result<String> {
    let read = |file: &str| -> Option<Vec<f64>> {
        let text = std::fs::read_to_string(out.join(format!("{file}.txt"))).ok()?;
        result_row(&text)
    };
    let mut s = String::from(
        "mtrdma's own overhead, one tenant alone (SoftRoCE under emulation, same VM boot)\n",
    );
    let _ = writeln!(
        s,
        "{:<34} {:>12} {:>12} {:>12} {:>14}",
        "test", "perftest", "perf raw", "perf mtrdma", "mtrdma/perftest"
    );
    // write_lat columns: bytes iters t_min t_max t_typical t_avg t_stdev p99 p99.9
    let lats = [
        read("ib_write_lat"),
        read("perf_write_lat_raw"),
        read("perf_write_lat_mtrdma"),
    ];
    for (name, col) in [
        ("write_lat 16 B t_typical (us)", 4),
        ("write_lat 16 B t_avg (us)", 5),
        ("write_lat 16 B p99 (us)", 7),
    ] {
        row(&mut s, name, &lats, col);
    }
    // write_bw columns: bytes iters peak avg msgrate
    let bws = [
        read("ib_write_bw"),
        read("perf_write_bw_raw"),
        read("perf_write_bw_mtrdma"),
    ];
    row(&mut s, "write_bw 64 KiB BW average (MB/s)", &bws, 3);
    s.push_str("(write_bw: 128 outstanding on every path; mtrdma with --pieces 128)\n");
    s.push_str(
        "targets: mtrdma latency within 5% of ib_write_lat (ratio <= 1.05), \
         bandwidth at least 95% of ib_write_bw (ratio >= 0.95)\n",
    );
    s.push_str(&preload_reference(&read));
    Ok(s)
}

/// Unmodified perftest with and without the preload library: medians of
/// the rounds run in turn.
fn preload_reference(read: &dyn Fn(&str) -> Option<Vec<f64>>) -> String {
    let median = |mut v: Vec<f64>| -> Option<f64> {
        v.sort_by(f64::total_cmp);
        (!v.is_empty()).then(|| v[v.len() / 2])
    };
    let runs = |tool: &str, way: &str, col: usize| -> Vec<f64> {
        (1..=PRELOAD_ROUNDS)
            .filter_map(|r| read(&format!("preload_{tool}_{way}_{r}")))
            .filter_map(|row| row.get(col).copied())
            .collect()
    };
    let mut s = format!(
        "\nunmodified perftest under the preload library (libmtrdma_preload.so), one tenant alone: \
         {PRELOAD_ROUNDS} rounds, plain and preloaded in turn, medians\n"
    );
    let _ = writeln!(
        s,
        "{:<34} {:>12} {:>12} {:>10}  each round (plain / preloaded)",
        "test", "plain", "preloaded", "ratio"
    );
    let cases = [
        (
            "ib_write_lat",
            "write_lat 16 B t_typical (us)",
            4,
            "latency tenant",
            1.15,
            false,
        ),
        (
            "ib_write_bw",
            "write_bw 64 KiB BW average (MB/s)",
            3,
            "bulk tenant",
            0.95,
            true,
        ),
    ];
    for (tool, name, col, who, target, at_least) in cases {
        let (plain, lib) = (runs(tool, "plain", col), runs(tool, "lib", col));
        let pairs: Vec<String> = plain
            .iter()
            .zip(&lib)
            .map(|(p, l)| format!("{p:.2}/{l:.2}"))
            .collect();
        let (mp, ml) = (median(plain), median(lib));
        let ratio = match (mp, ml) {
            (Some(p), Some(l)) if p > 0.0 => Some(l / p),
            _ => None,
        };
        let verdict = match ratio {
            Some(r) if (at_least && r >= target) || (!at_least && r <= target) => "met",
            Some(_) => "NOT met",
            None => "missing",
        };
        let cell = |x: Option<f64>| x.map_or_else(|| "missing".to_string(), |x| format!("{x:.2}"));
        let _ = writeln!(
            s,
            "{name:<34} {:>12} {:>12} {:>10}  {}  ({who}; target {} {target}: {verdict})",
            cell(mp),
            cell(ml),
            ratio.map_or_else(|| "-".to_string(), |r| format!("{r:.3}")),
            pairs.join(" "),
            if at_least { ">=" } else { "<=" },
        );
    }
    s
}

fn row(s: &mut String, name: &str, runs: &[Option<Vec<f64>>; 3], col: usize) {
    let v: Vec<Option<f64>> = runs
        .iter()
        .map(|r| r.as_ref().and_then(|r| r.get(col).copied()))
        .collect();
    let cell = |x: Option<f64>| x.map_or_else(|| "missing".to_string(), |x| format!("{x:.2}"));
    let ratio = match (v[2], v[0]) {
        (Some(m), Some(p)) if p > 0.0 => format!("{:.3}", m / p),
        _ => "-".to_string(),
    };
    let _ = writeln!(
        s,
        "{name:<34} {:>12} {:>12} {:>12} {:>14}",
        cell(v[0]),
        cell(v[1]),
        cell(v[2]),
        ratio
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_preload_table_takes_medians_of_rounds_in_turn() {
        let read = |file: &str| -> Option<Vec<f64>> {
            let round: f64 = file.rsplit('_').next()?.parse().ok()?;
            let lib = file.contains("_lib_");
            if file.starts_with("preload_ib_write_lat") {
                // t_typical in column 4: plain 10, 11, 12; preloaded 11, 12, 30.
                let t = if lib {
                    [11.0, 12.0, 30.0]
                } else {
                    [10.0, 11.0, 12.0]
                };
                Some(vec![16.0, 1.0, 0.0, 0.0, t[round as usize - 1]])
            } else {
                // Bandwidth in column 3: plain 60, 62, 64; preloaded 58.
                let b = if lib { 58.0 } else { 58.0 + 2.0 * round };
                Some(vec![65536.0, 1.0, 0.0, b, 0.0])
            }
        };
        let s = preload_reference(&read);
        assert!(s.contains("11.00        12.00      1.091"), "{s}");
        assert!(s.contains("target <= 1.15: met"), "{s}");
        assert!(s.contains("62.00        58.00      0.935"), "{s}");
        assert!(s.contains("target >= 0.95: NOT met"), "{s}");
        assert!(s.contains("10.00/11.00 11.00/12.00 12.00/30.00"), "{s}");
    }

    #[test]
    fn reads_perftest_result_rows() {
        let lat = " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] \n 16      2000          20.75          761.87       25.61    \t       31.52       \t29.07  \t\t156.02  \t\t596.04 \n---\n";
        let row = result_row(lat).unwrap();
        assert_eq!(row.len(), 9);
        assert_eq!((row[4], row[7]), (25.61, 156.02));
        let bw = " #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]\n Conflicting CPU frequency values detected: 0.0 != 1.0\n 65536      1000             24.74              19.62  \t\t   0.000314\n";
        let row = result_row(bw).unwrap();
        assert_eq!(row[3], 19.62);
        assert!(result_row("no header here\n 1 2 3 4 5\n").is_none());
    }
}
