//! The mixed-precision recipe (`--precision bf16`: bf16 activations and weight copies, fp32
//! master weights, gradients and Adam) against fp32 and against itself across parallel mixes.
//!
//! Tolerance 1e-2 relative (bf16 keeps 8 significant bits: 2^-9 relative per rounding). The
//! loss after one step compares the recipe's forward with fp32's; the parameters after the
//! grid's steps are the fp32 master weights, whose updates differ only through the gradients (the
//! test's Adam, lr 1e-4 and eps 1e-6, bounds how far a gradient difference moves a weight).
//!
//! Memory: measured peak per rank within 2% of the engine's prediction for the same
//! configuration with `precision = "bf16"`, in the same runs of the covering array.
//!
//! Where mixes round differently from the single rank: a TP or SP collective on a bf16
//! activation (all-reduce, reduce-scatter, all-gather of partial sums) rounds the sum once
//! where the single rank rounds the whole matmul output once; pipeline sends carry bf16
//! activations and their gradients as the single rank holds them, so they add no rounding;
//! gradient reductions are fp32.

use super::common::*;
use super::equivalence::{covering_array, mix_of, GBS, STEPS};
use super::memory;
use parsim_executor::runner::{run_cpu, RunOptions};
use parsim_plan::plan::{Plan, Precision};
use parsim_plan::RunReport;

const TOL: f64 = 1e-2;

fn run_with(plan: &Plan, steps: u32, precision: Precision) -> RunReport {
    run_cpu(
        plan,
        &RunOptions {
            steps,
            warmup: 0,
            export_params: true,
            precision,
            ..RunOptions::default()
        },
    )
    .unwrap_or_else(|e| panic!("runs: {e}"))
}

/// Loss after one step and every parameter after the run's last step, within `TOL`.
fn assert_close(label: &str, got: &RunReport, reference: &RunReport) {
    let l0 = (got.loss[0] - reference.loss[0]).abs() / reference.loss[0].abs();
    assert!(
        l0 <= TOL,
        "{label}: loss {} vs {} (rel {l0:e})",
        got.loss[0],
        reference.loss[0]
    );
    let rp = reference.params.as_ref().expect("params");
    let gp = got.params.as_ref().expect("params");
    assert_eq!(rp.len(), gp.len(), "{label}: parameter tensors");
    let mut worst = 0.0f64;
    for (name, want) in rp {
        let d = rel_diff(&gp[name], want);
        worst = worst.max(d);
        assert!(d <= TOL, "{label}: {name} differs by {d:e} relative");
    }
    eprintln!("{label}: loss rel {l0:e}, worst parameter rel {worst:e}");
}

#[test]
fn bf16_single_rank_matches_fp32_within_bf16_tolerance() {
    for (flash, norm, act) in [(true, "rmsnorm", "swiglu"), (false, "layernorm", "gelu")] {
        let p = plan(config(&Mix::single(), GBS, flash, norm, act));
        let fp32 = run_with(&p, 3, Precision::Fp32);
        let bf16 = run_with(&p, 3, Precision::Bf16);
        // The recipe really rounds: the loss is not fp32's to the last bit.
        assert_ne!(bf16.loss[0], fp32.loss[0], "bf16 run computed in fp32");
        assert_close(&format!("bf16 vs fp32, {norm} {act}"), &bf16, &fp32);
    }
}

/// The grid's configuration of `mix` with `precision = "bf16"` (what the engine predicts for).
fn bf16_config(mix: &Mix, flash: bool, norm: &str, act: &str) -> serde_json::Value {
    let mut v = config(mix, GBS, flash, norm, act);
    v["training"]["precision"] = "bf16".into();
    v
}

/// Each mix of the array in bf16 against the bf16 single rank (loss and parameters) and, in
/// the same run, its measured peak per rank against the engine's bf16 prediction: bf16 weight
/// copies (2 bytes), fp32 gradients (grad_dtype fp32), fp32 master weights with the Adam
/// moments (12 bytes per parameter), bf16 activations except the loss's fp32 softmax and the
/// attention statistics.
#[test]
fn every_mix_of_the_grid_in_bf16_matches_the_bf16_single_rank_and_its_memory() {
    let (rows, _) = covering_array();
    let mut references = std::collections::HashMap::new();
    for r in &rows {
        let (mix, flash, norm, act) = mix_of(r);
        let reference = references.entry((flash, norm, act)).or_insert_with(|| {
            run_with(
                &plan(bf16_config(&Mix::single(), flash, norm, act)),
                STEPS,
                Precision::Bf16,
            )
        });
        let v = bf16_config(&mix, flash, norm, act);
        let got = run_with(&plan(v.clone()), STEPS, Precision::Bf16);
        let label = format!("{mix:?} flash {flash} {norm} {act}");
        assert_close(&label, &got, reference);
        memory::assert_within_two_percent(&label, &memory::against_prediction(v, &got));
    }
}

#[test]
fn bf16_tensors_count_two_bytes_and_master_weights_join_the_optimizer_states() {
    // Single rank, ZeRO 0: weights P x 2 bytes (bf16 copy), gradients P x 4, optimizer
    // P x 12 (fp32 master, m, v), where fp32 has P x 4, P x 4 and P x 8.
    let p = plan(config(&Mix::single(), GBS, true, "rmsnorm", "swiglu"));
    let fp32 = run_with(&p, 1, Precision::Fp32);
    let bf16 = run_with(&p, 1, Precision::Bf16);
    let (a, b) = (&fp32.ranks[0].category_max, &bf16.ranks[0].category_max);
    let params = a.weights / 4;
    assert_eq!(b.weights, 2 * params);
    assert_eq!(b.gradients, 4 * params);
    assert_eq!(b.optimizer, 12 * params);
    assert_eq!(a.optimizer, 8 * params);
    // The CPU allocates exactly: reserved bytes are the requested ones.
    assert_eq!(bf16.ranks[0].reserved_peak, bf16.ranks[0].peak);
    // Activations are (mostly) bf16: fewer bytes, but not half (the loss's softmax is fp32).
    assert!(b.activations < a.activations && 2 * b.activations > a.activations);
}
