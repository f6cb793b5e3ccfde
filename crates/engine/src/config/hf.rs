//! Import of a Hugging Face `config.json` (Llama, Mistral, Mixtral, Qwen2, Qwen3 dense and MoE,
//! DeepSeek-V3 and its variants such as Kimi K2, GPT-OSS, Llama 4, Nemotron-H and Nemotron 3,
//! GPT-2).

use super::enums::{Activation, Normalization, PositionEmbedding, RouterScore};
use super::error::ConfigError;
use super::model::{MambaConfig, MlaConfig, ModelConfig};
use serde_json::Value;
use std::path::Path;

/// Architectures the importer understands (the `architectures[0]` of config.json).
pub const SUPPORTED: &[&str] = &[
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "MixtralForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
    "Qwen3MoeForCausalLM",
    "DeepseekV3ForCausalLM",
    "GptOssForCausalLM",
    "Llama4ForConditionalGeneration",
    "Llama4ForCausalLM",
    "NemotronHForCausalLM",
    "GPT2LMHeadModel",
];

/// Reads and converts a config.json file.
pub fn import_file(path: &Path) -> Result<ModelConfig, ConfigError> {
    let value = super::load::parse_document_file(path)?;
    import(&value, &path.display().to_string())
}

/// Typed access to the fields of one config.json, with errors naming the file and key.
struct Fields<'a> {
    v: &'a Value,
    origin: &'a str,
}

impl Fields<'_> {
    fn err(&self, message: String) -> ConfigError {
        ConfigError::Import {
            origin: self.origin.to_string(),
            message,
        }
    }

    fn opt_u64(&self, key: &str) -> Result<Option<u64>, ConfigError> {
        match self.v.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(x) => x.as_u64().map(Some).ok_or_else(|| {
                self.err(format!("`{key}` must be a non-negative integer, got {x}"))
            }),
        }
    }

    fn u64(&self, key: &str) -> Result<u64, ConfigError> {
        self.opt_u64(key)?
            .ok_or_else(|| self.err(format!("missing required key `{key}`")))
    }

    fn u32(&self, key: &str) -> Result<u32, ConfigError> {
        let x = self.u64(key)?;
        u32::try_from(x).map_err(|_| self.err(format!("`{key}` = {x} is too large")))
    }

    fn opt_u32(&self, key: &str) -> Result<Option<u32>, ConfigError> {
        match self.opt_u64(key)? {
            None => Ok(None),
            Some(x) => u32::try_from(x)
                .map(Some)
                .map_err(|_| self.err(format!("`{key}` = {x} is too large"))),
        }
    }

    /// A boolean, `default` when absent or null; any other type is an error (a string
    /// `"yes"` was read as false).
    fn bool_or(&self, key: &str, default: bool) -> Result<bool, ConfigError> {
        match self.v.get(key) {
            None | Some(Value::Null) => Ok(default),
            Some(x) => x
                .as_bool()
                .ok_or_else(|| self.err(format!("`{key}` must be true or false, got {x}"))),
        }
    }

    /// A number, `default` when absent or null; any other type is an error (a string
    /// `"0.5"` was read as the default).
    fn f64_or(&self, key: &str, default: f64) -> Result<f64, ConfigError> {
        match self.v.get(key) {
            None | Some(Value::Null) => Ok(default),
            Some(x) => x
                .as_f64()
                .ok_or_else(|| self.err(format!("`{key}` must be a number, got {x}"))),
        }
    }

    /// A positive integer (a count that cannot be zero).
    fn positive_u32(&self, key: &str) -> Result<u32, ConfigError> {
        let x = self.u32(key)?;
        if x == 0 {
            return Err(self.err(format!("`{key}` must be at least 1, got 0")));
        }
        Ok(x)
    }

    fn str(&self, key: &str) -> Option<&str> {
        self.v.get(key).and_then(Value::as_str)
    }
}

