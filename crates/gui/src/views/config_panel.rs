//! The configuration panel: Model, Training, Parallelism and Cluster, each control with the
//! engine's violations for its field right under it.
//!
//! Parallel degrees are drop-downs of the values that can be valid given the others (divisors
//! of the GPUs left, of the heads, of the layers); sizes that must be multiples (global batch,
//! GPU count, sequence length) snap to their step. Model shapes are free: the engine says what
//! is wrong with them.

use super::controls::{choice, divisors, errors, label, row, stepped, with_current};
use crate::fields;
use crate::state::{vpp_for, Problems};
use egui::{CollapsingHeader, DragValue, RichText, Ui};
use parsim::config::presets::{preset, PRESET_NAMES};
use parsim::config::{Config, CpComm, Framework, GpuProfile, Precision, Recompute, ScheduleKind};

/// Upper bounds of the free sizes: far beyond any real model, small enough that the engine's
/// integer arithmetic cannot overflow.
const MAX_LAYERS: u64 = 1024;
const MAX_HIDDEN: u64 = 1 << 18;
const MAX_HEADS: u64 = 4096;
const MAX_FFN: u64 = 1 << 21;
const MAX_VOCAB: u64 = 1 << 23;
const MAX_EXPERTS: u64 = 4096;
const MAX_SEQ: u64 = 1 << 23;
const MAX_BATCH: u64 = 1 << 22;
const MAX_GPUS: u64 = 1 << 20;

/// The name of the preset `config`'s model equals, if any.
pub fn preset_of(config: &Config) -> Option<&'static str> {
    PRESET_NAMES
        .iter()
        .copied()
        .find(|n| preset(n).is_some_and(|m| m == config.model))
}

/// Data-parallel degree implied by the GPU count, if the model-parallel product divides it.
pub fn derived_dp(config: &Config) -> Option<u64> {
    let p = &config.parallel;
    let mp = (p.tp as u64 * p.cp as u64).saturating_mul(p.pp as u64);
    let n = config.cluster.num_gpus as u64;
    (mp > 0 && n.is_multiple_of(mp)).then(|| n / mp)
}

/// GPUs left for one degree once the others are placed (all of them if they do not divide).
fn room(config: &Config, others: u64) -> u64 {
    let n = config.cluster.num_gpus as u64;
    if others > 0 && n.is_multiple_of(others) {
        n / others
    } else {
        n
    }
}

/// The values each parallel degree can take given everything else.
pub mod options {
    use super::*;

    /// TP: divides the GPUs left by CP x PP, the attention heads and (without MLA) KV heads.
    pub fn tp(c: &Config) -> Vec<u32> {
        let p = &c.parallel;
        let m = &c.model;
        let opts = divisors(room(c, p.cp as u64 * p.pp as u64))
            .into_iter()
            .filter(|&d| d <= MAX_HEADS)
            .filter(|&d| (m.num_attention_heads as u64).is_multiple_of(d))
            .filter(|&d| m.mla.is_some() || (m.num_query_groups as u64).is_multiple_of(d))
            .map(|d| d as u32)
            .collect();
        with_current(opts, p.tp)
    }

    /// CP: divides the GPUs left by TP x PP and the sequence (twice for zigzag).
    pub fn cp(c: &Config) -> Vec<u32> {
        let p = &c.parallel;
        let z = if p.cp_comm == CpComm::Zigzag { 2 } else { 1 };
        let opts = divisors(room(c, p.tp as u64 * p.pp as u64))
            .into_iter()
            .filter(|&d| d <= MAX_HEADS && c.training.seq_length.is_multiple_of(d * z))
            .map(|d| d as u32)
            .collect();
        with_current(opts, p.cp)
    }

    /// PP: divides the GPUs left by TP x CP, and the layers into pp x vpp chunks (unless the
    /// first/last stage sizes are set); interleaved 1F1B needs at least 2.
    pub fn pp(c: &Config) -> Vec<u32> {
        let p = &c.parallel;
        let layers = c.model.num_layers as u64;
        let uneven = p.first_stage_layers.is_some()
            || p.last_stage_layers.is_some()
            || p.pipeline_layout.is_some()
            || p.account_for_embedding_in_pipeline_split
            || p.account_for_loss_in_pipeline_split;
        let opts = divisors(room(c, p.tp as u64 * p.cp as u64))
            .into_iter()
            .filter(|&d| d <= layers)
            .filter(|&d| uneven || layers.is_multiple_of(d * p.vpp.max(1) as u64))
            .filter(|&d| p.schedule != ScheduleKind::Interleaved1F1B || d >= 2)
            .map(|d| d as u32)
            .collect();
        with_current(opts, p.pp)
    }

