//! Conditions of `[[ ... ]]`, `[ ... ]` and `test`: string and integer comparisons, `-z`,
//! `-n`, `-v`, `!`, `&&`/`||` (`-a`/`-o`) and parentheses, as bash evaluates them. A file
//! test, a regular-expression match or a comparison of what is not a number cannot be decided
//! from the script alone: the outcome is unknown, with the reason.

use super::expand::Expanded;
use std::collections::BTreeSet;

/// True, false, or not decidable here.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(super) enum Tri {
    True,
    False,
    #[default]
    Unknown,
}

impl Tri {
    pub fn of(b: bool) -> Tri {
        if b {
            Tri::True
        } else {
            Tri::False
        }
    }

    pub fn not(self) -> Tri {
        match self {
            Tri::True => Tri::False,
            Tri::False => Tri::True,
            Tri::Unknown => Tri::Unknown,
        }
    }
}

/// A command's or condition's outcome: its status, the unset variables it read, and why it
/// is unknown when it is.
#[derive(Debug, Clone, Default, PartialEq)]
pub(super) struct Outcome {
    pub status: Tri,
    pub env: BTreeSet<String>,
    pub why: Option<String>,
}

impl Outcome {
    pub fn known(b: bool) -> Outcome {
        Outcome {
            status: Tri::of(b),
            ..Outcome::default()
        }
    }

    pub fn unknown(why: String) -> Outcome {
        Outcome {
            status: Tri::Unknown,
            env: BTreeSet::new(),
            why: Some(why),
        }
    }
}

/// Evaluates the operands of a test; `double` for `[[ ]]` (`&&`, `||`, patterns), else `[ ]`
/// (`-a`, `-o`). `is_set` answers `-v NAME`.
pub(super) fn evaluate(words: &[Expanded], double: bool, is_set: &dyn Fn(&str) -> bool) -> Outcome {
    let mut t = Test {
        words,
        pos: 0,
        double,
        is_set,
        env: BTreeSet::new(),
        why: None,
    };
    let status = if words.is_empty() {
        Tri::False
    } else {
        let s = t.or();
        if t.pos < words.len() {
            t.unknown("an expression parsim does not read".into())
        } else {
            s
        }
    };
    Outcome {
        status,
        env: t.env,
        why: t.why,
    }
}

struct Test<'a> {
    words: &'a [Expanded],
    pos: usize,
    double: bool,
    is_set: &'a dyn Fn(&str) -> bool,
    env: BTreeSet<String>,
    why: Option<String>,
}

