//! `cargo xtask demo`: the isolation demo on a real verbs device inside the
//! SoftRoCE VM.
//!
//! First every program on the demo's list
//! (`mtrdma-demo/src/bin/isolation/programs.rs`) is built; the scenarios find their programs through the same list. Then
//! one boot, with the shared link set up, runs the demo's [`Form`]:
//!
//! * the default (about five minutes): the link's rate (below), then
//!   mtrdma-demo's `isolation --link` (tenants as processes across the shaped
//!   link) with the latency tenant next to 1, 4 and 8 bulk tenants,
//!   weights, a cap and the control-path storm, 4 s a measurement;
//! * `--full` (about twenty minutes): first the overhead rounds on `rxe0`
//!   (perftest's `ib_write_lat` and `ib_write_bw` plain and under the
//!   preload library, mtrdma-demo's `perf` on the plain and on the
//!   scheduled path; see `overhead.rs`), then the link's rate, every
//!   scenario of `isolation --link` at its own length (the preloaded
//!   hogs, the adversarial table and the applications too) with the
//!   coordinator's kernel monitor, then the single-process
//!   `SharedScheduler` variant across the same link;
//! * `--short`: what `--full` runs, about a second a measurement, figures
//!   printed but not judged; `cargo xtask test` runs it through [`script`]
//!   and [`summary`] in its device tests' boot.
//!
//! Arguments after `--` go to `isolation --link`, after the form's own.
//! Each step prints when it starts (minutes into the job), and
//! `isolation` prints each scenario and measurement as it begins, with
//! about how long is left. Everything lands in `target/demo/`
//! (`target/demo-short/` for `--short`): the tools' outputs,
//! `reference.txt` (the overhead tables, `--full`), `link-rate.txt` (every
//! probe of the link and the rate chosen), `link/` and `single-process/`
//! (tables, CSV files, pictures and every process's output).
//!
//! The link's rate (`--link auto`, the default) is the highest, in steps
//! of 10 Mbit/s from 50 Mbit/s up to [`AUTO_CEILING_BPS`], at which
//! perftest's `ib_write_bw -s 4096` alone fills at least 95% of the link
//! in this boot: a binary search of 3-second probes (2-second ones but in
//! `--full`), each printed, after what rxe carries across the link
//! unshaped is measured and printed (see [`link::Search`]). Under
//! emulation the host's speed, not the link, sets what one sender moves,
//! and a link the senders cannot fill is not the bottleneck the tenants
//! share: their CPU is. `--link RATE` shapes the link to RATE instead (with a warning when
//! RATE is more than half of what rxe carries unshaped).
//!
//! The demo ends with every scenario and whether it ran, and exits
//! non-zero only when one could not run, naming it; a target not met is
//! in the tables.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context as _, Result};

use crate::programs::{Build, PROGRAMS};
use crate::status::{self, State};
use crate::{deps, link, overhead, proc, vm};

/// The fastest link the demo chooses by itself (`--link auto`, the
/// default; see [`link::Search`]): well above the fastest that
/// `ib_write_bw -s 4096` filled to 95% in boots on the machines measured
/// (200 Mbit/s; it filled 84% of 250 and 78% of 300 Mbit/s).
pub(crate) const AUTO_CEILING_BPS: u64 = 400_000_000;

/// Every probe of the link and the rate chosen, in the demo's directory.
const LINK_RATE_FILE: &str = "link-rate.txt";

/// The single-process run's scenarios (`isolation` without `--link`).
const SINGLE_PROCESS_ARGS: &str = "--chunk 4096 --budget 16384";

/// Which demo runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Form {
    /// The latency tenant next to 1, 4 and 8 bulk tenants, weights, a cap
    /// and the storm on the link, 4 s a measurement.
    Default,
    /// Everything: the overhead rounds, every link scenario at its own
    /// length with the kernel monitor, and the single-process variant.
    Full,
    /// What `Full` runs, about a second a measurement, not judged.
    Short,
}

