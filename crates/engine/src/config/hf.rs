//! Import of a Hugging Face `config.json` (Llama, Mistral, Mixtral, Qwen2, DeepSeek-V3, GPT-2).

use super::enums::{Activation, Normalization, PositionEmbedding, RouterScore};
use super::error::ConfigError;
use super::model::{MlaConfig, ModelConfig};
use serde_json::Value;
use std::path::Path;

/// Architectures the importer understands (the `architectures[0]` of config.json).
pub const SUPPORTED: &[&str] = &[
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "MixtralForCausalLM",
    "Qwen2ForCausalLM",
    "DeepseekV3ForCausalLM",
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
                "deepseek_v3" => "DeepseekV3ForCausalLM".to_string(),
                "gpt2" => "GPT2LMHeadModel".to_string(),
                other => other.to_string(),
            })
        })
        .ok_or_else(|| f.err("neither `architectures` nor `model_type` is present".into()))?;
    match arch.as_str() {
        "LlamaForCausalLM" | "MistralForCausalLM" | "MixtralForCausalLM" | "Qwen2ForCausalLM" => {
            llama_like(&f, &arch)
        }
        "DeepseekV3ForCausalLM" => deepseek_v3(&f),
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
