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
leaves its rows not expressible, by name; a row whose printed layout no version of its \
recipe had (the 26.02.01 GB300 LLAMA3_70B MXFP8 and NVFP4 rows, the 25.11 H100 GPT OSS \
120B row) runs at the recipe's layout, named in its notes. A figure in parentheses (the same run at another quantisation \
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

/// A row whose printed layout no version of its model's recipe ever had, and the layout the
/// recipe runs (the same run as a later container prints it).
struct Misprint {
    container: &'static str,
    model: &'static str,
    system: &'static str,
    precision: &'static str,
    /// (tp, pp, vp, micro batch) of the recipe.
    recipe: (u32, u32, u32, u64),
    cite: &'static str,
}

/// The 26.02.01 archive's two GB300 LLAMA3_70B low-precision rows print pp 4 without vp at
/// micro batch 2 (MXFP8) and pp 1 at micro batch 2 (NVFP4); the recipes of every container
/// (scripts/performance/configs/llama/llama3_workload_base_configs.py from its first GB300
/// configs, commit 5ccbfdfc0, to its removal; then perf_recipes/llama/gb300/llama3.py's
/// llama3_70b_pretrain_64gpu_gb300_{fp8mx,nvfp4}_config) run pp 4 x vp 5 at micro batch 1
/// (WorkloadBaseConfig's default), and the 26.04 table prints that layout for the same runs
/// at 4742 and 7397 tokens/s (printed here: 4798 and 7002). Neither printed layout can run:
/// without recomputation, 1F1B's four micro batches of two 8192-token sequences in flight on
/// the first of four stages hold 80 layer activations of Llama 3 70B, over 280 GiB.
/// The 25.11 H100 GPT OSS 120B row prints micro batch 4 and 2 accumulation steps, the B200
/// row's figures beside it: at pp 4 (16 data-parallel ranks) its global batch of 512 makes 8
/// steps at micro batch 4; every recipe runs micro batch 1 (v0.2.0's
/// scripts/performance/configs/gpt_oss/workload_base_configs.py,
/// GPT_OSS_120B_H100_BF16_BASE_CONFIG: pp 4 over the base's micro batch 1; today's
/// perf_recipes/gpt_oss/h100/gpt_oss.py), as the 26.02-26.04.01 H100 rows print it.
const MISPRINTS: [Misprint; 3] = [
    Misprint {
        container: "26.02.01",
        model: "LLAMA3_70B",
        system: "DGX-GB300",
        precision: "MXFP8",
        recipe: (1, 4, 5, 1),
        cite: "llama3_70b_pretrain_64gpu_gb300_fp8mx_config; the 26.04 row",
    },
    Misprint {
        container: "26.02.01",
        model: "LLAMA3_70B",
        system: "DGX-GB300",
        precision: "NVFP4",
        recipe: (1, 4, 5, 1),
        cite: "llama3_70b_pretrain_64gpu_gb300_nvfp4_config; the 26.04 row",
    },
    Misprint {
        container: "25.11",
        model: "GPT OSS 120B",
        system: "DGX-H100",
        precision: "BF16",
        recipe: (1, 4, 1, 1),
        cite: "GPT_OSS_120B_H100_BF16_BASE_CONFIG; the row's own 2 accumulation steps",
    },
];

