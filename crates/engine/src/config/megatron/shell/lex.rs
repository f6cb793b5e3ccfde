//! The script's tokens: words (literal text and expansions still to be made) and the control
//! operators between them, each with the line it starts on. Comments, line continuations,
//! redirections and here-documents are consumed here: they change no word of a command.

/// One part of a word.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Piece {
    Lit(String),
    /// `$NAME` or `${BODY}`: `body` is the name or what the braces hold; `quoted` inside
    /// double quotes (no word splitting).
    Param {
        body: String,
        quoted: bool,
        raw: String,
    },
    /// `$(...)` or backticks: never run, always unresolved.
    Command(String),
    /// `$((EXPR))`.
    Arith {
        expr: String,
        quoted: bool,
        raw: String,
    },
}

/// A word made of pieces.
#[derive(Debug, Clone, PartialEq, Default)]
pub(super) struct Word {
    pub pieces: Vec<Piece>,
    /// Quotes appeared in it, so it stays a word even when it expands to nothing.
    pub quoted: bool,
}

impl Word {
    /// The text of a word that is one unquoted literal (keywords, names, `[[`).
    pub fn plain(&self) -> Option<&str> {
        match self.pieces.as_slice() {
            [Piece::Lit(s)] if !self.quoted => Some(s),
            _ => None,
        }
    }
}

/// Control operators.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Op {
    Newline,
    Semi,
    /// `;;` ending a `case` arm.
    DoubleSemi,
    And,
    Or,
    Pipe,
    Amp,
    Open,
    Close,
}

#[derive(Debug, Clone, PartialEq)]
pub(super) enum Tok {
    Word(Word),
    Op(Op),
}

/// A token and the (1-based) line it starts on.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Token {
    pub tok: Tok,
    pub line: usize,
}

/// Splits a script into tokens.
pub(super) fn lex(text: &str) -> Vec<Token> {
    let mut lx = Lexer::new(text, false);
    lx.run();
    lx.tokens
}

/// The text of a `${NAME:-WORD}` operand (or of `$((...))`) as one word: quotes and
/// expansions read as in a script, blanks kept as literal text.
pub(super) fn word_of(text: &str) -> Word {
    let mut lx = Lexer::new(text, true);
    lx.run();
    lx.end_word();
    lx.tokens
        .into_iter()
        .find_map(|t| match t.tok {
            Tok::Word(w) => Some(w),
            Tok::Op(_) => None,
        })
        .unwrap_or_default()
}

struct Lexer {
    chars: Vec<char>,
    pos: usize,
    line: usize,
    tokens: Vec<Token>,
    word: Word,
    in_word: bool,
    word_line: usize,
    /// Blanks and operators are literal text (an operand of `${...}`).
    literal_blanks: bool,
    /// The next word is a redirection's target and is dropped.
    drop_next_word: bool,
    /// Here-document delimiters (and whether leading tabs are stripped) whose bodies start at
    /// the next newline.
    heredocs: Vec<(String, bool)>,
}

impl Lexer {
    fn new(text: &str, literal_blanks: bool) -> Lexer {
        Lexer {
            chars: text.chars().collect(),
            pos: 0,
            line: 1,
            tokens: Vec::new(),
            word: Word::default(),
            in_word: false,
            word_line: 1,
            literal_blanks,
            drop_next_word: false,
            heredocs: Vec::new(),
        }
    }

    fn peek(&self) -> Option<char> {
        self.chars.get(self.pos).copied()
    }

    fn peek_at(&self, k: usize) -> Option<char> {
        self.chars.get(self.pos + k).copied()
    }

    /// Consumes one character, counting lines.
    fn bump(&mut self) -> Option<char> {
        let c = self.peek()?;
        self.pos += 1;
        if c == '\n' {
            self.line += 1;
        }
        Some(c)
    }

    fn start_word(&mut self) {
        if !self.in_word {
            self.in_word = true;
            self.word_line = self.line;
        }
    }

    fn lit(&mut self, c: char) {
        self.start_word();
        if let Some(Piece::Lit(s)) = self.word.pieces.last_mut() {
            s.push(c);
        } else {
            self.word.pieces.push(Piece::Lit(c.to_string()));
        }
    }

