//! torch FSDP2's resident shard (src/memory/fsdp2.rs): the fp32 sharded parameter is the
//! master copy, so a rank holds 4 bytes of shard and AdamW's moments where the generic ZeRO-3
//! model holds a 2-byte shard, a 4-byte master and the moments; the gathered units, gradients
//! and activations are the same.

use super::common::est;
use serde_json::{json, Value};

/// A 2-layer dense model (hidden 64, 8 heads of 8 in 4 groups, SwiGLU 128, vocabulary 128,
/// untied, no biases) on 8 H100s under FSDP (ZeRO-3, dp 8), with `parallel` and `training`
/// laid over it.
fn tiny(parallel: Value, training: Value) -> Value {
    let mut c = json!({
        "model": {"num_layers": 2, "hidden_size": 64, "num_attention_heads": 8,
                  "num_query_groups": 4, "ffn_hidden_size": 128, "vocab_size": 128,
                  "make_vocab_size_divisible_by": 1},
        "cluster": {"gpu": "h100-sxm", "num_gpus": 8},
        "parallel": {"tp": 1, "sp": false, "pp": 1, "zero": 3},
        "training": {"framework": "fsdp", "seq_length": 32, "micro_batch_size": 1,
                     "global_batch_size": 8}
    });
    for (section, over) in [("parallel", parallel), ("training", training)] {
        for (k, v) in over.as_object().unwrap() {
            c[section][k] = v.clone();
        }
    }
    c
}

/// The model's parameters by hand (per layer QKV 8192, projection 4096, fc1 16384, fc2 8192,
/// two norms of 64; embedding and output 128 x 64 each, the final norm 64), and a rank's
/// eighth of them, rounded up as ZeRO shards.
const PARAMS: u64 = 2 * (36864 + 128) + 2 * 8192 + 64;

#[test]
fn the_fsdp2_shard_is_the_fp32_master() {
    let shard = PARAMS.div_ceil(8);
    let torch = est(tiny(json!({"fsdp": "torch"}), json!({})));
    assert_eq!(torch.params.total, PARAMS);
    let t = &torch.memory.stages[0];
    // FSDP2: the fp32 shard (4 bytes) and AdamW's two fp32 moments (8), no master apart.
    assert_eq!(t.weights, 4 * shard);
    assert_eq!(t.optimizer, 8 * shard);
    // The generic ZeRO-3 model: a bf16 shard (2), and a 4-byte master beside the moments.
    let generic = est(tiny(json!({}), json!({})));
    let g = &generic.memory.stages[0];
    assert_eq!(g.weights, 2 * shard);
    assert_eq!(g.optimizer, 12 * shard);
    assert_eq!(t.gradients, g.gradients);
    // Pure bf16 (no master): the shard is bf16 and the optimizer the bf16 moments, as before.
    let pure = json!({"master_weights": false, "grad_dtype": "bf16"});
    let p = est(tiny(json!({"fsdp": "torch"}), pure));
    assert_eq!(p.memory.stages[0].weights, 2 * shard);
    assert_eq!(p.memory.stages[0].optimizer, 4 * shard);
}

/// torch FSDP2 offloads through its own CPUOffloadPolicy (parameters and gradients as well),
/// which is not the optimizer offload parsim models: refused by field.
#[test]
fn optimizer_offload_under_fsdp2_is_refused() {
    use parsim::config::{Config, Layer, Resolved};
    let doc = tiny(
        json!({"fsdp": "torch"}),
        json!({"optimizer_offload_fraction": 1.0}),
    );
    let e = Config::from_layers(&[Layer::overrides(doc)])
        .and_then(Resolved::new)
        .expect_err("refused")
        .to_string();
    assert!(
        e.contains("training.optimizer_offload_fraction") && e.contains("CPUOffloadPolicy"),
        "{e}"
    );
}
