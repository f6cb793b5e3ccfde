//! The model architecture: a decoder-only transformer, dense or mixture-of-experts, with
//! MHA, GQA or multi-head latent attention (MLA, DeepSeek-V2/V3).

use super::enums::{Activation, Normalization, PositionEmbedding, RouterScore};
use serde::{Deserialize, Serialize};

/// Multi-head latent attention (DeepSeek-V2, "DeepSeek-V2: A Strong, Economical, and Efficient
/// Mixture-of-Experts Language Model"): low-rank compressed queries and a joint low-rank KV
/// latent, with a decoupled rotary part of the query/key heads.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MlaConfig {
    /// Rank of the query compression (0 = plain `hidden -> heads x qk_head_dim` projection).
    pub q_lora_rank: u64,
    /// Rank of the joint key/value latent.
    pub kv_lora_rank: u64,
    /// Per-head query/key dimension without rotary.
    pub qk_nope_head_dim: u64,
    /// Per-head rotary query/key dimension (the rotary key is shared by all heads).
    pub qk_rope_head_dim: u64,
    /// Per-head value dimension.
    pub v_head_dim: u64,
}

impl MlaConfig {
    /// Query/key head dimension seen by the attention core.
    pub fn qk_head_dim(&self) -> u64 {
        self.qk_nope_head_dim + self.qk_rope_head_dim
    }
}

