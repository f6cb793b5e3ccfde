//! Built-in model presets, each with the source of its shape.

use super::enums::{Activation, Normalization, PositionEmbedding, RouterScore};
use super::model::{MambaConfig, MlaConfig, ModelConfig};

/// Builds a preset's model under the name it is asked by.
pub type BuildPreset = fn(&str) -> ModelConfig;

/// The built-in presets: a name and the function that builds the model (with its source in
/// a comment there). A new preset is one line here; the names (`--model`'s help, the
/// unknown-preset error, the GUI's list, the fuzz lists) derive from this table.
pub const PRESETS: &[(&str, BuildPreset)] = &[
    ("gpt3-175b", gpt3_175b),
    // Touvron et al. 2023 ("Llama 2"), Table 1 and the released config.json files.
    ("llama2-7b", |n| {
        llama(n, 32, 4096, (32, 32), 11008, 32000, 4096)
    }),
    ("llama2-70b", |n| {
        llama(n, 80, 8192, (64, 8), 28672, 32000, 4096)
    }),
    // Meta 2024 ("The Llama 3 Herd of Models"), Table 3.
    ("llama3-8b", |n| {
        llama(n, 32, 4096, (32, 8), 14336, 128256, 8192)
    }),
    ("llama3-70b", |n| {
        llama(n, 80, 8192, (64, 8), 28672, 128256, 8192)
    }),
    ("llama3-405b", |n| {
        llama(n, 126, 16384, (128, 8), 53248, 128256, 8192)
    }),
    ("mixtral-8x7b", mixtral_8x7b),
    ("deepseek-v3", deepseek_v3),
    ("qwen3-8b", |n| qwen3(n, 36, 4096, (32, 8), 12288, None)),
    ("qwen3-30b-a3b", |n| {
        qwen3(n, 48, 2048, (32, 4), 6144, Some((128, 8, 768)))
    }),
    ("qwen3-235b-a22b", |n| {
        qwen3(n, 94, 4096, (64, 4), 12288, Some((128, 8, 1536)))
    }),
    ("gpt-oss-20b", |n| gpt_oss(n, 24, 32)),
    ("gpt-oss-120b", |n| gpt_oss(n, 36, 128)),
    ("kimi-k2", kimi_k2),
    ("llama4-scout", |n| llama4(n, 16, false, 10485760)),
    ("llama4-maverick", |n| llama4(n, 128, true, 1048576)),
    ("nemotron-h-8b", |n| {
        nemotron_h(n, NEMOTRON_H_8B, 4096, 32, 21504, (128, 128))
    }),
    ("nemotron-h-47b", |n| {
        nemotron_h(n, NEMOTRON_H_47B, 8192, 64, 30720, (256, 256))
    }),
    ("nemotron-h-56b", |n| {
        nemotron_h(n, NEMOTRON_H_56B, 8192, 64, 32768, (256, 256))
    }),
    ("nemotron-3-nano", nemotron_3_nano),
    ("nemotron-3-super", |n| {
        nemotron_3_latent(n, NEMOTRON_3_SUPER, 4096, (32, 128), (2688, 5376, 1024))
    }),
    ("nemotron-3-ultra", |n| {
        nemotron_3_latent(n, NEMOTRON_3_ULTRA, 8192, (64, 256), (5120, 10240, 2048))
    }),
];

/// Names of the built-in presets, in [`PRESETS`]' order.
pub const PRESET_NAMES: &[&str] = &{
    let mut names = [""; PRESETS.len()];
    let mut i = 0;
    while i < PRESETS.len() {
        names[i] = PRESETS[i].0;
        i += 1;
    }
    names
};

/// The `--model` help: every preset.
pub fn preset_help() -> String {
    format!("Model preset ({}).", PRESET_NAMES.join(", "))
}

/// A Qwen3 model (Qwen team 2025, "Qwen3 Technical Report", Tables 1 and 2, and the released
/// config.json files): head dimension 128 whatever hidden / heads is, QK norm, untied
/// embeddings (8B up), the 151,936-token vocabulary; `moe` is (experts, top-k, expert FFN),
/// the gates renormalised over the top k (`norm_topk_prob`), every layer MoE.
fn qwen3(
    name: &str,
    l: u32,
    h: u64,
    heads: (u32, u32),
    f: u64,
    moe: Option<(u32, u32, u64)>,
) -> ModelConfig {
    let mut m = ModelConfig {
        kv_channels: Some(128),
        qk_layernorm: true,
        ..llama(name, l, h, heads, f, 151936, 40960)
    };
    if let Some((e, k, moe_ffn)) = moe {
        m.num_experts = e;
        m.moe_router_topk = k;
        m.moe_ffn_hidden_size = moe_ffn;
        m.moe_router_renormalize = true;
    }
    m
}

