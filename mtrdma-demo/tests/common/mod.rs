//! What mtrdma-demo's device tests share: the root package's test helpers
//! (`tests/common`, the same file), and this package's programs.

// Not every test binary uses all of it.
#![allow(dead_code, unused_imports)]

#[path = "../../../tests/common/mod.rs"]
mod root;
pub(crate) use root::*;

/// The `isolation` demo, as `cargo test` built it.
pub(crate) const ISOLATION: &str = env!("CARGO_BIN_EXE_isolation");
/// `perf`, as `cargo test` built it.
pub(crate) const PERF: &str = env!("CARGO_BIN_EXE_perf");
/// `remote_memory`, as `cargo test` built it.
pub(crate) const REMOTE_MEMORY: &str = env!("CARGO_BIN_EXE_remote_memory");
