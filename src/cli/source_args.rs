//! Where a configuration comes from: a file, a model preset or Hugging Face config.json, and
//! the launches of other frameworks (a Megatron-LM script, a Megatron-Bridge YAML, a torchtitan
//! job file, a DeepSpeed JSON), each read into one override layer merged in that order under the flags.

use super::bridge_layer;
use super::deepspeed_layer;
use super::registry_help;
use anyhow::Context;
use clap::Args;
use parsim::config::megatron;
use parsim::config::torchtitan;
use parsim::config::{Config, Layer};
use serde_json::{json, Map, Value};
use std::io::Read;
use std::path::{Path, PathBuf};

/// Where the configuration starts from: a file, and the model from a preset or a Hugging Face
/// config.json. Shared by every subcommand that reads a configuration.
#[derive(Debug, Clone, Default, Args)]
pub struct SourceArgs {
    /// Configuration file (TOML, or JSON by extension); flags override it.
    #[arg(long, short = 'c', value_name = "FILE")]
    pub config: Option<PathBuf>,
    #[arg(long, value_name = "PRESET", conflicts_with = "model_config", help = registry_help::model())]
    pub model: Option<String>,
    /// A Hugging Face config.json to import the model from.
    #[arg(long, value_name = "HF_CONFIG_JSON")]
    pub model_config: Option<PathBuf>,
    /// A Megatron-LM (or NeMo Megatron) launch script or argument list, `-` for stdin: its
    /// model, parallel and training flags apply over --config, and the flags given here over
    /// it. Flags with no counterpart are named in a warning.
    #[arg(long, value_name = "FILE|-")]
    pub megatron_args: Option<PathBuf>,
    /// A Megatron-Bridge configuration (the YAML `ConfigContainer.to_yaml()` writes, a run's
    /// run_config.yaml): applies over --config and --megatron-args, flags over it; fields
    /// parsim cannot model are refused by name.
    #[arg(long, value_name = "BRIDGE_YAML")]
    pub bridge_config: Option<PathBuf>,
    /// A torchtitan job file (TOML JobConfig): applies over --config, flags over it; what
    /// parsim cannot model is refused by name.
    #[arg(long, value_name = "JOB_TOML")]
    pub torchtitan_config: Option<PathBuf>,
    /// A torchtitan launch override `--section.field value`, written section.field=value,
    /// over --torchtitan-config in order; repeatable.
    #[arg(
        long = "torchtitan-override",
        visible_alias = "tt",
        value_name = "SECTION.FIELD=VALUE",
        requires = "torchtitan_config",
        allow_hyphen_values = true
    )]
    pub torchtitan_overrides: Vec<String>,
    /// A DeepSpeed configuration (the JSON given to `deepspeed.initialize`): its ZeRO stage,
    /// precision, batch and ZeRO buckets apply over --config and --megatron-args, and the flags
    /// given here over it. Keys parsim cannot model are refused by name.
    #[arg(long, value_name = "DS_CONFIG_JSON")]
    pub deepspeed_config: Option<PathBuf>,
}

impl SourceArgs {
    /// Adds the model source to the override layer `m`.
    pub(super) fn put_overrides(&self, m: &mut Map<String, Value>) {
        put(m, "model", "preset", self.model.clone());
        put(
            m,
            "model",
            "hf_config",
            self.model_config.as_ref().map(|p| p.display().to_string()),
        );
    }

    /// The configuration file's layer (none without a file) under the override layer
    /// `overrides`, merged.
    pub fn load_with(&self, overrides: Value) -> anyhow::Result<Config> {
        let mut warnings = Vec::new();
        let cfg = self.load_noting(overrides, &mut warnings);
        for w in warnings {
            eprintln!("warning: {w}");
        }
        cfg
    }