/// The default form's scenarios of `isolation --link`, and its
/// measurements' length.
const DEFAULT_ARGS: &[&str] = &[
    "--scenarios",
    "latency,weights,cap,storm",
    "--bulk",
    "1,4,8",
    "--seconds",
    "4",
];

/// What a demo run does.
#[derive(Debug)]
pub(crate) struct Plan {
    pub(crate) form: Form,
    /// The cargo profile the programs are built and run in.
    pub(crate) release: bool,
    /// Measure the link and shape it (to a fixed rate, or to the one the
    /// search finds), or take the link as the boot set it up (`None`).
    pub(crate) calibrate: Option<(link::Link, link::RateChoice)>,
    /// Arguments for mtrdma-demo's `isolation --link`.
    pub(crate) isolation_args: Vec<String>,
}

impl Plan {
    fn profile_dir(&self) -> PathBuf {
        proc::target_dir().join(if self.release { "release" } else { "debug" })
    }

    pub(crate) fn program(&self, name: &str) -> PathBuf {
        let program = PROGRAMS
            .iter()
            .find(|p| p.name == name)
            .unwrap_or_else(|| panic!("{name} is on the demo's list of programs"));
        program.path(&self.profile_dir())
    }

    /// How long the overhead rounds run.
    fn settings(&self) -> overhead::Settings {
        if self.form == Form::Full {
            overhead::FULL
        } else {
            overhead::SHORT
        }
    }

    /// Whether the overhead rounds and the single-process run are in.
    fn whole_sweep(&self) -> bool {
        self.form != Form::Default
    }

    /// The demo's own steps, in order, before the link run.
    fn steps(&self) -> Vec<&'static str> {
        let mut steps = Vec::new();
        if self.whole_sweep() {
            steps.extend(["reference", "preload"]);
        }
        if self.calibrate.is_some() {
            steps.push("link rate");
        }
        steps
    }

    /// The runs of `isolation` it makes after its steps: the link run, and
    /// in the whole sweep the single-process one.
    fn runs(&self) -> &'static [(&'static str, &'static str)] {
        const LINK: (&str, &str) = ("link", "isolation --link");
        const SINGLE: (&str, &str) = ("single-process", "isolation (one process)");
        if self.whole_sweep() {
            &[LINK, SINGLE]
        } else {
            &[LINK]
        }
    }
}

