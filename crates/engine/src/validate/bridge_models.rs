//! The models behind the Megatron-Bridge performance summary's rows: the parsim preset each
//! table name is, and the settings of the model's recipe that the table does not print but
//! that the row needs to be expressible at all (how 61 layers split over virtual stages), or
//! that the recipe is documented to set. Each entry cites where its settings come from; the
//! same settings, with the same citations, are what `tests/engine/blackwell.rs` and
//! `tests/engine/moe_recipes.rs` build these recipes with.

/// One model of the table.
#[derive(Debug, Clone, Copy)]
pub struct BridgeModel {
    /// The table's name, without a parenthesised variant ("DeepSeekV3").
    pub name: &'static str,
    /// The parsim preset, or why no configuration describes the model.
    pub preset: Result<&'static str, &'static str>,
    /// Megatron's `account_for_{embedding,loss}_in_pipeline_split`: the embedding and the loss
    /// each take a layer's slot in the pipeline split.
    pub pipeline_slots: bool,
    /// MTP layers the recipe trains (DeepSeek-V3: 1; "(w/o MTP)" rows: 0).
    pub mtp_layers: u32,
    /// `pipeline_model_parallel_layout` by the number of virtual stages (pp x vpp), written
    /// with the recipe's MTP layers (`m`).
    pub layouts: &'static [(u32, &'static str)],
    /// Muon under the layer-wise distributed optimizer (`dist_muon`, ZeRO-1), as the recipe
    /// trains.
    pub muon: bool,
    /// `recompute_modules` the recipe sets, by the GPU profile and precision they apply to
    /// (`""`: any); absent: Megatron-Core's default, no recomputation.
    pub recompute_modules: &'static [RecomputeRule],
    /// `recompute_modules` of an earlier recipe, told apart by the micro batch the table prints
    /// (the recipe change moved both): consulted before `recompute_modules`.
    pub recompute_at_micro_batch: &'static [MicroBatchRecompute],
    /// Decoder layers whose activations the recipe offloads to the host, on its Megatron-FSDP
    /// rows (the recipes that shard with Megatron-FSDP are the ones that offload), by the GPU
    /// profile and precision they apply to; absent: none.
    pub fsdp_offload_layers: &'static [OffloadRule],
    /// Where the recipe turns the low-precision parameter gather off (`fp8_param_gather`,
    /// NVFP4's `fp4_param_gather`: the bf16 weights stay); elsewhere the mixed-precision
    /// recipe's own setting, on (src/megatron/bridge/training/mixed_precision.py:
    /// `bf16_with_fp8_current_scaling_mixed`, `bf16_with_mxfp8_mixed`, `bf16_with_nvfp4_mixed`).
    pub param_gather_off: &'static [ByRecipe<()>],
    /// Settings of the recipe that parsim's configuration does not say (a token dispatcher
    /// other than all-to-all, CUDA graphs and their scope): the rows are predicted without
    /// them, and each row's notes name them.
    pub unmodelled: &'static [&'static str],
    /// A setting of the recipe without which the row would be another run, and which parsim
    /// cannot say: the row is not expressible, for this reason.
    pub refused: Option<&'static str>,
    /// The recipe's MoE token dispatcher by the GPU profile and precision it applies to
    /// (`""`: any), first match wins; absent: the all-to-all dispatcher.
    pub dispatch: &'static [DispatchRule],
    /// Where the recipe runs the routed experts as Transformer Engine's fused grouped MLP
    /// (`training.fused_grouped_mlp`), by the GPU profile and precision it applies to.
    pub fused_grouped_mlp: &'static [ByRecipe<()>],
    /// Where the recipe captures the whole iteration as one CUDA graph (`cuda_graph_impl =
    /// "full_iteration"`, with HybridEP's static budget `moe_expert_rank_capacity_factor`, so
    /// no MoE layer reads its token counts on the host): `training.cuda_graphs`, by the GPU
    /// profile and precision it applies to.
    pub full_iteration_graphs: &'static [ByRecipe<()>],
    /// Where the settings above come from.
    pub cite: &'static str,
}

