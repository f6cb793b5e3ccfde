//! Measured peak tracked bytes per rank against the engine's prediction for the same
//! configuration (CPU profile: no runtime overhead; fp32).

use super::common::*;
use parsim::estimate::estimate;
use parsim::plan::lower;
use parsim_executor::runner::{run_cpu, RunOptions};

/// (rank, pp rank, measured total, predicted total, measured breakdown, predicted breakdown)
pub fn compare(
    mix: &Mix,
    flash: bool,
    norm: &str,
    act: &str,
    gbs: u64,
) -> Vec<(u32, u64, u64, String, String)> {
    let res = resolve(config(mix, gbs, flash, norm, act));
    let est = estimate(&res).expect("estimate");
    let plan = lower(&res, &options()).expect("lowers");
    let rep = run_cpu(
        &plan,
        &RunOptions {
            steps: 2,
            warmup: 0,
            ..RunOptions::default()
        },
    )
    .expect("runs");
    rep.ranks
        .iter()
        .map(|r| {
            let s = &est.memory.stages[r.coords.pp as usize];
            let p = r.peak;
            (
                r.rank,
                p.total(),
                s.total,
                format!(
                    "w {} g {} o {} a {} b {}",
                    p.weights, p.gradients, p.optimizer, p.activations, p.buffers
                ),
                format!(
                    "w {} g {} o {} a {} b {}",
                    s.weights, s.gradients, s.optimizer, s.activations, s.buffers
                ),
            )
        })
        .collect()
}

#[test]
#[ignore]
fn print_memory() {
    let mixes = [
        Mix::single(),
        Mix {
            tp: 2,
            sp: true,
            ..Mix::single()
        },
        Mix {
            tp: 2,
            sp: false,
            ..Mix::single()
        },
        Mix {
            recompute: "selective",
            ..Mix::single()
        },
        Mix {
            recompute: "full",
            ..Mix::single()
        },
        Mix {
            pp: 2,
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
            schedule: "zb-v",
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
            zero: 1,
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
            println!("{m:?} flash {flash}");
            for (rank, meas, pred, mb, pb) in compare(m, flash, "rmsnorm", "swiglu", 8) {
                let d = (meas as f64 - pred as f64) / pred as f64 * 100.0;
                println!("  rank {rank}: measured {meas} predicted {pred} ({d:+.2}%)\n     meas {mb}\n     pred {pb}");
            }
        }
    }
}

#[test]
#[ignore]
fn print_grid_memory() {
    let (rows, _) = super::equivalence::covering_array();
    for r in &rows {
        let (mix, flash, norm, act) = super::equivalence::mix_of(r);
        let res = compare(&mix, flash, norm, act, super::equivalence::GBS);
        let worst = res
            .iter()
            .map(|(_, m, p, _, _)| (*m as f64 - *p as f64) / *p as f64 * 100.0)
            .fold(0.0f64, |a, b| if b.abs() > a.abs() { b } else { a });
        println!("{worst:+.2}% {mix:?} flash {flash} {norm} {act}");
        if worst.abs() > 2.0 {
            for (rank, meas, pred, mb, pb) in res
                .into_iter()
                .filter(|(_, m, p, _, _)| ((*m as f64 - *p as f64) / *p as f64 * 100.0).abs() > 2.0)
                .take(3)
            {
                let d = (meas as f64 - pred as f64) / pred as f64 * 100.0;
                println!(
                    "  rank {rank}: {meas} vs {pred} ({d:+.2}%)\n     meas {mb}\n     pred {pb}"
                );
            }
        }
    }
}
