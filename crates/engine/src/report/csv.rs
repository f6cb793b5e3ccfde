//! CSV output (RFC 4180): a header and rows of fields, quoted where a field holds a comma, a
//! quote or a line break. Numbers are written in full (seconds, bytes, fractions), not in the
//! rounded units of the human tables, so a spreadsheet can compute with them.

use std::fmt::Write;

/// A CSV document being built.
#[derive(Debug, Clone, Default)]
pub struct Csv {
    text: String,
}

impl Csv {
    /// A document whose first line is `header`.
    pub fn new(header: &[&str]) -> Csv {
        let mut c = Csv::default();
        c.row(header.iter().copied());
        c
    }

    /// Appends one line.
    pub fn row<S: AsRef<str>>(&mut self, fields: impl IntoIterator<Item = S>) {
        for (i, f) in fields.into_iter().enumerate() {
            if i > 0 {
                self.text.push(',');
            }
            let f = f.as_ref();
            if f.contains([',', '"', '\n', '\r']) {
                let _ = write!(self.text, "\"{}\"", f.replace('"', "\"\""));
            } else {
                self.text.push_str(f);
            }
        }
        self.text.push('\n');
    }

    /// The document.
    pub fn finish(self) -> String {
        self.text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_are_quoted_when_needed() {
        let mut c = Csv::new(&["a", "b"]);
        c.row(["1", "x, \"y\""]);
        assert_eq!(c.finish(), "a,b\n1,\"x, \"\"y\"\"\"\n");
    }
}
