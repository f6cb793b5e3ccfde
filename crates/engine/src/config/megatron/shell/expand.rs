//! Word expansion as bash does it for a launch script: parameters (`$X`, `${X}`, `${A[@]}`,
//! `${A[i]}`, `${#A[@]}`, `${X:-d}`, `${X-d}`, `${X:=d}`, `${X:+alt}`), integer arithmetic
//! `$((...))`, and word splitting of unquoted expansions. Every expanded word remembers the
//! variables the script does not set that it was read from (its `env`), so a flag whose value
//! came from the environment or a default can be named.

use super::lex::{word_of, Piece, Word};
use super::Shell;
use std::collections::BTreeSet;

/// An expanded word and the unset variables (or the script's arguments, `1`, `@`) it read.
#[derive(Debug, Clone, PartialEq, Default)]
pub(super) struct Expanded {
    pub text: String,
    pub env: BTreeSet<String>,
}

/// How a parameter that is not set expands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Unset {
    /// Kept as written (`$TP`) and reported as unresolved: a command's words.
    Raw,
    /// Empty, as bash expands it: a test's operands.
    Empty,
}

/// The value of one parameter: its items (one for a scalar), whether it spreads into one word
/// per item when quoted (`"${A[@]}"`), and what it read.
struct Value {
    items: Vec<String>,
    spread: bool,
    env: BTreeSet<String>,
}

/// Words under construction: `open` when the last word may still grow.
#[derive(Default)]
struct Builder {
    words: Vec<Expanded>,
    open: bool,
    /// A quoted piece was seen, so an empty word counts.
    quoted: bool,
}

impl Builder {
    fn add(&mut self, text: &str, env: &BTreeSet<String>) {
        if self.open {
            let w = self.words.last_mut().expect("an open word");
            w.text.push_str(text);
            w.env.extend(env.iter().cloned());
        } else {
            self.words.push(Expanded {
                text: text.to_string(),
                env: env.clone(),
            });
            self.open = true;
        }
    }

    /// Unquoted text: split at blanks.
    fn add_split(&mut self, text: &str, env: &BTreeSet<String>) {
        if text.is_empty() {
            return;
        }
        if text.starts_with(char::is_whitespace) {
            self.open = false;
        }
        for (i, part) in text.split_whitespace().enumerate() {
            if i > 0 {
                self.open = false;
            }
            self.add(part, env);
        }
        if text.ends_with(char::is_whitespace) {
            self.open = false;
        }
    }

    fn finish(mut self) -> Vec<Expanded> {
        if self.words.is_empty() && self.quoted {
            self.words.push(Expanded::default());
        }
        self.words
    }
}

/// A parameter's name and what follows it in `${...}`.
fn split_name(body: &str) -> (&str, &str) {
    let special = body
        .chars()
        .next()
        .is_some_and(|c| matches!(c, '@' | '*' | '#' | '?' | '$' | '!'));
    let end = if special {
        1
    } else if body.starts_with(|c: char| c.is_ascii_digit()) {
        body.find(|c: char| !c.is_ascii_digit())
            .unwrap_or(body.len())
    } else {
        body.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(body.len())
    };
    body.split_at(end)
}

impl Shell {
    /// Expands `word` into zero or more words.
    pub(super) fn expand(&mut self, word: &Word, unset: Unset) -> Vec<Expanded> {
        let mut b = Builder {
            quoted: word.quoted,
            ..Builder::default()
        };
        let none = BTreeSet::new();
        for piece in &word.pieces {
            match piece {
                Piece::Lit(s) => b.add(s, &none),
                Piece::Command(raw) => {
                    self.unresolved(raw);
                    b.add(raw, &none);
                }
                Piece::Arith { expr, quoted, raw } => match self.arith_text(expr) {
                    Some((v, env)) => {
                        let text = v.to_string();
                        if *quoted {
                            b.add(&text, &env);
                        } else {
                            b.add_split(&text, &env);
                        }
                    }
                    None => {
                        self.unresolved(raw);
                        b.add(raw, &none);
                    }
                },
                Piece::Param { body, quoted, raw } => match self.param(body, unset) {
                    Some(v) => {
                        for (i, item) in v.items.iter().enumerate() {
                            if i > 0 && v.spread {
                                b.open = false;
                            }
                            if *quoted {
                                b.add(item, &v.env);
                            } else {
                                b.add_split(item, &v.env);
                            }
                        }
                        if *quoted && v.items.is_empty() && !v.spread {
                            b.add("", &v.env);
                        } else if v.items.iter().all(|i| i.trim().is_empty()) {
                            // Nothing left of it: what it read still counts for a test.
                            self.dropped.extend(v.env);
                        }
                    }
                    None => {
                        self.unresolved(raw);
                        b.add(raw, &none);
                    }
                },
            }
        }
        b.finish()
    }