/// The architecture. Field names follow Megatron-LM's arguments.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    /// A display name (the preset's, or the imported config's architecture).
    pub name: String,
    pub num_layers: u32,
    pub hidden_size: u64,
    pub num_attention_heads: u32,
    /// Key/value heads (GQA); equal to the attention heads for MHA.
    pub num_query_groups: u32,
    /// Per-head dimension; `None` means hidden_size / num_attention_heads.
    pub kv_channels: Option<u64>,
    /// Dense MLP intermediate size.
    pub ffn_hidden_size: u64,
    /// Unpadded vocabulary size.
    pub vocab_size: u64,
    /// Megatron's `--make-vocab-size-divisible-by N`: pad the vocabulary to a multiple of
    /// N x TP. 1 means no padding (the most loaded TP rank holds ceil(V/TP) rows).
    pub make_vocab_size_divisible_by: u64,
    pub max_position_embeddings: u64,
    pub position_embedding: PositionEmbedding,
    pub activation: Activation,
    pub normalization: Normalization,
    /// Biases on every linear layer (GPT-2/3).
    pub add_bias_linear: bool,
    /// Biases on the QKV projection only (Qwen2).
    pub add_qkv_bias: bool,
    pub tied_embeddings: bool,
    /// Dropout after attention/MLP and on embeddings; 0 stores no masks.
    pub hidden_dropout: f64,
    /// Dropout on the attention probabilities; 0 stores no mask.
    pub attention_dropout: f64,
    /// Multi-head latent attention; `None` for MHA/GQA.
    pub mla: Option<MlaConfig>,
    /// Routed experts per MoE layer (0 = dense model).
    pub num_experts: u32,
    pub moe_router_topk: u32,
    /// Intermediate size of one routed expert.
    pub moe_ffn_hidden_size: u64,
    /// Intermediate size of the shared experts together (0 = none); DeepSeek's
    /// n_shared_experts x moe_intermediate_size.
    pub moe_shared_expert_intermediate_size: u64,
    /// Megatron's `--moe-latent-size` (latent MoE, Nemotron 3 Super and Ultra): each MoE layer
    /// projects its tokens from the hidden size down to this width before routing them
    /// (`fc1_latent_proj`), its routed experts work and its tokens travel at this width, and
    /// `fc2_latent_proj` projects the combined output back up (Megatron-Core's moe_layer.py);
    /// the router and the shared experts stay at the hidden size. `None`: no projection.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moe_latent_size: Option<u64>,
    /// The first k layers are dense (DeepSeek-V3: 3).
    pub moe_first_k_dense: u32,
    /// Router carries a per-expert score-correction bias (DeepSeek-V3's aux-loss-free balancing).
    pub moe_router_bias: bool,
    /// Tokens of the hottest expert relative to a uniform share (1.0 = perfectly balanced).
    pub moe_load_imbalance: f64,
    /// Megatron's `--moe-expert-capacity-factor`: each expert takes at most
    /// ceil(factor x tokens x topk / num_experts) of a rank's routed tokens and drops the least
    /// probable beyond (Lepikhin et al. 2020, GShard). 0 = no capacity, no dropping.
    #[serde(default)]
    pub moe_capacity_factor: f64,
    /// Fraction of the routed assignments the capacity drops, in [0, 1), for a router whose
    /// drops are not a balanced router's (a learned one at initialisation crowds a few experts
    /// and drops about half at factor 1.0; `parsim execute` measures it). `None`: a balanced
    /// router's, derived from `moe_capacity_factor`. Needs a capacity factor.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moe_dropped_fraction: Option<f64>,
    /// Megatron's `--moe-aux-loss-coeff`: weight of the load-balancing loss (Fedus et al.
    /// 2021, Switch Transformer eq. 4); 0 = none.
    #[serde(default)]
    pub moe_aux_loss_coeff: f64,
    /// Megatron's `--moe-router-score-function`: softmax, or sigmoid (DeepSeek-V3).
    #[serde(default)]
    pub moe_router_score_function: RouterScore,
    /// Gates renormalised over the k chosen experts (DeepSeek-V3's `norm_topk_prob`).
    #[serde(default)]
    pub moe_router_renormalize: bool,
    /// Megatron's `--moe-router-force-load-balancing`, a benchmarking setting ("for
    /// benchmarking purposes only", Megatron says): the router's choice is overridden by an
    /// exactly balanced one (token g of a microbatch takes experts (g k + j) mod E, j < k),
    /// so every expert gets the same tokens and the engine's balanced router holds exactly;
    /// the gates stay the router's scores of those experts, so the router still trains.
    #[serde(default)]
    pub moe_router_force_load_balancing: bool,
    /// Megatron's `--moe-router-num-groups`: group-limited routing, the experts in this many
    /// equal groups (DeepSeek-V3: 8, one per node); 0 = none.
    #[serde(default)]
    pub moe_router_num_groups: u32,
    /// Megatron's `--moe-router-group-topk`: a token's experts lie in at most this many groups.
    #[serde(default)]
    pub moe_router_group_topk: u32,
    /// Megatron's `--moe-router-bias-update-rate`: the expert bias moves by this much per step.
    #[serde(default = "default_bias_update_rate")]
    pub moe_router_bias_update_rate: f64,
    /// Multi-token-prediction modules (DeepSeek-V3); placed on the last pipeline stage.
    pub mtp_num_layers: u32,
    /// Megatron's `--mtp-loss-scaling-factor`: the MTP losses enter the training loss as
    /// lambda / D times their sum over the D depths (DeepSeek-V3 Technical Report, sec. 2.2,
    /// eq. 25; 0.3 for its first 10T tokens, then 0.1).
    #[serde(default = "default_mtp_loss_scaling_factor")]
    pub mtp_loss_scaling_factor: f64,
    /// QK norm (Qwen3; Megatron's `--qk-layernorm`): an RMSNorm over every query and key head,
    /// with `head_dim` weights for the queries and as many for the keys.
    #[serde(default, skip_serializing_if = "is_false")]
    pub qk_layernorm: bool,
    /// Learned attention sinks (GPT-OSS; Megatron's `--softmax-type learnable`): one logit
    /// per head added to the softmax's denominator, so a head may attend to nothing.
    #[serde(default, skip_serializing_if = "is_false")]
    pub attention_sinks: bool,
    /// The clamp on a gated linear unit's inputs (Megatron's `--activation-func-clamp-value`;
    /// GPT-OSS's `swiglu_limit`, 7.0): the gate half is clamped from above, the linear half to
    /// [-limit, limit], before the activation. `None`: no clamp.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub activation_clamp: Option<f64>,
    /// Sliding-window attention (GPT-OSS 128, Mistral 7B 4096): a query attends to the last
    /// `window_size` keys, itself included (Hugging Face's `sliding_window`; Megatron's
    /// `--window-size L,0` is L + 1). `None`: every query sees its whole causal past.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window_size: Option<u64>,
    /// Chunked attention (Llama 4's `attention_chunk_size`, 8192): the sequence is cut into
    /// chunks of this many tokens and a query attends causally inside its own chunk only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attention_chunk_size: Option<u64>,
    /// Megatron's `--window-attn-skip-freq N`: layer l (1-based) keeps the window or chunk
    /// unless l % N == 0, where it attends in full (GPT-OSS 2, Llama 4 4). 0: every layer.
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    pub window_attn_skip_freq: u32,
    /// Which layers are MoE, as Megatron's `--moe-layer-freq` list (1 MoE, 0 dense; Llama 4
    /// Maverick `[0,1]*24`). Empty: every layer from `moe_first_k_dense` on.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub moe_layer_pattern: Vec<u8>,
    /// The router has a trainable bias per expert (GPT-OSS; Megatron's router under
    /// `--add-bias-linear`), apart from DeepSeek-V3's rule-updated `moe_router_bias`.
    #[serde(default, skip_serializing_if = "is_false")]
    pub moe_router_linear_bias: bool,
    /// A hybrid model's layers (Megatron's `--hybrid-layer-pattern`, Nemotron-H): one
    /// character a layer, `M` a Mamba-2 mixer, `*` attention, `-` an MLP, `E` an MoE, each
    /// with its own pre-norm. `None`: every layer is attention and an MLP (or MoE).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hybrid_layer_pattern: Option<String>,
    /// The Mamba-2 mixer of the `M` layers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mamba: Option<MambaConfig>,
}

