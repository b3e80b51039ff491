//! The demo's overhead figures, one tenant alone on `rxe0`: the
//! demo's `perf` (mtrdma-demo) against perftest's `ib_write_lat`/`ib_write_bw`, and
//! the same perftest programs under the preload library against plain.
//!
//! Under emulation one run moves by a third from the next, more than the
//! effects measured, so the paths run in alternating, paired rounds in one
//! boot (each round runs every path once, in reverse order every other
//! round), and a figure with a target is the median of the per-round
//! ratios, printed with their interquartile range. A target is judged only
//! when that range is narrower than the distance from the median to the
//! target; rounds are added (up to a limit) until every target is decided,
//! and a figure still undecided then is reported so, not as met or not
//! met.

use std::fmt::Write as _;
use std::path::Path;

use crate::proc;

/// How long the overhead measurements run.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Settings {
    pub(crate) lat_iters: u32,
    pub(crate) bw_iters: u32,
    /// Rounds before targets are first judged.
    pub(crate) min_rounds: u32,
    /// Rounds at most, decided or not.
    pub(crate) max_rounds: u32,
    /// Whether targets are judged (not in the short form).
    pub(crate) judged: bool,
}

/// The demo's settings.
pub(crate) const FULL: Settings = Settings {
    lat_iters: 10_000,
    bw_iters: 1_000,
    min_rounds: 3,
    max_rounds: 9,
    judged: true,
};

/// The short form's (`cargo xtask demo --short`, and the test command):
/// two rounds, so that the spread is printed, figures not judged.
pub(crate) const SHORT: Settings = Settings {
    lat_iters: 1_000,
    bw_iters: 100,
    min_rounds: 2,
    max_rounds: 2,
    judged: false,
};

const BW_SIZE: u32 = 65_536;
/// The TCP port perftest's server listens on by default.
const PERFTEST_PORT: u32 = 18_515;

/// The figures with a target: (label, test, numerator path, column,
/// target, whether the ratio must be at least the target).
const JUDGED: [(&str, &str, &str, usize, f64, bool); 4] = [
    ("write_lat 16 B t_typical", "lat", "mtrdma", 4, 1.05, false),
    ("write_bw 64 KiB BW average", "bw", "mtrdma", 3, 0.95, true),
    ("ib_write_lat t_typical", "lat", "preload", 4, 1.15, false),
    ("ib_write_bw BW average", "bw", "preload", 3, 0.95, true),
];

