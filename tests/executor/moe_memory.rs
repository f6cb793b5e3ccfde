//! Measured peak tracked bytes per rank of MoE runs against the engine's prediction: the
//! existing MoE grid (EP 2 and 4, ZeRO 1-3, with dropping) and the DeepSeek-style mixes
//! (sigmoid router with the expert bias, groups, a shared expert, a dense first layer).
//!
//! Within 2% on every rank with the engine's balanced router: EP 2 with ZeRO-1 (plain and
//! DeepSeek-style: the shared expert's weights, gradients and activations are predicted). The
//! rest of the grid runs within 2% under Megatron's forced
//! load balancing (`model.moe_router_force_load_balancing`), EP 4 with ZeRO-3 included. With
//! the learned router, which is unbalanced at initialisation, the run's measured load gives the
//! `moe_load_imbalance` to predict with (`RankReport::moe_load`, the engine's
//! `imbalance_of_rank_load`), and with a capacity the measured share of dropped assignments
//! the `moe_dropped_fraction` (the learned router drops about half at factor 1.0, a balanced
//! one none): the whole grid (TP 2 + SP with expert-TP 2 included: each TP rank routes its SP
//! shard, as Megatron-Core and the engine) then has the hottest EP rank within 2% and the
//! others at or below +2% of the prediction (figures in docs/executor.md).

use super::common::{options, resolve};
use super::memory::{compare_config, worst_percent};
use super::moe::{moe_config, Moe, BASE};
use parsim::estimate::estimate;
use parsim::lower::lower;
use parsim::model::imbalance_of_rank_load;
use parsim_executor::runner::{run_cpu, RunOptions};

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
    ]
}

