//! The fields of torchtitan's `JobConfig` (torchtitan/config/job_config.py at commit 238fa99,
//! the last before its February 2026 move to a Python config registry, plus the `[float8]`
//! and `[mx]` sections of releases before its October 2025 `[quantize]` refactor, commit
//! 24e9105): each field's type, torchtitan's default, and what parsim does with it. One row a
//! field; the reader refuses every section and key not listed.

/// What a field's value may be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ty {
    Bool,
    Int,
    /// A float (an integer is accepted).
    Float,
    Str,
    /// A list of strings (on an override: comma-separated).
    List,
    /// A list of lists of strings (on an override: JSON).
    Lists,
}

impl Ty {
    /// The type in words, for errors.
    pub fn name(self) -> &'static str {
        match self {
            Ty::Bool => "a boolean",
            Ty::Int => "an integer",
            Ty::Float => "a number",
            Ty::Str => "a string",
            Ty::List => "a list of strings",
            Ty::Lists => "a list of lists of strings",
        }
    }
}

/// What parsim does with a field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Effect {
    /// Read into the configuration (src/config/torchtitan/{parallelism,training}.rs).
    Mapped,
    /// Changes neither memory nor step time: accepted and listed in one note.
    NoEffect,
    /// Changes memory or time in a way parsim does not model: accepted only at torchtitan's
    /// default (which parsim's model matches), refused by name otherwise, with the reason.
    Unmodelled(&'static str),
    /// Read as a note only (torch.compile): the estimate uses parsim's kernel model.
    Noted,
}

/// One field: its dotted path, type, torchtitan's default (JSON text; `null` for `None`) and
/// effect.
#[derive(Debug, Clone, Copy)]
pub struct Field {
    pub path: &'static str,
    pub ty: Ty,
    pub default: &'static str,
    pub effect: Effect,
}

const fn f(path: &'static str, ty: Ty, default: &'static str, effect: Effect) -> Field {
    Field {
        path,
        ty,
        default,
        effect,
    }
}

use Effect::{Mapped as M, NoEffect as N, Noted, Unmodelled as U};
use Ty::{Bool as B, Float as F, Int as I, List as L, Lists as LL, Str as S};

const CPU_OFFLOAD: &str = "FSDP's CPUOffloadPolicy (parameters, gradients and optimizer states in host memory) is not modelled";
const BF16_TRAINING: &str = "bf16 parameters, gradients and optimizer states without an fp32 master copy are not modelled (parsim keeps fp32 master weights)";
const CUSTOM_MODULE: &str =
    "a custom module can change the model or the job in ways parsim cannot read";
const CUSTOM_SPLIT: &str =
    "an explicit module split per pipeline stage is not read (use the layer weights)";
const CSV_SCHEDULE: &str = "a pipeline schedule from a CSV file is not modelled";
const LOSS_PARALLEL: &str = "parsim's loss is vocab-parallel over TP (loss parallel); gathering the logits first is not modelled";
const EARLY_STEP: &str =
    "the optimizer step in backward (gradients freed as they are used) is not modelled";
const OPT_IMPL: &str =
    "parsim's optimizer time is the fused implementation's; foreach and for-loop are not modelled";
const DETERMINISTIC: &str = "deterministic kernels run slower than parsim's kernel model";
const GC_DEBUG: &str = "a gc.collect() every step adds host time parsim does not model";
const AC_EARLY_STOP: &str = "stopping recomputation early is not modelled";
const AC_DEBUG: &str = "activation-checkpoint debugging runs slower than parsim's model";
const FT: &str = "TorchFT's fault-tolerant HSDP with dynamic replica groups is not modelled";
const COMM_MODE: &str = "a fake or local-tensor communication backend is a dry run, not training";
const FP8_EMULATE: &str = "emulated float8 GEMMs run at no FP8 rate parsim has";

