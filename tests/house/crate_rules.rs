//! The workspace as a house (issue 29), checked on every crate's sources (`crates/*/src` and
//! the CLI's `src/`):
//! - no import cycle between files: each `crate::`, `super::` and `self::` path (use trees
//!   included) names the deepest file module it reaches and every file module it passes
//!   through below the file's own ancestors (`super::ops::x` names `ops` too), and those edges
//!   form no cycle;
//! - no function over 150 lines and no file over 800 lines outside tests;
//! - one module style: a directory module is `dir/mod.rs`, never `dir.rs` beside `dir/`.
//!
//! Test code is left out everywhere: items under a `#[cfg(test)]` attribute (`mod tests { .. }`,
//! helpers) and the files they declare (`#[cfg(test)] mod tests;`), and `tests/` folders.
//! Each crate's modules also keep the order docs/architecture.md states in its module-order
//! table (`documented_order` below reads it from the page).

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// Longest function allowed, from its `fn` line to its closing brace.
const MAX_FN_LINES: usize = 150;
/// Longest source file allowed, counting only lines outside test sections.
const MAX_FILE_LINES: usize = 800;

// ---------------------------------------------------------------------------------------------
// Lexing: code with comments and literals blanked, then tokens with their line.

/// `text` with every comment and the inside of every string, raw string and char literal
/// replaced by spaces (newlines kept), so braces and paths in them are not seen as code.
fn blank_literals(text: &str) -> String {
    let c: Vec<char> = text.chars().collect();
    let mut out = c.clone();
    let blank = |out: &mut Vec<char>, from: usize, to: usize| {
        for ch in out.iter_mut().take(to.min(c.len())).skip(from) {
            if *ch != '\n' {
                *ch = ' ';
            }
        }
    };
    let ident = |ch: char| ch.is_alphanumeric() || ch == '_';
    let mut i = 0;
    while i < c.len() {
        let next = c.get(i + 1).copied();
        if c[i] == '/' && next == Some('/') {
            let end = (i..c.len()).find(|&j| c[j] == '\n').unwrap_or(c.len());
            blank(&mut out, i, end);
            i = end;
        } else if c[i] == '/' && next == Some('*') {
            let (mut depth, mut j) = (1, i + 2);
            while j < c.len() && depth > 0 {
                if c[j] == '/' && c.get(j + 1) == Some(&'*') {
                    depth += 1;
                    j += 2;
                } else if c[j] == '*' && c.get(j + 1) == Some(&'/') {
                    depth -= 1;
                    j += 2;
                } else {
                    j += 1;
                }
            }
            blank(&mut out, i, j);
            i = j;
        } else if c[i] == 'r'
            && (i == 0 || !ident(c[i - 1]) || (c[i - 1] == 'b' && (i < 2 || !ident(c[i - 2]))))
            && matches!(next, Some('"' | '#'))
        {
            let hashes = (i + 1..c.len()).take_while(|&j| c[j] == '#').count();
            if c.get(i + 1 + hashes) != Some(&'"') {
                i += 1;
                continue;
            }
            let open = i + 1 + hashes;
            let mut j = open + 1;
            while j < c.len()
                && !(c[j] == '"' && (j + 1..=j + hashes).all(|k| c.get(k) == Some(&'#')))
            {
                j += 1;
            }
            blank(&mut out, open + 1, j);
            i = j + 1 + hashes;
        } else if c[i] == '"' {
            let mut j = i + 1;
            while j < c.len() && c[j] != '"' {
                j += if c[j] == '\\' { 2 } else { 1 };
            }
            blank(&mut out, i + 1, j);
            i = j + 1;
        } else if c[i] == '\'' && next == Some('\\') {
            let end = (i + 3..c.len()).find(|&j| c[j] == '\'').unwrap_or(c.len());
            blank(&mut out, i + 1, end);
            i = end + 1;
        } else if c[i] == '\'' && c.get(i + 2) == Some(&'\'') {
            blank(&mut out, i + 1, i + 2);
            i += 3;
        } else {
            i += 1;
        }
    }
    out.into_iter().collect()
}

/// One token of blanked code: an identifier (with `$` kept on `$crate`), `::`, or one
/// punctuation character.
#[derive(Debug, Clone)]
struct Tok {
    text: String,
    line: usize,
}

fn tokens(code: &str) -> Vec<Tok> {
    let c: Vec<char> = code.chars().collect();
    let mut out = Vec::new();
    let (mut i, mut line) = (0, 1);
    while i < c.len() {
        let ch = c[i];
        if ch == '\n' {
            line += 1;
            i += 1;
        } else if ch.is_whitespace() {
            i += 1;
        } else if ch.is_alphanumeric()
            || ch == '_'
            || (ch == '$' && c.get(i + 1).is_some_and(|n| n.is_alphabetic()))
        {
            let start = i;
            i += 1;
            while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                i += 1;
            }
            let text: String = c[start..i].iter().collect();
            out.push(Tok { text, line });
        } else if ch == ':' && c.get(i + 1) == Some(&':') {
            out.push(Tok {
                text: "::".into(),
                line,
            });
            i += 2;
        } else {
            out.push(Tok {
                text: ch.to_string(),
                line,
            });
            i += 1;
        }
    }
    out
}

fn is_ident(t: &str) -> bool {
    t.chars()
        .next()
        .is_some_and(|c| c.is_alphabetic() || c == '_' || c == '$')
}

