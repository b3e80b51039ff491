//! The loom stage of `cargo xtask test`: the quota table's protocols
//! between processes (the policy's seqlock; a process slot's claim,
//! reclamation and freeing) model-checked with loom, every interleaving
//! within a bound of preemptions (`mtrdma-core/src/table/loom.rs`).
//!
//! The crate is built with `--cfg mtrdma_loom`, which swaps those words'
//! atomics for loom's; that build has a target directory of its own
//! (`target/loom`), so that it never invalidates the ordinary one.

use anyhow::Result;

use crate::proc::{self, TestCounts};

/// Runs the loom checks: whether they passed, a line for the summary, and
/// the counts.
pub(crate) fn run() -> Result<(bool, String, Option<TestCounts>)> {
    let mut flags = std::env::var("RUSTFLAGS").unwrap_or_default();
    if !flags.is_empty() {
        flags.push(' ');
    }
    flags.push_str("--cfg mtrdma_loom");
    let (ok, out) = proc::tee(
        proc::cargo()
            .env("RUSTFLAGS", flags)
            .env("CARGO_TARGET_DIR", proc::target_dir().join("loom"))
            .args([
                "test",
                "-p",
                "mtrdma-core",
                "--lib",
                "--color",
                "never",
                "table::loom::",
            ]),
    )?;
    let counts = TestCounts::parse(&out);
    if counts.passed == 0 {
        return Ok((false, "no loom check ran".into(), Some(counts)));
    }
    Ok((
        ok && counts.failed == 0,
        "mtrdma-core table::loom".into(),
        Some(counts),
    ))
}
