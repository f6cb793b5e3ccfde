//! Built-in model presets, each with the source of its shape.

use super::enums::{Activation, Normalization, PositionEmbedding, RouterScore};
use super::model::{MlaConfig, ModelConfig};

/// Names of the built-in presets.
pub const PRESET_NAMES: &[&str] = &[
    "gpt3-175b",
    "llama2-7b",
    "llama2-70b",
    "llama3-8b",
    "llama3-70b",
    "llama3-405b",
    "mixtral-8x7b",
    "deepseek-v3",
];

/// A Llama-style dense model (RMSNorm, SwiGLU, rotary, untied, no biases).
/// `heads` is (attention heads, KV heads).
fn llama(name: &str, l: u32, h: u64, (a, g): (u32, u32), f: u64, v: u64, ctx: u64) -> ModelConfig {
    ModelConfig {
        name: name.into(),
        num_layers: l,
        hidden_size: h,
        num_attention_heads: a,
        num_query_groups: g,
        ffn_hidden_size: f,
        vocab_size: v,
        max_position_embeddings: ctx,
        ..ModelConfig::default()
    }
}

/// The preset called `name`, if there is one.
pub fn preset(name: &str) -> Option<ModelConfig> {
    Some(match name {
        // Brown et al. 2020 ("Language Models are Few-Shot Learners"), Table 2.1: 96 layers,
        // d_model 12288, 96 heads, context 2048; GPT-2 vocabulary (50257), learned positions,
        // biases, tied embeddings, LayerNorm, GeLU, dropout 0.1.
        "gpt3-175b" => ModelConfig {
            name: name.into(),
            num_layers: 96,
            hidden_size: 12288,
            num_attention_heads: 96,
            num_query_groups: 96,
            kv_channels: None,
            ffn_hidden_size: 4 * 12288,
            vocab_size: 50257,
            max_position_embeddings: 2048,
            position_embedding: PositionEmbedding::Learned,
            activation: Activation::Gelu,
            normalization: Normalization::Layernorm,
            add_bias_linear: true,
            add_qkv_bias: true,
            tied_embeddings: true,
            hidden_dropout: 0.1,
            attention_dropout: 0.1,
            ..ModelConfig::default()
        },
        // Touvron et al. 2023 ("Llama 2"), Table 1 and the released config.json files.
        "llama2-7b" => llama(name, 32, 4096, (32, 32), 11008, 32000, 4096),
        "llama2-70b" => llama(name, 80, 8192, (64, 8), 28672, 32000, 4096),
        // Meta 2024 ("The Llama 3 Herd of Models"), Table 3.
        "llama3-8b" => llama(name, 32, 4096, (32, 8), 14336, 128256, 8192),
        "llama3-70b" => llama(name, 80, 8192, (64, 8), 28672, 128256, 8192),
        "llama3-405b" => llama(name, 126, 16384, (128, 8), 53248, 128256, 8192),
        // Jiang et al. 2024 ("Mixtral of Experts"), Table 1: 8 experts, top-2, every layer MoE.
        "mixtral-8x7b" => ModelConfig {
            num_experts: 8,
            moe_router_topk: 2,
            moe_ffn_hidden_size: 14336,
            ..llama(name, 32, 4096, (32, 8), 14336, 32000, 32768)
        },
        // DeepSeek-AI 2024 ("DeepSeek-V3 Technical Report"), Sec. 4.2, and its config.json:
        // 61 layers, hidden 7168, 128 heads, MLA (q rank 1536, kv rank 512, nope 128, rope 64,
        // v 128), first 3 layers dense (FFN 18432), then 1 shared + 256 routed experts of 2048,
        // top-8, with the aux-loss-free score-correction bias. MTP off by default.
        "deepseek-v3" => ModelConfig {
            name: name.into(),
            num_layers: 61,
            hidden_size: 7168,
            num_attention_heads: 128,
            num_query_groups: 128,
            kv_channels: Some(128),
            ffn_hidden_size: 18432,
            vocab_size: 129280,
            max_position_embeddings: 163840,
            mla: Some(MlaConfig {
                q_lora_rank: 1536,
                kv_lora_rank: 512,
                qk_nope_head_dim: 128,
                qk_rope_head_dim: 64,
                v_head_dim: 128,
            }),
            num_experts: 256,
            moe_router_topk: 8,
            moe_ffn_hidden_size: 2048,
            moe_shared_expert_intermediate_size: 2048,
            moe_first_k_dense: 3,
            moe_router_bias: true,
            // Sigmoid gates renormalised over the top 8, within 4 of 8 node groups
            // (DeepSeek-V3 Technical Report, sec. 2.1.2 and 4.2).
            moe_router_score_function: RouterScore::Sigmoid,
            moe_router_renormalize: true,
            moe_router_num_groups: 8,
            moe_router_group_topk: 4,
            ..ModelConfig::default()
        },
        _ => return None,
    })
}
