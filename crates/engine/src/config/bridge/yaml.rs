//! A Megatron-Bridge YAML document as a JSON value. Bridge writes its configuration with
//! Megatron-LM's safe representers (megatron/training/config/yaml_utils.py): a function or a
//! torch dtype as `{_target_: torch.bfloat16, _call_: false}`, an enum as `{_target_: Class,
//! _call_: true, _args_: [value], _name_: NAME}`. Those become their dotted name and the
//! enum's name, so a rule reads `torch.bfloat16` or `auto`; anything else keeps its shape.

use super::super::error::ConfigError;
use super::super::import::ImportError;
use serde_json::{Map, Number, Value};

/// Parses `text` (named `origin` in errors). A key given twice, a non-string key or a YAML tag
/// is an error naming where it is.
pub fn parse(text: &str, origin: &str) -> Result<Value, ImportError> {
    let doc: serde_norway::Value = serde_norway::from_str(text).map_err(|e| {
        let at = e
            .location()
            .map(|l| format!(" (line {}, column {})", l.line(), l.column()))
            .unwrap_or_default();
        ImportError::Parse(ConfigError::Import {
            origin: origin.to_string(),
            message: format!("not a YAML document{at}: {e}"),
        })
    })?;
    to_json(&doc, "")
}

fn join(prefix: &str, key: &str) -> String {
    if prefix.is_empty() {
        key.to_string()
    } else {
        format!("{prefix}.{key}")
    }
}

fn to_json(v: &serde_norway::Value, path: &str) -> Result<Value, ImportError> {
    use serde_norway::Value as Y;
    let at = || {
        if path.is_empty() {
            "(top level)".to_string()
        } else {
            path.to_string()
        }
    };
    Ok(match v {
        Y::Null => Value::Null,
        Y::Bool(b) => Value::Bool(*b),
        Y::Number(n) => number(n),
        Y::String(s) => Value::String(s.clone()),
        Y::Sequence(items) => Value::Array(
            items
                .iter()
                .enumerate()
                .map(|(i, item)| to_json(item, &format!("{}[{i}]", at())))
                .collect::<Result<_, _>>()?,
        ),
        Y::Mapping(m) => {
            let mut out = Map::new();
            for (k, item) in m {
                let Some(key) = k.as_str() else {
                    return Err(ImportError::field(
                        at(),
                        format!("a key must be a string, got {k:?}"),
                    ));
                };
                let value = to_json(item, &join(path, key))?;
                out.insert(key.to_string(), value);
            }
            named_object(out)
        }
        Y::Tagged(t) => {
            return Err(ImportError::field(
                at(),
                format!(
                    "the YAML tag {} is not read (Megatron-Bridge writes none)",
                    t.tag
                ),
            ))
        }
    })
}

/// A YAML number: an integer stays one; a float that JSON cannot hold (`.inf`, `.nan`) becomes
/// its text, so a rule that needs a number refuses it by name and one that reads nothing
/// accepts it.
fn number(n: &serde_norway::Number) -> Value {
    if let Some(i) = n.as_u64() {
        return Value::Number(i.into());
    }
    if let Some(i) = n.as_i64() {
        return Value::Number(i.into());
    }
    let f = n.as_f64().unwrap_or(f64::NAN);
    Number::from_f64(f).map_or_else(|| Value::String(f.to_string()), Value::Number)
}

/// A function, dtype or enum as Megatron-LM's representers write it, as its name; any other
/// object unchanged.
fn named_object(m: Map<String, Value>) -> Value {
    let only = |keys: &[&str]| m.keys().all(|k| keys.contains(&k.as_str()));
    let target = m.get("_target_").and_then(Value::as_str);
    match (target, m.get("_call_"), m.get("_name_")) {
        (Some(_), Some(Value::Bool(true)), Some(Value::String(name)))
            if only(&["_target_", "_call_", "_args_", "_name_"]) =>
        {
            Value::String(name.clone())
        }
        (Some(t), Some(Value::Bool(false)), None) if only(&["_target_", "_call_"]) => {
            Value::String(t.to_string())
        }
        _ => Value::Object(m),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Megatron-LM's representers' shapes become names; other objects, integers and floats keep
    /// theirs; `.inf` becomes text; a repeated key and a tag are errors naming where.
    #[test]
    fn representer_objects_become_names_and_bad_documents_are_named() {
        let doc = parse(
            "model:\n  params_dtype: {_target_: torch.bfloat16, _call_: false}\n  \
             attention_backend: {_target_: megatron.core.transformer.enums.AttnBackend, _call_: true, _args_: [5], _name_: auto}\n  \
             init_method: {_target_: torch.nn.init.normal_, _partial_: true, std: 0.02}\n  \
             num_layers: 32\n  hidden_dropout: 0.0\n  clip: .inf\n",
            "t.yaml",
        )
        .unwrap();
        let m = &doc["model"];
        assert_eq!(m["params_dtype"], "torch.bfloat16");
        assert_eq!(m["attention_backend"], "auto");
        assert_eq!(m["init_method"]["_partial_"], true);
        assert_eq!(m["num_layers"], 32);
        assert_eq!(m["hidden_dropout"], 0.0);
        assert_eq!(m["clip"], "inf");
        let err = parse("model:\n  a: 1\n  a: 2\n", "t.yaml")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("t.yaml") && err.contains("duplicate entry with key \"a\""),
            "{err}"
        );
        let err = parse("model:\n  a: !custom 1\n", "t.yaml")
            .unwrap_err()
            .to_string();
        assert!(err.contains("model.a") && err.contains("!custom"), "{err}");
        let err = parse("model:\n  1: x\n", "t.yaml").unwrap_err().to_string();
        assert!(err.starts_with("model: a key must be a string"), "{err}");
    }
}
