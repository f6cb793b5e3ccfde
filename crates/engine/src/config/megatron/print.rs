//! The reverse of the import: a configuration as a Megatron-LM launch (`torchrun ...
//! pretrain_gpt.py` with one flag per line). Settings Megatron has no flag for are listed in a
//! comment at the top, so the text reads back with [`super::import`] to the same configuration.

use crate::config::{
    Activation, Config, CpComm, Dtype, Normalization, PositionEmbedding, Precision, Recompute,
    RouterScore, ScheduleKind, TrainingMode,
};

/// The launch for `cfg`: a comment naming what has no Megatron flag, then the command.
pub fn to_megatron_args(cfg: &Config) -> String {
    let mut flags: Vec<String> = Vec::new();
    let mut flag = |f: &str, v: Option<String>| match v {
        Some(v) => flags.push(format!("{f} {v}")),
        None => flags.push(f.to_string()),
    };
    model_flags(cfg, &mut flag);
    parallel_flags(cfg, &mut flag);
    training_flags(cfg, &mut flag);
    let mut out = String::new();
    let lost = not_expressible(cfg);
    if !lost.is_empty() {
        out.push_str("# no Megatron-LM flag for: ");
        out.push_str(&lost.join(", "));
        out.push('\n');
    }
    let per_node = cfg.cluster.per_node();
    let nodes = cfg.cluster.num_gpus / per_node.max(1);
    let per_node = if nodes * per_node == cfg.cluster.num_gpus {
        per_node
    } else {
        out.push_str("# the GPU count is not a whole number of nodes: one node of all of them\n");
        cfg.cluster.num_gpus
    };
    out.push_str(&format!(
        "torchrun --nproc_per_node {per_node} --nnodes {} pretrain_gpt.py",
        cfg.cluster.num_gpus / per_node.max(1)
    ));
    for f in flags {
        out.push_str(" \\\n    ");
        out.push_str(&f);
    }
    out.push('\n');
    out
}