    fn piece(&mut self, p: Piece) {
        self.start_word();
        self.word.pieces.push(p);
    }

    fn end_word(&mut self) {
        if self.in_word {
            let word = std::mem::take(&mut self.word);
            if self.drop_next_word {
                self.drop_next_word = false;
            } else {
                self.tokens.push(Token {
                    tok: Tok::Word(word),
                    line: self.word_line,
                });
            }
            self.in_word = false;
        }
    }

    fn op(&mut self, op: Op) {
        self.end_word();
        self.tokens.push(Token {
            tok: Tok::Op(op),
            line: self.line,
        });
    }

    fn run(&mut self) {
        while let Some(c) = self.bump() {
            if self.literal_blanks {
                match c {
                    '\\' => {
                        if let Some(n) = self.bump() {
                            self.lit(n);
                        }
                    }
                    '\'' => self.single_quoted(),
                    '"' => self.double_quoted(),
                    '$' => self.dollar(false),
                    '`' => self.backtick(),
                    c => self.lit(c),
                }
                continue;
            }
            match c {
                '\\' => match self.peek() {
                    Some('\n') => {
                        self.bump();
                    }
                    Some(_) => {
                        let n = self.bump().unwrap_or('\\');
                        self.word.quoted = true;
                        self.lit(n);
                    }
                    None => {}
                },
                '\'' => self.single_quoted(),
                '"' => self.double_quoted(),
                '$' => self.dollar(false),
                '`' => self.backtick(),
                '#' if !self.in_word => {
                    while self.peek().is_some_and(|q| q != '\n') {
                        self.bump();
                    }
                }
                '(' => self.op(Op::Open),
                ')' => self.op(Op::Close),
                '\n' => {
                    // `bump` counted the newline; the operator belongs to the line it ends.
                    self.end_word();
                    self.tokens.push(Token {
                        tok: Tok::Op(Op::Newline),
                        line: self.line - 1,
                    });
                    self.heredoc_bodies();
                }
                ';' => {
                    if self.peek() == Some(';') {
                        self.bump();
                        self.op(Op::DoubleSemi);
                    } else {
                        self.op(Op::Semi);
                    }
                }
                '&' => match self.peek() {
                    Some('&') => {
                        self.bump();
                        self.op(Op::And);
                    }
                    Some('>') => {
                        self.bump();
                        self.redirection('>');
                    }
                    _ => self.op(Op::Amp),
                },
                '|' => match self.peek() {
                    Some('|') => {
                        self.bump();
                        self.op(Op::Or);
                    }
                    Some('&') => {
                        self.bump();
                        self.op(Op::Pipe);
                    }
                    _ => self.op(Op::Pipe),
                },
                '>' | '<' => self.redirection(c),
                c if c.is_whitespace() => self.end_word(),
                c => self.lit(c),
            }
        }
        self.end_word();
    }

    /// A redirection (`>`, `>>`, `2>&1`, `<`, `<<EOF`, `<<<`): its target word is dropped and
    /// a here-document's body skipped. A file-descriptor number right before it goes too.
    fn redirection(&mut self, first: char) {
        let fd = matches!(self.word.pieces.as_slice(), [Piece::Lit(s)] if s.chars().all(|c| c.is_ascii_digit()))
            && !self.word.quoted;
        if fd {
            self.word = Word::default();
            self.in_word = false;
        } else {
            self.end_word();
        }
        if first == '<' && self.peek() == Some('<') && self.peek_at(1) != Some('<') {
            self.bump();
            let strip_tabs = self.peek() == Some('-');
            if strip_tabs {
                self.bump();
            }
            while self.peek().is_some_and(|c| c == ' ' || c == '\t') {
                self.bump();
            }
            let mut delim = String::new();
            while let Some(c) = self.peek() {
                if c.is_whitespace() || matches!(c, ';' | '&' | '|' | '(' | ')' | '<' | '>') {
                    break;
                }
                self.bump();
                if c != '\'' && c != '"' && c != '\\' {
                    delim.push(c);
                }
            }
            self.heredocs.push((delim, strip_tabs));
            return;
        }
        while self
            .peek()
            .is_some_and(|c| matches!(c, '>' | '<' | '&' | '|'))
        {
            self.bump();
        }
        self.drop_next_word = true;
    }

