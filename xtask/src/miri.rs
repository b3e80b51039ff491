//! The Miri stage of `cargo xtask test`: the tests that read memory a
//! device may leave unwritten (work completions whose fields a provider
//! need not write), that hand the provider pointers to walk (lists of
//! work requests), or that drop futures while the NIC holds their
//! regions, run under Miri, which reports any read of uninitialised
//! memory, any use of a pointer a later borrow invalidated, and any leak
//! as undefined behaviour or an error. A plain `cargo test` runs them
//! too, but cannot see these.
//!
//! Miri is a nightly component; it is installed when missing. Where it
//! cannot be, the stage says it was skipped and why (it never reports a
//! pass it did not run).

use std::process::Command;

use anyhow::Result;

use crate::proc;

/// The crate run under Miri, the features it is built with, and the
/// test filters: completions' fields read where a provider may not have
/// written them (`qp::wc`); the awaited requests on the null sink, whose
/// dropped futures must free no region the NIC holds (`asynchronous`);
/// and batches posted as linked lists, whose links and scatter pointers
/// must stay valid while the provider walks them (the direct batches on
/// the null sink; the scheduled ones read the CPU's counter, which Miri
/// cannot).
const PACKAGE: &str = "mtrdma-verbs";
const FEATURES: &str = "tokio,test-util";
const FILTERS: &[&str] = &[
    "qp::wc",
    "asynchronous",
    "scheduled::tests::batches::a_batch_goes_as_one_list",
    "scheduled::tests::batches::a_batch_refused_in_its_second_list",
    "scheduled::tests::batches::a_batch_the_send_queue_cannot_hold",
    "scheduled::tests::batches::a_failed_request_in_a_batch",
];

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
    let mut cmd = miri();
    cmd.args(["test", "-p", PACKAGE, "--features", FEATURES, "--lib", "--"])
        .args(FILTERS);
    let (ok, out) = proc::tee(&mut cmd)?;
    if !ok {
        return Ok((false, format!("{PACKAGE}: failed under Miri")));
    }
    let passed = proc::word_after(&out, "test result: ok. ");
    Ok((
        true,
        format!("{PACKAGE} ({}): {passed} passed", FILTERS.join(", ")),
    ))
}
