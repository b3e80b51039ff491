//! What mtrdma-demo's device tests share: the root package's test helpers
//! (`tests/common`, the same file), and this package's programs.

// Not every test binary uses all of it.
#![allow(dead_code, unused_imports)]

use std::path::{Path, PathBuf};

#[path = "../../../tests/common/mod.rs"]
mod root;
pub(crate) use root::*;

/// The `isolation` demo, as `cargo test` built it.
pub(crate) const ISOLATION: &str = env!("CARGO_BIN_EXE_isolation");
/// `perf`, as `cargo test` built it.
pub(crate) const PERF: &str = env!("CARGO_BIN_EXE_perf");
/// `remote_memory`, as `cargo test` built it.
pub(crate) const REMOTE_MEMORY: &str = env!("CARGO_BIN_EXE_remote_memory");

/// The report and the output directory of an `isolation` run. In `cargo
/// xtask test`'s boot the demo's short form has run it already
/// (`MTRDMA_DEMO_SHORT` names its output, `part` the run's directory in
/// it), and that run is read, after `check` of its directory; elsewhere
/// `run_here` runs it into `temp_name` in the temporary directory and
/// gives what it printed.
pub(crate) fn demo_run(
    part: &str,
    check: impl FnOnce(&Path),
    temp_name: String,
    run_here: impl FnOnce(&Path) -> String,
) -> (String, PathBuf) {
    match std::env::var_os("MTRDMA_DEMO_SHORT") {
        Some(demo) => {
            let out_dir = Path::new(&demo).join(part);
            check(&out_dir);
            let text = std::fs::read_to_string(out_dir.join("results.txt"))
                .unwrap_or_else(|e| panic!("the demo's short form wrote no {part} report: {e}"));
            (text, out_dir)
        }
        None => {
            let out_dir = std::env::temp_dir().join(temp_name);
            let text = run_here(&out_dir);
            (text, out_dir)
        }
    }
}
