//! The test index (tests/README.md) lists exactly the workspace's test binaries, each with the
//! command that runs it, and every binary is built one way: a folder `tests/<subject>/` whose
//! `main.rs` opens with a one-line `//!` comment saying what belongs there.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::Path;

/// Each workspace member's folder and package name, from the root manifest's `members` line.
fn members(root: &Path) -> Vec<(String, String)> {
    let manifest = fs::read_to_string(root.join("Cargo.toml")).expect("Cargo.toml");
    let members_line = manifest
        .lines()
        .find(|l| l.trim_start().starts_with("members"))
        .expect("workspace members");
    members_line
        .split('"')
        .skip(1)
        .step_by(2)
        .map(|member| {
            let toml = fs::read_to_string(root.join(member).join("Cargo.toml")).expect("member");
            let name = toml
                .lines()
                .find_map(|l| l.strip_prefix("name = \""))
                .and_then(|r| r.strip_suffix('"'))
                .expect("package name");
            (member.to_string(), name.to_string())
        })
        .collect()
}

/// The repository path of a member's `tests/` folder (`tests/`, `crates/gui/tests/`).
fn tests_dir(member: &str) -> String {
    match member {
        "." => "tests/".to_string(),
        m => format!("{m}/tests/"),
    }
}

/// The test binaries cargo discovers in the workspace, by repository path (`tests/cli/`,
/// `crates/executor/tests/numerics/`), each with the command that runs it; and every file
/// that would build a binary another way (`tests/*.rs`).
fn binaries(root: &Path) -> (BTreeMap<String, String>, Vec<String>) {
    let mut found = BTreeMap::new();
    let mut loose = Vec::new();
    for (member, package) in members(root) {
        let dir = tests_dir(&member);
        let Ok(entries) = fs::read_dir(root.join(&dir)) else {
            continue;
        };
        for entry in entries {
            let path = entry.expect("entry").path();
            let name = path
                .file_name()
                .expect("name")
                .to_string_lossy()
                .to_string();
            if path.is_dir() && path.join("main.rs").is_file() {
                let run = match member.as_str() {
                    "." => format!("cargo test --test {name}"),
                    _ => format!("cargo test -p {package} --test {name}"),
                };
                found.insert(format!("{dir}{name}/"), run);
            } else if path.extension().is_some_and(|e| e == "rs") {
                loose.push(format!("{dir}{name}"));
            }
        }
    }
    (found, loose)
}

/// The binaries an index names: the first backticked path of each table row, with the row.
fn indexed(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter_map(|line| {
            let cell = line.strip_prefix("| `")?;
            let path = &cell[..cell.find('`')?];
            path.ends_with('/')
                .then(|| (path.to_string(), line.to_string()))
        })
        .collect()
}

/// The `[[test]]` entries of a manifest: each one's name and, where given, its path.
fn declared_tests(manifest: &str) -> Vec<(String, Option<String>)> {
    let value = |line: &str, key: &str| {
        let rest = line
            .trim()
            .strip_prefix(key)?
            .trim_start()
            .strip_prefix('=')?;
        Some(rest.trim().trim_matches('"').to_string())
    };
    let mut out: Vec<(String, Option<String>)> = Vec::new();
    let mut inside = false;
    for line in manifest.lines() {
        if line.trim_start().starts_with('[') {
            inside = line.trim() == "[[test]]";
            if inside {
                out.push((String::new(), None));
            }
            continue;
        }
        if let (true, Some(last)) = (inside, out.last_mut()) {
            if let Some(name) = value(line, "name") {
                last.0 = name;
            } else if let Some(path) = value(line, "path") {
                last.1 = Some(path);
            }
        }
    }
    out
}

#[test]
fn test_entries_are_read_with_their_paths() {
    let manifest = "[package]\nname = \"x\"\n\n[[test]]\nname = \"gpu\"\nrequired-features = [\"cuda\"]\n\n\
                    [[test]]\nname = \"old\"\npath = \"tests/old.rs\"\n\n[dependencies]\npath = \"no\"\n";
    assert_eq!(
        declared_tests(manifest),
        vec![
            ("gpu".to_string(), None),
            ("old".to_string(), Some("tests/old.rs".to_string()))
        ]
    );
}

#[test]
fn index_rows_are_read_from_table_rows_only() {
    let text = "| `tests/cli/` | flags | `cargo test --test cli` |\n\
                | binary | what | run |\n\
                see `tests/engine/` in prose\n\
                | `tests/golden/estimate/*.json` | goldens | |\n";
    let got: Vec<String> = indexed(text).into_keys().collect();
    assert_eq!(got, vec!["tests/cli/".to_string()]);
}

#[test]
fn the_index_lists_every_test_binary_and_how_to_run_it() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let (found, _) = binaries(root);
    let index = fs::read_to_string(root.join("tests/README.md")).expect("tests/README.md");
    let rows = indexed(&index);
    let listed: BTreeSet<&String> = rows.keys().collect();
    let built: BTreeSet<&String> = found.keys().collect();
    let unlisted: Vec<_> = built.difference(&listed).collect();
    let gone: Vec<_> = listed.difference(&built).collect();
    assert!(
        unlisted.is_empty() && gone.is_empty(),
        "tests/README.md is out of date: binaries it does not list {unlisted:?}, rows for \
         binaries that do not exist {gone:?}"
    );
    // The workspace has subject binaries at the root and in the crates.
    assert!(found.len() >= 10, "only {} binaries found", found.len());
    for (path, run) in &found {
        assert!(
            rows[path].contains(&format!("`{run}`")),
            "tests/README.md's row for {path} does not give `{run}`"
        );
    }
}

#[test]
fn every_test_binary_is_a_folder_opening_with_one_line() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let (found, loose) = binaries(root);
    assert!(
        loose.is_empty(),
        "a test binary is a folder tests/<subject>/ with a main.rs; move these into one: {loose:?}"
    );
    for (member, _) in members(root) {
        let manifest = fs::read_to_string(root.join(&member).join("Cargo.toml")).expect("toml");
        for (name, path) in declared_tests(&manifest) {
            assert!(
                path.is_none(),
                "{member}/Cargo.toml gives the test {name} a path: cargo finds \
                 tests/<subject>/main.rs itself (a [[test]] entry only adds required-features)"
            );
            let dir = format!("{}{name}/", tests_dir(&member));
            assert!(
                found.contains_key(&dir),
                "{member}/Cargo.toml declares the test {name}, but {dir}main.rs does not exist"
            );
        }
    }
    for path in found.keys() {
        let main = fs::read_to_string(root.join(path).join("main.rs")).expect("main.rs");
        let mut lines = main.lines();
        let first = lines.next().unwrap_or("");
        let second = lines.next().unwrap_or("");
        assert!(
            first.starts_with("//! ") && (second == "//!" || !second.starts_with("//!")),
            "{path}main.rs must open with a one-line `//!` comment saying what belongs there \
             (more may follow after an empty `//!` line)"
        );
    }
}
