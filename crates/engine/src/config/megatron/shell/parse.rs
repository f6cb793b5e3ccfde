//! The script's tokens as a tree of commands: simple commands with their assignments (bash
//! arrays and `+=` appends), `if`/`elif`/`else`, `for`, `while`/`until`, `case`, functions,
//! `{ }` and `( )` groups, `&&`/`||` lists, pipelines and `[[ ... ]]` tests. Parsing never
//! fails: a construct left open at the end of the text ends there.

use super::lex::{Op, Tok, Token, Word};
use std::rc::Rc;

/// A value assigned: one word, or a bash array's words.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum AssignValue {
    Scalar(Word),
    Array(Vec<Word>),
}

/// `NAME=value`, `NAME+=value`, `NAME=(...)`, `NAME+=(...)`, `NAME[i]=value`.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Assign {
    pub name: String,
    pub index: Option<String>,
    pub append: bool,
    pub value: AssignValue,
}

/// One command of the tree, with the line it starts on where that is reported.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Node {
    Simple {
        assigns: Vec<Assign>,
        words: Vec<Word>,
        line: usize,
    },
    /// `[[ ... ]]`: its words, with `&&`, `||`, `(` and `)` kept as words.
    Test {
        words: Vec<Word>,
        line: usize,
    },
    If {
        arms: Vec<(Vec<Node>, Vec<Node>)>,
        otherwise: Option<Vec<Node>>,
        line: usize,
    },
    For {
        var: String,
        /// `None`: `for x; do` (the positional parameters).
        items: Option<Vec<Word>>,
        body: Vec<Node>,
        line: usize,
    },
    Loop {
        until: bool,
        cond: Vec<Node>,
        body: Vec<Node>,
        line: usize,
    },
    Case {
        subject: Word,
        arms: Vec<(Vec<Word>, Vec<Node>)>,
        line: usize,
    },
    Function {
        name: String,
        body: Rc<[Node]>,
    },
    Group {
        body: Vec<Node>,
        subshell: bool,
    },
    /// `a && b || c`: the first command and each (`&&`?, command) after it.
    AndOr {
        first: Box<Node>,
        rest: Vec<(bool, Node)>,
    },
    Pipeline {
        negated: bool,
        cmds: Vec<Node>,
    },
    /// A construct the reader does not run (C-style `for ((...))`, `select`, `(( ... ))`),
    /// named in a note; `body` is what it would run.
    Unsupported {
        what: &'static str,
        body: Vec<Node>,
        line: usize,
    },
}

/// Builtins whose `NAME=value` arguments are assignments.
const DECLARATIONS: [&str; 5] = ["export", "local", "declare", "readonly", "typeset"];

/// True for `export`, `local`, `declare`, `readonly` and `typeset`.
pub(super) fn is_declaration(word: &str) -> bool {
    DECLARATIONS.contains(&word)
}

/// Parses tokens into commands.
pub(super) fn parse(tokens: Vec<Token>) -> Vec<Node> {
    let mut p = Parser { tokens, pos: 0 };
    let mut nodes = Vec::new();
    while p.pos < p.tokens.len() {
        let before = p.pos;
        nodes.extend(p.list(&[]));
        if p.pos == before {
            // A stray closing word or operator at the top: skip it.
            p.pos += 1;
        }
    }
    nodes
}

struct Parser {
    tokens: Vec<Token>,
    pos: usize,
}

impl Parser {
    fn tok(&self) -> Option<&Tok> {
        self.tokens.get(self.pos).map(|t| &t.tok)
    }

    fn line(&self) -> usize {
        self.tokens
            .get(self.pos)
            .or(self.tokens.last())
            .map_or(1, |t| t.line)
    }

    /// The next token's text when it is a plain word (a keyword where a command starts).
    fn keyword(&self) -> Option<&str> {
        match self.tok() {
            Some(Tok::Word(w)) => w.plain(),
            _ => None,
        }
    }

    fn is_op(&self, op: Op) -> bool {
        self.tok() == Some(&Tok::Op(op))
    }

