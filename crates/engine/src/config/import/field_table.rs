//! The reader of the field tables the imports keep as data (config/torchtitan/job_fields.txt,
//! config/deepspeed/keys.txt): one row a field, cells separated by ` | `, `#` comments, and
//! `@name = text` lines that a row's last cell refers to as `@name` (the reason a value is
//! refused, written once however many rows share it).

/// A malformed row of a shipped table (a unit test parses each, so none ships).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("config/{file} line {line}: {rule}")]
pub struct TableError {
    pub file: &'static str,
    pub line: usize,
    pub rule: String,
}

/// One row: its cells (the last without its `@name`) and the reason that name stands for.
#[derive(Debug, Clone)]
pub struct Row {
    pub file: &'static str,
    pub line: usize,
    pub cells: Vec<&'static str>,
    pub reason: Option<&'static str>,
}

impl Row {
    /// An error naming this row's line and the rule it breaks.
    pub fn error(&self, rule: impl Into<String>) -> TableError {
        TableError {
            file: self.file,
            line: self.line,
            rule: rule.into(),
        }
    }
}

/// The rows of `text` (the table `file`, named in errors), each of `cells` cells.
pub fn read_rows(
    file: &'static str,
    text: &'static str,
    cells: usize,
) -> Result<Vec<Row>, TableError> {
    let mut reasons: Vec<(&str, &'static str)> = Vec::new();
    let mut rows = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let bad = |rule: String| TableError {
            file,
            line: i + 1,
            rule,
        };
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if let Some(rest) = line.strip_prefix('@') {
            let (name, reason) = rest
                .split_once(" = ")
                .ok_or_else(|| bad("a reason is `@name = text`".into()))?;
            reasons.push((name.trim(), reason.trim()));
            continue;
        }
        let mut row: Vec<&'static str> = line.split(" | ").map(str::trim).collect();
        if row.len() != cells {
            return Err(bad(format!("{} cells, a row has {cells}", row.len())));
        }
        let last = row[cells - 1];
        let reason = match last.split_once('@') {
            Some((head, name)) => {
                row[cells - 1] = head.trim();
                let found = reasons.iter().find(|(n, _)| *n == name.trim());
                Some(
                    found
                        .map(|(_, r)| *r)
                        .ok_or_else(|| bad(format!("no reason '@{name}' above")))?,
                )
            }
            None => None,
        };
        rows.push(Row {
            file,
            line: i + 1,
            cells: row,
            reason,
        });
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reason is resolved by name; a row of the wrong width or an unknown reason is an error
    /// naming its line.
    #[test]
    fn rows_resolve_their_reasons_and_bad_rows_name_their_line() {
        let rows = read_rows("t.txt", "# c\n@why = a reason\na | b @why\nc | d", 2).unwrap();
        assert_eq!(rows.len(), 2);
        assert_eq!(
            (rows[0].cells.clone(), rows[0].reason),
            (vec!["a", "b"], Some("a reason"))
        );
        assert_eq!((rows[1].line, rows[1].reason), (4, None));
        let err = read_rows("t.txt", "\na | b | c", 2).unwrap_err();
        assert_eq!((err.line, err.rule.as_str()), (2, "3 cells, a row has 2"));
        assert!(read_rows("t.txt", "a | b @none", 2)
            .unwrap_err()
            .rule
            .contains("'@none'"));
        assert_eq!(
            read_rows("t.txt", "@why", 2).unwrap_err().to_string(),
            "config/t.txt line 1: a reason is `@name = text`"
        );
    }
}
