//! The published whole-run measurements of 2022-2026 (`calibration/data/published-runs-2026.json`,
//! copied with its citation block from the project's shared data set): three tables, each
//! stating its use (validation only, or fitting and validation). Parsed once into JSON rows;
//! each source's reader ([`super::megatron_bridge`], [`super::vtrain`], [`super::bloom`]) turns
//! its rows into configurations. The repository carries the file: nothing is read at run time.

use serde::Deserialize;
use serde_json::Value;
use std::sync::OnceLock;

/// Why a published row cannot be read or described as a configuration: the field and the rule
/// it breaks, or the feature of the run that parsim does not model.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RowError {
    /// The data set itself does not parse.
    #[error("{PATH}: {message}")]
    DataSet { message: String },
    #[error("{PATH} has no table whose source starts with '{prefix}'")]
    NoTable { prefix: String },
    /// A field of a row that breaks its rule: missing, not a (whole, non-negative) number, 0.
    #[error("field '{field}' {rule}")]
    Field { field: String, rule: String },
    #[error("model '{model}' does not give 'hidden H, L layers, A heads'")]
    NoShape { model: String },
    /// A feature of the row that parsim does not model, said by the source's reader.
    #[error("{0}")]
    NotModelled(String),
}

impl RowError {
    fn field(field: &str, rule: String) -> RowError {
        RowError::Field {
            field: field.to_string(),
            rule,
        }
    }
}

/// The data set shipped with the repository.
pub const DATA: &str = include_str!("../../../../calibration/data/published-runs-2026.json");

/// Where the data set lives, relative to the repository root.
pub const PATH: &str = "calibration/data/published-runs-2026.json";

#[derive(Debug, Deserialize)]
struct Document {
    tables: Vec<Table>,
}

/// One source table: its name, the use its curator allows, its notes and its rows.
#[derive(Debug, Clone, Deserialize)]
pub struct Table {
    pub source: String,
    /// "validation only: never fit ..." or "fitting and validation ...".
    #[serde(rename = "use")]
    pub usage: String,
    pub notes: String,
    pub rows: Vec<Value>,
}

/// The table whose `source` starts with `prefix`.
pub fn table(prefix: &str) -> Result<&'static Table, RowError> {
    static DOC: OnceLock<Result<Document, RowError>> = OnceLock::new();
    let doc = DOC
        .get_or_init(|| {
            serde_json::from_str(DATA).map_err(|e| RowError::DataSet {
                message: e.to_string(),
            })
        })
        .as_ref()
        .map_err(Clone::clone)?;
    doc.tables
        .iter()
        .find(|t| t.source.starts_with(prefix))
        .ok_or_else(|| RowError::NoTable {
            prefix: prefix.to_string(),
        })
}

/// A field's main value: a `{"value": v, "alt_in_parentheses": a}` pair (a second figure the
/// source prints in parentheses: another quantisation granularity or layout of the same run)
/// gives `v`, the figure the table's row states first.
pub fn main(v: &Value) -> &Value {
    v.get("value").unwrap_or(v)
}

/// The number in field `key`: `None` when absent or null. A string whose first word is a
/// number (`"661 [note:gpt-oss-note]"`) gives that number; anything else is an error naming
/// the field.
pub fn number(row: &Value, key: &str) -> Result<Option<f64>, RowError> {
    let Some(v) = row.get(key).map(main) else {
        return Ok(None);
    };
    let parsed = match v {
        Value::Null => return Ok(None),
        Value::Number(n) => n.as_f64(),
        Value::String(s) => s.split_whitespace().next().and_then(|w| w.parse().ok()),
        _ => None,
    };
    match parsed {
        Some(x) if x.is_finite() && x >= 0.0 => Ok(Some(x)),
        _ => Err(RowError::field(
            key,
            format!("is not a non-negative number: {v}"),
        )),
    }
}

/// A whole number in field `key` (`None` when absent or null).
pub fn whole(row: &Value, key: &str) -> Result<Option<u64>, RowError> {
    match number(row, key)? {
        None => Ok(None),
        Some(x) if x.fract() == 0.0 && x <= u32::MAX as f64 => Ok(Some(x as u64)),
        Some(x) => Err(RowError::field(key, format!("is not a whole number: {x}"))),
    }
}

