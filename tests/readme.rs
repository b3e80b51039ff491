//! The README shows the example that is the crate's front page
//! (`docs/using-from-rust.md`, compiled by the crate's doctests), word
//! for word; and it stays a front page.

#[test]
fn the_readme_shows_the_crate_example_as_compiled() {
    let root = env!("CARGO_MANIFEST_DIR");
    let read = |path: &str| {
        std::fs::read_to_string(format!("{root}/{path}")).unwrap_or_else(|e| panic!("{path}: {e}"))
    };
    let example = read("docs/using-from-rust.md");
    assert!(example.contains("```rust,no_run"), "the example is Rust");
    assert!(
        read("README.md").contains(&example),
        "README.md must contain docs/using-from-rust.md as it is"
    );
}

/// The README is a front page: at most 200 lines, with the dependency
/// line and the example on its first screen (the first 50 lines hold the
/// `[dependencies]` line and the example's first line).
#[test]
fn the_readme_is_a_front_page() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md"))
        .expect("README.md");
    let lines: Vec<&str> = readme.lines().collect();
    assert!(lines.len() <= 200, "README.md has {} lines", lines.len());
    let first_screen = &lines[..lines.len().min(50)];
    assert!(
        first_screen.iter().any(|l| l.starts_with("mtrdma = ")),
        "the dependency line is on the first screen"
    );
    assert!(
        first_screen.iter().any(|l| l.starts_with("```rust")),
        "the example begins on the first screen"
    );
}