/// Converts a parsed config.json.
pub fn import(v: &Value, origin: &str) -> Result<ModelConfig, ConfigError> {
    let f = Fields { v, origin };
    let arch = v
        .get("architectures")
        .and_then(|a| a.get(0))
        .and_then(Value::as_str)
        .map(str::to_string)
        .or_else(|| {
            f.str("model_type").map(|t| match t {
                "llama" => "LlamaForCausalLM".to_string(),
                "mistral" => "MistralForCausalLM".to_string(),
                "mixtral" => "MixtralForCausalLM".to_string(),
                "qwen2" => "Qwen2ForCausalLM".to_string(),
                "qwen3" => "Qwen3ForCausalLM".to_string(),
                "qwen3_moe" => "Qwen3MoeForCausalLM".to_string(),
                "deepseek_v3" | "kimi_k2" => "DeepseekV3ForCausalLM".to_string(),
                "gpt_oss" => "GptOssForCausalLM".to_string(),
                "llama4" => "Llama4ForConditionalGeneration".to_string(),
                "llama4_text" => "Llama4ForCausalLM".to_string(),
                "nemotron_h" => "NemotronHForCausalLM".to_string(),
                "gpt2" => "GPT2LMHeadModel".to_string(),
                other => other.to_string(),
            })
        })
        .ok_or_else(|| f.err("neither `architectures` nor `model_type` is present".into()))?;
    match arch.as_str() {
        "LlamaForCausalLM" | "MistralForCausalLM" | "MixtralForCausalLM" | "Qwen2ForCausalLM" => {
            llama_like(&f, &arch)
        }
        "Qwen3ForCausalLM" | "Qwen3MoeForCausalLM" => qwen3(&f, &arch),
        "DeepseekV3ForCausalLM" => deepseek_v3(&f),
        "GptOssForCausalLM" => gpt_oss(&f),
        "Llama4ForConditionalGeneration" | "Llama4ForCausalLM" => {
            // The multimodal checkpoint keeps the language model under `text_config`; its
            // vision encoder is not modelled.
            let text = v.get("text_config").unwrap_or(v);
            llama4(&Fields { v: text, origin })
        }
        "NemotronHForCausalLM" => nemotron_h(&f),
        "GPT2LMHeadModel" | "GPT2Model" => gpt2(&f),
        other => Err(f.err(format!(
            "unsupported architecture `{other}` (supported: {})",
            SUPPORTED.join(", ")
        ))),
    }
}

fn activation(f: &Fields, key: &str) -> Result<Activation, ConfigError> {
    match f.str(key).unwrap_or("silu") {
        "silu" | "swiglu" => Ok(Activation::Swiglu),
        "gelu" | "gelu_new" | "gelu_pytorch_tanh" | "gelu_fast" => Ok(Activation::Gelu),
        other => Err(f.err(format!("`{key}` = {other} is not supported (silu or gelu)"))),
    }
}

fn llama_like(f: &Fields, arch: &str) -> Result<ModelConfig, ConfigError> {
    let heads = f.u32("num_attention_heads")?;
    let hidden = f.u64("hidden_size")?;
    let mut m = ModelConfig {
        name: arch.to_string(),
        num_layers: f.u32("num_hidden_layers")?,
        hidden_size: hidden,
        num_attention_heads: heads,
        num_query_groups: f.opt_u32("num_key_value_heads")?.unwrap_or(heads),
        kv_channels: f.opt_u64("head_dim")?,
        ffn_hidden_size: f.u64("intermediate_size")?,
        vocab_size: f.u64("vocab_size")?,
        max_position_embeddings: f.opt_u64("max_position_embeddings")?.unwrap_or(4096),
        position_embedding: PositionEmbedding::Rope,
        activation: activation(f, "hidden_act")?,
        normalization: Normalization::Rmsnorm,
        tied_embeddings: f.bool_or("tie_word_embeddings", false)?,
        attention_dropout: f.f64_or("attention_dropout", 0.0)?,
        add_qkv_bias: arch == "Qwen2ForCausalLM" || f.bool_or("attention_bias", false)?,
        ..ModelConfig::default()
    };
    if arch == "MixtralForCausalLM" {
        // Zero experts would silently turn Mixtral dense.
        m.num_experts = f.positive_u32("num_local_experts")?;
        m.moe_router_topk = f.positive_u32("num_experts_per_tok")?;
        m.moe_ffn_hidden_size = m.ffn_hidden_size;
    }
    Ok(m)
}

