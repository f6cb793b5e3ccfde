//! Enough of bash to read a Megatron-LM launch script the way bash runs it: quotes, line
//! continuations, comments, variables and bash arrays with `+=` appends, `${X:-default}` and
//! friends, `$((arithmetic))`, `if`/`elif`/`else` on `[[ ]]`/`[ ]`/`test` conditions,
//! `&&`/`||` lists, `for` loops over words, `case`, functions and `( )`/`{ }` groups
//! ([`lex`] -> [`parse`] -> [`eval`]).
//!
//! What it cannot evaluate is never dropped in silence: `$(...)` and variables the script does
//! not set stay as written and are reported as unresolved; a condition it cannot decide (a file
//! test, a command's exit status), a `while` loop, `source` or `eval` is named in a note with
//! its line, as is a condition or a flag value that depends on a variable the script does not
//! set (the environment) or on the script's own arguments, which it is read without.

mod eval;
mod expand;
mod lex;
mod parse;
mod test_expr;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet};
use std::rc::Rc;

/// One word of a command after expansion, with the variables the script does not set (or the
/// script's arguments: `1`, `@`) that it was read from.
#[derive(Debug, Clone, PartialEq, Default)]
pub(super) struct Arg {
    pub text: String,
    pub env: BTreeSet<String>,
}

/// The commands a script runs, after expansion, and what could not be resolved.
#[derive(Debug, Default)]
pub(super) struct Script {
    /// Each command's words (assignments taken out), in the order they run.
    pub commands: Vec<Vec<Arg>>,
    /// Variables and substitutions that could not be resolved, as written (`$TP`, `$(nproc)`).
    pub unresolved: Vec<String>,
    /// Every assignment in script order, with its value split into words as an unquoted
    /// `$NAME` would be (Megatron-LM's modelopt conf files only set `MODEL_ARGS="..."`); an
    /// append gives the whole value after it.
    pub assignments: Vec<(String, Vec<String>)>,
    /// What was evaluated under an assumption, or not evaluated, one sentence each.
    pub notes: Vec<String>,
}

/// A variable: its items (one for a scalar) and the unset variables its value was read from.
#[derive(Debug, Clone, Default)]
struct Var {
    items: Vec<String>,
    env: BTreeSet<String>,
}

/// The interpreter's state.
struct Shell {
    vars: BTreeMap<String, Var>,
    functions: BTreeMap<String, Rc<[parse::Node]>>,
    /// The positional parameters inside a function call; `None` at the top, where they are the
    /// script's own arguments (read as none).
    args: Option<Vec<String>>,
    /// The script's lines, to quote in notes.
    lines: Vec<String>,
    script: Script,
    /// Function calls in progress.
    depth: usize,
    /// Loop iterations left before the reader stops looping.
    budget: usize,
    /// The unset variables read by expansions that left no word (`[ -z $X ]`).
    dropped: BTreeSet<String>,
}

/// The most nested function calls evaluated.
const MAX_DEPTH: usize = 32;
/// The most loop iterations evaluated in one script.
const MAX_ITERATIONS: usize = 100_000;

/// Reads a script: every command it runs, expanded, with notes on what was assumed.
pub(super) fn parse(text: &str) -> Script {
    let nodes = parse::parse(lex::lex(text));
    let mut sh = Shell {
        vars: BTreeMap::new(),
        functions: BTreeMap::new(),
        args: None,
        lines: text.lines().map(str::to_string).collect(),
        script: Script::default(),
        depth: 0,
        budget: MAX_ITERATIONS,
        dropped: BTreeSet::new(),
    };
    sh.run(&nodes);
    let mut script = sh.script;
    script.unresolved.dedup();
    let mut seen = BTreeSet::new();
    script.notes.retain(|n| seen.insert(n.clone()));
    script
}

impl Shell {
    fn unresolved(&mut self, raw: &str) {
        self.script.unresolved.push(raw.to_string());
    }

    fn note(&mut self, line: usize, text: String) {
        self.script.notes.push(format!("line {line}: {text}"));
    }

    /// Line `line` of the script, trimmed and shortened for a note.
    fn quote_line(&self, line: usize) -> String {
        let text = self
            .lines
            .get(line.saturating_sub(1))
            .map_or("", |l| l.trim());
        let short: String = text.chars().take(90).collect();
        if short.len() < text.len() {
            format!("`{short}...`")
        } else {
            format!("`{short}`")
        }
    }

    /// Sets `name` (appending with `append`), recording the assignment.
    fn set(&mut self, name: &str, items: Vec<String>, append: bool, env: BTreeSet<String>) {
        let var = self.vars.entry(name.to_string()).or_default();
        if append {
            var.items.extend(items);
        } else {
            var.items = items;
            var.env.clear();
        }
        var.env.extend(env);
        let words = var
            .items
            .iter()
            .flat_map(|v| v.split_whitespace().map(str::to_string))
            .collect();
        self.script.assignments.push((name.to_string(), words));
    }
}

/// How a set of unset variables reads in a note: "TP (not set by the script)", "the script's
/// argument 3".
pub(super) fn describe_env(env: &BTreeSet<String>) -> String {
    let mut args = Vec::new();
    let mut vars = Vec::new();
    for n in env {
        if n.parse::<usize>().is_ok() {
            args.push(n.as_str());
        } else if matches!(n.as_str(), "@" | "*" | "#") {
            args.push("all");
        } else {
            vars.push(n.as_str());
        }
    }
    let mut parts = Vec::new();
    if !vars.is_empty() {
        parts.push(format!(
            "{} (not set by the script: the environment may set {})",
            vars.join(", "),
            if vars.len() == 1 { "it" } else { "them" }
        ));
    }
    if !args.is_empty() {
        args.dedup();
        parts.push(if args == ["all"] {
            "the script's arguments (read as none)".to_string()
        } else {
            format!(
                "the script's argument{} {} (read as not given)",
                if args.len() == 1 { "" } else { "s" },
                args.join(", ")
            )
        });
    }
    parts.join(" and ")
}
