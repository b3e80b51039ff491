//! `cargo xtask test`: every check and test, device tests included.
//!
//! Stages: deps, `cargo fmt --check`, `cargo clippy -D warnings`, the
//! book (`mdbook build docs`), `cargo test --workspace` (and the
//! examples' unit tests) on the host, the quota table's protocols
//! between processes model-checked with loom, the tests of memory a
//! device may leave unwritten under Miri, each cargo-fuzz target for
//! 20 s (as many at once as there are CPUs), then the device tests (the
//! `#[ignore]`d ones) of every test binary with `--ignored` against a real
//! verbs device: `rxe0` inside one boot of the SoftRoCE VM, or the host's
//! device named by `MTRDMA_TEST_DEVICE` when that is set. The VM boot also
//! sets up the shared link at [`link::TEST_RATE`], so tests may use the
//! devices `MTRDMA_LINK_SENDER` and `MTRDMA_LINK_RECEIVER` when those are set.
//! Before the device tests, the same boot runs the demo in its short form
//! (`cargo xtask demo --short`, in the debug build): a scenario of the demo
//! that cannot run fails the stage, named; and then a minute of the soak
//! (`cargo xtask soak`), whose failure fails the stage too. Last, `cargo
//! package` (every published crate built from its package alone).
//!
//! Two builds run from the loom stage on under the idle scheduling policy,
//! on CPU time the foreground and the VM leave (the VM's device tests leave
//! much of the host idle): the package verification, joined as the last
//! stage, and the preload library's release build, which the device tests
//! wait for after the demo's short form and the soak.

use std::fmt::Write as _;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Result;

use crate::proc::{self, TestCounts};
use crate::{book, demo, deps, fuzz, link, loom, miri, soak, vm};

/// The stages a full run goes through: deps, fmt, clippy, book, host
/// tests, loom, miri, fuzz, package, device tests.
const STAGES: usize = 10;

/// How long each fuzz target runs: seven targets, two at a time on this
/// machine's two CPUs, a minute of fuzzing in all.
pub(crate) const FUZZ_TIME: Duration = Duration::from_secs(15);

/// How long the device tests wait for the preload library's release build.
const PRELOAD_WAIT: Duration = Duration::from_secs(20 * 60);

/// The device tests' budget inside the VM.
const VM_TIMEOUT: Duration = Duration::from_secs(40 * 60);

/// The device tests run on SoftiWARP as well, as (test binary, name
/// filter): the rdma_cm ones, the preload library under perftest's rdma_cm
/// mode, the reliable-connected data path, direct and scheduled, its
/// completion events, the shared scheduler, shared receive queues and the
/// async API (their queue pairs connect through rdma_cm on iWARP).
const SIW_TESTS: [(&str, &str); 8] = [
    ("cm-", ""),
    ("programs-", "rdma_cm"),
    ("rc-", ""),
    ("scheduled-", ""),
    ("events-", ""),
    ("shared-", ""),
    ("srq-", ""),
    ("asynchronous-", ""),
];

/// Device tests that do not apply to SoftiWARP, as (test, why): they are
/// skipped there and listed as not applicable.
const SIW_NOT_APPLICABLE: [(&str, &str); 16] = [
    (
        "atomics_change_the_peers_word_and_return_what_it_held",
        "no atomic operations",
    ),
    (
        "a_send_to_a_peer_without_receives_fails_after_bounded_retries",
        "iWARP has no receiver-not-ready retries",
    ),
    (
        "a_stuck_queue_pair_does_not_hold_the_others_bulk_traffic",
        "iWARP has no receiver-not-ready retries",
    ),
    ("a_ud_datagram_wakes_a_waiting_server", "iWARP has no datagrams"),
    (
        "ud_queue_pairs_share_one_srq_and_each_receive_names_its_source",
        "iWARP has no datagrams",
    ),
    (
        "datagrams_posted_with_the_queue_pairs_own_send_resolve_to_their_own_regions",
        "iWARP has no datagrams",
    ),
    (
        "one_thread_answers_64_rc_clients_through_one_srq_one_cq_and_one_channel",
        "it connects its 64 clients by exchanging endpoints, which iWARP cannot; cm's tests accept 64 clients through rdma_cm onto one shared completion queue and receive queue there",
    ),
    (
        "removing_a_queue_pair_hands_back_its_flushed_requests",
        "it posts on a queue pair before connecting it by endpoint, which iWARP cannot",
    ),
    (
        "window::a_peer_reaches_a_lent_piece_through_its_own_connection_until_it_is_taken_back",
        "no memory windows",
    ),
    (
        "window::what_cannot_be_lent_is_refused_with_its_region_and_a_dropped_queue_pair_frees_its_loans",
        "no memory windows",
    ),
    (
        "window::a_lent_pieces_key_reaches_nothing_of_the_registration_outside_the_piece",
        "no memory windows",
    ),
    (
        "a_scheduled_queue_pair_lends_a_piece_and_takes_it_back_among_its_pieces",
        "no memory windows",
    ),
    (
        "a_write_with_immediate_sent_whole_shows_its_length_to_the_peer",
        "iWARP carries no immediate data",
    ),
    (
        "the_peer_destroyed_mid_transfer_gives_errors_and_buffers_back",
        SIW_LOSES_POSTS,
    ),
    (
        "batch::a_batch_to_a_peer_that_is_gone_comes_back_failed_each_request_once",
        SIW_LOSES_POSTS,
    ),
    (
        "batch::a_gather_the_peer_refuses_and_those_flushed_after_it_hand_every_region_back",
        SIW_LOSES_POSTS,
    ),
];

