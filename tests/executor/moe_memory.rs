//! Measured peak tracked bytes per rank of MoE runs against the engine's prediction: the
//! existing MoE grid (EP 2 and 4, ZeRO 1-3, with dropping) and the DeepSeek-style mixes
//! (sigmoid router with the expert bias, groups, a shared expert, a dense first layer).
//!
//! Within 2% today: EP 2 with ZeRO-1 (plain and DeepSeek-style: the shared expert's weights,
//! gradients and activations are predicted) and DeepSeek-style CP 2 with EP 2. The rest of the
//! grid runs within 2% under Megatron's forced load balancing (`model.moe_router_force_load_balancing`),
//! EP 4 with ZeRO-3 included. With the learned router it is the ignored test below,
//! which fails with the figures of docs/executor.md: the
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
#[ignore = "known gap of issue 19: the learned router at initialisation is unbalanced (-6.8% to +3.6%); the engine's moe_load_imbalance is not yet set from the measured loads"]
fn the_whole_moe_grid_matches_the_prediction_per_rank() {
    let bad = beyond_two_percent(&beyond());
    assert!(bad.is_empty(), "beyond 2%: {bad:#?}");
}

/// The grid under Megatron's forced load balancing (the engine's balanced router, exactly),
/// dropping at capacity factor 0.75; `zero3_ep4` picks the EP 4 ZeRO-3 mixes (+0.23% plain,
/// -0.59% DeepSeek-style: the peak is in a MoE layer's backward, where the gradient buckets
/// open at each space's first weight gradient, the experts' first, and forward holds a
/// layer's dense part and its experts as its two gathered sets) or the rest.
fn forced(zero3_ep4: bool) -> Vec<Moe> {
    beyond()
        .into_iter()
        .filter(|m| (m.zero == 3 && m.ep == 4) == zero3_ep4)
        .map(|m| Moe {
            force_balance: true,
            capacity_factor: if m.capacity_factor > 0.0 { 0.75 } else { 0.0 },
            ..m
        })
        .collect()
}

#[test]
fn the_grid_under_forced_balancing_matches_the_prediction_per_rank() {
    // TP 2 + SP with expert-TP 2 (+1.55%), EP 2 dp 4 ZeRO-2 dropping (-1.61%), EP 4 top-1
    // dropping (-0.04%), PP 2 ZB-V (-0.45%): the learned router's -6.83% .. +3.61% were its
    // imbalance.
    let bad = beyond_two_percent(&forced(false));
    assert!(bad.is_empty(), "beyond 2%: {bad:#?}");
}

#[test]
fn the_ep4_zero3_mixes_under_forced_balancing_match_the_prediction_per_rank() {
    let bad = beyond_two_percent(&forced(true));
    assert!(bad.is_empty(), "beyond 2%: {bad:#?}");
}