/// GPT-OSS (OpenAI 2025, "gpt-oss-120b & gpt-oss-20b Model Card", Table 1 and sec. 2.1, and
/// the released config.json files): `l` layers of hidden 2880, 64 query and 8 KV heads of 64,
/// biases on attention and experts, a learned sink per head, a 128-token sliding window on
/// every other layer (from the first), `e` experts of 2880 with top-4 softmax routing and a
/// biased router, the GLU's inputs clamped to 7 (`swiglu_limit`), the o200k vocabulary
/// (201,088 rows).
fn gpt_oss(name: &str, l: u32, e: u32) -> ModelConfig {
    ModelConfig {
        kv_channels: Some(64),
        add_bias_linear: true,
        add_qkv_bias: true,
        num_experts: e,
        moe_router_topk: 4,
        moe_ffn_hidden_size: 2880,
        moe_router_renormalize: true,
        moe_router_linear_bias: true,
        attention_sinks: true,
        activation_clamp: Some(7.0),
        window_size: Some(128),
        window_attn_skip_freq: 2,
        ..llama(name, l, 2880, (64, 8), 2880, 201088, 131072)
    }
}

/// Llama 4's language model (Meta 2025, "The Llama 4 herd", and the released config.json
/// files' `text_config`): 48 layers of hidden 5120, 40 query and 8 KV heads of 128, dense
/// layers of 16384, MoE layers of `e` routed experts and one shared expert of 8192 with
/// top-1 sigmoid routing, on every layer (Scout) or every other one from the second
/// (Maverick's `interleave_moe_layer_step` 2), attention in 8192-token chunks except on
/// every fourth layer (the NoPE layers, which attend in full), the 202,048-token vocabulary.
/// The vision encoder is not modelled.
fn llama4(name: &str, e: u32, interleave: bool, ctx: u64) -> ModelConfig {
    ModelConfig {
        num_experts: e,
        moe_router_topk: 1,
        moe_ffn_hidden_size: 8192,
        moe_shared_expert_intermediate_size: 8192,
        moe_router_score_function: RouterScore::Sigmoid,
        moe_layer_pattern: if interleave {
            (0..48).map(|l| (l % 2) as u8).collect()
        } else {
            Vec::new()
        },
        attention_chunk_size: Some(8192),
        window_attn_skip_freq: 4,
        kv_channels: Some(128),
        ..llama(name, 48, 5120, (40, 8), 16384, 202048, ctx)
    }
}

/// A hybrid Mamba-2 model of NVIDIA's Nemotron-H family (NVIDIA 2025, "Nemotron-H: A Family
/// of Accurate and Efficient Hybrid Mamba-Transformer Models", arXiv:2504.03624, Table 1, and
/// the released config.json files): `pattern`'s layers (M Mamba-2, * attention, - MLP, E
/// MoE), 8 KV groups of 128 channels, no positional embedding (the Mamba layers carry
/// order), squared-ReLU MLPs (not gated: GeLU's shapes), RMSNorm, no biases, untied
/// embeddings, the 131,072-token vocabulary; Mamba-2 mixers of `mamba_heads` heads of 64
/// with 8 groups of state `state`, kernel 4.
fn nemotron_h(
    name: &str,
    pattern: &str,
    h: u64,
    heads: u32,
    f: u64,
    (mamba_heads, state): (u32, u64),
) -> ModelConfig {
    ModelConfig {
        kv_channels: Some(128),
        position_embedding: PositionEmbedding::None,
        activation: Activation::Gelu,
        hybrid_layer_pattern: Some(pattern.into()),
        mamba: Some(MambaConfig {
            num_heads: mamba_heads,
            head_dim: 64,
            state_dim: state,
            num_groups: 8,
            conv_kernel: 4,
            chunk_size: 128,
        }),
        ..llama(name, pattern.len() as u32, h, (heads, 8), f, 131072, 8192)
    }
}

/// Nemotron-H-8B's and -56B's layer pattern: a Mamba-2 layer before every MLP, attention at
/// the given period (Megatron-Bridge's NemotronH providers, the config.json files).
const NEMOTRON_H_8B: &str = "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-";
const NEMOTRON_H_47B: &str = "M-M-M-M-M-M-M-M-M*-M-M-M-M-M-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-M-M---MM---M-M*-M-M-M-M-M-";
const NEMOTRON_H_56B: &str = "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-";
/// Nemotron 3 Nano 30B-A3B's 52 layers: 23 Mamba-2, 6 attention, 23 MoE.
const NEMOTRON_3_NANO: &str = "MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME";
/// Nemotron 3 Super 120B-A12B's 88 layers: 40 Mamba-2, 8 attention, 40 latent MoE.
const NEMOTRON_3_SUPER: &str =
    "MEMEMEM*EMEMEMEM*EMEMEMEM*EMEMEMEMEM*EMEMEMEMEM*EMEMEMEMEM*EMEMEMEMEM*EMEMEMEM*EMEMEMEME";
/// Nemotron 3 Ultra 550B-A55B's 108 layers: 48 Mamba-2, 12 attention, 48 latent MoE.
const NEMOTRON_3_ULTRA: &str = "MEMEMEM*EMEMEM*EMEMEMEM*EMEMEMEM*EMEMEM*EMEMEMEM*EMEMEMEM*EMEMEM*EMEMEMEM*EMEMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME";

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
    PRESETS
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(n, build)| build(n))
}

