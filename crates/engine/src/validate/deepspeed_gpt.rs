//! A Megatron-DeepSpeed GPT run of 2022-23, as vTrain's and BLOOM tr11's tables describe them,
//! as a configuration overlay: a Megatron GPT (`calibrate::published::gpt`: LayerNorm, GeLU,
//! biases, learned positions, tied embeddings, FFN 4h, dropout 0.1) on A100-80GB nodes of 8,
//! fp16 mixed precision with fp32 gradients, full activation checkpointing, no fused attention,
//! no sequence parallelism, 1F1B under parsim's deepspeed framework (DeepSpeed's pipeline
//! engine: blocking sends, gradient reduction after the backward). Both tables name their
//! degrees and batch `gpus`, `tp`, `pp`, `dp`, `mbs`, `gbs` and `seq`.

use super::data::{self, RowError};
use crate::calibrate::published::gpt;
use serde_json::{json, Value};

/// The overlay of row `v`: a GPT named `name` of (hidden, layers, heads) and vocabulary
/// `vocab`, at ZeRO stage `zero`.
pub fn overlay(
    v: &Value,
    name: &str,
    (h, l, a): (u64, u32, u32),
    vocab: u64,
    zero: u64,
) -> Result<Value, RowError> {
    if zero > 3 {
        return Err(RowError::NotModelled(format!(
            "ZeRO stage {zero} is not one of 0-3"
        )));
    }
    let seq = data::required(v, "seq")?;
    let model = gpt(name, (l, h, a, 4 * h), vocab, seq, true);
    Ok(json!({
        "model": serde_json::to_value(model)
            .map_err(|e| RowError::NotModelled(e.to_string()))?,
        "cluster": {"gpu": "a100-80g", "num_gpus": data::degree(v, "gpus")?, "gpus_per_node": 8},
        "parallel": {"tp": data::degree(v, "tp")?, "pp": data::degree(v, "pp")?,
                     "dp": data::degree(v, "dp")?, "cp": 1, "vpp": 1, "sp": false,
                     "zero": zero, "schedule": "1f1b"},
        "training": {"framework": "deepspeed", "precision": "fp16", "grad_dtype": "fp32",
                     "recompute": "full", "flash_attention": false, "flops_attention": "full",
                     "seq_length": seq, "micro_batch_size": data::required(v, "mbs")?,
                     "global_batch_size": data::required(v, "gbs")?},
    }))
}
