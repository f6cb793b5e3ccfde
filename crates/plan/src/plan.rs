//! The Plan: everything a backend needs to run a training step, and nothing about presets or
//! configuration files. Per rank: its coordinates, its process groups, the pipeline stages
//! (model chunks) it holds, and its ordered actions. The engine lowers a configuration into a
//! Plan (`parsim::lower`), so prediction and execution describe the same work.

pub use crate::group::Coords;
use crate::group::{GroupKind, Groups};
use serde::Serialize;
use std::ops::Range;

/// Normalisation layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Norm {
    RmsNorm,
    LayerNorm,
}

/// MLP activation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Activation {
    Swiglu,
    Gelu,
}

/// Activation recomputation (Korthikanti et al. 2022).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Recompute {
    None,
    /// Drops the attention core's softmax (or log-sum-exp) and recomputes it in backward.
    Selective,
    /// Keeps each layer's input only and reruns the layer's forward in backward.
    Full,
}

/// How context parallelism exchanges K/V (Liu et al. 2023 Ring Attention; Megatron's CP;
/// Jacobs et al. 2023 DeepSpeed-Ulysses).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum CpComm {
    /// Ring of K/V blocks over contiguous sequence shards (causal work grows with the rank).
    Ring,
    /// The same ring over the load-balanced layout: rank r holds chunks r and 2cp-1-r.
    Zigzag,
    /// All-gather K/V before attention, reduce-scatter dK/dV after (load-balanced layout).
    AllGather,
    /// Ulysses: all-to-all Q/K/V to head shards of the whole sequence, and the output back.
    A2a,
}

impl CpComm {
    /// Whether the sequence is cut into 2cp chunks, rank r holding chunks r and 2cp-1-r.
    pub fn load_balanced(self) -> bool {
        matches!(self, CpComm::Zigzag | CpComm::AllGather)
    }

    /// Positions (within one sequence of `seq`) of the rows CP rank `rank` of `cp` holds.
    pub fn positions(self, seq: usize, cp: usize, rank: usize) -> Vec<u32> {
        if cp <= 1 {
            return (0..seq as u32).collect();
        }
        if self.load_balanced() {
            let c = seq / (2 * cp);
            let early = rank * c;
            let late = (2 * cp - 1 - rank) * c;
            (early..early + c)
                .chain(late..late + c)
                .map(|p| p as u32)
                .collect()
        } else {
            let c = seq / cp;
            (rank * c..(rank + 1) * c).map(|p| p as u32).collect()
        }
    }
}

/// The model's shape (unsharded sizes).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelShape {
    pub num_layers: u32,
    pub hidden: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub ffn: usize,
    /// Rows of the embedding and output layer (padded vocabulary; divisible by tp).
    pub vocab: usize,
    /// Synthetic tokens are drawn from 0..data_vocab (<= vocab).
    pub data_vocab: usize,
    pub seq: usize,
    pub micro_batch: usize,
    pub norm: Norm,
    pub norm_eps: f32,
    pub activation: Activation,
    pub rope_theta: f32,
    /// Fused attention: keep the log-sum-exp instead of the softmax.
    pub flash: bool,
    /// Standard deviation of the (uniform) initialisation of weight matrices.
    pub init_std: f32,
    /// Mixture-of-experts layers (`None`: a dense model).
    pub moe: Option<MoeShape>,
    /// Megatron's hidden dropout rate (after the embedding, attention and MLP), in [0, 1).
    pub hidden_dropout: f32,
    /// Dropout of the attention probabilities, in [0, 1): runs inside the flash attention, its
    /// mask regenerated in backward (the executor's `rng::AttnDropout`).
    pub attention_dropout: f32,
    /// The output layer reads the input embedding's weight (GPT-2/3); with PP > 1 the last
    /// stage holds a copy kept equal by the embedding group's all-reduce.
    pub tied_embeddings: bool,
    /// Biases on every linear layer (Megatron's `--add-bias-linear`): column-parallel ones split
    /// with their output columns, row-parallel ones replicated and added after the reduction.
    pub bias_linear: bool,
    /// A bias on the fused QKV projection (`--add-qkv-bias`, implied by `bias_linear`).
    pub qkv_bias: bool,
    /// Learned absolute position embeddings with this many rows (GPT-2/3); 0 = rotary.
    pub learned_positions: usize,
    /// Multi-head latent attention instead of the fused QKV projection (`None`: MHA/GQA).
    pub mla: Option<MlaShape>,
    /// Multi-token-prediction modules D on the last stage (DeepSeek-V3 sec. 2.2; 0 = none).
    pub mtp_layers: u32,
    /// Weight of each MTP depth's mean loss in the training loss: lambda / D.
    pub mtp_loss_scale: f32,
    /// Sliding-window or chunked attention, attention sinks and QK norm (all off by default).
    pub attention: AttentionShape,
    /// A hybrid model's decoder layers, one sublayer each (Megatron's `--hybrid-layer-pattern`);
    /// empty: every layer is attention and an MLP (or MoE).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub hybrid: Vec<HybridLayer>,
    /// The Mamba-2 mixer of the hybrid model's [`HybridLayer::Mamba`] layers.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mamba: Option<MambaShape>,
}