    /// VPP: what the schedule allows; for interleaved 1F1B the counts of at least 2 that split
    /// each rank's layers evenly (the first 16).
    pub fn vpp(c: &Config) -> Vec<u32> {
        let p = &c.parallel;
        let opts = match p.schedule {
            ScheduleKind::Interleaved1F1B => {
                let slots = c.model.num_layers
                    + p.account_for_embedding_in_pipeline_split as u32
                    + p.account_for_loss_in_pipeline_split as u32;
                let per_rank = slots / p.pp.max(1);
                (2..=per_rank.max(2))
                    .filter(|v| per_rank.is_multiple_of(*v))
                    .take(16)
                    .collect()
            }
            k => vec![vpp_for(k, p.vpp)],
        };
        with_current(opts, p.vpp)
    }

    /// EP: 1 for a dense model; otherwise divides the expert count and, on Megatron-Core's
    /// expert grid (expert_tp x ep over tp x cp x dp), tp x cp x dp / expert_tp: EP may exceed
    /// DP (MoE Parallel Folding).
    pub fn ep(c: &Config) -> Vec<u32> {
        let experts = c.model.num_experts as u64;
        let p = &c.parallel;
        let etp = p.etp() as u64;
        let stage = derived_dp(c).map(|dp| p.tp as u64 * p.cp as u64 * dp);
        let opts = match stage {
            Some(n) if experts > 0 && etp > 0 && n.is_multiple_of(etp) => divisors(n / etp)
                .into_iter()
                .filter(|d| experts.is_multiple_of(*d))
                .map(|d| d as u32)
                .collect(),
            _ => vec![1],
        };
        with_current(opts, c.parallel.ep)
    }
}

/// Draws the panel; returns whether the configuration changed.
pub fn ui(ui: &mut Ui, config: &mut Config, problems: Option<&Problems>) -> bool {
    let before = config.clone();
    let p = problems;

    let unplaced: Vec<_> = fields::unplaced(p).collect();
    if !unplaced.is_empty() {
        let color = ui.visuals().error_fg_color;
        for v in unplaced {
            let field = if v.field.is_empty() {
                String::new()
            } else {
                format!("{}: ", v.field)
            };
            ui.add(
                egui::Label::new(
                    RichText::new(format!("{field}{}", fields::message(v))).color(color),
                )
                .wrap(),
            );
        }
        ui.separator();
    }

    CollapsingHeader::new(RichText::new("Model").strong())
        .default_open(true)
        .show(ui, |ui| model(ui, config, p));
    CollapsingHeader::new(RichText::new("Training").strong())
        .default_open(true)
        .show(ui, |ui| training(ui, config, p));
    CollapsingHeader::new(RichText::new("Parallelism").strong())
        .default_open(true)
        .show(ui, |ui| parallelism(ui, config, p));
    CollapsingHeader::new(RichText::new("Cluster").strong())
        .default_open(true)
        .show(ui, |ui| cluster(ui, config, p));
    CollapsingHeader::new(RichText::new("Run").strong())
        .default_open(false)
        .show(ui, |ui| super::run_panel::ui(ui, config));
    *config != before
}