fn model_flags(cfg: &Config, flag: &mut impl FnMut(&str, Option<String>)) {
    let m = &cfg.model;
    let s = |v: u64| Some(v.to_string());
    flag("--num-layers", s(m.num_layers.into()));
    flag("--hidden-size", s(m.hidden_size));
    flag("--ffn-hidden-size", s(m.ffn_hidden_size));
    flag("--num-attention-heads", s(m.num_attention_heads.into()));
    if m.num_query_groups != m.num_attention_heads {
        flag("--group-query-attention", None);
        flag("--num-query-groups", s(m.num_query_groups.into()));
    }
    if let Some(k) = m.kv_channels {
        flag("--kv-channels", s(k));
    }
    flag("--vocab-size", s(m.vocab_size));
    flag(
        "--make-vocab-size-divisible-by",
        s(m.make_vocab_size_divisible_by),
    );
    flag("--max-position-embeddings", s(m.max_position_embeddings));
    let pos = match m.position_embedding {
        PositionEmbedding::Rope => "rope",
        PositionEmbedding::Learned => "learned_absolute",
        PositionEmbedding::None => "none",
    };
    flag("--position-embedding-type", Some(pos.into()));
    let norm = match m.normalization {
        Normalization::Rmsnorm => "RMSNorm",
        Normalization::Layernorm => "LayerNorm",
    };
    flag("--normalization", Some(norm.into()));
    if m.activation == Activation::Swiglu {
        flag("--swiglu", None);
    }
    if let Some(v) = m.activation_clamp {
        flag("--activation-func-clamp-value", Some(v.to_string()));
    }
    if !m.add_bias_linear {
        flag("--disable-bias-linear", None);
        if m.add_qkv_bias {
            flag("--add-qkv-bias", None);
        }
    }
    if !m.tied_embeddings {
        flag("--untie-embeddings-and-output-weights", None);
    }
    flag("--hidden-dropout", Some(m.hidden_dropout.to_string()));
    flag("--attention-dropout", Some(m.attention_dropout.to_string()));
    if m.qk_layernorm {
        flag("--qk-layernorm", None);
    }
    if m.attention_sinks {
        flag("--softmax-type", Some("learnable".into()));
    }
    if let Some(w) = m.window_size {
        flag("--window-size", Some(format!("{},0", w.saturating_sub(1))));
        if m.window_attn_skip_freq > 0 {
            flag("--window-attn-skip-freq", s(m.window_attn_skip_freq.into()));
        }
    }
    if let Some(p) = &m.hybrid_layer_pattern {
        flag("--hybrid-layer-pattern", Some(p.clone()));
    }
    if let Some(mc) = &m.mamba {
        flag("--mamba-num-heads", s(mc.num_heads.into()));
        flag("--mamba-head-dim", s(mc.head_dim));
        flag("--mamba-state-dim", s(mc.state_dim));
        flag("--mamba-num-groups", s(mc.num_groups.into()));
    }
    if let Some(mla) = &m.mla {
        flag("--multi-latent-attention", None);
        flag("--q-lora-rank", s(mla.q_lora_rank));
        flag("--kv-lora-rank", s(mla.kv_lora_rank));
        flag("--qk-head-dim", s(mla.qk_nope_head_dim));
        flag("--qk-pos-emb-head-dim", s(mla.qk_rope_head_dim));
        flag("--v-head-dim", s(mla.v_head_dim));
    }
    if m.num_experts > 0 {
        flag("--num-experts", s(m.num_experts.into()));
        flag("--moe-router-topk", s(m.moe_router_topk.into()));
        flag("--moe-ffn-hidden-size", s(m.moe_ffn_hidden_size));
        if m.moe_shared_expert_intermediate_size > 0 {
            flag(
                "--moe-shared-expert-intermediate-size",
                s(m.moe_shared_expert_intermediate_size),
            );
        }
        if m.moe_first_k_dense > 0 {
            let moe = m.num_layers.saturating_sub(m.moe_first_k_dense);
            flag(
                "--moe-layer-freq",
                Some(format!("\"([0]*{}+[1]*{moe})\"", m.moe_first_k_dense)),
            );
        }
        if !m.moe_layer_pattern.is_empty() {
            let list: Vec<String> = m.moe_layer_pattern.iter().map(u8::to_string).collect();
            flag(
                "--moe-layer-freq",
                Some(format!("\"[{}]\"", list.join(","))),
            );
        }
        if m.moe_router_force_load_balancing {
            flag("--moe-router-force-load-balancing", None);
        }
        if m.moe_router_bias {
            flag("--moe-router-enable-expert-bias", None);
            flag(
                "--moe-router-bias-update-rate",
                Some(m.moe_router_bias_update_rate.to_string()),
            );
        }
        if m.moe_router_score_function != RouterScore::Softmax {
            flag(
                "--moe-router-score-function",
                Some(m.moe_router_score_function.to_string()),
            );
        }
        if m.moe_router_num_groups > 0 {
            flag("--moe-router-num-groups", s(m.moe_router_num_groups.into()));
            flag("--moe-router-group-topk", s(m.moe_router_group_topk.into()));
        }
        if m.moe_capacity_factor > 0.0 {
            flag(
                "--moe-expert-capacity-factor",
                Some(m.moe_capacity_factor.to_string()),
            );
        }
        if m.moe_aux_loss_coeff > 0.0 {
            flag(
                "--moe-aux-loss-coeff",
                Some(m.moe_aux_loss_coeff.to_string()),
            );
        }
        if let Some(latent) = m.moe_latent_size {
            flag("--moe-latent-size", Some(latent.to_string()));
        }
    }
    if m.mtp_num_layers > 0 {
        flag("--mtp-num-layers", s(m.mtp_num_layers.into()));
        flag(
            "--mtp-loss-scaling-factor",
            Some(m.mtp_loss_scaling_factor.to_string()),
        );
    }
}

