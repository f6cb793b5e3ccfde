//! ZeRO 0/1 gradient buckets during backward (Megatron-Core's DDP with `overlap_grad_reduce`,
//! `parallel.ddp_bucket_size`): the trace of the CPU backend, which plays the same generic
//! runner as CUDA, shows each bucket reduced inside the last microbatch's backward, in reverse
//! layer order, before the backward of the layers below it; nothing is left for the optimizer
//! step but the sequence-parallel norm sums over TP; and the parameters after three steps are
//! those of the run that reduces the whole gradient at the step.

use super::common::{config, plan, rel_diff, Mix};
use super::moe::{moe_config, BASE};
use parsim_executor::runner::{run_cpu, RunOptions};
use parsim_executor::trace::Clock;
use parsim_plan::plan::{Action, Plan, RankPlan};
use parsim_plan::trace::{EventKind, RankTrace};
use parsim_plan::GroupKind;
use parsim_plan::RunReport;
use serde_json::Value;

/// The small model's parameters per TP rank at TP 2 (hidden 64, 8 heads and 4 KV heads of 8,
/// FFN 128 SwiGLU, vocab 128, RMSNorm, no biases): a layer is attention norm 64, QKV
/// (32 + 16 + 16) x 64 = 4096, projection 64 x 32 = 2048, MLP norm 64, FC1 (2 x 64) x 64 =
/// 8192, FC2 64 x 64 = 4096: 18560; the output block the final norm 64 and 64 x 64 of the
/// vocabulary: 4160; the embedding 64 x 64 = 4096.
const LAYER: u64 = 18560;
const OUTPUT: u64 = 4160;
const EMBEDDING: u64 = 4096;

fn with_bucket(mut v: Value, params: u64) -> Value {
    v["parallel"]["ddp_bucket_size"] = params.into();
    v
}

fn tp2_sp_dp2(zero: u8) -> Mix {
    Mix {
        tp: 2,
        sp: true,
        dp: 2,
        zero,
        ..Mix::single()
    }
}

fn traced(plan: &Plan) -> Vec<RankTrace> {
    let r = run_cpu(
        plan,
        &RunOptions {
            steps: 2,
            warmup: 1,
            trace: Some(Clock::new()),
            ..RunOptions::default()
        },
    )
    .unwrap_or_else(|e| panic!("runs: {e}"));
    r.traces.expect("traces")
}

/// (action index, op, group, bytes) of one recorded collective.
pub(super) type Collective = (usize, String, Vec<u32>, u64);

/// A timed step's collectives in call order, each with the index of the action it ran in:
/// (action index, op, group, bytes).
pub(super) fn collectives(t: &RankTrace) -> Vec<Collective> {
    let mut at = None;
    let mut out = Vec::new();
    for e in &t.events {
        match &e.kind {
            EventKind::Action { index, .. } => at = Some(*index),
            EventKind::Collective { op, group, bytes } => out.push((
                at.expect("a collective inside an action"),
                op.to_string(),
                group.clone(),
                *bytes,
            )),
            _ => {}
        }
    }
    out
}

/// A gradient reduction over the rank's DP group (not ZeRO 1's parameter all-gather).
pub(super) fn is_reduction(c: &Collective, rp: &RankPlan) -> bool {
    c.2 == rp.groups.get(GroupKind::DpCp) && (c.1 == "all_reduce" || c.1 == "reduce_scatter")
}

