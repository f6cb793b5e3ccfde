//! Measurement files for `parsim calibrate --measurements FILE.jsonl`: one JSON object per
//! line, `{"config": {...a parsim configuration...}, "step_s": 1.23, "peak_bytes": 123,
//! "label": "optional", "holdout": false}`. The configuration is the same document as a
//! `--config` file (model preset or fields, cluster, parallel, training); `peak_bytes` is
//! optional. Lines that are empty or start with `#` are skipped. Every error names the line.
//! `ops` (optional) holds the op-class timings of the run's slowest rank, as
//! `execute --calibrate` writes them (docs/calibration.md, "Op timings"). `rendezvous_s`
//! (optional) is the host's seconds per synchronisation between two rank threads when the
//! run was made, which `execute --calibrate` measures beside its sweep.

use crate::config::{Config, ConfigError, Layer, Resolved};
use parsim_plan::op_timing::OpTiming;
use serde_json::Value;
use std::path::Path;

/// One measured run.
#[derive(Debug, Clone)]
pub struct Measurement {
    /// 1-based line in the file.
    pub line: usize,
    pub label: String,
    pub config: Config,
    pub step_s: f64,
    pub peak_bytes: Option<u64>,
    /// Forced into the held-out set.
    pub holdout: bool,
    /// The op-class timings of the slowest rank over the timed steps (empty: not profiled).
    pub ops: Vec<OpTiming>,
    /// Seconds per synchronisation between two rank threads on the host when the run was
    /// made (`parsim_executor::backend::cpu::rendezvous`: a member that arrives first sleeps
    /// and must be woken), which no op timing holds; `None`: not measured.
    pub rendezvous_s: Option<f64>,
}

impl Measurement {
    /// The configuration validated against `gpu` (the profile being fitted). Shared, not
    /// copied: a fit resolves every measurement under each trial profile.
    pub fn resolve(
        &self,
        gpu: &std::sync::Arc<crate::config::GpuProfile>,
    ) -> Result<Resolved, ConfigError> {
        Resolved::with_gpu(self.config.clone(), std::sync::Arc::clone(gpu))
    }
}

/// Why a measurement file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum MeasurementError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}:{line}: {message}")]
    Line {
        path: String,
        line: usize,
        message: String,
    },
    #[error("{path}: no measurements (every line is empty or a comment)")]
    Empty { path: String },
}

/// Lines whose `peak_bytes` exceed the memory of the GPU they name: no run can have measured
/// such a peak (a unit mistake, or a peak copied from a prediction), so the user is told
/// before they enter the fit. `origin` names the file.
pub fn peak_warnings(measurements: &[Measurement], origin: &str) -> Vec<String> {
    measurements
        .iter()
        .filter_map(|m| {
            let peak = m.peak_bytes?;
            let gpu = crate::config::GpuProfile::load(&m.config.cluster.gpu).ok()?;
            (peak > gpu.memory_bytes).then(|| {
                format!(
                    "{origin}:{}: `peak_bytes` = {peak} exceeds the memory of {} ({} bytes): not a peak a run can measure",
                    m.line, gpu.name, gpu.memory_bytes
                )
            })
        })
        .collect()
}

/// The fields a measurement line may hold.
const KNOWN_KEYS: [&str; 7] = [
    "config",
    "step_s",
    "peak_bytes",
    "label",
    "holdout",
    "ops",
    "rendezvous_s",
];

/// The shortest and longest measured step accepted, in seconds: outside them a fit divides
/// its way to infinity (a step of 1e-300 s) or the figure is not a step time.
const MIN_STEP_S: f64 = 1e-6;
const MAX_STEP_S: f64 = 1e7;

/// The longest synchronisation accepted, in seconds (as `tables.collective.rendezvous_s`):
/// a wake-up slower than a second is a deadlock timeout, not a rendezvous.
const MAX_RENDEZVOUS_S: f64 = 1.0;

/// A line's `ops`: an array of op timings, each checked ([`OpTiming::validate`]); errors name
/// the element and its field.
fn parse_ops(v: Option<&Value>) -> Result<Vec<OpTiming>, String> {
    let items = match v {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(a)) => a,
        Some(o) => return Err(format!("`ops` must be an array of op timings, got {o}")),
    };
    items
        .iter()
        .enumerate()
        .map(|(j, o)| {
            let t = <OpTiming as serde::Deserialize>::deserialize(o)
                .map_err(|e| format!("`ops[{j}]`: {e}"))?;
            t.validate().map_err(|e| format!("`ops[{j}]`: {e}"))?;
            Ok(t)
        })
        .collect()
}

