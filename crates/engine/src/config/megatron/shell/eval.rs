//! Runs the parsed script the way bash would, without running any program: assignments and
//! appends, conditions, loops over words, `case`, functions and groups change the variables;
//! every other command is recorded with its expanded words.
//!
//! A branch decided by what the script cannot know (a command's exit status, a file test) is
//! taken as bash would most plausibly run on the way to the training command: the branch that
//! does not `exit` when the other does, and otherwise the one where the condition is false,
//! named in a note when the two differ in what they set or run. A condition decided by a
//! variable the script does not set, or by the script's arguments, is decided with that
//! variable unset (or its default) and named in a note when it matters.

use super::expand::Unset;
use super::lex::Word;
use super::parse::{is_declaration, Assign, AssignValue, Node};
use super::test_expr::{evaluate, glob_match, Outcome, Tri};
use super::{describe_env, Arg, Shell};
use std::collections::BTreeSet;

/// How a command ends: on to the next, or out of the script, function or loop.
pub(super) enum Flow {
    Go(Outcome),
    Exit,
    Return(Outcome),
    Break,
    Continue,
}

/// Commands that change nothing the import reads (no variable, no training command).
const INERT: &[&str] = &[
    "echo",
    "printf",
    "mkdir",
    "cd",
    "pushd",
    "popd",
    "sleep",
    "exit",
    "return",
    "true",
    "false",
    ":",
    "[",
    "[[",
    "test",
    "set",
    "shopt",
    "export",
    "rm",
    "cp",
    "mv",
    "ln",
    "touch",
    "ls",
    "cat",
    "tee",
    "date",
    "hostname",
    "wait",
    "pwd",
    "which",
    "ulimit",
    "umask",
    "trap",
    "chmod",
    "nvidia-smi",
    "env",
    "sync",
    "break",
    "continue",
    "kill",
    "pkill",
    "scontrol",
    "srun_wait",
];

/// Builtins that succeed whatever their arguments.
const SUCCEED: &[&str] = &[
    "echo", "printf", "export", "mkdir", "cd", "set", "shopt", "ulimit", "umask", "trap", "sleep",
    "wait", "pwd", "local", "declare", "readonly", "typeset",
];

/// Builtins that set variables the reader cannot know.
const READERS: &[&str] = &["read", "mapfile", "readarray", "getopts"];

/// What a piece of script could change: the variables it sets, and whether it runs a command
/// that could be the training command or defines a function.
#[derive(Debug, Default)]
struct Effects {
    vars: BTreeSet<String>,
    runs: bool,
}

impl Effects {
    fn any(&self) -> bool {
        self.runs || !self.vars.is_empty()
    }

    fn describe(&self) -> String {
        let mut parts = Vec::new();
        if !self.vars.is_empty() {
            parts.push(format!(
                "sets {}",
                self.vars.iter().cloned().collect::<Vec<_>>().join(", ")
            ));
        }
        if self.runs {
            parts.push("runs commands".to_string());
        }
        parts.join(" and ")
    }

    fn of(nodes: &[&[Node]]) -> Effects {
        let mut e = Effects::default();
        for list in nodes {
            for n in *list {
                e.add(n);
            }
        }
        e
    }

    fn add(&mut self, n: &Node) {
        match n {
            Node::Simple { assigns, words, .. } => {
                self.vars.extend(assigns.iter().map(|a| a.name.clone()));
                let first = words.first().and_then(Word::plain);
                match first {
                    None if words.is_empty() => {}
                    Some(w) if INERT.contains(&w) || is_declaration(w) => {}
                    Some("unset") => {
                        self.vars.extend(
                            words[1..]
                                .iter()
                                .filter_map(|w| w.plain().map(String::from)),
                        );
                    }
                    _ => self.runs = true,
                }
            }
            Node::Test { .. } => {}
            Node::If {
                arms, otherwise, ..
            } => {
                for (c, b) in arms {
                    c.iter().chain(b).for_each(|n| self.add(n));
                }
                otherwise.iter().flatten().for_each(|n| self.add(n));
            }
            Node::For { var, body, .. } => {
                self.vars.insert(var.clone());
                body.iter().for_each(|n| self.add(n));
            }
            Node::Loop { cond, body, .. } => cond.iter().chain(body).for_each(|n| self.add(n)),
            Node::Case { arms, .. } => arms.iter().flat_map(|a| &a.1).for_each(|n| self.add(n)),
            Node::Function { .. } => self.runs = true,
            Node::Group { body, .. } | Node::Unsupported { body, .. } => {
                body.iter().for_each(|n| self.add(n));
            }
            Node::AndOr { first, rest } => {
                self.add(first);
                rest.iter().for_each(|(_, n)| self.add(n));
            }
            Node::Pipeline { cmds, .. } => cmds.iter().for_each(|n| self.add(n)),
        }
    }
}

