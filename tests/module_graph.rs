//! The engine's modules import one way (docs/design.md, Layout): config -> layout -> model ->
//! network/time -> schedule -> memory/comm -> estimate -> search/report/cli. Reads every
//! `crate::` path in src/ and fails on any cycle between top-level modules, or between the
//! files of one directory that name each other (`super::file::`).

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in fs::read_dir(dir).expect("read src") {
        let p = e.expect("entry").path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The identifiers following each occurrence of `prefix` in `text` (comments skipped).
fn names_after<'a>(text: &'a str, prefix: &'a str) -> impl Iterator<Item = &'a str> + 'a {
    text.lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .flat_map(move |l| {
            l.match_indices(prefix)
                .map(move |(i, _)| &l[i + prefix.len()..])
        })
        .map(|rest| {
            let end = rest
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(rest.len());
            &rest[..end]
        })
        .filter(|n| !n.is_empty())
}

/// A cycle in `graph`, if any (depth-first search with colours).
fn find_cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        n: &str,
        g: &BTreeMap<String, BTreeSet<String>>,
        state: &mut BTreeMap<String, u8>,
        path: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        match state.get(n) {
            Some(2) => return None,
            Some(1) => {
                let start = path.iter().position(|p| p == n).unwrap_or(0);
                let mut c = path[start..].to_vec();
                c.push(n.to_string());
                return Some(c);
            }
            _ => {}
        }
        state.insert(n.to_string(), 1);
        path.push(n.to_string());
        for m in g.get(n).into_iter().flatten() {
            if let Some(c) = visit(m, g, state, path) {
                return Some(c);
            }
        }
        path.pop();
        state.insert(n.to_string(), 2);
        None
    }
    let mut state = BTreeMap::new();
    for n in graph.keys() {
        if let Some(c) = visit(n, graph, &mut state, &mut Vec::new()) {
            return Some(c);
        }
    }
    None
}

#[test]
fn src_modules_import_one_way() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("crates/engine/src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut top: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut siblings: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for f in &files {
        let rel = f.strip_prefix(&src).expect("under src");
        let parts: Vec<String> = rel
            .iter()
            .map(|p| p.to_string_lossy().trim_end_matches(".rs").to_string())
            .collect();
        let module = parts[0].clone();
        if module == "lib" || module == "main" {
            continue;
        }
        let text = fs::read_to_string(f).expect("read file");
        // Only the library's own code: unit tests may reach anywhere.
        let text = text.split("#[cfg(test)]").next().unwrap_or("");
        let edges = top.entry(module.clone()).or_default();
        for name in names_after(text, "crate::") {
            let is_module = src.join(format!("{name}.rs")).exists() || src.join(name).is_dir();
            if name != module && is_module {
                edges.insert(name.to_string());
            }
        }
        if parts.len() >= 2 {
            let dir = parts[..parts.len() - 1].join("/");
            let me = parts.join("/");
            let sib = siblings.entry(me.clone()).or_default();
            for name in names_after(text, "super::") {
                let other = format!("{dir}/{name}");
                if other != me && src.join(format!("{other}.rs")).exists() {
                    sib.insert(other);
                }
            }
        }
    }
    assert!(top.contains_key("model") && top.contains_key("network"));
    // The engine's modules in docs/design.md's order: each imports only those before it.
    let order = [
        "config", "layout", "model", "network", "time", "schedule", "memory", "comm", "estimate",
        "search",
    ];
    let rank = |m: &str| order.iter().position(|o| *o == m);
    for (from, tos) in &top {
        for to in tos {
            if let (Some(a), Some(b)) = (rank(from), rank(to)) {
                let same_tier = matches!((from.as_str(), to.as_str()), ("comm", "memory"));
                assert!(
                    b < a && !same_tier,
                    "{from} imports {to}, against docs/design.md's order {order:?}"
                );
            }
        }
    }
    if let Some(c) = find_cycle(&top) {
        panic!("import cycle between modules: {}", c.join(" -> "));
    }
    if let Some(c) = find_cycle(&siblings) {
        panic!("import cycle between files: {}", c.join(" -> "));
    }
}