/// The keys a query attends to, besides the causal mask: all of its past, the last `w`
/// positions (itself included: sliding-window attention, GPT-OSS, Mistral), or its own chunk
/// of `c` positions (Llama 4's chunked attention).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Default)]
pub enum AttnSpan {
    #[default]
    Full,
    Window(usize),
    Chunk(usize),
}

impl AttnSpan {
    /// The first key position a query at position `qp` sees (the last is `qp` itself).
    pub fn first_key(self, qp: u32) -> u32 {
        // Spans beyond u32 positions cover every position: no wrap, no division by zero.
        let positions = |n: usize| u32::try_from(n.max(1)).unwrap_or(u32::MAX);
        match self {
            AttnSpan::Full => 0,
            AttnSpan::Window(w) => qp.saturating_sub(positions(w) - 1),
            AttnSpan::Chunk(c) => qp - qp % positions(c),
        }
    }
}

/// Attention variants of issue 31's models; the default is plain causal attention.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Default)]
pub struct AttentionShape {
    /// Sliding window of this many keys per query, itself included (`None`: none).
    pub window: Option<usize>,
    /// Chunked attention: a query sees its own chunk of this many positions (`None`: none).
    pub chunk: Option<usize>,
    /// Megatron's `--window-attn-skip-freq`: layer l (1-based) with l % full_every == 0
    /// attends in full; 0 = every layer keeps the window or chunk.
    pub full_every: u32,
    /// Learned attention sinks (GPT-OSS): one logit per query head in every softmax's
    /// denominator, split over TP with the heads.
    pub sinks: bool,
    /// QK norm (Qwen3): the model's norm over each query and key head (`head_dim` features),
    /// its two gains shared by the heads and replicated over TP.
    pub qk_norm: bool,
}

impl ModelShape {
    /// A dense decoder with every option off: RMSNorm, SwiGLU, flash attention, rotary
    /// positions (theta 10 000), init std 0.02, head_dim = hidden / heads, the whole vocabulary
    /// in the data, one sequence of one token per microbatch, and no MoE, MLA, MTP, dropout,
    /// biases or tied embeddings. Tests and benchmarks set the rest with `..`.
    pub fn dense(
        num_layers: u32,
        hidden: usize,
        heads: usize,
        kv_heads: usize,
        ffn: usize,
        vocab: usize,
    ) -> Self {
        ModelShape {
            num_layers,
            hidden,
            heads,
            kv_heads,
            head_dim: hidden / heads.max(1),
            ffn,
            vocab,
            data_vocab: vocab,
            seq: 1,
            micro_batch: 1,
            norm: Norm::RmsNorm,
            norm_eps: 1e-5,
            activation: Activation::Swiglu,
            rope_theta: 10000.0,
            flash: true,
            init_std: 0.02,
            moe: None,
            hidden_dropout: 0.0,
            attention_dropout: 0.0,
            tied_embeddings: false,
            bias_linear: false,
            qkv_bias: false,
            learned_positions: 0,
            mtp_layers: 0,
            mtp_loss_scale: 0.0,
            mla: None,
            attention: AttentionShape::default(),
            hybrid: Vec::new(),
            mamba: None,
        }
    }
}