/// The Mamba-2 mixer (Dao and Gu 2024, "Transformers are SSMs", sec. 7; Megatron-Core's
/// MambaMixer): an input projection to z, x, B, C and dt, a causal depthwise convolution over
/// x, B and C, the SSD chunked scan, a gated RMSNorm and an output projection.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MambaConfig {
    /// SSM heads (Megatron's `--mamba-num-heads`); heads x head_dim is the inner width.
    pub num_heads: u32,
    /// Channels a head (`--mamba-head-dim`, 64).
    pub head_dim: u64,
    /// State size N (`--mamba-state-dim`, 128).
    pub state_dim: u64,
    /// Groups sharing B and C (`--mamba-num-groups`, 8).
    pub num_groups: u32,
    /// Width of the causal convolution (4).
    #[serde(default = "default_conv_kernel")]
    pub conv_kernel: u64,
    /// The SSD's chunk length Q (128, mamba_ssm's default).
    #[serde(default = "default_ssd_chunk")]
    pub chunk_size: u64,
}

fn default_conv_kernel() -> u64 {
    4
}

fn default_ssd_chunk() -> u64 {
    128
}

impl MambaConfig {
    /// The inner width: heads x head_dim.
    pub fn inner(&self) -> u64 {
        self.num_heads as u64 * self.head_dim
    }

    /// Channels of the convolution: x, B and C.
    pub fn conv_channels(&self) -> u64 {
        self.inner() + 2 * self.num_groups as u64 * self.state_dim
    }
}

/// A layer of a hybrid model (one character of `hybrid_layer_pattern`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum HybridLayer {
    /// `M`: a Mamba-2 mixer.
    Mamba,
    /// `*`: self-attention.
    Attention,
    /// `-`: a dense MLP.
    Mlp,
    /// `E`: a mixture of experts.
    Moe,
}