/// Reads and checks a measurement file.
pub fn read(path: &Path) -> Result<Vec<Measurement>, MeasurementError> {
    let text = std::fs::read_to_string(path).map_err(|source| MeasurementError::Io {
        path: path.display().to_string(),
        source,
    })?;
    parse(&text, &path.display().to_string())
}

/// Parses measurement text; `origin` names it in errors.
pub fn parse(text: &str, origin: &str) -> Result<Vec<Measurement>, MeasurementError> {
    let mut out = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = i + 1;
        let t = raw.trim();
        if t.is_empty() || t.starts_with('#') {
            continue;
        }
        let err = |message: String| MeasurementError::Line {
            path: origin.to_string(),
            line,
            message,
        };
        serde_json::from_str::<crate::config::load::UniqueKeys>(t)
            .map_err(|e| err(format!("not JSON: {e}")))?;
        let v: Value = serde_json::from_str(t).map_err(|e| err(format!("not JSON: {e}")))?;
        let obj = v
            .as_object()
            .ok_or_else(|| err("expected a JSON object".into()))?;
        if let Some(k) = obj.keys().find(|k| !KNOWN_KEYS.contains(&k.as_str())) {
            return Err(err(format!(
                "unknown field `{k}` (known: {})",
                KNOWN_KEYS.join(", ")
            )));
        }
        let config = obj
            .get("config")
            .ok_or_else(|| err("missing field `config` (a parsim configuration object)".into()))?;
        if !config.is_object() {
            return Err(err("`config` must be an object".into()));
        }
        let step_s = obj
            .get("step_s")
            .ok_or_else(|| err("missing field `step_s` (measured seconds per step)".into()))?
            .as_f64()
            .ok_or_else(|| err("`step_s` must be a number".into()))?;
        if !(step_s.is_finite() && (MIN_STEP_S..=MAX_STEP_S).contains(&step_s)) {
            return Err(err(format!(
                "`step_s` must be a positive number of seconds in [{MIN_STEP_S:e}, {MAX_STEP_S:e}], got {step_s:?}"
            )));
        }
        let peak_bytes =
            match obj.get("peak_bytes") {
                None | Some(Value::Null) => None,
                Some(p) => Some(p.as_u64().filter(|&b| b > 0).ok_or_else(|| {
                    err(format!("`peak_bytes` must be a positive integer, got {p}"))
                })?),
            };
        let label = match obj.get("label") {
            None | Some(Value::Null) => format!("line {line}"),
            Some(l) => l
                .as_str()
                .ok_or_else(|| err(format!("`label` must be a string, got {l}")))?
                .to_string(),
        };
        let holdout = match obj.get("holdout") {
            None | Some(Value::Null) => false,
            Some(h) => h
                .as_bool()
                .ok_or_else(|| err(format!("`holdout` must be true or false, got {h}")))?,
        };
        let ops = parse_ops(obj.get("ops")).map_err(err)?;
        let rendezvous_s = match obj.get("rendezvous_s") {
            None | Some(Value::Null) => None,
            Some(r) => Some(
                r.as_f64()
                    .filter(|s| s.is_finite() && (0.0..=MAX_RENDEZVOUS_S).contains(s))
                    .ok_or_else(|| {
                        err(format!(
                            "`rendezvous_s` must be a number of seconds in [0, {MAX_RENDEZVOUS_S}], got {r}"
                        ))
                    })?,
            ),
        };
        let layer = Layer {
            origin: format!("{origin}:{line}"),
            base_dir: Path::new(origin).parent().map(Path::to_path_buf),
            value: serde_json::json!(config),
        };
        let config =
            Config::from_layers(&[layer]).map_err(|e| err(format!("configuration: {e}")))?;
        // Validate now so a bad configuration is reported with its line.
        Resolved::new(config.clone())
            .map_err(|e| err(format!("configuration does not validate: {e}")))?;
        out.push(Measurement {
            line,
            label,
            config,
            step_s,
            peak_bytes,
            holdout,
            ops,
            rendezvous_s,
        });
    }
    if out.is_empty() {
        return Err(MeasurementError::Empty {
            path: origin.to_string(),
        });
    }
    Ok(out)
}