    /// Skips the bodies of the here-documents opened on the line just ended.
    fn heredoc_bodies(&mut self) {
        for (delim, strip_tabs) in std::mem::take(&mut self.heredocs) {
            loop {
                let start = self.pos;
                while self.peek().is_some_and(|c| c != '\n') {
                    self.bump();
                }
                let line: String = self.chars[start..self.pos].iter().collect();
                let at_end = self.bump().is_none();
                let line = if strip_tabs {
                    line.trim_start_matches('\t')
                } else {
                    line.as_str()
                };
                if line == delim || at_end {
                    break;
                }
            }
        }
    }

    fn single_quoted(&mut self) {
        self.start_word();
        self.word.quoted = true;
        while let Some(q) = self.bump() {
            if q == '\'' {
                return;
            }
            self.lit(q);
        }
    }

    fn double_quoted(&mut self) {
        self.start_word();
        self.word.quoted = true;
        while let Some(q) = self.bump() {
            match q {
                '"' => return,
                '\\' => match self.bump() {
                    Some('\n') | None => {}
                    Some(n) if matches!(n, '$' | '`' | '"' | '\\') => self.lit(n),
                    Some(n) => {
                        self.lit('\\');
                        self.lit(n);
                    }
                },
                '$' => self.dollar(true),
                '`' => self.backtick(),
                q => self.lit(q),
            }
        }
    }

    fn backtick(&mut self) {
        let start = self.pos - 1;
        while let Some(q) = self.bump() {
            if q == '`' {
                break;
            }
        }
        let raw: String = self.chars[start..self.pos].iter().collect();
        self.piece(Piece::Command(raw));
    }

    /// Text up to the `)` closing an already opened `(`, nesting counted; the position ends
    /// after it.
    fn balanced(&mut self, open: char, close: char) {
        let mut depth = 1usize;
        while let Some(q) = self.bump() {
            if q == open {
                depth += 1;
            } else if q == close {
                depth -= 1;
                if depth == 0 {
                    return;
                }
            }
        }
    }

    /// After a `$`: `$((...))`, `$(...)`, `${...}`, `$NAME` or a special parameter.
    fn dollar(&mut self, quoted: bool) {
        let start = self.pos - 1;
        match self.peek() {
            Some('(') if self.peek_at(1) == Some('(') => {
                self.bump();
                self.bump();
                let body_start = self.pos;
                self.balanced('(', ')');
                let body_end = self.pos.saturating_sub(1).max(body_start);
                // The arithmetic closes with `))`: the second `)` follows.
                if self.peek() == Some(')') {
                    self.bump();
                }
                let expr: String = self.chars[body_start..body_end].iter().collect();
                let raw: String = self.chars[start..self.pos].iter().collect();
                self.piece(Piece::Arith { expr, quoted, raw });
            }
            Some('(') => {
                self.bump();
                self.balanced('(', ')');
                let raw: String = self.chars[start..self.pos].iter().collect();
                self.piece(Piece::Command(raw));
            }
            Some('{') => {
                self.bump();
                let body_start = self.pos;
                self.balanced('{', '}');
                let body_end = self.pos.saturating_sub(1).max(body_start);
                let body: String = self.chars[body_start..body_end].iter().collect();
                let raw: String = self.chars[start..self.pos].iter().collect();
                self.piece(Piece::Param { body, quoted, raw });
            }
            Some(c) if c.is_ascii_alphabetic() || c == '_' => {
                while self
                    .peek()
                    .is_some_and(|q| q.is_ascii_alphanumeric() || q == '_')
                {
                    self.bump();
                }
                let raw: String = self.chars[start..self.pos].iter().collect();
                let body = raw[1..].to_string();
                self.piece(Piece::Param { body, quoted, raw });
            }
            Some(c) if c.is_ascii_digit() || matches!(c, '@' | '*' | '#' | '?' | '$' | '!') => {
                self.bump();
                let raw: String = self.chars[start..self.pos].iter().collect();
                self.piece(Piece::Param {
                    body: c.to_string(),
                    quoted,
                    raw,
                });
            }
            _ => self.lit('$'),
        }
    }
}
