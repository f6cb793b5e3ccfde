//! NVIDIA Megatron-Bridge (NeMo Framework) performance summary, containers 25.09-26.08
//! (github.com/NVIDIA-NeMo/Megatron-Bridge, docs/performance-summary.md and
//! docs/performance-summary-archive.md): pre-training, SFT and LoRA rows of tokens/s per GPU at
//! printed tp/pp/cp/vp/ep, micro and global batch, sequence, precision, GPUs and system.
//! Validation only: no efficiency is ever fitted to these rows.

use super::bridge_models::{self, BridgeModel};
use super::data::{self, RowError};
use super::{Measured, SourceRow};
use serde_json::{json, Map, Value};

/// The settings the table does not print, and where they come from.
pub const DEFAULTS: &str = "Megatron-Core's defaults as parsim's megatron-core framework applies \
them (gradient reduce-scatter and parameter all-gather overlapped, no TP communication overlap), \
the distributed optimizer (ZeRO-1), or Megatron-FSDP with optim_grads_params (ZeRO-3 over every \
data-parallel rank) where the row's FSDP column is above 0 (the table's notes); no \
recomputation (Megatron-Core's default) unless the model's recipe lists modules; sequence \
parallelism with TP > 1; expert TP 1; interleaved 1F1B where vp > 1; forced load balancing on \
every MoE model and capacity factor 1.0 on token-drop rows (the notes: 'MoE benchmarks \
force-balance tokens and are dropless unless labelled tokendrop'); FP8 and FP8-CS as per-tensor \
current scaling, FP8-MX as MXFP8; the GPU profile's own node size and NVLink domain (the table \
gives neither); SFT rows as full fine-tuning at the row's sequence, LoRA rows as LoRA of rank 16 \
on the QKV, output, FC1 and FC2 projections (Megatron-Bridge's PEFT guide, \
docs/training/peft.md); per model, the recipe settings its entry in \
crates/engine/src/validate/bridge_models.rs cites (pipeline layouts, embedding and loss slots, \
MTP, Muon, recompute modules, fp8_param_gather turned off); every recipe's gradients \
reduced and accumulated in bf16 (perf_recipes/_common.py's _benchmark_common: \
grad_reduce_in_fp32 = False) and, at FP8, MXFP8 and NVFP4, its weights kept and gathered \
in that format (training/mixed_precision.py: fp8_param_gather = True, NVFP4's \
fp4_param_gather = True); the recipe settings parsim's configuration does not say (a \
token dispatcher other than all-to-all, CUDA graphs) are named in the row's notes, and a \
recipe parsim cannot say at all (Megatron-FSDP as HSDP, fine-grained activation offloading) \
leaves its rows not expressible, by name. A figure in parentheses (the same run at another quantisation \
granularity or layout) is not used. Measured step = global batch x sequence / (tokens/s per GPU \
x GPUs).";

/// The table's systems and the GPU profile each runs.
const SYSTEMS: [(&str, &str); 5] = [
    ("DGX-H100", "h100-sxm"),
    ("DGX-B200", "b200"),
    ("DGX-B300", "b300"),
    ("DGX-GB200", "gb200"),
    ("DGX-GB300", "gb300"),
];

/// Every row of the table.
pub fn rows() -> Result<Vec<SourceRow>, RowError> {
    let t = data::table("NVIDIA Megatron-Bridge")?;
    Ok(t.rows.iter().enumerate().map(|(i, v)| row(i, v)).collect())
}

/// The row's parallel layout and batch as printed.
#[derive(Debug, Clone, Copy)]
struct Printed {
    gpus: u32,
    tp: u32,
    pp: u32,
    cp: u32,
    vpp: u32,
    ep: u32,
    fsdp: u64,
    mbs: u64,
    gbs: u64,
    seq: u64,
}

