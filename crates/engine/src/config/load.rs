//! Reading configuration documents: TOML or JSON text becomes a JSON value (syntax errors with
//! line and column), layers of values are merged, and the result is deserialized with the path
//! of the field that fails.

use super::error::ConfigError;
use serde::de::DeserializeOwned;
use serde_json::Value;
use std::path::Path;

/// Parses a TOML or JSON document (by extension: `.json` is JSON, anything else TOML).
pub fn parse_document_file(path: &Path) -> Result<Value, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
        path: path.display().to_string(),
        source,
    })?;
    let origin = path.display().to_string();
    if path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("json"))
    {
        parse_json(&text, &origin)
    } else {
        parse_toml(&text, &origin)
    }
}

/// Parses JSON text into a value. A key given twice in one object is an error, as in TOML
/// (serde_json alone keeps the last one silently).
pub fn parse_json(text: &str, origin: &str) -> Result<Value, ConfigError> {
    let err = |e: serde_json::Error| ConfigError::Parse {
        origin: origin.to_string(),
        line: e.line(),
        column: e.column(),
        message: e.to_string(),
    };
    serde_json::from_str::<UniqueKeys>(text).map_err(err)?;
    serde_json::from_str(text).map_err(err)
}

/// A JSON document walked only to refuse duplicate keys (the error names the key).
pub struct UniqueKeys;

impl<'de> serde::Deserialize<'de> for UniqueKeys {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(UniqueKeysVisitor)
    }
}

struct UniqueKeysVisitor;

impl<'de> serde::de::Visitor<'de> for UniqueKeysVisitor {
    type Value = UniqueKeys;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<UniqueKeys, E> {
        Ok(UniqueKeys)
    }
    fn visit_i64<E>(self, _: i64) -> Result<UniqueKeys, E> {
        Ok(UniqueKeys)
    }
    fn visit_u64<E>(self, _: u64) -> Result<UniqueKeys, E> {
        Ok(UniqueKeys)
    }
    fn visit_f64<E>(self, _: f64) -> Result<UniqueKeys, E> {
        Ok(UniqueKeys)
    }
    fn visit_str<E>(self, _: &str) -> Result<UniqueKeys, E> {
        Ok(UniqueKeys)
    }
    fn visit_unit<E>(self) -> Result<UniqueKeys, E> {
        Ok(UniqueKeys)
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut a: A) -> Result<UniqueKeys, A::Error> {
        while a.next_element::<UniqueKeys>()?.is_some() {}
        Ok(UniqueKeys)
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut a: A) -> Result<UniqueKeys, A::Error> {
        let mut seen = std::collections::HashSet::new();
        while let Some(key) = a.next_key::<String>()? {
            if !seen.insert(key.clone()) {
                return Err(serde::de::Error::custom(format!("duplicate key `{key}`")));
            }
            a.next_value::<UniqueKeys>()?;
        }
        Ok(UniqueKeys)
    }
}

/// Parses TOML text into a JSON value.
pub fn parse_toml(text: &str, origin: &str) -> Result<Value, ConfigError> {
    let table: toml::Table = toml::from_str(text).map_err(|e| {
        let (line, column) = e
            .span()
            .map(|s| line_column(text, s.start))
            .unwrap_or((0, 0));
        ConfigError::Parse {
            origin: origin.to_string(),
            line,
            column,
            message: e.message().to_string(),
        }
    })?;
    if let Some((field, v)) = non_finite(&toml::Value::Table(table.clone()), String::new()) {
        return Err(ConfigError::Field {
            origin: origin.to_string(),
            field,
            message: format!("must be a finite number, got {v}"),
        });
    }
    serde_json::to_value(table).map_err(|e| ConfigError::Parse {
        origin: origin.to_string(),
        line: 0,
        column: 0,
        message: e.to_string(),
    })
}

/// The dotted path and value of the first NaN or infinite float (JSON cannot carry them).
fn non_finite(v: &toml::Value, path: String) -> Option<(String, f64)> {
    match v {
        toml::Value::Float(f) if !f.is_finite() => Some((path, *f)),
        toml::Value::Table(t) => t.iter().find_map(|(k, v)| {
            let p = if path.is_empty() {
                k.clone()
            } else {
                format!("{path}.{k}")
            };
            non_finite(v, p)
        }),
        toml::Value::Array(a) => a
            .iter()
            .enumerate()
            .find_map(|(i, v)| non_finite(v, format!("{path}[{i}]"))),
        _ => None,
    }
}

/// Deserializes TOML text straight into `T`, naming the failing field.
pub fn parse_toml_typed<T: DeserializeOwned>(text: &str, origin: &str) -> Result<T, ConfigError> {
    from_value(parse_toml(text, origin)?, origin)
}

/// Deserializes a value into `T`, naming the failing field by its dotted path.
pub fn from_value<T: DeserializeOwned>(value: Value, origin: &str) -> Result<T, ConfigError> {
    serde_path_to_error::deserialize(value).map_err(|e| ConfigError::Field {
        origin: origin.to_string(),
        field: e.path().to_string(),
        message: e.into_inner().to_string(),
    })
}

/// 1-based line and column of a byte offset.
fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before
        .rfind('\n')
        .map_or(before.len(), |i| before.len() - i - 1)
        + 1;
    (line, column)
}

/// Deep-merges `overlay` into `base`: objects merge key by key, anything else replaces.
pub fn merge(base: &mut Value, overlay: Value) {
    match (base, overlay) {
        (Value::Object(b), Value::Object(o)) => {
            for (k, v) in o {
                match b.get_mut(&k) {
                    Some(slot) => merge(slot, v),
                    None => {
                        b.insert(k, v);
                    }
                }
            }
        }
        (slot, v) => *slot = v,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn toml_syntax_error_has_line_and_column() {
        let err = parse_toml("[model]\nnum_layers = = 3\n", "x.toml").unwrap_err();
        match err {
            ConfigError::Parse { line, column, .. } => {
                assert_eq!(line, 2);
                assert!(column >= 1);
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn merge_is_deep() {
        let mut a = serde_json::json!({"p": {"tp": 1, "pp": 2}, "x": 1});
        merge(&mut a, serde_json::json!({"p": {"tp": 4}, "x": {"y": 2}}));
        assert_eq!(
            a,
            serde_json::json!({"p": {"tp": 4, "pp": 2}, "x": {"y": 2}})
        );
    }
}