/// The rounds, as a shell script for the VM: files in `rounds` (a quoted
/// directory), `perf` and `preload` the quoted paths of mtrdma-demo's `perf`
/// and the preload library, `xtask` the quoted path of this program (it
/// judges whether more rounds are needed). Sets `ref_fail` and
/// `preload_fail` to what failed, if anything.
pub(crate) fn script(s: &Settings, rounds: &str, perf: &str, preload: &str, xtask: &str) -> String {
    let lat = format!("-s 16 -n {}", s.lat_iters);
    let bw = format!("-s {BW_SIZE} -n {}", s.bw_iters);
    let mut out = format!(
        "rm -rf {rounds}; mkdir -p {rounds}\n\
         ref_fail=; preload_fail=\n\
         printf '[link]\\ncapacity = \"100Gbit\"\\n[[tenant]]\\nid = 1\\nname = \"t\"\\nclass = \"latency\"\\n' > \"$TMPDIR/preload-lat.toml\"\n\
         printf '[link]\\ncapacity = \"100Gbit\"\\n[[tenant]]\\nid = 1\\nname = \"t\"\\nclass = \"bulk\"\\n' > \"$TMPDIR/preload-bw.toml\"\n\
         # pt HOW TOOL FILE ARGS...: perftest's server and client on rxe0 over\n\
         # localhost, plain or (HOW = lat, bw) under the preload library as that tenant\n\
         pt() {{\n\
         how=$1; tool=$2; file=$3; shift 3\n\
         if [ \"$how\" = plain ]; then set -- \"$tool\" -d rxe0 -x 1 \"$@\"\n\
         else set -- env LD_PRELOAD={preload} MTRDMA_POLICY=\"$TMPDIR/preload-$how.toml\" \"$tool\" -d rxe0 -x 1 \"$@\"; fi\n\
         \"$@\" > \"$TMPDIR/$file.server\" 2>&1 &\n\
         server=$!\n\
         # the client once the server listens on perftest's port,\n\
         # up to 30 s (the preloaded server, a debug build, took over the\n\
         # second once waited, and its client gave up)\n\
         {listening}\n\
         \"$@\" localhost > {rounds}/$file.txt 2>&1; rc=$?\n\
         # a client that failed leaves its server waiting for it\n\
         [ $rc = 0 ] || kill $server 2>/dev/null\n\
         wait\n\
         # perftest gives no report when it cannot calibrate the CPU's clock\n\
         # (now and then under emulation): a round without this figure\n\
         grep -q \"Can't produce a report\" {rounds}/$file.txt && return 0\n\
         return $rc\n\
         }}\n\
         # ours FILE ARGS...: perf in loopback on rxe0\n\
         ours() {{ file=$1; shift; {perf} --loopback --device rxe0 \"$@\" > {rounds}/$file.txt 2>&1; }}\n\
         round() {{\n\
         k=$1\n\
         for test in lat bw; do\n\
         if [ $test = lat ]; then tool=ib_write_lat; t=write_lat; a=\"{lat}\"; extra=\n\
         else tool=ib_write_bw; t=write_bw; a=\"{bw}\"; extra=\"--pieces 128\"; fi\n\
         order=\"perftest raw mtrdma preload\"\n\
         if [ $((k % 2)) = 0 ]; then order=\"preload mtrdma raw perftest\"; fi\n\
         for way in $order; do\n\
         f=${{test}}_${{way}}_$k\n\
         case $way in\n\
         perftest) pt plain $tool $f $a || ref_fail=\"$tool, round $k ({rounds}/$f.txt)\" ;;\n\
         raw) ours $f --test $t $a --path raw || ref_fail=\"perf --test $t --path raw, round $k ({rounds}/$f.txt)\" ;;\n\
         mtrdma) ours $f --test $t $a --path mtrdma $extra || ref_fail=\"perf --test $t --path mtrdma, round $k ({rounds}/$f.txt)\" ;;\n\
         preload) pt $test $tool $f $a || preload_fail=\"$tool under the preload library, round $k ({rounds}/$f.txt)\" ;;\n\
         esac\n\
         done\n\
         done\n\
         }}\n\
         k=0\n\
         while [ $k -lt {max} ]; do\n\
         k=$((k + 1))\n\
         echo \"== overhead, round $k: perftest, perf raw, perf mtrdma, perftest preloaded ==\"\n\
         round $k\n",
        max = s.max_rounds,
        listening = proc::wait_listening_sh(PERFTEST_PORT, 300),
    );
    if s.judged {
        let _ = writeln!(
            out,
            "if [ $k -ge {min} ] && {xtask} demo-rounds-decided {rounds}; then break; fi",
            min = s.min_rounds
        );
    }
    out.push_str("done\n");
    out
}

