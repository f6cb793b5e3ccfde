//! Configuration: model, cluster, parallel mix and training settings (serde), presets,
//! Hugging Face `config.json` import, GPU profiles and validation.
//!
//! Loading is layered: built-in defaults, then a model base (preset or HF config), then the
//! file, then command-line overrides; the merged document is deserialized once, so type errors
//! name the field. [`Config::resolve`] validates the result into a [`Resolved`] configuration.

pub mod bridge;
mod cluster;
pub mod deepspeed;
mod enums;
mod error;
mod framework;
mod fsdp;
mod gpu;
pub mod hf;
pub mod import;
pub mod load;
pub mod megatron;
mod model;
mod parallel;
pub mod presets;
pub mod registry;
mod resolve;
pub(crate) mod rules;
mod run;
mod runtime_memory;
pub mod tables;
pub mod torchtitan;
mod training;

pub use cluster::{ClusterConfig, DomainRule, NvlinkDomain};
pub use enums::*;
pub use error::{ConfigError, Violation};
pub use framework::{
    zero3_exposed_s, Framework, OverlapDefaults, DEEPSPEED_MAX_LIVE_PARAMS,
    DEEPSPEED_PERSISTENCE_THRESHOLD, DEEPSPEED_PREFETCH_BUCKET, DEEPSPEED_REDUCE_BUCKET,
};
pub use fsdp::{held_zero, syncs_once_per_step, Fsdp};
pub use gpu::{
    Efficiency, Evidence, GemmShape, GpuPower, GpuProfile, Link, Links, NcclArch, PeakFlops,
    CALIBRATE_PROVENANCE, DEFAULT_GPUS_PER_NODE,
};
pub use model::{
    AttentionSpan, HybridLayer, LayerKind, MambaConfig, MlaConfig, ModelConfig, MAX_LAYER_VARIANTS,
};
pub use parallel::ParallelConfig;
pub use registry::Registry;
pub use resolve::{PipelinePlacement, Resolved};
pub use rules::check_base;
pub use rules::pipeline_layout;
pub use run::{parse_token_count, RunConfig, TokenCountError};
pub use runtime_memory::RuntimeMemory;
pub use tables::RateTables;
pub use training::{LoraConfig, TrainingConfig};

use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::path::{Path, PathBuf};

/// A whole configuration. Every field has a default: Llama-3-8B, seq 8192, 8 x H100 SXM,
/// TP 2 with SP, DP 4, ZeRO-1, micro batch 1, global batch 64, selective recompute.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub model: ModelConfig,
    #[serde(default)]
    pub cluster: ClusterConfig,
    #[serde(default)]
    pub parallel: ParallelConfig,
    #[serde(default)]
    pub training: TrainingConfig,
    /// Whole-run settings (tokens, price, power, failures); left out when none is set.
    #[serde(default, skip_serializing_if = "RunConfig::is_empty")]
    pub run: RunConfig,
}

/// One layer of configuration input: a document and where it came from.
#[derive(Debug, Clone)]
pub struct Layer {
    /// Shown in errors (a file path, or "command line").
    pub origin: String,
    /// Directory that relative paths in the document (e.g. `model.hf_config`) are relative to.
    pub base_dir: Option<PathBuf>,
    pub value: Value,
}

impl Layer {
    /// A layer read from a TOML or JSON file.
    pub fn from_file(path: &Path) -> Result<Layer, ConfigError> {
        Ok(Layer {
            origin: path.display().to_string(),
            base_dir: path.parent().map(Path::to_path_buf),
            value: load::parse_document_file(path)?,
        })
    }

    /// A layer of command-line overrides (an object shaped like the file).
    pub fn overrides(value: Value) -> Layer {
        Layer {
            origin: "command line".into(),
            base_dir: None,
            value,
        }
    }
}

/// Where the model's base shape comes from.
enum ModelBase {
    Preset(String),
    HfConfig(PathBuf),
}

/// The overlap defaults of the framework `merged` names, as a layer to merge under the user's
/// (`None` when the value is not a string: deserialization then names the field).
fn framework_defaults(merged: &Value) -> Result<Option<Value>, ConfigError> {
    let Some(name) = merged
        .get("training")
        .and_then(|t| t.get("framework"))
        .and_then(Value::as_str)
    else {
        return Ok(None);
    };
    let framework = Framework::parse(name).ok_or_else(|| ConfigError::UnknownName {
        field: "training.framework",
        value: name.to_string(),
        known: "megatron-core, nemo, deepspeed, fsdp".into(),
        hint: "nemo runs Megatron-Core",
    })?;
    let zero = merged
        .get("parallel")
        .and_then(|p| p.get("zero"))
        .and_then(Value::as_u64)
        .unwrap_or(1)
        .min(3) as u8;
    let d = framework.overlap_defaults(zero);
    Ok(Some(serde_json::json!({"parallel": {
        "tp_comm_overlap": d.tp_comm_overlap,
        "overlap_grad_reduce": d.overlap_grad_reduce,
        "overlap_param_gather": d.overlap_param_gather,
    }})))
}

