//! Attention dropout executed (rate 0.1, inside the flash attention, the mask regenerated in
//! backward from Philox keyed by seed, step, layer, global head, global query token and key
//! position): every TP split of the heads and every CP layout of the sequence draws the
//! single-rank run's mask, so the loss after one step and the parameters after three match
//! that run within 1e-5 relative.

use super::common::*;
use super::equivalence::{compare, GBS};
use serde_json::Value;

/// The small GPT-3-style model (GeLU, LayerNorm, learned positions, hidden dropout 0.1) with
/// attention dropout `p`.
fn model(mix: &Mix, p: f64) -> Value {
    let mut v = config(mix, GBS, true, "layernorm", "gelu");
    v["model"]["hidden_dropout"] = 0.1.into();
    v["model"]["attention_dropout"] = p.into();
    v["model"]["position_embedding"] = "learned".into();
    v
}

fn mixes() -> Vec<(&'static str, Mix)> {
    let s = Mix::single;
    let cp = |comm: &'static str| Mix {
        cp: 2,
        cp_comm: comm,
        ..s()
    };
    vec![
        (
            "tp2+sp",
            Mix {
                tp: 2,
                sp: true,
                ..s()
            },
        ),
        ("cp2 p2p", cp("p2p")),
        ("cp2 zigzag", cp("zigzag")),
        ("cp2 allgather", cp("allgather")),
        ("cp2 a2a", cp("a2a")),
        (
            "cp2 a2a + tp2 sp",
            Mix {
                tp: 2,
                sp: true,
                ..cp("a2a")
            },
        ),
        ("pp2 1f1b", Mix { pp: 2, ..s() }),
        (
            "dp2 zero3",
            Mix {
                dp: 2,
                zero: 3,
                ..s()
            },
        ),
        (
            "cp2 zigzag selective recompute",
            Mix {
                recompute: "selective",
                ..cp("zigzag")
            },
        ),
    ]
}

#[test]
fn attention_dropout_matches_the_single_rank_run_under_tp_cp_pp_dp() {
    let reference = run(&plan(model(&Mix::single(), 0.1)), 3);
    // The mask acts: without it the parameters after three steps move beyond the tolerance.
    let undropped = run(&plan(model(&Mix::single(), 0.0)), 3);
    let (rp, up) = (reference.params.as_ref(), undropped.params.as_ref());
    let moved = rp
        .expect("params")
        .iter()
        .map(|(name, want)| rel_diff(&up.expect("params")[name], want))
        .fold(0.0, f64::max);
    assert!(
        moved > 1e-3,
        "attention dropout did not change the run ({moved:e})"
    );
    for (name, mix) in mixes() {
        let got = run(&plan(model(&mix, 0.1)), 3);
        compare(name, &got, &reference);
    }
}

#[test]
fn attention_dropout_without_flash_attention_is_refused_by_field() {
    let mut v = model(&Mix::single(), 0.1);
    v["training"]["flash_attention"] = false.into();
    let err = parsim::lower::lower(&resolve(v), &options())
        .expect_err("refused")
        .to_string();
    assert!(err.contains("model.attention_dropout"), "{err}");
    assert!(err.contains("flash_attention"), "{err}");
}