/// The recipe's layout in place of a misprinted one (see [`MISPRINTS`]), with a note.
fn recipe_layout(v: &Value, mut p: Printed, notes: &mut Vec<String>) -> Printed {
    let field = |k: &str| data::text(v, k);
    let Some(m) = MISPRINTS.iter().find(|m| {
        field("container") == m.container
            && field("model") == m.model
            && field("system") == m.system
            && field("precision") == m.precision
    }) else {
        return p;
    };
    let (tp, pp, vpp, mbs) = m.recipe;
    notes.push(format!(
        "printed layout t{} p{} v{} mbs{} is not the recipe's: run at t{tp} p{pp} v{vpp} \
         mbs{mbs} ({})",
        p.tp, p.pp, p.vpp, p.mbs, m.cite
    ));
    p.tp = tp;
    p.pp = pp;
    p.vpp = vpp;
    p.mbs = mbs;
    p
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
    let setup = p.and_then(|p| overlay(v, &recipe_layout(v, p, &mut notes), &mut notes));
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
        if d.overlaps_in(data::text(v, "container")) && p.ep > 1 && (p.pp == 1 || p.vpp > 1) {
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
        .recompute_modules_at(gpu, precision, p.mbs)
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

    /// The first row whose label starts with `prefix`.
    fn row<'a>(rows: &'a [SourceRow], prefix: &str) -> &'a SourceRow {
        rows.iter()
            .find(|r| r.label.starts_with(prefix))
            .unwrap_or_else(|| panic!("no row {prefix}"))
    }

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
            let r = row(&rows, prefix);
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
        let r = row(&rows, "26.04.01 Nemotron_3_Super B200 x64 MXFP8");
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

    /// The two misprinted 26.02.01 rows run as the 26.04 table prints the same runs (a second
    /// printing, independent of the recipe file): the same overlay, the printed layout named
    /// in a note; no other row is touched.
    #[test]
    fn misprinted_rows_run_at_the_layout_a_later_container_prints() {
        let rows = rows().unwrap();
        let find = |container: &str, precision: &str| {
            row(
                &rows,
                &format!("{container} LLAMA3_70B GB300 x64 {precision} "),
            )
        };
        for precision in ["MXFP8", "NVFP4"] {
            let old = find("26.02.01", precision);
            let new = find("26.04", precision);
            assert!(new.label.contains("t1 p4 c1 v5 e1 mbs1"), "{}", new.label);
            let (o, n) = (old.setup.as_ref().unwrap(), new.setup.as_ref().unwrap());
            assert_eq!(o["parallel"], n["parallel"], "{precision}");
            assert_eq!(o["training"], n["training"], "{precision}");
            assert!(
                old.notes.iter().any(|n| n.contains("is not the recipe's")),
                "{:?}",
                old.notes
            );
        }
        // The H100 GPT OSS row: its 2 accumulation steps are 512 / (mbs x dp) at pp 1 and
        // micro batch 4 (64 data-parallel ranks), not at its printed pp 4 (8 steps); run at the
        // recipe's micro batch 1, as the 26.02 row prints the same layout.
        let gpt = row(&rows, "25.11 GPT OSS 120B H100 x64 BF16 t1 p4");
        let later = row(&rows, "26.02 GPT OSS 120B H100 x64 BF16");
        let (o, n) = (gpt.setup.as_ref().unwrap(), later.setup.as_ref().unwrap());
        assert_eq!(o["parallel"], n["parallel"]);
        assert_eq!(o["training"]["micro_batch_size"], 1);
        assert_eq!(
            o["training"]["micro_batch_size"],
            n["training"]["micro_batch_size"]
        );
        let noted = rows
            .iter()
            .filter(|r| r.notes.iter().any(|n| n.contains("is not the recipe's")))
            .count();
        assert_eq!(noted, 3);
    }

    /// Where the table prints accumulation steps (the 25.11 pages), global batch = steps x
    /// micro batch x data-parallel ranks (GPUs / (tp pp cp)) must hold: the rows where it does
    /// not are the misprinted H100 GPT OSS row (corrected from its recipe) and the GB300
    /// Qwen3 235B row, whose steps fit neither its pp nor its micro batch and whose 256-GPU
    /// recipe is not published (left at its printed settings).
    #[test]
    fn printed_accumulation_steps_contradict_only_the_known_rows() {
        let t = data::table("NVIDIA Megatron-Bridge").unwrap();
        let mut broken = Vec::new();
        for v in &t.rows {
            let Some(steps) = data::whole(v, "grad_accum").unwrap() else {
                continue;
            };
            let p = printed(v).unwrap();
            let dp = u64::from(p.gpus / (p.tp * p.pp * p.cp));
            if steps * p.mbs * dp != p.gbs {
                broken.push(format!(
                    "{} {} {}",
                    data::text(v, "container"),
                    data::text(v, "model"),
                    data::text(v, "system")
                ));
            }
        }
        assert_eq!(
            broken,
            [
                "25.11 Qwen3_235B_a22B DGX-GB300",
                "25.11 GPT OSS 120B DGX-H100"
            ]
        );
    }

    /// Qwen3-235B's H100 recipe overlaps the all-to-all dispatcher's EP communication
    /// (perf_recipes/qwen/h100/qwen3_moe.py, qwen3_235b_a22b_pretrain_256gpu_h100_fp8cs_config:
    /// overlap_moe_expert_parallel_comm = True) since the 25.11 container; the 25.09 scripts
    /// did not; its B200 FP8 recipe never does
    /// (qwen3_235b_a22b_pretrain_64gpu_b200_fp8cs_config: moe_a2a_overlap = False).
    #[test]
    fn qwen3_235b_overlaps_the_all_to_all_on_h100_from_25_11() {
        let rows = rows().unwrap();
        let overlay = |prefix: &str| {
            let r = row(&rows, prefix);
            r.setup.as_ref().unwrap()["parallel"].clone()
        };
        let h100 = overlay("26.04 Qwen3_235B_a22B H100 x256 FP8");
        assert_eq!(h100["moe_token_dispatcher"], "alltoall");
        assert_eq!(h100["overlap_moe_expert_parallel_comm"], true);
        let h100_2509 = overlay("25.09 Qwen3_235B_a22B (tokendrop) H100 x256 FP8");
        assert_eq!(h100_2509["moe_token_dispatcher"], "alltoall");
        assert!(h100_2509.get("overlap_moe_expert_parallel_comm").is_none());
        let b200 = overlay("25.09 Qwen3_235B_a22B (tokendrop) B200 x64 FP8");
        assert_eq!(b200["moe_token_dispatcher"], "alltoall");
        assert!(
            b200.get("overlap_moe_expert_parallel_comm").is_none(),
            "{b200}"
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