/// The token dispatcher (`parallel.moe_token_dispatcher`, `moe_flex_dispatcher_backend`) and
/// EP overlap (`overlap_moe_expert_parallel_comm`) a recipe sets on `gpu` at `precision`.
#[derive(Debug, Clone, Copy)]
pub struct DispatchRule {
    pub gpu: &'static str,
    pub precision: &'static str,
    pub dispatcher: &'static str,
    pub backend: &'static str,
    pub overlap: bool,
    /// The first container whose recipe runs the EP overlap (`""`: every one); the table's
    /// container labels (YY.MM, YY.MM.N) order as text.
    pub overlap_from: &'static str,
}

impl DispatchRule {
    /// Whether the recipe of `container` runs the EP overlap.
    pub fn overlaps_in(&self, container: &str) -> bool {
        self.overlap && container >= self.overlap_from
    }
}

const fn flex(
    gpu: &'static str,
    precision: &'static str,
    backend: &'static str,
    overlap: bool,
) -> DispatchRule {
    DispatchRule {
        gpu,
        precision,
        dispatcher: "flex",
        backend,
        overlap,
        overlap_from: "",
    }
}

/// The all-to-all dispatcher on `gpu`, with the EP overlap from container `overlap_from` on
/// (`None`: never).
const fn alltoall(gpu: &'static str, overlap_from: Option<&'static str>) -> DispatchRule {
    let (overlap, overlap_from) = match overlap_from {
        Some(container) => (true, container),
        None => (false, ""),
    };
    DispatchRule {
        gpu,
        precision: "",
        dispatcher: "alltoall",
        backend: "",
        overlap,
        overlap_from,
    }
}

/// A recipe setting `value` on `gpu` (`""`: any) at `precision` (`""`: any); the first rule
/// that matches a row applies.
#[derive(Debug, Clone, Copy)]
pub struct ByRecipe<T> {
    pub gpu: &'static str,
    pub precision: &'static str,
    pub value: T,
}

/// Selective recomputation of these modules.
pub type RecomputeRule = ByRecipe<&'static [&'static str]>;

/// Selective recomputation of `modules` on `gpu` at `precision` in the recipe that ran at
/// micro batch `micro_batch` (an earlier version of the model's recipe).
#[derive(Debug, Clone, Copy)]
pub struct MicroBatchRecompute {
    pub rule: RecomputeRule,
    pub micro_batch: u64,
}

/// Activation offloading of this many decoder layers (Megatron-Core's `cpu_offloading` with
/// `cpu_offloading_weights = False` and `cpu_offloading_num_layers`).
pub type OffloadRule = ByRecipe<u32>;

/// The value of the first of `rules` that matches `gpu` and `precision`.
fn first_match<T: Copy>(rules: &[ByRecipe<T>], gpu: &str, precision: &str) -> Option<T> {
    rules
        .iter()
        .find(|r| {
            (r.gpu.is_empty() || r.gpu == gpu)
                && (r.precision.is_empty() || r.precision == precision)
        })
        .map(|r| r.value)
}

const fn none() -> BridgeModel {
    BridgeModel {
        name: "",
        preset: Err(""),
        pipeline_slots: false,
        mtp_layers: 0,
        layouts: &[],
        muon: false,
        recompute_modules: &[],
        recompute_at_micro_batch: &[],
        fsdp_offload_layers: &[],
        param_gather_off: &[],
        unmodelled: &[],
        refused: None,
        dispatch: &[],
        fused_grouped_mlp: &[],
        full_iteration_graphs: &[],
        cite: "",
    }
}

const fn rule(
    gpu: &'static str,
    precision: &'static str,
    modules: &'static [&'static str],
) -> RecomputeRule {
    ByRecipe {
        gpu,
        precision,
        value: modules,
    }
}

const fn off(gpu: &'static str, precision: &'static str) -> ByRecipe<()> {
    ByRecipe {
        gpu,
        precision,
        value: (),
    }
}

const fn offload(gpu: &'static str, precision: &'static str, layers: u32) -> OffloadRule {
    ByRecipe {
        gpu,
        precision,
        value: layers,
    }
}