    fn eat_keyword(&mut self, kw: &str) -> bool {
        if self.keyword() == Some(kw) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    fn skip_newlines(&mut self) {
        while self.is_op(Op::Newline) {
            self.pos += 1;
        }
    }

    fn skip_separators(&mut self) {
        while matches!(self.tok(), Some(Tok::Op(Op::Newline | Op::Semi | Op::Amp))) {
            self.pos += 1;
        }
    }

    /// Commands up to one of `stops` (keywords, or `)` and `;;`) where a command starts.
    fn list(&mut self, stops: &[&str]) -> Vec<Node> {
        let mut out = Vec::new();
        loop {
            self.skip_separators();
            let stop = match self.tok() {
                None => true,
                Some(Tok::Op(Op::Close)) => stops.contains(&")"),
                Some(Tok::Op(Op::DoubleSemi)) => stops.contains(&";;"),
                Some(Tok::Word(w)) => w.plain().is_some_and(|k| stops.contains(&k)),
                _ => false,
            };
            if stop {
                return out;
            }
            let before = self.pos;
            if let Some(n) = self.and_or(stops) {
                out.push(n);
            }
            if self.pos == before {
                if !stops.is_empty() {
                    // Not a command and not a stop of this list: skip it.
                    self.pos += 1;
                } else {
                    return out;
                }
            }
        }
    }

    fn and_or(&mut self, stops: &[&str]) -> Option<Node> {
        let first = self.pipeline(stops)?;
        let mut rest = Vec::new();
        while let Some(Tok::Op(op @ (Op::And | Op::Or))) = self.tok() {
            let and = *op == Op::And;
            self.pos += 1;
            self.skip_newlines();
            match self.pipeline(stops) {
                Some(n) => rest.push((and, n)),
                None => break,
            }
        }
        Some(if rest.is_empty() {
            first
        } else {
            Node::AndOr {
                first: Box::new(first),
                rest,
            }
        })
    }

    fn pipeline(&mut self, stops: &[&str]) -> Option<Node> {
        let negated = self.eat_keyword("!");
        let mut cmds = vec![self.command(stops)?];
        while self.is_op(Op::Pipe) {
            self.pos += 1;
            self.skip_newlines();
            match self.command(stops) {
                Some(n) => cmds.push(n),
                None => break,
            }
        }
        Some(if cmds.len() == 1 && !negated {
            cmds.pop().expect("one command")
        } else {
            Node::Pipeline { negated, cmds }
        })
    }

    fn command(&mut self, stops: &[&str]) -> Option<Node> {
        let line = self.line();
        match self.keyword() {
            Some("if") => return Some(self.if_clause(line)),
            Some("for") => return Some(self.for_clause(line)),
            Some("select") => {
                let body = self.for_clause(line);
                return Some(Node::Unsupported {
                    what: "a `select` menu",
                    body: vec![body],
                    line,
                });
            }
            Some(kw @ ("while" | "until")) => {
                let until = kw == "until";
                self.pos += 1;
                let cond = self.list(&["do"]);
                self.eat_keyword("do");
                let body = self.list(&["done"]);
                self.eat_keyword("done");
                return Some(Node::Loop {
                    until,
                    cond,
                    body,
                    line,
                });
            }
            Some("case") => return Some(self.case_clause(line)),
            Some("function") => {
                self.pos += 1;
                let name = self.keyword().unwrap_or("").to_string();
                self.pos += 1;
                if self.is_op(Op::Open) {
                    self.pos += 2;
                }
                return Some(self.function_body(name));
            }
            Some("{") => {
                self.pos += 1;
                let body = self.list(&["}"]);
                self.eat_keyword("}");
                return Some(Node::Group {
                    body,
                    subshell: false,
                });
            }
            Some("[[") => return Some(self.test(line)),
            _ => {}
        }
        if self.is_op(Op::Open) {
            self.pos += 1;
            if self.is_op(Op::Open) {
                // `(( ... ))`: an arithmetic command.
                let mut depth = 2usize;
                while depth > 0 && self.tok().is_some() {
                    match self.tok() {
                        Some(Tok::Op(Op::Open)) => depth += 1,
                        Some(Tok::Op(Op::Close)) => depth -= 1,
                        _ => {}
                    }
                    self.pos += 1;
                }
                return Some(Node::Unsupported {
                    what: "an arithmetic command `(( ... ))`",
                    body: Vec::new(),
                    line,
                });
            }
            let body = self.list(&[")"]);
            if self.is_op(Op::Close) {
                self.pos += 1;
            }
            return Some(Node::Group {
                body,
                subshell: true,
            });
        }
        let simple = self.simple(line)?;
        // `name() { ... }`: a function definition.
        if let Node::Simple { assigns, words, .. } = &simple {
            if assigns.is_empty() && words.len() == 1 && self.is_op(Op::Open) {
                if let Some(name) = words[0].plain() {
                    if self.tokens.get(self.pos + 1).map(|t| &t.tok) == Some(&Tok::Op(Op::Close)) {
                        let name = name.to_string();
                        self.pos += 2;
                        return Some(self.function_body(name));
                    }
                }
            }
        }
        let _ = stops;
        Some(simple)
    }

    fn function_body(&mut self, name: String) -> Node {
        self.skip_newlines();
        let body = match self.command(&[]) {
            Some(Node::Group { body, .. }) => body,
            Some(other) => vec![other],
            None => Vec::new(),
        };
        Node::Function {
            name,
            body: Rc::from(body),
        }
    }

    /// `NAME=...` at the start of a word: the name, an index, whether it appends, and the
    /// value's first pieces.
    fn assignment_start(word: &Word) -> Option<(String, Option<String>, bool, Word)> {
        let super::lex::Piece::Lit(first) = word.pieces.first()? else {
            return None;
        };
        let eq = first.find('=')?;
        let (mut name, value) = (&first[..eq], &first[eq + 1..]);
        let append = name.ends_with('+');
        if append {
            name = &name[..name.len() - 1];
        }
        let (name, index) = match name.split_once('[') {
            Some((n, i)) => (n, Some(i.trim_end_matches(']').to_string())),
            None => (name, None),
        };
        let mut chars = name.chars();
        let head_ok = chars
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
        if !head_ok || !chars.all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return None;
        }
        let mut rest = Word {
            pieces: Vec::new(),
            quoted: word.quoted,
        };
        if !value.is_empty() {
            rest.pieces.push(super::lex::Piece::Lit(value.to_string()));
        }
        rest.pieces.extend(word.pieces[1..].iter().cloned());
        Some((name.to_string(), index, append, rest))
    }