/// Why tests that post to a queue pair whose peer is gone do not apply:
/// SoftiWARP never completes what is posted once the queue pair is in the
/// error state (its kernel flushes the send queue when the state changes,
/// and a doorbell afterwards flushes nothing), so those requests come
/// back only when the queue pair is destroyed.
const SIW_LOSES_POSTS: &str =
    "SoftiWARP never completes requests posted once its queue pair is in the error state";

struct Stage {
    name: &'static str,
    ok: bool,
    detail: String,
    counts: Option<TestCounts>,
    took: Duration,
}

pub(crate) fn run() -> Result<ExitCode> {
    // Cargo cleans its home's caches once a day, from whichever command
    // runs first after the day is out. One that ran beside the package
    // verification deleted the sources that verification had unpacked
    // from its local registry, mid-build (rustc: "No such file or
    // directory"). Every command this one runs (they inherit the
    // environment) leaves the caches alone; cargo's own commands outside
    // it still clean them. Set before any thread starts.
    std::env::set_var("CARGO_CACHE_AUTO_CLEAN_FREQUENCY", "never");
    let mut stages = Vec::new();
    let mut stage = |name, f: &mut dyn FnMut() -> Result<(bool, String, Option<TestCounts>)>| {
        println!("\n==== {name} ====");
        let start = Instant::now();
        let (ok, detail, counts) = f().unwrap_or_else(|e| (false, format!("{e:#}"), None));
        if !ok {
            eprintln!("xtask test: stage {name} FAILED: {detail}");
        }
        stages.push(Stage {
            name,
            ok,
            detail,
            counts,
            took: start.elapsed(),
        });
        ok
    };

    // Without the packages nothing else can build.
    if stage("deps", &mut || {
        deps::ensure()?;
        Ok((true, format!("{} packages", deps::PACKAGES.len()), None))
    }) {
        stage("fmt", &mut || {
            let ok = proc::status(proc::cargo().args(["fmt", "--all", "--", "--check"]))?;
            Ok((ok, String::new(), None))
        });
        stage("clippy", &mut || {
            let ok = proc::status(proc::cargo().args([
                "clippy",
                "--workspace",
                "--all-targets",
                "--",
                "-D",
                "warnings",
            ]))?;
            Ok((ok, String::new(), None))
        });
        stage("book", &mut || {
            let (ok, front) = book::run()?;
            Ok((ok, front, None))
        });
        stage("host tests", &mut || {
            let (ok, mut out) = proc::tee(proc::cargo().args([
                "test",
                "--workspace",
                "--no-fail-fast",
                "--color",
                "never",
            ]))?;
            // The examples' own unit tests: `cargo test` builds examples
            // as programs (the device tests run them), `--examples` as
            // test harnesses. With `--lib` every package is in the build,
            // as above, and so are the features of its build-time
            // dependencies: without it `bindgen` and what depends on it
            // build again with other features. Only the examples'
            // harnesses run (the libraries' ran above).
            let harnesses = test_executables(&["--examples", "--lib"], Some("example"))?;
            if harnesses.is_empty() {
                anyhow::bail!("cargo test --examples --no-run built no example harness");
            }
            let mut examples_ok = true;
            for harness in harnesses {
                let (ran, text) = proc::tee(
                    std::process::Command::new(&harness)
                        .args(["--color", "never"])
                        .current_dir(proc::workspace_root()),
                )?;
                examples_ok &= ran;
                out.push_str(&text);
            }
            let counts = TestCounts::parse(&out);
            Ok((
                ok && examples_ok && counts.failed == 0,
                String::new(),
                Some(counts),
            ))
        });
        // Two builds run under the idle scheduling policy from here on,
        // on CPU time the stages in the foreground and the VM leave: every
        // published crate packaged and built from its package alone, and
        // the preload library optimised for the device tests.
        let mut package = Some(start_package());
        let mut preload = Some(proc::Background::start_idle(
            "the release build of the preload library",
            proc::cargo().args(["build", "--release", "-p", "mtrdma-preload"]),
            &proc::target_dir().join("xtask-logs/preload-release.log"),
        ));
        stage("loom", &mut loom::run);
        stage("miri", &mut || {
            let (ok, detail) = miri::run()?;
            Ok((ok, detail, None))
        });
        stage("fuzz", &mut || {
            let detail = fuzz::run(FUZZ_TIME)?;
            Ok((true, detail, None))
        });
        stage("device tests", &mut || {
            device_tests(preload.take().expect("started once")?)
        });
        stage("package", &mut || {
            let (ok, detail) = package.take().expect("joined once")?.join()?;
            Ok((ok, detail, None))
        });
    }

    println!("\n==== summary ====");
    let mut total = TestCounts::default();
    for s in &stages {
        let mut line = format!(
            "{:<13} {:<6} {:>6.1} s",
            s.name,
            if s.ok { "ok" } else { "FAILED" },
            s.took.as_secs_f64()
        );
        if let Some(c) = s.counts {
            let _ = write!(
                line,
                "  {} passed, {} failed, {} ignored",
                c.passed, c.failed, c.ignored
            );
            total.passed += c.passed;
            total.failed += c.failed;
        }
        if !s.detail.is_empty() {
            let _ = write!(line, "  ({})", s.detail.lines().next().unwrap_or_default());
        }
        println!("{line}");
    }
    println!("total: {} passed, {} failed", total.passed, total.failed);
    // Every stage ran (a stage that could not start stops the run early).
    let ok = stages.len() == STAGES && stages.iter().all(|s| s.ok);
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// Starts `cargo package` of every published crate, in the background:
/// each packages and builds from its package alone (README, licence and
/// metadata included), in dependency order.
fn start_package() -> Result<proc::Background> {
    // Verification builds each package against the others as registry
    // crates, which cargo takes as unchanging for a name and version:
    // stale copies and builds from earlier runs must go.
    forget_packaged_sources()?;
    let target = proc::target_dir().join("package-verify");
    if target.exists() {
        std::fs::remove_dir_all(&target)?;
    }
    proc::Background::start_idle(
        "cargo package (every published crate built from its package)",
        proc::cargo()
            // The verification builds only have to compile: without
            // debuginfo or incremental state they take less of the CPU the
            // foreground stages share.
            .env("CARGO_PROFILE_DEV_DEBUG", "0")
            .env("CARGO_INCREMENTAL", "0")
            .args([
                "package",
                "--workspace",
                "--exclude",
                "xtask",
                // The demo's programs are not published.
                "--exclude",
                "mtrdma-demo",
                "--allow-dirty",
                "--quiet",
                "--target-dir",
            ])
            .arg(&target),
        &proc::target_dir().join("xtask-logs/package.log"),
    )
}

/// Removes cargo's unpacked copies of this workspace's crates from earlier
/// `cargo package` runs. Packaging verifies each crate against the others'
/// packages through a local registry, and cargo unpacks a package of a
/// given name and version once: a copy left by an earlier run would be
/// built instead of the one just packaged. Only local registries (whose
/// directories' names start with `-`) are touched; nothing of crates.io.
/// (The builds of such copies are kept apart in their own target
/// directory, removed before each run.)
fn forget_packaged_sources() -> Result<()> {
    let home = std::env::var_os("CARGO_HOME")
        .map(std::path::PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| std::path::Path::new(&h).join(".cargo")));
    let Some(home) = home else {
        return Ok(());
    };
    let ours = [
        "mtrdma-",
        "mtrdma-core-",
        "mtrdma-sched-",
        "mtrdma-verbs-",
        "mtrdma-preload-",
    ];
    for kind in ["src", "cache"] {
        let Ok(registries) = std::fs::read_dir(home.join("registry").join(kind)) else {
            continue;
        };
        for registry in registries.flatten() {
            if !registry.file_name().to_string_lossy().starts_with('-') {
                continue;
            }
            for entry in std::fs::read_dir(registry.path())?.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                let version = |prefix: &str| {
                    name.strip_prefix(prefix)
                        .is_some_and(|rest| rest.starts_with(|c: char| c.is_ascii_digit()))
                };
                if ours.iter().any(|p| version(p)) {
                    let path = entry.path();
                    if path.is_dir() {
                        std::fs::remove_dir_all(&path)?;
                    } else {
                        std::fs::remove_file(&path)?;
                    }
                }
            }
        }
    }
    Ok(())
}

