//! Hybrid Mamba-2 models in the executor (Megatron's `--hybrid-layer-pattern`): the SSD chunked
//! scan against the plain recurrence (Dao and Gu 2024, sec. 6: the same model computed two
//! ways), the mixer's backward against finite differences through a tiny model's loss, a
//! hybrid model under TP + SP, DP and PP against its single-rank run (fp32, 1e-5 relative, as
//! the other twin tests), and every rank's measured peak within 2% of the engine's prediction.

use super::common::*;
use super::memory::compare_config;
use super::moe::{compare, moe_config, Moe, BASE};
use parsim_executor::backend::cpu::ops::mamba::{ssd_chunked, ssd_sequential};
use parsim_executor::backend::ops::MambaGeo;
use parsim_executor::runner::{run_cpu, RunOptions};
use parsim_plan::plan::{AdamConfig, HybridLayer, MambaShape, ModelShape, Plan, Recompute};
use serde_json::{json, Value};

/// A deterministic uniform in [-1, 1) (a 64-bit LCG's high bits).
fn noise(seed: u64, len: usize) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            s = s
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

#[test]
fn the_chunked_scan_equals_the_sequential_recurrence() {
    // Chunks that divide the sequence, one that does not (a short last chunk), one token a
    // chunk and one chunk for the whole sequence; two sequences, two groups of two heads.
    for (s, q) in [(12, 4), (13, 5), (7, 1), (9, 16)] {
        let g = MambaGeo {
            b: 2,
            s,
            heads: 4,
            p: 3,
            groups: 2,
            n: 5,
            k: 4,
            q,
            eps: 1e-5,
        };
        let n = g.tokens();
        let xbc = noise(1, n * g.conv());
        let dt: Vec<f32> = noise(2, n * g.heads)
            .iter()
            .map(|v| 0.6 + 0.5 * v)
            .collect();
        let a: Vec<f32> = noise(3, g.heads).iter().map(|v| -1.0 - 0.5 * v).collect();
        let da: Vec<f32> = (0..n * g.heads).map(|i| dt[i] * a[i % g.heads]).collect();
        let d = noise(4, g.heads);
        let mut chunked = vec![0.0; n * g.inner()];
        let mut states = vec![0.0; g.states_len()];
        ssd_chunked(&g, &xbc, &dt, &da, &d, &mut chunked, &mut states);
        let mut sequential = vec![0.0; n * g.inner()];
        ssd_sequential(&g, &xbc, &dt, &da, &d, &mut sequential);
        let diff = rel_diff(&chunked, &sequential);
        assert!(diff < 1e-5, "s {s}, q {q}: chunked vs sequential {diff:e}");
        // The scan is not trivially zero, and the second sequence does not see the first:
        // its first token's output is dt (B . C) x + D x (h = dt x B^T, y = h C + D x).
        assert!(sequential.iter().any(|v| v.abs() > 0.1));
        let t = g.s;
        let row = &xbc[t * g.conv()..(t + 1) * g.conv()];
        for h in 0..g.heads {
            let grp = h / (g.heads / g.groups);
            let b0 = g.inner() + grp * g.n;
            let c0 = b0 + g.groups * g.n;
            let bc: f32 = (0..g.n).map(|i| row[b0 + i] * row[c0 + i]).sum();
            for p in 0..g.p {
                let x = row[h * g.p + p];
                let want = dt[t * g.heads + h] * bc * x + d[h] * x;
                let got = chunked[t * g.inner() + h * g.p + p];
                assert!(
                    (got - want).abs() < 1e-5,
                    "s {s}, q {q}, head {h}: {got} vs {want}"
                );
            }
        }
    }
}

/// A tiny hybrid model "M*M-" of hidden 8 (Mamba: 4 heads of 2 channels, 2 groups of state 3,
/// convolution 3, chunk 2 over 5 tokens, so the last chunk is short), as a Plan.
fn tiny_hybrid(pattern: &str) -> ModelShape {
    let hybrid = pattern
        .chars()
        .map(|c| match c {
            'M' => HybridLayer::Mamba,
            '*' => HybridLayer::Attention,
            _ => HybridLayer::Mlp,
        })
        .collect::<Vec<_>>();
    ModelShape {
        init_std: 0.4,
        seq: 5,
        micro_batch: 2,
        hybrid,
        mamba: Some(MambaShape {
            heads: 4,
            head_dim: 2,
            state: 3,
            groups: 2,
            conv_kernel: 3,
            chunk: 2,
        }),
        ..ModelShape::dense(pattern.len() as u32, 8, 2, 1, 12, 16)
    }
}

