//! Measured peak tracked bytes per rank of MoE runs against the engine's prediction: the
//! existing MoE grid (EP 2 and 4, ZeRO 1-3, with dropping) and the DeepSeek-style mixes
//! (sigmoid router with the expert bias, groups, a shared expert, a dense first layer).
//!
//! Within 2% today: EP 2 with ZeRO-1 (plain and DeepSeek-style: the shared expert's weights,
//! gradients and activations are predicted) and DeepSeek-style CP 2 with EP 2. The rest of the
//! grid is the ignored test below, which fails with the figures of docs/executor.md: the
//! engine predicts a balanced router, while the executor's at initialisation drops about half
//! the assignments at capacity factor 1.0 (where a balanced one drops none) and spreads the EP 4
//! ranks' activations by 20%; under TP the executor routes the gathered microbatch where
//! Megatron-Core (and the engine) routes the SP shard.

use super::memory::{compare_config, worst_percent};
use super::moe::{moe_config, Moe, BASE};

const DS: Moe = Moe {
    first_dense: 1,
    deepseek: true,
    ..BASE
};

/// The mixes within 2% on every rank.
fn within() -> Vec<Moe> {
    vec![
        Moe {
            ep: 2,
            dp: 2,
            zero: 1,
            ..BASE
        },
        Moe {
            ep: 2,
            dp: 2,
            zero: 1,
            ..DS
        },
        Moe {
            cp: 2,
            ep: 2,
            dp: 2,
            zero: 1,
            ..DS
        },
        Moe {
            cp: 2,
            cp_comm: "a2a",
            ep: 2,
            dp: 2,
            zero: 1,
            ..DS
        },
    ]
}

/// The rest of the grid (not yet within 2%).
fn beyond() -> Vec<Moe> {
    let ds = DS;
    vec![
        Moe {
            tp: 2,
            sp: true,
            ep: 2,
            dp: 2,
            zero: 1,
            ..ds
        },
        Moe {
            ep: 2,
            dp: 4,
            zero: 2,
            capacity_factor: 1.0,
            ..BASE
        },
        Moe {
            ep: 4,
            dp: 4,
            zero: 3,
            ..BASE
        },
        Moe {
            ep: 4,
            dp: 4,
            zero: 1,
            top_k: 1,
            capacity_factor: 1.0,
            ..BASE
        },
        Moe {
            ep: 4,
            dp: 4,
            zero: 3,
            ..ds
        },
        Moe {
            ep: 2,
            dp: 2,
            pp: 2,
            vpp: 2,
            schedule: "zb-v",
            ..ds
        },
    ]
}

/// Mixes whose worst rank is beyond 2%, with that figure.
fn beyond_two_percent(mixes: &[Moe]) -> Vec<String> {
    let mut bad = Vec::new();
    for m in mixes {
        let res = compare_config(moe_config(m));
        let worst = worst_percent(&res);
        eprintln!("{worst:+.2}% {m:?}");
        if worst.abs() > 2.0 {
            for x in &res {
                eprintln!("   {x:?}");
            }
            bad.push(format!("{worst:+.2}% {m:?}"));
        }
    }
    bad
}

#[test]
fn moe_peak_memory_matches_the_prediction_per_rank() {
    let bad = beyond_two_percent(&within());
    assert!(bad.is_empty(), "beyond 2%: {bad:#?}");
}

#[test]
#[ignore = "known gap of issue 19: the init router is unbalanced (EP 4, dropping, ZB-V: -6.8% to +2.5%) and TP routes the gathered microbatch (+3.6%)"]
fn the_whole_moe_grid_matches_the_prediction_per_rank() {
    let bad = beyond_two_percent(&beyond());
    assert!(bad.is_empty(), "beyond 2%: {bad:#?}");
}