fn deepseek_v3(f: &Fields) -> Result<ModelConfig, ConfigError> {
    let heads = f.u32("num_attention_heads")?;
    let moe_ffn = f.u64("moe_intermediate_size")?;
    let shared = f.opt_u64("n_shared_experts")?.unwrap_or(0);
    let shared_ffn = shared.checked_mul(moe_ffn).ok_or_else(|| {
        f.err(format!(
            "`n_shared_experts` x `moe_intermediate_size` = {shared} x {moe_ffn} overflows"
        ))
    })?;
    Ok(ModelConfig {
        name: "DeepseekV3ForCausalLM".into(),
        num_layers: f.u32("num_hidden_layers")?,
        hidden_size: f.u64("hidden_size")?,
        num_attention_heads: heads,
        num_query_groups: f.opt_u32("num_key_value_heads")?.unwrap_or(heads),
        kv_channels: Some(f.u64("v_head_dim")?),
        ffn_hidden_size: f.u64("intermediate_size")?,
        vocab_size: f.u64("vocab_size")?,
        max_position_embeddings: f.opt_u64("max_position_embeddings")?.unwrap_or(4096),
        position_embedding: PositionEmbedding::Rope,
        activation: activation(f, "hidden_act")?,
        normalization: Normalization::Rmsnorm,
        tied_embeddings: f.bool_or("tie_word_embeddings", false)?,
        attention_dropout: f.f64_or("attention_dropout", 0.0)?,
        mla: Some(MlaConfig {
            q_lora_rank: f.opt_u64("q_lora_rank")?.unwrap_or(0),
            kv_lora_rank: f.u64("kv_lora_rank")?,
            qk_nope_head_dim: f.u64("qk_nope_head_dim")?,
            qk_rope_head_dim: f.u64("qk_rope_head_dim")?,
            v_head_dim: f.u64("v_head_dim")?,
        }),
        num_experts: f.u32("n_routed_experts")?,
        moe_router_topk: f.u32("num_experts_per_tok")?,
        moe_ffn_hidden_size: moe_ffn,
        moe_shared_expert_intermediate_size: shared_ffn,
        moe_first_k_dense: f.opt_u32("first_k_dense_replace")?.unwrap_or(0),
        // DeepSeek-V3's `noaux_tc` routing carries e_score_correction_bias.
        moe_router_bias: f.str("topk_method") == Some("noaux_tc"),
        moe_router_score_function: match f.str("scoring_func") {
            Some("sigmoid") => RouterScore::Sigmoid,
            _ => RouterScore::Softmax,
        },
        moe_router_renormalize: f.bool_or("norm_topk_prob", false)?,
        moe_router_num_groups: f.opt_u32("n_group")?.unwrap_or(0),
        moe_router_group_topk: f.opt_u32("topk_group")?.unwrap_or(0),
        // num_nextn_predict_layers is recorded by the checkpoint but MTP is an opt-in here.
        mtp_num_layers: 0,
        ..ModelConfig::default()
    })
}

fn gpt2(f: &Fields) -> Result<ModelConfig, ConfigError> {
    let hidden = f.u64("n_embd")?;
    let heads = f.u32("n_head")?;
    Ok(ModelConfig {
        name: "GPT2LMHeadModel".into(),
        num_layers: f.u32("n_layer")?,
        hidden_size: hidden,
        num_attention_heads: heads,
        num_query_groups: heads,
        kv_channels: None,
        ffn_hidden_size: match f.opt_u64("n_inner")? {
            Some(n) => n,
            None => hidden
                .checked_mul(4)
                .ok_or_else(|| f.err(format!("`n_embd` = {hidden} is too large")))?,
        },
        vocab_size: f.u64("vocab_size")?,
        max_position_embeddings: f.opt_u64("n_positions")?.unwrap_or(1024),
        position_embedding: PositionEmbedding::Learned,
        activation: activation(f, "activation_function")?,
        normalization: Normalization::Layernorm,
        add_bias_linear: true,
        add_qkv_bias: true,
        tied_embeddings: f.bool_or("tie_word_embeddings", true)?,
        hidden_dropout: f.f64_or("resid_pdrop", 0.1)?,
        attention_dropout: f.f64_or("attn_pdrop", 0.1)?,
        ..ModelConfig::default()
    })
}