fn model(ui: &mut Ui, c: &mut Config, p: Option<&Problems>) {
    let current = preset_of(c);
    let shown = match current {
        Some(n) => n.to_string(),
        None => format!("{} (edited)", c.model.name),
    };
    ui.horizontal(|ui| {
        let l = label(
            ui,
            "Preset",
            "Start from a published model shape; the fields below edit it",
        );
        egui::ComboBox::from_id_salt("preset")
            .selected_text(shown)
            .width(150.0)
            .show_ui(ui, |ui| {
                for &n in PRESET_NAMES {
                    if ui.selectable_label(current == Some(n), n).clicked() {
                        if let Some(m) = preset(n) {
                            c.model = m;
                        }
                    }
                }
            })
            .response
            .labelled_by(l.id);
    });
    errors(ui, p, "model.name");
    let m = &mut c.model;
    row(
        ui,
        "Layers",
        "Decoder layers",
        "model.num_layers",
        p,
        |ui| ui.add(DragValue::new(&mut m.num_layers).range(1..=MAX_LAYERS)),
    );
    row(
        ui,
        "Hidden",
        "Model width (hidden size)",
        "model.hidden_size",
        p,
        |ui| {
            ui.add(
                DragValue::new(&mut m.hidden_size)
                    .range(1..=MAX_HIDDEN)
                    .speed(16),
            )
        },
    );
    row(
        ui,
        "Heads",
        "Attention heads",
        "model.num_attention_heads",
        p,
        |ui| ui.add(DragValue::new(&mut m.num_attention_heads).range(1..=MAX_HEADS)),
    );
    row(
        ui,
        "KV heads",
        "Key/value heads (query groups, GQA); equal to the heads for MHA",
        "model.num_query_groups",
        p,
        |ui| ui.add(DragValue::new(&mut m.num_query_groups).range(1..=MAX_HEADS)),
    );
    row(
        ui,
        "FFN",
        "Dense MLP intermediate size",
        "model.ffn_hidden_size",
        p,
        |ui| {
            ui.add(
                DragValue::new(&mut m.ffn_hidden_size)
                    .range(1..=MAX_FFN)
                    .speed(64),
            )
        },
    );
    row(
        ui,
        "Vocab",
        "Vocabulary size",
        "model.vocab_size",
        p,
        |ui| {
            ui.add(
                DragValue::new(&mut m.vocab_size)
                    .range(1..=MAX_VOCAB)
                    .speed(64),
            )
        },
    );
    row(
        ui,
        "Experts",
        "Routed experts per MoE layer (0 = dense)",
        "model.num_experts",
        p,
        |ui| ui.add(DragValue::new(&mut m.num_experts).range(0..=MAX_EXPERTS)),
    );
    if m.num_experts > 0 {
        let max_k = m.num_experts as u64;
        row(
            ui,
            "Top-k",
            "Experts each token is routed to",
            "model.moe_router_topk",
            p,
            |ui| ui.add(DragValue::new(&mut m.moe_router_topk).range(1..=max_k)),
        );
        row(
            ui,
            "Expert FFN",
            "Intermediate size of one routed expert",
            "model.moe_ffn_hidden_size",
            p,
            |ui| {
                ui.add(
                    DragValue::new(&mut m.moe_ffn_hidden_size)
                        .range(1..=MAX_FFN)
                        .speed(64),
                )
            },
        );
    }
}

fn training(ui: &mut Ui, c: &mut Config, p: Option<&Problems>) {
    let par = &c.parallel;
    let z = if par.cp_comm == CpComm::Zigzag { 2 } else { 1 };
    let tp_step = if par.sp && par.tp > 1 {
        par.tp as u64
    } else {
        1
    };
    let seq_step = (par.cp.max(1) as u64 * z).saturating_mul(tp_step);
    let dp = derived_dp(c).unwrap_or(1);
    let t = &mut c.training;
    row(
        ui,
        "Sequence",
        "Tokens per sample; steps keep it divisible by CP (x2 for zigzag) and TP with SP",
        "training.seq_length",
        p,
        |ui| ui.add(stepped(&mut t.seq_length, 1..=MAX_SEQ, seq_step)),
    );
    row(
        ui,
        "Micro batch",
        "Samples per microbatch",
        "training.micro_batch_size",
        p,
        |ui| ui.add(DragValue::new(&mut t.micro_batch_size).range(1..=1024)),
    );
    let gbs_step = t.micro_batch_size.max(1).saturating_mul(dp);
    row(
        ui,
        "Global batch",
        "Samples per step; steps by micro batch x DP so the microbatch count stays whole",
        "training.global_batch_size",
        p,
        |ui| ui.add(stepped(&mut t.global_batch_size, 1..=MAX_BATCH, gbs_step)),
    );
    row(
        ui,
        "Precision",
        "Numeric type of weights and activations",
        "training.precision",
        p,
        |ui| {
            choice(ui, "precision", &mut t.precision, Precision::ALL, |v| {
                v.as_str().to_string()
            })
        },
    );
    row(
        ui,
        "Recompute",
        "Activation recomputation (Korthikanti et al. 2022)",
        "training.recompute",
        p,
        |ui| {
            choice(ui, "recompute", &mut t.recompute, Recompute::ALL, |v| {
                v.as_str().to_string()
            })
        },
    );
    row(
        ui,
        "Flash attention",
        "Fused attention: no s x s tensors are saved",
        "training.flash_attention",
        p,
        |ui| ui.checkbox(&mut t.flash_attention, ""),
    );
    let framework = row(
        ui,
        "Framework",
        "Megatron-Core (NeMo), DeepSpeed or FSDP: sets its overlap, bucketing and ZeRO-3 \
         prefetch defaults (docs/time-model.md)",
        "training.framework",
        p,
        |ui| {
            choice(ui, "framework", &mut t.framework, &Framework::ALL, |v| {
                v.name().to_string()
            })
        },
    );
    if framework {
        c.apply_framework_defaults();
    }
}