/// Brown et al. 2020 ("Language Models are Few-Shot Learners"), Table 2.1: 96 layers, d_model
/// 12288, 96 heads, context 2048; GPT-2 vocabulary (50257), learned positions, biases, tied
/// embeddings, LayerNorm, GeLU, dropout 0.1.
fn gpt3_175b(name: &str) -> ModelConfig {
    ModelConfig {
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
    }
}

/// Jiang et al. 2024 ("Mixtral of Experts"), Table 1: 8 experts, top-2, every layer MoE.
fn mixtral_8x7b(name: &str) -> ModelConfig {
    ModelConfig {
        num_experts: 8,
        moe_router_topk: 2,
        moe_ffn_hidden_size: 14336,
        ..llama(name, 32, 4096, (32, 8), 14336, 32000, 32768)
    }
}

/// DeepSeek-AI 2024 ("DeepSeek-V3 Technical Report"), Sec. 4.2, and its config.json: 61
/// layers, hidden 7168, 128 heads, MLA (q rank 1536, kv rank 512, nope 128, rope 64, v 128),
/// first 3 layers dense (FFN 18432), then 1 shared + 256 routed experts of 2048, top-8, with
/// the aux-loss-free score-correction bias. MTP off by default.
fn deepseek_v3(name: &str) -> ModelConfig {
    ModelConfig {
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
    }
}

/// Moonshot AI 2025 ("Kimi K2: Open Agentic Intelligence", sec. 2.3 and Table 2, and its
/// config.json): DeepSeek-V3's architecture with 64 heads, 384 routed experts and one shared,
/// the first layer dense, no expert groups, a 163,840-token vocabulary.
fn kimi_k2(name: &str) -> ModelConfig {
    ModelConfig {
        num_attention_heads: 64,
        num_query_groups: 64,
        vocab_size: 163840,
        max_position_embeddings: 131072,
        num_experts: 384,
        moe_first_k_dense: 1,
        moe_router_num_groups: 0,
        moe_router_group_topk: 0,
        ..deepseek_v3(name)
    }
}

/// NVIDIA 2025 ("NVIDIA Nemotron 3 Nano 30B-A3B" model card and config.json; Megatron-LM's
/// modelopt conf file): hidden 2688, 32 query and 2 KV heads of 128, Mamba-2 mixers of 64
/// heads of 64 (state 128, 8 groups), MoE layers of 128 squared-ReLU experts of 1856 with
/// top-6 sigmoid routing, the aux-loss-free expert bias and one shared expert of 3712.
fn nemotron_3_nano(name: &str) -> ModelConfig {
    ModelConfig {
        num_experts: 128,
        moe_router_topk: 6,
        moe_ffn_hidden_size: 1856,
        moe_shared_expert_intermediate_size: 3712,
        moe_router_score_function: RouterScore::Sigmoid,
        moe_router_bias: true,
        num_query_groups: 2,
        mamba: Some(MambaConfig {
            num_heads: 64,
            head_dim: 64,
            state_dim: 128,
            num_groups: 8,
            conv_kernel: 4,
            chunk_size: 128,
        }),
        ..nemotron_h(name, NEMOTRON_3_NANO, 2688, 32, 1856, (64, 128))
    }
}

/// Nemotron 3 Super and Ultra (NVIDIA 2026; Megatron-LM's modelopt conf files
/// examples/post_training/modelopt/conf/nvidia/NVIDIA-Nemotron-3-{Super-120B-A12B,
/// Ultra-550B-A55B}-BF16.sh, which Megatron-Bridge's NemotronH bridge reads from the same
/// config.json fields): Nemotron 3 Nano's layer kinds at hidden `h`, 2 KV groups of 128,
/// Mamba-2 mixers of `mamba_heads` heads of 64 (state 128, 8 groups), and latent MoE layers of
/// 512 squared-ReLU experts, top-22 sigmoid routing with the expert bias; `moe` is (expert
/// FFN, shared expert FFN, `--moe-latent-size`). The MTP block the checkpoints also hold is
/// not part of the preset (`model.mtp_num_layers`, as Megatron's conf files leave it out).
fn nemotron_3_latent(
    name: &str,
    pattern: &str,
    h: u64,
    (heads, mamba_heads): (u32, u32),
    (f, shared, latent): (u64, u64, u64),
) -> ModelConfig {
    ModelConfig {
        num_experts: 512,
        moe_router_topk: 22,
        moe_ffn_hidden_size: f,
        moe_shared_expert_intermediate_size: shared,
        moe_latent_size: Some(latent),
        moe_router_score_function: RouterScore::Sigmoid,
        moe_router_bias: true,
        num_query_groups: 2,
        ..nemotron_h(name, pattern, h, heads, f, (mamba_heads, 128))
    }
}
