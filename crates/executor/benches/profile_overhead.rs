//! The cost of op profiling (`RunOptions::profile_ops`, `execute --profile-ops`): the same
//! small single-rank model (hidden 256, 4 layers, seq 256: many short ops, where bracketing
//! each with two clock readings costs most) stepped with and without profiling, in
//! interleaved rounds so that drift in the machine's load touches both alike. Prints each
//! round's median steps, the medians over rounds and their ratio (goal: within 5%).
//! Run: `cargo bench -p parsim-executor --bench profile_overhead`.

use parsim_executor::plan::{AdamConfig, ModelShape, Plan, Recompute};
use parsim_executor::runner::{run_cpu, RunOptions};

/// The median of `v` (not empty).
fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// The median timed step of one run of `plan` (`profile`: ops timed).
fn step_s(plan: &Plan, profile: bool) -> f64 {
    let r = run_cpu(
        plan,
        &RunOptions {
            steps: 6,
            warmup: 1,
            profile_ops: profile,
            ..RunOptions::default()
        },
    )
    .expect("runs");
    r.ranks[0].median_step_s()
}

fn main() {
    // `cargo test --all-targets` runs bench binaries without --bench: do nothing then.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "load average: {} (other work on the machine widens the spread)",
        load.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    );
    let model = ModelShape {
        seq: 256,
        ..ModelShape::dense(4, 256, 8, 4, 704, 1024)
    };
    let plan = Plan::single_rank(model, AdamConfig::default(), 1, 2, Recompute::None);
    let (mut off, mut on) = (Vec::new(), Vec::new());
    for round in 0..7 {
        // Alternate which goes first.
        let (a, b) = if round % 2 == 0 {
            let a = step_s(&plan, false);
            (a, step_s(&plan, true))
        } else {
            let b = step_s(&plan, true);
            (step_s(&plan, false), b)
        };
        println!(
            "round {round}: step {:.2} ms without profiling, {:.2} ms with",
            a * 1e3,
            b * 1e3
        );
        off.push(a);
        on.push(b);
    }
    let (off, on) = (median(off), median(on));
    println!(
        "median step: {:.2} ms without, {:.2} ms with --profile-ops; ratio {:.4} ({:+.2}%)",
        off * 1e3,
        on * 1e3,
        on / off,
        (on / off - 1.0) * 100.0
    );
}
