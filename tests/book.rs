//! The book (`docs/`, an mdBook) holds together: every page its summary
//! lists exists, every page is listed (none is left unreachable), every
//! page's Rust snippets are doctests (`src/lib.rs` includes each page),
//! and every link in the book and the README points at a file that
//! exists and, with a `#fragment`, at a heading of that page.

use std::collections::BTreeSet;
use std::path::{Component, Path, PathBuf};

mod common;
use common::files_under;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The lines of `text` outside fenced code blocks (the fences' own lines
/// left out too).
fn unfenced(text: &str) -> impl Iterator<Item = &str> {
    let mut fenced = false;
    text.lines().filter(move |line| {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            return false;
        }
        !fenced
    })
}

/// The text outside fenced code blocks and inline code spans: links
/// inside code are not links.
fn prose(text: &str) -> String {
    let mut out = String::new();
    for line in unfenced(text) {
        let mut in_code = false;
        for c in line.chars() {
            if c == '`' {
                in_code = !in_code;
            } else if !in_code {
                out.push(c);
            }
        }
        out.push('\n');
    }
    out
}

/// The targets of the inline links and images in `text`: `[..](target)`.
fn links(text: &str) -> Vec<String> {
    let text = prose(text);
    let mut found = Vec::new();
    let mut rest = text.as_str();
    while let Some(at) = rest.find("](") {
        rest = &rest[at + 2..];
        let Some(end) = rest.find(')') else { break };
        let target = rest[..end].split_whitespace().next().unwrap_or("");
        found.push(target.to_string());
        rest = &rest[end..];
    }
    found
}

/// The anchors mdBook gives a page's headings: lower case, letters,
/// digits, `-` and `_` kept, spaces made `-`, everything else dropped;
/// a repeated heading gets `-1`, `-2`, ...
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    for line in unfenced(text) {
        let Some(title) = line.strip_prefix('#') else {
            continue;
        };
        let title = title.trim_start_matches('#').trim();
        let base: String = title
            .chars()
            .filter_map(|c| match c {
                ' ' => Some('-'),
                c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c.to_ascii_lowercase()),
                _ => None,
            })
            .collect();
        let mut id = base.clone();
        let mut n = 1;
        while !seen.insert(id.clone()) {
            id = format!("{base}-{n}");
            n += 1;
        }
    }
    seen
}

/// `path` with `.` and `..` taken out.
fn normal(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            c => out.push(c),
        }
    }
    out
}

/// The pages `docs/SUMMARY.md` lists, relative to `docs/`.
fn summary() -> Vec<String> {
    links(&read(&root().join("docs/SUMMARY.md")))
}

/// The link problems of one Markdown file.
fn broken_links(file: &Path) -> Vec<String> {
    let text = read(file);
    let dir = file.parent().expect("a file has a directory");
    let mut broken = Vec::new();
    for target in links(&text) {
        if target.contains("://") || target.starts_with("mailto:") {
            continue;
        }
        let (path, fragment) = match target.split_once('#') {
            Some((p, f)) => (p, Some(f)),
            None => (target.as_str(), None),
        };
        let resolved = if path.is_empty() {
            file.to_path_buf()
        } else {
            normal(&dir.join(path))
        };
        if !resolved.exists() {
            broken.push(format!("{}: {target}: no such file", file.display()));
            continue;
        }
        if let Some(fragment) = fragment {
            if resolved.extension().is_some_and(|e| e == "md")
                && !anchors(&read(&resolved)).contains(fragment)
            {
                broken.push(format!("{}: {target}: no such heading", file.display()));
            }
        }
    }
    broken
}

#[test]
fn every_page_the_summary_lists_exists_and_every_page_is_listed() {
    let docs = root().join("docs");
    let listed: BTreeSet<PathBuf> = summary().iter().map(|p| normal(&docs.join(p))).collect();
    for page in &listed {
        assert!(
            page.exists(),
            "SUMMARY.md lists {}, which does not exist",
            page.display()
        );
    }
    let mut all = Vec::new();
    files_under(&docs, "md", &mut all);
    // The summary itself, and the example the crate's front page, the
    // README and the "Using it" page include.
    let not_pages = ["SUMMARY.md", "using-from-rust.md"].map(|p| docs.join(p));
    for page in all {
        if !not_pages.contains(&page) {
            assert!(
                listed.contains(&page),
                "{} is not in docs/SUMMARY.md: no reader can reach it",
                page.display()
            );
        }
    }
}

#[test]
fn every_page_of_the_book_is_a_doctest() {
    let lib = read(&root().join("src/lib.rs"));
    for page in summary() {
        assert!(
            lib.contains(&format!("\"{page}\"")),
            "src/lib.rs's book module does not include {page}: its Rust snippets would not be tested"
        );
    }
}

#[test]
fn every_link_in_the_book_and_the_readme_leads_somewhere() {
    let mut files = vec![root().join("README.md")];
    files_under(&root().join("docs"), "md", &mut files);
    let broken: Vec<String> = files.iter().flat_map(|f| broken_links(f)).collect();
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn the_link_checker_finds_what_is_broken() {
    let dir = std::env::temp_dir().join(format!("mtrdma-book-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temporary directory");
    std::fs::write(
        dir.join("b.md"),
        "# A title, with punctuation\n\n## Again\n## Again\n",
    )
    .expect("written");
    let a = dir.join("a.md");
    std::fs::write(
        &a,
        "[ok](b.md#a-title-with-punctuation) [ok](b.md#again-1) [gone](c.md) \
         [bad](b.md#nothing) `[code](c.md)` [web](https://example.com)\n",
    )
    .expect("written");
    let broken = broken_links(&a);
    std::fs::remove_dir_all(&dir).expect("removed");
    assert_eq!(broken.len(), 2, "{broken:?}");
    assert!(broken[0].ends_with("c.md: no such file"), "{broken:?}");
    assert!(
        broken[1].ends_with("b.md#nothing: no such heading"),
        "{broken:?}"
    );
}