/// The rest of the grid: within 2% at the measured load (the learned router) or
/// under forced balancing, not with the balanced prediction.
fn beyond() -> Vec<Moe> {
    let ds = DS;
    vec![
        Moe {
            cp: 2,
            ep: 2,
            dp: 2,
            zero: 1,
            ..ds
        },
        Moe {
            cp: 2,
            cp_comm: "a2a",
            ep: 2,
            dp: 2,
            zero: 1,
            ..ds
        },
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

/// One rank of a learned-router run against the prediction at the measured imbalance.
#[derive(Debug)]
struct Loaded {
    rank: u32,
    /// Received rows over the rank's uniform share (`MoeLoad::rank_load`).
    load: f64,
    dropped: u64,
    /// (measured - predicted) / predicted peak, in percent.
    percent: f64,
}

/// Runs `m` with its learned router, derives `moe_load_imbalance` from the measured loads (the
/// hottest EP rank's received rows over its uniform share, through the engine's inverse of its
/// rank load: docs/engine.md, MoE load) and predicts with it; returns that imbalance (1 where
/// no rank receives more than the kept share) and every rank against that prediction.
fn at_measured_imbalance(m: &Moe) -> (f64, Vec<Loaded>) {
    let (imbalance, _, ranks) = at_measured_load(m);
    (imbalance, ranks)
}

/// [`at_measured_imbalance`] with the measured dropped fraction too (0 without drops), fed
/// back as `moe_dropped_fraction`.
fn at_measured_load(m: &Moe) -> (f64, f64, Vec<Loaded>) {
    let v = moe_config(m);
    let plan = lower(&resolve(v.clone()), &options()).expect("lowers");
    let opts = RunOptions {
        steps: 2,
        warmup: 0,
        ..RunOptions::default()
    };
    let rep = run_cpu(&plan, &opts).expect("runs");
    let hottest = rep
        .ranks
        .iter()
        .map(|r| r.moe_load.rank_load().expect("routed"))
        .fold(0.0f64, f64::max);
    // The capacity's drops over every rank's assignments (`execute`'s `moe_load`); the
    // imbalance is then that of the kept share.
    let routed: u64 = rep.ranks.iter().map(|r| r.moe_load.assigned).sum();
    let dropped: u64 = rep.ranks.iter().map(|r| r.moe_dropped).sum();
    let fraction = dropped as f64 / routed as f64;
    let kept_load = hottest / (1.0 - fraction);
    let imbalance = imbalance_of_rank_load(kept_load, m.experts as u64, m.ep as u64).max(1.0);
    let mut at = v;
    at["model"]["moe_load_imbalance"] = imbalance.into();
    if dropped > 0 {
        at["model"]["moe_dropped_fraction"] = fraction.into();
    }
    let est = estimate(&resolve(at)).expect("estimate");
    let ranks = rep
        .ranks
        .iter()
        .map(|r| {
            let p = est.memory.stages[r.coords.pp as usize].total as f64;
            Loaded {
                rank: r.rank,
                load: r.moe_load.rank_load().expect("routed"),
                dropped: r.moe_dropped,
                percent: (r.peak.total() as f64 - p) / p * 100.0,
            }
        })
        .collect();
    (imbalance, fraction, ranks)
}

/// The learned-router mixes of the grid without a capacity.
fn learned() -> Vec<Moe> {
    beyond()
        .into_iter()
        .filter(|m| m.capacity_factor == 0.0)
        .collect()
}

#[test]
fn the_learned_router_matches_the_prediction_at_the_measured_imbalance() {
    // DeepSeek-style CP 2 with EP 2 (ring and Ulysses: MoE Parallel Folding makes the EP
    // group the two CP ranks of one sequence, whose learned routing is less even than the
    // balanced prediction, +2.15% on rank 3), TP 2 + SP with expert-TP 2 and EP 2, EP 4
    // ZeRO-3 (plain and DeepSeek-style) and DeepSeek-style PP 2 ZB-V: the router at
    // initialisation sends the hottest EP rank 1.23x, 1.23x, 1.06x, 1.19x, 1.14x and 1.09x its
    // share (imbalance 1.94, 1.94, 1.23, 1.38, 1.28, 1.36): that rank within 2% of the
    // prediction (+0.53%, +0.53%, +1.84%, +1.67%, +1.08%, +1.58%), the others at or below it
    // (+2%: the prediction is the hottest rank's).
    let mixes = learned();
    assert_eq!(mixes.len(), 6);
    for m in &mixes {
        let (imbalance, ranks) = at_measured_imbalance(m);
        eprintln!("imbalance {imbalance:.4} {m:?}");
        for r in &ranks {
            eprintln!("   {r:?}");
        }
        // The learned router is not balanced: the measure is not the default's 1.
        assert!(imbalance > 1.05, "{m:?}: {imbalance}");
        let hot = ranks
            .iter()
            .max_by(|a, b| a.load.total_cmp(&b.load))
            .expect("ranks");
        assert!(hot.percent.abs() <= 2.0, "{m:?}: hottest {hot:?}");
        for r in &ranks {
            assert!(
                r.percent <= 2.0,
                "{m:?}: rank {} above the prediction",
                r.rank
            );
        }
    }
}

/// Whether the hottest rank (by received rows) is within 2% and every rank at or below +2%;
/// its worst figure.
fn within_at_the_hottest(ranks: &[Loaded]) -> (bool, f64) {
    let hot = ranks
        .iter()
        .max_by(|a, b| a.load.total_cmp(&b.load))
        .expect("ranks");
    let worst = ranks.iter().map(|r| r.percent).fold(hot.percent, f64::max);
    (hot.percent.abs() <= 2.0 && worst <= 2.0, hot.percent)
}

#[test]
fn a_capacity_matches_the_learned_router_at_its_measured_drops() {
    // EP 2 dp 4 ZeRO-2 top-2 and EP 4 top-1, capacity factor 1.0: the router at
    // initialisation crowds a few experts, whose capacity drops about half of the assignments
    // (a balanced router none), so even the hottest rank receives less than its share.
    // Predicted with the measured dropped fraction (every rank sends and holds the kept
    // share) and the kept share's imbalance, the hottest rank is within 2% and the others at
    // or below +2%; with the balanced router's drops (none) every rank was -3.3% to -5.3%.
    for m in beyond().iter().filter(|m| m.capacity_factor > 0.0) {
        let (imbalance, fraction, ranks) = at_measured_load(m);
        eprintln!("imbalance {imbalance:.4} dropped {fraction:.4} {m:?}");
        for r in &ranks {
            eprintln!("   {r:?}");
            assert!(r.load < 1.0 && r.dropped > 0, "{m:?}: {r:?}");
        }
        // Not a balanced router's drops (none at factor 1.0), and a hot rank among the kept.
        assert!((0.3..0.8).contains(&fraction), "{m:?}: {fraction}");
        assert!(imbalance > 1.05, "{m:?}: {imbalance}");
        let (ok, hot) = within_at_the_hottest(&ranks);
        assert!(ok, "{m:?}: hottest {hot:+.2}%, {ranks:#?}");
    }
}

#[test]
fn the_whole_moe_grid_matches_the_prediction_at_the_measured_imbalance() {
    let mut bad = Vec::new();
    for m in &beyond() {
        let (imbalance, fraction, ranks) = at_measured_load(m);
        let (ok, hot) = within_at_the_hottest(&ranks);
        let worst = ranks.iter().map(|r| r.percent).fold(hot, f64::max);
        eprintln!("hottest {hot:+.2}% worst {worst:+.2}% imbalance {imbalance:.3} dropped {fraction:.3} {m:?}");
        if !ok {
            bad.push(format!("imbalance {imbalance:.3}: {ranks:?} {m:?}"));
        }
    }
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
    // TP 2 + SP with expert-TP 2 (+0.23%), EP 2 dp 4 ZeRO-2 dropping (+0.00%), EP 4 top-1
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