fn parallel_flags(cfg: &Config, flag: &mut impl FnMut(&str, Option<String>)) {
    let p = &cfg.parallel;
    let s = |v: u32| Some(v.to_string());
    flag("--tensor-model-parallel-size", s(p.tp));
    flag("--pipeline-model-parallel-size", s(p.pp));
    // Megatron-Core derives vpp from an explicit layout and refuses both.
    if p.vpp > 1 && p.pipeline_layout.is_none() {
        flag("--virtual-pipeline-model-parallel-size", s(p.vpp));
    }
    flag("--context-parallel-size", s(p.cp));
    if p.cp > 1 {
        let kind = match p.cp_comm {
            CpComm::P2p | CpComm::Zigzag => "p2p",
            CpComm::Allgather => "all_gather",
            CpComm::A2a => "a2a",
        };
        flag("--cp-comm-type", Some(kind.into()));
    }
    if p.ep > 1 || cfg.model.num_experts > 0 {
        flag("--expert-model-parallel-size", s(p.ep));
    }
    if cfg.model.num_experts > 0 || p.expert_tp.is_some() {
        flag("--expert-tensor-parallel-size", s(p.etp()));
    }
    // The dispatcher always, as Megatron-Core's default (allgather) is not parsim's.
    if cfg.model.num_experts > 0 {
        let d = p.moe_token_dispatcher;
        flag("--moe-token-dispatcher-type", Some(d.to_string()));
        if d == crate::config::TokenDispatcher::Flex {
            let b = p.moe_flex_dispatcher_backend.to_string();
            flag("--moe-flex-dispatcher-backend", Some(b));
        }
    }
    if p.overlap_moe_expert_parallel_comm {
        flag("--overlap-moe-expert-parallel-comm", None);
    }
    if p.sp {
        flag("--sequence-parallel", None);
    }
    match p.fsdp {
        Some(crate::config::Fsdp::Megatron) => {
            flag("--use-megatron-fsdp", None);
            flag(
                "--data-parallel-sharding-strategy",
                Some(crate::config::Fsdp::megatron_strategy(p.zero).to_string()),
            );
        }
        Some(crate::config::Fsdp::Torch) => flag("--use-torch-fsdp2", None),
        None => {}
    }
    if p.zero >= 1 {
        flag("--use-distributed-optimizer", None);
    }
    if p.overlap_grad_reduce {
        flag("--overlap-grad-reduce", None);
    }
    if p.overlap_param_gather {
        flag("--overlap-param-gather", None);
    }
    if p.tp_comm_overlap {
        flag("--tp-comm-overlap", None);
    }
    if let Some(b) = p.ddp_bucket_size {
        flag("--ddp-bucket-size", Some(b.to_string()));
    }
    if let Some(n) = p.first_stage_layers {
        flag("--decoder-first-pipeline-num-layers", s(n));
    }
    if let Some(n) = p.last_stage_layers {
        flag("--decoder-last-pipeline-num-layers", s(n));
    }
    if let Some(layout) = &p.pipeline_layout {
        // Quoted: '|', '*' and parentheses are shell syntax.
        flag(
            "--pipeline-model-parallel-layout",
            Some(format!("'{layout}'")),
        );
    }
    if p.account_for_embedding_in_pipeline_split {
        flag("--account-for-embedding-in-pipeline-split", None);
    }
    if p.account_for_loss_in_pipeline_split {
        flag("--account-for-loss-in-pipeline-split", None);
    }
}

fn training_flags(cfg: &Config, flag: &mut impl FnMut(&str, Option<String>)) {
    let t = &cfg.training;
    flag("--seq-length", Some(t.seq_length.to_string()));
    // The tokens to train as whole sequences (else named among what has no flag).
    if let Some(tokens) = cfg.run.train_tokens {
        if t.seq_length > 0 && tokens % t.seq_length == 0 {
            flag("--train-samples", Some((tokens / t.seq_length).to_string()));
        }
    }
    flag("--micro-batch-size", Some(t.micro_batch_size.to_string()));
    if t.cuda_graphs {
        flag("--cuda-graph-impl", Some("local".into()));
    }
    flag("--global-batch-size", Some(t.global_batch_size.to_string()));
    match t.precision {
        Precision::Bf16 => flag("--bf16", None),
        Precision::Fp16 => flag("--fp16", None),
        Precision::Fp8 => {
            flag("--bf16", None);
            flag("--fp8-format", Some("hybrid".into()));
            match t.fp8_recipe {
                Some(crate::config::Fp8Recipe::Current) => {
                    flag("--fp8-recipe", Some("tensorwise".into()))
                }
                Some(crate::config::Fp8Recipe::Blockwise) => {
                    flag("--fp8-recipe", Some("blockwise".into()))
                }
                _ => {}
            }
        }
        Precision::Fp32 => {}
        Precision::Mxfp8 => {
            flag("--bf16", None);
            flag("--fp8-format", Some("e4m3".into()));
            flag("--fp8-recipe", Some("mxfp8".into()));
        }
        Precision::Nvfp4 => {
            flag("--bf16", None);
            flag("--fp4-format", Some("e2m1".into()));
            flag("--fp4-recipe", Some("nvfp4".into()));
        }
    }
    if t.fp8_param_gather {
        if t.precision == Precision::Nvfp4 {
            flag("--fp4-param-gather", None);
        } else {
            flag("--fp8-param-gather", None);
        }
    }
    let (start, end) = t.bf16_layers();
    if start + end > 0 {
        flag("--first-last-layers-bf16", None);
        flag("--num-layers-at-start-in-bf16", Some(start.to_string()));
        flag("--num-layers-at-end-in-bf16", Some(end.to_string()));
    }
    if t.grad_dtype == Dtype::Bf16 {
        flag("--grad-reduce-in-bf16", None);
    }
    // Moments below fp32: the precision-aware optimizer (int8 has no Megatron flag: lost).
    let states = t.optimizer_state_dtype();
    if !matches!(
        states,
        crate::config::OptimizerStateDtype::Fp32 | crate::config::OptimizerStateDtype::Int8
    ) {
        flag("--use-precision-aware-optimizer", None);
        if t.grad_dtype == Dtype::Bf16 {
            flag("--main-grads-dtype", Some("bf16".into()));
        }
        flag("--exp-avg-dtype", Some(states.to_string()));
        flag("--exp-avg-sq-dtype", Some(states.to_string()));
    }
    match t.recompute {
        Recompute::None => {}
        Recompute::Selective => flag("--recompute-granularity", Some("selective".into())),
        Recompute::Full => {
            flag("--recompute-granularity", Some("full".into()));
            flag("--recompute-method", Some("uniform".into()));
            flag("--recompute-num-layers", Some("1".into()));
        }
    }
    if let Some(modules) = &t.recompute_modules {
        let names: Vec<&str> = modules.iter().map(|m| m.as_str()).collect();
        flag("--recompute-modules", Some(names.join(" ")));
    }
    if t.offload_activation_layers > 0 {
        flag("--cpu-offloading", None);
        flag(
            "--cpu-offloading-num-layers",
            Some(t.offload_activation_layers.to_string()),
        );
    }
    if t.optimizer == crate::config::Optimizer::Muon {
        flag("--optimizer", Some("muon".into()));
    }
    let backend = if t.flash_attention {
        "flash"
    } else {
        "unfused"
    };
    flag("--attention-backend", Some(backend.into()));
}