impl HybridLayer {
    /// The layer a pattern character stands for.
    pub fn of(c: char) -> Option<HybridLayer> {
        match c {
            'M' => Some(HybridLayer::Mamba),
            '*' => Some(HybridLayer::Attention),
            '-' => Some(HybridLayer::Mlp),
            'E' => Some(HybridLayer::Moe),
            _ => None,
        }
    }
}

fn is_false(b: &bool) -> bool {
    !*b
}

fn is_zero_u32(x: &u32) -> bool {
    *x == 0
}

/// Which keys a query of one layer attends to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AttentionSpan {
    /// The whole causal past.
    Full,
    /// The last `n` keys, itself included.
    Window(u64),
    /// Its own `n`-token chunk of the sequence, causally.
    Chunk(u64),
}

/// What kind of decoder layer one layer is: its MLP and its attention span.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct LayerKind {
    pub moe: bool,
    pub span: AttentionSpan,
    /// The one sublayer of a hybrid model's layer; `None` for attention and an MLP.
    pub hybrid: Option<HybridLayer>,
}

/// At most this many layer kinds beside the full-attention dense and MoE layers.
pub const MAX_LAYER_VARIANTS: usize = 4;

/// Megatron's default `--mtp-loss-scaling-factor`.
fn default_mtp_loss_scaling_factor() -> f64 {
    0.1
}

/// Megatron's default `--moe-router-bias-update-rate` (DeepSeek-V3 used 0.001, sec. 4.2).
fn default_bias_update_rate() -> f64 {
    1e-3
}

impl Default for ModelConfig {
    /// Llama-3-8B (Meta, "The Llama 3 Herd of Models", Table 3).
    fn default() -> Self {
        ModelConfig {
            name: "llama3-8b".into(),
            num_layers: 32,
            hidden_size: 4096,
            num_attention_heads: 32,
            num_query_groups: 8,
            kv_channels: None,
            ffn_hidden_size: 14336,
            vocab_size: 128256,
            make_vocab_size_divisible_by: 1,
            max_position_embeddings: 8192,
            position_embedding: PositionEmbedding::Rope,
            activation: Activation::Swiglu,
            normalization: Normalization::Rmsnorm,
            add_bias_linear: false,
            add_qkv_bias: false,
            tied_embeddings: false,
            hidden_dropout: 0.0,
            attention_dropout: 0.0,
            mla: None,
            num_experts: 0,
            moe_router_topk: 0,
            moe_ffn_hidden_size: 0,
            moe_shared_expert_intermediate_size: 0,
            moe_latent_size: None,
            moe_first_k_dense: 0,
            moe_router_bias: false,
            moe_load_imbalance: 1.0,
            moe_capacity_factor: 0.0,
            moe_dropped_fraction: None,
            moe_aux_loss_coeff: 0.0,
            moe_router_score_function: RouterScore::Softmax,
            moe_router_renormalize: false,
            moe_router_force_load_balancing: false,
            moe_router_num_groups: 0,
            moe_router_group_topk: 0,
            moe_router_bias_update_rate: default_bias_update_rate(),
            mtp_num_layers: 0,
            mtp_loss_scaling_factor: default_mtp_loss_scaling_factor(),
            qk_layernorm: false,
            attention_sinks: false,
            activation_clamp: None,
            window_size: None,
            attention_chunk_size: None,
            window_attn_skip_freq: 0,
            moe_layer_pattern: Vec::new(),
            moe_router_linear_bias: false,
            hybrid_layer_pattern: None,
            mamba: None,
        }
    }
}

impl ModelConfig {
    /// Per-head dimension of queries and keys (and values, outside MLA).
    pub fn head_dim(&self) -> u64 {
        self.kv_channels
            .unwrap_or(self.hidden_size / self.num_attention_heads.max(1) as u64)
    }

    /// True when the model has routed experts.
    pub fn is_moe(&self) -> bool {
        self.num_experts > 0
    }

