//! The README shows the example that is the crate's front page
//! (`docs/using-from-rust.md`, compiled by the crate's doctests), word
//! for word.

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