impl Config {
    /// Merges layers over the defaults. A layer whose `[model]` names `preset` or `hf_config`
    /// restarts the model from that base: model fields of earlier layers are dropped, its own
    /// and later layers' model fields apply on top.
    pub fn from_layers(layers: &[Layer]) -> Result<Config, ConfigError> {
        let mut base: Option<ModelBase> = None;
        let mut start = 0;
        for (i, layer) in layers.iter().enumerate() {
            let Some(model) = layer.value.get("model") else {
                continue;
            };
            if let Some(p) = model.get("preset") {
                let name = p.as_str().ok_or_else(|| ConfigError::Field {
                    origin: layer.origin.clone(),
                    field: "model.preset".into(),
                    message: "must be a string".into(),
                })?;
                base = Some(ModelBase::Preset(name.to_string()));
                start = i;
            }
            if let Some(p) = model.get("hf_config") {
                let path = p.as_str().ok_or_else(|| ConfigError::Field {
                    origin: layer.origin.clone(),
                    field: "model.hf_config".into(),
                    message: "must be a path string".into(),
                })?;
                let path = match &layer.base_dir {
                    Some(dir) if Path::new(path).is_relative() => dir.join(path),
                    _ => PathBuf::from(path),
                };
                base = Some(ModelBase::HfConfig(path));
                start = i;
            }
        }
        let model = match base {
            None => ModelConfig::default(),
            Some(ModelBase::Preset(name)) => {
                presets::preset(&name).ok_or_else(|| ConfigError::UnknownName {
                    field: "model.preset",
                    value: name,
                    known: presets::PRESET_NAMES.join(", "),
                    hint: "or give the model's fields, or --model-config HF_CONFIG_JSON",
                })?
            }
            Some(ModelBase::HfConfig(path)) => hf::import_file(&path)?,
        };
        let defaults = Config {
            model,
            ..Config::default()
        };
        let base = serde_json::to_value(&defaults).expect("config serializes");
        let overlay = |mut merged: Value| {
            for (i, layer) in layers.iter().enumerate() {
                let mut v = layer.value.clone();
                if let Some(obj) = v.as_object_mut() {
                    if i < start {
                        obj.remove("model");
                    } else if let Some(Value::Object(m)) = obj.get_mut("model") {
                        m.remove("preset");
                        m.remove("hf_config");
                    }
                }
                load::merge(&mut merged, v);
            }
            merged
        };
        // The framework's overlap defaults sit under the user's layers: merge once to learn
        // the framework and ZeRO stage, then again over defaults that carry them.
        let first = overlay(base.clone());
        let merged = match framework_defaults(&first)? {
            None => first,
            Some(d) => {
                let mut base = base;
                load::merge(&mut base, d);
                overlay(base)
            }
        };
        let origin = layers
            .iter()
            .map(|l| l.origin.as_str())
            .collect::<Vec<_>>()
            .join(" + ");
        let origin = if origin.is_empty() {
            "defaults".to_string()
        } else {
            origin
        };
        load::from_value(merged, &origin)
    }

    /// Fills in what the GPU profile gives by default: `cluster.gpus_per_node` (4 on a
    /// GB200/GB300 tray, 8 on an HGX board) where the configuration leaves it out.
    pub fn fill_profile_defaults(&mut self, gpu: &GpuProfile) {
        self.cluster.gpus_per_node = Some(self.cluster.gpus_per_node_on(gpu));
    }

    /// This configuration with its profile's defaults filled in ([`Config::fill_profile_defaults`]),
    /// the profile loaded by `cluster.gpu`.
    pub fn with_profile_defaults(mut self) -> Result<Config, ConfigError> {
        let gpu = GpuProfile::load(&self.cluster.gpu)?;
        self.fill_profile_defaults(&gpu);
        Ok(self)
    }

    /// The overlap switches of this configuration's framework at its ZeRO stage, for callers
    /// that change `training.framework` in place (the GUI).
    pub fn apply_framework_defaults(&mut self) {
        self.training.framework.apply_defaults(&mut self.parallel);
    }

    /// Serializes as TOML (the CLI's file format).
    pub fn to_toml(&self) -> String {
        toml::to_string(self).expect("config serializes to TOML")
    }
}
