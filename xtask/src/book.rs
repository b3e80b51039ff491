//! The book stage of `cargo xtask test`: builds the mdBook under `docs/`
//! into `target/book/`, installing mdbook with `cargo install` when the
//! pinned version is missing. (The book's Rust snippets run as the
//! `mtrdma` crate's doctests, and its links are checked by
//! `tests/book.rs`, both in the host tests.)

use std::process::Command;

use anyhow::Result;

use crate::proc;

/// The mdbook the book is built with.
const MDBOOK_VERSION: &str = "0.5.4";

/// Whether `mdbook --version` names [`MDBOOK_VERSION`].
fn has_mdbook() -> bool {
    proc::output(Command::new("mdbook").arg("--version"))
        .is_ok_and(|version| version.contains(MDBOOK_VERSION))
}

/// Builds the book; returns where its front page is.
pub(crate) fn run() -> Result<(bool, String)> {
    if !has_mdbook() {
        // Only the HTML renderer and its search: no server or watcher.
        proc::check(Command::new("cargo").args([
            "install",
            "mdbook",
            "--locked",
            "--version",
            MDBOOK_VERSION,
            "--no-default-features",
            "--features",
            "search",
        ]))?;
    }
    let docs = proc::workspace_root().join("docs");
    let ok = proc::status(Command::new("mdbook").arg("build").arg(&docs))?;
    let front = proc::workspace_root().join("target/book/index.html");
    Ok((ok && front.exists(), front.display().to_string()))
}
