//! A configuration as a Python caller gives it: a dict shaped like parsim's TOML, a path to a
//! TOML or JSON configuration, a Hugging Face config.json, a torchtitan job file, a DeepSpeed
//! configuration, a Megatron-Bridge configuration (YAML) or a Megatron-LM launch script, or a
//! Megatron argument list (such as `sys.argv`); an optional dict of overrides goes over it, as
//! the CLI's flags go over `--config`. A file's kind is told by its extension (`.yaml` is
//! Megatron-Bridge's) and its top-level keys, which never overlap: parsim's sections,
//! torchtitan's `[job]`, `[parallelism]` and the like, DeepSpeed's `zero_optimization` and
//! batch keys, Hugging Face's `model_type`/`architectures`.

use crate::errors::config_error;
use parsim::config::{bridge, deepspeed, load, megatron, torchtitan, Config, Layer};
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
    let flags = match overrides {
        Some(o) => dict_value(py, o, "overrides")?,
        None => json!({}),
    };
    let (first, deepspeed) = layer_of(py, config, &flags, &mut warnings)?;
    let mut layers = vec![first];
    layers.push(Layer {
        origin: "overrides".into(),
        base_dir: None,
        value: flags,
    });
    let mut cfg = Config::from_layers(&layers).map_err(config_error)?;
    if let Some(imported) = deepspeed {
        // The batch needs the data-parallel size of the merged configuration (as the CLI's
        // --deepspeed-config does).
        let origin = layers[0].origin.clone();
        if let Some((value, note)) = imported
            .batch_layer(&cfg)
            .map_err(|e| in_file(&origin, e))?
        {
            warnings.push(format!("{origin}: {note}"));
            let batch = Layer {
                origin,
                base_dir: None,
                value,
            };
            layers.insert(1, batch);
            cfg = Config::from_layers(&layers).map_err(config_error)?;
        }
    }
    warn(py, &warnings)?;
    Ok(cfg)
}

/// An import's error as `parsim.ConfigError`, naming the file it came from.
fn in_file(origin: &str, e: parsim::config::import::ImportError) -> PyErr {
    crate::errors::ConfigError::new_err(format!("{origin}: {}", crate::errors::message(&e)))
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
    flags: &Value,
    warnings: &mut Vec<String>,
) -> PyResult<(Layer, Option<deepspeed::DeepspeedImport>)> {
    if let Ok(d) = config.downcast::<PyDict>() {
        let layer = Layer {
            origin: "config dict".into(),
            base_dir: None,
            value: dict_value(py, d, "config dict")?,
        };
        return Ok((layer, None));
    }
    if config.is_instance_of::<PyList>() || config.is_instance_of::<PyTuple>() {
        let words: Vec<String> = config.extract().map_err(|_| {
            PyTypeError::new_err(
                "config: a list is a Megatron argument list: every item must be a str",
            )
        })?;
        let layer = megatron_layer(&argument_text(&words), "Megatron arguments", warnings)?;
        return Ok((layer, None));
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
    file_layer(&path, flags, warnings)
}

/// An imported file's text, its read error a configuration error naming the file.
fn read_text(path: &Path, origin: &str) -> PyResult<String> {
    std::fs::read_to_string(path)
        .map_err(|e| crate::errors::ConfigError::new_err(format!("reading {origin}: {e}")))
}

/// An import's layer from `origin`, its notes added to `warnings` under the file's name.
fn noted_layer(
    origin: String,
    value: Value,
    notes: Vec<String>,
    warnings: &mut Vec<String>,
) -> Layer {
    warnings.extend(notes.into_iter().map(|w| format!("{origin}: {w}")));
    Layer {
        origin,
        base_dir: None,
        value,
    }
}

/// A file's layer: `.toml` is a configuration or (with a section only torchtitan has) a
/// torchtitan job file, `.json` a configuration, a Hugging Face config.json (with
/// `model_type` or `architectures` at its top) or a DeepSpeed configuration (with
/// `zero_optimization` or a batch key), `.yaml` (or `.yml`) a Megatron-Bridge configuration
/// (parsim's own configurations are TOML or JSON), anything else a Megatron-LM launch script. A DeepSpeed
/// import comes back beside its layer: its batch is resolved once the layers are merged.
fn file_layer(
    path: &Path,
    flags: &Value,
    warnings: &mut Vec<String>,
) -> PyResult<(Layer, Option<deepspeed::DeepspeedImport>)> {
    let ext = path
        .extension()
        .map(|e| e.to_string_lossy().to_ascii_lowercase());
    let origin = path.display().to_string();
    match ext.as_deref() {
        Some("toml") => {
            let layer = Layer::from_file(path).map_err(config_error)?;
            if !is_torchtitan_job(&layer.value) {
                return Ok((layer, None));
            }
            let job = torchtitan::load(path, &[], &[], flags).map_err(|e| in_file(&origin, e))?;
            warnings.extend(job.notes.iter().map(|n| format!("{origin}: {n}")));
            Ok((job.layer, None))
        }
        Some("json") => {
            let layer = Layer::from_file(path).map_err(config_error)?;
            if is_hf_config(&layer.value) {
                let hf = json!({"model": {"hf_config": origin}});
                return Ok((Layer::overrides(hf), None));
            }
            if !is_deepspeed_config(&layer.value) {
                return Ok((layer, None));
            }
            let text = read_text(path, &origin)?;
            let imported = deepspeed::import(&text, &origin).map_err(|e| in_file(&origin, e))?;
            let layer = noted_layer(
                origin,
                imported.layer.clone(),
                imported.warnings(),
                warnings,
            );
            Ok((layer, Some(imported)))
        }
        Some("yaml" | "yml") => {
            let text = read_text(path, &origin)?;
            let imported = bridge::import(&text, &origin).map_err(|e| in_file(&origin, e))?;
            let notes = imported.warnings();
            Ok((noted_layer(origin, imported.layer, notes, warnings), None))
        }
        _ => {
            let origin = path.display().to_string();
            let text = std::fs::read_to_string(path).map_err(|e| {
                crate::errors::ConfigError::new_err(format!(
                    "reading Megatron arguments {origin}: {e}"
                ))
            })?;
            Ok((megatron_layer(&text, &origin, warnings)?, None))
        }
    }
}

/// True for a torchtitan job file: a top-level section of torchtitan's JobConfig that is not
/// one of parsim's (`[job]`, `[parallelism]`, `[activation_checkpoint]`, ...; both have
/// `[model]` and `[training]`).
fn is_torchtitan_job(v: &Value) -> bool {
    const PARSIM: [&str; 5] = ["model", "cluster", "parallel", "training", "run"];
    v.as_object().is_some_and(|top| {
        top.keys()
            .any(|k| !PARSIM.contains(&k.as_str()) && torchtitan::schema::is_section(k))
    })
}

/// True for a DeepSpeed configuration: its ZeRO section or one of its batch keys at the top
/// (none is a parsim section).
fn is_deepspeed_config(v: &Value) -> bool {
    [
        "zero_optimization",
        "train_batch_size",
        "train_micro_batch_size_per_gpu",
        "gradient_accumulation_steps",
    ]
    .iter()
    .any(|k| v.get(k).is_some())
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