/// A list of integers (`[]` when absent or null); anything else is an error naming the key.
fn u64_list(f: &Fields, key: &str) -> Result<Vec<u64>, ConfigError> {
    match f.v.get(key) {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(items)) => items
            .iter()
            .map(|x| {
                x.as_u64().ok_or_else(|| {
                    f.err(format!("`{key}` must list non-negative integers, got {x}"))
                })
            })
            .collect(),
        Some(x) => Err(f.err(format!("`{key}` must be a list of integers, got {x}"))),
    }
}

/// The MoE layer pattern of `layers` layers with `moe` saying which are MoE; empty when every
/// layer is (the default needs no pattern).
fn moe_pattern(layers: u32, moe: impl Fn(u32) -> bool) -> Vec<u8> {
    let pattern: Vec<u8> = (0..layers).map(|l| u8::from(moe(l))).collect();
    if pattern.iter().all(|&x| x == 1) {
        Vec::new()
    } else {
        pattern
    }
}

/// Megatron's `--window-attn-skip-freq` of a list saying which layers attend in full: N when
/// exactly the layers l with (l + 1) % N == 0 do, 0 when none does. `key` names the list.
fn skip_freq(f: &Fields, key: &str, full: &[bool]) -> Result<u32, ConfigError> {
    let n = full.len() as u32;
    if !full.iter().any(|&x| x) {
        return Ok(0);
    }
    (1..=n)
        .find(|&k| (0..n).all(|l| full[l as usize] == ((l + 1) % k == 0)))
        .ok_or_else(|| {
            f.err(format!(
                "`{key}`: the full-attention layers are not every N-th layer (the only pattern modelled)"
            ))
        })
}

/// Qwen3, dense (`Qwen3ForCausalLM`) and MoE (`Qwen3MoeForCausalLM`): Llama-like with a head
/// dimension of its own (128 whatever hidden / heads is) and an RMSNorm on each query and key
/// head (Qwen team, "Qwen3 Technical Report", 2025, sec. 2); the MoE has no shared expert and
/// renormalises its top-k gates (`norm_topk_prob`).
fn qwen3(f: &Fields, arch: &str) -> Result<ModelConfig, ConfigError> {
    if f.bool_or("use_sliding_window", false)? {
        return Err(f.err(
            "`use_sliding_window` = true (sliding window from `max_window_layers` on) is not modelled".into(),
        ));
    }
    let mut m = llama_like(f, "Qwen3ForCausalLM")?;
    m.name = arch.to_string();
    m.qk_layernorm = true;
    m.add_qkv_bias = f.bool_or("attention_bias", false)?;
    m.add_bias_linear = m.add_qkv_bias;
    if arch == "Qwen3MoeForCausalLM" {
        m.num_experts = f.positive_u32("num_experts")?;
        m.moe_router_topk = f.positive_u32("num_experts_per_tok")?;
        m.moe_ffn_hidden_size = f.u64("moe_intermediate_size")?;
        m.moe_router_renormalize = f.bool_or("norm_topk_prob", false)?;
        // Hugging Face's Qwen3MoeDecoderLayer: MoE unless listed in `mlp_only_layers`, and
        // only every `decoder_sparse_step`-th layer ((l + 1) % step == 0).
        let step = f.opt_u32("decoder_sparse_step")?.unwrap_or(1);
        if step == 0 {
            return Err(f.err("`decoder_sparse_step` must be at least 1, got 0".into()));
        }
        let dense = u64_list(f, "mlp_only_layers")?;
        m.moe_layer_pattern = moe_pattern(m.num_layers, |l| {
            !dense.contains(&(l as u64)) && (l + 1) % step == 0
        });
    }
    Ok(m)
}

