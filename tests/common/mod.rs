//! Helpers shared by the integration tests (each test binary includes this module).

use serde_json::Value;

/// Optional fields, null when unset; every other null is a NaN or an infinity that
/// serde_json wrote as null.
const OPTIONAL_KEYS: [&str; 12] = [
    "kv_channels",
    "mla",
    "ddp_bucket_size",
    "expert_tp",
    "first_stage_layers",
    "last_stage_layers",
    "per_layer_moe",
    "dp",
    "hf_config",
    "preset",
    "ci95",
    "measured_peak_bytes",
];

/// The first null (other than an unset optional field), NaN or infinity in a JSON document,
/// with its path.
pub fn non_numbers(v: &Value) -> Option<String> {
    fn walk(v: &Value, path: &str, key: &str) -> Option<String> {
        match v {
            Value::Null if OPTIONAL_KEYS.contains(&key) => None,
            Value::Null => Some(format!("null at {path}")),
            Value::Number(n) if !n.as_f64().is_some_and(f64::is_finite) => {
                Some(format!("{n} at {path}"))
            }
            Value::Array(a) => a
                .iter()
                .enumerate()
                .find_map(|(i, x)| walk(x, &format!("{path}[{i}]"), key)),
            Value::Object(o) => o
                .iter()
                .find_map(|(k, x)| walk(x, &format!("{path}.{k}"), k)),
            _ => None,
        }
    }
    walk(v, "$", "")
}
