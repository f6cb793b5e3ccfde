//! The git history of calibration/accuracy-guards.toml: every commit (and the uncommitted
//! working tree) that loosens a guard must add a line to docs/accuracy.md naming it.
//! `parsim::validate::guards::loosened` says what a change loosens; this file walks the
//! history with the `git` command.

use parsim::validate::guards::{self, GuardFile};
use std::path::Path;
use std::process::Command;

/// The page whose added lines must name a loosened guard.
const PAGE: &str = "docs/accuracy.md";

fn git(root: &Path, args: &[&str]) -> Result<String, String> {
    let out = Command::new("git")
        .args(args)
        .current_dir(root)
        .output()
        .map_err(|e| format!("git could not run ({e})"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "`git {}`: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// The lines a unified diff adds.
fn added_lines(diff: &str) -> Vec<&str> {
    diff.lines()
        .filter(|l| l.starts_with('+') && !l.starts_with("+++"))
        .collect()
}

/// Appends to `out` each loosening from `old` to `new` that no added line of the page names.
fn check(old: &str, new: &str, page_diff: &str, at: &str, out: &mut Vec<String>) {
    let new = match GuardFile::parse(new) {
        Ok(f) => f,
        Err(e) => {
            out.push(format!("{at}: the guard file does not parse: {e}"));
            return;
        }
    };
    let Ok(old) = GuardFile::parse(old) else {
        println!("{at}: the guard file before it is not in today's format; not compared");
        return;
    };
    let added = added_lines(page_diff);
    for (id, change) in guards::loosened(&old, &new) {
        // The page's "Guard changes" list names a loosened guard as "guard `ID`" (the guard
        // table's rows name it too, without the backticks, whenever a figure moves).
        let named = format!("guard `{id}`");
        if !added.iter().any(|l| l.contains(&named)) {
            out.push(format!("{at}: {id}: {change}"));
        }
    }
}

/// Every loosening in the guard file's history (and in the working tree) that
/// docs/accuracy.md does not name in the same change; `Err` says why the history cannot be
/// read here (no git, not a repository, no committed guard file).
pub fn unexplained_loosenings(root: &Path) -> Result<Vec<String>, String> {
    git(root, &["rev-parse", "--is-inside-work-tree"])?;
    let log = git(root, &["log", "--format=%H %P", "--", guards::PATH])?;
    if log.trim().is_empty() {
        return Err(format!("{} has no committed history here", guards::PATH));
    }
    let mut out = Vec::new();
    for line in log.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        // A root commit has nothing before it; a merge's changes are checked in the commits it
        // merges (which this log lists too).
        let [commit, parent] = words[..] else {
            continue;
        };
        let Ok(old) = git(root, &["show", &format!("{parent}:{}", guards::PATH)]) else {
            if git(root, &["cat-file", "-e", &format!("{parent}^{{commit}}")]).is_err() {
                println!("{commit}: its parent is not in this clone (shallow?); not compared");
            }
            // Otherwise the commit added the file.
            continue;
        };
        let new = git(root, &["show", &format!("{commit}:{}", guards::PATH)])?;
        let diff = git(root, &["show", "--format=", commit, "--", PAGE])?;
        check(&old, &new, &diff, &commit[..12.min(commit.len())], &mut out);
    }
    if let Ok(head) = git(root, &["show", &format!("HEAD:{}", guards::PATH)]) {
        let now = std::fs::read_to_string(root.join(guards::PATH)).map_err(|e| e.to_string())?;
        let diff = git(root, &["diff", "HEAD", "--", PAGE])?;
        check(&head, &now, &diff, "uncommitted changes", &mut out);
    }
    Ok(out)
}

/// The check itself, on literal files: a loosening is reported unless an added line of the
/// page names it; a tightening never is.
#[test]
fn a_loosening_needs_a_line_naming_it() {
    let old = "[[guard]]\nid = \"g\"\nsources = [\"vtrain\"]\nmedian = 0.1\nworst = 0.2\nguards = \"t\"\n";
    let looser = old.replace("worst = 0.2", "worst = 0.3");
    let tighter = old.replace("worst = 0.2", "worst = 0.15");
    let mut out = Vec::new();
    check(old, &tighter, "", "c1", &mut out);
    assert!(out.is_empty(), "{out:?}");
    check(old, &looser, "+| g | 1 | 10.0% (10.0%) |\n", "c2", &mut out);
    assert_eq!(out.len(), 1, "{out:?}");
    assert!(out[0].starts_with("c2: g: worst"), "{out:?}");
    out.clear();
    check(
        old,
        &looser,
        "--- a/docs/accuracy.md\n+++ b/docs/accuracy.md\n+- guard `g`: worst 0.2 -> 0.3 (why)\n",
        "c3",
        &mut out,
    );
    assert!(out.is_empty(), "{out:?}");
    // A removed line naming it does not count.
    check(old, &looser, "-- guard `g`: worst (why)\n", "c4", &mut out);
    assert_eq!(out.len(), 1);
}
