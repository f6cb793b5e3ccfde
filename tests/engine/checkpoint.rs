//! The run's checkpoint size (`run.checkpoint_bytes`) against hand counts: every parameter
//! once in bf16 (2 bytes) plus its fp32 master copy (4) and Adam's two fp32 moments (8), 14
//! bytes a parameter (Micikevicius et al. 2018; Kingma & Ba 2015), whatever the parallel mix.
//! Expert parallelism shards the experts; it does not drop any, so the size cannot shrink as
//! EP grows (it did: 6.54e11 bytes at EP 1, 5.75e11 at EP 8 for Mixtral-8x7B).

use super::common::resolve;
use parsim::estimate::estimate;
use parsim::planning::run_forecast;
use serde_json::json;

const BYTES_PER_PARAM: u64 = 2 + 4 + 8;

fn checkpoint(overlay: serde_json::Value) -> f64 {
    let r = resolve(overlay);
    let e = estimate(&r).expect("estimate");
    run_forecast(&r, &e)
        .expect("run")
        .expect("train_tokens set")
        .checkpoint_bytes
}

/// Mixtral-8x7B (Jiang et al. 2024, Table 1: dim 4096, 32 layers, 32 heads of 128, 8 KV
/// heads, FFN 14336, 8 experts, vocabulary 32000), counted by hand: per layer the attention
/// 4096 x (4096 + 2 x 1024 + 4096), eight SwiGLU experts 3 x 4096 x 14336 each, the router
/// 4096 x 8 and two RMSNorms; untied input and output embeddings 32000 x 4096 each; the final
/// norm: 46,702,792,704 parameters (the model card's 46.7B).
#[test]
fn mixtral_checkpoint_is_fourteen_bytes_a_parameter_at_any_ep() {
    let per_layer: u64 =
        4096 * (4096 + 2 * 1024 + 4096) + 8 * 3 * 4096 * 14336 + 4096 * 8 + 2 * 4096;
    let params = 32 * per_layer + 2 * 32000 * 4096 + 4096;
    assert_eq!(params, 46_702_792_704);
    let hand = (params * BYTES_PER_PARAM) as f64;
    for ep in [1, 8] {
        let got = checkpoint(json!({
            "model": {"preset": "mixtral-8x7b"},
            "cluster": {"num_gpus": 64},
            "parallel": {"tp": 1, "sp": false, "pp": 4, "ep": ep},
            "training": {"recompute": "full", "seq_length": 4096, "global_batch_size": 256},
            "run": {"train_tokens": 1_000_000_000u64}
        }));
        assert_eq!(got, hand, "EP {ep}");
    }
}

/// DeepSeek-V3: 671B parameters (DeepSeek-AI 2024, the technical report's abstract) x 14 bytes
/// = 9.39e12 bytes = 8.54 TiB (it showed 7.50 TiB).
#[test]
fn deepseek_v3_checkpoint_is_8_54_tib() {
    let got = checkpoint(json!({
        "model": {"preset": "deepseek-v3"},
        "cluster": {"num_gpus": 1024, "gpu": "h200"},
        "parallel": {"tp": 1, "sp": false, "pp": 1, "ep": 64, "zero": 3},
        "training": {"seq_length": 4096, "global_batch_size": 1024},
        "run": {"train_tokens": 1_000_000_000_000u64}
    }));
    let tib = got / (1u64 << 40) as f64;
    let hand = 671e9 * BYTES_PER_PARAM as f64 / (1u64 << 40) as f64;
    assert!(
        (tib - hand).abs() < 0.005 * hand,
        "{tib:.3} TiB vs {hand:.3}"
    );
    assert_eq!(format!("{tib:.2}"), "8.54");
}
