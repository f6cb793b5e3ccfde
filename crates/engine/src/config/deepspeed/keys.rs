//! Every key a DeepSpeed configuration may hold, and what the import does with it. The lists
//! are read from DeepSpeed's own config code (deepspeedai/DeepSpeed at commit edaa7221):
//! `DeepSpeedConfig._initialize_params` (deepspeed/runtime/config.py) and the keys of
//! deepspeed/runtime/constants.py for the top level; `DeepSpeedZeroConfig`
//! (deepspeed/runtime/zero/config.py), `DeepSpeedBF16Config` / `DeepSpeedFP16Config`
//! (deepspeed/runtime/precision_config.py), `DeepSpeedZeroOffload*Config`
//! (deepspeed/runtime/zero/offload_config.py) and the `activation_checkpointing` constants
//! (deepspeed/runtime/activation_checkpointing/config.py) for the sections.
//!
//! A key is mapped (it lands in the override layer), has no effect on memory or step time
//! (accepted, listed in one note), is modelled only at DeepSpeed's default (any other value is
//! refused by name), or is refused whenever it turns something on that parsim does not model.
//! A key in none of the tables is not DeepSpeed's and is refused.

/// What the import does with one key.
#[derive(Debug, Clone, Copy)]
pub enum Rule {
    /// Read into the override layer (`super::import` names each).
    Mapped,
    /// Changes neither memory nor step time: accepted and listed.
    NoEffect,
    /// A section whose contents change neither memory nor step time (logging, monitors,
    /// checkpoint engines, the scheduler): accepted whole and listed.
    NoEffectSection,
    /// Modelled at DeepSpeed's default only; another value is refused with the reason.
    DefaultOnly(Default, &'static str),
    /// Refused whenever present, with the reason.
    Unmodelled(&'static str),
    /// A section refused when its `enabled` is true (accepted, and listed, when false).
    UnlessDisabled(&'static str),
    /// A section with keys of its own.
    Section(&'static [(&'static str, Rule)]),
    /// An offload section: accepted at `device` "none", refused otherwise with the reason.
    Offload(&'static str),
}

/// DeepSpeed's default of a [`Rule::DefaultOnly`] key.
#[derive(Debug, Clone, Copy)]
pub enum Default {
    Bool(bool),
    Num(f64),
    /// The key's default is None: any value given sets something.
    Null,
}

use Rule::{
    DefaultOnly, Mapped, NoEffect, NoEffectSection, Offload, Section, UnlessDisabled, Unmodelled,
};

/// The top level (deepspeed/runtime/config.py `_initialize_params`, constants.py).
pub const TOP: &[(&str, Rule)] = &[
    ("train_batch_size", Mapped),
    ("train_micro_batch_size_per_gpu", Mapped),
    ("gradient_accumulation_steps", Mapped),
    ("zero_optimization", Section(ZERO)),
    ("bf16", Section(BF16)),
    ("bfloat16", Section(BF16)),
    ("fp16", Section(FP16)),
    ("optimizer", Section(OPTIMIZER)),
    ("data_types", Section(DATA_TYPES)),
    ("activation_checkpointing", Section(ACTIVATION_CHECKPOINTING)),
    ("scheduler", NoEffectSection),
    ("steps_per_print", NoEffect),
    ("wall_clock_breakdown", NoEffect),
    ("memory_breakdown", NoEffect),
    ("dump_state", NoEffect),
    ("gradient_clipping", NoEffect),
    ("prescale_gradients", NoEffect),
    ("gradient_predivide_factor", NoEffect),
    ("gradient_allreduce_op", NoEffect),
    ("zero_allow_untested_optimizer", NoEffect),
    ("zero_force_ds_cpu_optimizer", NoEffect),
    ("managed_gradient_accumulation", NoEffect),
    ("dataloader_drop_last", NoEffect),
    ("log_level", NoEffect),
    ("vocabulary_size", NoEffect),
    ("tensorboard", NoEffectSection),
    ("wandb", NoEffectSection),
    ("csv_monitor", NoEffectSection),
    ("comet", NoEffectSection),
    ("comms_logger", NoEffectSection),
    ("flops_profiler", NoEffectSection),
    ("autotuning", NoEffectSection),
    ("checkpoint", NoEffectSection),
    ("nebula", NoEffectSection),
    ("datastates", NoEffectSection),
    ("timers", NoEffectSection),
    ("aio", NoEffectSection),
    ("eigenvalue", NoEffectSection),
    (
        "sparse_gradients",
        DefaultOnly(
            Default::Bool(false),
            "sparse (CSR) embedding gradients are not modelled",
        ),
    ),
    (
        "disable_allgather",
        DefaultOnly(
            Default::Bool(false),
            "the ZeRO parameter all-gather turned off is not modelled",
        ),
    ),
    (
        "communication_data_type",
        DefaultOnly(
            Default::Null,
            "a gradient communication dtype of its own is not modelled (parsim reduces gradients in training.grad_dtype)",
        ),
    ),
    (
        "seq_parallel_communication_data_type",
        DefaultOnly(
            Default::Null,
            "DeepSpeed-Ulysses' communication dtype is not modelled",
        ),
    ),
    (
        "graph_harvesting",
        DefaultOnly(
            Default::Bool(false),
            "CUDA-graph capture of the optimizer step is not modelled",
        ),
    ),
    (
        "use_data_before_expert_parallelism",
        DefaultOnly(
            Default::Bool(false),
            "DeepSpeed-MoE's data-before-expert rank order is not modelled",
        ),
    ),
    (
        "amp",
        UnlessDisabled("NVIDIA Apex AMP mixed precision is not modelled (use bf16 or fp16)"),
    ),
    (
        "torch_autocast",
        UnlessDisabled("torch.autocast mixed precision (fp32 parameters) is not modelled"),
    ),
    (
        "progressive_layer_drop",
        UnlessDisabled("progressive layer dropping (fewer layers run per step) is not modelled"),
    ),
    (
        "curriculum_learning",
        UnlessDisabled("curriculum learning (a sequence length that changes per step) is not modelled"),
    ),
    (
        "data_efficiency",
        UnlessDisabled("data efficiency (random-LTD token dropping, curriculum) is not modelled"),
    ),
    (
        "elasticity",
        UnlessDisabled("elastic training chooses the batch and GPU count itself; give them instead"),
    ),
    (
        "hybrid_engine",
        UnlessDisabled("the RLHF hybrid engine (training and generation) is not modelled"),
    ),
    (
        "sparse_attention",
        Unmodelled("block-sparse attention is not modelled"),
    ),
    (
        "compression_training",
        Unmodelled("compression training (quantization, pruning, layer reduction) is not modelled"),
    ),
    (
        "weight_quantization",
        Unmodelled("quantized weights are not modelled"),
    ),
    (
        "compile",
        Unmodelled("torch.compile / DeepCompile passes (their memory and overlap) are not modelled"),
    ),
    (
        "pipeline",
        Unmodelled("the PipelineEngine's settings are not read: give the pipeline degree as --pp"),
    ),
    (
        "tensor_parallel",
        Unmodelled("DeepSpeed AutoTP is not modelled: give Megatron-style tensor parallelism as --tp"),
    ),
    (
        "expert_parallel",
        Unmodelled("DeepSpeed AutoEP is not modelled: give expert parallelism as --ep"),
    ),
    (
        "sequence_parallel_size",
        Unmodelled("DeepSpeed-Ulysses is not read from the JSON: give it as --cp N --cp-comm a2a"),
    ),
];

/// `zero_optimization` (deepspeed/runtime/zero/config.py `DeepSpeedZeroConfig`).
const ZERO: &[(&str, Rule)] = &[
    ("stage", Mapped),
    ("reduce_bucket_size", Mapped),
    ("overlap_comm", Mapped),
    ("stage3_prefetch_bucket_size", Mapped),
    ("prefetch_bucket_size", Mapped),
    ("stage3_param_persistence_threshold", Mapped),
    ("param_persistence_threshold", Mapped),
    ("stage3_max_live_parameters", Mapped),
    ("max_live_parameters", Mapped),
    // utils.py all_gather_dp_groups: with torch's all_gather_into_tensor (torch >= 1.13) the
    // ZeRO-1/2 parameter all-gather is one call per group and the bucket size is not read.
    ("allgather_bucket_size", NoEffect),
    ("load_from_fp32_weights", NoEffect),
    ("elastic_checkpoint", NoEffect),
    ("stage3_gather_16bit_weights_on_model_save", NoEffect),
    ("gather_16bit_weights_on_model_save", NoEffect),
    ("stage3_gather_fp16_weights_on_model_save", NoEffect),
    ("ignore_unused_parameters", NoEffect),
    ("legacy_stage1", NoEffect),
    ("log_trace_cache_warnings", NoEffect),
    ("enable_sanity_checks", NoEffect),
    ("pipeline_loading_checkpoint", NoEffect),
    ("override_module_apply", NoEffect),
    ("save_muon_momentum_buffer_in_memory", NoEffect),
    // CPU-offload settings, read only with an offload (refused below).
    ("round_robin_gradients", NoEffect),
    ("cpu_offload_use_pin_memory", NoEffect),
    (
        "contiguous_gradients",
        DefaultOnly(
            Default::Bool(true),
            "gradients left where autograd puts them (no contiguous buffer) are not modelled",
        ),
    ),
    (
        "reduce_scatter",
        DefaultOnly(
            Default::Bool(true),
            "gradients all-reduced instead of reduce-scattered are not modelled",
        ),
    ),
    (
        "allgather_partitions",
        DefaultOnly(
            Default::Bool(true),
            "parameters gathered by broadcasts instead of an all-gather are not modelled",
        ),
    ),
    (
        "use_multi_rank_bucket_allreduce",
        DefaultOnly(
            Default::Bool(true),
            "per-rank reduce calls instead of one bucket all-reduce are not modelled",
        ),
    ),
    (
        "sub_group_size",
        DefaultOnly(
            Default::Num(1e9),
            "the optimizer step's fp32 sub-groups of another size are not modelled",
        ),
    ),
    (
        "stage3_max_reuse_distance",
        DefaultOnly(
            Default::Num(1e9),
            "ZeRO-3 parameters kept gathered for reuse are not modelled beyond DeepSpeed's default",
        ),
    ),
    (
        "max_reuse_distance",
        DefaultOnly(
            Default::Num(1e9),
            "ZeRO-3 parameters kept gathered for reuse are not modelled beyond DeepSpeed's default",
        ),
    ),
    (
        "stage3_model_persistence_threshold",
        DefaultOnly(
            Default::Num(9.223372036854776e18),
            "a cap on persistent ZeRO-3 parameters is not modelled",
        ),
    ),
    (
        "model_persistence_threshold",
        DefaultOnly(
            Default::Num(9.223372036854776e18),
            "a cap on persistent ZeRO-3 parameters is not modelled",
        ),
    ),
    (
        "stage3_module_granularity_threshold",
        DefaultOnly(
            Default::Num(0.0),
            "fine-grained modules fetched as one unit are not modelled",
        ),
    ),
    (
        "module_granularity_threshold",
        DefaultOnly(
            Default::Num(0.0),
            "fine-grained modules fetched as one unit are not modelled",
        ),
    ),
    (
        "stage3_use_all_reduce_for_fetch_params",
        DefaultOnly(
            Default::Bool(false),
            "ZeRO-3 parameters fetched by all-reduce are not modelled",
        ),
    ),
    (
        "use_all_reduce_for_fetch_params",
        DefaultOnly(
            Default::Bool(false),
            "ZeRO-3 parameters fetched by all-reduce are not modelled",
        ),
    ),
    (
        "stage3_allgather_sequential",
        DefaultOnly(
            Default::Bool(false),
            "ZeRO-3 parameters gathered one by one are not modelled",
        ),
    ),
    (
        "allgather_sequential",
        DefaultOnly(
            Default::Bool(false),
            "ZeRO-3 parameters gathered one by one are not modelled",
        ),
    ),
    (
        "zero_hpz_partition_size",
        DefaultOnly(
            Default::Num(1.0),
            "ZeRO++ hierarchical partitioning (hpZ) is not modelled",
        ),
    ),
    (
        "zero_quantized_weights",
        DefaultOnly(
            Default::Bool(false),
            "ZeRO++ quantized weight all-gathers (qwZ) are not modelled",
        ),
    ),
    (
        "zero_quantized_nontrainable_weights",
        DefaultOnly(
            Default::Bool(false),
            "quantized frozen weights are not modelled",
        ),
    ),
    (
        "zero_quantized_gradients",
        DefaultOnly(
            Default::Bool(false),
            "ZeRO++ quantized gradient reduction (qgZ) is not modelled",
        ),
    ),
    (
        "zeropp_loco_param",
        DefaultOnly(Default::Null, "LoCo-ZeRO++ is not modelled"),
    ),
    (
        "mics_shard_size",
        DefaultOnly(Default::Num(-1.0), "MiCS sharding groups are not modelled"),
    ),
    (
        "mics_hierarchical_params_gather",
        DefaultOnly(
            Default::Bool(false),
            "MiCS hierarchical gathers are not modelled",
        ),
    ),
    (
        "memory_efficient_linear",
        DefaultOnly(
            Default::Bool(true),
            "ZeRO-3 linear layers saving their full inputs are not modelled",
        ),
    ),
    (
        "offload_optimizer",
        Offload("CPU optimizer offload is not modelled"),
    ),
    (
        "offload_param",
        Offload("parameter offload is not modelled"),
    ),
    (
        "cpu_offload",
        DefaultOnly(Default::Null, "CPU optimizer offload is not modelled"),
    ),
    (
        "cpu_offload_param",
        DefaultOnly(Default::Null, "parameter offload is not modelled"),
    ),
    (
        "zenflow",
        DefaultOnly(
            Default::Null,
            "ZenFlow (optimizer steps on the CPU, overlapped) is not modelled",
        ),
    ),
    (
        "leaf_module",
        Unmodelled("ZeRO-3 leaf modules (gathered as one unit) are not modelled"),
    ),
];

/// `bf16` (precision_config.py `DeepSpeedBF16Config`).
const BF16: &[(&str, Rule)] = &[
    ("enabled", Mapped),
    ("check_grad_overflow", NoEffect),
    (
        "immediate_grad_update",
        DefaultOnly(
            Default::Bool(false),
            "gradients applied to the fp32 accumulator as they are produced are not modelled",
        ),
    ),
    ("bf16_master_weights_and_grads", Mapped),
    ("bf16_optimizer_states", Mapped),
];

/// `fp16` (precision_config.py `DeepSpeedFP16Config`): the loss-scaling settings change
/// neither memory nor time.
const FP16: &[(&str, Rule)] = &[
    ("enabled", Mapped),
    ("auto_cast", NoEffect),
    ("loss_scale", NoEffect),
    ("initial_scale_power", NoEffect),
    ("loss_scale_window", NoEffect),
    ("hysteresis", NoEffect),
    ("consecutive_hysteresis", NoEffect),
    ("min_loss_scale", NoEffect),
    (
        "fp16_master_weights_and_grads",
        DefaultOnly(
            Default::Bool(false),
            "fp16 master weights and gradients are not modelled",
        ),
    ),
];

/// `optimizer` (config.py `get_optimizer_name` / `get_optimizer_params`): its type is
/// mapped; its params (lr, betas, eps, weight decay) change neither memory nor time.
const OPTIMIZER: &[(&str, Rule)] = &[
    ("type", Mapped),
    ("params", NoEffectSection),
    ("legacy_fusion", NoEffect),
];

/// `data_types` (config.py: `grad_accum_dtype`, `param_dtype`, `buffer_dtype`).
const DATA_TYPES: &[(&str, Rule)] = &[
    ("grad_accum_dtype", Mapped),
    (
        "param_dtype",
        DefaultOnly(
            Default::Null,
            "a parameter dtype other than the precision's is not modelled",
        ),
    ),
    ("buffer_dtype", NoEffect),
];

/// `activation_checkpointing` (activation_checkpointing/config.py). The section configures
/// `deepspeed.checkpointing.checkpoint`; whether layers are recomputed is the model's choice.
const ACTIVATION_CHECKPOINTING: &[(&str, Rule)] = &[
    (
        "partition_activations",
        DefaultOnly(
            Default::Bool(false),
            "checkpoints partitioned across model-parallel ranks are not modelled",
        ),
    ),
    (
        "cpu_checkpointing",
        DefaultOnly(
            Default::Bool(false),
            "checkpoints offloaded to CPU memory are not modelled",
        ),
    ),
    (
        "contiguous_memory_optimization",
        DefaultOnly(
            Default::Bool(false),
            "checkpoints copied into one preallocated buffer are not modelled",
        ),
    ),
    ("number_checkpoints", NoEffect),
    ("synchronize_checkpoint_boundary", NoEffect),
    ("profile", NoEffect),
];

/// The offload sections' `device` values DeepSpeed knows (offload_config.py
/// `OffloadDeviceEnum`).
pub const OFFLOAD_DEVICES: [&str; 3] = ["none", "cpu", "nvme"];