/// Each block its own bucket (`ddp_bucket_size` = 1), TP 2 + SP x DP 2, 2 microbatches a DP
/// rank: in the second (last) backward, 10 DP reductions of the output block, layers 7 to 0
/// and the embedding, in that order, with bytes 4 x the block's parameters (fp32 gradients),
/// all-reduce under ZeRO 0 and reduce-scatter under ZeRO 1; between two of them the next
/// block's TP collectives (its backward ran after the bucket was issued); none in forward,
/// the first backward or the optimizer step, which keeps only the SP norm sums over TP (2 a
/// layer and the final norm, h x 4 bytes each).
#[test]
fn timeline_grad_buckets_reduce_in_the_last_backward_in_reverse_layer_order() {
    for (zero, op) in [(0u8, "all_reduce"), (1, "reduce_scatter")] {
        let p = plan(with_bucket(
            config(&tp2_sp_dp2(zero), 4, true, "rmsnorm", "swiglu"),
            1,
        ));
        let traces = traced(&p);
        let mut want = vec![OUTPUT];
        want.extend([LAYER; 8]);
        want.push(EMBEDDING);
        let want: Vec<u64> = want.into_iter().map(|n| n * 4).collect();
        for (rp, t) in p.ranks.iter().zip(&traces) {
            let all = collectives(t);
            let last_b = rp
                .actions
                .iter()
                .rposition(|a| matches!(a, Action::Backward { .. }))
                .expect("a backward");
            let dp: Vec<_> = all.iter().filter(|c| is_reduction(c, rp)).collect();
            assert!(
                dp.iter().all(|c| c.0 == last_b && c.1 == op),
                "zero {zero} rank {}: DP collectives outside the last backward: {dp:?}",
                rp.rank
            );
            let bytes: Vec<u64> = dp.iter().map(|c| c.3).collect();
            assert_eq!(bytes, want, "zero {zero} rank {}", rp.rank);
            // Between consecutive buckets, the next block's backward: TP collectives.
            let pos: Vec<usize> = all
                .iter()
                .enumerate()
                .filter(|(_, c)| is_reduction(c, rp))
                .map(|(i, _)| i)
                .collect();
            for w in pos.windows(2) {
                assert!(
                    all[w[0] + 1..w[1]]
                        .iter()
                        .any(|c| c.2 == rp.groups.get(GroupKind::Tp)),
                    "zero {zero} rank {}: buckets {w:?} with no backward between: {all:?}",
                    rp.rank
                );
            }
            let opt = rp
                .actions
                .iter()
                .position(|a| *a == Action::OptimizerStep)
                .expect("an optimizer step");
            let at_step: Vec<_> = all.iter().filter(|c| c.0 == opt).collect();
            let norms = at_step
                .iter()
                .filter(|c| {
                    c.1 == "all_reduce" && c.2 == rp.groups.get(GroupKind::Tp) && c.3 == 64 * 4
                })
                .count();
            assert_eq!(norms, 2 * 8 + 1, "zero {zero}: {at_step:?}");
            // ZeRO 1 all-gathers the updated shards over DP: every parameter, fp32.
            let gathers = at_step
                .iter()
                .filter(|c| c.1 == "all_gather" && c.2 == rp.groups.get(GroupKind::DpCp))
                .map(|c| c.3)
                .collect::<Vec<_>>();
            let total = (OUTPUT + 8 * LAYER + EMBEDDING) * 4;
            let want_gathers = if zero == 1 { vec![total] } else { Vec::new() };
            assert_eq!(gathers, want_gathers, "zero {zero}: {at_step:?}");
            assert_eq!(at_step.len(), norms + gathers.len(), "{at_step:?}");
        }
    }
}

/// Buckets of at least 40,000 parameters, walking back: output + layers 7, 6 = 41,280 closes
/// the first, layers 5-3 = 55,680 the second and layers 2-0 the third; the embedding's 4,096
/// is the last (Megatron-Core closes a bucket once it reaches `bucket_size`).
#[test]
fn timeline_grad_buckets_group_whole_layers_up_to_the_bucket_size() {
    let p = plan(with_bucket(
        config(&tp2_sp_dp2(1), 4, true, "rmsnorm", "swiglu"),
        40_000,
    ));
    let traces = traced(&p);
    let want: Vec<u64> = [OUTPUT + 2 * LAYER, 3 * LAYER, 3 * LAYER, EMBEDDING]
        .into_iter()
        .map(|n| n * 4)
        .collect();
    for (rp, t) in p.ranks.iter().zip(&traces) {
        let got: Vec<u64> = collectives(t)
            .into_iter()
            .filter(|c| is_reduction(c, rp))
            .map(|c| c.3)
            .collect();
        assert_eq!(got, want, "rank {}", rp.rank);
    }
}

