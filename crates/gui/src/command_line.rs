//! The `parsim estimate` command line that reproduces the current view.
//!
//! Flags mirror `src/cli/config_args.rs`. Each flag is built together with the override it
//! stands for, and the overrides are merged the way the CLI merges them
//! (`Config::from_layers`); only when that gives back exactly the configuration on screen are
//! the flags offered. A model that is no preset (edited layers, heads, ...) has no flags, so
//! then the command names a saved configuration file instead.

use crate::views::config_panel::preset_of;
use parsim::config::presets::preset;
use parsim::config::{Config, Framework, Layer, ModelConfig, ParallelConfig, TrainingConfig};
use parsim::report::format::shell_quote as quote;
use serde_json::{json, Map, Value};

/// A command line and, when it needs one, what to do first.
#[derive(Debug, Clone, PartialEq)]
pub struct CommandLine {
    pub text: String,
    /// Set when the command reads a file that must be saved first.
    pub note: Option<String>,
}

/// Flags and the override document they stand for, built side by side.
#[derive(Default)]
struct Flags {
    args: Vec<String>,
    doc: Map<String, Value>,
}

impl Flags {
    fn set(&mut self, section: &str, key: &str, v: Value) {
        let sec = self.doc.entry(section).or_insert_with(|| json!({}));
        sec[key] = v;
    }

    /// `--flag value` for `section.key`.
    fn value(&mut self, flag: &str, section: &str, key: &str, v: impl serde::Serialize + ToString) {
        self.args
            .push(format!("--{flag} {}", quote(&v.to_string())));
        self.set(
            section,
            key,
            serde_json::to_value(&v).unwrap_or(Value::Null),
        );
    }

    /// A bare switch setting `section.key` to `v`.
    fn switch(&mut self, flag: &str, section: &str, key: &str, v: bool) {
        self.args.push(format!("--{flag}"));
        self.set(section, key, Value::Bool(v));
    }
}

/// The flags for `c` (preset model assumed) and their override document.
fn flags(c: &Config, model: &str) -> Flags {
    let d = Config::default();
    let mut f = Flags::default();
    let (m, p, t, k) = (&c.model, &c.parallel, &c.training, &c.cluster);
    f.value("model", "model", "preset", model);
    f.value("gpu", "cluster", "gpu", &k.gpu);
    f.value("gpus", "cluster", "num_gpus", k.num_gpus);
    if let Some(n) = k
        .gpus_per_node
        .filter(|_| k.gpus_per_node != d.cluster.gpus_per_node)
    {
        f.value("gpus-per-node", "cluster", "gpus_per_node", n);
    }
    if let Some(d) = k.nvlink_domain_size {
        f.value("nvlink-domain-size", "cluster", "nvlink_domain_size", d);
    }
    f.parallel(p, &d.parallel);
    f.overlaps(p, t.framework);
    f.training(t, &d.training);
    f.model_fields(m, model);
    if let Some(n) = c.run.train_tokens {
        f.value("train-tokens", "run", "train_tokens", n);
    }
    if let Some(p) = c.run.price_per_gpu_hour_usd {
        f.value("gpu-hour-price", "run", "price_per_gpu_hour_usd", p);
    }
    f
}

impl Flags {
    /// The parallel layout's flags, where they differ from the defaults `d` (tp and pp always).
    fn parallel(&mut self, p: &ParallelConfig, d: &ParallelConfig) {
        self.value("tp", "parallel", "tp", p.tp);
        if p.sp != d.sp {
            if p.sp {
                self.switch("sp", "parallel", "sp", true);
            } else {
                self.switch("no-sp", "parallel", "sp", false);
            }
        }
        if p.cp != d.cp {
            self.value("cp", "parallel", "cp", p.cp);
        }
        if p.cp_comm != d.cp_comm {
            self.value("cp-comm", "parallel", "cp_comm", p.cp_comm);
        }
        self.value("pp", "parallel", "pp", p.pp);
        if p.vpp != d.vpp {
            self.value("vpp", "parallel", "vpp", p.vpp);
        }
        if p.schedule != d.schedule {
            self.value("schedule", "parallel", "schedule", p.schedule);
        }
        if p.ep != d.ep {
            self.value("ep", "parallel", "ep", p.ep);
        }
        if let Some(v) = p.expert_tp {
            self.value("expert-tp", "parallel", "expert_tp", v);
        }
        if p.zero != d.zero {
            self.value("zero", "parallel", "zero", p.zero);
        }
        if let Some(f) = p.fsdp {
            self.value("fsdp", "parallel", "fsdp", f.name());
        }
        if let Some(v) = p.dp {
            self.value("dp", "parallel", "dp", v);
        }
        if p.order != d.order {
            self.value("order", "parallel", "order", &p.order);
        }
        if let Some(v) = p.first_stage_layers {
            self.value("first-stage-layers", "parallel", "first_stage_layers", v);
        }
        if let Some(v) = p.last_stage_layers {
            self.value("last-stage-layers", "parallel", "last_stage_layers", v);
        }
        if let Some(v) = &p.pipeline_layout {
            self.value("pipeline-layout", "parallel", "pipeline_layout", v);
        }
        if p.account_for_embedding_in_pipeline_split {
            self.switch(
                "account-for-embedding-in-pipeline-split",
                "parallel",
                "account_for_embedding_in_pipeline_split",
                true,
            );
        }
        if p.account_for_loss_in_pipeline_split {
            self.switch(
                "account-for-loss-in-pipeline-split",
                "parallel",
                "account_for_loss_in_pipeline_split",
                true,
            );
        }
        if p.tp_comm_overlap {
            self.switch("tp-comm-overlap", "parallel", "tp_comm_overlap", true);
        }
    }

