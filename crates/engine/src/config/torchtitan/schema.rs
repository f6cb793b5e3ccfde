//! The fields of torchtitan's `JobConfig` (torchtitan/config/job_config.py at commit 238fa99,
//! the last before its February 2026 move to a Python config registry, plus the `[float8]`
//! and `[mx]` sections of releases before its October 2025 `[quantize]` refactor, commit
//! 24e9105): each field's type, torchtitan's default, and what parsim does with it. One row a
//! field, in the data file job_fields.txt beside this one; the reader refuses every section
//! and key not listed.

/// What a field's value may be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ty {
    Bool,
    Int,
    /// A float (an integer is accepted).
    Float,
    Str,
    /// A list of strings (on an override: comma-separated).
    List,
    /// A list of lists of strings (on an override: JSON).
    Lists,
}

impl Ty {
    /// The type in words, for errors.
    pub fn name(self) -> &'static str {
        match self {
            Ty::Bool => "a boolean",
            Ty::Int => "an integer",
            Ty::Float => "a number",
            Ty::Str => "a string",
            Ty::List => "a list of strings",
            Ty::Lists => "a list of lists of strings",
        }
    }
}

/// What parsim does with a field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Effect {
    /// Read into the configuration (src/config/torchtitan/{parallelism,training}.rs).
    Mapped,
    /// Changes neither memory nor step time: accepted and listed in one note.
    NoEffect,
    /// Changes memory or time in a way parsim does not model: accepted only at torchtitan's
    /// default (which parsim's model matches), refused by name otherwise, with the reason.
    Unmodelled(&'static str),
    /// Read as a note only (torch.compile): the estimate uses parsim's kernel model.
    Noted,
}

/// One field: its dotted path, type, torchtitan's default (JSON text; `null` for `None`) and
/// effect.
#[derive(Debug, Clone, Copy)]
pub struct Field {
    pub path: &'static str,
    pub ty: Ty,
    pub default: &'static str,
    pub effect: Effect,
}

/// The field table: one row a field, `path | type | default | effect`, with the reasons of
/// the unmodelled fields as `@name = text` lines (the file's header says more).
const TABLE: &str = include_str!("job_fields.txt");

use super::super::import::{read_rows, TableError};

/// Parses a field table in [`TABLE`]'s format (the shared reader, `super::super::import`).
pub fn parse_table(text: &'static str) -> Result<Vec<Field>, TableError> {
    read_rows("torchtitan/job_fields.txt", text, 4)?
        .into_iter()
        .map(|row| {
            let [path, ty, default, effect] = [0, 1, 2, 3].map(|i| row.cells[i]);
            let ty = match ty {
                "bool" => Ty::Bool,
                "int" => Ty::Int,
                "float" => Ty::Float,
                "str" => Ty::Str,
                "list" => Ty::List,
                "lists" => Ty::Lists,
                other => return Err(row.error(format!("unknown type '{other}'"))),
            };
            let effect = match (effect, row.reason) {
                ("unmodelled", Some(reason)) => Effect::Unmodelled(reason),
                ("mapped", None) => Effect::Mapped,
                ("no-effect", None) => Effect::NoEffect,
                ("noted", None) => Effect::Noted,
                (other, _) => return Err(row.error(format!("unknown effect '{other}'"))),
            };
            Ok(Field {
                path,
                ty,
                default,
                effect,
            })
        })
        .collect()
}

/// Every field parsim knows, by section.
pub fn fields() -> &'static [Field] {
    static FIELDS: std::sync::LazyLock<Vec<Field>> = std::sync::LazyLock::new(|| {
        parse_table(TABLE).expect("the shipped torchtitan field table parses (unit-tested)")
    });
    &FIELDS
}

/// The field at `path`, if torchtitan has one.
pub fn field(path: &str) -> Option<&'static Field> {
    fields().iter().find(|f| f.path == path)
}

/// Whether `path` is a section (a table) of the job: a proper prefix of some field's path.
pub fn is_section(path: &str) -> bool {
    fields().iter().any(|f| {
        f.path
            .strip_prefix(path)
            .is_some_and(|rest| rest.starts_with('.'))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every default parses as JSON of its field's type (or null), and no path is listed twice.
    #[test]
    fn defaults_parse_and_paths_are_unique() {
        let mut seen = std::collections::HashSet::new();
        for f in fields() {
            assert!(seen.insert(f.path), "{} twice", f.path);
            let v: serde_json::Value = serde_json::from_str(f.default).unwrap();
            let ok = match f.ty {
                _ if v.is_null() => true,
                Ty::Bool => v.is_boolean(),
                Ty::Int => v.is_i64(),
                Ty::Float => v.is_number(),
                Ty::Str => v.is_string(),
                Ty::List | Ty::Lists => v.is_array(),
            };
            assert!(
                ok,
                "{}: default {} is not {}",
                f.path,
                f.default,
                f.ty.name()
            );
        }
        // 159 rows in the table, one per field of the sources above.
        assert_eq!(fields().len(), 159);
        assert!(is_section("quantize.linear") && is_section("training"));
        assert!(!is_section("training.seq_len") && !is_section("train"));
    }

    /// A row the table cannot hold is an error naming its line and the rule.
    #[test]
    fn malformed_rows_are_named_by_line() {
        let err = |t: &'static str| parse_table(t).unwrap_err();
        assert_eq!(err("a.b | str | null").rule, "3 cells, a row has 4");
        assert_eq!(err("# c\na.b | text | null | mapped").line, 2);
        assert!(err("a.b | str | null | maybe").rule.contains("'maybe'"));
        assert!(err("a.b | str | null | unmodelled @why")
            .rule
            .contains("'@why'"));
        let ok = parse_table("@why = a reason\na.b | int | 3 | unmodelled @why").unwrap();
        assert_eq!(ok[0].effect, Effect::Unmodelled("a reason"));
        assert_eq!((ok[0].path, ok[0].default, ok[0].ty), ("a.b", "3", Ty::Int));
    }
}