/// GPT-OSS (OpenAI, "gpt-oss-120b & gpt-oss-20b Model Card", 2025, sec. 2.1): every layer MoE
/// (top-4 of 128 or 32 experts, biased, a biased router, gates softmaxed over the chosen
/// four), attention with biases and a learned sink per head, alternating a 128-token sliding
/// window with full attention (`layer_types`), the o200k vocabulary.
fn gpt_oss(f: &Fields) -> Result<ModelConfig, ConfigError> {
    let layers = f.u32("num_hidden_layers")?;
    let heads = f.u32("num_attention_heads")?;
    let ffn = f.u64("intermediate_size")?;
    let topk = match f.opt_u32("num_experts_per_tok")? {
        Some(k) => k,
        None => f.positive_u32("experts_per_token")?,
    };
    if topk == 0 {
        return Err(f.err("`num_experts_per_tok` must be at least 1, got 0".into()));
    }
    let window = f.u64("sliding_window")?;
    if window == 0 {
        return Err(f.err("`sliding_window` must be at least 1, got 0".into()));
    }
    // Hugging Face's default: sliding on even layers, full on odd ones.
    let full: Vec<bool> = match f.v.get("layer_types") {
        None | Some(Value::Null) => (0..layers).map(|l| (l + 1) % 2 == 0).collect(),
        Some(Value::Array(items)) => {
            if items.len() != layers as usize {
                return Err(f.err(format!(
                    "`layer_types` lists {} layers, `num_hidden_layers` is {layers}",
                    items.len()
                )));
            }
            items
                .iter()
                .map(|x| match x.as_str() {
                    Some("full_attention") => Ok(true),
                    Some("sliding_attention") => Ok(false),
                    _ => Err(f.err(format!(
                        "`layer_types`: unknown {x} (full_attention, sliding_attention)"
                    ))),
                })
                .collect::<Result<_, _>>()?
        }
        Some(x) => return Err(f.err(format!("`layer_types` must be a list, got {x}"))),
    };
    let all_full = full.iter().all(|&x| x);
    Ok(ModelConfig {
        name: "GptOssForCausalLM".into(),
        num_layers: layers,
        hidden_size: f.u64("hidden_size")?,
        num_attention_heads: heads,
        num_query_groups: f.opt_u32("num_key_value_heads")?.unwrap_or(heads),
        kv_channels: f.opt_u64("head_dim")?,
        ffn_hidden_size: ffn,
        vocab_size: f.u64("vocab_size")?,
        max_position_embeddings: f.opt_u64("max_position_embeddings")?.unwrap_or(131072),
        position_embedding: PositionEmbedding::Rope,
        activation: Activation::Swiglu,
        normalization: Normalization::Rmsnorm,
        add_bias_linear: f.bool_or("attention_bias", true)?,
        add_qkv_bias: f.bool_or("attention_bias", true)?,
        tied_embeddings: f.bool_or("tie_word_embeddings", false)?,
        attention_dropout: f.f64_or("attention_dropout", 0.0)?,
        num_experts: f.positive_u32("num_local_experts")?,
        moe_router_topk: topk,
        moe_ffn_hidden_size: ffn,
        moe_router_renormalize: true,
        moe_router_linear_bias: true,
        attention_sinks: true,
        activation_clamp: Some(f.f64_or("swiglu_limit", 7.0)?),
        window_size: (!all_full).then_some(window),
        window_attn_skip_freq: if all_full {
            0
        } else {
            skip_freq(f, "layer_types", &full)?
        },
        ..ModelConfig::default()
    })
}

