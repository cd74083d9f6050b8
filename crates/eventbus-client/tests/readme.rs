//! The guide's Rust examples (docs/clients.md, docs/outbox-inbox.md) are the crate's doc examples, which `cargo test` compiles (and the first runs)
//! against a real broker: the two stay identical.

#![allow(clippy::unwrap_used)] // Tests fail loudly on purpose.

/// The code of the first ```rust block of the page (`rust` or `rust,ignore`).
fn readme_snippet(readme: &str) -> String {
    let fence = readme.find("```rust").unwrap();
    let start = fence + readme[fence..].find('\n').unwrap() + 1;
    let len = readme[start..].find("\n```").unwrap();
    readme[start..start + len].to_owned()
}

/// The visible lines (not `# ` hidden ones) of the first example in a source file
/// written with `prefix` (`//!` for a crate's documentation, `///` for an item's).
fn doc_example(source: &str, prefix: &str) -> String {
    let lines: Vec<&str> = source.lines().map(str::trim_start).collect();
    let is_fence = |l: &&str| l.strip_prefix(prefix).is_some_and(|rest| rest.trim_start().starts_with("```"));
    let start = lines.iter().position(is_fence).unwrap();
    let end = start + 1 + lines[start + 1..].iter().position(is_fence).unwrap();
    let visible: Vec<&str> = lines[start + 1..end]
        .iter()
        .map(|l| {
            let l = l.strip_prefix(prefix).unwrap();
            l.strip_prefix(' ').unwrap_or(l)
        })
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
        doc_example(&lib, "//!"),
        "docs/clients.md and src/lib.rs differ: copy the example over"
    );
}

#[test]
fn the_guides_inbox_example_is_the_tested_doc_example() {
    let page = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/outbox-inbox.md")).unwrap();
    let inbox = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/src/inbox.rs")).unwrap();
    assert_eq!(
        readme_snippet(&page),
        doc_example(&inbox, "///"),
        "docs/outbox-inbox.md and src/inbox.rs differ: copy the example over"
    );
}