/// A whole number that must be present.
pub fn required(row: &Value, key: &str) -> Result<u64, RowError> {
    whole(row, key)?.ok_or_else(|| RowError::field(key, "is missing".into()))
}

/// A positive whole number that must be present, as a parallel degree or GPU count.
pub fn degree(row: &Value, key: &str) -> Result<u32, RowError> {
    match required(row, key)? {
        0 => Err(RowError::field(key, "is 0".into())),
        // `whole` keeps values at most u32::MAX.
        n => Ok(n as u32),
    }
}

/// The text in field `key` (the empty string when absent or not text).
pub fn text<'a>(row: &'a Value, key: &str) -> &'a str {
    row.get(key).map(main).and_then(Value::as_str).unwrap_or("")
}

/// A field's value as it reads in a label ("?" when absent).
pub fn text_num(row: &Value, key: &str) -> String {
    match row.get(key).map(main) {
        Some(Value::Number(n)) => n.to_string(),
        Some(Value::String(s)) => s.clone(),
        _ => "?".into(),
    }
}

/// The shape a GPT-style model description gives: "hidden 1024, 24 layers, 16 heads" (the
/// vTrain and BLOOM tables' `model` field), as (hidden, layers, heads).
pub fn gpt_shape(model: &str) -> Result<(u64, u32, u32), RowError> {
    let words: Vec<&str> = model
        .split(|c: char| c == ',' || c == ':' || c.is_whitespace())
        .filter(|w| !w.is_empty())
        .collect();
    let after = |name: &str| {
        words
            .windows(2)
            .find(|w| w[0] == name)
            .and_then(|w| w[1].parse::<u64>().ok())
    };
    let before = |name: &str| {
        words
            .windows(2)
            .find(|w| w[1] == name)
            .and_then(|w| w[0].parse::<u32>().ok())
    };
    match (after("hidden"), before("layers"), before("heads")) {
        (Some(h), Some(l), Some(a)) if h > 0 && l > 0 && a > 0 => Ok((h, l, a)),
        _ => Err(RowError::NoShape {
            model: model.to_string(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn every_table_is_found_with_its_use() {
        for (prefix, rows) in [
            ("NVIDIA Megatron-Bridge", 278),
            ("vTrain", 1440),
            ("BigScience BLOOM", 91),
        ] {
            let t = table(prefix).unwrap();
            assert_eq!(t.rows.len(), rows, "{prefix}");
            assert!(!t.usage.is_empty() && !t.notes.is_empty(), "{prefix}");
        }
        assert!(table("nothing")
            .unwrap_err()
            .to_string()
            .contains("nothing"));
    }

    #[test]
    fn fields_read_main_values_and_refuse_what_is_not_a_number() {
        let row = json!({"a": 3, "b": {"value": 64, "alt_in_parentheses": 0},
                         "c": "661 [note:x]", "d": null, "e": "many", "f": 2.5, "g": -1});
        assert_eq!(whole(&row, "a").unwrap(), Some(3));
        assert_eq!(whole(&row, "b").unwrap(), Some(64));
        assert_eq!(number(&row, "c").unwrap(), Some(661.0));
        assert_eq!(whole(&row, "d").unwrap(), None);
        assert_eq!(whole(&row, "missing").unwrap(), None);
        let said = |r: Result<_, RowError>| r.map(|_: u64| ()).unwrap_err().to_string();
        let said_f = |r: Result<Option<f64>, RowError>| r.unwrap_err().to_string();
        assert!(said_f(number(&row, "e")).contains("'e'"));
        assert!(whole(&row, "f").unwrap_err().to_string().contains("'f'"));
        assert!(said_f(number(&row, "g")).contains("'g'"));
        assert!(degree(&json!({"tp": 0}), "tp")
            .unwrap_err()
            .to_string()
            .contains("'tp'"));
        assert!(said(required(&row, "d")).contains("missing"));
    }

    #[test]
    fn gpt_shapes_are_read_from_the_description() {
        assert_eq!(
            gpt_shape("GPT (Megatron style, MHA): hidden 2048, 20 layers, 16 heads").unwrap(),
            (2048, 20, 16)
        );
        assert_eq!(
            gpt_shape("BLOOM-style GPT (181B): hidden 14336, 72 layers, 64 heads, vocab").unwrap(),
            (14336, 72, 64)
        );
        assert!(gpt_shape("hidden 1024, 24 layers").is_err());
    }
}
