//! Model and hardware FLOPs against the published formulas.

use super::common::est;
use serde_json::json;

/// l, h, a, V, s, B.
type Shape = (u64, u64, u64, u64, u64, u64);

/// A GPT-style MHA model with f = 4h and a B x s batch on one GPU.
fn gpt(
    (l, h, a, v, s, batch): Shape,
    counting: &str,
    recompute: &str,
) -> parsim::estimate::Estimate {
    est(json!({
        "model": {"name": "gpt", "num_layers": l, "hidden_size": h, "num_attention_heads": a,
                  "num_query_groups": a, "ffn_hidden_size": 4 * h, "vocab_size": v,
                  "max_position_embeddings": s, "position_embedding": "learned",
                  "activation": "gelu", "normalization": "layernorm", "add_bias_linear": true,
                  "tied_embeddings": true},
        "cluster": {"num_gpus": 1},
        "parallel": {"tp": 1, "sp": false},
        "training": {"seq_length": s, "micro_batch_size": 1, "global_batch_size": batch,
                     "flops_attention": counting, "recompute": recompute}
    }))
}

fn close(a: f64, b: f64) -> bool {
    ((a - b) / b).abs() < 1e-12
}

const SHAPES: [Shape; 4] = [
    // l, h, a, V, s, B
    (96, 12288, 96, 51200, 2048, 8),
    (24, 2048, 16, 50304, 4096, 4),
    (40, 5120, 40, 32000, 8192, 2),
    (2, 256, 4, 1000, 512, 3),
];

#[test]
fn model_flops_causal_equal_megatron_formula() {
    // Megatron-LM (training.py num_floating_point_operations) with causal attention:
    // 72 B s l h^2 (1 + s/(12h) + V/(12 l h)).
    for (l, h, a, v, s, b) in SHAPES {
        let e = gpt((l, h, a, v, s, b), "causal", "none");
        let (lf, hf, vf, sf, bf) = (l as f64, h as f64, v as f64, s as f64, b as f64);
        let expect =
            72.0 * bf * sf * lf * hf * hf * (1.0 + sf / (12.0 * hf) + vf / (12.0 * lf * hf));
        assert!(
            close(e.flops.per_step_model, expect),
            "{} vs {expect}",
            e.flops.per_step_model
        );
    }
}

#[test]
fn model_flops_full_equal_narayanan_2021() {
    // Narayanan et al. 2021, Sec. 5.1: 72 B s l h^2 (1 + s/(6h) + V/(12 l h)).
    for (l, h, a, v, s, b) in SHAPES {
        let e = gpt((l, h, a, v, s, b), "full", "none");
        let (lf, hf, vf, sf, bf) = (l as f64, h as f64, v as f64, s as f64, b as f64);
        let expect =
            72.0 * bf * sf * lf * hf * hf * (1.0 + sf / (6.0 * hf) + vf / (12.0 * lf * hf));
        assert!(close(e.flops.per_step_model, expect));
        assert!(close(e.flops.per_token_model, expect / (bf * sf)));
    }
}

#[test]
fn hardware_flops_with_full_recompute_equal_narayanan_2021() {
    // Narayanan et al. 2021, Sec. 5.1, with activation recomputation (one extra forward of
    // every layer, not of the output layer): 96 B s l h^2 (1 + s/(6h) + V/(16 l h)).
    for (l, h, a, v, s, b) in SHAPES {
        let e = gpt((l, h, a, v, s, b), "full", "full");
        let (lf, hf, vf, sf, bf) = (l as f64, h as f64, v as f64, s as f64, b as f64);
        let expect =
            96.0 * bf * sf * lf * hf * hf * (1.0 + sf / (6.0 * hf) + vf / (16.0 * lf * hf));
        assert!(close(e.flops.per_step_hardware, expect));
    }
}

/// Model FLOPs per token of one decoder layer: a 1-layer minus a 0-vocab-effect comparison.
fn per_token_layer(model: serde_json::Value) -> f64 {
    let run = |layers: u64| {
        let mut m = model.clone();
        m["num_layers"] = layers.into();
        est(
            json!({"model": m, "cluster": {"num_gpus": 1}, "parallel": {"tp": 1, "sp": false},
                   "training": {"seq_length": 1024, "global_batch_size": 1}}),
        )
        .flops
        .per_token_model
    };
    run(2) - run(1)
}

#[test]
fn gqa_scales_kv_projections_and_swiglu_costs_18hf() {
    // Per token per layer, forward + backward = 3 x forward:
    //   QKV 3 x 2h(a + 2g)d, output projection 3 x 2h^2, causal attention core 3 x 2sh,
    //   SwiGLU MLP 3 x 3 x 2hf = 18hf, GeLU MLP 3 x 2 x 2hf = 12hf.
    let (h, a, g, f, s) = (4096f64, 32f64, 8f64, 14336f64, 1024f64);
    let d = h / a;
    let base = json!({"name": "x", "hidden_size": 4096, "num_attention_heads": 32, "num_query_groups": 8,
                      "ffn_hidden_size": 14336, "vocab_size": 32000});
    let attn = 3.0 * (2.0 * h * (a + 2.0 * g) * d + 2.0 * h * h + 2.0 * s * h);
    let swiglu = per_token_layer(base.clone());
    assert!(close(swiglu, attn + 18.0 * h * f), "{swiglu}");
    let mut gelu = base.clone();
    gelu["activation"] = "gelu".into();
    assert!(close(per_token_layer(gelu), attn + 12.0 * h * f));
    let mut mha = base;
    mha["num_query_groups"] = 32.into();
    let attn_mha = 3.0 * (2.0 * h * 3.0 * h + 2.0 * h * h + 2.0 * s * h);
    assert!(close(per_token_layer(mha), attn_mha + 18.0 * h * f));
}
