//! The guide's Rust example (docs/clients.md) is the crate documentation's, which `cargo test` runs
//! against a real broker: the two stay identical.

#![allow(clippy::unwrap_used)] // Tests fail loudly on purpose.

/// The code of the first ```rust block of the page.
fn readme_snippet(readme: &str) -> String {
    let start = readme.find("```rust\n").unwrap() + "```rust\n".len();
    let len = readme[start..].find("\n```").unwrap();
    readme[start..start + len].to_owned()
}

/// The visible lines (not `# ` hidden ones) of the first example in `lib.rs`.
fn doc_example(lib: &str) -> String {
    let lines: Vec<&str> = lib.lines().collect();
    let start = lines.iter().position(|l| *l == "//! ```").unwrap();
    let end = start + 1 + lines[start + 1..].iter().position(|l| *l == "//! ```").unwrap();
    let visible: Vec<&str> = lines[start + 1..end]
        .iter()
        .map(|l| l.strip_prefix("//! ").unwrap_or_else(|| l.strip_prefix("//!").unwrap()))
        .filter(|l| !l.starts_with("# "))
        .collect();
    visible.join("\n")
}

#[test]
fn the_readme_rust_example_is_the_tested_doc_example() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/clients.md")).unwrap();
    let lib = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/src/lib.rs")).unwrap();
    assert_eq!(
        readme_snippet(&readme),
        doc_example(&lib),
        "docs/clients.md and src/lib.rs differ: copy the example over"
    );
}