/// `cargo xtask demo [--full|--short] [--link RATE] [-- ISOLATION-ARGS...]`.
pub(crate) fn run(rest: &[String]) -> Result<ExitCode> {
    let (ours, theirs) = match rest.iter().position(|a| a == "--") {
        Some(i) => (&rest[..i], &rest[i + 1..]),
        None => (rest, &[][..]),
    };
    let mut form = Form::Default;
    let mut rate = "auto".to_string();
    let mut it = ours.iter();
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--full" | "--short" if form != Form::Default => {
                anyhow::bail!("`cargo xtask demo` takes one of --full and --short")
            }
            "--full" => form = Form::Full,
            "--short" => form = Form::Short,
            "--link" => rate = link_rate_arg(it.next())?,
            other => anyhow::bail!(
                "`cargo xtask demo` takes [--full|--short] [--link RATE|auto] [-- ARGS for isolation --link], not {other:?}"
            ),
        }
    }
    let (link, choice) = link_choice(&rate, form != Form::Full)?;
    let plan = Plan {
        form,
        release: true,
        calibrate: Some((link.clone(), choice)),
        isolation_args: theirs.to_vec(),
    };
    deps::ensure()?;
    build(&plan)?;
    let out = proc::target_dir().join(if form == Form::Short {
        "demo-short"
    } else {
        "demo"
    });
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let opts = vm::Options {
        timeout: Duration::from_secs(40 * 60),
        rw_shares: vec![out.clone()],
        link: Some(link),
        ..vm::Options::default()
    };
    let outcome = vm::run(&opts, &vm::Job::script(script(&plan, &out)?));
    // What ran is summed up even when the VM did not finish.
    let (text, failed) = summary(&plan, &out, outcome.as_ref().map_or(-1, |o| o.exit_code));
    println!("\n{text}");
    println!("results, CSV and pictures: {}", out.display());
    outcome?;
    Ok(if failed.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// The value of `--link` (`RATE` or `auto`), as `demo` and `soak` take it.
pub(crate) fn link_rate_arg(value: Option<&String>) -> Result<String> {
    value
        .cloned()
        .context("--link needs a RATE (such as 100mbit) or auto")
}

/// The link the VM boots with and how the job chooses its rate, for
/// `--link RATE` (`auto`: the search, with short probes if `short`).
pub(crate) fn link_choice(rate: &str, short: bool) -> Result<(link::Link, link::RateChoice)> {
    if rate == "auto" {
        // The boot's link starts at the ceiling; the calibration at the
        // start of the job shapes it to the rate it finds.
        return Ok((
            link::Link::new(&format!("{AUTO_CEILING_BPS}bit"))?,
            link::RateChoice::Search(link::Search::new(AUTO_CEILING_BPS, short)),
        ));
    }
    let link = link::Link::new(rate)?;
    let bps = link.bits_per_second();
    if bps == 0 {
        anyhow::bail!(
            "the demo needs a shaped link (--link RATE such as 100mbit, or auto), not {rate}"
        );
    }
    Ok((link, link::RateChoice::Fixed(bps)))
}

/// The programs on the demo's list that are not built in `plan`'s
/// profile.
pub(crate) fn unbuilt(plan: &Plan) -> Vec<&'static str> {
    PROGRAMS
        .iter()
        .filter(|p| !p.path(&plan.profile_dir()).exists())
        .map(|p| p.name)
        .collect()
}

/// Builds every program on the demo's list in `plan`'s profile: the root
/// package's examples and mtrdma-demo's binaries in one build (one
/// resolution of features), the preload library in another.
pub(crate) fn build(plan: &Plan) -> Result<()> {
    let mut examples = proc::cargo();
    examples.args(["build", "-p", "mtrdma", "-p", "mtrdma-demo"]);
    let mut preload = proc::cargo();
    preload.arg("build");
    if plan.release {
        examples.arg("--release");
        preload.arg("--release");
    }
    for p in PROGRAMS {
        match p.build {
            Build::Example => examples.args(["--example", p.name]),
            Build::Demo => examples.args(["--bin", p.name]),
            Build::PreloadLibrary => preload.args(["-p", p.name]),
        };
    }
    proc::check(&mut examples)?;
    proc::check(&mut preload)
}