/// Every model name of the table.
pub const MODELS: &[BridgeModel] = &[
    BridgeModel {
        name: "LLAMA3_8B",
        preset: Ok("llama3-8b"),
        ..none()
    },
    BridgeModel {
        name: "LLAMA3_70B",
        preset: Ok("llama3-70b"),
        fsdp_offload_layers: &[
            offload("b200", "fp8", 5),
            offload("gb200", "bf16", 20),
            offload("gb200", "fp8", 40),
            offload("gb300", "bf16", 30),
            offload("gb300", "fp8", 20),
        ],
        cite: "Megatron-Bridge perf_recipes/llama/{b200,gb200,gb300}/llama3.py \
               (llama3_70b_pretrain_64gpu_*_config, commit 067f987d): the Megatron-FSDP configs \
               offload cpu_offloading_num_layers decoder layers' activations (weights kept)",
        ..none()
    },
    BridgeModel {
        name: "LLAMA3.1_405B",
        preset: Ok("llama3-405b"),
        pipeline_slots: true,
        fsdp_offload_layers: &[
            offload("b300", "bf16", 40),
            offload("gb300", "bf16", 40),
            offload("gb200", "fp8", 95),
        ],
        cite: "Megatron-Bridge's Llama 3.1 405B recipe: the embedding and the loss take a slot \
               each, 126 layers in 128 slots; perf_recipes/llama/{b300,gb300}/llama31.py \
               (llama31_405b_pretrain_*gpu_*_bf16_config, commit 067f987d): the Megatron-FSDP \
               configs offload 40 decoder layers' activations; the GB200 FP8 Megatron-FSDP \
               config (tp 2, the 25.09 row) offloads 95 (v0.1.0rc4's \
               scripts/performance/configs/llama31/llama31_405b_llm_pretrain.yaml, perf_matrix \
               gb200 fp8_cs and fp8_ds: cpu_offloading_num_layers 95)",
        ..none()
    },
    BridgeModel {
        name: "DeepSeekV3",
        preset: Ok("deepseek-v3"),
        mtp_layers: 1,
        layouts: &[
            (4, "Et*16|t*16|t*16|t*13mL"),
            (8, "Et*8|(t*8|)*6,t*5mL"),
            (16, "Et*4|(t*4|)*14,tmL"),
        ],
        recompute_modules: &[
            rule("h100-sxm", "", &["mla_up_proj", "mlp"]),
            rule("b200", "mxfp8", &["mla_up_proj", "mlp"]),
            rule("b200", "nvfp4", &["mla_up_proj", "layernorm", "moe_act"]),
            rule("b200", "", &["mla_up_proj"]),
            rule("b300", "", &["mla_up_proj"]),
            rule("gb200", "fp8", &["mlp"]),
            rule("gb200", "nvfp4", &["mlp"]),
            rule("gb200", "", &["mla_up_proj"]),
            rule("gb300", "bf16", &["moe_act"]),
            rule("gb300", "mxfp8", &[]),
            rule("gb300", "", &["mla_up_proj"]),
        ],
        recompute_at_micro_batch: &[MicroBatchRecompute {
            rule: rule("gb300", "mxfp8", &["mla_up_proj"]),
            micro_batch: 2,
        }],
        param_gather_off: &[off("b200", "nvfp4")],
        dispatch: &[
            flex("b200", "", "deepep", true),
            flex("b300", "", "hybridep", true),
            flex("gb200", "", "hybridep", true),
            flex("gb300", "", "hybridep", true),
        ],
        cite: "Megatron-Bridge's DeepSeek-V3 recipe: one MTP layer, and \
               set_deepseek_v3_pipeline_model_parallel_layout's layouts for 4, 8 and 16 virtual \
               stages (the embedding first, the MTP layer and the loss last); \
               perf_recipes/deepseek/{h100,b200,b300,gb200,gb300}/deepseek_v3.py \
               (deepseek_v3_pretrain_*_config, commit 067f987d): recompute_modules by system \
               and precision (none in the GB300 MXFP8 config, at micro batch 1); before \
               8af195c0a (2026-06-06, \"DSV3 GB300 MXFP8 full-iter CG recipe\") the GB300 \
               MXFP8 config was DEEPSEEK_V3_PRETRAIN_CONFIG_GB300_V1/V2 of \
               scripts/performance/configs/deepseek/deepseek_workload_base_configs.py: micro \
               batch 2, recompute_modules [mla_up_proj] (the 26.02-26.04.01 rows); the B200 NVFP4 config \
               turns fp4_param_gather off; the dispatcher from those files and common.py's \
               _enable_deepseek_full_iteration_mxfp8: flex with DeepEP on B200, HybridEP \
               elsewhere, overlap_moe_expert_parallel_comm",
        ..none()
    },
    BridgeModel {
        name: "Kimi_K2",
        preset: Ok("kimi-k2"),
        layouts: &[(16, "Et*4|(t*4|)*14tL")],
        muon: true,
        recompute_modules: &[
            rule("b200", "", &["mla_up_proj"]),
            rule("gb200", "", &["mla_up_proj"]),
            rule("gb300", "", &["mla_up_proj"]),
            rule("h100-sxm", "", &["mla_up_proj", "mlp"]),
        ],
        param_gather_off: &[off("", "")],
        dispatch: &[
            flex("gb200", "", "hybridep", false),
            flex("gb300", "", "hybridep", false),
        ],
        cite: "Megatron-Bridge kimi_workload_base_configs.py and kimi_llm_pretrain.py: Muon \
               as dist_muon (recipes/utils/optimizer_utils.py, \
               distributed_muon_with_cosine_annealing; training/optim.py builds it as \
               Megatron-Core's layer-wise distributed optimizer, ddp.use_distributed_optimizer \
               off, so without a parameter layout), recompute_modules by system (GB300: \
               mla_up_proj since commit fecfbc9a1, Mar 2026, as perf_recipes/kimi/gb300/kimi_k2.py \
               today), and _get_kimi_k2_pipeline_layout for 16 virtual stages; \
               perf_recipes/kimi/{h100,b200,gb200,gb300}/kimi_k2.py: fp8_param_gather = False",
        ..none()
    },
    BridgeModel {
        name: "Qwen3_30B_a3B",
        preset: Ok("qwen3-30b-a3b"),
        dispatch: &[
            flex("h100-sxm", "fp8", "hybridep", false),
            flex("b200", "mxfp8", "hybridep", true),
            flex("b300", "mxfp8", "hybridep", true),
            flex("gb200", "mxfp8", "hybridep", true),
            flex("gb300", "mxfp8", "hybridep", true),
            flex("b200", "", "hybridep", false),
            flex("b300", "", "hybridep", false),
            flex("gb200", "", "hybridep", false),
            flex("gb300", "", "hybridep", false),
        ],
        full_iteration_graphs: &[
            off("b300", "mxfp8"),
            off("gb200", "mxfp8"),
            off("gb300", "mxfp8"),
        ],
        cite: "Megatron-Bridge qwen3 performance configs: no recomputation; the dispatcher \
               from perf_recipes/qwen/{h100,b200,b300,gb200,gb300}/qwen3_moe.py and common.py's \
               _enable_hybridep_full_iteration_mxfp8 (commit 067f987d): flex with HybridEP, \
               the EP overlap with MXFP8; the same helper captures the whole iteration as a \
               CUDA graph (qwen3_30b_a3b_pretrain_8gpu_{b300,gb200,gb300}_fp8mx_config; B200's \
               keeps partial graphs: its memory cannot hold the full one)",
        ..none()
    },
    BridgeModel {
        name: "Qwen3_235B_a22B",
        preset: Ok("qwen3-235b-a22b"),
        pipeline_slots: true,
        dispatch: &[
            alltoall("h100-sxm", Some("25.11")),
            flex("b200", "mxfp8", "hybridep", true),
            alltoall("b200", None),
            flex("b300", "mxfp8", "hybridep", true),
            flex("gb200", "mxfp8", "hybridep", true),
            flex("gb300", "mxfp8", "hybridep", true),
            flex("b300", "", "hybridep", false),
            flex("gb200", "", "hybridep", false),
            flex("gb300", "", "hybridep", false),
        ],
        full_iteration_graphs: &[
            off("b200", "mxfp8"),
            off("b300", "mxfp8"),
            off("gb200", "mxfp8"),
            off("gb300", "mxfp8"),
        ],
        cite: "Megatron-Bridge recipes/qwen/qwen3_moe.py: the embedding and the loss take a \
               slot each (94 layers in 96 slots); no recomputation; the dispatcher from \
               perf_recipes/qwen/{h100,b200,b300,gb200,gb300}/qwen3_moe.py (commit 067f987d): \
               all-to-all on H100 and on B200 but for MXFP8, else flex with HybridEP, the EP \
               overlap with MXFP8 and on H100 (qwen3_235b_a22b_pretrain_256gpu_h100_*_config: \
               overlap_moe_expert_parallel_comm and delay_wgrad_compute) from the 25.11 \
               container on: commit cb62f8620 (2025-11-21, \"cuda graph fine grained scope | \
               hybridEP | a2a overlap\") set moe_a2a_overlap on the H100 presets of \
               scripts/performance/configs/qwen/, before the 25.11 summary (2025-12-04); the \
               25.09 scripts (setup_experiment.py, v0.1.0rc4) overlapped on H100 only \
               DeepSeek-V3; with MXFP8 but on 64 B200s the whole iteration as a CUDA \
               graph (common.py's _enable_hybridep_full_iteration_mxfp8)",
        ..none()
    },
    BridgeModel {
        name: "GPT OSS 120B",
        preset: Ok("gpt-oss-120b"),
        recompute_modules: &[
            rule("h100-sxm", "bf16", &["layernorm", "moe_act"]),
            rule("b200", "bf16", &["layernorm", "moe_act"]),
            rule("gb200", "bf16", &["layernorm", "moe_act"]),
        ],
        param_gather_off: &[off("", "")],
        dispatch: &[
            flex("gb200", "mxfp8", "hybridep", true),
            flex("gb300", "mxfp8", "hybridep", true),
            flex("b300", "", "hybridep", false),
        ],
        fused_grouped_mlp: &[off("gb200", "mxfp8"), off("gb300", "mxfp8")],
        full_iteration_graphs: &[off("gb200", "mxfp8"), off("gb300", "mxfp8")],
        cite: "Megatron-Bridge gpt_oss_workload_base_configs.py: the H100, B200 and GB200 BF16 \
               configs recompute layernorm and moe_act; the MXFP8 configs recompute nothing; \
               perf_recipes/gpt_oss/common.py: fp8_param_gather and fp4_param_gather = False; \
               the dispatcher from perf_recipes/gpt_oss/{b300,gb200,gb300}/gpt_oss.py and \
               common.py's _apply_gpt_oss_120b_full_iter_fp8mx_configs (commit 067f987d): flex \
               with HybridEP on B300 and for MXFP8 on GB200/GB300, there with the EP overlap \
               and the experts as Transformer Engine's fused grouped MLP \
               (use_transformer_engine_op_fuser, NVTE_CUTEDSL_FUSED_GROUPED_MLP=1; since \
               \"full-iter CG for GPT-OSS 120B\", 2026-06-09), the whole iteration as a CUDA \
               graph with a static HybridEP budget (moe_expert_rank_capacity_factor 1.5)",
        ..none()
    },
    BridgeModel {
        name: "Nemotron_3_Nano",
        preset: Ok("nemotron-3-nano"),
        ..none()
    },
    BridgeModel {
        name: "Nemotron_3_Super",
        preset: Ok("nemotron-3-super"),
        mtp_layers: 1,
        recompute_modules: &[
            rule(
                "b200",
                "bf16",
                &["moe_act", "moe", "layernorm", "core_attn"],
            ),
            rule("b200", "mxfp8", &["moe_act", "layernorm"]),
            rule("b300", "bf16", &["moe_act", "layernorm"]),
            rule("b300", "nvfp4", &["moe_act", "layernorm"]),
        ],
        param_gather_off: &[off("", "nvfp4")],
        dispatch: &[flex("", "", "hybridep", false)],
        unmodelled: &[
            "CUDA graphs over attn, mamba, moe_router and moe_preprocess",
            "the MTP layer run twice (mtp_num_layers 2 with mtp_use_repeated_layer: one \
             block's parameters, counted once here, and one of its two passes)",
        ],
        cite: "Megatron-Bridge perf_recipes/nemotronh/{b200,b300,gb200,gb300}/nemotronh.py \
               (nemotron_3_super_pretrain_64gpu_*_config, commit 067f987d, Aug 2026) and \
               recipes/nemotronh/h100/nemotron_3_super.py: recompute_modules by system and \
               precision (none on GB200 and GB300, nor for B200 NVFP4 or B300 MXFP8), the flex \
               dispatcher with HybridEP, CUDA graphs, one shared MTP block; common.py's \
               _nemotron_3_super_nvfp4_precision: fp4_param_gather = False",
        ..none()
    },
    BridgeModel {
        name: "Nemotron_3_Ultra",
        preset: Ok("nemotron-3-ultra"),
        mtp_layers: 1,
        refused: Some(
            "Nemotron 3 Ultra: its recipe shards with Megatron-FSDP as HSDP (parameters, \
             gradients and optimizer within each 64-GPU NVLink domain, the optimizer again \
             across domains; num_distributed_optimizer_instances = GPUs / 64) and offloads \
             the expert MLP's activations by fine-grained activation offloading; parsim \
             models neither",
        ),
        cite: "Megatron-Bridge perf_recipes/nemotronh/common.py \
               (_apply_nemotron_3_ultra_fsdp_hsdp) and {gb200,gb300}/nemotronh.py \
               (nemotron_3_ultra_pretrain_256gpu_*_fp8mx_config), commit 067f987d",
        ..none()
    },
    BridgeModel {
        name: "Nemotron_3_5_Lightning",
        preset: Err("Nemotron 3.5 Lightning: no preset (its architecture is not in parsim)"),
        ..none()
    },
    BridgeModel {
        name: "DeepSeekV4 Flash",
        preset: Err("DeepSeek-V4 Flash: no preset (its architecture is not in parsim)"),
        ..none()
    },
];

