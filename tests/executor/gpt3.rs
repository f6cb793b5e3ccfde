//! The acceptance of the GPT-3-style model (LayerNorm, GeLU, learned absolute positions, linear
//! and QKV biases, tied input and output embeddings, hidden and attention dropout 0.1): every parallel mix equals
//! the single-rank run (loss after one step, parameters after three, fp32, 1e-5 relative) and
//! every rank's measured peak memory is within 2% of the engine's prediction.

use super::common::*;
use super::equivalence::{compare, GBS};
use serde_json::Value;

/// The small GPT-3-style model of the acceptance.
fn gpt3(mix: &Mix) -> Value {
    let mut v = config(mix, GBS, true, "layernorm", "gelu");
    let m = &mut v["model"];
    m["hidden_dropout"] = 0.1.into();
    m["attention_dropout"] = 0.1.into();
    m["position_embedding"] = "learned".into();
    m["tied_embeddings"] = true.into();
    m["add_bias_linear"] = true.into();
    m["add_qkv_bias"] = true.into();
    v
}

fn mixes() -> Vec<(&'static str, Mix)> {
    let s = Mix::single;
    vec![
        (
            "tp2+sp",
            Mix {
                tp: 2,
                sp: true,
                ..s()
            },
        ),
        ("pp2 1f1b", Mix { pp: 2, ..s() }),
        (
            "pp2 interleaved vpp2",
            Mix {
                pp: 2,
                vpp: 2,
                schedule: "interleaved-1f1b",
                ..s()
            },
        ),
        (
            "dp2 zero1",
            Mix {
                dp: 2,
                zero: 1,
                ..s()
            },
        ),
        (
            "dp2 zero3",
            Mix {
                dp: 2,
                zero: 3,
                ..s()
            },
        ),
        ("cp2 p2p", Mix { cp: 2, ..s() }),
    ]
}

/// Mixes beyond the acceptance's: ZeRO 2 with PP 2 (copies on two ranks, each sharded over
/// DP), and ZB-V (first and last stage on one rank).
fn more_mixes() -> Vec<(&'static str, Mix)> {
    let s = Mix::single;
    vec![
        (
            "pp2 dp2 zero2",
            Mix {
                pp: 2,
                dp: 2,
                zero: 2,
                ..s()
            },
        ),
        (
            "pp2 zb-v",
            Mix {
                pp: 2,
                vpp: 2,
                schedule: "zb-v",
                ..s()
            },
        ),
    ]
}

#[test]
fn gpt3_style_model_matches_the_single_rank_run_under_every_mix() {
    let reference = run(&plan(gpt3(&Mix::single())), 3);
    // Tying acts: the untied model's parameters after three steps differ.
    let mut untied = gpt3(&Mix::single());
    untied["model"]["tied_embeddings"] = false.into();
    let other = run(&plan(untied), 3);
    let params = reference.params.as_ref().expect("params");
    let emb = "embedding.weight";
    let moved = rel_diff(&other.params.as_ref().expect("params")[emb], &params[emb]);
    assert!(
        moved > 1e-4,
        "tying did not change the embedding ({moved:e})"
    );
    assert!(!params.contains_key("output.weight"));
    // The biases exist and train: the last layer's move between step one and step three.
    let start = run(&plan(gpt3(&Mix::single())), 1);
    for b in ["bq", "bk", "bv", "bo", "b_fc1", "b_down"] {
        let name = format!("layers.7.{b}");
        let moved = rel_diff(
            &params[&name],
            &start.params.as_ref().expect("params")[&name],
        );
        assert!(moved > 1e-6, "{name} did not train ({moved:e})");
    }
    for (name, mix) in mixes().into_iter().chain(more_mixes()) {
        let got = run(&plan(gpt3(&mix)), 3);
        compare(name, &got, &reference);
    }
}

#[test]
fn gpt3_style_memory_is_within_two_percent_per_rank() {
    let mut worst = 0.0f64;
    let mut failures = Vec::new();
    for (name, mix) in mixes() {
        for (rank, m, p, mb, pb) in super::memory::compare_config(gpt3(&mix)) {
            let pct = (m as f64 - p as f64) / p as f64 * 100.0;
            println!("{name} rank {rank}: measured {m} predicted {p} ({pct:+.2}%)");
            worst = worst.max(pct.abs());
            if pct.abs() > 2.0 {
                failures.push(format!(
                    "{name} rank {rank}: {pct:+.2}%\n  measured  {mb}\n  predicted {pb}"
                ));
            }
        }
    }
    println!("worst {worst:.2}%");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