fn parallelism(ui: &mut Ui, c: &mut Config, p: Option<&Problems>) {
    let num = |v: u32| v.to_string();
    let o = options::tp(c);
    row(
        ui,
        "TP",
        "Tensor-parallel degree (divisors of the heads and KV heads that fit the GPUs)",
        "parallel.tp",
        p,
        |ui| choice(ui, "tp", &mut c.parallel.tp, &o, num),
    );
    let tp = c.parallel.tp;
    row(
        ui,
        "SP",
        "Sequence parallelism with TP (needs TP > 1)",
        "parallel.sp",
        p,
        |ui| ui.add_enabled(tp > 1, egui::Checkbox::without_text(&mut c.parallel.sp)),
    );
    let o = options::cp(c);
    row(
        ui,
        "CP",
        "Context-parallel degree (splits the sequence)",
        "parallel.cp",
        p,
        |ui| choice(ui, "cp", &mut c.parallel.cp, &o, num),
    );
    if c.parallel.cp > 1 {
        row(
            ui,
            "CP exchange",
            "How context-parallel ranks exchange keys and values",
            "parallel.cp_comm",
            p,
            |ui| {
                choice(ui, "cp_comm", &mut c.parallel.cp_comm, CpComm::ALL, |v| {
                    v.as_str().to_string()
                })
            },
        );
    }
    let o = options::pp(c);
    row(
        ui,
        "PP",
        "Pipeline-parallel degree (divides the layers into pp x vpp chunks)",
        "parallel.pp",
        p,
        |ui| choice(ui, "pp", &mut c.parallel.pp, &o, num),
    );
    let o = options::vpp(c);
    row(
        ui,
        "VPP",
        "Virtual stages (model chunks) per pipeline rank; set by the schedule",
        "parallel.vpp",
        p,
        |ui| choice(ui, "vpp", &mut c.parallel.vpp, &o, num),
    );
    let before = c.parallel.schedule;
    row(
        ui,
        "Schedule",
        "Pipeline schedule",
        "parallel.schedule",
        p,
        |ui| {
            choice(
                ui,
                "schedule",
                &mut c.parallel.schedule,
                ScheduleKind::ALL,
                |v| v.as_str().to_string(),
            )
        },
    );
    if c.parallel.schedule != before {
        c.parallel.vpp = vpp_for(c.parallel.schedule, c.parallel.vpp);
    }
    pipeline_split(ui, c, p);
    let o = options::ep(c);
    row(
        ui,
        "EP",
        "Expert-parallel degree (on the expert grid: expert TP x EP divides TP x CP x DP)",
        "parallel.ep",
        p,
        |ui| choice(ui, "ep", &mut c.parallel.ep, &o, num),
    );
    row(
        ui,
        "ZeRO",
        "0 none, 1 optimizer states, 2 + gradients, 3 + parameters",
        "parallel.zero",
        p,
        |ui| {
            choice(ui, "zero", &mut c.parallel.zero, &[0, 1, 2, 3], |v| {
                v.to_string()
            })
        },
    );
    let dp = derived_dp(c);
    ui.horizontal(|ui| {
        let l = label(ui, "DP (derived)", "GPUs / (TP x CP x PP)");
        let text = match dp {
            Some(dp) => {
                let t = &c.training;
                let per_step = t.micro_batch_size.saturating_mul(dp);
                if per_step > 0 && t.global_batch_size.is_multiple_of(per_step) {
                    format!("{dp}  ·  {} microbatches", t.global_batch_size / per_step)
                } else {
                    dp.to_string()
                }
            }
            None => "—".to_string(),
        };
        ui.label(text).labelled_by(l.id);
    });
    errors(ui, p, "parallel.dp");
}

