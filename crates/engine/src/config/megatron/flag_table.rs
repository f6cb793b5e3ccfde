//! The Megatron-LM flags the reader knows by name: those that map one to one onto a field,
//! those kept to combine later, and those refused because they shape what is not modelled.

/// What a flag's value is read as when it maps one to one onto a field.
#[derive(Clone, Copy)]
pub(super) enum Kind {
    Int,
    Float,
    /// A switch: present means `true`.
    On,
}

/// Flags that map one to one: (flag, section, field, kind).
pub(super) const DIRECT: &[(&str, &str, &str, Kind)] = &[
    ("--kv-channels", "model", "kv_channels", Kind::Int),
    (
        "--max-position-embeddings",
        "model",
        "max_position_embeddings",
        Kind::Int,
    ),
    ("--moe-router-topk", "model", "moe_router_topk", Kind::Int),
    (
        "--moe-ffn-hidden-size",
        "model",
        "moe_ffn_hidden_size",
        Kind::Int,
    ),
    (
        "--moe-shared-expert-intermediate-size",
        "model",
        "moe_shared_expert_intermediate_size",
        Kind::Int,
    ),
    ("--moe-latent-size", "model", "moe_latent_size", Kind::Int),
    (
        "--moe-expert-capacity-factor",
        "model",
        "moe_capacity_factor",
        Kind::Float,
    ),
    (
        "--moe-aux-loss-coeff",
        "model",
        "moe_aux_loss_coeff",
        Kind::Float,
    ),
    (
        "--moe-router-enable-expert-bias",
        "model",
        "moe_router_bias",
        Kind::On,
    ),
    (
        "--moe-router-bias-update-rate",
        "model",
        "moe_router_bias_update_rate",
        Kind::Float,
    ),
    (
        "--activation-func-clamp-value",
        "model",
        "activation_clamp",
        Kind::Float,
    ),
    (
        "--moe-router-force-load-balancing",
        "model",
        "moe_router_force_load_balancing",
        Kind::On,
    ),
    (
        "--moe-router-num-groups",
        "model",
        "moe_router_num_groups",
        Kind::Int,
    ),
    (
        "--moe-router-group-topk",
        "model",
        "moe_router_group_topk",
        Kind::Int,
    ),
    ("--mtp-num-layers", "model", "mtp_num_layers", Kind::Int),
    (
        "--mtp-loss-scaling-factor",
        "model",
        "mtp_loss_scaling_factor",
        Kind::Float,
    ),
    ("--hidden-dropout", "model", "hidden_dropout", Kind::Float),
    (
        "--attention-dropout",
        "model",
        "attention_dropout",
        Kind::Float,
    ),
    ("--expert-model-parallel-size", "parallel", "ep", Kind::Int),
    (
        "--expert-tensor-parallel-size",
        "parallel",
        "expert_tp",
        Kind::Int,
    ),
    (
        "--decoder-first-pipeline-num-layers",
        "parallel",
        "first_stage_layers",
        Kind::Int,
    ),
    (
        "--decoder-last-pipeline-num-layers",
        "parallel",
        "last_stage_layers",
        Kind::Int,
    ),
    (
        "--account-for-embedding-in-pipeline-split",
        "parallel",
        "account_for_embedding_in_pipeline_split",
        Kind::On,
    ),
    (
        "--account-for-loss-in-pipeline-split",
        "parallel",
        "account_for_loss_in_pipeline_split",
        Kind::On,
    ),
    (
        "--ddp-bucket-size",
        "parallel",
        "ddp_bucket_size",
        Kind::Int,
    ),
    ("--seq-length", "training", "seq_length", Kind::Int),
    (
        "--micro-batch-size",
        "training",
        "micro_batch_size",
        Kind::Int,
    ),
    (
        "--global-batch-size",
        "training",
        "global_batch_size",
        Kind::Int,
    ),
];

/// Flags with an integer value that the reader's `State::finish` combines.
pub(super) const KEPT_INTS: &[&str] = &[
    "--num-layers",
    "--hidden-size",
    "--ffn-hidden-size",
    "--num-attention-heads",
    "--num-query-groups",
    "--vocab-size",
    "--padded-vocab-size",
    "--make-vocab-size-divisible-by",
    "--num-experts",
    "--tensor-model-parallel-size",
    "--pipeline-model-parallel-size",
    "--context-parallel-size",
    "--virtual-pipeline-model-parallel-size",
    "--num-layers-per-virtual-pipeline-stage",
    "--recompute-num-layers",
    "--q-lora-rank",
    "--kv-lora-rank",
    "--qk-head-dim",
    "--qk-pos-emb-head-dim",
    "--v-head-dim",
    "--num-distributed-optimizer-instances",
    "--mamba-num-heads",
    "--mamba-head-dim",
    "--mamba-num-groups",
    "--mamba-state-dim",
    "--num-layers-at-start-in-bf16",
    "--num-layers-at-end-in-bf16",
    "--cpu-offloading-num-layers",
    "--muon-num-ns-steps",
    "--train-samples",
    "--train-iters",
];