/// The numbers of the first result row under perftest's `#bytes` header
/// (perf prints the same).
pub(crate) fn result_row(text: &str) -> Option<Vec<f64>> {
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

/// The rounds' results as written in a directory, each file read once.
pub(crate) struct Rounds {
    /// The result row of each file stem that has one (`lat_perftest_3`).
    rows: std::collections::HashMap<String, Vec<f64>>,
    /// How many rounds ran (the highest round with any result).
    pub(crate) count: u32,
}

impl Rounds {
    /// From `read`, which gives the result row of a file stem
    /// (`lat_perftest_3`), asked once for every stem of every round until
    /// a round has none.
    pub(crate) fn new(read: &dyn Fn(&str) -> Option<Vec<f64>>) -> Rounds {
        let mut rows = std::collections::HashMap::new();
        let mut count = 0;
        for k in 1..=64 {
            let mut any = false;
            for t in ["lat", "bw"] {
                for w in ["perftest", "raw", "mtrdma", "preload"] {
                    let stem = format!("{t}_{w}_{k}");
                    if let Some(row) = read(&stem) {
                        rows.insert(stem, row);
                        any = true;
                    }
                }
            }
            if !any {
                break;
            }
            count = k;
        }
        Rounds { rows, count }
    }

    /// Column `col` of `test`'s `way` in each round (`None` where missing).
    fn values(&self, test: &str, way: &str, col: usize) -> Vec<Option<f64>> {
        (1..=self.count)
            .map(|k| {
                self.rows
                    .get(&format!("{test}_{way}_{k}"))
                    .and_then(|r| r.get(col).copied())
            })
            .collect()
    }

    /// The per-round ratios of `way` to plain perftest, in rounds where
    /// both have a figure.
    fn ratios(&self, test: &str, way: &str, col: usize) -> Vec<f64> {
        self.values(test, way, col)
            .into_iter()
            .zip(self.values(test, "perftest", col))
            .filter_map(|(x, p)| match (x, p) {
                (Some(x), Some(p)) if p > 0.0 => Some(x / p),
                _ => None,
            })
            .collect()
    }

    /// The median of `test`'s `way` at `col` over the rounds.
    fn median(&self, test: &str, way: &str, col: usize) -> Option<f64> {
        let v: Vec<f64> = self.values(test, way, col).into_iter().flatten().collect();
        quantile(&v, 0.5)
    }
}

/// The `q` quantile of `v`, interpolated linearly between order
/// statistics.
fn quantile(v: &[f64], q: f64) -> Option<f64> {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    if s.is_empty() {
        return None;
    }
    let pos = q * (s.len() - 1) as f64;
    let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
    Some(s[lo] + (s[hi] - s[lo]) * (pos - lo as f64))
}

/// A ratio against its target.
#[derive(Debug, PartialEq)]
pub(crate) enum Verdict {
    Met,
    NotMet,
    /// The spread of the rounds is as wide as the distance to the target.
    Undecided,
    /// Short form: printed, not judged.
    NotJudged,
    Missing,
}

impl Verdict {
    fn text(&self) -> &'static str {
        match self {
            Verdict::Met => "met",
            Verdict::NotMet => "NOT met",
            Verdict::Undecided => "undecided in this boot",
            Verdict::NotJudged => "not judged (short form)",
            Verdict::Missing => "missing",
        }
    }
}

/// Per-round ratios summed up: median, interquartile range, verdict.
pub(crate) struct Judged {
    pub(crate) median: Option<f64>,
    pub(crate) iqr: Option<(f64, f64)>,
    pub(crate) verdict: Verdict,
}

/// Judges `ratios` against `target`: decided when their interquartile
/// range is narrower than the distance from their median to the target
/// (and there are at least two rounds).
pub(crate) fn judge(ratios: &[f64], target: f64, at_least: bool, judged: bool) -> Judged {
    let median = quantile(ratios, 0.5);
    let iqr = quantile(ratios, 0.25).zip(quantile(ratios, 0.75));
    let verdict = match (median, iqr) {
        (None, _) | (_, None) => Verdict::Missing,
        _ if !judged => Verdict::NotJudged,
        (Some(m), Some((lo, hi))) => {
            if ratios.len() < 2 || hi - lo >= (m - target).abs() {
                Verdict::Undecided
            } else if (at_least && m >= target) || (!at_least && m <= target) {
                Verdict::Met
            } else {
                Verdict::NotMet
            }
        }
    };
    Judged {
        median,
        iqr,
        verdict,
    }
}

impl Rounds {
    /// What a step's rounds lack: the first of its paths and tests that
    /// gave no figure in any round (`step`: `reference` or `preload`).
    pub(crate) fn lacking(&self, step: &str) -> Option<String> {
        let ways: &[&str] = if step == "preload" {
            &["perftest", "preload"]
        } else {
            &["perftest", "raw", "mtrdma"]
        };
        ["lat", "bw"].iter().find_map(|test| {
            let col = if *test == "lat" { 4 } else { 3 };
            ways.iter()
                .find(|way| self.median(test, way, col).is_none())
                .map(|way| {
                    format!(
                        "no round of {} rounds gave a figure for {test} on the {way} path (see rounds/{test}_{way}_*.txt)",
                        self.count
                    )
                })
        })
    }

    /// How many of the judged figures are decided (met or not met), of
    /// how many.
    pub(crate) fn decided_count(&self) -> (usize, usize) {
        let decided = JUDGED
            .iter()
            .filter(|&&(_, test, way, col, target, at_least)| {
                matches!(
                    judge(&self.ratios(test, way, col), target, at_least, true).verdict,
                    Verdict::Met | Verdict::NotMet
                )
            })
            .count();
        (decided, JUDGED.len())
    }