    /// True when layer `layer` (0-based) is a mixture-of-experts layer.
    pub fn is_moe_layer(&self, layer: u32) -> bool {
        if !self.is_moe() {
            return false;
        }
        if let Some(h) = self.hybrid(layer) {
            return h == HybridLayer::Moe;
        }
        if self.moe_layer_pattern.is_empty() {
            return layer >= self.moe_first_k_dense;
        }
        self.moe_layer_pattern.get(layer as usize) == Some(&1)
    }

    /// Number of MoE layers among the decoder layers.
    pub fn num_moe_layers(&self) -> u32 {
        if !self.is_moe() {
            0
        } else if self.moe_layer_pattern.is_empty() && self.hybrid_layer_pattern.is_none() {
            self.num_layers.saturating_sub(self.moe_first_k_dense)
        } else {
            (0..self.num_layers)
                .filter(|&l| self.is_moe_layer(l))
                .count() as u32
        }
    }

    /// The keys a query of layer `layer` (0-based) attends to: the window or chunk, except on
    /// every `window_attn_skip_freq`-th layer (1-based, as Megatron-Core's
    /// `is_layer_window_attention`), which attends in full.
    pub fn attention_span(&self, layer: u32) -> AttentionSpan {
        let full = self.window_attn_skip_freq > 0 && (layer + 1) % self.window_attn_skip_freq == 0;
        match (self.window_size, self.attention_chunk_size) {
            _ if full => AttentionSpan::Full,
            (Some(w), _) => AttentionSpan::Window(w),
            (None, Some(c)) => AttentionSpan::Chunk(c),
            (None, None) => AttentionSpan::Full,
        }
    }

    /// The sublayer of hybrid layer `layer` (0-based); `None` outside a hybrid model.
    pub fn hybrid(&self, layer: u32) -> Option<HybridLayer> {
        let p = self.hybrid_layer_pattern.as_ref()?;
        p.chars().nth(layer as usize).and_then(HybridLayer::of)
    }

    /// The kind of layer `layer` (0-based).
    pub fn layer_kind(&self, layer: u32) -> LayerKind {
        let hybrid = self.hybrid(layer);
        LayerKind {
            moe: self.is_moe_layer(layer),
            span: if hybrid.is_some() {
                AttentionSpan::Full
            } else {
                self.attention_span(layer)
            },
            hybrid,
        }
    }

    /// The layer kinds other than full-attention dense and MoE layers (which every ledger
    /// has), in the order they first appear; empty for a model of full-attention layers.
    pub fn layer_variants(&self) -> Vec<LayerKind> {
        let mut out: Vec<LayerKind> = Vec::new();
        if self.window_size.is_none()
            && self.attention_chunk_size.is_none()
            && self.hybrid_layer_pattern.is_none()
        {
            return out;
        }
        for l in 0..self.num_layers {
            let k = self.layer_kind(l);
            let other = k.span != AttentionSpan::Full || k.hybrid.is_some();
            if other && !out.contains(&k) {
                out.push(k);
                if out.len() == MAX_LAYER_VARIANTS {
                    break;
                }
            }
        }
        out
    }

    /// The index into [`Self::layer_variants`] of layer `layer`'s kind (`None`: a
    /// full-attention dense or MoE layer).
    pub fn variant_of(&self, layer: u32, variants: &[LayerKind]) -> Option<usize> {
        let k = self.layer_kind(layer);
        variants.iter().position(|v| *v == k)
    }

    /// Vocabulary rows after Megatron's padding to a multiple of N x TP (N = 1: none).
    pub fn padded_vocab_size(&self, tp: u32) -> u64 {
        let n = self.make_vocab_size_divisible_by;
        if n <= 1 {
            return self.vocab_size;
        }
        let multiple = n * tp as u64;
        self.vocab_size.div_ceil(multiple) * multiple
    }
}
