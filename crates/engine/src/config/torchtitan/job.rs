//! A torchtitan job as read: the TOML file's fields and the launch's `--section.field value`
//! overrides over them, each checked against torchtitan's `JobConfig` (src/config/torchtitan/
//! schema.rs), with torchtitan's default for every field left out.

use super::schema::{self, Field, Ty};
use super::TorchtitanError;
use serde_json::Value;
use std::collections::BTreeMap;

/// The fields a job sets (file, then overrides), by dotted path.
#[derive(Debug, Clone, Default)]
pub struct Job {
    /// Names the file in errors.
    pub origin: String,
    set: BTreeMap<String, Value>,
}

impl Job {
    /// Reads the TOML text `text` (named `origin`), then applies `overrides`
    /// (`section.field=value`, a leading `--` allowed; a boolean field alone means true).
    pub fn read(text: &str, origin: &str, overrides: &[String]) -> Result<Job, TorchtitanError> {
        let doc = super::super::load::parse_toml(text, origin)?;
        let mut job = Job {
            origin: origin.to_string(),
            set: BTreeMap::new(),
        };
        if let Value::Object(top) = doc {
            for (k, v) in top {
                job.flatten(k, v)?;
            }
        }
        for text in overrides {
            job.apply_override(text)?;
        }
        Ok(job)
    }

    /// Walks a table into fields, refusing unknown sections and keys and wrong types.
    fn flatten(&mut self, path: String, value: Value) -> Result<(), TorchtitanError> {
        if let Some(f) = schema::field(&path) {
            let value = self.typed(f, value)?;
            self.set.insert(path, value);
            return Ok(());
        }
        match value {
            Value::Object(table) if schema::is_section(&path) => {
                for (k, v) in table {
                    self.flatten(format!("{path}.{k}"), v)?;
                }
                Ok(())
            }
            Value::Object(_) => Err(self.unknown_section(&path)),
            _ if path.contains('.') && !schema::is_section(parent(&path)) => {
                Err(self.unknown_section(parent(&path)))
            }
            _ => Err(TorchtitanError::field(
                format!("{}: {path}", self.origin),
                "unknown key (torchtitan's JobConfig has no such field)",
            )),
        }
    }

    /// `value` checked against the field's type (an integer is a valid float).
    fn typed(&self, f: &Field, value: Value) -> Result<Value, TorchtitanError> {
        let ok = match f.ty {
            Ty::Bool => value.is_boolean(),
            Ty::Int => value.is_i64(),
            Ty::Float => value.is_number(),
            Ty::Str => value.is_string(),
            Ty::List => value
                .as_array()
                .is_some_and(|a| a.iter().all(Value::is_string)),
            Ty::Lists => value.as_array().is_some_and(|a| {
                a.iter().all(|x| {
                    x.as_array()
                        .is_some_and(|inner| inner.iter().all(Value::is_string))
                })
            }),
        };
        if ok {
            Ok(value)
        } else {
            Err(self.invalid(f.path, format!("must be {}, got {value}", f.ty.name())))
        }
    }

    /// One `section.field=value` override, typed by its field.
    fn apply_override(&mut self, text: &str) -> Result<(), TorchtitanError> {
        let bad =
            |rule: String| TorchtitanError::field(format!("torchtitan override '{text}'"), rule);
        let body = text.strip_prefix("--").unwrap_or(text);
        let (path, raw) = match body.split_once('=') {
            Some((p, v)) => (p.trim(), Some(v.trim())),
            None => (body.trim(), None),
        };
        let Some(f) = schema::field(path) else {
            let rule = if schema::is_section(path) {
                "names a section, not a field: write section.field=value".to_string()
            } else {
                format!("unknown field {path} (torchtitan's JobConfig has no such field)")
            };
            return Err(bad(rule));
        };
        let value = match (f.ty, raw) {
            (Ty::Bool, None) => Value::Bool(true),
            (_, None) => return Err(bad("needs a value: section.field=value".into())),
            (Ty::Bool, Some(v)) => match v.to_ascii_lowercase().as_str() {
                "true" => Value::Bool(true),
                "false" => Value::Bool(false),
                _ => return Err(bad(format!("{path} is a boolean: true or false, got {v}"))),
            },
            (Ty::Int, Some(v)) => v
                .parse::<i64>()
                .map(Value::from)
                .map_err(|_| bad(format!("{path} is an integer, got {v}")))?,
            (Ty::Float, Some(v)) => match v.parse::<f64>() {
                Ok(x) if x.is_finite() => Value::from(x),
                _ => return Err(bad(format!("{path} is a finite number, got {v}"))),
            },
            (Ty::Str, Some(v)) => Value::String(v.to_string()),
            (Ty::List, Some(v)) => Value::Array(
                v.split(',')
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .map(|s| Value::String(s.to_string()))
                    .collect(),
            ),
            (Ty::Lists, Some(v)) => serde_json::from_str(v)
                .map_err(|e| bad(format!("{path} is a JSON list of lists: {e}")))?,
        };
        let value = self.typed(f, value)?;
        self.set.insert(path.to_string(), value);
        Ok(())
    }

    /// The value at `path`: what the job sets, else torchtitan's default (`null` for `None`).
    pub fn get(&self, path: &str) -> Value {
        if let Some(v) = self.set.get(path) {
            return v.clone();
        }
        schema::field(path)
            .and_then(|f| serde_json::from_str(f.default).ok())
            .unwrap_or(Value::Null)
    }

    /// The paths the job sets, in order.
    pub fn set_paths(&self) -> impl Iterator<Item = &str> {
        self.set.keys().map(String::as_str)
    }

    /// The integer at `path` (its type was checked on reading).
    pub fn int(&self, path: &str) -> Option<i64> {
        self.get(path).as_i64()
    }

    /// The string at `path`, `None` when it is `None` in torchtitan.
    pub fn string(&self, path: &str) -> Option<String> {
        self.get(path).as_str().map(str::to_string)
    }

    /// The boolean at `path`.
    pub fn flag(&self, path: &str) -> bool {
        self.get(path).as_bool().unwrap_or(false)
    }

    /// The list of strings at `path`.
    pub fn list(&self, path: &str) -> Vec<String> {
        self.get(path)
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|v| v.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// An error naming `path` and a rule torchtitan itself enforces.
    pub fn invalid(&self, path: &str, rule: impl Into<String>) -> TorchtitanError {
        TorchtitanError::field(format!("{}: {path}", self.origin), rule)
    }

    /// An error naming `path`, its value and why parsim cannot model it.
    pub fn unmodelled(&self, path: &str, reason: impl Into<String>) -> TorchtitanError {
        TorchtitanError::field(
            format!("{}: {path} = {}", self.origin, self.get(path)),
            format!("not modelled: {}", reason.into()),
        )
    }

    /// An error naming a table torchtitan's `JobConfig` does not have.
    fn unknown_section(&self, path: &str) -> TorchtitanError {
        TorchtitanError::field(
            format!("{}: [{path}]", self.origin),
            "unknown section (not one of torchtitan's JobConfig)",
        )
    }
}

/// The section of a dotted path (`a.b` of `a.b.c`; the path itself when it has no dot).
fn parent(path: &str) -> &str {
    path.rsplit_once('.').map_or(path, |(p, _)| p)
}