/// The demo as a script for the VM, writing into `out` (a directory the
/// VM shares writable).
pub(crate) fn script(plan: &Plan, out: &Path) -> Result<String> {
    let q = |p: &Path| proc::shell_quote(&p.display().to_string());
    let dir = q(out);
    let perf = q(&plan.program("perf"));
    let isolation = q(&plan.program("isolation"));
    let settings = plan.settings();
    let steps = format!("{dir}/{}", status::FILE);
    let mut script = format!(
        "# the demo ({form})\n\
         rm -rf {dir}/link {dir}/single-process {dir}/rounds; rm -f {steps} {dir}/{LINK_RATE_FILE} {dir}/reference.txt\n\
         for s in {names}; do printf '%s\\tpending\\n' \"$s\" >> {steps}; done\n\
         # step NAME WHY: records the step (WHY empty: it ran)\n\
         step() {{ if [ -z \"$2\" ]; then printf '%s\\tran\\n' \"$1\"; else printf '%s\\tdid not run\\t%s\\n' \"$1\" \"$2\"; fi >> {steps}; }}\n\
         # at WHAT: says that WHAT begins, minutes into the job\n\
         demo_t0=$(date +%s)\n\
         at() {{ e=$(( $(date +%s) - demo_t0 )); printf '== [%d:%02d] %s ==\\n' $((e / 60)) $((e % 60)) \"$*\"; }}\n",
        form = match plan.form {
            Form::Default => "default: latency, weights, cap and storm on the link",
            Form::Full => "full",
            Form::Short => "short form",
        },
        names = plan
            .steps()
            .iter()
            .map(|s| proc::shell_quote(s))
            .collect::<Vec<_>>()
            .join(" "),
    );
    if plan.whole_sweep() {
        let xtask = q(&std::env::current_exe().context("finding this program")?);
        script.push_str(
            "at 'the overhead rounds: perftest, perf raw and mtrdma, perftest preloaded'\n",
        );
        script.push_str(&overhead::script(
            &settings,
            &format!("{dir}/rounds"),
            &perf,
            &q(&plan.program("mtrdma-preload")),
            &xtask,
        ));
        script.push_str("step reference \"$ref_fail\"\nstep preload \"$preload_fail\"\n");
    }
    if let Some((link, choice)) = &plan.calibrate {
        script.push_str("at 'the link: what rxe carries unshaped, and the rate it is shaped to'\n");
        // The calibration exits the job when it fails: the summary then
        // says the link rate and everything after it did not run.
        script.push_str(&link.calibration_script(
            &perf,
            *choice,
            &format!("{dir}/{LINK_RATE_FILE}"),
        ));
        script.push_str("step 'link rate' ''\n");
    }
    let mut link_args: Vec<String> = Vec::new();
    let mut single_args: Vec<String> = Vec::new();
    match plan.form {
        Form::Default => link_args.extend(DEFAULT_ARGS.iter().map(|a| a.to_string())),
        Form::Full => link_args.push("--coordinator-monitor".into()),
        Form::Short => {
            // A second a measurement after half a second's lead; one
            // bulk count, and 64 KiB messages so that what unprotected
            // senders leave queued drains in moments.
            link_args.extend(
                [
                    "--seconds",
                    "1",
                    "--warmup-ms",
                    "500",
                    "--bulk",
                    "1",
                    "--msg",
                    "65536",
                    "--coordinator-monitor",
                ]
                .map(String::from),
            );
            single_args
                .extend(["--seconds", "1", "--warmup-ms", "200", "--bulk", "1"].map(String::from));
            script.push_str(
                "echo '(the short form: about a second a measurement, to show that every scenario \
                 runs; the met and NOT met in its tables are not the demo'\\''s figures)'\n",
            );
        }
    }
    link_args.extend(plan.isolation_args.iter().cloned());
    let words = |v: &[String]| -> String {
        v.iter()
            .map(|a| format!(" {}", proc::shell_quote(a)))
            .collect()
    };
    let _ = writeln!(
        script,
        "at 'isolation --link (tenants as processes on the shared link)'\n\
         {isolation} --link --out {dir}/link{}",
        words(&link_args),
    );
    if plan.whole_sweep() {
        let _ = writeln!(
            script,
            "at 'isolation, one process (SharedScheduler), rxa -> rxb'\n\
             {isolation} --device \"$MTRDMA_LINK_SENDER\" --peer-device \"$MTRDMA_LINK_RECEIVER\" \
             {SINGLE_PROCESS_ARGS} --out {dir}/single-process{}",
            words(&single_args),
        );
    }
    script.push_str("at 'the end'\n");
    Ok(script)
}

