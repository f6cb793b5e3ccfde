//! Why a Plan is refused: each variant names the quantity and the rule.

use crate::group::GroupKind;

/// A Plan that fails [`Plan::validate`](crate::plan::Plan::validate), naming the quantity.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PlanError {
    #[error("model sizes must be positive")]
    NonPositiveSizes,
    #[error("parallel.grad_bucket_params must be at least 1 parameter (or unset: reduce at the optimizer step)")]
    ZeroGradBucket,
    #[error("model.learned_positions ({rows} rows) must cover the sequence ({seq})")]
    PositionsBelowSeq { rows: usize, seq: usize },
    /// MLA's decoupled rotary key is part of its attention (DeepSeek-V2).
    #[error(
        "model.mla needs rotary positions: model.position_embedding must be rope, not learned"
    )]
    MlaWithLearnedPositions,
    #[error("model.hidden_dropout ({p}) must lie in [0, 1)")]
    HiddenDropout { p: f32 },
    #[error("model.attention_dropout ({p}) must lie in [0, 1)")]
    AttentionDropout { p: f32 },
    /// Without flash attention Megatron keeps the dropped softmax and its mask; the executor
    /// runs attention dropout inside the flash attention only.
    #[error("model.attention_dropout runs inside the flash attention: set flash = true")]
    AttentionDropoutWithoutFlash,
    #[error("model.attention.{field} must be at least 1 key (or unset)")]
    ZeroAttentionSpan { field: &'static str },
    /// The sink logit joins the softmax's denominator through the flash attention's
    /// log-sum-exp.
    #[error("model.attention.sinks run inside the flash attention: set flash = true")]
    SinksWithoutFlash,
    #[error("model.moe.layer_pattern has {len} entries, one per decoder layer ({layers}) needed")]
    MoeLayerPattern { len: usize, layers: u32 },
    #[error("heads ({heads}) must be a multiple of kv_heads ({kv_heads})")]
    HeadsNotMultipleOfKvHeads { heads: usize, kv_heads: usize },
    #[error("heads ({heads}) and kv_heads ({kv_heads}) must be divisible by tp ({tp})")]
    HeadsNotDivisibleByTp {
        heads: usize,
        kv_heads: usize,
        tp: usize,
    },
    #[error("ffn ({ffn}) and padded vocab ({vocab}) must be divisible by tp ({tp})")]
    FfnVocabNotDivisibleByTp { ffn: usize, vocab: usize, tp: usize },
    #[error("head_dim ({head_dim}) must be even for rotary")]
    OddHeadDim { head_dim: usize },
    #[error("cp must be at least 1")]
    ZeroCp,
    #[error("seq ({seq}) must be divisible by {chunks} ({per} chunks of cp {cp})")]
    SeqNotDivisibleByCpChunks {
        seq: usize,
        chunks: usize,
        per: &'static str,
        cp: usize,
    },
    #[error("Ulysses (a2a) needs the heads ({heads}) and kv_heads ({kv_heads}) of a TP rank (tp {tp}) divisible by cp ({cp})")]
    UlyssesHeads {
        heads: usize,
        kv_heads: usize,
        tp: usize,
        cp: usize,
    },
    #[error("context parallelism needs flash attention (the ring merges partial outputs by their log-sum-exp)")]
    CpWithoutFlash,
    #[error("tokens per microbatch and CP rank ({tokens}) must be divisible by tp ({tp}) with sp")]
    SpTokensNotDivisible { tokens: usize, tp: usize },
    #[error("zero stage {zero} (0..=3)")]
    ZeroStage { zero: u8 },
    #[error("data_vocab ({data_vocab}) must lie in 1..=vocab ({vocab})")]
    DataVocab { data_vocab: usize, vocab: usize },
    #[error("ep must be at least 1")]
    ZeroEp,
    #[error("num_experts ({num_experts}) must be positive and divisible by ep ({ep})")]
    ExpertsNotDivisibleByEp { num_experts: usize, ep: usize },
    #[error("moe top_k ({top_k}) must lie in 1..=num_experts ({num_experts})")]
    TopK { top_k: usize, num_experts: usize },
    #[error("moe ffn must be positive")]
    ZeroMoeFfn,
    #[error("expert tp ({etp}) x ep ({ep}) must divide tp x cp x dp ({fold}), and MoE with tp > 1 needs sequence parallelism (each TP rank routes its sequence shard)")]
    ExpertTp { etp: u32, ep: u32, fold: usize },
    #[error("moe ffn ({ffn}) must be divisible by the expert tensor parallelism and shared_ffn ({shared_ffn}) by tp ({tp})")]
    MoeFfnNotDivisible {
        ffn: usize,
        shared_ffn: usize,
        tp: usize,
    },
    #[error("moe {name} must be finite and >= 0, got {value}")]
    MoeCoefficient { name: &'static str, value: f32 },
    #[error("moe router groups ({groups}) must divide num_experts ({num_experts}), group_topk ({group_topk}) must lie in 1..=groups, and top_k ({top_k}) in group_topk..=group_topk x experts per group")]
    RouterGroups {
        groups: usize,
        group_topk: usize,
        num_experts: usize,
        top_k: usize,
    },
    #[error("the load-balancing loss runs on softmax scores; with sigmoid scores set aux_loss_coeff = 0 (DeepSeek-V3 balances by the expert bias)")]
    AuxLossWithSigmoid,
    #[error("ep = {ep} needs MoE layers")]
    EpWithoutMoe { ep: usize },
    /// LoRA (Hu et al. 2021): a positive rank and a positive finite alpha.
    #[error("lora.{field}: {rule}")]
    Lora {
        field: &'static str,
        rule: &'static str,
    },
    #[error("{ranks} rank plans for world tp x cp x pp x dp = {world}")]
    RankCount { ranks: usize, world: usize },
    #[error("rank plan {index} has rank {rank}")]
    RankNumber { index: usize, rank: u32 },
    #[error("rank {rank}: the {group} group has {members} members, {rule} ({expected}) expected")]
    GroupSize {
        rank: usize,
        group: GroupKind,
        members: usize,
        rule: &'static str,
        expected: usize,
    },
    #[error("rank {rank}: the expert-TP group must be the expert tp ({etp}) ranks of its EP index and pipeline rank holding it (a block of consecutive TP ranks when expert tp divides tp, whole TP groups when tp divides it), ascending, meeting the expert-DP group in the rank alone")]
    ExpertTpGroup { rank: usize, etp: u32 },
    #[error("rank {rank} holds stage {stage} of another pipeline rank")]
    ForeignStage { rank: usize, stage: u32 },
    /// A hybrid model's layers or its Mamba-2 mixer (Megatron's `--hybrid-layer-pattern`).
    #[error("model.{field}: {rule}")]
    Hybrid { field: &'static str, rule: String },
}