/// Settings with no Megatron-LM flag (they keep parsim's value on import).
fn not_expressible(cfg: &Config) -> Vec<String> {
    let mut lost = Vec::new();
    let m = &cfg.model;
    if let Some(c) = m.attention_chunk_size {
        lost.push(format!(
            "attention_chunk_size = {c} (Llama 4's chunked attention)"
        ));
    }
    if m.moe_router_linear_bias != (m.add_bias_linear && m.num_experts > 0) {
        lost.push(format!(
            "moe_router_linear_bias = {} (Megatron's router has a bias exactly under --add-bias-linear)",
            m.moe_router_linear_bias
        ));
    }
    if let Some(mc) = &m.mamba {
        if mc.conv_kernel != 4 || mc.chunk_size != 128 {
            lost.push(format!(
                "mamba.conv_kernel = {}, mamba.chunk_size = {} (Megatron's are 4 and 128)",
                mc.conv_kernel, mc.chunk_size
            ));
        }
    }
    let p = &cfg.parallel;
    if p.cp > 1 && p.cp_comm == CpComm::P2p {
        lost.push(
            "cp_comm = \"p2p\" (a contiguous split; Megatron's p2p ring is load-balanced: zigzag)"
                .into(),
        );
    }
    if !matches!(
        p.schedule,
        ScheduleKind::OneFOneB | ScheduleKind::Interleaved1F1B
    ) {
        lost.push(format!("schedule = \"{}\"", p.schedule));
    }
    if p.zero >= 2 && p.fsdp.is_none() {
        lost.push(format!(
            "zero = {} (Megatron's distributed optimizer is ZeRO-1)",
            p.zero
        ));
    }
    if !matches!(cfg.training.grad_dtype, Dtype::Fp32 | Dtype::Bf16) {
        lost.push(format!("grad_dtype = \"{}\"", cfg.training.grad_dtype));
    }
    if !cfg.training.master_weights {
        lost.push("master_weights = false (Megatron-Core always keeps a master copy)".into());
    }
    if cfg.training.optimizer_state_dtype() == crate::config::OptimizerStateDtype::Int8 {
        lost.push("optimizer_state_dtype = \"int8\" (no Megatron flag)".into());
    }
    if !p.cp_comm_overlap {
        lost.push("cp_comm_overlap = false".into());
    }
    if cfg.training.framework != crate::config::Framework::MegatronCore {
        lost.push(format!(
            "framework = \"{}\" (the command runs Megatron-Core; its overlap switches are written as set)",
            cfg.training.framework.name()
        ));
    }
    let zero3 = [
        ("zero3_prefetch_params", p.zero3_prefetch_params),
        ("zero3_prefetch_bucket_size", p.zero3_prefetch_bucket_size),
        (
            "zero3_param_persistence_threshold",
            p.zero3_param_persistence_threshold,
        ),
        ("zero3_max_live_parameters", p.zero3_max_live_parameters),
    ];
    for (name, v) in zero3 {
        if let Some(n) = v {
            lost.push(format!("{name} = {n}"));
        }
    }
    if p.order != "tp-cp-ep-dp-pp" {
        lost.push(format!("order = \"{}\"", p.order));
    }
    if cfg.training.mode == TrainingMode::Lora {
        lost.push("mode = \"lora\"".into());
    }
    if p.dp.is_some() {
        lost.push("dp (Megatron derives it from the GPU count)".into());
    }
    if let Some(tokens) = cfg.run.train_tokens {
        let seq = cfg.training.seq_length;
        if seq == 0 || tokens % seq != 0 {
            lost.push(format!(
                "run.train_tokens = {tokens} (not a whole number of {seq}-token sequences)"
            ));
        }
    }
    lost.push(format!("cluster.gpu = \"{}\"", cfg.cluster.gpu));
    lost
}