/// The summary a demo run ends with (the overhead tables, then every
/// scenario and whether it ran), also written to `out/reference.txt` and
/// `out/summary.txt`; and the scenarios that did not run, with why.
/// `exit_code` is the VM job's.
pub(crate) fn summary(plan: &Plan, out: &Path, exit_code: i32) -> (String, Vec<(String, String)>) {
    let settings = plan.settings();
    let rounds_dir = out.join("rounds");
    let read = |stem: &str| -> Option<Vec<f64>> {
        overhead::result_row(&std::fs::read_to_string(rounds_dir.join(format!("{stem}.txt"))).ok()?)
    };
    let rounds = overhead::Rounds::new(&read);
    // The overhead tables, of the forms that run the rounds.
    let reference = if plan.whole_sweep() {
        let table = rounds.table(&settings);
        let _ = std::fs::write(out.join("reference.txt"), &table);
        format!("{table}\n")
    } else {
        String::new()
    };

    let ended = if exit_code == 0 {
        "it did not finish".to_string()
    } else {
        format!("the VM job ended (exit status {exit_code}) before it")
    };
    let mut rows: Vec<(String, State)> = Vec::new();
    let read_states = |path: &Path| -> Option<Vec<(String, State)>> {
        Some(status::parse(&std::fs::read_to_string(path).ok()?))
    };
    let steps = read_states(&out.join(status::FILE)).unwrap_or_default();
    for step in plan.steps() {
        let mut state = steps
            .iter()
            .find(|(s, _)| s == step)
            .map_or(State::Pending, |(_, st)| st.clone());
        // Overhead steps whose every command ran may still have measured
        // nothing on a path.
        if state == State::Ran {
            if let Some(why) = (step != "link rate")
                .then(|| rounds.lacking(step))
                .flatten()
            {
                state = State::Failed(why);
            }
        }
        rows.push((step.to_string(), state));
    }
    for &(run, what) in plan.runs() {
        match read_states(&out.join(run).join(status::FILE)) {
            Some(states) if !states.is_empty() => {
                rows.extend(states.into_iter().map(|(s, st)| (format!("{run}/{s}"), st)))
            }
            _ => rows.push((
                run.to_string(),
                State::Failed(format!(
                    "{what} recorded no scenario ({} is missing): it could not start; see its output above",
                    out.join(run).join(status::FILE).display()
                )),
            )),
        }
    }
    let mut text = format!("{reference}==== the demo's scenarios ====\n");
    // The rate the link was shaped to: the report's last line.
    if plan.calibrate.is_some() {
        if let Ok(report) = std::fs::read_to_string(out.join(LINK_RATE_FILE)) {
            if let Some(line) = report.lines().rev().find(|l| !l.trim().is_empty()) {
                let _ = writeln!(text, "{line}");
            }
        }
    }
    let mut failed = Vec::new();
    for (name, state) in rows {
        let what = match state {
            State::Ran => "ran".to_string(),
            State::Pending => {
                let why = format!("not reached: {ended}");
                failed.push((name.clone(), why.clone()));
                format!("did not run ({why})")
            }
            State::Failed(why) => {
                failed.push((name.clone(), why.clone()));
                format!("did not run: {why}")
            }
        };
        let _ = writeln!(text, "{name:<28} {what}");
    }
    if failed.is_empty() {
        text.push_str("every scenario ran (whether each met its targets is in its table)\n");
    } else {
        let names: Vec<&str> = failed.iter().map(|(n, _)| n.as_str()).collect();
        let _ = writeln!(
            text,
            "{} scenario(s) did not run: {}",
            failed.len(),
            names.join(", ")
        );
    }
    let _ = std::fs::write(out.join("summary.txt"), &text);
    (text, failed)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Asserts that `text` contains every one of `parts`.
    fn contains_all(text: &str, parts: &[&str]) {
        for part in parts {
            assert!(text.contains(part), "{part:?} missing from:\n{text}");
        }
    }

    fn plan(form: Form) -> Plan {
        Plan {
            form,
            release: false,
            calibrate: None,
            isolation_args: Vec::new(),
        }
    }

    #[test]
    fn the_summary_names_every_scenario_that_did_not_run() {
        let out = std::env::temp_dir().join(format!("xtask-demo-summary-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&out);
        std::fs::create_dir_all(out.join("link")).unwrap();
        std::fs::write(
            out.join(status::FILE),
            "reference\tran\npreload\tdid not run\tib_write_bw under the preload library, round 1\n",
        )
        .unwrap();
        std::fs::write(
            out.join("link").join(status::FILE),
            "latency\tran\napps\tdid not run\tscenario apps starts remote_memory, which ...\nstorm\tpending\n",
        )
        .unwrap();
        // The reference step ran its commands but no round gave figures.
        let (text, failed) = summary(&plan(Form::Short), &out, 1);
        let names: Vec<&str> = failed.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "reference",
                "preload",
                "link/apps",
                "link/storm",
                "single-process"
            ],
            "{text}"
        );
        assert!(
            text.contains("no round of 0 rounds gave a figure"),
            "{text}"
        );
        contains_all(
            &text,
            &["link/latency", "starts remote_memory", "exit status 1"],
        );

        // Everything recorded as ran, with figures: nothing failed.
        std::fs::create_dir_all(out.join("rounds")).unwrap();
        for way in ["perftest", "raw", "mtrdma", "preload"] {
            let row = "#bytes\n 16 1000 1.0 2.0 3.0 4.0 5.0 6.0 7.0\n";
            std::fs::write(out.join(format!("rounds/lat_{way}_1.txt")), row).unwrap();
            std::fs::write(out.join(format!("rounds/bw_{way}_1.txt")), row).unwrap();
        }
        std::fs::write(out.join(status::FILE), "reference\tran\npreload\tran\n").unwrap();
        std::fs::write(out.join("link").join(status::FILE), "latency\tran\n").unwrap();
        std::fs::create_dir_all(out.join("single-process")).unwrap();
        std::fs::write(out.join("single-process").join(status::FILE), "cap\tran\n").unwrap();
        let (text, failed) = summary(&plan(Form::Short), &out, 0);
        assert!(failed.is_empty(), "{text}");
        assert!(text.contains("every scenario ran"), "{text}");
        std::fs::remove_dir_all(&out).ok();
    }

    #[test]
    fn the_short_form_runs_the_whole_sweep_briefly_and_does_not_judge() {
        let s = script(&plan(Form::Short), Path::new("/out")).unwrap();
        assert!(
            s.contains("--link --out /out/link --seconds 1 --warmup-ms 500"),
            "{s}"
        );
        contains_all(
            &s,
            &[
                "--coordinator-monitor",
                "perftest preloaded",
                "--out /out/single-process --seconds 1",
            ],
        );
        assert!(!s.contains("demo-rounds-decided"), "{s}");
        let mut full = plan(Form::Full);
        full.isolation_args = vec!["--bulk".into(), "2,6".into()];
        let s = script(&full, Path::new("/out")).unwrap();
        assert!(
            s.contains("--link --out /out/link --coordinator-monitor --bulk 2,6\n"),
            "{s}"
        );
        contains_all(&s, &["demo-rounds-decided", "--out /out/single-process\n"]);
    }

    #[test]
    fn the_default_form_runs_four_link_scenarios_and_says_when_each_step_begins() {
        let mut p = plan(Form::Default);
        p.calibrate = Some(link_choice("auto", true).unwrap());
        p.isolation_args = vec!["--seconds".into(), "5".into()];
        let s = script(&p, Path::new("/out")).unwrap();
        assert!(
            s.contains(
                "--link --out /out/link --scenarios latency,weights,cap,storm --bulk 1,4,8 \
                 --seconds 4 --seconds 5\n"
            ),
            "{s}"
        );
        // No overhead rounds and no single-process run.
        assert!(!s.contains("ib_write_lat"), "{s}");
        assert!(!s.contains("single-process --"), "{s}");
        contains_all(
            &s,
            &["at 'the link: what rxe carries unshaped", "at 'the end'"],
        );
        // Its summary does not ask for the steps it does not take.
        let out = std::env::temp_dir().join(format!("xtask-demo-default-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&out);
        std::fs::create_dir_all(out.join("link")).unwrap();
        std::fs::write(out.join(status::FILE), "link rate\tran\n").unwrap();
        std::fs::write(
            out.join("link").join(status::FILE),
            "latency\tran\nweights\tran\n",
        )
        .unwrap();
        let (text, failed) = summary(&p, &out, 0);
        assert!(failed.is_empty(), "{text}");
        assert!(!text.contains("overhead"), "{text}");
        assert!(!out.join("reference.txt").exists());
        std::fs::remove_dir_all(&out).ok();
    }

    #[test]
    fn auto_searches_up_to_the_ceiling_and_a_rate_is_kept() {
        let (link, choice) = link_choice("auto", false).unwrap();
        assert_eq!(link.bits_per_second(), AUTO_CEILING_BPS);
        assert_eq!(
            choice,
            link::RateChoice::Search(link::Search {
                ceiling: 400_000_000,
                probe_secs: 3
            })
        );
        let (_, short) = link_choice("auto", true).unwrap();
        assert!(matches!(short, link::RateChoice::Search(s) if s.probe_secs == 2));
        let (link, fixed) = link_choice("120mbit", true).unwrap();
        assert_eq!(link.bits_per_second(), 120_000_000);
        assert_eq!(fixed, link::RateChoice::Fixed(120_000_000));
        let err = link_choice("unshaped", false).unwrap_err().to_string();
        assert!(err.contains("needs a shaped link"), "{err}");
    }

    #[test]
    fn the_link_rate_is_searched_before_the_link_run_and_reported() {
        for (form, short, secs) in [(Form::Short, true, 2), (Form::Full, false, 3)] {
            let mut p = plan(form);
            p.calibrate = Some(link_choice("auto", short).unwrap());
            let s = script(&p, Path::new("/out")).unwrap();
            // A stale report from an earlier run goes first.
            assert!(
                s.contains("rm -f /out/scenarios.tsv /out/link-rate.txt /out/reference.txt\n"),
                "{s}"
            );
            let search = s.find("while [ $lo -le $hi ]").expect("the search runs");
            assert!(
                s.contains(&format!(
                    "ib_write_bw -x 1 -s 4096 -D {secs} -p 17998 -d rxa 127.0.0.1"
                )),
                "{s}"
            );
            contains_all(
                &s,
                &[
                    "lo=5; hi=40\n",
                    ": > /out/link-rate.txt\n",
                    "| tee -a /out/link-rate.txt",
                ],
            );
            let ran = s.find("step 'link rate' ''").unwrap();
            let isolation = s.find("--link --out /out/link").unwrap();
            assert!(search < ran && ran < isolation, "{s}");
        }
        let mut fixed = plan(Form::Full);
        fixed.calibrate = Some(link_choice("100mbit", false).unwrap());
        let s = script(&fixed, Path::new("/out")).unwrap();
        assert!(s.contains("rate=100000000\n"), "{s}");
        assert!(!s.contains("link_probe"), "{s}");
    }

    #[test]
    fn the_summary_gives_the_rate_the_link_was_shaped_to() {
        let out = std::env::temp_dir().join(format!("xtask-demo-rate-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&out);
        std::fs::create_dir_all(&out).unwrap();
        std::fs::write(
            out.join(LINK_RATE_FILE),
            "link: probe at 220 Mbit/s: ib_write_bw moved 19.07 MB/s, 72.7% of the link: short of 95%\n\
             link: the link is shaped to 160000000 bit/s (160 Mbit/s), the highest rate ...\n\n",
        )
        .unwrap();
        let mut p = plan(Form::Short);
        p.calibrate = Some(link_choice("auto", true).unwrap());
        let (text, _) = summary(&p, &out, 1);
        assert!(
            text.contains("\nlink: the link is shaped to 160000000 bit/s (160 Mbit/s)"),
            "{text}"
        );
        assert!(!text.contains("probe at"), "{text}");
        // Without a calibration (the test command's run) no report is read.
        let (text, _) = summary(&plan(Form::Short), &out, 1);
        assert!(!text.contains("shaped to"), "{text}");
        std::fs::remove_dir_all(&out).ok();
    }
}