/// Every field parsim knows, by section.
pub const FIELDS: &[Field] = &[
    // [job]
    f("job.config_file", S, "null", N),
    f("job.dump_folder", S, "\"./outputs\"", N),
    f("job.description", S, "\"default job\"", N),
    f("job.print_config", B, "false", N),
    f("job.save_config_file", S, "null", N),
    f("job.custom_config_module", S, "\"\"", U(CUSTOM_MODULE)),
    // [profiling]
    f("profiling.enable_profiling", B, "false", N),
    f("profiling.save_traces_folder", S, "\"profile_traces\"", N),
    f("profiling.profile_freq", I, "10", N),
    f("profiling.profiler_active", I, "1", N),
    f("profiling.profiler_warmup", I, "3", N),
    f("profiling.enable_memory_snapshot", B, "false", N),
    f(
        "profiling.save_memory_snapshot_folder",
        S,
        "\"memory_snapshot\"",
        N,
    ),
    // [metrics]
    f("metrics.log_freq", I, "10", N),
    f("metrics.enable_tensorboard", B, "false", N),
    f("metrics.disable_color_printing", B, "false", N),
    f("metrics.save_tb_folder", S, "\"tb\"", N),
    f("metrics.save_for_all_ranks", B, "false", N),
    f("metrics.enable_wandb", B, "false", N),
    // [model]
    f("model.name", S, "\"llama3\"", M),
    f("model.flavor", S, "\"debugmodel\"", M),
    f("model.hf_assets_path", S, "\"./tests/assets/tokenizer\"", N),
    f("model.tokenizer_path", S, "null", N),
    f("model.converters", L, "[]", M),
    f("model.print_after_conversion", B, "false", N),
    // [optimizer]
    f("optimizer.name", S, "\"AdamW\"", M),
    f("optimizer.lr", F, "0.0008", N),
    f("optimizer.beta1", F, "0.9", N),
    f("optimizer.beta2", F, "0.95", N),
    f("optimizer.eps", F, "1e-8", N),
    f("optimizer.weight_decay", F, "0.1", N),
    f("optimizer.implementation", S, "\"fused\"", U(OPT_IMPL)),
    f(
        "optimizer.early_step_in_backward",
        B,
        "false",
        U(EARLY_STEP),
    ),
    // [lr_scheduler]
    f("lr_scheduler.warmup_steps", I, "200", N),
    f("lr_scheduler.total_steps", I, "null", N),
    f("lr_scheduler.decay_ratio", F, "null", N),
    f("lr_scheduler.decay_type", S, "\"linear\"", N),
    f("lr_scheduler.min_lr_factor", F, "0.0", N),
    // [training]
    f("training.dataset", S, "\"c4_test\"", N),
    f("training.dataset_path", S, "null", N),
    f("training.local_batch_size", I, "8", M),
    f("training.global_batch_size", I, "-1", M),
    f("training.seq_len", I, "2048", M),
    f("training.max_norm", F, "1.0", N),
    f("training.steps", I, "10000", M),
    f("training.enable_cpu_offload", B, "false", U(CPU_OFFLOAD)),
    f("training.dtype", S, "\"float32\"", U(BF16_TRAINING)),
    f("training.mixed_precision_param", S, "\"bfloat16\"", M),
    f("training.mixed_precision_reduce", S, "\"float32\"", M),
    f("training.gc_freq", I, "50", N),
    f("training.gc_debug", B, "false", U(GC_DEBUG)),
    f("training.dataloader.num_workers", I, "0", N),
    f("training.dataloader.persistent_workers", B, "false", N),
    f("training.dataloader.pin_memory", B, "false", N),
    f("training.dataloader.prefetch_factor", I, "null", N),
    // [parallelism] (the expert fields apply to MoE models only: no llama3 flavor has experts,
    // so they change nothing here; torchtitan: "No effect for non-MoE models")
    f("parallelism.data_parallel_replicate_degree", I, "1", M),
    f("parallelism.data_parallel_shard_degree", I, "-1", M),
    f(
        "parallelism.fsdp_reshard_after_forward",
        S,
        "\"default\"",
        M,
    ),
    f("parallelism.tensor_parallel_degree", I, "1", M),
    f(
        "parallelism.disable_loss_parallel",
        B,
        "false",
        U(LOSS_PARALLEL),
    ),
    f("parallelism.enable_async_tensor_parallel", B, "false", M),
    f("parallelism.pipeline_parallel_degree", I, "1", M),
    f(
        "parallelism.module_fqns_per_model_part",
        LL,
        "null",
        U(CUSTOM_SPLIT),
    ),
    f(
        "parallelism.pipeline_parallel_first_stage_less_layers",
        I,
        "1",
        M,
    ),
    f(
        "parallelism.pipeline_parallel_last_stage_less_layers",
        I,
        "1",
        M,
    ),
    f(
        "parallelism.pipeline_parallel_layers_per_stage",
        I,
        "null",
        M,
    ),
    f("parallelism.pipeline_parallel_schedule", S, "\"1F1B\"", M),
    f(
        "parallelism.pipeline_parallel_schedule_csv",
        S,
        "\"\"",
        U(CSV_SCHEDULE),
    ),
    f("parallelism.pipeline_parallel_microbatch_size", I, "1", M),
    f(
        "parallelism.pipeline_parallel_expert_parallel_overlap",
        B,
        "true",
        N,
    ),
    f("parallelism.context_parallel_degree", I, "1", M),
    f(
        "parallelism.context_parallel_load_balancer",
        S,
        "\"headtail\"",
        M,
    ),
    f(
        "parallelism.context_parallel_rotate_method",
        S,
        "\"allgather\"",
        M,
    ),
    f("parallelism.expert_parallel_degree", I, "1", N),
    f("parallelism.expert_tensor_parallel_degree", I, "1", N),
    f(
        "parallelism.expert_parallel_comm_backend",
        S,
        "\"standard\"",
        N,
    ),
    // [checkpoint]
    f("checkpoint.enable", B, "false", N),
    f("checkpoint.enable_ft_dataloader_checkpoints", B, "true", N),
    f("checkpoint.folder", S, "\"checkpoint\"", N),
    f("checkpoint.interval", I, "500", N),
    f("checkpoint.initial_load_path", S, "null", N),
    f("checkpoint.initial_load_model_only", B, "true", N),
    f("checkpoint.initial_load_in_hf", B, "false", N),
    f("checkpoint.initial_load_in_hf_quantized", B, "false", N),
    f("checkpoint.last_save_model_only", B, "true", N),
    f("checkpoint.last_save_in_hf", B, "false", N),
    f("checkpoint.export_dtype", S, "\"float32\"", N),
    f("checkpoint.async_mode", S, "\"disabled\"", N),
    f("checkpoint.keep_latest_k", I, "10", N),
    f("checkpoint.load_step", I, "-1", N),
    f("checkpoint.exclude_from_loading", L, "[]", N),
    f("checkpoint.enable_first_step_checkpoint", B, "false", N),
    f("checkpoint.create_seed_checkpoint", B, "false", N),
    f("checkpoint.load_only", B, "false", N),
    // [activation_checkpoint]
    f("activation_checkpoint.mode", S, "\"selective\"", M),
    f("activation_checkpoint.selective_ac_option", S, "\"2\"", M),
    f(
        "activation_checkpoint.per_op_sac_force_recompute_mm_shapes_by_fqns",
        L,
        "[\"moe.router.gate\"]",
        N,
    ),
    f(
        "activation_checkpoint.early_stop",
        B,
        "false",
        U(AC_EARLY_STOP),
    ),
    f("activation_checkpoint.memory_budget", F, "0.5", N),
    f(
        "activation_checkpoint.visualize_memory_budget_pareto",
        B,
        "false",
        N,
    ),
    f("activation_checkpoint.preserve_rng_state", B, "true", N),
    f(
        "activation_checkpoint.determinism_check",
        S,
        "\"default\"",
        N,
    ),
    f("activation_checkpoint.debug", B, "false", U(AC_DEBUG)),
    // [compile]
    f("compile.enable", B, "false", Noted),
    f("compile.components", L, "[\"model\", \"loss\"]", Noted),
    f("compile.backend", S, "\"inductor\"", Noted),
    // [quantize] (torchtitan from October 2025; the grouped-GEMM fields apply to MoE experts
    // only, which no llama3 flavor has)
    f(
        "quantize.linear.float8.enable_fsdp_float8_all_gather",
        B,
        "false",
        M,
    ),
    f(
        "quantize.linear.float8.precompute_float8_dynamic_scale_for_fsdp",
        B,
        "false",
        N,
    ),
    f("quantize.linear.float8.recipe_name", S, "null", M),
    f("quantize.linear.float8.filter_fqns", L, "[]", M),
    f("quantize.linear.float8.emulate", B, "false", U(FP8_EMULATE)),
    f(
        "quantize.linear.mx.mxfp8_dim1_cast_kernel_choice",
        S,
        "\"triton\"",
        N,
    ),
    f("quantize.linear.mx.recipe_name", S, "\"mxfp8_cublas\"", M),
    f("quantize.linear.mx.filter_fqns", L, "[\"output\"]", M),
    f("quantize.grouped_mm.float8.fqns", L, "[]", N),
    f("quantize.grouped_mm.mx.recipe_name", S, "\"mxfp8\"", N),
    f("quantize.grouped_mm.mx.fqns", L, "[]", N),
    // [float8] and [mx] (torchtitan before October 2025)
    f("float8.enable_fsdp_float8_all_gather", B, "false", M),
    f(
        "float8.precompute_float8_dynamic_scale_for_fsdp",
        B,
        "false",
        N,
    ),
    f("float8.recipe_name", S, "null", M),
    f("float8.filter_fqns", L, "[]", M),
    f("float8.emulate", B, "false", U(FP8_EMULATE)),
    f("float8.moe_fqns_prototype", L, "[]", N),
    f("mx.mxfp8_dim1_cast_kernel_choice", S, "\"triton\"", N),
    f("mx.recipe_name", S, "\"mxfp8_cublas\"", M),
    f("mx.filter_fqns", L, "[\"output\"]", M),
    f("mx.moe_fqns_prototype", L, "[]", N),
    // [comm]
    f("comm.init_timeout_seconds", I, "300", N),
    f("comm.train_timeout_seconds", I, "100", N),
    f("comm.trace_buf_size", I, "20000", N),
    f("comm.save_traces_folder", S, "\"comm_traces\"", N),
    f("comm.save_traces_file_prefix", S, "\"rank_\"", N),
    f("comm.mode", S, "\"default\"", U(COMM_MODE)),
    // [memory_estimation]
    f("memory_estimation.enable", B, "false", N),
    f("memory_estimation.disable_fake_mode", B, "false", N),
    // [fault_tolerance]
    f("fault_tolerance.enable", B, "false", U(FT)),
    f("fault_tolerance.process_group", S, "\"gloo\"", N),
    f("fault_tolerance.process_group_timeout_ms", I, "10000", N),
    f("fault_tolerance.replica_id", I, "0", N),
    f("fault_tolerance.group_size", I, "0", N),
    f("fault_tolerance.min_replica_size", I, "1", N),
    f("fault_tolerance.semi_sync_method", S, "null", N),
    // [experimental]
    f("experimental.custom_import", S, "\"\"", U(CUSTOM_MODULE)),
    f(
        "experimental.custom_args_module",
        S,
        "\"\"",
        U(CUSTOM_MODULE),
    ),
    // [validation]
    f("validation.enable", B, "false", N),
    f("validation.dataset", S, "\"c4_validation\"", N),
    f("validation.dataset_path", S, "null", N),
    f("validation.local_batch_size", I, "8", N),
    f("validation.seq_len", I, "2048", N),
    f("validation.freq", I, "10", N),
    f("validation.steps", I, "-1", N),
    f("validation.dataloader.num_workers", I, "0", N),
    f("validation.dataloader.persistent_workers", B, "false", N),
    f("validation.dataloader.pin_memory", B, "false", N),
    f("validation.dataloader.prefetch_factor", I, "null", N),
    // [debug]
    f("debug.seed", I, "null", N),
    f("debug.deterministic", B, "false", U(DETERMINISTIC)),
    f("debug.deterministic_warn_only", B, "false", N),
    f("debug.moe_force_load_balance", B, "false", N),
];