/// True when `nodes` end the script outright (an `exit` among them, not inside a condition).
fn exits(nodes: &[&[Node]]) -> bool {
    nodes.iter().flat_map(|l| l.iter()).any(|n| match n {
        Node::Simple { words, .. } => words.first().and_then(Word::plain) == Some("exit"),
        Node::Group { body, .. } => exits(&[body]),
        Node::AndOr { first, rest } => {
            exits(&[std::slice::from_ref(first)])
                || rest.iter().any(|(_, n)| exits(&[std::slice::from_ref(n)]))
        }
        _ => false,
    })
}

/// The line a node starts on (0 when it has none).
fn line_of(n: &Node) -> usize {
    match n {
        Node::Simple { line, .. }
        | Node::Test { line, .. }
        | Node::If { line, .. }
        | Node::For { line, .. }
        | Node::Loop { line, .. }
        | Node::Case { line, .. }
        | Node::Unsupported { line, .. } => *line,
        Node::Group { body, .. } => body.first().map_or(0, line_of),
        Node::AndOr { first, .. } => line_of(first),
        Node::Pipeline { cmds, .. } => cmds.first().map_or(0, line_of),
        Node::Function { .. } => 0,
    }
}

impl Shell {
    /// Runs `nodes` in order.
    pub(super) fn run(&mut self, nodes: &[Node]) -> Flow {
        let mut last = Outcome::known(true);
        for n in nodes {
            match self.node(n) {
                Flow::Go(o) => last = o,
                other => return other,
            }
        }
        Flow::Go(last)
    }

    fn node(&mut self, n: &Node) -> Flow {
        match n {
            Node::Simple {
                assigns,
                words,
                line,
            } => self.simple(assigns, words, *line),
            Node::Test { words, .. } => {
                let args: Vec<_> = words
                    .iter()
                    .map(|w| self.expand_one(w, Unset::Empty))
                    .collect();
                let vars = self.vars.keys().cloned().collect::<BTreeSet<_>>();
                Flow::Go(evaluate(&args, true, &|n| vars.contains(n)))
            }
            Node::If {
                arms,
                otherwise,
                line,
            } => self.if_clause(arms, otherwise.as_deref(), *line),
            Node::For {
                var,
                items,
                body,
                line,
            } => self.for_loop(var, items.as_deref(), body, *line),
            Node::Loop {
                until,
                cond,
                body,
                line,
            } => {
                let e = Effects::of(&[cond, body]);
                if e.any() {
                    let kind = if *until { "until" } else { "while" };
                    let text = format!(
                        "a `{kind}` loop is not run (it repeats until a command's status changes), and what it {} is not applied",
                        e.describe()
                    );
                    self.note(*line, text);
                }
                Flow::Go(Outcome::unknown("a loop".into()))
            }
            Node::Case {
                subject,
                arms,
                line,
            } => self.case_clause(subject, arms, *line),
            Node::Function { name, body } => {
                self.functions.insert(name.clone(), body.clone());
                Flow::Go(Outcome::known(true))
            }
            Node::Group { body, subshell } => {
                if *subshell {
                    let saved = (self.vars.clone(), self.functions.clone());
                    let flow = self.run(body);
                    (self.vars, self.functions) = saved;
                    match flow {
                        // `exit` leaves the subshell only.
                        Flow::Exit => Flow::Go(Outcome::known(false)),
                        other => other,
                    }
                } else {
                    self.run(body)
                }
            }
            Node::AndOr { first, rest } => self.and_or(first, rest),
            Node::Pipeline { negated, cmds } => {
                let mut last = Outcome::known(true);
                for c in cmds {
                    // Each part of a pipeline runs in a subshell.
                    let saved = (self.vars.clone(), self.functions.clone());
                    let flow = self.node(c);
                    if cmds.len() > 1 {
                        (self.vars, self.functions) = saved;
                    }
                    match flow {
                        Flow::Go(o) => last = o,
                        Flow::Exit if cmds.len() > 1 => {}
                        other => return other,
                    }
                }
                if *negated {
                    last.status = last.status.not();
                }
                Flow::Go(last)
            }
            Node::Unsupported { what, body, line } => {
                let e = Effects::of(&[body]);
                if e.any() {
                    let text = format!(
                        "{what} is not run, and what it {} is not applied",
                        e.describe()
                    );
                    self.note(*line, text);
                }
                Flow::Go(Outcome::unknown((*what).to_string()))
            }
        }
    }