    /// The overlap switches, where they differ from `framework`'s defaults, and the
    /// overlap-related sizes.
    fn overlaps(&mut self, p: &ParallelConfig, framework: Framework) {
        // The overlap switches are written where they differ from the framework's defaults.
        let fw = framework.overlap_defaults(p.zero);
        if p.overlap_grad_reduce != fw.overlap_grad_reduce {
            let flag = if p.overlap_grad_reduce {
                "overlap-grad-reduce"
            } else {
                "no-overlap-grad-reduce"
            };
            self.switch(
                flag,
                "parallel",
                "overlap_grad_reduce",
                p.overlap_grad_reduce,
            );
        }
        if p.overlap_param_gather != fw.overlap_param_gather {
            let flag = if p.overlap_param_gather {
                "overlap-param-gather"
            } else {
                "no-overlap-param-gather"
            };
            self.switch(
                flag,
                "parallel",
                "overlap_param_gather",
                p.overlap_param_gather,
            );
        }
        if let Some(v) = p.zero3_prefetch_params {
            self.value(
                "zero3-prefetch-params",
                "parallel",
                "zero3_prefetch_params",
                v,
            );
        }
        if !p.cp_comm_overlap {
            self.switch("no-cp-comm-overlap", "parallel", "cp_comm_overlap", false);
        }
        if let Some(v) = p.ddp_bucket_size {
            self.value("ddp-bucket-size", "parallel", "ddp_bucket_size", v);
        }
        if let Some(v) = p.pp_p2p {
            self.value("pp-p2p", "parallel", "pp_p2p", v);
        }
    }

    /// The training flags, where they differ from the defaults `d` (micro and global batch
    /// always).
    fn training(&mut self, t: &TrainingConfig, d: &TrainingConfig) {
        if t.framework != d.framework {
            self.value("framework", "training", "framework", t.framework.name());
        }
        if t.seq_length != d.seq_length {
            self.value("seq", "training", "seq_length", t.seq_length);
        }
        self.value("mbs", "training", "micro_batch_size", t.micro_batch_size);
        self.value("gbs", "training", "global_batch_size", t.global_batch_size);
        if t.precision != d.precision {
            self.value("precision", "training", "precision", t.precision);
        }
        if t.grad_dtype != d.grad_dtype {
            self.value("grad-dtype", "training", "grad_dtype", t.grad_dtype);
        }
        if !t.master_weights {
            self.switch("no-master-weights", "training", "master_weights", false);
        }
        if let Some(dtype) = t.optimizer_state_dtype {
            self.value(
                "optimizer-state-dtype",
                "training",
                "optimizer_state_dtype",
                dtype,
            );
        }
        if t.recompute != d.recompute {
            self.value("recompute", "training", "recompute", t.recompute);
        }
        if t.flash_attention != d.flash_attention {
            self.value(
                "flash-attention",
                "training",
                "flash_attention",
                t.flash_attention,
            );
        }
        if t.flops_attention != d.flops_attention {
            self.value(
                "flops-attention",
                "training",
                "flops_attention",
                t.flops_attention,
            );
        }
        if t.mode != d.mode {
            self.value("mode", "training", "mode", t.mode);
        }
        if t.lora.rank != d.lora.rank {
            self.args.push(format!("--lora-rank {}", t.lora.rank));
            self.set("training", "lora", json!({ "rank": t.lora.rank }));
        }
    }

