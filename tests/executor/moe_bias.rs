//! Linear biases with mixture-of-experts layers and with MLA (Megatron's `--add-bias-linear`):
//! each routed expert's fc1 and fc2 biases (in the experts block, split over expert TP as the
//! weights), the shared experts' (as the dense MLP's), none on the router (Megatron-Core's
//! router is a weight only), and under MLA the output projection's only (Megatron-Core builds
//! MLA's down and up projections with `bias=False`, so `add_qkv_bias` changes nothing). Every
//! mix gives the single-rank run's loss after one step and parameters after three (fp32, 1e-5
//! relative); every rank's weights are the engine's count and its peak within 2%.

use super::common::*;
use super::memory::{compare_config, weight_bytes};
use super::mla::deepseek_mla;
use super::moe::{compare, moe_config, Moe, BASE};
use serde_json::Value;

/// `v` with linear (and QKV) biases.
fn with_biases(mut v: Value) -> Value {
    v["model"]["add_bias_linear"] = true.into();
    v["model"]["add_qkv_bias"] = true.into();
    v
}

fn ds() -> Moe {
    Moe {
        first_dense: 1,
        deepseek: true,
        ..BASE
    }
}

/// The plain router with EP 2 and ZeRO-1; DeepSeek-style routing with a shared expert under
/// TP 2 + SP (expert-TP 2: fc1's bias split, fc2's whole), EP 4 with ZeRO-3, PP 2 with ZB-V
/// (the experts' bias gradients held for the W action).
fn moe_mixes() -> Vec<Moe> {
    vec![
        Moe {
            ep: 2,
            dp: 2,
            zero: 1,
            ..BASE
        },
        Moe {
            tp: 2,
            sp: true,
            ..ds()
        },
        Moe {
            ep: 4,
            dp: 4,
            zero: 3,
            ..ds()
        },
        Moe {
            pp: 2,
            vpp: 2,
            schedule: "zb-v",
            ep: 2,
            dp: 2,
            ..ds()
        },
    ]
}

#[test]
fn moe_with_linear_biases_matches_the_single_rank_run() {
    for c in moe_mixes() {
        let reference = run(&plan(with_biases(moe_config(&c.single()))), 3);
        let got = run(&plan(with_biases(moe_config(&c))), 3);
        compare(&format!("biases {c:?}"), &got, &reference);
    }
}

#[test]
fn mla_with_linear_biases_matches_the_single_rank_run() {
    let mixes = [
        Moe {
            tp: 2,
            sp: true,
            ..ds()
        },
        Moe {
            cp: 2,
            ep: 2,
            dp: 2,
            zero: 1,
            ..ds()
        },
    ];
    for c in mixes {
        let reference = run(&plan(with_biases(deepseek_mla(&c.single()))), 3);
        let got = run(&plan(with_biases(deepseek_mla(&c))), 3);
        compare(&format!("MLA biases {c:?}"), &got, &reference);
    }
}

/// The biases are there and train: every expert has its two, the shared expert its two, the
/// router none, MLA's projections none but the output projection's; they move in three steps
/// and change the first loss (they start nonzero).
#[test]
fn the_biases_megatron_builds_are_the_ones_trained() {
    let c = ds().single();
    let v = deepseek_mla(&c);
    let without = run(&plan(v.clone()), 1);
    let with = run(&plan(with_biases(v.clone())), 3);
    assert_ne!(with.loss[0], without.loss[0]);
    let p = with.params.as_ref().expect("params");
    let first = run(&plan(with_biases(v)), 1);
    let p0 = first.params.as_ref().expect("params");
    for e in 0..8 {
        for b in ["fc1_bias", "fc2_bias"] {
            let name = format!("layers.1.experts.{e}.{b}");
            let x = p.get(&name).unwrap_or_else(|| panic!("{name} missing"));
            let want = if b == "fc1_bias" { 2 * 64 } else { 64 };
            assert_eq!(x.len(), want, "{name}");
            assert!(rel_diff(x, &p0[&name]) > 0.0, "{name} did not train");
        }
    }
    for name in [
        "layers.1.shared_experts.fc1_bias",
        "layers.1.shared_experts.fc2_bias",
        "layers.1.bo",
        "layers.0.b_down",
    ] {
        assert!(p.contains_key(name), "{name} missing");
    }
    let unexpected: Vec<&String> = p
        .keys()
        .filter(|k| k.ends_with(".bq") || k.contains("router_bias") || k.contains("router.b"))
        .collect();
    assert!(unexpected.is_empty(), "{unexpected:?}");
}

/// Weights the engine's per-rank count (the experts' biases sharded as the executor holds
/// them), peaks within 2%; under Megatron's forced load balancing, the engine's balanced
/// router (the learned one's imbalance at initialisation is a known gap of its own, see
/// `moe_memory.rs`), and without EP 4 ZeRO-3 (likewise).
#[test]
fn moe_bias_memory_is_within_2_percent_of_the_prediction() {
    let balanced = |c: Moe| Moe {
        force_balance: true,
        ..c
    };
    let mut configs: Vec<(String, Value)> = moe_mixes()
        .into_iter()
        .filter(|c| c.zero != 3)
        .map(|c| (format!("{c:?}"), with_biases(moe_config(&balanced(c)))))
        .collect();
    let mla = balanced(Moe {
        tp: 2,
        sp: true,
        ..ds()
    });
    configs.push((format!("MLA {mla:?}"), with_biases(deepseek_mla(&mla))));
    for (label, v) in configs {
        for (rank, got, want, gb, wb) in compare_config(v) {
            let rel = (got as f64 - want as f64) / want as f64;
            eprintln!("biases {label} rank {rank}: {:+.2}%", 100.0 * rel);
            // Within the DeepSeek router's expert bias (8 fp32 per MoE layer, 3 layers), which
            // the engine counts and the executor keeps outside its tracker; an expert's biases
            // are (2 x 64 + 64) x 4 bytes.
            let dw = weight_bytes(&gb) - weight_bytes(&wb);
            assert!(
                dw.abs() <= 4 * 8 * 3,
                "{label} rank {rank}: weights {gb} vs {wb}"
            );
            assert!(
                rel.abs() <= 0.02,
                "{label} rank {rank}: {:.2}%\n  measured {gb}\n  predicted {wb}",
                100.0 * rel
            );
        }
    }
}
