//! Just enough of POSIX shell to read a Megatron-LM launch script: line continuations, quotes,
//! comments, statements, variable assignments (scalars and bash arrays) and `$VAR`, `${VAR}`,
//! `${VAR[@]}`, `${VAR:-default}` expansion. Anything it cannot resolve (a variable the script
//! does not set, `$(...)` command substitution) is kept as literal text and reported.

use std::collections::BTreeMap;

/// One part of a word: literal text, or an expansion still to be looked up.
#[derive(Debug, Clone, PartialEq)]
enum Piece {
    Lit(String),
    /// `$NAME` and friends; `quoted` when inside double quotes (no word splitting).
    Var {
        name: String,
        default: Option<String>,
        quoted: bool,
        raw: String,
    },
    /// `$(...)` or backticks: never run, always unresolved.
    Command(String),
}

/// A lexed token: a word made of pieces, or a bare `(` / `)` (bash array brackets).
#[derive(Debug, Clone, PartialEq)]
enum Token {
    Word(Vec<Piece>),
    Open,
    Close,
}

/// The commands of a script after expansion, and what could not be resolved.
#[derive(Debug, Default)]
pub(super) struct Script {
    /// Each command's words (assignments taken out).
    pub commands: Vec<Vec<String>>,
    /// Variables and substitutions that could not be resolved, as written (`$TP`, `$(nproc)`).
    pub unresolved: Vec<String>,
    /// Every assignment in script order, with its value split into words as an unquoted
    /// `$NAME` would be (Megatron-LM's modelopt conf files only set `MODEL_ARGS="..."`).
    pub assignments: Vec<(String, Vec<String>)>,
}

/// Reads a script: statements are split, assignments recorded, and commands expanded.
pub(super) fn parse(text: &str) -> Script {
    let mut vars: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut script = Script::default();
    for statement in lex(text) {
        let mut tokens = statement.into_iter().peekable();
        let mut words = Vec::new();
        while let Some(tok) = tokens.next() {
            let Token::Word(pieces) = tok else {
                continue;
            };
            if words.is_empty() {
                if let Some((name, rest)) = assignment(&pieces) {
                    let value = if rest.is_empty() && tokens.peek() == Some(&Token::Open) {
                        tokens.next();
                        let mut items = Vec::new();
                        for t in tokens.by_ref() {
                            match t {
                                Token::Word(p) => items.extend(expand(&p, &vars, &mut script)),
                                Token::Close => break,
                                Token::Open => {}
                            }
                        }
                        items
                    } else {
                        vec![expand(&rest, &vars, &mut script).join(" ")]
                    };
                    let words: Vec<String> = value
                        .iter()
                        .flat_map(|v| v.split_whitespace().map(str::to_string))
                        .collect();
                    script.assignments.push((name.clone(), words));
                    vars.insert(name, value);
                    continue;
                }
                if matches!(pieces.as_slice(), [Piece::Lit(w)] if is_builtin_prefix(w)) {
                    continue;
                }
            }
            words.extend(expand(&pieces, &vars, &mut script));
        }
        if !words.is_empty() {
            script.commands.push(words);
        }
    }
    script.unresolved.dedup();
    script
}

/// `export`, `local` and the like before an assignment.
fn is_builtin_prefix(w: &str) -> bool {
    matches!(w, "export" | "local" | "declare" | "readonly")
}

/// `NAME=rest` when the word starts with a literal assignment.
fn assignment(pieces: &[Piece]) -> Option<(String, Vec<Piece>)> {
    let Some(Piece::Lit(first)) = pieces.first() else {
        return None;
    };
    let (name, value) = first.split_once('=')?;
    let valid = name.chars().next()?.is_ascii_alphabetic() || name.starts_with('_');
    if !valid || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return None;
    }
    let mut rest = Vec::new();
    if !value.is_empty() {
        rest.push(Piece::Lit(value.to_string()));
    }
    rest.extend(pieces[1..].iter().cloned());
    Some((name.to_string(), rest))
}