/// One decoder layer of a hybrid model (one character of Megatron's `--hybrid-layer-pattern`):
/// its one sublayer, with its own pre-norm and residual.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum HybridLayer {
    /// `M`: the Mamba-2 mixer.
    Mamba,
    /// `*`: self-attention.
    Attention,
    /// `-`: the dense MLP.
    Mlp,
    /// `E`: the mixture of experts.
    Moe,
}

/// The Mamba-2 mixer (Dao and Gu 2024, "Transformers are SSMs", sec. 7; Megatron-Core's
/// MambaMixer): in_proj to z, x, B, C and dt; a causal depthwise convolution and SiLU over x,
/// B and C; the SSD scan; the D skip; a gated RMSNorm grouped by the B/C groups; out_proj.
/// Tensor parallelism splits the heads and the groups.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct MambaShape {
    /// SSM heads; heads x head_dim is the inner width.
    pub heads: usize,
    /// Channels a head (P).
    pub head_dim: usize,
    /// State size (N).
    pub state: usize,
    /// Groups sharing B and C.
    pub groups: usize,
    /// Width of the causal convolution.
    pub conv_kernel: usize,
    /// The SSD's chunk length (Q).
    pub chunk: usize,
}

impl MambaShape {
    /// The inner width: heads x head_dim.
    pub fn inner(&self) -> usize {
        self.heads * self.head_dim
    }
}

/// Multi-head latent attention (DeepSeek-V2, "DeepSeek-V2: A Strong, Economical, and Efficient
/// Mixture-of-Experts Language Model", section 2.1): the query through a low-rank latent with
/// its RMSNorm, keys and values through a joint latent with its RMSNorm, and a decoupled rotary
/// key shared by all heads. Query/key heads are `qk_nope + qk_rope` wide, value heads `v`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct MlaShape {
    pub q_lora_rank: usize,
    pub kv_lora_rank: usize,
    pub qk_nope: usize,
    pub qk_rope: usize,
    pub v: usize,
}

impl MlaShape {
    /// Query/key head width seen by the attention core.
    pub fn qk(&self) -> usize {
        self.qk_nope + self.qk_rope
    }
}

/// The routed experts of the MoE layers (Shazeer et al. 2017; Megatron-Core's MoE): a
/// replicated router (hidden -> experts), softmax or sigmoid scores then top-k (optionally
/// group-limited and with DeepSeek-V3's selection-only expert bias), experts as the dense MLP
/// (no biases) with their own intermediate size, and optional shared experts.
#[derive(Debug, Clone, PartialEq, Serialize, Default)]
pub struct MoeShape {
    pub num_experts: usize,
    pub top_k: usize,
    /// Intermediate size of one expert.
    pub ffn: usize,
    /// The first layers are dense (Megatron's `--moe-layer-freq` with leading dense layers).
    pub first_k_dense: u32,
    /// Expert capacity = ceil(factor x tokens x k / experts) per source microbatch; 0 = none.
    pub capacity_factor: f32,
    /// Coefficient of the load-balancing loss (Fedus et al. 2021, eq. 4); 0 = none.
    pub aux_loss_coeff: f32,
    /// The router's scores, their top-k selection and gates.
    pub router: RouterShape,
    /// Intermediate size of the shared experts together (DeepSeek-V2/V3; 0 = none).
    pub shared_ffn: usize,
    /// Which decoder layers are MoE (1) or dense (0), as Megatron's `--moe-layer-freq` list
    /// (Llama 4 Maverick: every other one); empty: every layer from `first_k_dense` on.
    pub layer_pattern: Vec<u8>,
    /// A trained bias per expert on the router's logits (GPT-OSS; Megatron's router under
    /// `--add-bias-linear`), replicated over TP as the router.
    pub router_linear_bias: bool,
}