    /// Whether to take the branch `yes` (the condition true) over `no`, given the condition's
    /// outcome `o`; a note says so when the outcome is assumed and the branches differ.
    fn choose(&mut self, o: &Outcome, line: usize, yes: &[&[Node]], no: &[&[Node]]) -> bool {
        let (ey, en) = (Effects::of(yes), Effects::of(no));
        let matters = ey.any() || en.any();
        match o.status {
            Tri::True | Tri::False => {
                let taken = o.status == Tri::True;
                if !o.env.is_empty() && matters {
                    let text = format!(
                        "{} depends on {}: it reads as {taken}, so the branch that {} runs",
                        self.quote_line(line),
                        describe_env(&o.env),
                        (if taken { &ey } else { &en }).describe_or("does nothing"),
                    );
                    self.note(line, text);
                }
                taken
            }
            Tri::Unknown => {
                let (xy, xn) = (exits(yes), exits(no));
                if xy != xn {
                    // The training command runs, so the script took the branch that goes on.
                    return xn;
                }
                // Apply neither branch's changes where one has none; else the false branch.
                let taken = !ey.any() && en.any();
                if matters {
                    let skipped = if taken { &en } else { &ey };
                    let text = format!(
                        "cannot decide {} ({}): the branch that {} is not applied",
                        self.quote_line(line),
                        o.why.as_deref().unwrap_or("unknown"),
                        skipped.describe_or("does nothing"),
                    );
                    self.note(line, text);
                }
                taken
            }
        }
    }

    fn if_clause(
        &mut self,
        arms: &[(Vec<Node>, Vec<Node>)],
        otherwise: Option<&[Node]>,
        line: usize,
    ) -> Flow {
        for (i, (cond, body)) in arms.iter().enumerate() {
            let o = match self.run(cond) {
                Flow::Go(o) => o,
                other => return other,
            };
            let mut rest: Vec<&[Node]> = arms[i + 1..]
                .iter()
                .flat_map(|(c, b)| [c.as_slice(), b.as_slice()])
                .collect();
            rest.extend(otherwise);
            let at = cond.first().map_or(line, line_of);
            if self.choose(&o, at, &[body], &rest) {
                return self.run(body);
            }
        }
        match otherwise {
            Some(body) => self.run(body),
            None => Flow::Go(Outcome::known(true)),
        }
    }

    fn and_or(&mut self, first: &Node, rest: &[(bool, Node)]) -> Flow {
        let mut o = match self.node(first) {
            Flow::Go(o) => o,
            other => return other,
        };
        for (and, n) in rest {
            let one = std::slice::from_ref(n);
            let line = line_of(first);
            let run = if *and {
                self.choose(&o, line, &[one], &[])
            } else {
                !self.choose(&o, line, &[], &[one])
            };
            if run {
                o = match self.node(n) {
                    Flow::Go(o) => o,
                    other => return other,
                };
            }
        }
        Flow::Go(o)
    }