/// Builds the test binaries and runs their ignored (device) tests, in the VM
/// or on the host device named by `MTRDMA_TEST_DEVICE`. In the VM the same
/// boot first runs the demo in its short form, through the demo's own
/// [`demo::script`] and [`demo::summary`]: every scenario for about a
/// second a measurement, so that a program missing from the demo's list, a
/// renamed flag or a scenario that cannot start fails the tests, named.
/// The link tests that check a demo scenario's table read that run
/// (`MTRDMA_DEMO_SHORT`) rather than run the scenario again.
fn device_tests(preload: proc::Background) -> Result<(bool, String, Option<TestCounts>)> {
    let binaries = test_binaries()?;
    // `cargo test` built the examples on the demo's list; this build adds
    // the preload library, with the features of the whole workspace (a
    // `cargo build` of a few programs would resolve other features and
    // build their dependencies again).
    if !proc::status(proc::cargo().args(["build", "--workspace", "--all-targets"]))? {
        anyhow::bail!("building the demo's programs failed");
    }
    // Programs preload the library optimised in the device tests, which
    // compare them with and without it. Its release build may still be
    // running (on the CPU time the VM leaves) when the VM boots: it is
    // handed over through a directory the VM shares writable, and the
    // device tests, after the demo's short form and the soak, wait for it.
    let handoff = proc::target_dir().join("preload-release");
    if handoff.exists() {
        std::fs::remove_dir_all(&handoff)?;
    }
    std::fs::create_dir_all(&handoff)?;
    let library = handoff.join("libmtrdma_preload.so");
    let waiter = std::thread::spawn({
        let (handoff, library) = (handoff.clone(), library.clone());
        move || -> Result<(bool, String)> {
            let (ok, detail) = preload.join()?;
            if ok {
                std::fs::copy(
                    proc::target_dir().join("release/libmtrdma_preload.so"),
                    &library,
                )?;
            }
            std::fs::write(handoff.join(if ok { "built" } else { "failed" }), &detail)?;
            Ok((ok, detail))
        }
    });
    let mut script = format!(
        "status=0\n\
         waited=0\n\
         while [ ! -e {dir}/built ] && [ ! -e {dir}/failed ] && [ $waited -lt {limit} ]; do sleep 1; waited=$((waited + 1)); done\n\
         if [ -e {dir}/built ]; then echo \"the preload library's release build: ready (waited $waited s for it)\"; \
         else echo \"the preload library's release build FAILED or did not finish: its tests fail\"; status=1; fi\n\
         export MTRDMA_PRELOAD_LIB={library}\n",
        dir = proc::shell_quote(&handoff.display().to_string()),
        library = proc::shell_quote(&library.display().to_string()),
        limit = PRELOAD_WAIT.as_secs(),
    );
    for bin in &binaries {
        let _ = writeln!(
            script,
            "echo '==> {name}'\n{bin} --ignored --test-threads=1 --color never || status=1",
            name = bin.rsplit('/').next().unwrap_or(bin),
            bin = proc::shell_quote(bin),
        );
    }
    script.push_str(&siw_script(&binaries));
    // The soak (in the VM's boot, before the device tests) fails the stage
    // too.
    script.push_str(
        "if [ -n \"${soak_fail:-}\" ]; then echo \"soak failed: $soak_fail\"; status=1; fi\nexit $status\n",
    );

    let (ok, out, where_) = match std::env::var("MTRDMA_TEST_DEVICE") {
        Ok(device) if std::env::var_os("MTRDMA_VM").is_none() => {
            let (ok, out) = proc::tee(std::process::Command::new("sh").arg("-c").arg(&script))?;
            (
                ok,
                out,
                format!("host device {device}; the demo's short form needs the VM's link and did not run"),
            )
        }
        _ => {
            // The demo's short form, in the debug build the tests use.
            let demo_plan = demo::Plan {
                form: demo::Form::Short,
                release: false,
                calibrate: None,
                isolation_args: Vec::new(),
            };
            let unbuilt = demo::unbuilt(&demo_plan);
            if !unbuilt.is_empty() {
                anyhow::bail!(
                    "`cargo build --workspace --all-targets` did not build the demo's {}",
                    unbuilt.join(", ")
                );
            }
            let demo_out = proc::target_dir().join("demo-short");
            std::fs::create_dir_all(&demo_out)?;
            // The link's rate is the highest that ib_write_bw fills in
            // this boot, at most the test rate (the demo's search, with its
            // short probes), so that on a slow host it is still the link,
            // not the tenants' CPU, that queues.
            let perf = proc::target_dir().join("debug/perf");
            let link = link::Link::new(link::TEST_RATE)?;
            let calibration = link.calibration_script(
                &proc::shell_quote(&perf.display().to_string()),
                link::RateChoice::Search(link::Search::new(link.bits_per_second(), true)),
                "\"$TMPDIR/link-rate.txt\"",
            );
            let script = format!(
                "export MTRDMA_TEST_DEVICE=rxe0\n{calibration}\
                 echo '==== the demo, short form (cargo xtask demo --short) ===='\n\
                 ( {} )\n\
                 export MTRDMA_DEMO_SHORT={}\n\
                 {}\
                 echo '==== device tests ===='\n{script}",
                demo::script(&demo_plan, &demo_out)?,
                proc::shell_quote(&demo_out.display().to_string()),
                soak::script(
                    &proc::target_dir().join("debug/isolation"),
                    soak::TEST_SECONDS,
                    &demo_out.join("soak"),
                ),
            );
            let opts = vm::Options {
                timeout: VM_TIMEOUT,
                link: Some(link),
                rw_shares: vec![demo_out.clone(), handoff.clone()],
                ..vm::Options::default()
            };
            let outcome = vm::run(&opts, &vm::Job::script(script))?;
            let (summary, failed) = demo::summary(&demo_plan, &demo_out, 0);
            println!("\n{summary}");
            if failed.is_empty() {
                let soak = if outcome.stdout.contains("soak failed:") {
                    "; the soak FAILED"
                } else {
                    " and a minute's soak"
                };
                (
                    outcome.exit_code == 0,
                    outcome.stdout,
                    format!("rxe0 in the SoftRoCE VM, after the demo's short form (every scenario ran){soak}"),
                )
            } else {
                let names: Vec<String> = failed
                    .iter()
                    .map(|(name, why)| format!("{name} ({why})"))
                    .collect();
                (
                    false,
                    outcome.stdout,
                    format!("the demo's short form: did not run: {}", names.join("; ")),
                )
            }
        }
    };
    let (built, built_detail) = waiter
        .join()
        .map_err(|_| anyhow::anyhow!("handing the preload library over panicked"))??;
    if !built {
        return Ok((false, built_detail, Some(TestCounts::parse(&out))));
    }
    let counts = TestCounts::parse(&out);
    if counts.passed == 0 {
        return Ok((false, format!("{where_}: no device test ran"), Some(counts)));
    }
    Ok((ok && counts.failed == 0, where_, Some(counts)))
}