/// A table name split into the model and its parenthesised variant ("DeepSeekV3 (w/o MTP)" ->
/// ("DeepSeekV3", Some("w/o MTP"))).
pub fn split_variant(name: &str) -> (&str, Option<&str>) {
    match name.find(" (") {
        Some(i) if name.ends_with(')') => (&name[..i], Some(&name[i + 2..name.len() - 1])),
        _ => (name, None),
    }
}

/// The model of a table name.
pub fn find(name: &str) -> Option<&'static BridgeModel> {
    let (base, _) = split_variant(name);
    MODELS.iter().find(|m| m.name == base)
}

impl BridgeModel {
    /// The recipe's layout for `stages` virtual stages, with `mtp` MTP layers (the string is
    /// written with the recipe's; without them its `m` is dropped).
    pub fn layout(&self, stages: u32, mtp: u32) -> Option<String> {
        let (_, l) = self.layouts.iter().find(|(n, _)| *n == stages)?;
        Some(if mtp == self.mtp_layers {
            (*l).to_string()
        } else {
            l.replace('m', "")
        })
    }

    /// The token dispatcher the recipe sets on `gpu` at `precision`, if it sets one.
    pub fn dispatch(&self, gpu: &str, precision: &str) -> Option<&'static DispatchRule> {
        self.dispatch.iter().find(|r| {
            (r.gpu.is_empty() || r.gpu == gpu)
                && (r.precision.is_empty() || r.precision == precision)
        })
    }

    /// The modules the recipe recomputes on `gpu` at `precision`, if it sets any.
    pub fn recompute_modules(&self, gpu: &str, precision: &str) -> Option<&'static [&'static str]> {
        first_match(self.recompute_modules, gpu, precision)
    }

    /// [`Self::recompute_modules`] of the recipe that ran at micro batch `micro_batch`: an
    /// earlier recipe's where one is listed for it.
    pub fn recompute_modules_at(
        &self,
        gpu: &str,
        precision: &str,
        micro_batch: u64,
    ) -> Option<&'static [&'static str]> {
        let earlier: Vec<RecomputeRule> = self
            .recompute_at_micro_batch
            .iter()
            .filter(|e| e.micro_batch == micro_batch)
            .map(|e| e.rule)
            .collect();
        first_match(&earlier, gpu, precision).or_else(|| self.recompute_modules(gpu, precision))
    }

    /// Whether the recipe on `gpu` at `precision` gathers its weights in their low-precision
    /// format (`fp8_param_gather`, `fp4_param_gather`).
    pub fn gathers_low_precision(&self, gpu: &str, precision: &str) -> bool {
        matches!(precision, "fp8" | "mxfp8" | "nvfp4")
            && first_match(self.param_gather_off, gpu, precision).is_none()
    }

    /// Whether the recipe fuses the routed experts into one grouped MLP on `gpu` at
    /// `precision`.
    pub fn fuses_grouped_mlp(&self, gpu: &str, precision: &str) -> bool {
        first_match(self.fused_grouped_mlp, gpu, precision).is_some()
    }

    /// Whether the recipe on `gpu` at `precision` runs the whole iteration as a CUDA graph.
    pub fn graphs_full_iteration(&self, gpu: &str, precision: &str) -> bool {
        first_match(self.full_iteration_graphs, gpu, precision).is_some()
    }

    /// The decoder layers the recipe's Megatron-FSDP run on `gpu` at `precision` offloads.
    pub fn fsdp_offload_layers(&self, gpu: &str, precision: &str) -> u32 {
        first_match(self.fsdp_offload_layers, gpu, precision).unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::pipeline_layout;

    #[test]
    fn every_named_preset_exists() {
        for m in MODELS {
            if let Ok(p) = m.preset {
                assert!(crate::config::presets::preset(p).is_some(), "{}", m.name);
            }
        }
    }

    /// Each layout holds the model's layers, its MTP layers, one embedding and one loss, over
    /// exactly the stage count it is listed for, and so does its MTP-free variant.
    #[test]
    fn layouts_place_every_layer_once() {
        for m in MODELS {
            let Ok(p) = m.preset else { continue };
            let layers = crate::config::presets::preset(p).unwrap().num_layers;
            for &(stages, _) in m.layouts {
                for mtp in [m.mtp_layers, 0] {
                    let l = m.layout(stages, mtp).unwrap();
                    let parsed = pipeline_layout::parse(&l).unwrap();
                    assert_eq!(parsed.len() as u32, stages, "{l}");
                    let decoder: u32 = parsed.iter().map(|s| s.decoder).sum();
                    let mtps: u32 = parsed.iter().map(|s| s.mtp).sum();
                    assert_eq!((decoder, mtps), (layers, mtp), "{l}");
                    assert!(parsed[0].embedding && parsed[parsed.len() - 1].loss, "{l}");
                }
            }
        }
    }

    #[test]
    fn variants_split_off_and_names_are_found() {
        assert_eq!(
            split_variant("DeepSeekV3 (w/o MTP)"),
            ("DeepSeekV3", Some("w/o MTP"))
        );
        assert_eq!(split_variant("GPT OSS 120B"), ("GPT OSS 120B", None));
        assert_eq!(
            find("Qwen3_30B_a3B (tokendrop)").unwrap().name,
            "Qwen3_30B_a3B"
        );
        assert!(find("Unknown").is_none());
        let kimi = find("Kimi_K2").unwrap();
        assert_eq!(
            kimi.recompute_modules("gb300", "mxfp8"),
            Some(&["mla_up_proj"][..])
        );
        assert_eq!(kimi.recompute_modules("b300", "bf16"), None);
        let deepseek = find("DeepSeekV3").unwrap();
        assert_eq!(deepseek.recompute_modules("gb300", "mxfp8"), Some(&[][..]));
        assert_eq!(
            deepseek.recompute_modules_at("gb300", "mxfp8", 1),
            Some(&[][..])
        );
        assert_eq!(
            deepseek.recompute_modules_at("gb300", "mxfp8", 2),
            Some(&["mla_up_proj"][..])
        );
        assert_eq!(
            deepseek.recompute_modules_at("gb200", "fp8", 2),
            Some(&["mlp"][..])
        );
        assert_eq!(
            deepseek.recompute_modules("gb200", "fp8"),
            Some(&["mlp"][..])
        );
        let llama = find("LLAMA3_70B").unwrap();
        assert_eq!(llama.fsdp_offload_layers("gb200", "fp8"), 40);
        assert_eq!(llama.fsdp_offload_layers("h100-sxm", "fp8"), 0);
        let llama31 = find("LLAMA3.1_405B").unwrap();
        assert_eq!(llama31.fsdp_offload_layers("gb200", "fp8"), 95);
        assert_eq!(llama31.fsdp_offload_layers("gb200", "bf16"), 0);
        assert!(llama.gathers_low_precision("gb300", "nvfp4"));
        assert!(!llama.gathers_low_precision("gb300", "bf16"));
        assert!(!deepseek.gathers_low_precision("b200", "nvfp4"));
        assert!(deepseek.gathers_low_precision("b200", "mxfp8"));
        assert!(!find("GPT OSS 120B")
            .unwrap()
            .gathers_low_precision("gb200", "mxfp8"));
    }
}
