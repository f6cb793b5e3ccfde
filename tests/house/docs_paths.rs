//! The documentation names real files: every repository path a page of docs/, the README or
//! the test index (tests/README.md) quotes in backticks (`crates/engine/src/time.rs`,
//! `tests/executor/`) exists, and docs/architecture.md names every crate of the workspace. A move that leaves a page
//! pointing at a file that is gone fails here.

use std::fs;
use std::path::Path;

/// Top-level folders of this repository whose paths the pages quote.
const ROOTS: [&str; 8] = [
    "crates/",
    "src/",
    "tests/",
    "docs/",
    "calibration/",
    "scripts/",
    "benches/",
    "examples/",
];

/// Endings of the project's own files (other projects' paths, such as NCCL's `.cc` sources or
/// another repository's README, are quoted too and are not checked).
const OWN_ENDINGS: [&str; 10] = [
    ".rs", ".cu", ".cuh", ".h", ".toml", ".py", ".sh", ".json", ".jsonl", "/",
];

/// The repository paths quoted in backticks in `text`, with their line numbers.
fn quoted_paths(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let mut rest = line;
        while let Some(start) = rest.find('`') {
            let after = &rest[start + 1..];
            let Some(end) = after.find('`') else { break };
            let span = &after[..end];
            rest = &after[end + 1..];
            let head = span
                .split(|c: char| c.is_whitespace() || c == ':' || c == '(')
                .next()
                .unwrap_or("");
            let checked = ROOTS.iter().any(|r| head.starts_with(r))
                && OWN_ENDINGS.iter().any(|e| head.ends_with(e))
                && !head.contains(['*', '{', '<', '$']);
            if checked {
                out.push((i + 1, head.to_string()));
            }
        }
    }
    out
}

#[test]
fn quoted_paths_are_found_in_backticks_only_for_own_files() {
    let text = "see `crates/engine/src/time.rs` and `src/graph/tuning.cc` (NCCL)\n\
                `tests/executor/` and `cargo test` and `crates/*/src/`";
    let got = quoted_paths(text);
    assert_eq!(
        got,
        vec![
            (1, "crates/engine/src/time.rs".to_string()),
            (2, "tests/executor/".to_string())
        ]
    );
}

#[test]
fn every_quoted_repository_path_exists() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut pages: Vec<_> = fs::read_dir(root.join("docs"))
        .expect("docs/")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    pages.push(root.join("README.md"));
    pages.push(root.join("tests/README.md"));
    let mut missing = Vec::new();
    let mut checked = 0;
    for page in &pages {
        let text = fs::read_to_string(page).expect("read page");
        for (line, path) in quoted_paths(&text) {
            checked += 1;
            if !root.join(path.trim_end_matches('/')).exists() {
                missing.push(format!(
                    "{}:{line}: {path}",
                    page.strip_prefix(root).unwrap_or(page).display()
                ));
            }
        }
    }
    assert!(
        checked > 50,
        "only {checked} paths found: is the scan broken?"
    );
    assert!(
        missing.is_empty(),
        "pages name files that do not exist:\n{}",
        missing.join("\n")
    );
}

#[test]
fn the_architecture_page_names_every_crate() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let page = fs::read_to_string(root.join("docs/architecture.md")).expect("architecture.md");
    let manifest = fs::read_to_string(root.join("Cargo.toml")).expect("Cargo.toml");
    let members_line = manifest
        .lines()
        .find(|l| l.trim_start().starts_with("members"))
        .expect("workspace members");
    let mut names = Vec::new();
    for member in members_line.split('"').skip(1).step_by(2) {
        let toml = fs::read_to_string(root.join(member).join("Cargo.toml")).expect("member");
        let name = toml
            .lines()
            .find_map(|l| l.strip_prefix("name = \""))
            .and_then(|r| r.strip_suffix('"'))
            .expect("package name")
            .to_string();
        names.push((member.to_string(), name));
    }
    assert!(names.len() >= 6, "{names:?}");
    for (member, name) in names {
        assert!(
            page.contains(&format!("`{name}`")),
            "docs/architecture.md does not name the crate `{name}` ({member})"
        );
        if member != "." {
            assert!(
                page.contains(&format!("{member}/")),
                "docs/architecture.md does not name the folder {member}/"
            );
        }
    }
}