    /// The two tables: perf against perftest, and perftest preloaded
    /// against plain.
    pub(crate) fn table(&self, s: &Settings) -> String {
        let cell = |x: Option<f64>| x.map_or_else(|| "missing".to_string(), |x| format!("{x:.2}"));
        let ratio = |x: Option<f64>| x.map_or_else(|| "-".to_string(), |x| format!("{x:.3}"));
        let range = |x: Option<(f64, f64)>| {
            x.map_or_else(|| "-".to_string(), |(a, b)| format!("{a:.3}-{b:.3}"))
        };
        let mut out = format!(
            "mtrdma's own overhead, one tenant alone on rxe0 (SoftRoCE under emulation, one VM boot): \
             {} rounds, each path once a round, in reverse order every other round; medians over the \
             rounds, and the median of the per-round ratios with their interquartile range\n",
            self.count
        );
        let _ = writeln!(
            out,
            "{:<34} {:>9} {:>9} {:>11} {:>7} {:>13} {:>8}  verdict",
            "test", "perftest", "perf raw", "perf mtrdma", "ratio", "ratio IQR", "target"
        );
        let rows = [
            (
                "write_lat 16 B t_typical (us)",
                "lat",
                4,
                Some((1.05, false)),
            ),
            ("write_lat 16 B t_avg (us)", "lat", 5, None),
            ("write_lat 16 B p99 (us)", "lat", 7, None),
            (
                "write_bw 64 KiB BW average (MB/s)",
                "bw",
                3,
                Some((0.95, true)),
            ),
        ];
        for (name, test, col, target) in rows {
            let (t, at_least) = target.unwrap_or((f64::NAN, false));
            let j = judge(
                &self.ratios(test, "mtrdma", col),
                t,
                at_least,
                s.judged && target.is_some(),
            );
            let _ = writeln!(
                out,
                "{name:<34} {:>9} {:>9} {:>11} {:>7} {:>13} {:>8}  {}",
                cell(self.median(test, "perftest", col)),
                cell(self.median(test, "raw", col)),
                cell(self.median(test, "mtrdma", col)),
                ratio(j.median),
                range(j.iqr),
                target.map_or_else(
                    || "-".to_string(),
                    |(t, at_least)| format!("{} {t}", if at_least { ">=" } else { "<=" })
                ),
                if target.is_some() {
                    j.verdict.text()
                } else {
                    "-"
                },
            );
        }
        out.push_str(
            "(ratio: perf mtrdma / perftest in the same round; write_bw: 128 outstanding on every \
             path, mtrdma with --pieces 128)\n",
        );
        let _ = writeln!(
            out,
            "\nunmodified perftest under the preload library (libmtrdma_preload.so), one tenant alone, \
             in the same rounds"
        );
        let _ = writeln!(
            out,
            "{:<34} {:>9} {:>9} {:>7} {:>13} {:>8}  {:<24} each round (plain/preloaded)",
            "test", "plain", "preloaded", "ratio", "ratio IQR", "target", "verdict"
        );
        for &(name, test, way, col, target, at_least) in &JUDGED[2..] {
            let j = judge(&self.ratios(test, way, col), target, at_least, s.judged);
            let pairs: Vec<String> = self
                .values(test, "perftest", col)
                .into_iter()
                .zip(self.values(test, way, col))
                .map(|(p, l)| format!("{}/{}", cell(p), cell(l)))
                .collect();
            let who = if test == "lat" {
                "latency tenant"
            } else {
                "bulk tenant"
            };
            let _ = writeln!(
                out,
                "{:<34} {:>9} {:>9} {:>7} {:>13} {:>8}  {:<24} {}  ({who})",
                format!("{name} {}", if test == "lat" { "(us)" } else { "(MB/s)" }),
                cell(self.median(test, "perftest", col)),
                cell(self.median(test, way, col)),
                ratio(j.median),
                range(j.iqr),
                format!("{} {target}", if at_least { ">=" } else { "<=" }),
                j.verdict.text(),
                pairs.join(" "),
            );
        }
        if s.judged {
            let _ = writeln!(
                out,
                "(a target is judged when the ratios' interquartile range is narrower than the \
                 distance from their median to it; rounds were added, up to {}, until every one was)",
                s.max_rounds
            );
        }
        out
    }
}