    /// Assignments and words up to a control operator.
    fn simple(&mut self, line: usize) -> Option<Node> {
        let mut assigns = Vec::new();
        let mut words: Vec<Word> = Vec::new();
        while let Some(Tok::Word(w)) = self.tok() {
            let w = w.clone();
            self.pos += 1;
            let declaring = words.len() == 1 && words[0].plain().is_some_and(is_declaration);
            if words.is_empty() || declaring {
                if let Some((name, index, append, rest)) = Self::assignment_start(&w) {
                    let value = if rest.pieces.is_empty() && !rest.quoted && self.is_op(Op::Open) {
                        AssignValue::Array(self.array_items())
                    } else {
                        AssignValue::Scalar(rest)
                    };
                    assigns.push(Assign {
                        name,
                        index,
                        append,
                        value,
                    });
                    continue;
                }
                if declaring && w.plain().is_some_and(|f| f.starts_with('-')) {
                    continue;
                }
            }
            words.push(w);
        }
        if assigns.is_empty() && words.is_empty() {
            return None;
        }
        Some(Node::Simple {
            assigns,
            words,
            line,
        })
    }

    /// The words of `( ... )` after `NAME=`; newlines inside do not end the command.
    fn array_items(&mut self) -> Vec<Word> {
        self.pos += 1;
        let mut items = Vec::new();
        while let Some(t) = self.tok() {
            match t {
                Tok::Word(w) => items.push(w.clone()),
                Tok::Op(Op::Close) => {
                    self.pos += 1;
                    break;
                }
                Tok::Op(_) => {}
            }
            self.pos += 1;
        }
        items
    }