    /// [`SourceArgs::load_with`], its warnings added to `warnings` instead of printed.
    pub fn load_noting(
        &self,
        overrides: Value,
        warnings: &mut Vec<String>,
    ) -> anyhow::Result<Config> {
        let mut layers = Vec::new();
        if let Some(path) = &self.config {
            layers.push(Layer::from_file(path)?);
        }
        if let Some(path) = &self.megatron_args {
            layers.push(megatron_layer(path, warnings)?);
        }
        if let Some(path) = &self.bridge_config {
            layers.push(bridge_layer::read(path, warnings)?);
        }
        if let Some(path) = &self.torchtitan_config {
            let tt = torchtitan::load(path, &self.torchtitan_overrides, &layers, &overrides)?;
            warnings.extend(tt.notes.iter().map(|n| format!("{}: {n}", path.display())));
            layers.push(tt.layer);
        }
        let deepspeed = match &self.deepspeed_config {
            Some(path) => Some(deepspeed_layer::read(path, &mut layers, warnings)?),
            None => None,
        };
        layers.push(Layer::overrides(overrides));
        let mut cfg = Config::from_layers(&layers)?;
        if let Some((imported, at)) = deepspeed {
            // The batch needs the data-parallel size of the merged configuration.
            let batch = imported
                .batch_layer(&cfg)
                .map_err(|e| deepspeed_layer::in_file(&at, e))?;
            if let Some((value, note)) = batch {
                warnings.push(format!("{at}: {note}"));
                let layer = Layer {
                    origin: at,
                    base_dir: None,
                    value,
                };
                layers.insert(layers.len() - 1, layer);
                cfg = Config::from_layers(&layers)?;
            }
        }
        warnings.extend(self.dropped_model(&layers[..layers.len() - 1]));
        Ok(cfg)
    }

    /// The model fields of the files that `--model` or `--model-config` replaces, named
    /// (they were silently discarded before).
    fn dropped_model(&self, files: &[Layer]) -> Vec<String> {
        let flag = match (&self.model, &self.model_config) {
            (Some(_), _) => "--model",
            (None, Some(_)) => "--model-config",
            (None, None) => return Vec::new(),
        };
        files
            .iter()
            .filter_map(|layer| {
                let model = layer.value.get("model")?.as_object()?;
                let dropped: Vec<&str> = model
                    .keys()
                    .map(String::as_str)
                    .filter(|k| !matches!(*k, "preset" | "hf_config"))
                    .collect();
                (!model.is_empty()).then(|| {
                    format!(
                        "{flag} replaces the model of {}: its [model] fields{} are ignored",
                        layer.origin,
                        if dropped.is_empty() {
                            String::new()
                        } else {
                            format!(" ({})", dropped.join(", "))
                        }
                    )
                })
            })
            .collect()
    }
}

/// The override layer of a Megatron-LM launch (`-` reads stdin); what did not carry over is
/// added to `warnings`.
fn megatron_layer(path: &Path, warnings: &mut Vec<String>) -> anyhow::Result<Layer> {
    let (text, origin) = if path.as_os_str() == "-" {
        let mut text = String::new();
        std::io::stdin()
            .read_to_string(&mut text)
            .context("reading Megatron arguments from stdin")?;
        (text, "Megatron arguments (stdin)".to_string())
    } else {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading Megatron arguments {}", path.display()))?;
        (text, path.display().to_string())
    };
    let imported = megatron::import(&text, &origin)?;
    for warning in imported.warnings() {
        warnings.push(format!("{origin}: {warning}"));
    }
    Ok(Layer {
        origin,
        base_dir: None,
        value: imported.layer,
    })
}

impl SourceArgs {
    /// True when the configuration file sets tp, cp, pp or dp.
    pub(super) fn file_sets_degrees(&self) -> anyhow::Result<bool> {
        let Some(path) = &self.config else {
            return Ok(false);
        };
        let layer = Layer::from_file(path)?;
        let parallel = &layer.value["parallel"];
        Ok(["tp", "cp", "pp", "dp"]
            .iter()
            .any(|k| parallel.get(k).is_some()))
    }
}

/// Sets `section.key` of the override layer `map` to `v` where given.
pub(super) fn put<T: serde::Serialize>(
    map: &mut Map<String, Value>,
    section: &str,
    key: &str,
    v: Option<T>,
) {
    if let Some(v) = v {
        let sec = map.entry(section).or_insert_with(|| json!({}));
        sec[key] = serde_json::to_value(v).expect("flag value serializes");
    }
}