/// `xtask demo-rounds-decided DIR`, run in the VM between rounds: exits 0
/// when every target is decided on the rounds in DIR so far.
pub(crate) fn decided_command(rest: &[String]) -> anyhow::Result<std::process::ExitCode> {
    let [dir] = rest else {
        anyhow::bail!("usage: xtask demo-rounds-decided DIR");
    };
    let dir = Path::new(dir);
    let read = |stem: &str| -> Option<Vec<f64>> {
        result_row(&std::fs::read_to_string(dir.join(format!("{stem}.txt"))).ok()?)
    };
    let rounds = Rounds::new(&read);
    let (decided, all) = rounds.decided_count();
    println!(
        "overhead: {} rounds, {decided} of {all} targets decided",
        rounds.count
    );
    Ok(if decided == all {
        std::process::ExitCode::SUCCESS
    } else {
        std::process::ExitCode::FAILURE
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rounds whose results come from `lat(way, k)` and `bw(way, k)`.
    fn rounds_of(
        n: u32,
        lat: impl Fn(&str, u32) -> f64,
        bw: impl Fn(&str, u32) -> f64,
    ) -> impl Fn(&str) -> Option<Vec<f64>> {
        move |stem: &str| {
            let mut parts = stem.split('_');
            let (test, way, k) = (parts.next()?, parts.next()?, parts.next()?.parse().ok()?);
            if k > n {
                return None;
            }
            Some(if test == "lat" {
                let t = lat(way, k);
                vec![16.0, 1.0, 0.0, 0.0, t, t, 0.0, t]
            } else {
                vec![65536.0, 1.0, 0.0, bw(way, k), 0.0]
            })
        }
    }

    #[test]
    fn the_rounds_script_is_valid_shell_and_waits_for_the_server_to_listen() {
        let script = script(&FULL, "/tmp/r", "/t/perf", "/t/lib.so", "/t/xtask");
        crate::proc::assert_valid_shell(&script);
        assert!(script.contains("/proc/net/tcp"), "{script}");
        assert!(!script.contains("sleep 1\n"), "{script}");
    }

    #[test]
    fn a_target_is_judged_only_when_the_rounds_agree() {
        // Steady rounds well inside their targets: decided, met.
        let read = rounds_of(
            3,
            |w, _| if w == "perftest" { 10.0 } else { 10.2 },
            |_, _| 40.0,
        );
        let rounds = Rounds::new(&read);
        assert_eq!(rounds.count, 3);
        assert_eq!(rounds.decided_count(), (4, 4));
        let t = rounds.table(&FULL);
        assert!(t.contains("1.020"), "{t}");
        assert!(!t.contains("undecided"), "{t}");

        // Latency rounds spread across the preload target: undecided.
        let read = rounds_of(
            3,
            |w, k| match (w, k) {
                ("preload", 1) => 11.72,
                ("preload", 2) => 17.01,
                ("preload", 3) => 16.44,
                (_, 1) => 11.72 / 1.03,
                (_, 2) => 10.82,
                _ => 15.12,
            },
            |_, _| 40.0,
        );
        let rounds = Rounds::new(&read);
        assert_eq!(rounds.decided_count(), (3, 4));
        let t = rounds.table(&FULL);
        assert!(t.contains("undecided in this boot"), "{t}");

        // Clearly past a target: decided, not met.
        let read = rounds_of(
            4,
            |_, _| 10.0,
            |w, k| {
                if w == "mtrdma" {
                    30.0 + f64::from(k) * 0.1
                } else {
                    40.0
                }
            },
        );
        let rounds = Rounds::new(&read);
        assert_eq!(rounds.decided_count(), (4, 4));
        assert!(rounds.table(&FULL).contains("NOT met"));
        // The short form prints and does not judge.
        let t = rounds.table(&SHORT);
        assert!(t.contains("not judged (short form)"), "{t}");
        assert!(!t.contains("NOT met"), "{t}");
    }

    #[test]
    fn judges_from_the_median_and_the_interquartile_range() {
        let j = judge(&[1.0, 1.02, 1.04], 1.15, false, true);
        assert_eq!(j.verdict, Verdict::Met);
        assert_eq!(j.median, Some(1.02));
        assert_eq!(j.iqr, Some((1.01, 1.03)));
        assert_eq!(
            judge(&[1.0, 1.3], 1.15, false, true).verdict,
            Verdict::Undecided
        );
        assert_eq!(judge(&[1.1], 1.15, false, true).verdict, Verdict::Undecided);
        assert_eq!(
            judge(&[0.9, 0.91, 0.9], 0.95, true, true).verdict,
            Verdict::NotMet
        );
        assert_eq!(judge(&[], 0.95, true, true).verdict, Verdict::Missing);
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
