//! The Miri stage of `cargo xtask test`: the tests that read memory a
//! device may leave unwritten (work completions whose fields a provider
//! need not write), run under Miri, which reports any read of
//! uninitialised memory as undefined behaviour. A plain `cargo test` runs
//! them too, but cannot see such a read.
//!
//! Miri is a nightly component; it is installed when missing. Where it
//! cannot be, the stage says it was skipped and why (it never reports a
//! pass it did not run).

use std::process::Command;

use anyhow::Result;

use crate::proc;

/// The crates and test filters run under Miri.
const TESTS: &[(&str, &str)] = &[("mtrdma-verbs", "qp::wc")];

/// `cargo +nightly miri`, with the toolchain rustup picked for xtask out
/// of the way.
fn miri() -> Command {
    let mut cmd = Command::new("cargo");
    cmd.args(["+nightly", "miri"])
        .current_dir(proc::workspace_root())
        .env_remove("RUSTUP_TOOLCHAIN")
        .env_remove("CARGO")
        .env_remove("RUSTC");
    cmd
}

fn has_miri() -> bool {
    miri()
        .arg("--version")
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

/// Installs Miri (and the standard library's sources it builds from) for
/// the nightly toolchain, installing that too if needed.
fn install() -> Result<()> {
    let toolchain = Command::new("rustup")
        .args(["toolchain", "list"])
        .output()?;
    let listed = String::from_utf8_lossy(&toolchain.stdout).contains("nightly");
    if listed {
        proc::check(Command::new("rustup").args([
            "component",
            "add",
            "--toolchain",
            "nightly",
            "miri",
            "rust-src",
        ]))
    } else {
        proc::check(Command::new("rustup").args([
            "toolchain",
            "install",
            "nightly",
            "--profile",
            "minimal",
            "--component",
            "miri",
            "--component",
            "rust-src",
        ]))
    }
}

/// Runs the tests under Miri: whether they passed, and a line for the
/// summary.
pub(crate) fn run() -> Result<(bool, String)> {
    if !has_miri() {
        if let Err(e) = install() {
            return Ok((true, format!("SKIPPED: Miri could not be installed ({e})")));
        }
    }
    let mut ran = Vec::new();
    for (package, filter) in TESTS {
        let mut cmd = miri();
        cmd.args(["test", "-p", package, "--lib", filter]);
        let (ok, out) = proc::tee(&mut cmd)?;
        if !ok {
            return Ok((false, format!("{package} {filter}: failed under Miri")));
        }
        let passed = proc::word_after(&out, "test result: ok. ");
        ran.push(format!("{package} {filter}: {passed} passed"));
    }
    Ok((true, ran.join(", ")))
}
