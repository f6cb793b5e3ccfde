//! LoRA's linear (Hu et al. 2021) against finite differences: y = W x + (alpha / r) B A x on
//! every target of a tiny single-rank model, B drawn from the seed (nonzero) so that both A's
//! and B's gradients are nonzero. Central differences of the f64-accumulated mean loss for a
//! sample of elements of every adapter tensor; the frozen base weights get no gradient.

use parsim_executor::runner::{run_cpu, RunOptions};
use parsim_plan::plan::{Activation, AdamConfig, LoraShape, ModelShape, Plan, Recompute};

fn tiny(activation: Activation) -> ModelShape {
    ModelShape {
        activation,
        init_std: 0.4,
        mtp_loss_scale: 0.1,
        seq: 6,
        micro_batch: 2,
        ..ModelShape::dense(2, 8, 2, 1, 12, 16)
    }
}

fn lora_plan(activation: Activation, recompute: Recompute) -> Plan {
    let mut plan = Plan::single_rank(tiny(activation), AdamConfig::default(), 3, 2, recompute);
    plan.lora = Some(LoraShape {
        rank: 3,
        alpha: 6.0,
        qkv: true,
        proj: true,
        fc1: true,
        fc2: true,
        seeded_b: true,
    });
    plan
}

fn run(plan: &Plan, perturb: Vec<(String, usize, f32)>) -> parsim_plan::run_report::RunReport {
    run_cpu(
        plan,
        &RunOptions {
            steps: 1,
            warmup: 0,
            export_grads: true,
            perturb,
            ..RunOptions::default()
        },
    )
    .expect("runs")
}

fn check(activation: Activation, recompute: Recompute) {
    let plan = lora_plan(activation, recompute);
    let grads = run(&plan, Vec::new()).grads.expect("grads");
    // Two layers x four targets x (A, B); B of fc1 under SwiGLU is two tensors (gate, up)
    // and of QKV three (q, k, v).
    let b_parts = if activation == Activation::Swiglu {
        7
    } else {
        6
    };
    assert_eq!(grads.len(), 2 * (4 + b_parts), "{:?}", grads.keys());
    assert!(
        grads.keys().all(|k| k.contains("_lora_")),
        "only adapters train: {:?}",
        grads.keys()
    );
    let delta = 2e-3f32;
    let mut checked = 0;
    for (name, g) in &grads {
        let imax = (0..g.len())
            .max_by(|&a, &b| g[a].abs().total_cmp(&g[b].abs()))
            .expect("elements");
        let gmax = g[imax].abs() as f64;
        assert!(gmax > 1e-6, "{name}: zero gradient");
        let mut idx: Vec<usize> = (0..4).map(|k| (k * 7919 + 13) % g.len()).collect();
        idx.push(imax);
        for i in idx {
            let up = run(&plan, vec![(name.clone(), i, delta)]).loss[0];
            let down = run(&plan, vec![(name.clone(), i, -delta)]).loss[0];
            let fd = (up - down) / (2.0 * delta as f64);
            let err = (fd - g[i] as f64).abs();
            assert!(
                err <= 2e-3 * gmax.max(1e-3) + 2e-5,
                "{name}[{i}]: analytic {} vs finite difference {fd} ({activation:?}, {recompute:?})",
                g[i]
            );
            checked += 1;
        }
    }
    assert!(checked >= 60);
}

#[test]
fn lora_adapter_gradients_match_finite_differences() {
    check(Activation::Swiglu, Recompute::None);
    check(Activation::Gelu, Recompute::Full);
}

/// Hu et al.'s initialisation: B = 0, so the adapted model's first loss is the base model's.
#[test]
fn zero_b_leaves_the_first_loss_of_the_base_model() {
    let mut plan = lora_plan(Activation::Swiglu, Recompute::None);
    plan.lora.as_mut().expect("lora").seeded_b = false;
    let lora = run(&plan, Vec::new()).loss[0];
    plan.lora = None;
    let base = run(&plan, Vec::new()).loss[0];
    assert_eq!(lora, base);
}

/// A zero rank or a non-positive alpha is refused by field, not run with an infinite scale.
#[test]
fn a_bad_lora_shape_is_refused_by_field() {
    for (rank, alpha, field) in [
        (0, 6.0, "lora.rank"),
        (3, 0.0, "lora.alpha"),
        (3, f32::NAN, "lora.alpha"),
    ] {
        let mut plan = lora_plan(Activation::Swiglu, Recompute::None);
        let l = plan.lora.as_mut().expect("lora");
        (l.rank, l.alpha) = (rank, alpha);
        let err = run_cpu(&plan, &RunOptions::default())
            .expect_err("refused")
            .to_string();
        assert!(err.contains(field), "{err}");
    }
}