fn printed(v: &Value) -> Result<Printed, RowError> {
    let or_one = |k: &str| -> Result<u32, RowError> {
        Ok(match data::whole(v, k)? {
            None | Some(0) => 1,
            Some(n) => n as u32,
        })
    };
    Ok(Printed {
        gpus: data::degree(v, "num_gpus")?,
        tp: data::degree(v, "tp")?,
        pp: data::degree(v, "pp")?,
        cp: data::degree(v, "cp")?,
        vpp: or_one("vp")?,
        ep: or_one("ep")?,
        fsdp: data::whole(v, "fsdp")?.unwrap_or(0),
        mbs: data::required(v, "micro_batch_size")?,
        gbs: data::required(v, "global_batch_size")?,
        seq: data::required(v, "seq_len")?,
    })
}

fn row(index: usize, v: &Value) -> SourceRow {
    let name = data::text(v, "model");
    let system = data::text(v, "system");
    let task = data::text(v, "task").trim_end_matches(" Performance");
    let precision = data::text(v, "precision");
    let p = printed(v);
    let label = match &p {
        Ok(p) => format!(
            "{} {name} {} x{} {} t{} p{} c{} v{} e{}{} mbs{} gbs{} s{}",
            data::text(v, "container"),
            system.trim_start_matches("DGX-"),
            p.gpus,
            precision.split(' ').next().unwrap_or(""),
            p.tp,
            p.pp,
            p.cp,
            p.vpp,
            p.ep,
            if p.fsdp > 0 { " fsdp" } else { "" },
            p.mbs,
            p.gbs,
            p.seq
        ),
        Err(_) => format!("{} {name} {system}", data::text(v, "container")),
    };
    let measured = match (&p, data::number(v, "tokens_per_sec_per_gpu")) {
        (Ok(p), Ok(Some(tokens))) if tokens > 0.0 => Measured {
            step_s: Some((p.gbs * p.seq) as f64 / (tokens * p.gpus as f64)),
            memory_bytes: None,
            // Every row ran.
            fits: Some(true),
            memory_contradicted: false,
        },
        _ => Measured::default(),
    };
    let mut notes = Vec::new();
    let setup = p.and_then(|p| overlay(v, &p, &mut notes));
    SourceRow {
        index,
        label,
        model: if task == "Pre-Training" {
            name.to_string()
        } else {
            format!("{name} {task}")
        },
        system: system.to_string(),
        measured,
        setup,
        notes,
    }
}

/// The precision and FP8 recipe a row's precision column names.
fn precision(
    p: &str,
    notes: &mut Vec<String>,
) -> Result<(&'static str, Option<&'static str>), RowError> {
    let main = p.split(" (").next().unwrap_or(p).trim();
    Ok(match main {
        "MXFP8" | "FP8-MX" => ("mxfp8", None),
        "FP8-CS" => ("fp8", Some("current")),
        "FP8" => {
            notes.push(if p.contains("not stated") {
                "precision: the 25.09 page states FP8 for the whole table; the figure outside \
                 the parentheses is taken as per-tensor current scaling"
                    .into()
            } else {
                "precision: FP8 taken as per-tensor current scaling (FP8-CS)".into()
            });
            ("fp8", Some("current"))
        }
        "NVFP4" => ("nvfp4", None),
        "BF16" => ("bf16", None),
        other => {
            return Err(RowError::NotModelled(format!(
                "precision '{other}' is not one parsim models"
            )))
        }
    })
}