/// Llama 4's language model (Meta, "The Llama 4 herd", 2025, and Hugging Face's
/// `Llama4TextConfig`): MoE on every `interleave_moe_layer_step`-th layer (or those of
/// `moe_layers`) with one shared expert of `intermediate_size` beside the routed ones,
/// dense layers of `intermediate_size_mlp`, sigmoid top-k routing, and attention in chunks of
/// `attention_chunk_size` except on the NoPE layers (`no_rope_layers` 0, every fourth by
/// default), which attend in full. Its QK norm is a parameter-free L2 norm, left out.
fn llama4(f: &Fields) -> Result<ModelConfig, ConfigError> {
    let layers = f.u32("num_hidden_layers")?;
    let heads = f.u32("num_attention_heads")?;
    let expert_ffn = f.u64("intermediate_size")?;
    let step = f.opt_u32("interleave_moe_layer_step")?.unwrap_or(1);
    if step == 0 {
        return Err(f.err("`interleave_moe_layer_step` must be at least 1, got 0".into()));
    }
    let listed = u64_list(f, "moe_layers")?;
    let moe_layer = |l: u32| {
        if f.v.get("moe_layers").is_some_and(|x| !x.is_null()) {
            listed.contains(&(l as u64))
        } else {
            (l + 1) % step == 0
        }
    };
    let no_rope = u64_list(f, "no_rope_layers")?;
    let full: Vec<bool> = if no_rope.is_empty() {
        (0..layers).map(|l| (l + 1) % 4 == 0).collect()
    } else if no_rope.len() != layers as usize {
        return Err(f.err(format!(
            "`no_rope_layers` lists {} layers, `num_hidden_layers` is {layers}",
            no_rope.len()
        )));
    } else {
        no_rope.iter().map(|&x| x == 0).collect()
    };
    let chunk = f.opt_u64("attention_chunk_size")?;
    if chunk == Some(0) {
        return Err(f.err("`attention_chunk_size` must be at least 1, got 0".into()));
    }
    Ok(ModelConfig {
        name: "Llama4ForCausalLM".into(),
        num_layers: layers,
        hidden_size: f.u64("hidden_size")?,
        num_attention_heads: heads,
        num_query_groups: f.opt_u32("num_key_value_heads")?.unwrap_or(heads),
        kv_channels: f.opt_u64("head_dim")?,
        ffn_hidden_size: f.u64("intermediate_size_mlp")?,
        vocab_size: f.u64("vocab_size")?,
        max_position_embeddings: f.opt_u64("max_position_embeddings")?.unwrap_or(4096),
        position_embedding: PositionEmbedding::Rope,
        activation: activation(f, "hidden_act")?,
        normalization: Normalization::Rmsnorm,
        add_qkv_bias: f.bool_or("attention_bias", false)?,
        tied_embeddings: f.bool_or("tie_word_embeddings", false)?,
        attention_dropout: f.f64_or("attention_dropout", 0.0)?,
        num_experts: f.positive_u32("num_local_experts")?,
        moe_router_topk: f.positive_u32("num_experts_per_tok")?,
        moe_ffn_hidden_size: expert_ffn,
        moe_shared_expert_intermediate_size: expert_ffn,
        moe_router_score_function: RouterScore::Sigmoid,
        moe_layer_pattern: moe_pattern(layers, moe_layer),
        attention_chunk_size: chunk,
        window_attn_skip_freq: match chunk {
            Some(_) => skip_freq(f, "no_rope_layers", &full)?,
            None => 0,
        },
        ..ModelConfig::default()
    })
}

