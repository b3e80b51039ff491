//! The library crates stay readable in pieces: no source file of theirs
//! is over 800 lines (split a module by what its parts do before it
//! grows past that).

use std::path::Path;

mod common;
use common::files_under;

/// The library crates' sources: the facade's `src/` and each published
/// member's.
const LIBRARY_SOURCES: [&str; 5] = [
    "src",
    "mtrdma-core/src",
    "mtrdma-sched/src",
    "mtrdma-verbs/src",
    "mtrdma-preload/src",
];

const MOST_LINES: usize = 800;

#[test]
fn no_library_source_file_is_over_800_lines() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    for dir in LIBRARY_SOURCES {
        files_under(&root.join(dir), "rs", &mut files);
    }
    assert!(files.len() > 50, "the library's sources were found");
    let long: Vec<String> = files
        .iter()
        .filter_map(|f| {
            let lines = std::fs::read_to_string(f).unwrap().lines().count();
            (lines > MOST_LINES).then(|| format!("{} ({lines} lines)", f.display()))
        })
        .collect();
    assert!(
        long.is_empty(),
        "over {MOST_LINES} lines: {}",
        long.join(", ")
    );
}
