//! The fuzz stage of `cargo xtask test`: every cargo-fuzz target for a short,
//! bounded time, built once and then run as many at a time as there are
//! CPUs.
//!
//! Uses the nightly toolchain with AddressSanitizer when rustup has one;
//! otherwise the current toolchain with `RUSTC_BOOTSTRAP=1` and no
//! sanitizer (coverage-guided fuzzing still works). cargo-fuzz is installed
//! with `cargo install` when missing.

use std::process::Command;
use std::time::Duration;

use anyhow::{bail, Result};

use crate::proc;

/// The fuzz targets (`fuzz/fuzz_targets/*.rs`).
pub(crate) const TARGETS: &[&str] = &[
    "policy_file",
    "quota_table",
    "engine_rules",
    "registration",
    "registry_wire",
    "data_path",
    "host_reports",
];

fn has_nightly() -> bool {
    proc::output(Command::new("cargo").args(["+nightly", "--version"])).is_ok()
}

fn has_cargo_fuzz() -> bool {
    proc::output(Command::new("cargo").args(["fuzz", "--version"])).is_ok()
}

/// `cargo fuzz` on the toolchain chosen: nightly when rustup has it (with
/// AddressSanitizer), else the current one with `RUSTC_BOOTSTRAP=1` and
/// no sanitizer; `-O`, in the workspace root.
fn cargo_fuzz(nightly: bool, subcommand: &str) -> Command {
    let mut cmd = Command::new("cargo");
    if nightly {
        cmd.arg("+nightly");
    } else {
        cmd.env("RUSTC_BOOTSTRAP", "1");
    }
    cmd.args(["fuzz", subcommand, "-O"]);
    if !nightly {
        cmd.args(["-s", "none"]);
    }
    cmd.current_dir(proc::workspace_root())
        // The toolchain rustup picked for xtask must not override +nightly.
        .env_remove("RUSTUP_TOOLCHAIN")
        .env_remove("CARGO")
        .env_remove("RUSTC");
    cmd
}

/// Runs one target for `each` (built already): its run count, or why it
/// failed with the end of libFuzzer's report.
fn run_one(nightly: bool, target: &str, each: Duration) -> Result<String> {
    let mut cmd = cargo_fuzz(nightly, "run");
    cmd.arg(target)
        .arg("--")
        .arg(format!("-max_total_time={}", each.as_secs()));
    eprintln!("$ {}", proc::describe(&cmd));
    let output = cmd.output()?;
    // libFuzzer reports every new input on stderr: keep it for a failure.
    let out = String::from_utf8_lossy(&output.stderr).into_owned();
    if !output.status.success() {
        let lines: Vec<&str> = out.lines().collect();
        bail!(
            "fuzz target {target} failed (the crashing input is in fuzz/artifacts/{target}/):\n{}",
            lines[lines.len().saturating_sub(60)..].join("\n")
        );
    }
    let runs = proc::word_after(&out, "Done ");
    Ok(format!("{target} {runs} runs"))
}

/// Builds every target, then runs each for `each`, as many at once as
/// there are CPUs (a libFuzzer process uses one); returns a line per
/// target with its run count.
pub(crate) fn run(each: Duration) -> Result<String> {
    if !has_cargo_fuzz() {
        proc::check(Command::new("cargo").args(["install", "cargo-fuzz", "--locked"]))?;
    }
    let nightly = has_nightly();
    proc::check(&mut cargo_fuzz(nightly, "build"))?;
    let at_once = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut summary = Vec::new();
    for group in TARGETS.chunks(at_once) {
        let results: Vec<Result<String>> = std::thread::scope(|s| {
            let runs: Vec<_> = group
                .iter()
                .map(|target| s.spawn(move || run_one(nightly, target, each)))
                .collect();
            runs.into_iter()
                .map(|r| r.join().expect("a fuzz run's thread does not panic"))
                .collect()
        });
        for result in results {
            summary.push(result?);
        }
    }
    Ok(format!(
        "{}{}",
        summary.join(", "),
        if nightly {
            ""
        } else {
            " (no sanitizer: no nightly toolchain)"
        }
    ))
}