/// The configuration overlay of a row, or why parsim cannot describe it.
fn overlay(v: &Value, p: &Printed, notes: &mut Vec<String>) -> Result<Value, RowError> {
    let name = data::text(v, "model");
    let model: &BridgeModel = bridge_models::find(name)
        .ok_or_else(|| RowError::NotModelled(format!("model '{name}': no preset")))?;
    let preset = model
        .preset
        .map_err(|why| RowError::NotModelled(why.to_string()))?;
    if let Some(why) = model.refused {
        return Err(RowError::NotModelled(why.to_string()));
    }
    let system = data::text(v, "system");
    let gpu = SYSTEMS
        .iter()
        .find(|(s, _)| *s == system)
        .map(|(_, g)| *g)
        .ok_or_else(|| RowError::NotModelled(format!("system '{system}': no GPU profile")))?;
    let (precision, fp8_recipe) = precision(data::text(v, "precision"), notes)?;
    let (_, variant) = bridge_models::split_variant(name);
    let moe = crate::config::presets::preset(preset).is_some_and(|m| m.num_experts > 0);

    let mut m = Map::new();
    m.insert("preset".into(), json!(preset));
    let mtp = match variant {
        Some("w/o MTP") => 0,
        _ => model.mtp_layers,
    };
    if model.mtp_layers > 0 {
        m.insert("mtp_num_layers".into(), json!(mtp));
    }
    if moe {
        m.insert("moe_router_force_load_balancing".into(), json!(true));
    }
    if variant == Some("tokendrop") {
        m.insert("moe_capacity_factor".into(), json!(1.0));
    }

    // ZeRO-1: the distributed optimizer, or under Muon (the recipes' `dist_muon`) the
    // layer-wise distributed optimizer.
    let mut par = json!({"tp": p.tp, "pp": p.pp, "cp": p.cp, "vpp": p.vpp, "ep": p.ep,
                         "zero": 1});
    if p.vpp > 1 {
        par["schedule"] = json!("interleaved-1f1b");
    }
    if p.fsdp > 0 {
        par["fsdp"] = json!("megatron");
        par["zero"] = json!(3);
    }
    if model.pipeline_slots {
        par["account_for_embedding_in_pipeline_split"] = json!(true);
        par["account_for_loss_in_pipeline_split"] = json!(true);
    }
    if let Some(d) = model.dispatch(gpu, precision).filter(|_| moe) {
        par["moe_token_dispatcher"] = json!(d.dispatcher);
        let mut what = d.dispatcher.to_string();
        if !d.backend.is_empty() {
            par["moe_flex_dispatcher_backend"] = json!(d.backend);
            what = format!("{what} ({})", d.backend);
        }
        // Megatron-Core runs the EP overlap only with virtual stages under pipelining.
        if d.overlap && p.ep > 1 && (p.pp == 1 || p.vpp > 1) {
            par["overlap_moe_expert_parallel_comm"] = json!(true);
            what.push_str(", EP overlap");
        }
        notes.push(format!("token dispatcher {what} (the model's recipe)"));
    }
    let stages = p.pp * p.vpp;
    if p.pp > 1 && !model.layouts.is_empty() {
        let layout = model.layout(stages, mtp).ok_or_else(|| {
            RowError::NotModelled(format!(
                "{}: the recipe's layout map has no entry for pp x vp = {stages} virtual \
                 stages (which split of its layers the row ran is not published)",
                model.name
            ))
        })?;
        notes.push(format!("pipeline layout {layout} (the model's recipe)"));
        par["pipeline_layout"] = json!(layout);
    }

    let mut train = json!({"precision": precision, "seq_length": p.seq,
                           "micro_batch_size": p.mbs, "global_batch_size": p.gbs,
                           "recompute": "none"});
    if let Some(r) = fp8_recipe {
        train["fp8_recipe"] = json!(r);
    }
    if let Some(modules) = model
        .recompute_modules(gpu, precision)
        .filter(|m| !m.is_empty())
    {
        train["recompute"] = json!("selective");
        train["recompute_modules"] = json!(modules);
        notes.push(format!(
            "recompute modules {} (the model's recipe)",
            modules.join(", ")
        ));
    }
    let offloaded = model.fsdp_offload_layers(gpu, precision);
    if p.fsdp > 0 && offloaded > 0 {
        train["offload_activation_layers"] = json!(offloaded);
        notes.push(format!(
            "activations of {offloaded} layers offloaded to the host (the model's recipe)"
        ));
    }
    if model.muon {
        train["optimizer"] = json!("muon");
    }
    // Every performance recipe reduces and accumulates its gradients in bf16
    // (`_benchmark_common`, src/megatron/bridge/perf_recipes/_common.py; before it the
    // scripts/performance/configs/*_llm_pretrain.py of each model).
    train["grad_dtype"] = json!("bf16");
    if model.gathers_low_precision(gpu, precision) {
        train["fp8_param_gather"] = json!(true);
    }
    if moe && model.fuses_grouped_mlp(gpu, precision) {
        train["fused_grouped_mlp"] = json!(true);
        notes.push("experts as the fused grouped MLP (the model's recipe)".into());
    }
    if moe && model.graphs_full_iteration(gpu, precision) {
        train["cuda_graphs"] = json!(true);
        notes.push("the whole iteration as a CUDA graph (the model's recipe)".into());
    }
    for setting in model.unmodelled {
        notes.push(format!("not modelled: {setting} (the model's recipe)"));
    }
    if data::text(v, "task").starts_with("LoRA") {
        train["mode"] = json!("lora");
        train["lora"] = json!({"rank": 16, "targets": ["qkv", "proj", "fc1", "fc2"]});
    }
    Ok(json!({
        "model": Value::Object(m),
        "cluster": {"gpu": gpu, "num_gpus": p.gpus},
        "parallel": par,
        "training": train,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_row_is_read_and_the_measured_step_follows_from_its_tokens() {
        let rows = rows().unwrap();
        assert_eq!(rows.len(), 278);
        // 26.08 DeepSeekV3 on 256 GB300: GBS 4096 x 4096 tokens at 6288 tokens/s/GPU.
        let r = &rows[0];
        let step = 4096.0 * 4096.0 / (6288.0 * 256.0);
        assert!((r.measured.step_s.unwrap() / step - 1.0).abs() < 1e-12);
        assert_eq!(r.model, "DeepSeekV3");
        assert_eq!(r.system, "DGX-GB300");
        let overlay = r.setup.as_ref().unwrap();
        assert_eq!(overlay["parallel"]["pp"], 2);
        assert_eq!(overlay["parallel"]["vpp"], 8);
        assert_eq!(overlay["parallel"]["pipeline_layout"], "Et*4|(t*4|)*14,tmL");
        assert_eq!(overlay["training"]["precision"], "mxfp8");
    }

    #[test]
    fn rows_parsim_cannot_say_are_not_expressible_by_name() {
        let rows = rows().unwrap();
        let named = |prefix: &str, needle: &str| {
            let picked: Vec<_> = rows
                .iter()
                .filter(|r| r.model.starts_with(prefix))
                .collect();
            assert!(!picked.is_empty(), "{prefix}");
            for r in picked {
                let why = r.setup.as_ref().unwrap_err().to_string();
                assert!(why.contains(needle), "{prefix}: {why}");
            }
        };
        named("Nemotron_3_Ultra", "HSDP");
        named("DeepSeekV4 Flash", "no preset");
    }

    /// Every row is expressible at its recipe's settings but those parsim truly cannot say,
    /// each for its named reason: two models without a preset, Nemotron 3 Ultra's HSDP and
    /// activation offloading, and DeepSeek-V3 on pp 8 x vp 4, whose 32-stage layout the
    /// recipe does not publish.
    #[test]
    fn every_row_is_expressible_but_the_named_few() {
        let rows = rows().unwrap();
        let mut refused: Vec<(String, &str)> = rows
            .iter()
            .filter_map(|r| {
                let why = r.setup.as_ref().err()?.to_string();
                let reason = ["no preset", "HSDP", "32 virtual stages"]
                    .into_iter()
                    .find(|n| why.contains(n))
                    .unwrap_or_else(|| panic!("{}: unnamed reason {why}", r.label));
                Some((r.model.clone(), reason))
            })
            .collect();
        refused.sort();
        let want = [
            ("DeepSeekV3 (dropless)", "32 virtual stages"),
            ("DeepSeekV3 (w/o MTP)", "32 virtual stages"),
            ("DeepSeekV4 Flash", "no preset"),
            ("DeepSeekV4 Flash", "no preset"),
            ("Nemotron_3_5_Lightning", "no preset"),
            ("Nemotron_3_Ultra", "HSDP"),
            ("Nemotron_3_Ultra", "HSDP"),
        ];
        let got: Vec<(&str, &str)> = refused.iter().map(|(m, r)| (m.as_str(), *r)).collect();
        assert_eq!(got, want);
    }

    #[test]
    fn full_iteration_graph_recipes_run_as_graphs() {
        // perf_recipes/qwen/gb300/qwen3_moe.py's qwen3_30b_a3b_pretrain_8gpu_gb300_fp8mx_config
        // and perf_recipes/gpt_oss/gb200/gpt_oss.py's gpt_oss_120b_pretrain_64gpu_gb200_fp8mx_config
        // capture the whole iteration (common.py's _enable_hybridep_full_iteration_mxfp8,
        // _apply_gpt_oss_120b_full_iter_fp8mx_configs); the B200 MXFP8 Qwen3-30B recipe keeps
        // partial graphs (qwen/b200/qwen3_moe.py) and the BF16 ones none.
        let rows = rows().unwrap();
        let graphed = |prefix: &str| {
            let r = rows
                .iter()
                .find(|r| r.label.starts_with(prefix))
                .unwrap_or_else(|| panic!("no row {prefix}"));
            let on = r.setup.as_ref().unwrap()["training"]["cuda_graphs"] == json!(true);
            let noted = r.notes.iter().any(|n| n.contains("whole iteration"));
            assert_eq!(on, noted, "{:?}", r.notes);
            on
        };
        assert!(graphed("26.08 Qwen3_30B_a3B GB300 x8 MXFP8"));
        assert!(graphed("26.08 GPT OSS 120B GB200 x64 MXFP8"));
        assert!(!graphed("26.02 Qwen3_30B_a3B B200 x8 MXFP8"));
        assert!(!graphed("26.04 GPT OSS 120B GB200 x64 BF16"));
    }

    #[test]
    fn nemotron_3_super_rows_carry_their_recipe() {
        // The 26.04.01 B200 MXFP8 row: perf_recipes/nemotronh/b200/nemotronh.py's
        // nemotron_3_super_pretrain_64gpu_b200_fp8mx_config recomputes moe_act and layernorm.
        let rows = rows().unwrap();
        let r = rows
            .iter()
            .find(|r| {
                r.label
                    .starts_with("26.04.01 Nemotron_3_Super B200 x64 MXFP8")
            })
            .expect("the row");
        let o = r.setup.as_ref().unwrap();
        assert_eq!(o["model"]["preset"], "nemotron-3-super");
        assert_eq!(o["model"]["mtp_num_layers"], 1);
        assert_eq!(
            o["training"]["recompute_modules"],
            json!(["moe_act", "layernorm"])
        );
        assert_eq!(o["parallel"]["moe_token_dispatcher"], "flex");
        assert_eq!(o["parallel"]["moe_flex_dispatcher_backend"], "hybridep");
        assert!(
            r.notes.iter().any(|n| n.contains("flex (hybridep)")),
            "{:?}",
            r.notes
        );
        // The GB300 rows recompute nothing.
        let gb300 = rows
            .iter()
            .find(|r| r.model == "Nemotron_3_Super" && r.system == "DGX-GB300")
            .expect("a GB300 row");
        assert_eq!(
            gb300.setup.as_ref().unwrap()["training"]["recompute"],
            "none"
        );
    }

    #[test]
    fn precision_columns_map_to_recipes_and_refuse_the_unknown() {
        let mut notes = Vec::new();
        assert_eq!(precision("FP8-MX", &mut notes).unwrap(), ("mxfp8", None));
        assert_eq!(
            precision("FP8-CS (FP8-MX)", &mut notes).unwrap(),
            ("fp8", Some("current"))
        );
        assert!(notes.is_empty());
        assert_eq!(precision("FP8", &mut notes).unwrap().0, "fp8");
        assert_eq!(notes.len(), 1);
        assert!(precision("INT4", &mut notes)
            .unwrap_err()
            .to_string()
            .contains("INT4"));
    }
}