/// Switches that the reader's `State::finish` combines.
pub(super) const KEPT_SWITCHES: &[&str] = &[
    "--group-query-attention",
    "--swiglu",
    "--untie-embeddings-and-output-weights",
    "--disable-bias-linear",
    "--add-qkv-bias",
    "--sequence-parallel",
    "--use-distributed-optimizer",
    "--overlap-grad-reduce",
    "--overlap-param-gather",
    "--tp-comm-overlap",
    "--bf16",
    "--fp16",
    "--recompute-activations",
    "--grad-reduce-in-bf16",
    "--use-flash-attn",
    "--multi-latent-attention",
    "--qk-layernorm",
    "--quick-geglu",
    "--squared-relu",
    "--use-megatron-fsdp",
    "--use-torch-fsdp2",
    "--fsdp-double-buffer",
    "--enable-gpt-oss",
    "--export-qk-l2-norm",
    "--qk-l2-norm",
    "--is-hybrid-model",
    "--fp8-param-gather",
    "--fp4-param-gather",
    "--first-last-layers-bf16",
    "--cpu-offloading",
    "--cpu-offloading-weights",
    "--use-precision-aware-optimizer",
    "--moe-enable-deepep",
    "--overlap-moe-expert-parallel-comm",
    "--enable-cuda-graph",
    "--external-cuda-graph",
    "--optimizer-cpu-offload",
    "--overlap-cpu-optimizer-d2h-h2d",
];

/// Flags with a word value that the reader's `State::finish` combines.
pub(super) const KEPT_WORDS: &[&str] = &[
    "--normalization",
    "--position-embedding-type",
    "--recompute-granularity",
    "--recompute-method",
    "--fp8-format",
    "--fp8-recipe",
    "--fp4-format",
    "--fp4-recipe",
    "--cp-comm-type",
    "--attention-backend",
    "--moe-layer-freq",
    "--tokenizer-model",
    "--pipeline-model-parallel-layout",
    "--moe-router-score-function",
    "--window-size",
    "--window-attn-skip-freq",
    "--softmax-type",
    "--moe-token-dispatcher-type",
    "--data-parallel-sharding-strategy",
    "--outer-dp-sharding-strategy",
    "--hybrid-layer-pattern",
    "--hybrid-override-pattern",
    "--optimizer",
    "--muon-tp-mode",
    "--main-grads-dtype",
    "--main-params-dtype",
    "--exp-avg-dtype",
    "--exp-avg-sq-dtype",
    "--moe-flex-dispatcher-backend",
    "--cuda-graph-impl",
    "--optimizer-offload-fraction",
];

/// Flags with a list of words that the reader's `State::finish` combines.
pub(super) const KEPT_LISTS: &[&str] = &[
    "--recompute-modules",
    "--cuda-graph-scope",
    "--cuda-graph-modules",
];

/// Flags that change the model or the parallel layout in ways parsim does not model: an
/// error naming the flag and why, never an estimate of another model.
pub(super) const REFUSED: &[(&str, &str)] = &[
    (
        "--hybrid-attention-ratio",
        "hybrid Mamba-2/attention models are not modelled yet",
    ),
    (
        "--hybrid-mlp-ratio",
        "hybrid Mamba-2/attention models are not modelled yet",
    ),
    (
        "--moe-use-shared-expert-gate",
        "the shared expert's gate is not modelled",
    ),
    ("--moe-extended-tp", "extended expert TP is not modelled"),
    (
        "--heterogeneous-layers-config-path",
        "heterogeneous layers are not modelled",
    ),
    (
        "--heterogeneous-layers-config-encoded-json",
        "heterogeneous layers are not modelled",
    ),
    (
        "--spec",
        "a custom layer spec changes the model in ways that cannot be read from the flags",
    ),
    (
        "--hierarchical-context-parallel-sizes",
        "hierarchical context parallelism is not modelled",
    ),
    (
        "--encoder-num-layers",
        "encoder-decoder models are not modelled",
    ),
    (
        "--encoder-seq-length",
        "encoder-decoder models are not modelled",
    ),
    (
        "--pipeline-model-parallel-split-rank",
        "encoder-decoder pipelines are not modelled",
    ),
    (
        "--fine-grained-activation-offloading",
        "fine-grained activation offloading is not modelled (training.offload_activation_layers is whole-layer --cpu-offloading)",
    ),
];