    /// Expands `word` into one string (an assignment's value: no word splitting).
    pub(super) fn expand_one(&mut self, word: &Word, unset: Unset) -> Expanded {
        let unsplit = Word {
            pieces: word
                .pieces
                .iter()
                .map(|p| match p {
                    Piece::Param { body, raw, .. } => Piece::Param {
                        body: body.clone(),
                        quoted: true,
                        raw: raw.clone(),
                    },
                    Piece::Arith { expr, raw, .. } => Piece::Arith {
                        expr: expr.clone(),
                        quoted: true,
                        raw: raw.clone(),
                    },
                    other => other.clone(),
                })
                .collect(),
            quoted: true,
        };
        let words = self.expand(&unsplit, unset);
        let mut out = Expanded::default();
        for (i, w) in words.into_iter().enumerate() {
            if i > 0 {
                out.text.push(' ');
            }
            out.text.push_str(&w.text);
            out.env.extend(w.env);
        }
        out
    }

    /// The value of `${body}`; `None` when it cannot be given (kept as written).
    fn param(&mut self, body: &str, unset: Unset) -> Option<Value> {
        let env = |n: &str| BTreeSet::from([n.to_string()]);
        if let Some(rest) = body.strip_prefix('#').filter(|r| !r.is_empty()) {
            // `${#A[@]}` items, `${#X}` characters.
            let (name, sub) = split_name(rest);
            let v = self.lookup(name);
            let n = match (sub, &v) {
                ("[@]" | "[*]", Some(v)) => v.items.len(),
                ("", Some(v)) => v.items.first().map_or(0, |s| s.chars().count()),
                _ => return None,
            };
            return Some(Value {
                items: vec![n.to_string()],
                spread: false,
                env: v.map(|v| v.env).unwrap_or_default(),
            });
        }
        let (name, mut rest) = split_name(body);
        if name.is_empty() {
            return None;
        }
        let mut spread = false;
        let mut index = None;
        if let Some(sub) = rest.strip_prefix('[') {
            let close = sub.find(']')?;
            let (i, after) = (&sub[..close], &sub[close + 1..]);
            match i {
                "@" => spread = true,
                "*" => {}
                i => index = Some(self.arith_text(i)?.0),
            }
            rest = after;
        }
        let found = self.lookup(name).map(|mut v| {
            if let Some(i) = index {
                let item = usize::try_from(i)
                    .ok()
                    .and_then(|i| v.items.get(i).cloned());
                v.items = item.into_iter().collect();
            } else if !spread && name != "@" && name != "*" {
                // `$A` of an array is its first item; `${A[*]}` joins.
                if rest.is_empty() && !body.contains('[') {
                    v.items.truncate(1);
                } else {
                    v.items = vec![v.items.join(" ")];
                }
            }
            v.spread = spread || name == "@";
            v
        });
        let (op, operand) = match rest {
            "" => ("", ""),
            r if r.starts_with(":-")
                || r.starts_with(":=")
                || r.starts_with(":+")
                || r.starts_with(":?") =>
            {
                r.split_at(2)
            }
            r if r.starts_with('-')
                || r.starts_with('=')
                || r.starts_with('+')
                || r.starts_with('?') =>
            {
                r.split_at(1)
            }
            _ => return None,
        };
        let empty = found
            .as_ref()
            .is_none_or(|v| v.items.iter().all(String::is_empty));
        let use_default = match op {
            ":-" | ":=" => empty,
            "-" | "=" => found.is_none(),
            _ => false,
        };
        if use_default {
            let mut d = self.expand_one(&word_of(operand), unset);
            d.env.insert(name.to_string());
            if let Some(v) = &found {
                d.env.extend(v.env.iter().cloned());
            }
            if op.ends_with('=') {
                self.set(name, vec![d.text.clone()], false, d.env.clone());
            }
            return Some(Value {
                items: vec![d.text],
                spread: false,
                env: d.env,
            });
        }
        match op {
            ":+" | "+" => {
                let set = if op == ":+" { !empty } else { found.is_some() };
                let mut v = if set {
                    let a = self.expand_one(&word_of(operand), unset);
                    Value {
                        items: vec![a.text],
                        spread: false,
                        env: a.env,
                    }
                } else {
                    Value {
                        items: Vec::new(),
                        spread: false,
                        env: BTreeSet::new(),
                    }
                };
                if found.is_none() {
                    v.env.insert(name.to_string());
                }
                Some(v)
            }
            ":?" | "?" if empty => None,
            _ => match found {
                Some(v) => Some(v),
                None if self.is_argument(name) => Some(Value {
                    items: Vec::new(),
                    spread: name == "@",
                    env: env(name),
                }),
                None if unset == Unset::Empty => Some(Value {
                    items: Vec::new(),
                    spread: false,
                    env: env(name),
                }),
                None => None,
            },
        }
    }