    fn for_loop(&mut self, var: &str, items: Option<&[Word]>, body: &[Node], line: usize) -> Flow {
        let values: Vec<String> = match items {
            Some(words) => words
                .iter()
                .flat_map(|w| self.expand(w, Unset::Raw))
                .map(|e| e.text)
                .collect(),
            None => {
                if self.args.is_none() && Effects::of(&[body]).any() {
                    let text = "a `for` loop over the script's arguments runs for none (the script is read without arguments)".to_string();
                    self.note(line, text);
                }
                self.args.clone().unwrap_or_default()
            }
        };
        let mut last = Outcome::known(true);
        for v in values {
            if self.budget == 0 {
                self.note(
                    line,
                    "the loop ran past the reader's limit of iterations: it stopped there".into(),
                );
                break;
            }
            self.budget -= 1;
            self.vars.insert(
                var.to_string(),
                super::Var {
                    items: vec![v],
                    env: BTreeSet::new(),
                },
            );
            match self.run(body) {
                Flow::Go(o) => last = o,
                Flow::Break => break,
                Flow::Continue => {}
                other => return other,
            }
        }
        Flow::Go(last)
    }

    fn case_clause(
        &mut self,
        subject: &Word,
        arms: &[(Vec<Word>, Vec<Node>)],
        line: usize,
    ) -> Flow {
        let s = self.expand_one(subject, Unset::Empty);
        for (i, (patterns, body)) in arms.iter().enumerate() {
            let hit = patterns.iter().any(|p| {
                let p = self.expand_one(p, Unset::Empty);
                glob_match(&p.text, &s.text)
            });
            if hit {
                if !s.env.is_empty() {
                    let others: Vec<&[Node]> = arms
                        .iter()
                        .enumerate()
                        .filter(|(j, _)| *j != i)
                        .map(|(_, a)| a.1.as_slice())
                        .collect();
                    if Effects::of(&[body]).any() || Effects::of(&others).any() {
                        let text = format!(
                            "{} depends on {}: the arm for '{}' runs",
                            self.quote_line(line),
                            describe_env(&s.env),
                            s.text
                        );
                        self.note(line, text);
                    }
                }
                return self.run(body);
            }
        }
        Flow::Go(Outcome::known(true))
    }

    fn assign(&mut self, a: &Assign) {
        let (items, env) = match &a.value {
            AssignValue::Scalar(w) => {
                let e = self.expand_one(w, Unset::Raw);
                (vec![e.text], e.env)
            }
            AssignValue::Array(words) => {
                let mut env = BTreeSet::new();
                let mut items = Vec::new();
                for w in words {
                    for e in self.expand(w, Unset::Raw) {
                        env.extend(e.env);
                        items.push(e.text);
                    }
                }
                (items, env)
            }
        };
        if let Some(index) = &a.index {
            let i = self
                .arith_text(index)
                .and_then(|(i, _)| usize::try_from(i).ok());
            let mut cur = self.vars.get(&a.name).cloned().unwrap_or_default();
            if let (Some(i), Some(v)) = (i, items.into_iter().next()) {
                if cur.items.len() <= i {
                    cur.items.resize(i + 1, String::new());
                }
                cur.items[i] = if a.append {
                    cur.items[i].clone() + &v
                } else {
                    v
                };
                cur.env.extend(env);
                self.set(&a.name, cur.items, false, cur.env);
            }
            return;
        }
        let scalar_append = a.append && matches!(a.value, AssignValue::Scalar(_));
        if scalar_append {
            // `X+=text` appends to the first item (a string).
            let mut cur = self.vars.get(&a.name).cloned().unwrap_or_default();
            let text = items.into_iter().next().unwrap_or_default();
            match cur.items.first_mut() {
                Some(first) => first.push_str(&text),
                None => cur.items.push(text),
            }
            cur.env.extend(env);
            self.set(&a.name, cur.items, false, cur.env);
        } else {
            self.set(&a.name, items, a.append, env);
        }
    }