/// Index of the token closing the bracket opened at `open` (`(`, `[` or `{`), counting all three.
fn matching(toks: &[Tok], open: usize) -> usize {
    let mut depth = 0i64;
    for (j, t) in toks.iter().enumerate().skip(open) {
        match t.text.as_str() {
            "(" | "[" | "{" => depth += 1,
            ")" | "]" | "}" => {
                depth -= 1;
                if depth == 0 {
                    return j;
                }
            }
            _ => {}
        }
    }
    toks.len().saturating_sub(1)
}

// ---------------------------------------------------------------------------------------------
// Test sections.

/// What a file holds outside its test sections.
struct Lexed {
    /// Tokens outside `#[cfg(test)]` items.
    toks: Vec<Tok>,
    /// Lines of the file outside test sections.
    code_lines: usize,
    /// Child modules declared as files under `#[cfg(test)]` (`#[cfg(test)] mod tests;`).
    test_children: Vec<String>,
}

/// Whether the attribute starting at `#` (index `i`) is a `cfg` that holds only under test.
fn is_cfg_test(toks: &[Tok], i: usize) -> Option<usize> {
    if toks.get(i + 1)?.text != "[" || toks.get(i + 2)?.text != "cfg" {
        return None;
    }
    let close = matching(toks, i + 1);
    let inner = &toks[i + 2..close];
    let test = inner.iter().any(|t| t.text == "test") && !inner.iter().any(|t| t.text == "not");
    test.then_some(close)
}

/// The end (inclusive) of the item starting at `from`: its matching `}` or its `;`, or the
/// `,` ending a field or arm; stops before a `}` closing the enclosing scope.
fn item_end(toks: &[Tok], from: usize) -> usize {
    let mut j = from;
    // Further attributes on the same item.
    while j < toks.len() && toks[j].text == "#" && toks.get(j + 1).is_some_and(|t| t.text == "[") {
        j = matching(toks, j + 1) + 1;
    }
    while j < toks.len() {
        match toks[j].text.as_str() {
            "{" => return matching(toks, j),
            "(" | "[" => j = matching(toks, j) + 1,
            ";" | "," => return j,
            "}" | ")" | "]" => return j.saturating_sub(1),
            _ => j += 1,
        }
    }
    toks.len().saturating_sub(1)
}

fn lex(text: &str) -> Lexed {
    let all = tokens(&blank_literals(text));
    let total_lines = text.lines().count();
    let mut toks = Vec::new();
    let mut test_lines = BTreeSet::new();
    let mut test_children = Vec::new();
    let mut i = 0;
    while i < all.len() {
        if all[i].text == "#" {
            if let Some(close) = is_cfg_test(&all, i) {
                let end = item_end(&all, close + 1).max(close).min(all.len() - 1);
                let item = &all[(close + 1).min(end + 1)..=end];
                if let Some(k) = item.iter().position(|t| t.text == "mod") {
                    if item.get(k + 2).is_some_and(|t| t.text == ";") {
                        test_children.push(item[k + 1].text.clone());
                    }
                }
                test_lines.extend(all[i].line..=all[end.min(all.len() - 1)].line);
                i = end + 1;
                continue;
            }
        }
        toks.push(all[i].clone());
        i += 1;
    }
    Lexed {
        toks,
        code_lines: total_lines - test_lines.len().min(total_lines),
        test_children,
    }
}

// ---------------------------------------------------------------------------------------------
// Functions.

/// A function longer than allowed: its line, name (`Type::name` inside an impl or trait) and
/// length in lines.
#[derive(Debug, PartialEq)]
struct LongFn {
    line: usize,
    name: String,
    lines: usize,
}

/// The name an `impl` or `trait` block at `i` gives its methods: the type after `for` (or
/// after `impl`), last segment, generics dropped.
fn block_owner(toks: &[Tok], i: usize) -> (String, usize) {
    let Some(open) = (i..toks.len()).find(|&j| toks[j].text == "{" || toks[j].text == ";") else {
        return (String::new(), toks.len());
    };
    let head = &toks[i + 1..open];
    let head = match head.iter().position(|t| t.text == "where") {
        Some(w) => &head[..w],
        None => head,
    };
    let head = match head.iter().position(|t| t.text == "for") {
        Some(f) => &head[f + 1..],
        None => head,
    };
    let mut angle = 0i64;
    let mut name = String::new();
    for t in head {
        match t.text.as_str() {
            "<" => angle += 1,
            ">" => angle -= 1,
            s if angle == 0 && is_ident(s) && s != "impl" && s != "dyn" => name = s.to_string(),
            _ => {}
        }
    }
    (name, open)
}