fn loss(plan: &Plan, perturb: Vec<(String, usize, f32)>) -> f64 {
    let opts = RunOptions {
        steps: 1,
        warmup: 0,
        export_grads: true,
        perturb,
        ..RunOptions::default()
    };
    run_cpu(plan, &opts).expect("runs").loss[0]
}

#[test]
fn the_mixer_backward_matches_finite_differences() {
    // Central differences of the loss for a spread of elements of every Mamba tensor (and the
    // other layers' norms), each with the largest gradient of its tensor.
    let plan = Plan::single_rank(
        tiny_hybrid("M*M-"),
        AdamConfig::default(),
        3,
        1,
        Recompute::None,
    );
    let opts = RunOptions {
        steps: 1,
        warmup: 0,
        export_grads: true,
        ..RunOptions::default()
    };
    let grads = run_cpu(&plan, &opts).expect("runs").grads.expect("grads");
    let delta = 2e-3f32;
    let mut checked = 0;
    for (name, g) in grads.iter().filter(|(n, _)| n.starts_with("layers.0.")) {
        let imax = (0..g.len())
            .max_by(|&a, &b| g[a].abs().total_cmp(&g[b].abs()))
            .expect("elements");
        let mut idx: Vec<usize> = (0..4).map(|k| (k * 7919 + 13) % g.len()).collect();
        idx.push(imax);
        let gmax = g[imax].abs() as f64;
        assert!(gmax > 0.0, "{name}: no gradient");
        for i in idx {
            let up = loss(&plan, vec![(name.clone(), i, delta)]);
            let down = loss(&plan, vec![(name.clone(), i, -delta)]);
            let fd = (up - down) / (2.0 * delta as f64);
            let err = (fd - g[i] as f64).abs();
            assert!(
                err <= 2e-3 * gmax.max(1e-3) + 2e-5,
                "{name}[{i}]: analytic {} vs finite difference {fd}",
                g[i]
            );
            checked += 1;
        }
    }
    // in_proj, conv1d, A_log, D, dt_bias, the gated norm, out_proj and the pre-norm.
    assert!(checked >= 8 * 5, "{checked}");
}

/// The small test model (`config`) as the 4-layer hybrid "M*M-" (Mamba: 8 heads of 16
/// channels, 2 groups of state 8, chunk 8 over 32 tokens).
pub fn hybrid_config(mix: &Mix) -> Value {
    let mut v = config(mix, 4, true, "rmsnorm", "swiglu");
    let m = &mut v["model"];
    m["num_layers"] = 4.into();
    m["hybrid_layer_pattern"] = "M*M-".into();
    m["mamba"] = json!({"num_heads": 8, "head_dim": 16, "state_dim": 8, "num_groups": 2,
        "conv_kernel": 4, "chunk_size": 8});
    v
}

/// TP 2 with SP (and with full recompute), DP 2 with ZeRO 1, PP 2 under 1F1B and ZB-V (whose
/// W actions hold the mixer's weight-gradient tasks).
fn mixes() -> Vec<Mix> {
    vec![
        Mix::tp2_sp(),
        Mix {
            recompute: "full",
            ..Mix::tp2_sp()
        },
        Mix::dp2(1),
        Mix::pp2("1f1b", 1),
        Mix::pp2("zb-v", 2),
    ]
}

/// All of them at once, with ZeRO 3 and full recompute. Its memory is not compared: the
/// engine sizes ZeRO-3's two gathered parameter sets as twice the rank's largest layer, which
/// a stage of unlike hybrid layers (attention and a Mamba-2 mixer) does not hold at once.
fn combined() -> Mix {
    Mix {
        tp: 2,
        sp: true,
        dp: 2,
        zero: 3,
        recompute: "full",
        ..Mix::pp2("zb-v", 2)
    }
}

#[test]
fn a_hybrid_model_matches_its_single_rank_run() {
    let reference = run(&plan(hybrid_config(&Mix::single())), 3);
    for m in mixes().into_iter().chain([combined()]) {
        let got = run(&plan(hybrid_config(&m)), 3);
        compare(&format!("hybrid {m:?}"), &got, &reference);
    }
}