/// The router's score function (Megatron's `--moe-router-score-function`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Default)]
pub enum ScoreFunction {
    #[default]
    Softmax,
    /// Per-expert sigmoid (DeepSeek-V3).
    Sigmoid,
}

/// How tokens choose experts beyond plain softmax top-k (DeepSeek-V3, "DeepSeek-V3 Technical
/// Report", sec. 2.1.2; Megatron's router flags). The default is the plain router.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Default)]
pub struct RouterShape {
    pub score: ScoreFunction,
    /// Gates renormalised over the k chosen scores (DeepSeek-V3's `norm_topk_prob`).
    pub renormalize: bool,
    /// Auxiliary-loss-free balancing: a per-expert bias added to the scores for selection
    /// only, updated after each step by `bias_update_rate` x sign(mean load - load).
    pub expert_bias: bool,
    pub bias_update_rate: f32,
    /// Group-limited routing: experts in `groups` equal groups, a token's experts chosen
    /// within its best `group_topk` groups (0 = no groups).
    pub groups: usize,
    pub group_topk: usize,
    /// Megatron's `--moe-router-force-load-balancing` (benchmarking): token t of a microbatch
    /// takes experts (t k + j) mod E, j < k, whatever its scores; every expert gets the same
    /// tokens. The gates stay the scores of those experts.
    pub force_balance: bool,
}

impl RouterShape {
    /// True when this is the plain router (softmax, no renormalisation, bias or groups).
    pub fn is_plain(&self) -> bool {
        *self == RouterShape::default()
    }
}

impl ModelShape {
    /// Tokens of one microbatch.
    pub fn tokens(&self) -> usize {
        self.seq * self.micro_batch
    }

    /// True when decoder layer `layer` (0-based) is a mixture-of-experts layer.
    pub fn is_moe_layer(&self, layer: u32) -> bool {
        if let Some(k) = self.hybrid_layer(layer) {
            return k == HybridLayer::Moe && self.moe.is_some();
        }
        self.moe.as_ref().is_some_and(|m| {
            if m.layer_pattern.is_empty() {
                layer >= m.first_k_dense
            } else {
                m.layer_pattern.get(layer as usize) == Some(&1)
            }
        })
    }

    /// The keys a query of decoder layer `layer` (0-based) sees: the window or chunk, except
    /// on every `full_every`-th layer (1-based, Megatron-Core's `is_layer_window_attention`).
    pub fn span(&self, layer: u32) -> AttnSpan {
        let a = &self.attention;
        if a.full_every > 0 && (layer + 1) % a.full_every == 0 {
            return AttnSpan::Full;
        }
        match (a.window, a.chunk) {
            (Some(w), _) => AttnSpan::Window(w),
            (None, Some(c)) => AttnSpan::Chunk(c),
            (None, None) => AttnSpan::Full,
        }
    }

    /// The sublayer of hybrid layer `layer` (0-based); `None` outside a hybrid model (and for
    /// the MTP modules' layers, which are whole transformer layers).
    pub fn hybrid_layer(&self, layer: u32) -> Option<HybridLayer> {
        self.hybrid.get(layer as usize).copied()
    }
}