    fn test(&mut self, line: usize) -> Node {
        self.pos += 1;
        let mut words = Vec::new();
        while let Some(t) = self.tok() {
            let text = match t {
                Tok::Word(w) if w.plain() == Some("]]") => {
                    self.pos += 1;
                    break;
                }
                Tok::Word(w) => {
                    words.push(w.clone());
                    self.pos += 1;
                    continue;
                }
                Tok::Op(Op::And) => "&&",
                Tok::Op(Op::Or) => "||",
                Tok::Op(Op::Open) => "(",
                Tok::Op(Op::Close) => ")",
                Tok::Op(Op::Newline) => {
                    self.pos += 1;
                    continue;
                }
                Tok::Op(_) => break,
            };
            words.push(Word {
                pieces: vec![super::lex::Piece::Lit(text.to_string())],
                quoted: false,
            });
            self.pos += 1;
        }
        Node::Test { words, line }
    }

    fn if_clause(&mut self, line: usize) -> Node {
        self.pos += 1;
        let mut arms = Vec::new();
        let mut otherwise = None;
        let cond = self.list(&["then"]);
        self.eat_keyword("then");
        let body = self.list(&["elif", "else", "fi"]);
        arms.push((cond, body));
        loop {
            if self.eat_keyword("elif") {
                let cond = self.list(&["then"]);
                self.eat_keyword("then");
                let body = self.list(&["elif", "else", "fi"]);
                arms.push((cond, body));
            } else if self.eat_keyword("else") {
                otherwise = Some(self.list(&["fi"]));
                self.eat_keyword("fi");
                break;
            } else {
                self.eat_keyword("fi");
                break;
            }
        }
        Node::If {
            arms,
            otherwise,
            line,
        }
    }

    fn for_clause(&mut self, line: usize) -> Node {
        self.pos += 1;
        if self.is_op(Op::Open) {
            // `for ((i = 0; i < n; i++))`: skip the header, keep the body for the note.
            while self.tok().is_some() && self.keyword() != Some("do") {
                self.pos += 1;
            }
            self.eat_keyword("do");
            let body = self.list(&["done"]);
            self.eat_keyword("done");
            return Node::Unsupported {
                what: "a C-style `for ((...))` loop",
                body,
                line,
            };
        }
        let var = self.keyword().unwrap_or("").to_string();
        self.pos += 1;
        self.skip_newlines();
        let items = if self.eat_keyword("in") {
            let mut items = Vec::new();
            while let Some(Tok::Word(w)) = self.tok() {
                items.push(w.clone());
                self.pos += 1;
            }
            Some(items)
        } else {
            None
        };
        self.skip_separators();
        self.eat_keyword("do");
        let body = self.list(&["done"]);
        self.eat_keyword("done");
        Node::For {
            var,
            items,
            body,
            line,
        }
    }

    fn case_clause(&mut self, line: usize) -> Node {
        self.pos += 1;
        let subject = match self.tok() {
            Some(Tok::Word(w)) => w.clone(),
            _ => Word::default(),
        };
        self.pos += 1;
        self.skip_newlines();
        self.eat_keyword("in");
        let mut arms = Vec::new();
        loop {
            self.skip_newlines();
            if self.tok().is_none() || self.eat_keyword("esac") {
                break;
            }
            if self.is_op(Op::Open) {
                self.pos += 1;
            }
            let mut patterns = Vec::new();
            while let Some(t) = self.tok() {
                match t {
                    Tok::Word(w) => patterns.push(w.clone()),
                    Tok::Op(Op::Pipe) => {}
                    Tok::Op(Op::Close) => {
                        self.pos += 1;
                        break;
                    }
                    Tok::Op(_) => break,
                }
                self.pos += 1;
            }
            let body = self.list(&["esac", ";;"]);
            if self.is_op(Op::DoubleSemi) {
                self.pos += 1;
            }
            arms.push((patterns, body));
        }
        Node::Case {
            subject,
            arms,
            line,
        }
    }
}