/// Megatron-Core's explicit pipeline layout (vpp follows its stage count, as Megatron derives
/// it) and the embedding/loss layer slots.
fn pipeline_split(ui: &mut Ui, c: &mut Config, p: Option<&Problems>) {
    let mut text = c.parallel.pipeline_layout.clone().unwrap_or_default();
    let changed = row(
        ui,
        "Layout",
        "Megatron-Core's --pipeline-model-parallel-layout: E embedding, t layer, m MTP, L loss, '|' between the pp x vpp stages, X*n and (...)*n repeat; empty for an even split",
        "parallel.pipeline_layout",
        p,
        |ui| {
            ui.add(
                egui::TextEdit::singleline(&mut text)
                    .hint_text("e.g. Et*7|(t*8|)*14,t*7L")
                    .desired_width(180.0),
            )
        },
    );
    if changed {
        let text = text.trim();
        c.parallel.pipeline_layout = (!text.is_empty()).then(|| text.to_string());
        let stages = c
            .parallel
            .pipeline_layout
            .as_deref()
            .and_then(|l| parsim::config::pipeline_layout::parse(l).ok())
            .map(|s| s.len() as u32);
        if let Some(n) = stages.filter(|n| c.parallel.pp > 0 && n % c.parallel.pp == 0) {
            c.parallel.vpp = n / c.parallel.pp;
            if c.parallel.vpp > 1 && c.parallel.schedule == ScheduleKind::OneFOneB {
                c.parallel.schedule = ScheduleKind::Interleaved1F1B;
            }
        }
    }
    let par = &mut c.parallel;
    row(
        ui,
        "Embedding slot",
        "--account-for-embedding-in-pipeline-split: the embedding takes one layer slot on the first stage",
        "parallel.account_for_embedding_in_pipeline_split",
        p,
        |ui| ui.checkbox(&mut par.account_for_embedding_in_pipeline_split, ""),
    );
    row(
        ui,
        "Loss slot",
        "--account-for-loss-in-pipeline-split: the output layer and loss take one layer slot on the last stage",
        "parallel.account_for_loss_in_pipeline_split",
        p,
        |ui| ui.checkbox(&mut par.account_for_loss_in_pipeline_split, ""),
    );
}

fn cluster(ui: &mut Ui, c: &mut Config, p: Option<&Problems>) {
    let mut names: Vec<String> = GpuProfile::shipped_names()
        .into_iter()
        .map(String::from)
        .collect();
    if !names.contains(&c.cluster.gpu) {
        names.push(c.cluster.gpu.clone());
    }
    ui.horizontal(|ui| {
        let l = label(ui, "GPU", "Hardware profile (calibration/)");
        let before = c.cluster.gpu.clone();
        let mut r = egui::ComboBox::from_id_salt("gpu")
            .selected_text(c.cluster.gpu.clone())
            .width(150.0)
            .show_ui(ui, |ui| {
                for n in &names {
                    ui.selectable_value(&mut c.cluster.gpu, n.clone(), n);
                }
            })
            .response;
        if c.cluster.gpu != before {
            r.mark_changed();
        }
        r.labelled_by(l.id);
    });
    errors(ui, p, "cluster.gpu");
    let par = &c.parallel;
    let mp = (par.tp as u64 * par.cp as u64).saturating_mul(par.pp as u64);
    row(
        ui,
        "GPUs",
        "Total GPUs; steps by TP x CP x PP so DP stays whole",
        "cluster.num_gpus",
        p,
        |ui| ui.add(stepped(&mut c.cluster.num_gpus, 1..=MAX_GPUS, mp)),
    );
    nodes_and_domain(ui, c, p);
}