#[test]
fn hybrid_memory_is_within_2_percent_of_the_prediction() {
    let mut worst = 0.0f64;
    for m in [Mix::single()].into_iter().chain(mixes()) {
        for (rank, got, want, gb, wb) in compare_config(hybrid_config(&m)) {
            let rel = (got as f64 - want as f64).abs() / want as f64;
            worst = worst.max(rel);
            assert!(
                rel <= 0.02,
                "hybrid {m:?} rank {rank}: measured {got} vs predicted {want} ({:.2}%)\n  measured {gb}\n  predicted {wb}",
                100.0 * rel
            );
        }
    }
    eprintln!("hybrid memory: worst {:.2}%", 100.0 * worst);
}

/// The hybrid "M*ME" with 8 experts (top 2) in its last layer, as Nemotron-H's MoE variants.
fn hybrid_moe(c: &Moe) -> Value {
    let mut v = moe_config(c);
    let m = &mut v["model"];
    m["hybrid_layer_pattern"] = "M*ME".into();
    m["mamba"] = json!({"num_heads": 8, "head_dim": 16, "state_dim": 8, "num_groups": 2,
        "conv_kernel": 4, "chunk_size": 8});
    v
}

/// EP 2 with DP 2 and ZeRO 1, TP 2 + SP with expert TP 2, PP 2 ZB-V with full recompute.
fn moe_mixes() -> Vec<Moe> {
    vec![
        Moe {
            ep: 2,
            dp: 2,
            zero: 1,
            ..BASE
        },
        Moe {
            tp: 2,
            sp: true,
            ..BASE
        },
        Moe {
            pp: 2,
            vpp: 2,
            schedule: "zb-v",
            recompute: "full",
            ..BASE
        },
    ]
}

#[test]
fn a_hybrid_moe_model_matches_its_single_rank_run_and_the_memory_prediction() {
    let reference = run(&plan(hybrid_moe(&BASE)), 3);
    for c in moe_mixes() {
        let got = run(&plan(hybrid_moe(&c)), 3);
        compare(&format!("hybrid MoE {c:?}"), &got, &reference);
        // Forced balancing, as the MoE memory tests: every rank gets the engine's tokens.
        let balanced = Moe {
            force_balance: true,
            ..c
        };
        for (rank, got, want, gb, wb) in compare_config(hybrid_moe(&balanced)) {
            let rel = (got as f64 - want as f64).abs() / want as f64;
            let signed = 100.0 * (got as f64 - want as f64) / want as f64;
            eprintln!("hybrid MoE {c:?} rank {rank}: memory {signed:+.2}%");
            assert!(
                rel <= 0.02,
                "hybrid MoE {c:?} rank {rank}: measured {got} vs predicted {want}\n  {gb}\n  {wb}"
            );
        }
    }
}

/// What the executor does not run in a hybrid model is refused naming the field.
#[test]
fn unsupported_hybrid_features_are_refused_by_field() {
    let mut v = hybrid_config(&Mix::single());
    v["model"]["add_bias_linear"] = true.into();
    let e = parsim::lower::lower(&resolve(v), &options())
        .expect_err("refused")
        .to_string();
    assert!(e.starts_with("model.add_bias_linear"), "{e}");
}

/// The mixed-precision recipe runs the mixer too (bf16 activations, fp32 dt and its decay and
/// chunk states): the single-rank run's loss after one step and parameters after three equal
/// fp32's within bf16's 1e-2, and it does round.
#[test]
fn the_hybrid_model_in_bf16_matches_fp32_within_bf16_tolerance() {
    use parsim_plan::plan::Precision;
    let p = plan(hybrid_config(&Mix::single()));
    let with = |precision| {
        let opts = RunOptions {
            steps: 3,
            warmup: 0,
            export_params: true,
            precision,
            ..RunOptions::default()
        };
        run_cpu(&p, &opts).expect("runs")
    };
    let (fp32, bf16) = (with(Precision::Fp32), with(Precision::Bf16));
    assert_ne!(bf16.loss[0], fp32.loss[0], "bf16 run computed in fp32");
    let l0 = (bf16.loss[0] - fp32.loss[0]).abs() / fp32.loss[0].abs();
    assert!(l0 <= 1e-2, "loss {} vs {}", bf16.loss[0], fp32.loss[0]);
    let (bp, fp) = (bf16.params.expect("params"), fp32.params.expect("params"));
    for (name, want) in &fp {
        let d = rel_diff(&bp[name], want);
        assert!(d <= 1e-2, "{name} differs by {d:e} relative");
    }
}
