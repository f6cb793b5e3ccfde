//! Lowers a resolved configuration into the executor's [`Plan`]: the model's shape, each
//! rank's coordinates and process groups (from [`Layout`], Megatron order tp-cp-ep-dp-pp by
//! default), the pipeline stages, and each rank's ordered actions, taken from the schedule
//! generator ([`crate::schedule::generate`]) so the executor runs exactly the timeline that
//! `parsim schedule` draws. Sends and receives are made explicit: a forward receives its input
//! from the rank of the previous stage and sends its output to the next one (the reverse for
//! backward), unless both stages sit on the same rank (the bottom of a V).

use crate::config::{
    Activation, CpComm, LoraTarget, Normalization, PositionEmbedding, Recompute, Resolved,
    RouterScore, TrainingMode,
};
use crate::layout::Layout;
use crate::schedule::{self, ActionKind, ScheduleError};
use parsim_plan::plan::{
    self as xp, Action, AdamConfig, AttentionShape, Coords, LoraShape, MlaShape, ModelShape,
    MoeShape, Parallelism, Plan, RankPlan, RouterShape, StagePlan,
};
use parsim_plan::Groups;

/// Why a configuration cannot be executed (yet).
#[derive(Debug, thiserror::Error)]
pub enum LowerError {
    #[error("{field}: {message}")]
    Unsupported {
        field: &'static str,
        message: String,
    },
    #[error(transparent)]
    Schedule(#[from] ScheduleError),
}

/// Knobs of the execution that the configuration does not hold.
#[derive(Debug, Clone, Copy)]
pub struct LowerOptions {
    pub seed: u64,
    pub adam: AdamConfig,
    /// Standard deviation of the weight initialisation.
    pub init_std: f32,
    pub norm_eps: f32,
    pub rope_theta: f32,
}

impl Default for LowerOptions {
    fn default() -> Self {
        LowerOptions {
            seed: 1234,
            adam: AdamConfig::default(),
            init_std: 0.02,
            norm_eps: 1e-5,
            rope_theta: 10000.0,
        }
    }
}

/// The training settings the estimate models but the executor does not run: it steps with
/// Adam on fp32 master weights with fp32 moments, keeps every saved tensor on the GPU, and
/// recomputes the attention core only. `execute` asks before it adapts the precision to the
/// backend, so these are refused as the user set them.
pub fn check_training(t: &crate::config::TrainingConfig) -> Result<(), LowerError> {
    if t.optimizer != crate::config::Optimizer::Adam {
        return Err(unsupported(
            "training.optimizer",
            format!("the executor steps with adam only, not {}", t.optimizer),
        ));
    }
    if !t.master_weights {
        return Err(unsupported(
            "training.master_weights",
            "the executor keeps fp32 master weights (its mixed-precision recipe: bf16 weight copies, fp32 master, gradients and Adam moments); leave master_weights out",
        ));
    }
    if t.optimizer_state_dtype() != crate::config::OptimizerStateDtype::Fp32 {
        return Err(unsupported(
            "training.optimizer_state_dtype",
            format!(
                "the executor keeps Adam's moments in fp32, not {}; leave optimizer_state_dtype out",
                t.optimizer_state_dtype()
            ),
        ));
    }
    if t.offload_activation_layers > 0 {
        return Err(unsupported(
            "training.offload_activation_layers",
            "the executor does not offload activations to the host; set it to 0",
        ));
    }
    if t.optimizer_offload_fraction > 0.0 {
        return Err(unsupported(
            "training.optimizer_offload_fraction",
            "the executor keeps the optimizer state on the device and steps it there; set it to 0",
        ));
    }
    if t.recompute_modules() != [crate::config::RecomputeModule::CoreAttn] {
        return Err(unsupported(
            "training.recompute_modules",
            "the executor's selective recompute reruns the attention core only; leave recompute_modules out",
        ));
    }
    Ok(())
}

fn unsupported(field: &'static str, message: impl Into<String>) -> LowerError {
    LowerError::Unsupported {
        field,
        message: message.into(),
    }
}

/// Refuses what the executor does not run yet, naming the field.
fn check(r: &Resolved) -> Result<(), LowerError> {
    let m = &r.config.model;
    let p = &r.config.parallel;
    let t = &r.config.training;
    if p.cp > 1 && !t.flash_attention {
        return Err(unsupported(
            "training.flash_attention",
            "context parallelism merges partial attention outputs by their log-sum-exp; set flash_attention = true",
        ));
    }
    check_training(t)?;
    check_moe(r)?;
    check_layer_kinds(m, t.flash_attention)?;
    check_hybrid(r)?;
    if let Some(mla) = &m.mla {
        if mla.qk_rope_head_dim % 2 != 0 {
            return Err(unsupported(
                "model.mla.qk_rope_head_dim",
                "the rotary head dimension must be even",
            ));
        }
    }
    if m.attention_dropout > 0.0 && !t.flash_attention {
        return Err(unsupported(
            "model.attention_dropout",
            "attention dropout runs inside the flash attention; set training.flash_attention = true",
        ));
    }
    if !matches!(
        m.position_embedding,
        PositionEmbedding::Rope | PositionEmbedding::Learned
    ) {
        return Err(unsupported(
            "model.position_embedding",
            "the executor runs rotary or learned positions",
        ));
    }
    if let Some(f) = p.fsdp {
        return Err(unsupported(
            "parallel.fsdp",
            format!(
                "the executor runs the generic ZeRO stages, not {} FSDP's double buffers; leave fsdp out to run ZeRO-{}",
                f.name(),
                p.zero
            ),
        ));
    }
    let v = m.padded_vocab_size(p.tp);
    if v % p.tp as u64 != 0 {
        return Err(unsupported("model.vocab_size", format!("the vocabulary ({v}) must be divisible by tp ({}); set make_vocab_size_divisible_by", p.tp)));
    }
    if m.ffn_hidden_size % p.tp as u64 != 0 {
        return Err(unsupported(
            "model.ffn_hidden_size",
            format!(
                "ffn_hidden_size ({}) must be divisible by tp ({})",
                m.ffn_hidden_size, p.tp
            ),
        ));
    }
    if m.mla.is_none() && m.head_dim() % 2 != 0 {
        return Err(unsupported(
            "model.kv_channels",
            "the head dimension must be even for rotary positions",
        ));
    }
    let tokens = t.seq_length * t.micro_batch_size / p.cp as u64;
    if p.sp_active() && tokens % p.tp as u64 != 0 {
        return Err(unsupported("training.seq_length", format!("seq_length x micro_batch_size / cp ({tokens}) must be divisible by tp ({}) with sequence parallelism", p.tp)));
    }
    Ok(())
}

/// Refuses what the executor cannot run of issue 31's layer kinds, naming the field: sinks
/// need the flash attention's log-sum-exp.
fn check_layer_kinds(m: &crate::config::ModelConfig, flash: bool) -> Result<(), LowerError> {
    if m.attention_sinks && !flash {
        return Err(unsupported(
            "training.flash_attention",
            "attention sinks join the softmax through the flash attention's log-sum-exp; set flash_attention = true",
        ));
    }
    Ok(())
}

/// Refuses what the executor does not run in a hybrid model, naming the field: LoRA (the
/// engine has no adapter targets in the Mamba-2 mixer), linear biases and MLA.
fn check_hybrid(r: &Resolved) -> Result<(), LowerError> {
    let m = &r.config.model;
    if m.hybrid_layer_pattern.is_none() {
        return Ok(());
    }
    let refused = [
        (
            r.config.training.mode == TrainingMode::Lora,
            "training.mode",
            "LoRA",
        ),
        (m.add_bias_linear, "model.add_bias_linear", "linear biases"),
        (m.mla.is_some(), "model.mla", "multi-head latent attention"),
    ];
    match refused.into_iter().find(|(on, _, _)| *on) {
        Some((_, field, what)) => Err(unsupported(
            field,
            format!(
                "the executor does not run {what} in a hybrid model (model.hybrid_layer_pattern)"
            ),
        )),
        None => Ok(()),
    }
}

/// Refuses the mixture-of-experts features the executor does not run, naming the field.
fn check_moe(r: &Resolved) -> Result<(), LowerError> {
    let m = &r.config.model;
    let p = &r.config.parallel;
    if !m.is_moe() {
        if p.ep > 1 {
            return Err(unsupported(
                "parallel.ep",
                format!(
                    "expert parallelism (ep = {}) needs model.num_experts > 0",
                    p.ep
                ),
            ));
        }
        return Ok(());
    }
    if m.moe_router_score_function == RouterScore::Sigmoid && m.moe_aux_loss_coeff > 0.0 {
        return Err(unsupported(
            "model.moe_aux_loss_coeff",
            "the load-balancing loss is executed on softmax scores; with moe_router_score_function = \"sigmoid\" set it to 0 (DeepSeek-V3 balances by the expert bias)",
        ));
    }
    if m.moe_latent_size.is_some() {
        return Err(unsupported(
            "model.moe_latent_size",
            "the executor's experts work at the hidden size; it does not run a latent MoE's projections",
        ));
    }
    if m.moe_router_force_load_balancing && m.moe_router_num_groups > 0 {
        return Err(unsupported(
            "model.moe_router_force_load_balancing",
            "the executed balanced routing ignores router groups; set moe_router_num_groups = 0",
        ));
    }
    // Each expert's intermediate size splits over an expert-TP group of expert_tp ranks
    // (Megatron's --expert-tensor-parallel-size): expert_tp consecutive ranks of the flattened
    // tp x cp x dp index (MoE Parallel Folding), whatever its ratio to tp; under TP each
    // rank routes its own sequence shard (the configuration rules require SP for MoE under TP).
    for (field, v, by) in [
        ("model.moe_ffn_hidden_size", m.moe_ffn_hidden_size, p.etp()),
        (
            "model.moe_shared_expert_intermediate_size",
            m.moe_shared_expert_intermediate_size,
            p.tp,
        ),
    ] {
        if v % by as u64 != 0 {
            return Err(unsupported(
                field,
                format!("{v} must be divisible by {by} (its tensor parallelism)"),
            ));
        }
    }
    // EP lies on Megatron-Core's expert grid (expert_tp x ep over tp x cp x dp, which the
    // configuration rules check), so it may exceed dp.
    if m.num_experts % p.ep != 0 {
        return Err(unsupported(
            "parallel.ep",
            format!("ep ({}) must divide num_experts ({})", p.ep, m.num_experts),
        ));
    }
    Ok(())
}

/// One rank's actions: the schedule's compute actions with the pipeline sends and
/// receives they need, then the optimizer step.
fn rank_actions(program: &schedule::Program, me: u32, peer: impl Fn(u32) -> u32) -> Vec<Action> {
    let nstages = program.num_stages();
    let mut actions = Vec::new();
    for a in &program.ranks[me as usize] {
        let (s, mb) = (a.stage, a.microbatch);
        match a.kind {
            ActionKind::F => {
                if s > 0 && program.rank_of_stage(s - 1) != me {
                    actions.push(Action::RecvActivation {
                        from: peer(s - 1),
                        stage: s - 1,
                        mb,
                    });
                }
                actions.push(Action::Forward { stage: s, mb });
                if s + 1 < nstages && program.rank_of_stage(s + 1) != me {
                    actions.push(Action::SendActivation {
                        to: peer(s + 1),
                        stage: s,
                        mb,
                    });
                }
            }
            ActionKind::B | ActionKind::I => {
                if s + 1 < nstages && program.rank_of_stage(s + 1) != me {
                    actions.push(Action::RecvGrad {
                        from: peer(s + 1),
                        stage: s + 1,
                        mb,
                    });
                }
                actions.push(if a.kind == ActionKind::B {
                    Action::Backward { stage: s, mb }
                } else {
                    Action::BackwardInput { stage: s, mb }
                });
                if s > 0 && program.rank_of_stage(s - 1) != me {
                    actions.push(Action::SendGrad {
                        to: peer(s - 1),
                        stage: s,
                        mb,
                    });
                }
            }
            ActionKind::W => actions.push(Action::BackwardWeight { stage: s, mb }),
        }
    }
    actions.push(Action::OptimizerStep);
    actions
}

/// The executor's model shape of a resolved configuration.
fn model_shape(r: &Resolved, o: &LowerOptions) -> ModelShape {
    let m = &r.config.model;
    let p = &r.config.parallel;
    let t = &r.config.training;
    ModelShape {
        num_layers: m.num_layers,
        hidden: m.hidden_size as usize,
        heads: m.num_attention_heads as usize,
        kv_heads: m.num_query_groups as usize,
        head_dim: m.head_dim() as usize,
        ffn: m.ffn_hidden_size as usize,
        vocab: m.padded_vocab_size(p.tp) as usize,
        data_vocab: m.vocab_size as usize,
        seq: t.seq_length as usize,
        micro_batch: t.micro_batch_size as usize,
        norm: match m.normalization {
            Normalization::Rmsnorm => xp::Norm::RmsNorm,
            Normalization::Layernorm => xp::Norm::LayerNorm,
        },
        norm_eps: o.norm_eps,
        activation: match m.activation {
            Activation::Swiglu => xp::Activation::Swiglu,
            Activation::Gelu => xp::Activation::Gelu,
        },
        rope_theta: o.rope_theta,
        flash: t.flash_attention,
        init_std: o.init_std,
        mla: m.mla.as_ref().map(|a| MlaShape {
            q_lora_rank: a.q_lora_rank as usize,
            kv_lora_rank: a.kv_lora_rank as usize,
            qk_nope: a.qk_nope_head_dim as usize,
            qk_rope: a.qk_rope_head_dim as usize,
            v: a.v_head_dim as usize,
        }),
        moe: m.is_moe().then_some(MoeShape {
            num_experts: m.num_experts as usize,
            top_k: m.moe_router_topk as usize,
            ffn: m.moe_ffn_hidden_size as usize,
            first_k_dense: m.moe_first_k_dense,
            capacity_factor: m.moe_capacity_factor as f32,
            aux_loss_coeff: m.moe_aux_loss_coeff as f32,
            router: RouterShape {
                score: match m.moe_router_score_function {
                    RouterScore::Softmax => xp::ScoreFunction::Softmax,
                    RouterScore::Sigmoid => xp::ScoreFunction::Sigmoid,
                },
                renormalize: m.moe_router_renormalize,
                force_balance: m.moe_router_force_load_balancing,
                expert_bias: m.moe_router_bias,
                bias_update_rate: m.moe_router_bias_update_rate as f32,
                groups: m.moe_router_num_groups as usize,
                group_topk: m.moe_router_group_topk as usize,
            },
            shared_ffn: m.moe_shared_expert_intermediate_size as usize,
            layer_pattern: m.moe_layer_pattern.clone(),
            router_linear_bias: m.moe_router_linear_bias,
        }),
        hidden_dropout: m.hidden_dropout as f32,
        attention_dropout: m.attention_dropout as f32,
        tied_embeddings: m.tied_embeddings,
        bias_linear: m.add_bias_linear,
        qkv_bias: m.add_bias_linear || m.add_qkv_bias,
        learned_positions: match m.position_embedding {
            PositionEmbedding::Learned => m.max_position_embeddings as usize,
            _ => 0,
        },
        mtp_layers: m.mtp_num_layers,
        mtp_loss_scale: if m.mtp_num_layers > 0 {
            (m.mtp_loss_scaling_factor / m.mtp_num_layers as f64) as f32
        } else {
            0.0
        },
        attention: AttentionShape {
            window: m.window_size.map(|w| w as usize),
            chunk: m.attention_chunk_size.map(|c| c as usize),
            full_every: m.window_attn_skip_freq,
            sinks: m.attention_sinks,
            // MLA normalises its latents instead (the engine counts no QK norm there).
            qk_norm: m.qk_layernorm && m.mla.is_none(),
        },
        hybrid: hybrid_layers(m),
        mamba: m.mamba.as_ref().map(|a| xp::MambaShape {
            heads: a.num_heads as usize,
            head_dim: a.head_dim as usize,
            state: a.state_dim as usize,
            groups: a.num_groups as usize,
            conv_kernel: a.conv_kernel as usize,
            chunk: a.chunk_size as usize,
        }),
    }
}

/// A hybrid model's layers as the Plan names them (Megatron's pattern: M, *, - and E).
fn hybrid_layers(m: &crate::config::ModelConfig) -> Vec<xp::HybridLayer> {
    use crate::config::HybridLayer as H;
    (0..m.num_layers)
        .filter_map(|l| m.hybrid(l))
        .map(|h| match h {
            H::Mamba => xp::HybridLayer::Mamba,
            H::Attention => xp::HybridLayer::Attention,
            H::Mlp => xp::HybridLayer::Mlp,
            H::Moe => xp::HybridLayer::Moe,
        })
        .collect()
}

/// The executor's LoRA settings: rank, alpha (the rank when absent) and targets.
fn lora_shape(r: &Resolved) -> Option<LoraShape> {
    let t = &r.config.training;
    (t.mode == TrainingMode::Lora).then(|| {
        let has = |x: LoraTarget| t.lora.targets.contains(&x);
        LoraShape {
            rank: t.lora.rank as usize,
            alpha: t.lora.alpha.unwrap_or(t.lora.rank as f64) as f32,
            // `qkv` names the fused QKV projection (NeMo's `linear_qkv`); an MLA layer has
            // none, so the engine counts no adapter there (src/model/attention.rs).
            qkv: has(LoraTarget::Qkv) && r.config.model.mla.is_none(),
            proj: has(LoraTarget::Proj),
            fc1: has(LoraTarget::Fc1),
            fc2: has(LoraTarget::Fc2),
            seeded_b: false,
        }
    })
}

/// The executor's parallel degrees of a resolved configuration.
fn parallelism(r: &Resolved) -> Parallelism {
    let p = &r.config.parallel;
    let t = &r.config.training;
    Parallelism {
        tp: p.tp,
        sp: p.sp_active(),
        cp: p.cp,
        cp_comm: match p.cp_comm {
            CpComm::P2p => xp::CpComm::Ring,
            CpComm::Zigzag => xp::CpComm::Zigzag,
            CpComm::Allgather => xp::CpComm::AllGather,
            CpComm::A2a => xp::CpComm::A2a,
        },
        pp: p.pp,
        vpp: p.vpp,
        dp: r.dp,
        ep: p.ep,
        // A dense model's plan takes Megatron's default expert_tp = tp: its expert groups are
        // then the unfolded layout's, and no order is refused for experts it does not have.
        etp: if r.config.model.is_moe() {
            p.etp()
        } else {
            p.tp
        },
        zero: p.zero,
        recompute: match t.recompute {
            Recompute::None => xp::Recompute::None,
            Recompute::Selective => xp::Recompute::Selective,
            Recompute::Full => xp::Recompute::Full,
        },
        // The executor buckets whole blocks (a layer, the embedding, the output): FSDP's one
        // wrapped layer is a bucket closed after every block (1 parameter).
        grad_bucket_params: p.overlap_grad_reduce.then(|| {
            let n = p
                .ddp_bucket_size
                .unwrap_or_else(|| t.framework.grad_bucket_params(r.dp, 1));
            usize::try_from(n).unwrap_or(usize::MAX)
        }),
    }
}

/// The Plan of a resolved configuration.
pub fn lower(r: &Resolved, o: &LowerOptions) -> Result<Plan, LowerError> {
    check(r)?;
    let p = &r.config.parallel;
    // MoE Parallel Folding's expert grid for an MoE model ([`Layout::of`]); a dense model has
    // no experts, and its expert groups are the unfolded ones of expert_tp = tp (Megatron's
    // default), whatever the order.
    let layout = Layout::of(r);
    let program = schedule::generate(p.schedule, p.pp, p.vpp, r.microbatches)?;
    let nstages = program.num_stages();
    if nstages as usize != r.placement.num_stages() {
        return Err(unsupported(
            "parallel.vpp",
            format!(
                "the schedule has {nstages} stages, the layer placement {}",
                r.placement.num_stages()
            ),
        ));
    }
    let stages: Vec<StagePlan> = (0..nstages)
        .map(|s| StagePlan {
            stage: s,
            pp_rank: program.rank_of_stage(s),
            layers: r.placement.stage_layers[s as usize].clone(),
            embedding: s == 0,
            output: s == nstages - 1,
        })
        .collect();
    for (s, st) in stages.iter().enumerate() {
        if st.pp_rank != r.placement.stage_rank[s] {
            return Err(unsupported(
                "parallel.schedule",
                "the schedule's stage placement differs from the layer placement",
            ));
        }
    }
    let ranks = (0..layout.world())
        .map(|rank| {
            let c = layout.coords(rank);
            let peer = |stage: u32| {
                layout.rank(Coords {
                    pp: program.rank_of_stage(stage),
                    ..c
                })
            };
            let me = c.pp;
            let actions = rank_actions(&program, me, peer);
            RankPlan {
                rank,
                coords: c,
                // Every kind's group; the expert ones on MoE Parallel Folding's expert grid
                // (Megatron-Core's expert rank generator).
                groups: Groups::of_every_kind(|kind| layout.group_of(kind, rank)),
                stages: (0..nstages)
                    .filter(|&s| program.rank_of_stage(s) == me)
                    .collect(),
                actions,
            }
        })
        .collect();
    Ok(Plan {
        model: model_shape(r, o),
        parallel: parallelism(r),
        adam: o.adam,
        seed: o.seed,
        microbatches: r.microbatches,
        schedule: p.schedule.as_str().to_string(),
        stages,
        ranks,
        lora: lora_shape(r),
    })
}