    fn simple(&mut self, assigns: &[Assign], words: &[Word], line: usize) -> Flow {
        let first = words.first().and_then(Word::plain).map(str::to_string);
        if words.is_empty() || first.as_deref().is_some_and(is_declaration) {
            for a in assigns {
                self.assign(a);
            }
            return Flow::Go(Outcome::known(true));
        }
        // Assignments before a command set its environment only.
        if matches!(first.as_deref(), Some("[" | "test")) {
            self.dropped.clear();
            let mut args: Vec<_> = words[1..]
                .iter()
                .flat_map(|w| self.expand(w, Unset::Empty))
                .collect();
            if first.as_deref() == Some("[") && args.last().is_some_and(|a| a.text == "]") {
                args.pop();
            }
            let vars = self.vars.keys().cloned().collect::<BTreeSet<_>>();
            let mut o = evaluate(&args, false, &|n| vars.contains(n));
            o.env.append(&mut self.dropped);
            return Flow::Go(o);
        }
        let args: Vec<Arg> = words
            .iter()
            .flat_map(|w| self.expand(w, Unset::Raw))
            .map(|e| Arg {
                text: e.text,
                env: e.env,
            })
            .collect();
        let Some(name) = args.first().map(|a| a.text.clone()) else {
            return Flow::Go(Outcome::known(true));
        };
        let rest: Vec<String> = args[1..].iter().map(|a| a.text.clone()).collect();
        if let Some(flow) = self.builtin(&name, &rest, line) {
            return flow;
        }
        if let Some(body) = self.functions.get(&name).cloned() {
            return self.call(&name, rest, &body, line);
        }
        let status = if SUCCEED.contains(&name.as_str()) {
            Outcome::known(true)
        } else {
            Outcome::unknown(format!("the exit status of `{name}`"))
        };
        self.script.commands.push(args);
        Flow::Go(status)
    }

    /// The builtins that change the reader's state or its control flow.
    fn builtin(&mut self, name: &str, rest: &[String], line: usize) -> Option<Flow> {
        let ok = || Some(Flow::Go(Outcome::known(true)));
        match name {
            "true" | ":" => ok(),
            "false" => Some(Flow::Go(Outcome::known(false))),
            "exit" => Some(Flow::Exit),
            "return" => Some(Flow::Return(Outcome::known(
                rest.first().is_none_or(|s| s == "0"),
            ))),
            "break" => Some(Flow::Break),
            "continue" => Some(Flow::Continue),
            "unset" => {
                let functions = rest.first().is_some_and(|f| f == "-f");
                for n in rest.iter().filter(|r| !r.starts_with('-')) {
                    if functions {
                        self.functions.remove(n);
                    } else {
                        self.vars.remove(n);
                    }
                }
                ok()
            }
            "shift" => {
                let n = rest.first().and_then(|s| s.parse().ok()).unwrap_or(1usize);
                if let Some(a) = &mut self.args {
                    a.drain(..n.min(a.len()));
                }
                ok()
            }
            "set" if rest.first().is_some_and(|r| r == "--") => {
                self.args = Some(rest[1..].to_vec());
                ok()
            }
            "source" | "." => {
                let file = rest.first().cloned().unwrap_or_default();
                self.note(
                    line,
                    format!(
                        "`{name} {file}` is not read, so what that file sets is not known here"
                    ),
                );
                Some(Flow::Go(Outcome::unknown(format!("`{name} {file}`"))))
            }
            "eval" => {
                self.note(line, format!("`eval {}` is not evaluated", rest.join(" ")));
                Some(Flow::Go(Outcome::unknown("`eval`".into())))
            }
            n if READERS.contains(&n) => {
                let vars: Vec<&str> = rest
                    .iter()
                    .filter(|r| !r.starts_with('-'))
                    .map(String::as_str)
                    .collect();
                self.note(
                    line,
                    format!(
                        "`{n}` is not evaluated: {} keep(s) the value set before it",
                        vars.join(", ")
                    ),
                );
                Some(Flow::Go(Outcome::unknown(format!("`{n}`"))))
            }
            _ => None,
        }
    }

    fn call(&mut self, name: &str, args: Vec<String>, body: &[Node], line: usize) -> Flow {
        if self.depth >= super::MAX_DEPTH {
            self.note(
                line,
                format!("the call of `{name}` nests deeper than the reader follows: not run"),
            );
            return Flow::Go(Outcome::unknown(format!("`{name}`")));
        }
        self.depth += 1;
        let saved = self.args.replace(args);
        let flow = self.run(body);
        self.args = saved;
        self.depth -= 1;
        match flow {
            Flow::Return(o) | Flow::Go(o) => Flow::Go(o),
            Flow::Break | Flow::Continue => Flow::Go(Outcome::known(true)),
            Flow::Exit => Flow::Exit,
        }
    }
}

impl Effects {
    fn describe_or(&self, nothing: &str) -> String {
        if self.any() {
            self.describe()
        } else {
            nothing.to_string()
        }
    }
}
