//! The cost of op profiling (`RunOptions::profile_ops`, `execute --profile-ops`): the same
//! small single-rank model (hidden 256, 4 layers, seq 256: many short ops, where bracketing
//! each with two clock readings costs most) stepped with and without profiling, in
//! interleaved rounds so that drift in the machine's load touches both alike. Prints each
//! round's median steps, the medians over rounds and their ratio (goal: within 5%). On a
//! loaded machine the steps' spread hides a cost this small, so it also prints a second
//! estimate: the profiler's own cost per op (two clock readings, the record, reading it back
//! and summing it by key), measured alone, times the ops a step times, over the step.
//! Run: `cargo bench -p parsim-executor --bench profile_overhead`.

use parsim_executor::backend::cpu::CpuOps;
use parsim_executor::backend::Device;
use parsim_executor::op_profile::OpProfile;
use parsim_executor::runner::{run_cpu, RunOptions};
use parsim_plan::op_timing::OpKey;
use parsim_plan::plan::{AdamConfig, ModelShape, Plan, Recompute};
use std::time::Instant;

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

/// Seconds the profiler adds per timed op: `n` ops bracketed and recorded, then read back
/// and summed by key at the step's end, as the executor does.
fn cost_per_op_s(n: usize) -> f64 {
    let dev = CpuOps::new();
    let p = OpProfile::default();
    let key = OpKey::Memory { bytes: 64 };
    let t = Instant::now();
    p.start_step(true);
    for _ in 0..n {
        let (a, b) = (dev.record().expect("clock"), dev.record().expect("clock"));
        p.push(key.clone(), a, b);
    }
    p.finish_step(|a, b| dev.elapsed_s(a, b), &[(0..n, 1.0)], None)
        .expect("sums");
    t.elapsed().as_secs_f64() / n as f64
}

/// The median timed step of one run of `plan` (`profile`: ops timed).
fn step_s(plan: &Plan, profile: bool) -> f64 {
    step_and_ops(plan, profile).0
}

/// The median timed step of one run of `plan` and the ops it timed per timed step.
fn step_and_ops(plan: &Plan, profile: bool) -> (f64, f64) {
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
    let k = &r.ranks[0];
    let ops: u64 = k
        .ops
        .iter()
        .filter(|t| t.key != OpKey::HostGap)
        .map(|t| t.calls)
        .sum();
    (k.median_step_s(), ops as f64 / k.step_s.len() as f64)
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
    let per_op_s = (0..5)
        .map(|_| cost_per_op_s(200_000))
        .fold(f64::MAX, f64::min);
    let (_, ops) = step_and_ops(&plan, true);
    println!(
        "profiler cost: {:.0} ns per op (best of 5), {ops:.0} ops per step: {:.3} ms = {:.3}% of the {:.2} ms step",
        per_op_s * 1e9,
        per_op_s * ops * 1e3,
        100.0 * per_op_s * ops / off,
        off * 1e3
    );
}
