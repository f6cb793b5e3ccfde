//! torchtitan job import: a TOML job file (torchtitan's `JobConfig`, read by
//! torchtitan/config/manager.py until its February 2026 move to a Python config registry)
//! and the `--section.field value` overrides its launch scripts pass become one override
//! layer shaped like a configuration file, merged like a Megatron-LM launch (over `--config`,
//! under the flags).
//!
//! The job describes the whole run under torch FSDP2 (`training.framework = "fsdp"`), so the
//! layer carries torchtitan's defaults for what the file leaves out. Every field is one of
//! torchtitan's (src/config/torchtitan/schema.rs); what changes memory or time is mapped, or
//! accepted only at a value parsim models and refused by name otherwise; what changes neither
//! is listed in one note. Unknown sections and keys are refused by name.

mod job;
mod parallelism;
mod pipeline;
pub mod schema;
mod training;

/// Why a torchtitan job could not be imported: each error names the job's TOML path (or the
/// override) and the rule.
pub type TorchtitanError = super::import::ImportError;
pub use parallelism::DDP_BUCKET_PARAMS;
pub use training::FLAVORS;

use crate::config::megatron::put;
use crate::config::{ClusterConfig, ConfigError, Layer};
use job::Job;
use schema::Effect;
use serde_json::{json, Map, Value};
use std::path::Path;

/// A job file read from disk as a layer, with the notes to show.
#[derive(Debug, Clone)]
pub struct LoadedJob {
    pub layer: Layer,
    pub notes: Vec<String>,
}

/// Reads the job file at `path` with `overrides` into a layer placed over `earlier` layers
/// and under `flags` (the command line's layer): the GPU count that
/// `data_parallel_shard_degree = -1` divides is the flags' `cluster.num_gpus`, else the last
/// earlier layer's, else the default cluster's.
pub fn load(
    path: &Path,
    overrides: &[String],
    earlier: &[Layer],
    flags: &Value,
) -> Result<LoadedJob, TorchtitanError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
        path: path.display().to_string(),
        source,
    })?;
    let world = std::iter::once(flags)
        .chain(earlier.iter().rev().map(|l| &l.value))
        .find_map(|v| v["cluster"]["num_gpus"].as_u64())
        .and_then(|n| u32::try_from(n).ok())
        .unwrap_or(ClusterConfig::default().num_gpus);
    let origin = path.display().to_string();
    let imported = import(&text, &origin, overrides, world)?;
    Ok(LoadedJob {
        layer: Layer {
            origin,
            base_dir: None,
            value: imported.layer,
        },
        notes: imported.notes,
    })
}

/// The result of reading a job: the override layer and what the reader noted.
#[derive(Debug, Clone, PartialEq)]
pub struct TorchtitanImport {
    /// An override layer (`{"model": {...}, "parallel": {...}, ...}`).
    pub layer: Value,
    /// One sentence each: values derived, fields read as notes, fields with no effect.
    pub notes: Vec<String>,
}

/// Reads the job file `text` (named `origin` in errors) with `overrides`
/// (`section.field=value`, applied over the file in order) for a cluster of `world` GPUs
/// (the GPU count `data_parallel_shard_degree = -1` takes what is left of).
pub fn import(
    text: &str,
    origin: &str,
    overrides: &[String],
    world: u32,
) -> Result<TorchtitanImport, TorchtitanError> {
    let job = Job::read(text, origin, overrides)?;
    check_unmodelled(&job)?;
    let mut out = Out::default();
    put(&mut out.layer, "training", "framework", json!("fsdp"));
    let preset = training::preset(&job)?;
    put(&mut out.layer, "model", "preset", json!(preset));
    let layers = crate::config::presets::preset(preset).map_or(0, |m| m.num_layers);
    let d = parallelism::degrees(&job, world)?;
    parallelism::put_parallel(&job, &d, &mut out)?;
    pipeline::put_pipeline(&job, &d, layers, &mut out)?;
    let global = parallelism::put_batch(&job, &d, &mut out)?;
    let seq = match job.int("training.seq_len") {
        Some(s) if s >= 1 => s as u64,
        _ => return Err(job.invalid("training.seq_len", "must be 1 or more")),
    };
    put(&mut out.layer, "training", "seq_length", json!(seq));
    training::put_precision(&job, &d, &mut out)?;
    training::put_recompute(&job, &mut out)?;
    let step_tokens = global
        .checked_mul(seq)
        .ok_or_else(|| job.invalid("training.seq_len", "batch x sequence overflows"))?;
    training::put_run(&job, step_tokens, &mut out)?;
    out.notes.extend(compile_note(&job));
    out.notes.extend(no_effect_note(&job));
    Ok(TorchtitanImport {
        layer: Value::Object(out.layer),
        notes: out.notes,
    })
}

/// What an import writes: the override layer and its notes.
#[derive(Debug, Default)]
pub struct Out {
    pub layer: Map<String, Value>,
    pub notes: Vec<String>,
}

/// Refuses every field the job sets that parsim does not model at a value other than
/// torchtitan's default.
fn check_unmodelled(job: &Job) -> Result<(), TorchtitanError> {
    for path in job.set_paths() {
        let Some(f) = schema::field(path) else {
            continue;
        };
        if let Effect::Unmodelled(reason) = f.effect {
            let default: Value = serde_json::from_str(f.default).unwrap_or(Value::Null);
            let value = job.get(path);
            let same = value == default
                || (default.is_null() && value.as_str().is_some_and(str::is_empty));
            if !same {
                return Err(job.unmodelled(path, reason));
            }
        }
    }
    Ok(())
}

/// torch.compile, read as a note: the step is timed with parsim's kernel model.
fn compile_note(job: &Job) -> Option<String> {
    job.flag("compile.enable").then(|| {
        format!(
            "compile.enable = true (components {}): torch.compile's fusions are not modelled; the step is timed with parsim's kernel model",
            job.list("compile.components").join(", ")
        )
    })
}

/// The fields the job sets that change neither memory nor time, in one note.
fn no_effect_note(job: &Job) -> Option<String> {
    let names: Vec<&str> = job
        .set_paths()
        .filter(|p| schema::field(p).is_some_and(|f| f.effect == Effect::NoEffect))
        .collect();
    (!names.is_empty()).then(|| {
        format!(
            "accepted with no effect on memory or step time: {}",
            names.join(", ")
        )
    })
}