/// Every function (outside test sections) longer than `max` lines.
fn long_fns(lexed: &Lexed, max: usize) -> Vec<LongFn> {
    let toks = &lexed.toks;
    let mut out = Vec::new();
    // (closing brace index, owner) of the impl/trait blocks we are in.
    let mut owners: Vec<(usize, String)> = Vec::new();
    for i in 0..toks.len() {
        owners.retain(|(close, _)| *close > i);
        let t = toks[i].text.as_str();
        let item_start = i == 0
            || matches!(
                toks[i - 1].text.as_str(),
                "}" | ";" | "{" | "]" | "unsafe" | "default"
            );
        if (t == "impl" && item_start) || t == "trait" {
            let (name, open) = block_owner(toks, i);
            if open < toks.len() && toks[open].text == "{" {
                owners.push((matching(toks, open), name));
            }
        }
        if t != "fn" || !toks.get(i + 1).is_some_and(|n| is_ident(&n.text)) {
            continue;
        }
        let mut j = i + 2;
        while j < toks.len() && toks[j].text != "{" && toks[j].text != ";" {
            if toks[j].text == "(" || toks[j].text == "[" {
                j = matching(toks, j);
            }
            j += 1;
        }
        if j >= toks.len() || toks[j].text == ";" {
            continue;
        }
        let lines = toks[matching(toks, j)].line - toks[i].line + 1;
        if lines > max {
            let name = match owners.last() {
                Some((_, owner)) if !owner.is_empty() => format!("{owner}::{}", toks[i + 1].text),
                _ => toks[i + 1].text.clone(),
            };
            out.push(LongFn {
                line: toks[i].line,
                name,
                lines,
            });
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------
// Paths and the file graph.

/// Every path starting with `crate`, `$crate`, `super` or `self` in `toks`, use trees
/// expanded, as its segments (the leading keywords kept).
fn paths(toks: &[Tok]) -> Vec<Vec<String>> {
    /// Reads the use tree at `i` under `prefix`; returns the index after it.
    fn tree(
        toks: &[Tok],
        mut i: usize,
        mut prefix: Vec<String>,
        out: &mut Vec<Vec<String>>,
    ) -> usize {
        loop {
            let Some(t) = toks.get(i) else {
                out.push(prefix);
                return i;
            };
            if t.text == "{" {
                i += 1;
                while i < toks.len() && toks[i].text != "}" {
                    if toks[i].text == "," {
                        i += 1;
                        continue;
                    }
                    let before = i;
                    i = tree(toks, i, prefix.clone(), out);
                    if i == before {
                        i += 1;
                    }
                    while i < toks.len() && toks[i].text != "," && toks[i].text != "}" {
                        i += 1; // `as name`, `*`
                    }
                }
                return i + 1;
            }
            if !is_ident(&t.text) {
                out.push(prefix);
                return i;
            }
            if t.text != "self" || prefix.is_empty() {
                prefix.push(t.text.clone());
            }
            i += 1;
            if toks.get(i).is_some_and(|n| n.text == "::") {
                i += 1;
            } else {
                out.push(prefix);
                return i;
            }
        }
    }
    let mut out = Vec::new();
    let mut i = 0;
    while i < toks.len() {
        let t = toks[i].text.as_str();
        let starts = matches!(t, "crate" | "$crate" | "super" | "self")
            && toks.get(i + 1).is_some_and(|n| n.text == "::")
            && !(i > 0 && toks[i - 1].text == "::")
            && !(i > 1 && toks[i - 1].text == "in" && toks[i - 2].text == "(");
        if starts {
            i = tree(toks, i, Vec::new(), &mut out).max(i + 1);
        } else {
            i += 1;
        }
    }
    out
}

/// One crate's sources: each file's path relative to its `src/`, and its text.
type Sources = BTreeMap<String, String>;

/// The module path of a file (`search/mod.rs` and `search.rs` -> `[search]`; `lib.rs` -> `[]`).
fn module_of(file: &str) -> Vec<String> {
    let mut parts: Vec<String> = file
        .trim_end_matches(".rs")
        .split('/')
        .map(String::from)
        .collect();
    if matches!(
        parts.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        parts.pop();
    }
    parts
}

/// The file of module `m`, if it has one (`m.rs` or `m/mod.rs`; the root is `root`).
fn file_of(src: &Sources, m: &[String], root: &str) -> Option<String> {
    if m.is_empty() {
        return Some(root.to_string());
    }
    let base = m.join("/");
    [format!("{base}.rs"), format!("{base}/mod.rs")]
        .into_iter()
        .find(|f| src.contains_key(f))
}

/// The files a path names from module `here` (the file's module plus any inline modules):
/// the deepest file module along it, and every other file module it passes through on the
/// way down that is not one of `here`'s own ancestors. So `super::ops::elementwise::f` names
/// `ops` as well as `ops/elementwise`: a path reaches its item through each module on it, and
/// two files that reach each other so, through `super::` or `crate::`, are a cycle.
fn resolve(src: &Sources, here: &[String], path: &[String], root: &str) -> Vec<String> {
    let mut m: Vec<String> = match path.first().map(String::as_str) {
        Some("crate" | "$crate") => Vec::new(),
        Some("self" | "super") => here.to_vec(),
        _ => return Vec::new(),
    };
    let mut passed: Vec<Vec<String>> = Vec::new();
    for seg in path {
        match seg.as_str() {
            "crate" | "$crate" | "self" => {}
            "super" => {
                if m.pop().is_none() {
                    return Vec::new();
                }
            }
            name => {
                m.push(name.to_string());
                passed.push(m.clone());
            }
        }
    }
    let deepest = (0..=m.len())
        .rev()
        .find_map(|k| file_of(src, &m[..k], root));
    let through = passed
        .iter()
        .filter(|p| !here.starts_with(p))
        .filter_map(|p| file_of(src, p, root));
    deepest.into_iter().chain(through).collect()
}

/// The files each file names through its paths (self-edges dropped).
fn file_graph(src: &Sources) -> BTreeMap<String, BTreeSet<String>> {
    let lib_root = if src.contains_key("lib.rs") {
        "lib.rs"
    } else {
        "main.rs"
    };
    let mut graph = BTreeMap::new();
    for (file, text) in src {
        let root = if file == "main.rs" {
            "main.rs"
        } else {
            lib_root
        };
        let toks = lex(text).toks;
        let base = module_of(file);
        let mut edges = BTreeSet::new();
        // Paths are read per inline scope: find each path's start and its scope.
        let scopes: Vec<(usize, usize, Vec<String>)> = {
            let mut v = vec![(0, toks.len(), base.clone())];
            for (i, t) in toks.iter().enumerate() {
                if t.text == "mod" && toks.get(i + 2).is_some_and(|n| n.text == "{") {
                    let close = matching(&toks, i + 2);
                    let outer = v
                        .iter()
                        .rev()
                        .find(|(a, b, _)| *a <= i && i < *b)
                        .map(|s| s.2.clone());
                    let mut m = outer.unwrap_or_else(|| base.clone());
                    m.push(toks[i + 1].text.clone());
                    v.push((i + 3, close, m));
                }
            }
            v
        };
        for (k, (from, to, here)) in scopes.iter().enumerate() {
            // Tokens of this scope minus its nested inline modules.
            let mut own: Vec<Tok> = Vec::new();
            let mut j = *from;
            while j < *to {
                if let Some((_, end, _)) = scopes.iter().skip(k + 1).find(|(a, _, _)| *a == j) {
                    j = *end;
                    continue;
                }
                own.push(toks[j].clone());
                j += 1;
            }
            for p in paths(&own) {
                for target in resolve(src, here, &p, root) {
                    if &target != file {
                        edges.insert(target);
                    }
                }
            }
        }
        graph.insert(file.clone(), edges);
    }
    graph
}

/// Every cycle of the graph, one per strongly connected component: the cycle's path and the
/// component's size.
fn cycles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<(Vec<String>, usize)> {
    // Tarjan's strongly connected components, iterative enough for a few hundred files.
    struct T<'a> {
        g: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on: BTreeSet<&'a str>,
        comps: Vec<Vec<&'a str>>,
    }
    fn strong<'a>(t: &mut T<'a>, v: &'a str) {
        let n = t.index.len();
        t.index.insert(v, n);
        t.low.insert(v, n);
        t.stack.push(v);
        t.on.insert(v);
        for w in t.g.get(v).into_iter().flatten() {
            let w = w.as_str();
            if !t.index.contains_key(w) {
                strong(t, w);
                let lw = t.low[w];
                let lv = t.low.get_mut(v).expect("visited");
                *lv = (*lv).min(lw);
            } else if t.on.contains(w) {
                let iw = t.index[w];
                let lv = t.low.get_mut(v).expect("visited");
                *lv = (*lv).min(iw);
            }
        }
        if t.low[v] == t.index[v] {
            let mut comp = Vec::new();
            while let Some(w) = t.stack.pop() {
                t.on.remove(w);
                comp.push(w);
                if w == v {
                    break;
                }
            }
            t.comps.push(comp);
        }
    }
    let mut t = T {
        g: graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        comps: Vec::new(),
    };
    for v in graph.keys() {
        if !t.index.contains_key(v.as_str()) {
            strong(&mut t, v);
        }
    }
    let mut out = Vec::new();
    for comp in t.comps.into_iter().filter(|c| c.len() > 1) {
        let inside: BTreeSet<&str> = comp.iter().copied().collect();
        let start = *inside.iter().next().expect("non-empty");
        // Shortest way back to `start` inside the component (breadth-first).
        let mut prev: BTreeMap<&str, &str> = BTreeMap::new();
        let mut queue = std::collections::VecDeque::from([start]);
        let mut last = start;
        'search: while let Some(v) = queue.pop_front() {
            for w in graph
                .get(v)
                .into_iter()
                .flatten()
                .map(String::as_str)
                .filter(|w| inside.contains(w))
            {
                if w == start {
                    last = v;
                    break 'search;
                }
                if !prev.contains_key(w) {
                    prev.insert(w, v);
                    queue.push_back(w);
                }
            }
        }
        let mut path = vec![start.to_string()];
        let mut v = last;
        while v != start {
            path.push(v.to_string());
            v = prev[v];
        }
        path.push(start.to_string());
        let n = path.len();
        path[1..n - 1].reverse();
        out.push((path, comp.len()));
    }
    out.sort();
    out
}

