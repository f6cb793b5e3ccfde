//! A configuration as a Python caller gives it: a dict shaped like parsim's TOML, a path to a
//! TOML or JSON configuration, a Hugging Face config.json or a Megatron-LM launch script, or a
//! Megatron argument list (such as `sys.argv`); an optional dict of overrides goes over it, as
//! the CLI's flags go over `--config`.

use crate::errors::config_error;
use parsim::config::{load, megatron, Config, Layer};
use pyo3::exceptions::{PyTypeError, PyUserWarning};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyString, PyTuple};
use serde_json::{json, Value};
use std::ffi::CString;
use std::path::{Path, PathBuf};

/// The layers of `config` and `overrides`, merged and deserialized; what did not carry over
/// (a Megatron flag with no counterpart) is raised as a Python `UserWarning`.
pub fn load_config(
    py: Python<'_>,
    config: &Bound<'_, PyAny>,
    overrides: Option<&Bound<'_, PyDict>>,
) -> PyResult<Config> {
    let mut warnings = Vec::new();
    let mut layers = vec![layer_of(py, config, &mut warnings)?];
    if let Some(o) = overrides {
        layers.push(Layer {
            origin: "overrides".into(),
            base_dir: None,
            value: dict_value(py, o, "overrides")?,
        });
    }
    let cfg = Config::from_layers(&layers).map_err(config_error)?;
    warn(py, &warnings)?;
    Ok(cfg)
}

/// Raises each line as a `UserWarning` (an error when the warnings filter says so).
pub fn warn(py: Python<'_>, lines: &[String]) -> PyResult<()> {
    let category = py.get_type::<PyUserWarning>();
    for line in lines {
        let text = CString::new(line.replace('\0', " ")).unwrap_or_default();
        PyErr::warn(py, &category, &text, 1)?;
    }
    Ok(())
}

/// One layer from whatever `config` is.
fn layer_of(
    py: Python<'_>,
    config: &Bound<'_, PyAny>,
    warnings: &mut Vec<String>,
) -> PyResult<Layer> {
    if let Ok(d) = config.downcast::<PyDict>() {
        return Ok(Layer {
            origin: "config dict".into(),
            base_dir: None,
            value: dict_value(py, d, "config dict")?,
        });
    }
    if config.is_instance_of::<PyList>() || config.is_instance_of::<PyTuple>() {
        let words: Vec<String> = config.extract().map_err(|_| {
            PyTypeError::new_err(
                "config: a list is a Megatron argument list: every item must be a str",
            )
        })?;
        return megatron_layer(&argument_text(&words), "Megatron arguments", warnings);
    }
    let is_path =
        config.is_instance_of::<PyString>() || config.hasattr(pyo3::intern!(py, "__fspath__"))?;
    if !is_path {
        return Err(PyTypeError::new_err(format!(
            "config: expected a dict, a path (str or os.PathLike) or a list of Megatron arguments, got {}",
            config.get_type().name()?
        )));
    }
    let path: PathBuf = config.extract()?;
    file_layer(&path, warnings)
}

/// A file's layer: `.toml` is a configuration, `.json` a configuration or (with
/// `model_type` or `architectures` at its top) a Hugging Face config.json, anything else a
/// Megatron-LM launch script.
fn file_layer(path: &Path, warnings: &mut Vec<String>) -> PyResult<Layer> {
    let ext = path
        .extension()
        .map(|e| e.to_string_lossy().to_ascii_lowercase());
    match ext.as_deref() {
        Some("toml") => Layer::from_file(path).map_err(config_error),
        Some("json") => {
            let layer = Layer::from_file(path).map_err(config_error)?;
            if is_hf_config(&layer.value) {
                Ok(Layer::overrides(
                    json!({"model": {"hf_config": path.display().to_string()}}),
                ))
            } else {
                Ok(layer)
            }
        }
        _ => {
            let origin = path.display().to_string();
            let text = std::fs::read_to_string(path).map_err(|e| {
                crate::errors::ConfigError::new_err(format!(
                    "reading Megatron arguments {origin}: {e}"
                ))
            })?;
            megatron_layer(&text, &origin, warnings)
        }
    }
}

/// True for a Hugging Face config.json (parsim's own configurations have only sections at
/// their top).
fn is_hf_config(v: &Value) -> bool {
    v.get("model_type").is_some() || v.get("architectures").is_some()
}

/// The override layer of a Megatron-LM launch; what did not carry over goes to `warnings`.
fn megatron_layer(text: &str, origin: &str, warnings: &mut Vec<String>) -> PyResult<Layer> {
    let imported = megatron::import(text, origin).map_err(config_error)?;
    warnings.extend(
        imported
            .warnings()
            .into_iter()
            .map(|w| format!("{origin}: {w}")),
    );
    Ok(Layer {
        origin: origin.to_string(),
        base_dir: None,
        value: imported.layer,
    })
}

/// An argument list as one shell line (each word quoted where it needs to be).
fn argument_text(words: &[String]) -> String {
    words
        .iter()
        .map(|w| parsim::report::format::shell_quote(w))
        .collect::<Vec<_>>()
        .join(" ")
}

/// A dict as a JSON value, through Python's own `json.dumps` (a value JSON cannot carry, such
/// as NaN or an object, is refused by name).
fn dict_value(py: Python<'_>, d: &Bound<'_, PyDict>, origin: &str) -> PyResult<Value> {
    let kwargs = PyDict::new(py);
    kwargs.set_item("allow_nan", false)?;
    let text: String = py
        .import("json")?
        .call_method("dumps", (d,), Some(&kwargs))
        .map_err(|e| {
            crate::errors::ConfigError::new_err(format!(
                "{origin}: not a JSON document (numbers must be finite; values str, int, float, bool, list or dict): {e}"
            ))
        })?
        .extract()?;
    load::parse_json(&text, origin).map_err(config_error)
}
