//! One training step of a model with hidden 1024, 8 layers, seq 1024 on one rank (CPU
//! backend), against the machine's GEMM peak measured here with the same crate
//! (`matrixmultiply`). Run: `cargo bench -p parsim-executor --bench step`.
//!
//! Reports: the GEMM peak (best of square and layer-shaped products), the step time, the
//! step's GEMM FLOPs and the rate they ran at inside the step (the "matmul share" of the goal:
//! >= 70% of the peak), and the whole step's achieved GFLOP/s.

use parsim_executor::backend::cpu::gemm_counter::GemmCounter;
use parsim_executor::backend::cpu::ops::gemm::{gemm, View};
use parsim_executor::runner::{run_cpu, RunOptions};
use parsim_plan::plan::{AdamConfig, ModelShape, Plan, Recompute};
use std::time::Instant;

fn gemm_rate(m: usize, k: usize, n: usize, reps: usize) -> f64 {
    let a = vec![0.5f32; m * k];
    let b = vec![0.25f32; k * n];
    let mut c = vec![0.0f32; m * n];
    let counter = GemmCounter::new();
    let mut run = || {
        gemm(
            &counter,
            1.0,
            (&a, View::rm(m, k)),
            (&b, View::rm(k, n)),
            0.0,
            (&mut c, View::rm(m, n)),
        )
    };
    run(); // warm-up
    let t = Instant::now();
    for _ in 0..reps {
        run();
    }
    2.0 * (m * k * n * reps) as f64 / t.elapsed().as_secs_f64() / 1e9
}

fn main() {
    // `cargo test --all-targets` runs bench binaries without --bench: do nothing then.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "load average: {} (other work on the machine lowers every figure)",
        load.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    );
    let shapes = [
        (1024, 1024, 1024),
        (1024, 1024, 2816),
        (1024, 2816, 1024),
        (1024, 1024, 8192),
    ];
    // Best of five per shape: the peak is what the machine can do, not a busy moment.
    let peak = shapes
        .iter()
        .map(|&(m, k, n)| {
            let r = (0..5).map(|_| gemm_rate(m, k, n, 2)).fold(0.0, f64::max);
            println!("gemm {m}x{k}x{n}: {r:.1} GFLOP/s");
            r
        })
        .fold(0.0, f64::max);
    println!("GEMM peak (matrixmultiply, 1 thread): {peak:.1} GFLOP/s");

    let model = ModelShape {
        seq: 1024,
        ..ModelShape::dense(8, 1024, 16, 8, 2816, 8192)
    };
    let plan = Plan::single_rank(model, AdamConfig::default(), 1, 1, Recompute::None);
    let steps = 3;
    // The rank's device counts its own GEMMs and reports them.
    let t = Instant::now();
    let report = run_cpu(
        &plan,
        &RunOptions {
            steps,
            warmup: 1,
            ..RunOptions::default()
        },
    )
    .expect("runs");
    let wall = t.elapsed().as_secs_f64();
    let r = &report.ranks[0];
    let step_s = r.median_step_s();
    let (gflop, gsec) = (r.gemm_flops / steps as f64, r.gemm_seconds / steps as f64);
    println!(
        "step: {:.3} s median of {} timed ({wall:.1} s in all), loss {:.4}",
        step_s,
        steps - 1,
        report.loss[0]
    );
    println!(
        "GEMMs in the step: {:.1} GFLOP in {:.3} s = {:.1} GFLOP/s = {:.0}% of the GEMM peak",
        gflop / 1e9,
        gsec,
        gflop / gsec / 1e9,
        100.0 * gflop / gsec / 1e9 / peak
    );
    println!(
        "whole step: {:.1} GFLOP/s achieved ({:.0}% of the GEMM peak); GEMMs are {:.0}% of the step's time",
        gflop / step_s / 1e9,
        100.0 * gflop / step_s / 1e9 / peak,
        100.0 * gsec / step_s
    );
    println!(
        "peak tracked memory: {:.1} MiB",
        r.peak.total() as f64 / (1u64 << 20) as f64
    );
}
