//! `execute --profile-ops` (`RunOptions::profile_ops`): the op timings of a run sum with the
//! host gaps to the actions' times, and their keys are the model's, derived here from its
//! shape and the parallel mix: each GEMM's (m, n, k) and call count, and each collective's
//! group and bytes.

use super::common::{config, plan, Mix};
use parsim_executor::runner::{run_cpu, RunOptions};
use parsim_plan::op_timing::{CollectiveKind, OpKey, Placement};
use parsim_plan::plan::Plan;
use parsim_plan::DType;
use parsim_plan::RunReport;
use std::collections::BTreeMap;

/// Runs `plan` for `steps` steps (one warm-up), profiling ops.
fn profiled(plan: &Plan, steps: u32) -> RunReport {
    run_cpu(
        plan,
        &RunOptions {
            steps,
            warmup: 1,
            profile_ops: true,
            ..RunOptions::default()
        },
    )
    .unwrap_or_else(|e| panic!("runs: {e}"))
}

#[test]
fn op_times_and_host_gaps_sum_to_the_action_times() {
    // TP 2 with SP over 2 pipeline stages: GEMMs, attention, memory ops, TP collectives and
    // pipeline messages on every rank.
    let mix = Mix {
        tp: 2,
        sp: true,
        pp: 2,
        ..Mix::single()
    };
    let steps = 3;
    let r = profiled(&plan(config(&mix, 4, true, "rmsnorm", "swiglu")), steps);
    for k in &r.ranks {
        assert!(!k.ops.is_empty(), "rank {} recorded no ops", k.rank);
        for t in &k.ops {
            t.validate()
                .unwrap_or_else(|e| panic!("rank {}: {t:?}: {e}", k.rank));
        }
        let ops_s: f64 = k.ops.iter().map(|t| t.total_s).sum();
        // The phases are the actions' times per timed step.
        let p = &k.phases;
        let timed = (steps - 1) as f64;
        let actions_s =
            timed * (p.forward_s + p.backward_s + p.backward_weight_s + p.p2p_s + p.optimizer_s);
        let gap = k.ops.iter().find(|t| t.key == OpKey::HostGap).unwrap();
        // Within the clock's resolution per action (one host gap record per action).
        let tol = 1e-6 * gap.calls as f64;
        assert!(
            (ops_s - actions_s).abs() <= tol,
            "rank {}: ops {ops_s} s, actions {actions_s} s",
            k.rank
        );
        let step_s: f64 = k.step_s.iter().sum();
        assert!(
            ops_s <= step_s + tol,
            "rank {}: ops {ops_s} s > steps {step_s} s",
            k.rank
        );
        for class in ["gemm", "attention", "memory", "collective"] {
            assert!(
                k.ops
                    .iter()
                    .any(|t| format!("{:?}", t.key).to_lowercase().starts_with(class)),
                "rank {}: no {class} op",
                k.rank
            );
        }
    }
}

#[test]
fn gemm_keys_and_calls_follow_the_model_and_the_tp_split() {
    // TP 2, no SP, 2 microbatches, one timed step. Per TP rank (Megatron's split): QKV
    // [(8 + 2 x 4) x 8 / 2 = 64] x 64 and FC1 [2 x 128 / 2 = 128] x 64 split their outputs
    // (n), the projection 64 x [64 / 2 = 32] and FC2 64 x [128 / 2 = 64] their inputs (k); the
    // vocab-parallel head [128 / 2 = 64] x 64. Rows m = seq x micro batch = 32.
    let mix = Mix {
        tp: 2,
        ..Mix::single()
    };
    let r = profiled(&plan(config(&mix, 2, true, "rmsnorm", "swiglu")), 2);
    let (layers, mbs, m) = (8, 2, 32);
    // (inputs i, outputs o, how many per microbatch) of each linear layer forward.
    let linears = [
        (64, 64, layers),
        (32, 64, layers),
        (64, 128, layers),
        (64, 64, layers),
        (64, 64, 1),
    ];
    let mut want: BTreeMap<(u64, u64, u64), u64> = BTreeMap::new();
    for (i, o, count) in linears {
        // Forward y = x w^T [m, o]; backward dx = dy w [m, i] and dw = dy^T x [o, i].
        for key in [(m, o, i), (m, i, o), (o, i, m)] {
            *want.entry(key).or_default() += count * mbs;
        }
    }
    for k in &r.ranks {
        let got: BTreeMap<(u64, u64, u64), u64> = k
            .ops
            .iter()
            .filter_map(|t| match t.key {
                OpKey::Gemm { m, n, k, dtype } => {
                    assert_eq!(dtype, DType::F32);
                    Some(((m, n, k), t.calls))
                }
                _ => None,
            })
            .collect();
        assert_eq!(got, want, "rank {}", k.rank);
    }
}

#[test]
fn dp_gradient_all_reduce_moves_the_whole_gradient_over_the_dp_group() {
    // DP 2, ZeRO 0: the gradient all-reduces of a step cover every parameter once, fp32.
    // Parameters (hidden 64, 8 heads, 4 KV heads of 8, SwiGLU FFN 128, vocab 128, no biases):
    // a layer 2 x 64 (norms) + 128 x 64 (QKV) + 64 x 64 (proj) + 256 x 64 (FC1) + 64 x 128
    // (FC2) = 36992; 8 layers, the final norm 64, the head 128 x 64 and the embedding 128 x 64.
    let grads_bytes = 4 * (8 * 36992 + 64 + 2 * 128 * 64);
    let r = profiled(&plan(config(&Mix::dp2(0), 4, true, "rmsnorm", "swiglu")), 2);
    for k in &r.ranks {
        let mut reduced = 0;
        for t in &k.ops {
            if let OpKey::Collective {
                op,
                bytes,
                group_size,
                placement,
            } = t.key
            {
                assert_eq!(op, CollectiveKind::AllReduce, "rank {}: {t:?}", k.rank);
                assert_eq!(group_size, 2);
                assert_eq!(placement, Placement::IntraNode);
                reduced += bytes * t.calls;
            }
        }
        assert_eq!(reduced, grads_bytes, "rank {}", k.rank);
    }
}

#[test]
fn profiling_off_records_nothing() {
    let p = plan(config(&Mix::single(), 1, true, "rmsnorm", "swiglu"));
    let r = run_cpu(&p, &RunOptions::default()).unwrap();
    assert!(r.ranks.iter().all(|k| k.ops.is_empty()));
}