/// The test executables of the workspace, built on the host.
fn test_binaries() -> Result<Vec<String>> {
    let bins = test_executables(&[], None)?;
    if bins.is_empty() {
        anyhow::bail!("cargo test --no-run built no test binaries");
    }
    Ok(bins)
}

/// Builds `cargo test --workspace --no-run` with `extra` arguments and
/// returns the test executables it made, of targets of `kind` only when
/// given (`"example"`, `"test"`, `"lib"`).
fn test_executables(extra: &[&str], kind: Option<&str>) -> Result<Vec<String>> {
    let out = proc::output(
        proc::cargo()
            .args(["test", "--workspace", "--no-run"])
            .args(extra)
            .arg("--message-format=json-render-diagnostics"),
    )?;
    Ok(executables(&out, kind))
}

/// The test executables in cargo's JSON messages, sorted, each once.
fn executables(messages: &str, kind: Option<&str>) -> Vec<String> {
    let mut bins = Vec::new();
    for line in messages.lines() {
        let Ok(msg) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let is_test = msg["reason"] == "compiler-artifact" && msg["profile"]["test"] == true;
        let of_kind = kind.is_none_or(|k| {
            msg["target"]["kind"]
                .as_array()
                .is_some_and(|kinds| kinds.iter().any(|x| x == k))
        });
        if let (true, true, Some(exe)) = (is_test, of_kind, msg["executable"].as_str()) {
            bins.push(exe.to_string());
        }
    }
    bins.sort();
    bins.dedup();
    bins
}