/// GPUs per node and the NVLink domain: each shows its value, the profile's choice where the
/// configuration leaves it out ("automatic", never a bare 0); editing either sets it.
fn nodes_and_domain(ui: &mut Ui, c: &mut Config, p: Option<&Problems>) {
    let gpu = GpuProfile::load(&c.cluster.gpu).ok();
    let mut per_node = gpu
        .as_ref()
        .map_or(c.cluster.per_node(), |g| c.cluster.gpus_per_node_on(g));
    let changed = row(
        ui,
        "GPUs per node",
        "GPUs in one node, whose host's CPU memory and NICs they share (--gpus-per-node); default the profile's: 4 on a GB200/GB300 tray, 8 on an HGX board",
        "cluster.gpus_per_node",
        p,
        |ui| ui.add(DragValue::new(&mut per_node).range(1..=1024)),
    );
    if changed {
        c.cluster.gpus_per_node = Some(per_node);
    }
    let chosen = gpu.as_ref().map(|g| c.cluster.nvlink_domain_choice(g));
    let mut domain = chosen.as_ref().map_or(per_node, |d| d.size);
    let mut automatic = c.cluster.nvlink_domain_size.is_none();
    ui.horizontal(|ui| {
        let l = label(
            ui,
            "NVLink domain",
            "GPUs per NVLink domain (--nvlink-domain-size): a group inside one runs at NVLink rates across nodes. Automatic: on an NVL72 profile, a job of at most a rack is one domain, else whole racks of 72, else racks of 64 (16 of 18 trays), else the node",
        );
        let drag = ui
            .add(DragValue::new(&mut domain).range(1..=1_000_000))
            .labelled_by(l.id);
        let check = ui.checkbox(&mut automatic, "automatic");
        if drag.changed() {
            c.cluster.nvlink_domain_size = Some(domain);
        } else if check.changed() {
            c.cluster.nvlink_domain_size = (!automatic).then_some(domain);
        }
    });
    if let Some(d) = chosen.filter(|_| c.cluster.nvlink_domain_size.is_none()) {
        ui.label(RichText::new(d.reason).small());
    }
    errors(ui, p, "cluster.nvlink_domain_size");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::default_config;

    #[test]
    fn offered_degrees_are_valid_for_the_defaults() {
        let c = default_config();
        assert_eq!(options::tp(&c), [1, 2]);
        assert_eq!(options::pp(&c), [2, 4]);
        assert_eq!(options::vpp(&c), [2, 4, 8]);
        assert_eq!(options::ep(&c), [1]);
        assert_eq!(preset_of(&c), Some("llama3-8b"));
        assert_eq!(derived_dp(&c), Some(1));
    }

    /// Mixtral-8x7B (8 experts) on 16 GPUs with tp 4, pp 1 (dp 4): Megatron-Core's expert
    /// grid takes ep over the 4 x 4 = 16 ranks of the stage / expert_tp, so expert_tp 1 offers
    /// ep 8 (above dp 4), and expert_tp 4 only the divisors of 16 / 4 = 4; each resolves.
    #[test]
    fn ep_offers_the_folded_values_above_dp() {
        let mut c = default_config();
        c.model = preset("mixtral-8x7b").expect("preset");
        c.cluster.num_gpus = 16;
        c.parallel.tp = 4;
        c.parallel.pp = 1;
        c.parallel.vpp = 1;
        c.parallel.schedule = ScheduleKind::OneFOneB;
        c.parallel.expert_tp = Some(1);
        c.training.global_batch_size = 16;
        assert_eq!(derived_dp(&c), Some(4));
        assert_eq!(options::ep(&c), [1, 2, 4, 8]);
        for ep in options::ep(&c) {
            let mut c = c.clone();
            c.parallel.ep = ep;
            assert!(parsim::config::Resolved::new(c).is_ok(), "ep {ep}");
        }
        c.parallel.expert_tp = Some(4);
        assert_eq!(options::ep(&c), [1, 2, 4]);
    }

    #[test]
    fn every_offered_tp_resolves() {
        let c = default_config();
        for tp in options::tp(&c) {
            let mut c = c.clone();
            c.parallel.tp = tp;
            assert!(parsim::config::Resolved::new(c).is_ok(), "tp {tp}");
        }
    }
}