/// Expands a word into zero or more words (unquoted expansions split on whitespace).
fn expand(
    pieces: &[Piece],
    vars: &BTreeMap<String, Vec<String>>,
    script: &mut Script,
) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut open = false;
    let push = |text: &str, split: bool, out: &mut Vec<String>, open: &mut bool| {
        let parts: Vec<&str> = if split {
            text.split_whitespace().collect()
        } else {
            vec![text]
        };
        for (i, part) in parts.iter().enumerate() {
            if i == 0 && *open {
                out.last_mut().expect("open word").push_str(part);
            } else {
                out.push((*part).to_string());
            }
            *open = true;
        }
        if split && text.ends_with(char::is_whitespace) {
            *open = false;
        }
    };
    for piece in pieces {
        match piece {
            Piece::Lit(s) => push(s, false, &mut out, &mut open),
            Piece::Command(raw) => {
                script.unresolved.push(raw.clone());
                push(raw, false, &mut out, &mut open);
            }
            Piece::Var {
                name,
                default,
                quoted,
                raw,
            } => match (vars.get(name), default) {
                (Some(values), _) => {
                    for (i, v) in values.iter().enumerate() {
                        if i > 0 {
                            open = false;
                        }
                        push(v, !quoted, &mut out, &mut open);
                    }
                }
                (None, Some(d)) => push(d, !quoted, &mut out, &mut open),
                (None, None) => {
                    script.unresolved.push(raw.clone());
                    push(raw, false, &mut out, &mut open);
                }
            },
        }
    }
    out
}

/// Splits text into statements of tokens. Newlines inside `( ... )` do not end a statement.
fn lex(text: &str) -> Vec<Vec<Token>> {
    let mut lx = Lexer {
        chars: text.chars().collect(),
        pos: 0,
        statements: Vec::new(),
        current: Vec::new(),
        word: Vec::new(),
        in_word: false,
        depth: 0,
    };
    lx.run();
    lx.statements
}

struct Lexer {
    chars: Vec<char>,
    pos: usize,
    statements: Vec<Vec<Token>>,
    current: Vec<Token>,
    word: Vec<Piece>,
    in_word: bool,
    depth: usize,
}

impl Lexer {
    fn peek(&self) -> Option<char> {
        self.chars.get(self.pos).copied()
    }

    fn lit(&mut self, c: char) {
        self.in_word = true;
        if let Some(Piece::Lit(s)) = self.word.last_mut() {
            s.push(c);
        } else {
            self.word.push(Piece::Lit(c.to_string()));
        }
    }

    fn end_word(&mut self) {
        if self.in_word {
            self.current
                .push(Token::Word(std::mem::take(&mut self.word)));
            self.in_word = false;
        }
    }

    fn end_statement(&mut self) {
        self.end_word();
        if !self.current.is_empty() {
            self.statements.push(std::mem::take(&mut self.current));
        }
    }

    fn run(&mut self) {
        while let Some(c) = self.peek() {
            self.pos += 1;
            match c {
                '\\' => match self.peek() {
                    Some('\n') => self.pos += 1,
                    Some(next) => {
                        self.pos += 1;
                        self.lit(next);
                    }
                    None => {}
                },
                '\'' => {
                    self.in_word = true;
                    while let Some(q) = self.peek() {
                        self.pos += 1;
                        if q == '\'' {
                            break;
                        }
                        self.lit(q);
                    }
                }
                '"' => self.double_quoted(),
                '$' => self.dollar(false),
                '`' => {
                    let start = self.pos - 1;
                    while let Some(q) = self.peek() {
                        self.pos += 1;
                        if q == '`' {
                            break;
                        }
                    }
                    self.in_word = true;
                    let raw: String = self.chars[start..self.pos].iter().collect();
                    self.word.push(Piece::Command(raw));
                }
                '#' if !self.in_word => {
                    while self.peek().is_some_and(|q| q != '\n') {
                        self.pos += 1;
                    }
                }
                '(' => {
                    self.end_word();
                    self.depth += 1;
                    self.current.push(Token::Open);
                }
                ')' => {
                    self.end_word();
                    self.depth = self.depth.saturating_sub(1);
                    self.current.push(Token::Close);
                }
                '\n' if self.depth > 0 => self.end_word(),
                '\n' | ';' | '&' | '|' => self.end_statement(),
                c if c.is_whitespace() => self.end_word(),
                c => self.lit(c),
            }
        }
        self.end_statement();
    }