fn three_steps(plan: &Plan) -> RunReport {
    run_cpu(
        plan,
        &RunOptions {
            steps: 3,
            warmup: 0,
            export_params: true,
            ..RunOptions::default()
        },
    )
    .unwrap_or_else(|e| panic!("runs: {e}"))
}

/// The bucketed reduction gives the parameters of the reduction at the step (the same sums,
/// in another grouping where SP norms are summed over DP before TP: 1e-5 relative) under
/// ZeRO 0 and 1, for TP + SP, 1F1B, interleaved 1F1B, ZB-H1's split backward (buckets in the
/// W actions), tied embeddings over PP, and an EP 2 MoE (the experts' buckets over expert DP).
#[test]
fn grad_buckets_leave_the_parameters_of_the_reduction_at_the_step() {
    let mix = |pp: u32, vpp: u32, schedule: &'static str, zero: u8| Mix {
        pp,
        vpp,
        schedule,
        dp: 2,
        zero,
        ..Mix::single()
    };
    let mut tied = config(&mix(2, 1, "1f1b", 1), 8, true, "rmsnorm", "swiglu");
    tied["model"]["tied_embeddings"] = true.into();
    let mut moe = BASE;
    (moe.ep, moe.dp, moe.zero) = (2, 2, 1);
    let cases = [
        (
            "tp2+sp dp2 zero0",
            config(&tp2_sp_dp2(0), 4, true, "rmsnorm", "swiglu"),
        ),
        (
            "tp2+sp dp2 zero1",
            config(&tp2_sp_dp2(1), 4, true, "rmsnorm", "swiglu"),
        ),
        (
            "pp2 1f1b zero0",
            config(&mix(2, 1, "1f1b", 0), 8, true, "rmsnorm", "swiglu"),
        ),
        (
            "pp2 vpp2 interleaved zero1",
            config(
                &mix(2, 2, "interleaved-1f1b", 1),
                8,
                true,
                "rmsnorm",
                "swiglu",
            ),
        ),
        (
            "pp2 zb-h1 zero1",
            config(&mix(2, 1, "zb-h1", 1), 8, true, "rmsnorm", "swiglu"),
        ),
        ("pp2 tied zero1", tied),
        ("moe ep2 dp2 zero1", moe_config(&moe)),
    ];
    for (label, v) in cases {
        for bucket in [1u64, 40_000] {
            let bucketed = plan(with_bucket(v.clone(), bucket));
            assert!(bucketed.parallel.grad_bucket_params.is_some(), "{label}");
            let mut at_step = bucketed.clone();
            at_step.parallel.grad_bucket_params = None;
            let (got, want) = (three_steps(&bucketed), three_steps(&at_step));
            for (a, b) in got.loss.iter().zip(&want.loss) {
                assert!((a - b).abs() <= 1e-5 * b.abs(), "{label}: loss {a} vs {b}");
            }
            let (gp, wp) = (got.params.expect("params"), want.params.expect("params"));
            assert_eq!(gp.len(), wp.len());
            for ((name, g), (_, w)) in gp.iter().zip(&wp) {
                let e = rel_diff(g, w);
                assert!(e < 1e-5, "{label} bucket {bucket}: {name}: {e}");
            }
        }
    }
}

/// Without `overlap_grad_reduce` the whole gradient is reduced at the optimizer step: one DP
/// reduce-scatter there, none in backward.
#[test]
fn timeline_without_overlap_grad_reduce_reduces_at_the_step() {
    let mut v = config(&tp2_sp_dp2(1), 4, true, "rmsnorm", "swiglu");
    v["parallel"]["overlap_grad_reduce"] = false.into();
    let p = plan(v);
    assert_eq!(p.parallel.grad_bucket_params, None);
    let traces = traced(&p);
    for (rp, t) in p.ranks.iter().zip(&traces) {
        let opt = rp
            .actions
            .iter()
            .position(|a| *a == Action::OptimizerStep)
            .expect("an optimizer step");
        let dp: Vec<_> = collectives(t)
            .into_iter()
            .filter(|c| is_reduction(c, rp))
            .collect();
        assert_eq!(dp.len(), 1, "{dp:?}");
        assert_eq!(dp[0].0, opt);
    }
}