impl Test<'_> {
    fn peek(&self) -> Option<&str> {
        self.words.get(self.pos).map(|w| w.text.as_str())
    }

    /// The next operand, its unset variables recorded.
    fn take(&mut self) -> Option<String> {
        let w = self.words.get(self.pos)?;
        self.pos += 1;
        self.env.extend(w.env.iter().cloned());
        Some(w.text.clone())
    }

    fn unknown(&mut self, why: String) -> Tri {
        self.why.get_or_insert(why);
        Tri::Unknown
    }

    fn or(&mut self) -> Tri {
        let mut v = self.and();
        while matches!(
            (self.peek(), self.double),
            (Some("||"), true) | (Some("-o"), false)
        ) {
            self.pos += 1;
            let r = self.and();
            v = match (v, r) {
                (Tri::True, _) | (_, Tri::True) => Tri::True,
                (Tri::False, Tri::False) => Tri::False,
                _ => Tri::Unknown,
            };
        }
        v
    }

    fn and(&mut self) -> Tri {
        let mut v = self.not();
        while matches!(
            (self.peek(), self.double),
            (Some("&&"), true) | (Some("-a"), false)
        ) {
            self.pos += 1;
            let r = self.not();
            v = match (v, r) {
                (Tri::False, _) | (_, Tri::False) => Tri::False,
                (Tri::True, Tri::True) => Tri::True,
                _ => Tri::Unknown,
            };
        }
        v
    }

    fn not(&mut self) -> Tri {
        if self.peek() == Some("!") && self.words.len() > self.pos + 1 {
            self.pos += 1;
            return self.not().not();
        }
        self.primary()
    }

    fn primary(&mut self) -> Tri {
        if self.peek() == Some("(") {
            self.pos += 1;
            let v = self.or();
            if self.peek() == Some(")") {
                self.pos += 1;
            }
            return v;
        }
        let has_next = self.words.len() > self.pos + 1;
        let op = self.peek().unwrap_or("").to_string();
        if has_next && is_unary(&op) && !self.next_is_binary() {
            self.pos += 1;
            let operand = self.take().unwrap_or_default();
            return match op.as_str() {
                "-z" => Tri::of(operand.is_empty()),
                "-n" => Tri::of(!operand.is_empty()),
                "-v" => {
                    let set = (self.is_set)(&operand);
                    if !set {
                        self.env.insert(operand.clone());
                    }
                    Tri::of(set)
                }
                _ => self.unknown(format!("a file test, `{op} {operand}`")),
            };
        }
        let Some(left) = self.take() else {
            return Tri::False;
        };
        let Some(op) = self.peek().map(str::to_string).filter(|o| is_binary(o)) else {
            return Tri::of(!left.is_empty());
        };
        self.pos += 1;
        let right = self.take().unwrap_or_default();
        match op.as_str() {
            "=" | "==" => Tri::of(self.matches(&right, &left)),
            "!=" => Tri::of(!self.matches(&right, &left)),
            "<" => Tri::of(left < right),
            ">" => Tri::of(left > right),
            "=~" => self.unknown(format!("a regular-expression match, `{left} =~ {right}`")),
            "-nt" | "-ot" | "-ef" => {
                self.unknown(format!("a file comparison, `{left} {op} {right}`"))
            }
            _ => match (left.trim().parse::<i64>(), right.trim().parse::<i64>()) {
                (Ok(a), Ok(b)) => Tri::of(match op.as_str() {
                    "-eq" => a == b,
                    "-ne" => a != b,
                    "-lt" => a < b,
                    "-le" => a <= b,
                    "-gt" => a > b,
                    _ => a >= b,
                }),
                _ => self.unknown(format!(
                    "a number comparison of '{left}' and '{right}', not both numbers"
                )),
            },
        }
    }

    fn next_is_binary(&self) -> bool {
        self.words
            .get(self.pos + 1)
            .is_some_and(|w| is_binary(&w.text))
            && self.words.len() > self.pos + 2
    }

    /// `[[ a == pattern ]]` matches a glob pattern; `[ a = b ]` compares strings.
    fn matches(&self, pattern: &str, text: &str) -> bool {
        if self.double {
            glob_match(pattern, text)
        } else {
            pattern == text
        }
    }
}

fn is_unary(op: &str) -> bool {
    matches!(
        op,
        "-z" | "-n"
            | "-v"
            | "-a"
            | "-b"
            | "-c"
            | "-d"
            | "-e"
            | "-f"
            | "-g"
            | "-h"
            | "-k"
            | "-p"
            | "-r"
            | "-s"
            | "-t"
            | "-u"
            | "-w"
            | "-x"
            | "-G"
            | "-L"
            | "-N"
            | "-O"
            | "-S"
    )
}

fn is_binary(op: &str) -> bool {
    matches!(
        op,
        "=" | "=="
            | "!="
            | "<"
            | ">"
            | "=~"
            | "-eq"
            | "-ne"
            | "-lt"
            | "-le"
            | "-gt"
            | "-ge"
            | "-nt"
            | "-ot"
            | "-ef"
    )
}

/// Glob matching with `*`, `?` and `|`-free literal text (`[[ ]]` and `case` patterns).
pub(super) fn glob_match(pattern: &str, text: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let t: Vec<char> = text.chars().collect();
    // Iterative matching with backtracking to the last `*`.
    let (mut i, mut j) = (0usize, 0usize);
    let mut star: Option<(usize, usize)> = None;
    while j < t.len() {
        if i < p.len() && (p[i] == '?' || p[i] == t[j]) {
            i += 1;
            j += 1;
        } else if i < p.len() && p[i] == '*' {
            star = Some((i, j));
            i += 1;
        } else if let Some((si, sj)) = star {
            i = si + 1;
            j = sj + 1;
            star = Some((si, sj + 1));
        } else {
            return false;
        }
    }
    while i < p.len() && p[i] == '*' {
        i += 1;
    }
    i == p.len()
}
