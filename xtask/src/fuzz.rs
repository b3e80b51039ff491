//! The fuzz stage of `cargo xtask test`: every cargo-fuzz target for a short,
//! bounded time.
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
];

fn has_nightly() -> bool {
    proc::output(Command::new("cargo").args(["+nightly", "--version"])).is_ok()
}

fn has_cargo_fuzz() -> bool {
    proc::output(Command::new("cargo").args(["fuzz", "--version"])).is_ok()
}

/// Runs every target for `each`; returns a line per target with its run count.
pub(crate) fn run(each: Duration) -> Result<String> {
    if !has_cargo_fuzz() {
        proc::check(Command::new("cargo").args(["install", "cargo-fuzz", "--locked"]))?;
    }
    let nightly = has_nightly();
    let mut summary = Vec::new();
    for target in TARGETS {
        let mut cmd = Command::new("cargo");
        if nightly {
            cmd.arg("+nightly");
        } else {
            cmd.env("RUSTC_BOOTSTRAP", "1");
        }
        cmd.args(["fuzz", "run", "-O"]);
        if !nightly {
            cmd.args(["-s", "none"]);
        }
        cmd.arg(target)
            .arg("--")
            .arg(format!("-max_total_time={}", each.as_secs()))
            .current_dir(proc::workspace_root())
            // The toolchain rustup picked for xtask must not override +nightly.
            .env_remove("RUSTUP_TOOLCHAIN")
            .env_remove("CARGO")
            .env_remove("RUSTC");
        // libFuzzer reports every new input on stderr: keep it for a failure.
        eprintln!("$ {}", proc::describe(&cmd));
        let output = cmd.output()?;
        let out = String::from_utf8_lossy(&output.stderr).into_owned();
        if !output.status.success() {
            let lines: Vec<&str> = out.lines().collect();
            for line in &lines[lines.len().saturating_sub(60)..] {
                eprintln!("{line}");
            }
            bail!(
                "fuzz target {target} failed (the crashing input is in fuzz/artifacts/{target}/)"
            );
        }
        let runs = out
            .lines()
            .find_map(|l| {
                l.strip_prefix("Done ")
                    .and_then(|r| r.split_whitespace().next())
            })
            .unwrap_or("?");
        summary.push(format!("{target} {runs} runs"));
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