    fn double_quoted(&mut self) {
        self.in_word = true;
        while let Some(q) = self.peek() {
            self.pos += 1;
            match q {
                '"' => break,
                '\\' => {
                    if let Some(next) = self.peek() {
                        self.pos += 1;
                        if next != '\n' {
                            self.lit(next);
                        }
                    }
                }
                '$' => self.dollar(true),
                q => self.lit(q),
            }
        }
    }

    /// After a `$`: a variable, `${...}`, or `$(...)`.
    fn dollar(&mut self, quoted: bool) {
        let start = self.pos - 1;
        match self.peek() {
            Some('(') => {
                let mut depth = 0;
                while let Some(q) = self.peek() {
                    self.pos += 1;
                    match q {
                        '(' => depth += 1,
                        ')' => {
                            depth -= 1;
                            if depth == 0 {
                                break;
                            }
                        }
                        _ => {}
                    }
                }
                self.in_word = true;
                let raw: String = self.chars[start..self.pos].iter().collect();
                self.word.push(Piece::Command(raw));
            }
            Some('{') => {
                self.pos += 1;
                let body_start = self.pos;
                while self.peek().is_some_and(|q| q != '}') {
                    self.pos += 1;
                }
                let body: String = self.chars[body_start..self.pos].iter().collect();
                self.pos = (self.pos + 1).min(self.chars.len());
                let raw: String = self.chars[start..self.pos].iter().collect();
                let (name, default) = match body.split_once(":-") {
                    Some((n, d)) => (n.to_string(), Some(d.trim_matches(['"', '\'']).to_string())),
                    None => (body.clone(), None),
                };
                let name = name
                    .trim_end_matches("[@]")
                    .trim_end_matches("[*]")
                    .to_string();
                self.in_word = true;
                self.word.push(Piece::Var {
                    name,
                    default,
                    quoted,
                    raw,
                });
            }
            Some(c) if c.is_ascii_alphanumeric() || c == '_' || c == '@' || c == '*' => {
                while self
                    .peek()
                    .is_some_and(|q| q.is_ascii_alphanumeric() || q == '_' || q == '@' || q == '*')
                {
                    self.pos += 1;
                }
                let raw: String = self.chars[start..self.pos].iter().collect();
                self.in_word = true;
                self.word.push(Piece::Var {
                    name: raw[1..].to_string(),
                    default: None,
                    quoted,
                    raw,
                });
            }
            _ => self.lit('$'),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn continuations_arrays_and_variables_expand() {
        let s = parse(
            "TP=2\nARGS=(\n  --a 1 # comment\n  --b \"x y\"\n)\n\
             torchrun --nproc_per_node $GPUS pretrain_gpt.py \\\n  ${ARGS[@]} --tp ${TP} --pp ${PP:-4}\n",
        );
        assert_eq!(s.commands.len(), 1);
        assert_eq!(
            s.commands[0],
            [
                "torchrun",
                "--nproc_per_node",
                "$GPUS",
                "pretrain_gpt.py",
                "--a",
                "1",
                "--b",
                "x",
                "y",
                "--tp",
                "2",
                "--pp",
                "4"
            ]
        );
        assert_eq!(s.unresolved, ["$GPUS"]);
    }

    #[test]
    fn quoted_variables_do_not_split_and_commands_are_unresolved() {
        let s = parse("X=\"a b\"\necho \"$X\" $(nproc)\n");
        assert_eq!(s.commands[0], ["echo", "a b", "$(nproc)"]);
        assert_eq!(s.unresolved, ["$(nproc)"]);
    }
}