/// Nemotron-H and Nemotron 3 (`NemotronHForCausalLM`, NVIDIA's configuration_nemotron_h.py):
/// the layers from `hybrid_override_pattern` (or the `layers_block_type` list), Mamba-2 mixers
/// of `mamba_num_heads` x `mamba_head_dim` with `n_groups` groups of state `ssm_state_size`,
/// squared-ReLU MLPs (`relu2`, not gated), no positional embedding, and for the `E` layers
/// `n_routed_experts` sigmoid-routed experts with the aux-loss-free bias and a shared expert.
/// A latent MoE (`moe_latent_size`, Nemotron 3 Super and Ultra) projects the routed tokens to
/// that width. What parsim does not model is refused by field: biases, a convolution without
/// bias.
fn nemotron_h(f: &Fields) -> Result<ModelConfig, ConfigError> {
    let layers = f.u32("num_hidden_layers")?;
    let pattern: String = match (
        f.str("hybrid_override_pattern"),
        f.v.get("layers_block_type"),
    ) {
        (Some(p), _) => p.to_string(),
        (None, Some(Value::Array(items))) => items
            .iter()
            .map(|x| match x.as_str() {
                Some("mamba") => Ok('M'),
                Some("attention") => Ok('*'),
                Some("mlp") => Ok('-'),
                Some("moe") => Ok('E'),
                _ => Err(f.err(format!(
                    "`layers_block_type`: unknown {x} (mamba, attention, mlp, moe)"
                ))),
            })
            .collect::<Result<_, _>>()?,
        _ => return Err(f.err(
            "`hybrid_override_pattern` (or `layers_block_type`) is missing: it places the layers"
                .into(),
        )),
    };
    if let Some(c) = pattern
        .chars()
        .find(|c| !matches!(c, 'M' | '*' | '-' | 'E'))
    {
        return Err(f.err(format!(
            "`hybrid_override_pattern`: unknown layer '{c}' (M Mamba-2, * attention, - MLP, E MoE)"
        )));
    }
    if pattern.chars().count() != layers as usize {
        return Err(f.err(format!(
            "`hybrid_override_pattern` has {} layers, `num_hidden_layers` is {layers}",
            pattern.chars().count()
        )));
    }
    match f.str("mlp_hidden_act").unwrap_or("relu2") {
        "relu2" => {}
        other => {
            return Err(f.err(format!(
                "`mlp_hidden_act` = {other} is not supported (relu2)"
            )))
        }
    }
    for key in ["use_bias", "mlp_bias", "attention_bias", "mamba_proj_bias"] {
        if f.bool_or(key, false)? {
            return Err(f.err(format!(
                "`{key}` = true: biases in Nemotron-H layers are not modelled"
            )));
        }
    }
    if !f.bool_or("use_conv_bias", true)? {
        return Err(f.err(
            "`use_conv_bias` = false: the Mamba-2 convolution is counted with its bias".into(),
        ));
    }
    let heads = f.u32("num_attention_heads")?;
    let kv_channels = match f.opt_u64("head_dim")? {
        Some(d) => Some(d),
        None => f.opt_u64("attention_head_dim")?,
    };
    let groups = match f.opt_u32("n_groups")? {
        Some(g) => g,
        None => f.positive_u32("mamba_n_groups")?,
    };
    let mamba = MambaConfig {
        num_heads: f.positive_u32("mamba_num_heads")?,
        head_dim: f.u64("mamba_head_dim")?,
        state_dim: f.u64("ssm_state_size")?,
        num_groups: groups,
        conv_kernel: f.opt_u64("conv_kernel")?.unwrap_or(4),
        chunk_size: f.opt_u64("chunk_size")?.unwrap_or(128),
    };
    let mut m = ModelConfig {
        name: "NemotronHForCausalLM".into(),
        num_layers: layers,
        hidden_size: f.u64("hidden_size")?,
        num_attention_heads: heads,
        num_query_groups: f.opt_u32("num_key_value_heads")?.unwrap_or(heads),
        kv_channels,
        ffn_hidden_size: f.u64("intermediate_size")?,
        vocab_size: f.u64("vocab_size")?,
        max_position_embeddings: f.opt_u64("max_position_embeddings")?.unwrap_or(8192),
        position_embedding: PositionEmbedding::None,
        activation: Activation::Gelu,
        normalization: Normalization::Rmsnorm,
        tied_embeddings: f.bool_or("tie_word_embeddings", false)?,
        hybrid_layer_pattern: Some(pattern.clone()),
        mamba: pattern.contains('M').then_some(mamba),
        ..ModelConfig::default()
    };
    if pattern.contains('E') {
        m.num_experts = f.positive_u32("n_routed_experts")?;
        m.moe_router_topk = f.positive_u32("num_experts_per_tok")?;
        m.moe_ffn_hidden_size = f.u64("moe_intermediate_size")?;
        let shared = f.opt_u64("n_shared_experts")?.unwrap_or(1);
        let shared_ffn = f
            .opt_u64("moe_shared_expert_intermediate_size")?
            .unwrap_or(0);
        m.moe_shared_expert_intermediate_size = shared.checked_mul(shared_ffn).ok_or_else(|| {
            f.err(format!(
                "`n_shared_experts` x `moe_shared_expert_intermediate_size` = {shared} x {shared_ffn} overflows"
            ))
        })?;
        m.moe_router_score_function = RouterScore::Sigmoid;
        m.moe_router_bias = true;
        m.moe_router_renormalize = f.bool_or("norm_topk_prob", true)?;
    }
    m.moe_latent_size = f.opt_u64("moe_latent_size")?;
    Ok(m)
}