/// The field at `path`, if torchtitan has one.
pub fn field(path: &str) -> Option<&'static Field> {
    FIELDS.iter().find(|f| f.path == path)
}

/// Whether `path` is a section (a table) of the job: a proper prefix of some field's path.
pub fn is_section(path: &str) -> bool {
    FIELDS.iter().any(|f| {
        f.path
            .strip_prefix(path)
            .is_some_and(|rest| rest.starts_with('.'))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every default parses as JSON of its field's type (or null), and no path is listed twice.
    #[test]
    fn defaults_parse_and_paths_are_unique() {
        let mut seen = std::collections::HashSet::new();
        for f in FIELDS {
            assert!(seen.insert(f.path), "{} twice", f.path);
            let v: serde_json::Value = serde_json::from_str(f.default).unwrap();
            let ok = match f.ty {
                _ if v.is_null() => true,
                Ty::Bool => v.is_boolean(),
                Ty::Int => v.is_i64(),
                Ty::Float => v.is_number(),
                Ty::Str => v.is_string(),
                Ty::List | Ty::Lists => v.is_array(),
            };
            assert!(
                ok,
                "{}: default {} is not {}",
                f.path,
                f.default,
                f.ty.name()
            );
        }
        assert!(is_section("quantize.linear") && is_section("training"));
        assert!(!is_section("training.seq_len") && !is_section("train"));
    }
}