/// The parallel mix as the executor needs it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Parallelism {
    pub tp: u32,
    /// Megatron sequence parallelism (only with tp > 1).
    pub sp: bool,
    /// Context parallelism: every activation split along the sequence over `cp` ranks.
    pub cp: u32,
    pub cp_comm: CpComm,
    pub pp: u32,
    pub vpp: u32,
    pub dp: u32,
    /// Expert parallelism (divides dp; experts split over the EP group).
    pub ep: u32,
    /// Expert tensor parallelism (Megatron's `--expert-tensor-parallel-size`): each expert's
    /// intermediate size splits over an expert-TP group of `etp` ranks (`tp`: the TP group, as
    /// the dense MLP; 1: whole experts). Otherwise (MoE Parallel Folding, under TP + SP) each
    /// rank routes its own tokens; below tp the other expert-TP blocks of a TP group join the
    /// expert-data-parallel group, above tp an expert-TP group spans several DP or CP ranks.
    pub etp: u32,
    /// ZeRO stage 0..=3 (Rajbhandari et al. 2020).
    pub zero: u8,
    pub recompute: Recompute,
    /// ZeRO 0/1 gradient buckets, in parameters: `Some(n)` reduces each bucket (all-reduce
    /// under ZeRO 0, reduce-scatter under ZeRO 1) during the last microbatch's backward as
    /// soon as its gradients are final, as Megatron-Core's DDP with `overlap_grad_reduce`;
    /// `None` reduces the whole gradient at the optimizer step.
    pub grad_bucket_params: Option<usize>,
}

impl Parallelism {
    /// Whether each TP rank routes its own sequence shard in the MoE layers: under TP (which
    /// MoE needs with SP, as Megatron-Core), whatever the expert TP, as Megatron-Core's token
    /// dispatchers do.
    pub fn moe_routes_sp_shard(&self) -> bool {
        self.tp > 1 && self.sp
    }
}

/// LoRA fine-tuning (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models"):
/// every base weight frozen, a trainable pair A [rank, in], B [out, rank] beside each target
/// projection, its output scaled by `alpha / rank`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct LoraShape {
    pub rank: usize,
    pub alpha: f32,
    /// The engine's targets: the fused QKV projection, the attention output projection, the
    /// MLP's fc1 (gate and up under SwiGLU) and fc2.
    pub qkv: bool,
    pub proj: bool,
    pub fc1: bool,
    pub fc2: bool,
    /// B drawn from the seed instead of zero (Hu et al. start B at zero, which makes the first
    /// step's adapter output vanish): equivalence tests use it so they cannot pass trivially.
    pub seeded_b: bool,
}

impl LoraShape {
    /// The adapter output's scale alpha / r.
    pub fn scale(&self) -> f32 {
        self.alpha / self.rank as f32
    }
}

/// Adam hyper-parameters.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct AdamConfig {
    pub lr: f32,
    pub beta1: f32,
    pub beta2: f32,
    pub eps: f32,
    pub weight_decay: f32,
}

impl Default for AdamConfig {
    fn default() -> Self {
        AdamConfig {
            lr: 1e-3,
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            weight_decay: 0.0,
        }
    }
}

/// One global pipeline stage (model chunk).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StagePlan {
    pub stage: u32,
    /// The pipeline rank that runs it.
    pub pp_rank: u32,
    /// Decoder layers (contiguous).
    pub layers: Range<u32>,
    pub embedding: bool,
    pub output: bool,
}

/// One action of a rank, in execution order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
pub enum Action {
    /// Forward of `stage` for microbatch `mb`.
    Forward { stage: u32, mb: u32 },
    /// Full backward (input and weight gradients).
    Backward { stage: u32, mb: u32 },
    /// Input-gradient part of a split backward (zero-bubble schedules, Qi et al. 2024).
    BackwardInput { stage: u32, mb: u32 },
    /// Weight-gradient part of a split backward.
    BackwardWeight { stage: u32, mb: u32 },
    /// Send the output of `stage` for `mb` to global rank `to`.
    SendActivation { to: u32, stage: u32, mb: u32 },
    /// Receive the output of `stage` for `mb` from global rank `from`.
    RecvActivation { from: u32, stage: u32, mb: u32 },
    /// Send the input gradient of `stage` for `mb` to global rank `to`.
    SendGrad { to: u32, stage: u32, mb: u32 },
    /// Receive the input gradient of `stage` for `mb` from global rank `from`.
    RecvGrad { from: u32, stage: u32, mb: u32 },
    /// Reduce gradients over data parallelism (ZeRO as configured) and run Adam.
    OptimizerStep,
}

