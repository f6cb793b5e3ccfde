//! Walks a DeepSpeed configuration against the key tables ([`super::keys`]): every key is
//! mapped, accepted as having no effect, or refused by its JSON path.

use super::keys::{self, Default, Rule, OFFLOAD_DEVICES, OFFLOAD_OPTIMIZER_KEYS};
use super::DeepspeedError;
use serde_json::{Map, Value};

/// What a walk found: the mapped values by path, and the accepted keys.
#[derive(Debug, Default)]
pub struct Walked {
    /// Mapped keys by dotted path (e.g. `zero_optimization.stage`), as written.
    pub mapped: Vec<(String, Value)>,
    /// Keys that change neither memory nor step time, or sit at DeepSpeed's default, by path.
    pub accepted: Vec<String>,
}

impl Walked {
    /// The mapped value at `path`, if the configuration gives one.
    pub fn get(&self, path: &str) -> Option<&Value> {
        self.mapped.iter().find(|(p, _)| p == path).map(|(_, v)| v)
    }
}

/// Walks the whole document (an object: DeepSpeed's `param_dict`).
pub fn walk(doc: &Value) -> Result<Walked, DeepspeedError> {
    let Value::Object(top) = doc else {
        return Err(DeepspeedError::field(
            "(top level)",
            "a DeepSpeed configuration is a JSON object",
        ));
    };
    let mut out = Walked::default();
    section(top, "", &mut out)?;
    Ok(out)
}

fn join(prefix: &str, key: &str) -> String {
    if prefix.is_empty() {
        key.to_string()
    } else {
        format!("{prefix}.{key}")
    }
}

fn section(obj: &Map<String, Value>, prefix: &str, out: &mut Walked) -> Result<(), DeepspeedError> {
    for (key, value) in obj {
        let path = join(prefix, key);
        let Some(rule) = keys::rule(&path) else {
            return Err(DeepspeedError::field(
                path,
                "unknown key (not a key of DeepSpeed's configuration)",
            ));
        };
        apply(rule, &path, value, out)?;
    }
    Ok(())
}

fn apply(rule: Rule, path: &str, value: &Value, out: &mut Walked) -> Result<(), DeepspeedError> {
    let refuse = |what: &str| DeepspeedError::field(path, what);
    match rule {
        Rule::Mapped => out.mapped.push((path.to_string(), value.clone())),
        Rule::NoEffect | Rule::NoEffectSection => out.accepted.push(path.to_string()),
        Rule::DefaultOnly(default, why) => {
            if !at_default(value, default) {
                return Err(refuse(why));
            }
            out.accepted.push(path.to_string());
        }
        Rule::Unmodelled(why) => {
            // An empty section sets nothing.
            if !matches!(value, Value::Object(m) if m.is_empty()) && !value.is_null() {
                return Err(refuse(why));
            }
            out.accepted.push(path.to_string());
        }
        Rule::UnlessDisabled(why) => {
            let enabled = value.get("enabled");
            if enabled.is_some_and(|e| !at_default(e, Default::Bool(false))) {
                return Err(refuse(why));
            }
            out.accepted.push(path.to_string());
        }
        Rule::Section => match value {
            Value::Object(m) => section(m, path, out)?,
            Value::Null => {}
            _ => return Err(DeepspeedError::field(path, "must be an object")),
        },
        Rule::Offload(why) => {
            let device = match value {
                Value::Null => None,
                Value::Object(m) => m.get("device"),
                _ => return Err(DeepspeedError::field(path, "must be an object")),
            };
            match device.and_then(Value::as_str) {
                None | Some("none") => out.accepted.push(path.to_string()),
                Some(d) if OFFLOAD_DEVICES.contains(&d) => {
                    return Err(refuse(&format!("{why} (device \"{d}\")")));
                }
                Some(d) => return Err(unknown_device(path, d)),
            }
        }
        Rule::OffloadCpu(why) => offload_cpu(path, value, why, out)?,
    }
    Ok(())
}

/// An offload section's `device` that DeepSpeed does not have.
fn unknown_device(path: &str, d: &str) -> DeepspeedError {
    DeepspeedError::field(
        format!("{path}.device"),
        format!(
            "unknown offload device \"{d}\" (DeepSpeed's: {})",
            OFFLOAD_DEVICES.join(", ")
        ),
    )
}

/// The optimizer's offload section ([`Rule::OffloadCpu`]): `device` "cpu" is mapped (as the
/// path `<section>.device`), with every other key one DeepSpeed has and `ratio` at 1.
fn offload_cpu(
    path: &str,
    value: &Value,
    why: &str,
    out: &mut Walked,
) -> Result<(), DeepspeedError> {
    let m = match value {
        Value::Object(m) => m,
        Value::Null => {
            out.accepted.push(path.to_string());
            return Ok(());
        }
        _ => return Err(DeepspeedError::field(path, "must be an object")),
    };
    match m.get("device").and_then(Value::as_str) {
        None | Some("none") => {
            out.accepted.push(path.to_string());
            return Ok(());
        }
        Some("cpu") => {}
        Some(d) if OFFLOAD_DEVICES.contains(&d) => {
            return Err(DeepspeedError::field(
                path,
                format!("{why} (device \"{d}\")"),
            ));
        }
        Some(d) => return Err(unknown_device(path, d)),
    }
    for (key, v) in m {
        let sub = format!("{path}.{key}");
        if !OFFLOAD_OPTIMIZER_KEYS.contains(&key.as_str()) {
            return Err(DeepspeedError::field(
                sub,
                "unknown key (not a key of DeepSpeed's offload_optimizer section)",
            ));
        }
        if key == "ratio" && !at_default(v, Default::Num(1.0)) {
            return Err(DeepspeedError::field(
                sub,
                format!(
                    "a partial optimizer offload (ZeRO-3's ratio) is not modelled: only 1, got {v}"
                ),
            ));
        }
    }
    out.mapped.push((format!("{path}.device"), "cpu".into()));
    Ok(())
}

/// True when `value` is DeepSpeed's default, or "auto" (which DeepSpeed drops before reading:
/// `DeepSpeedConfigModel.__init__`, deepspeed/runtime/config_utils.py, so the default
/// applies).
fn at_default(value: &Value, default: Default) -> bool {
    if value.as_str() == Some("auto") {
        return true;
    }
    match default {
        Default::Null => value.is_null(),
        Default::Bool(b) => value.is_null() || value.as_bool() == Some(b),
        Default::Num(n) => {
            value.is_null()
                || value
                    .as_f64()
                    .is_some_and(|v| (v - n).abs() <= n.abs() * 1e-12)
        }
    }
}