// ---------------------------------------------------------------------------------------------
// The workspace.

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in fs::read_dir(dir).expect("read src") {
        let p = e.expect("entry").path();
        if p.is_dir() {
            if p.file_name().is_some_and(|n| n != "tests") {
                rust_files(&p, out);
            }
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// Every crate's `src/`, relative to the workspace root: `src` (the CLI) and `crates/*/src`.
fn crate_dirs(root: &Path) -> Vec<String> {
    let mut dirs = vec!["src".to_string()];
    let mut crates: Vec<String> = fs::read_dir(root.join("crates"))
        .expect("read crates/")
        .filter_map(|e| e.ok())
        .filter(|e| e.path().join("src").is_dir())
        .map(|e| format!("crates/{}/src", e.file_name().to_string_lossy()))
        .collect();
    crates.sort();
    dirs.extend(crates);
    dirs
}

/// A crate's non-test sources.
fn load(src_dir: &Path) -> Sources {
    let mut files = Vec::new();
    rust_files(src_dir, &mut files);
    let mut src: Sources = files
        .iter()
        .map(|f| {
            let rel = f
                .strip_prefix(src_dir)
                .expect("under src")
                .to_string_lossy()
                .replace('\\', "/");
            (rel, fs::read_to_string(f).expect("read file"))
        })
        .collect();
    // Files declared under `#[cfg(test)]` are tests.
    let tests: Vec<String> = src
        .iter()
        .flat_map(|(file, text)| {
            let dir = match file.rsplit_once('/') {
                Some((d, "mod.rs" | "lib.rs" | "main.rs")) => format!("{d}/"),
                Some((d, name)) => format!("{d}/{}/", name.trim_end_matches(".rs")),
                None if matches!(file.as_str(), "lib.rs" | "main.rs") => String::new(),
                None => format!("{}/", file.trim_end_matches(".rs")),
            };
            lex(text)
                .test_children
                .into_iter()
                .flat_map(move |c| [format!("{dir}{c}.rs"), format!("{dir}{c}/mod.rs")])
        })
        .collect();
    for t in tests {
        src.remove(&t);
    }
    src
}

/// Everything the house rules find wrong in one crate, one line each.
fn offenders(label: &str, src: &Sources, dirs: &BTreeSet<String>) -> Vec<String> {
    let mut out = Vec::new();
    for (cycle, size) in cycles(&file_graph(src)) {
        let path: Vec<String> = cycle.iter().map(|f| format!("{label}/{f}")).collect();
        out.push(format!(
            "import cycle ({size} files in the component): {}",
            path.join(" -> ")
        ));
    }
    for (file, text) in src {
        let lexed = lex(text);
        for f in long_fns(&lexed, MAX_FN_LINES) {
            out.push(format!(
                "{label}/{file}:{} fn {} is {} lines (max {MAX_FN_LINES})",
                f.line, f.name, f.lines
            ));
        }
        if lexed.code_lines > MAX_FILE_LINES {
            out.push(format!(
                "{label}/{file} is {} lines outside tests (max {MAX_FILE_LINES})",
                lexed.code_lines
            ));
        }
    }
    for d in dirs {
        if src.contains_key(&format!("{d}.rs")) {
            out.push(format!(
                "{label}/{d}.rs beside {label}/{d}/: use {label}/{d}/mod.rs"
            ));
        }
    }
    out
}

/// The directories under `src_dir`, relative to it.
fn subdirs(src_dir: &Path, rel: &str, out: &mut BTreeSet<String>) {
    for e in fs::read_dir(src_dir.join(rel))
        .expect("read dir")
        .filter_map(|e| e.ok())
    {
        if e.path().is_dir() {
            let name = e.file_name().to_string_lossy().to_string();
            let sub = if rel.is_empty() {
                name
            } else {
                format!("{rel}/{name}")
            };
            subdirs(src_dir, &sub, out);
            out.insert(sub);
        }
    }
}

#[test]
fn every_crate_keeps_the_house_rules() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dirs = crate_dirs(root);
    assert!(
        dirs.iter().any(|d| d == "crates/engine/src")
            && dirs.iter().any(|d| d == "crates/plan/src")
    );
    let mut all = Vec::new();
    for d in &dirs {
        let src = load(&root.join(d));
        assert!(!src.is_empty(), "{d} has no sources");
        let mut sub = BTreeSet::new();
        subdirs(&root.join(d), "", &mut sub);
        all.extend(offenders(d, &src, &sub));
    }
    assert!(
        all.is_empty(),
        "{} offenders of the house rules:\n{}",
        all.len(),
        all.join("\n")
    );
}

// ---------------------------------------------------------------------------------------------
// The checker on literal snippets, so it cannot pass by seeing nothing.

fn crate_of(files: &[(&str, &str)]) -> Sources {
    files
        .iter()
        .map(|(f, t)| (f.to_string(), t.to_string()))
        .collect()
}

/// A body of `n` statement lines.
fn body(n: usize) -> String {
    (0..n).map(|k| format!("    let _x{k} = {k};\n")).collect()
}

#[test]
fn a_two_file_cycle_is_found_through_use_trees_and_super() {
    let src = crate_of(&[
        ("lib.rs", "mod a;\nmod b;\n"),
        (
            "a/mod.rs",
            "mod inner;\nuse crate::{b::{self, Thing as T}};\n",
        ),
        ("a/inner.rs", "pub fn f() {}\n"),
        (
            "b.rs",
            "pub struct Thing;\nfn g() { super::a::inner::f() }\n",
        ),
    ]);
    let g = file_graph(&src);
    assert_eq!(g["a/mod.rs"], BTreeSet::from(["b.rs".to_string()]));
    // b reaches a/inner through a, which imports b: a cycle of a and b.
    assert_eq!(
        g["b.rs"],
        BTreeSet::from(["a/inner.rs".to_string(), "a/mod.rs".to_string()])
    );
    assert_eq!(
        cycles(&g),
        vec![(vec!["a/mod.rs".into(), "b.rs".into(), "a/mod.rs".into()], 2)]
    );
    let src = crate_of(&[
        ("lib.rs", "mod a;\nmod b;\n"),
        (
            "a/mod.rs",
            "mod inner;\nuse crate::{b::{self, Thing as T}};\n",
        ),
        ("a/inner.rs", "pub fn f() {}\n"),
        ("b.rs", "pub struct Thing;\nfn g() { super::a::f2() }\n"),
    ]);
    let c = cycles(&file_graph(&src));
    assert_eq!(
        c,
        vec![(vec!["a/mod.rs".into(), "b.rs".into(), "a/mod.rs".into()], 2)]
    );
    let msg = offenders("x", &src, &BTreeSet::from(["a".to_string()]));
    assert_eq!(
        msg,
        vec!["import cycle (2 files in the component): x/a/mod.rs -> x/b.rs -> x/a/mod.rs"]
    );
}

#[test]
fn a_cycle_through_a_module_a_super_path_passes_is_found() {
    // The tensor reaches the ops' kernel through `ops`, and `ops` imports the tensor: before
    // paths counted the modules they pass through, only tensor -> ops/elementwise was seen.
    let src = crate_of(&[
        ("lib.rs", "mod cpu;\n"),
        ("cpu/mod.rs", "mod ops;\nmod tensor;\n"),
        (
            "cpu/ops/mod.rs",
            "pub mod elementwise;\nuse super::tensor::store;\n",
        ),
        ("cpu/ops/elementwise.rs", "pub fn round() {}\n"),
        (
            "cpu/tensor.rs",
            "pub fn store() { super::ops::elementwise::round() }\n",
        ),
    ]);
    let g = file_graph(&src);
    assert_eq!(
        g["cpu/tensor.rs"],
        BTreeSet::from(["cpu/ops/elementwise.rs".into(), "cpu/ops/mod.rs".into()])
    );
    assert_eq!(
        cycles(&g),
        vec![(
            vec![
                "cpu/ops/mod.rs".into(),
                "cpu/tensor.rs".into(),
                "cpu/ops/mod.rs".into()
            ],
            2
        )]
    );
    // A path through the file's own ancestors names none of them: `crate::cpu::ops::x`
    // from cpu/ops/elementwise.rs reaches only its sibling.
    let src = crate_of(&[
        ("lib.rs", "mod cpu;\n"),
        ("cpu/mod.rs", "mod ops;\n"),
        ("cpu/ops/mod.rs", "pub mod a;\npub mod b;\n"),
        ("cpu/ops/a.rs", "use crate::cpu::ops::b::f;\n"),
        ("cpu/ops/b.rs", "pub fn f() {}\n"),
    ]);
    let g = file_graph(&src);
    assert_eq!(g["cpu/ops/a.rs"], BTreeSet::from(["cpu/ops/b.rs".into()]));
}

#[test]
fn paths_in_comments_strings_tests_and_inline_modules_resolve_right() {
    let src = crate_of(&[
        ("lib.rs", "mod a;\nmod b;\n"),
        (
            "a.rs",
            "// use crate::b::X;\nconst S: &str = \"crate::b::X\";\nconst R: &str = r#\"crate::b\"#;\n\
             pub(in crate::b) fn f() {}\n#[cfg(test)]\nmod tests { use crate::b::X; }\n\
             mod opts { use super::f; use self::deep::Y; mod deep { pub struct Y; } }\n",
        ),
        ("b.rs", "use crate::a::f;\n"),
    ]);
    let g = file_graph(&src);
    assert!(
        g["a.rs"].is_empty(),
        "a.rs names b only in comments, strings and tests: {:?}",
        g["a.rs"]
    );
    assert_eq!(g["b.rs"], BTreeSet::from(["a.rs".to_string()]));
}

#[test]
fn a_long_function_is_measured_from_fn_to_its_closing_brace() {
    // 1 `fn` line + 149 body lines + the closing brace = 151 lines.
    let text = format!("impl<T> Display for Wrapper<T> where T: Copy {{\n    fn fmt(&self) -> [u8; 2] {{\n{}    }}\n}}\nfn short() {{}}\n", body(149));
    let long = long_fns(&lex(&text), MAX_FN_LINES);
    assert_eq!(
        long,
        vec![LongFn {
            line: 2,
            name: "Wrapper::fmt".into(),
            lines: 151
        }]
    );
    let text = format!("fn ok() {{\n{}}}\n", body(148));
    assert!(
        long_fns(&lex(&text), MAX_FN_LINES).is_empty(),
        "150 lines is allowed"
    );
}

#[test]
fn braces_in_strings_chars_comments_and_raw_strings_do_not_count() {
    // Were any of these braces code, `f` would close early (or never) and measure wrong.
    let text = "fn f() {\n    let a = \"}\";\n    let b = '}';\n    let c = '\\'';\n    // }\n    /* } /* } */ } */\n\
                let d = r#\"}\"# ;\n    let e = br\"}\";\n    let l: &'static str = \"{\";\n    let g = b'{';\n}\nfn h<'a>(x: &'a u8) -> &'a u8 {\n    x\n}\n";
    let long = long_fns(&lex(text), 0);
    let got: Vec<(usize, usize)> = long.iter().map(|f| (f.line, f.lines)).collect();
    assert_eq!(got, vec![(1, 11), (12, 3)]);
}

#[test]
fn test_sections_count_neither_toward_files_nor_functions() {
    let text = format!("fn a() {{}}\n#[cfg(test)]\nmod tests {{\n    fn long() {{\n{}    }}\n}}\n#[cfg(test)]\nmod more;\n", body(200));
    let lexed = lex(&text);
    assert!(long_fns(&lexed, MAX_FN_LINES).is_empty());
    assert_eq!(lexed.code_lines, 1);
    assert_eq!(lexed.test_children, vec!["more".to_string()]);
    let text = format!("fn a() {{}}\n{}", "const X: u8 = 0;\n".repeat(800));
    assert_eq!(lex(&text).code_lines, 801);
}

#[test]
fn a_file_beside_its_directory_is_one_module_style_too_many() {
    let src = crate_of(&[
        ("lib.rs", "mod a;\nmod b;\n"),
        ("a.rs", "mod c;\n"),
        ("a/c.rs", ""),
        ("b/mod.rs", ""),
    ]);
    let dirs = BTreeSet::from(["a".to_string(), "b".to_string()]);
    assert_eq!(
        offenders("k", &src, &dirs),
        vec!["k/a.rs beside k/a/: use k/a/mod.rs"]
    );
}

// ---------------------------------------------------------------------------------------------
// The module order docs/architecture.md states.

/// Each crate's modules in the order docs/architecture.md states (its module-order table),
/// read from the page: every module of the crate is listed, and none imports one listed after
/// it. Tiers are joined by `->`, lowest first; modules of one tier, joined by `,`, import
/// neither each other; `a + b` is a knot the page names, two modules that import each other.
mod documented_order {
    use super::{file_graph, lex, load, Sources};
    use std::collections::{BTreeMap, BTreeSet};
    use std::path::Path;

    /// One row of the page's table: a module folder (`crates/engine/src`, `src/cli`) and its
    /// modules in tiers, lowest first; each tier's members are knots of one or more modules.
    #[derive(Debug, PartialEq)]
    pub(super) struct Order {
        pub folder: String,
        pub tiers: Vec<Vec<Vec<String>>>,
    }

    /// The rows of the table that follows `<!-- module-order -->`, up to the next blank line:
    /// `` | `folder` | a, b -> c + d -> e | ``.
    pub(super) fn parse(doc: &str) -> Result<Vec<Order>, String> {
        let start = doc
            .find("<!-- module-order -->")
            .ok_or("no `<!-- module-order -->` table")?;
        let mut out = Vec::new();
        for line in doc[start..].lines().skip(1) {
            let line = line.trim();
            if line.is_empty() {
                break;
            }
            let cells: Vec<&str> = line.trim_matches('|').split('|').map(str::trim).collect();
            let [folder, order] = cells[..] else {
                return Err(format!("module-order row `{line}` has not two cells"));
            };
            if !folder.starts_with('`') {
                continue; // the header and its rule
            }
            let name = |m: &str| m.trim().trim_matches('`').to_string();
            let tiers: Vec<Vec<Vec<String>>> = order
                .split("->")
                .map(|t| {
                    t.split(',')
                        .map(|k| k.split('+').map(name).collect::<Vec<_>>())
                        .collect()
                })
                .collect();
            if tiers.iter().flatten().flatten().any(String::is_empty) {
                return Err(format!("module-order row `{line}` has an empty name"));
            }
            out.push(Order {
                folder: name(folder).trim_end_matches('/').to_string(),
                tiers,
            });
        }
        if out.is_empty() {
            return Err("the module-order table has no rows".into());
        }
        Ok(out)
    }

    /// The file modules declared (outside tests) by the root files of `dir` (`lib.rs`,
    /// `main.rs` or `mod.rs`; `dir` relative to the crate's `src/`, `""` for `src/` itself).
    pub(super) fn declared(src: &Sources, dir: &str) -> BTreeSet<String> {
        let prefix = if dir.is_empty() {
            String::new()
        } else {
            format!("{dir}/")
        };
        let mut out = BTreeSet::new();
        for root in ["lib.rs", "main.rs", "mod.rs"] {
            let Some(text) = src.get(&format!("{prefix}{root}")) else {
                continue;
            };
            let toks = lex(text).toks;
            for (i, t) in toks.iter().enumerate() {
                if t.text == "mod" && toks.get(i + 2).is_some_and(|n| n.text == ";") {
                    out.insert(toks[i + 1].text.clone());
                }
            }
        }
        out
    }

    /// The modules directly under `dir` that each one's files name (the root files belong to
    /// none: a crate root may re-export anything).
    pub(super) fn module_graph(src: &Sources, dir: &str) -> BTreeMap<String, BTreeSet<String>> {
        let prefix: Vec<&str> = dir.split('/').filter(|p| !p.is_empty()).collect();
        let module = |file: &str| -> Option<String> {
            let parts: Vec<&str> = file.trim_end_matches(".rs").split('/').collect();
            let m = *parts.get(prefix.len())?;
            let root = parts.len() == prefix.len() + 1 && matches!(m, "lib" | "main" | "mod");
            (parts.starts_with(&prefix) && !root).then(|| m.to_string())
        };
        let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (from, tos) in file_graph(src) {
            let Some(a) = module(&from) else { continue };
            let edges = out.entry(a.clone()).or_default();
            edges.extend(tos.iter().filter_map(|t| module(t)).filter(|b| *b != a));
        }
        out
    }

    /// Everything wrong with `order` for a folder declaring `modules` that import as `graph`:
    /// a module left out or listed twice, a name that is no module, an import of a module
    /// above, and one of a module beside it outside a knot.
    pub(super) fn violations(
        order: &Order,
        modules: &BTreeSet<String>,
        graph: &BTreeMap<String, BTreeSet<String>>,
    ) -> Vec<String> {
        let f = &order.folder;
        let mut out = Vec::new();
        // Each listed module's (tier, knot) position.
        let mut at: BTreeMap<&str, (usize, usize)> = BTreeMap::new();
        for (t, tier) in order.tiers.iter().enumerate() {
            for (k, knot) in tier.iter().enumerate() {
                for m in knot {
                    if at.insert(m, (t, k)).is_some() {
                        out.push(format!("{f}: `{m}` is listed twice"));
                    }
                    if !modules.contains(m) {
                        out.push(format!("{f}: `{m}` is listed but is no module of it"));
                    }
                }
            }
        }
        for m in modules.iter().filter(|m| !at.contains_key(m.as_str())) {
            out.push(format!(
                "{f}: module `{m}` is missing from docs/architecture.md's order"
            ));
        }
        for (from, tos) in graph {
            for to in tos {
                let (Some(a), Some(b)) = (at.get(from.as_str()), at.get(to.as_str())) else {
                    continue;
                };
                if b.0 > a.0 {
                    out.push(format!("{f}: `{from}` imports `{to}`, which is above it"));
                } else if b.0 == a.0 && b.1 != a.1 {
                    out.push(format!(
                        "{f}: `{from}` imports `{to}`, beside it (a knot `{from} + {to}` says so)"
                    ));
                }
            }
        }
        out
    }

    #[test]
    fn every_crate_keeps_the_module_order_docs_architecture_md_states() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let doc = std::fs::read_to_string(root.join("docs/architecture.md")).expect("read doc");
        let orders = parse(&doc).expect("the module-order table parses");
        let mut listed = BTreeSet::new();
        let mut all = Vec::new();
        for order in &orders {
            let Some((krate, dir)) = order.folder.split_once("src") else {
                panic!(
                    "module-order folder `{}` is not a src/ folder",
                    order.folder
                );
            };
            let crate_src = format!("{krate}src");
            let dir = dir.trim_start_matches('/');
            let src = load(&root.join(&crate_src));
            let modules = declared(&src, dir);
            assert!(!modules.is_empty(), "{} declares no module", order.folder);
            all.extend(violations(order, &modules, &module_graph(&src, dir)));
            listed.insert(crate_src);
        }
        for d in super::crate_dirs(root) {
            if !listed.contains(&d) {
                all.push(format!(
                    "{d}: no row in docs/architecture.md's module order"
                ));
            }
        }
        assert!(
            all.is_empty(),
            "{} offenders:\n{}",
            all.len(),
            all.join("\n")
        );
    }

    /// A crate of four modules: `low` imports nothing, `mid` and `peer` import `low`, `top`
    /// imports `mid` and `peer`.
    fn tiny(extra: &str) -> Sources {
        super::crate_of(&[
            (
                "lib.rs",
                "mod low;\nmod mid;\nmod peer;\nmod top;\n#[cfg(test)]\nmod tests;\n",
            ),
            ("low.rs", extra),
            ("mid/mod.rs", "mod inner;\nuse crate::low::X;\n"),
            ("mid/inner.rs", "use crate::low::Y;\n"),
            ("peer.rs", "use super::low;\n"),
            ("top.rs", "use crate::{mid, peer};\n"),
        ])
    }

    fn check(table: &str, src: &Sources) -> Vec<String> {
        let doc = format!(
            "text\n<!-- module-order -->\n| folder | order |\n| --- | --- |\n{table}\n\nmore\n"
        );
        let orders = parse(&doc).expect("parses");
        assert_eq!(orders.len(), 1);
        violations(&orders[0], &declared(src, ""), &module_graph(src, ""))
    }

    #[test]
    fn a_kept_order_passes_and_the_table_reads_as_tiers_and_knots() {
        let src = tiny("");
        assert_eq!(
            declared(&src, ""),
            BTreeSet::from(["low", "mid", "peer", "top"].map(String::from)),
            "the test module is no module of the order"
        );
        assert!(check("| `x/src` | low -> mid, peer -> top |", &src).is_empty());
        let doc = "<!-- module-order -->\n| `src/cli` | `a`, b + c -> d |\n";
        let want = Order {
            folder: "src/cli".into(),
            tiers: vec![
                vec![vec!["a".into()], vec!["b".into(), "c".into()]],
                vec![vec!["d".into()]],
            ],
        };
        assert_eq!(parse(doc), Ok(vec![want]));
        assert!(parse("no table").is_err());
    }

    #[test]
    fn a_module_missing_from_the_doc_or_a_stale_name_is_an_offender() {
        let src = tiny("");
        assert_eq!(
            check("| `x/src` | low -> mid, gone -> top |", &src),
            vec![
                "x/src: `gone` is listed but is no module of it",
                "x/src: module `peer` is missing from docs/architecture.md's order",
            ]
        );
    }

    #[test]
    fn an_arrow_up_or_between_peers_is_an_offender_and_a_knot_is_not() {
        // `low` reaches `mid`'s inner file: an arrow up, found through a file below the module.
        let src = tiny("fn f() { crate::mid::inner::g() }\n");
        assert_eq!(
            check("| `x/src` | low -> mid, peer -> top |", &src),
            vec!["x/src: `low` imports `mid`, which is above it"]
        );
        assert_eq!(
            check("| `x/src` | low, mid -> peer -> top |", &tiny("")),
            vec!["x/src: `mid` imports `low`, beside it (a knot `mid + low` says so)"]
        );
        assert!(check("| `x/src` | low + mid -> peer -> top |", &src).is_empty());
    }
}
