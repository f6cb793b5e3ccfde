//! Measured peak tracked bytes per rank against the engine's prediction for the same
//! configuration (CPU profile: no runtime overhead; fp32); the pairwise covering array's runs
//! are checked by the equivalence test with [`against_prediction`], in the same runs.
//!
//! The engine sums each category's worst moment (weights, gradients, optimizer states, the
//! activation peak of the rank's action list, the worst phase's buffers); the executor
//! measures the worst moment of the sum. They describe the same tensors, so they agree within
//! 2% except where the categories' worst moments do not coincide or where a pass holds more
//! transients at once than the engine's one-op model (documented in docs/executor.md).

use super::common::*;
use parsim::estimate::estimate;
use parsim::lower::lower;
use parsim_executor::runner::{run_cpu, RunOptions};
use parsim_plan::RunReport;

/// Per rank: (rank, measured peak, predicted, measured breakdown, predicted breakdown).
pub fn compare(
    mix: &Mix,
    flash: bool,
    norm: &str,
    act: &str,
    gbs: u64,
) -> Vec<(u32, u64, u64, String, String)> {
    compare_config(config(mix, gbs, flash, norm, act))
}

/// [`compare`] for a configuration given whole.
pub fn compare_config(v: serde_json::Value) -> Vec<(u32, u64, u64, String, String)> {
    let plan = lower(&resolve(v.clone()), &options()).expect("lowers");
    let rep = run_cpu(
        &plan,
        &RunOptions {
            steps: 2,
            warmup: 0,
            ..RunOptions::default()
        },
    )
    .expect("runs");
    against_prediction(v, &rep)
}

/// Per rank of a run of configuration `v` (two steps or more, so that the optimizer states
/// exist during a forward pass): the measured peak and breakdown against the engine's.
pub fn against_prediction(
    v: serde_json::Value,
    rep: &RunReport,
) -> Vec<(u32, u64, u64, String, String)> {
    let est = estimate(&resolve(v)).expect("estimate");
    rep.ranks
        .iter()
        .map(|r| {
            let s = &est.memory.stages[r.coords.pp as usize];
            let p = r.peak;
            let c = r.category_max;
            (
                r.rank,
                p.total(),
                s.total,
                format!(
                    "w {} g {} o {} a {} b {} (own maxima a {} b {}; peak at {:?})",
                    p.weights,
                    p.gradients,
                    p.optimizer,
                    p.activations,
                    p.buffers,
                    c.activations,
                    c.buffers,
                    r.peak_site
                ),
                format!(
                    "w {} g {} o {} a {} b {}",
                    s.weights, s.gradients, s.optimizer, s.activations, s.buffers
                ),
            )
        })
        .collect()
}

/// The memory bound on every rank: weights, gradients and optimizer states exactly the
/// predicted tensors, the total within 2% (docs/executor.md says where the two may differ).
pub fn assert_within_two_percent(label: &str, res: &[(u32, u64, u64, String, String)]) {
    for (rank, _, _, mb, pb) in res {
        let head = |s: &str| s.split(" a ").next().unwrap_or("").to_string();
        assert_eq!(
            head(mb),
            head(pb),
            "{label} rank {rank}: weights/gradients/optimizer"
        );
    }
    let worst = worst_percent(res);
    eprintln!("{worst:+.2}% {label}");
    if worst.abs() > 2.0 {
        for x in res
            .iter()
            .filter(|x| ((x.1 as f64 - x.2 as f64) / x.2 as f64 * 100.0).abs() > 2.0)
            .take(2)
        {
            eprintln!("   {x:?}");
        }
    }
    assert!(worst.abs() <= 2.0, "{label}: {worst:+.2}% {res:#?}");
}

/// Bytes of weights in a breakdown "w N g ...".
pub fn weight_bytes(breakdown: &str) -> i64 {
    breakdown
        .strip_prefix("w ")
        .and_then(|s| s.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no weights in {breakdown}"))
}

pub fn worst_percent(res: &[(u32, u64, u64, String, String)]) -> f64 {
    res.iter()
        .map(|(_, m, p, _, _)| (*m as f64 - *p as f64) / *p as f64 * 100.0)
        .fold(0.0f64, |a, b| if b.abs() > a.abs() { b } else { a })
}

#[test]
fn single_mixes_are_within_two_percent() {
    let mixes = [
        Mix::single(),
        Mix {
            tp: 2,
            sp: true,
            ..Mix::single()
        },
        Mix {
            recompute: "full",
            ..Mix::single()
        },
        Mix {
            pp: 4,
            schedule: "gpipe",
            ..Mix::single()
        },
        Mix {
            pp: 2,
            vpp: 2,
            schedule: "interleaved-1f1b",
            ..Mix::single()
        },
        Mix {
            pp: 2,
            schedule: "zb-h1",
            ..Mix::single()
        },
        Mix {
            pp: 2,
            vpp: 2,
            schedule: "dualpipe-v",
            ..Mix::single()
        },
        Mix {
            dp: 2,
            zero: 2,
            ..Mix::single()
        },
        Mix {
            dp: 2,
            zero: 3,
            ..Mix::single()
        },
    ];
    for m in &mixes {
        for flash in [true, false] {
            let res = compare(m, flash, "rmsnorm", "swiglu", 8);
            let worst = worst_percent(&res);
            assert!(
                worst.abs() <= 2.0,
                "{m:?} flash {flash}: {worst:+.2}% {res:#?}"
            );
        }
    }
}

#[test]
fn the_comparison_can_fail() {
    // A prediction for another configuration (twice the micro batch) is far off.
    let m = Mix::single();
    let res = resolve(config(&m, 8, true, "rmsnorm", "swiglu"));
    let mut other = config(&m, 8, true, "rmsnorm", "swiglu");
    other["training"]["micro_batch_size"] = 2.into();
    let est = estimate(&resolve(other)).expect("estimate");
    let plan = lower(&res, &options()).expect("lowers");
    let rep = run_cpu(&plan, &RunOptions::default()).expect("runs");
    let (meas, pred) = (
        rep.ranks[0].peak.total() as f64,
        est.memory.stages[0].total as f64,
    );
    assert!((meas - pred).abs() / pred > 0.02);
}