/// The device stage's part on SoftiWARP: each of `binaries` that
/// `SIW_TESTS` names run on siw0 with the tests that do not apply skipped,
/// then the list of those, each with why (a shell script's lines).
fn siw_script(binaries: &[String]) -> String {
    let mut script = String::new();
    // The second provider: SoftiWARP (siw0, which the VM sets up) connects
    // only through rdma_cm. The tests run on it (SIW_TESTS) connect that
    // way there; what it lacks is skipped and listed as not applicable
    // (SIW_NOT_APPLICABLE). The other device tests (UD, and those of the
    // applications and the preload library) connect by exchanging
    // endpoints and are not run on it.
    let skips: String = SIW_NOT_APPLICABLE
        .iter()
        .map(|(test, _)| format!(" --skip {test}"))
        .collect();
    for (prefix, filter) in SIW_TESTS {
        let Some(bin) = binaries
            .iter()
            .find(|b| b.rsplit('/').next().is_some_and(|n| n.starts_with(prefix)))
        else {
            continue;
        };
        let _ = writeln!(
            script,
            "if [ -e /sys/class/infiniband/siw0 ]; then\n\
             echo '==> {name} {filter} on siw0 (SoftiWARP)'\n\
             MTRDMA_TEST_DEVICE=siw0 {bin} {filter} --ignored --test-threads=1 --color never{skips} || status=1\n\
             elif [ -n \"${{MTRDMA_VM:-}}\" ]; then echo 'siw0 (SoftiWARP) is missing in the VM'; status=1\n\
             else echo 'no siw0: {name} did not run on SoftiWARP'; fi",
            name = bin.rsplit('/').next().unwrap_or(bin),
            bin = proc::shell_quote(bin),
        );
    }
    script.push_str("echo 'not applicable on siw0 (SoftiWARP), not run there:'\n");
    for (test, why) in SIW_NOT_APPLICABLE {
        let line = format!("  {test}: {why}");
        let _ = writeln!(script, "echo {}", proc::shell_quote(&line));
    }
    script
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_softiwarp_script_is_valid_shell_and_names_every_test_that_does_not_apply() {
        let binaries = vec!["/t/deps/rc-1".to_string(), "/t/deps/cm-2".to_string()];
        let script = super::siw_script(&binaries);
        crate::proc::assert_valid_shell(&script);
        // The list, run as it is (no siw0 here, no MTRDMA_VM: the test
        // binaries are not run), says each test and why, word for word.
        let out = std::process::Command::new("sh")
            .args(["-c", &script])
            .env_remove("MTRDMA_VM")
            .output()
            .expect("sh runs");
        let text = String::from_utf8_lossy(&out.stdout);
        for (test, why) in super::SIW_NOT_APPLICABLE {
            assert!(text.contains(&format!("  {test}: {why}\n")), "{text}");
        }
    }

    #[test]
    fn only_test_executables_of_the_kind_asked_for_are_run() {
        let artifact = |kind: &str, exe: &str, test: bool| {
            serde_json::json!({
                "reason": "compiler-artifact",
                "target": { "kind": [kind], "name": "x" },
                "profile": { "test": test },
                "executable": exe,
            })
            .to_string()
        };
        let messages = [
            artifact("lib", "/t/deps/core-1", true),
            artifact("example", "/t/examples/rpc-2", true),
            artifact("example", "/t/examples/rpc", false),
            artifact("test", "/t/deps/link-3", true),
            artifact("example", "/t/examples/rpc-2", true),
            r#"{"reason":"build-finished","success":true}"#.to_string(),
            "not json".to_string(),
        ]
        .join("\n");
        assert_eq!(
            super::executables(&messages, Some("example")),
            ["/t/examples/rpc-2"]
        );
        assert_eq!(
            super::executables(&messages, None),
            ["/t/deps/core-1", "/t/deps/link-3", "/t/examples/rpc-2"]
        );
    }
}
