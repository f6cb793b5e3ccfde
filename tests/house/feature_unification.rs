//! The Python crate builds alone under maturin, so cargo unifies features over it alone; the
//! engine the workspace's tests compiled is reused only when every package in the engine's
//! dependency closure gets the same features both ways. crates/python/Cargo.toml lists the
//! features the rest of the workspace turns on; this test checks that list against `cargo
//! tree` (a stale list costs CI a recompile of the engine, about 75 s, not a wrong result).

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

/// `cargo tree` lines `name vX.Y.Z [feat,feat]` for the given selection, features merged over
/// a package's appearances (host and target uses alike, as `cargo tree` prints them).
fn features(args: &[&str]) -> BTreeMap<String, BTreeSet<String>> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string());
    let out = Command::new(cargo)
        .args([
            "tree",
            "--offline",
            "--locked",
            "--prefix",
            "none",
            "--format",
            "{p} [{f}]",
        ])
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo tree runs");
    assert!(
        out.status.success(),
        "cargo tree {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut map: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Some((package, rest)) = line.split_once(" [") else {
            continue;
        };
        let name_version = package.split(" (").next().unwrap_or(package).to_string();
        let feats = rest.split(']').next().unwrap_or("");
        map.entry(name_version).or_default().extend(
            feats
                .split(',')
                .filter(|f| !f.is_empty())
                .map(str::to_string),
        );
    }
    map
}

#[test]
fn python_crate_builds_the_engine_with_the_workspace_features() {
    let workspace = features(&["--workspace", "-e", "normal,dev,build"]);
    let python = features(&["-p", "parsim-python", "-e", "normal,build"]);
    let engine = features(&["-p", "parsim", "-e", "normal,build"]);
    assert!(
        engine.len() > 20,
        "the engine's dependency closure was read: {}",
        engine.len()
    );
    let differing: Vec<String> = engine
        .keys()
        .filter(|package| python.get(*package) != workspace.get(*package))
        .map(|package| {
            let w = workspace.get(package).cloned().unwrap_or_default();
            let p = python.get(package).cloned().unwrap_or_default();
            format!(
                "{package}: the workspace adds {:?}, the Python build adds {:?}",
                w.difference(&p).collect::<Vec<_>>(),
                p.difference(&w).collect::<Vec<_>>()
            )
        })
        .collect();
    assert!(
        differing.is_empty(),
        "crates/python/Cargo.toml's feature list is stale (maturin would recompile the engine):\n{}",
        differing.join("\n")
    );
}
