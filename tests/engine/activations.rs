//! Activation memory of a GPT-3-style layer against Korthikanti et al. 2022 ("Reducing
//! Activation Recomputation in Large Transformer Models"), Sec. 4: LayerNorm, GeLU, dropout,
//! no fused attention, 2-byte activations, 1-byte masks. Per layer, in bytes:
//!   no parallelism           sbh(34 + 5as/h)
//!   TP                       sbh(10 + 24/t + 5as/(ht))
//!   TP + SP                  (sbh/t)(34 + 5as/h)
//!   TP + SP + selective      34sbh/t

use super::common::resolve;
use parsim::config::Recompute;
use parsim::model::Ledger;
use proptest::prelude::*;
use serde_json::json;

/// Saved bytes of one GPT-3-style layer for one microbatch.
fn layer_bytes(s: u64, b: u64, h: u64, a: u64, t: u64, sp: bool, recompute: Recompute) -> u64 {
    let r = resolve(json!({
        "model": {
            "name": "gpt3-style", "num_layers": 4, "hidden_size": h, "num_attention_heads": a,
            "num_query_groups": a, "ffn_hidden_size": 4 * h, "vocab_size": 1024,
            "max_position_embeddings": s, "position_embedding": "learned", "activation": "gelu",
            "normalization": "layernorm", "add_bias_linear": true, "hidden_dropout": 0.1,
            "attention_dropout": 0.1
        },
        "cluster": {"num_gpus": t, "gpus_per_node": 8},
        "parallel": {"tp": t, "sp": sp},
        "training": {"seq_length": s, "micro_batch_size": b, "global_batch_size": b,
                     "flash_attention": false, "recompute": recompute.as_str(), "precision": "bf16"}
    }));
    Ledger::build(&r).dense.saved_bytes(recompute)
}

fn shapes() -> impl Strategy<Value = (u64, u64, u64, u64, u64)> {
    // s, b, heads, head dim, t (t divides the heads and s).
    (
        1u64..=8,
        1u64..=4,
        prop::sample::select(vec![8u64, 16, 32, 96]),
        prop::sample::select(vec![32u64, 64, 128]),
        0u32..=3,
    )
        .prop_map(|(s, b, a, d, tl)| (s * 256, b, a, d, 1u64 << tl))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn no_parallelism((s, b, a, d, _t) in shapes()) {
        let h = a * d;
        prop_assert_eq!(layer_bytes(s, b, h, a, 1, false, Recompute::None), s * b * h * 34 + 5 * a * s * s * b);
    }

    #[test]
    fn tensor_parallel((s, b, a, d, t) in shapes()) {
        let h = a * d;
        // sbh(10 + 24/t + 5as/(ht)) = 10sbh + 24sbh/t + 5as^2b/t
        let expect = 10 * s * b * h + 24 * s * b * h / t + 5 * a * s * s * b / t;
        prop_assert_eq!(layer_bytes(s, b, h, a, t, false, Recompute::None), expect);
    }

    #[test]
    fn tensor_and_sequence_parallel((s, b, a, d, t) in shapes()) {
        prop_assume!(t > 1);
        let h = a * d;
        let expect = (34 * s * b * h + 5 * a * s * s * b) / t;
        prop_assert_eq!(layer_bytes(s, b, h, a, t, true, Recompute::None), expect);
    }

    #[test]
    fn tensor_sequence_parallel_and_selective_recompute((s, b, a, d, t) in shapes()) {
        prop_assume!(t > 1);
        let h = a * d;
        prop_assert_eq!(layer_bytes(s, b, h, a, t, true, Recompute::Selective), 34 * s * b * h / t);
    }

    #[test]
    fn full_recompute_keeps_only_the_layer_input((s, b, a, d, t) in shapes()) {
        // Korthikanti et al. 2022, Sec. 4.2: full recomputation stores 2sbh per layer (/t with SP).
        prop_assume!(t > 1);
        let h = a * d;
        prop_assert_eq!(layer_bytes(s, b, h, a, t, true, Recompute::Full), 2 * s * b * h / t);
    }
}

#[test]
fn flash_attention_keeps_no_quadratic_term() {
    // With a fused kernel only Q, K, V (the output is the projection's input) and the fp32
    // log-sum-exp of each row are kept: doubling s exactly doubles the layer's bytes.
    let bytes = |s: u64| {
        let r = resolve(
            json!({"cluster": {"num_gpus": 1}, "parallel": {"tp": 1, "sp": false},
            "training": {"seq_length": s, "global_batch_size": 1, "recompute": "none"}}),
        );
        Ledger::build(&r).dense.saved_bytes(Recompute::None)
    };
    assert_eq!(bytes(8192), 2 * bytes(4096));
}