    /// The model fields that have flags, where they differ from preset `model`'s.
    fn model_fields(&mut self, m: &ModelConfig, model: &str) {
        if let Some(base) = preset(model) {
            if m.make_vocab_size_divisible_by != base.make_vocab_size_divisible_by {
                self.value(
                    "make-vocab-size-divisible-by",
                    "model",
                    "make_vocab_size_divisible_by",
                    m.make_vocab_size_divisible_by,
                );
            }
            if m.activation != base.activation {
                self.value("activation", "model", "activation", m.activation);
            }
            if m.moe_load_imbalance != base.moe_load_imbalance {
                self.value(
                    "moe-load-imbalance",
                    "model",
                    "moe_load_imbalance",
                    m.moe_load_imbalance,
                );
            }
            if m.mtp_num_layers != base.mtp_num_layers {
                self.value("mtp-layers", "model", "mtp_num_layers", m.mtp_num_layers);
            }
        }
    }
}

/// The preset a model comes from once the fields that have flags are set back to the
/// preset's own values.
fn flag_preset(c: &Config) -> Option<&'static str> {
    parsim::config::presets::PRESET_NAMES
        .iter()
        .copied()
        .find(|&n| {
            let Some(base) = preset(n) else { return false };
            let mut m = c.model.clone();
            m.make_vocab_size_divisible_by = base.make_vocab_size_divisible_by;
            m.activation = base.activation;
            m.moe_load_imbalance = base.moe_load_imbalance;
            m.mtp_num_layers = base.mtp_num_layers;
            m == base
        })
}

/// The `parsim estimate` command for `config`. `saved` is the file the configuration was last
/// saved to or opened from, if it still holds exactly this configuration.
pub fn command_line(config: &Config, saved: Option<&str>) -> CommandLine {
    if let Some(model) = preset_of(config).or_else(|| flag_preset(config)) {
        let f = flags(config, model);
        let back = Config::from_layers(&[Layer::overrides(Value::Object(f.doc))]);
        if back.as_ref().ok() == Some(config) {
            return CommandLine {
                text: format!("parsim estimate {}", f.args.join(" ")),
                note: None,
            };
        }
    }
    match saved {
        Some(path) => CommandLine {
            text: format!("parsim estimate --config {}", quote(path)),
            note: None,
        },
        None => CommandLine {
            text: "parsim estimate --config parsim-gui.toml".into(),
            note: Some(
                "this model has no command-line flags: save the configuration as parsim-gui.toml first (File > Save as…)"
                    .into(),
            ),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::default_config;

    #[test]
    fn defaults_give_flags_that_rebuild_the_configuration() {
        let c = command_line(&default_config(), None);
        assert_eq!(c.note, None);
        assert!(c.text.starts_with("parsim estimate --model llama3-8b"));
        for flag in [
            "--tp 2",
            "--pp 4",
            "--vpp 2",
            "--schedule interleaved-1f1b",
            "--gbs 8",
            "--gpus 8",
        ] {
            assert!(c.text.contains(flag), "{flag} missing from {}", c.text);
        }
    }

    #[test]
    fn switches_and_model_flags() {
        let mut cfg = default_config();
        cfg.parallel.sp = false;
        cfg.parallel.overlap_grad_reduce = false;
        cfg.model.mtp_num_layers = 1;
        cfg.training.recompute = parsim::config::Recompute::Full;
        let c = command_line(&cfg, None);
        assert_eq!(c.note, None, "{}", c.text);
        for flag in [
            "--no-sp",
            "--no-overlap-grad-reduce",
            "--mtp-layers 1",
            "--recompute full",
        ] {
            assert!(c.text.contains(flag), "{flag} missing from {}", c.text);
        }
    }

    #[test]
    fn a_token_budget_and_price_are_flags() {
        let mut c = default_config();
        c.run.train_tokens = Some(2_000_000_000_000);
        c.run.price_per_gpu_hour_usd = Some(2.5);
        let line = command_line(&c, None);
        assert!(line.note.is_none(), "{line:?}");
        assert!(line
            .text
            .contains("--train-tokens 2000000000000 --gpu-hour-price 2.5"));
    }

    #[test]
    fn an_edited_model_needs_a_file() {
        let mut cfg = default_config();
        cfg.model.num_layers = 16;
        let c = command_line(&cfg, None);
        assert!(c.note.is_some());
        assert_eq!(
            command_line(&cfg, Some("my run.toml")).text,
            "parsim estimate --config 'my run.toml'"
        );
    }
}