/// What one rank does.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RankPlan {
    pub rank: u32,
    pub coords: Coords,
    /// Members (global ranks, ascending) of this rank's group of each kind: the dense grid's
    /// TP, CP (the context-parallel ring), DP, DP x CP (the dense parameters' replicas, over
    /// which their gradients reduce and ZeRO shards) and PP groups; the expert grid's EP group
    /// (the ranks among which the experts are split), expert-DP group (the ranks holding the
    /// same slices of the same experts, over which expert gradients reduce) and expert-TP group
    /// (the `etp` ranks over which each expert's intermediate size splits: a block of the TP
    /// group when etp divides tp, else consecutive ranks of the flattened tp x cp x dp index,
    /// MoE Parallel Folding).
    pub groups: Groups,
    /// Global stages this rank holds, ascending.
    pub stages: Vec<u32>,
    /// One step's actions.
    pub actions: Vec<Action>,
}

impl RankPlan {
    /// This rank's expert-TP index: its place in its expert-TP group (the slice of each local
    /// expert's intermediate size it holds; 0 without the group).
    pub fn et_rank(&self) -> u32 {
        self.groups
            .get(GroupKind::ExpertTp)
            .iter()
            .position(|&x| x == self.rank)
            .unwrap_or(0) as u32
    }
}

/// The arithmetic recipe of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub enum Precision {
    /// Everything fp32: the equivalence reference.
    #[default]
    Fp32,
    /// The GPU's mixed-precision recipe: bf16 activations and weight copies, fp32 master
    /// weights (kept with the optimizer states), gradients and Adam moments; matmuls and
    /// reductions accumulate in fp32 and round to bf16 where their outputs are stored.
    Bf16,
}

impl Precision {
    /// The dtype of activations and weight copies.
    pub fn compute_dtype(self) -> crate::DType {
        match self {
            Precision::Fp32 => crate::DType::F32,
            Precision::Bf16 => crate::DType::Bf16,
        }
    }
}

/// A whole plan.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Plan {
    pub model: ModelShape,
    pub parallel: Parallelism,
    pub adam: AdamConfig,
    /// Seed of the initialisation and of the synthetic tokens.
    pub seed: u64,
    /// Microbatches per data-parallel rank per step.
    pub microbatches: u32,
    /// Schedule name, for reports.
    pub schedule: String,
    pub stages: Vec<StagePlan>,
    pub ranks: Vec<RankPlan>,
    /// LoRA fine-tuning (`None`: every weight trains).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lora: Option<LoraShape>,
}

impl Plan {
    /// World size.
    pub fn world(&self) -> u32 {
        self.ranks.len() as u32
    }

    /// Sequences per step over all data-parallel ranks.
    pub fn global_batch(&self) -> usize {
        // Context-parallel ranks share their sequences.
        self.microbatches as usize * self.model.micro_batch * self.parallel.dp as usize
    }

    /// A one-rank plan: every microbatch forward then backward, then the optimizer.
    pub fn single_rank(
        model: ModelShape,
        adam: AdamConfig,
        seed: u64,
        microbatches: u32,
        recompute: Recompute,
    ) -> Plan {
        let mut actions = Vec::new();
        for mb in 0..microbatches {
            actions.push(Action::Forward { stage: 0, mb });
            actions.push(Action::Backward { stage: 0, mb });
        }
        actions.push(Action::OptimizerStep);
        Plan {
            stages: vec![StagePlan {
                stage: 0,
                pp_rank: 0,
                layers: 0..model.num_layers,
                embedding: true,
                output: true,
            }],
            model,
            parallel: Parallelism {
                tp: 1,
                sp: false,
                cp: 1,
                cp_comm: CpComm::Ring,
                pp: 1,
                vpp: 1,
                dp: 1,
                ep: 1,
                etp: 1,
                zero: 0,
                recompute,
                grad_bucket_params: None,
            },
            adam,
            seed,
            microbatches,
            schedule: "single".into(),
            ranks: vec![RankPlan {
                rank: 0,
                coords: Coords::default(),
                groups: Groups::alone(0),
                stages: vec![0],
                actions,
            }],
            lora: None,
        }
    }
}
