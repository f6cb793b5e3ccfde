//! The single-rank run against finite differences: every op's backward (norms, rotary,
//! causal GQA attention with and without flash, SwiGLU and GeLU, vocab cross-entropy, the
//! embedding) is checked through the loss of a tiny model, for a sample of elements of every
//! parameter tensor. Central differences of the f64-accumulated mean loss.

use parsim_executor::plan::{Activation, AdamConfig, ModelShape, Norm, Plan, Recompute};
use parsim_executor::runner::{run_cpu, RunOptions};

fn tiny(norm: Norm, activation: Activation, flash: bool) -> ModelShape {
    ModelShape {
        num_layers: 2,
        hidden: 8,
        heads: 2,
        kv_heads: 1,
        head_dim: 4,
        ffn: 12,
        vocab: 16,
        data_vocab: 16,
        seq: 6,
        micro_batch: 2,
        norm,
        norm_eps: 1e-5,
        activation,
        rope_theta: 10000.0,
        flash,
        init_std: 0.4,
    }
}

fn loss(plan: &Plan, perturb: Vec<(String, usize, f32)>) -> f64 {
    let r = run_cpu(
        plan,
        &RunOptions {
            steps: 1,
            warmup: 0,
            export_grads: true,
            perturb,
            ..RunOptions::default()
        },
    )
    .expect("runs");
    r.loss[0]
}

fn check(norm: Norm, activation: Activation, flash: bool, recompute: Recompute) {
    let plan = Plan::single_rank(
        tiny(norm, activation, flash),
        AdamConfig::default(),
        3,
        2,
        recompute,
    );
    let base = run_cpu(
        &plan,
        &RunOptions {
            steps: 1,
            warmup: 0,
            export_grads: true,
            ..RunOptions::default()
        },
    )
    .expect("runs");
    let grads = base.grads.expect("grads");
    assert!(grads.len() >= 10);
    let delta = 2e-3f32;
    let mut checked = 0;
    for (name, g) in &grads {
        // A spread of elements, including the largest gradient of the tensor.
        let imax = (0..g.len())
            .max_by(|&a, &b| g[a].abs().total_cmp(&g[b].abs()))
            .unwrap();
        let mut idx: Vec<usize> = (0..5).map(|k| (k * 7919 + 13) % g.len()).collect();
        idx.push(imax);
        let gmax = g[imax].abs() as f64;
        for i in idx {
            let up = loss(&plan, vec![(name.clone(), i, delta)]);
            let down = loss(&plan, vec![(name.clone(), i, -delta)]);
            let fd = (up - down) / (2.0 * delta as f64);
            let err = (fd - g[i] as f64).abs();
            assert!(
                err <= 2e-3 * gmax.max(1e-3) + 2e-5,
                "{name}[{i}]: analytic {} vs finite difference {fd} ({norm:?}, {activation:?}, flash {flash}, {recompute:?})",
                g[i]
            );
            checked += 1;
        }
    }
    assert!(checked > 50);
}

#[test]
fn rmsnorm_swiglu_flash_matches_finite_differences() {
    check(Norm::RmsNorm, Activation::Swiglu, true, Recompute::None);
}

#[test]
fn layernorm_gelu_softmax_matches_finite_differences() {
    check(Norm::LayerNorm, Activation::Gelu, false, Recompute::None);
}

#[test]
fn recomputation_gives_the_same_gradients_as_finite_differences() {
    check(Norm::RmsNorm, Activation::Gelu, false, Recompute::Selective);
    check(Norm::LayerNorm, Activation::Swiglu, true, Recompute::Full);
}

#[test]
fn a_wrong_gradient_would_be_caught() {
    // The check can fail: a perturbation of the loss by a parameter is visible.
    let plan = Plan::single_rank(
        tiny(Norm::RmsNorm, Activation::Swiglu, true),
        AdamConfig::default(),
        3,
        2,
        Recompute::None,
    );
    let a = loss(&plan, vec![]);
    let b = loss(&plan, vec![("layers.0.wq".into(), 0, 0.5)]);
    assert!((a - b).abs() > 1e-6);
}