    /// A variable's (or positional parameter's) value.
    fn lookup(&self, name: &str) -> Option<Value> {
        if name == "@" || name == "*" {
            return self.args.as_ref().map(|a| Value {
                items: a.clone(),
                spread: true,
                env: BTreeSet::new(),
            });
        }
        if name == "#" {
            return self.args.as_ref().map(|a| Value {
                items: vec![a.len().to_string()],
                spread: false,
                env: BTreeSet::new(),
            });
        }
        if let Ok(i) = name.parse::<usize>() {
            let a = self.args.as_ref()?;
            return (i >= 1)
                .then(|| a.get(i - 1).cloned())
                .flatten()
                .map(|s| Value {
                    items: vec![s],
                    spread: false,
                    env: BTreeSet::new(),
                });
        }
        self.vars.get(name).map(|v| Value {
            items: v.items.clone(),
            spread: false,
            env: v.env.clone(),
        })
    }

    /// Positional and special parameters: the script's own arguments, which a launch script
    /// is read without.
    fn is_argument(&self, name: &str) -> bool {
        name.parse::<usize>().is_ok() || matches!(name, "@" | "*" | "#")
    }

    /// Integer arithmetic on `text` (its `$` expansions made first), with what it read.
    pub(super) fn arith_text(&mut self, text: &str) -> Option<(i64, BTreeSet<String>)> {
        let e = self.expand_one(&word_of(text), Unset::Raw);
        if e.text.contains('$') {
            return None;
        }
        let mut env = e.env;
        let mut p = Arith {
            chars: e.text.chars().filter(|c| !c.is_whitespace()).collect(),
            pos: 0,
            shell: self,
            env: &mut env,
        };
        let v = p.sum()?;
        (p.pos == p.chars.len()).then_some((v, env))
    }
}

/// A recursive-descent reader of integer expressions: `+ - * / % **`, parentheses, unary
/// signs, numbers and variable names (a name the script does not set gives no value).
struct Arith<'a> {
    chars: Vec<char>,
    pos: usize,
    shell: &'a Shell,
    env: &'a mut BTreeSet<String>,
}

impl Arith<'_> {
    fn peek(&self) -> Option<char> {
        self.chars.get(self.pos).copied()
    }

    fn sum(&mut self) -> Option<i64> {
        let mut v = self.product()?;
        while let Some(c @ ('+' | '-')) = self.peek() {
            self.pos += 1;
            let r = self.product()?;
            v = if c == '+' {
                v.checked_add(r)?
            } else {
                v.checked_sub(r)?
            };
        }
        Some(v)
    }

    fn product(&mut self) -> Option<i64> {
        let mut v = self.power()?;
        while let Some(c @ ('*' | '/' | '%')) = self.peek() {
            if c == '*' && self.chars.get(self.pos + 1) == Some(&'*') {
                break;
            }
            self.pos += 1;
            let r = self.power()?;
            v = match c {
                '*' => v.checked_mul(r)?,
                '/' => v.checked_div(r)?,
                _ => v.checked_rem(r)?,
            };
        }
        Some(v)
    }

    fn power(&mut self) -> Option<i64> {
        let base = self.unary()?;
        if self.peek() == Some('*') && self.chars.get(self.pos + 1) == Some(&'*') {
            self.pos += 2;
            let exp = u32::try_from(self.power()?).ok()?;
            return base.checked_pow(exp);
        }
        Some(base)
    }

    fn unary(&mut self) -> Option<i64> {
        match self.peek()? {
            '-' => {
                self.pos += 1;
                self.unary()?.checked_neg()
            }
            '+' => {
                self.pos += 1;
                self.unary()
            }
            '(' => {
                self.pos += 1;
                let v = self.sum()?;
                (self.peek() == Some(')')).then(|| self.pos += 1)?;
                Some(v)
            }
            c if c.is_ascii_digit() => {
                let start = self.pos;
                while self.peek().is_some_and(|c| c.is_ascii_digit()) {
                    self.pos += 1;
                }
                self.chars[start..self.pos]
                    .iter()
                    .collect::<String>()
                    .parse()
                    .ok()
            }
            c if c.is_ascii_alphabetic() || c == '_' => {
                let start = self.pos;
                while self
                    .peek()
                    .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
                {
                    self.pos += 1;
                }
                let name: String = self.chars[start..self.pos].iter().collect();
                let v = self.shell.vars.get(&name)?;
                self.env.extend(v.env.iter().cloned());
                let text = v.items.first()?.trim().to_string();
                if text.is_empty() {
                    return Some(0);
                }
                text.parse().ok()
            }
            _ => None,
        }
    }
}
