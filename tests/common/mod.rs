//! What the root package's device tests share: finding the examples that
//! `cargo test` builds, and reading perftest-style result rows.

use std::path::PathBuf;

/// `target/<profile>/examples/<name>`, next to `target/<profile>/deps/`.
pub(crate) fn example(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    let profile = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("the test binary lives in target/<profile>/deps");
    let path = profile.join("examples").join(name);
    assert!(
        path.exists(),
        "{} is missing: `cargo test` builds the examples",
        path.display()
    );
    path
}

/// The numbers of the first row under perftest's `#bytes` header.
pub(crate) fn result_row(text: &str) -> Vec<f64> {
    let mut lines = text.lines().skip_while(|l| !l.contains("#bytes"));
    lines.next().expect("a #bytes header");
    let row = lines.next().expect("a result row");
    row.split_whitespace()
        .map(|w| {
            w.parse()
                .unwrap_or_else(|_| panic!("not a number in {row:?}"))
        })
        .collect()
}
