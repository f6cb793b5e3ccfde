//! Issue #33 part 5: the assumptions behind a large hybrid run, Llama 3 405B on 16,384 H100s
//! (TP 8 with SP, PP 16, interleaved, one layer fewer on the first and last stages, DP 128;
//! Llama 3 paper, "The Llama 3 Herd of Models", sec. 3.3.2 and Table 4), each checked against
//! what the frameworks do rather than against the paper's end-to-end figure (which parsim
//! does not fit):
//! - the interleaved schedule's warm-up and cool-down shrink as 1/v (Narayanan et al. 2021,
//!   "Efficient Large-Scale Language Model Training on GPU Clusters", sec. 2.2.2: bubble
//!   (p-1)/(v m) of the ideal time);
//! - every microbatch crosses every chunk boundary once forward and once backward, each send
//!   the sequence-parallel activation (s/tp x h bf16 values: Megatron-Core sends the SP shard);
//! - the gradient reduction runs once a step, after each rank's own last backward: its time
//!   does not grow with the microbatches or the interleaving (tests/engine/fsdp.rs checks the
//!   per-step reduce-scatter of torch FSDP2 under pipelining by hand).

use super::common::est;
use parsim::model::CommKind;
use serde_json::{json, Value};

/// Megatron-Core layouts of 126 layers on 16 x v virtual stages, the embedding and loss in
/// the first and last (one layer fewer on the first and last ranks' outer chunks).
fn layout(vpp: u32) -> &'static str {
    match vpp {
        2 => "Et*3|(tttt|)*30,tttL",
        4 => "Et|(tt|)*62,tL",
        _ => "E|(t|)*126,L",
    }
}

fn llama3(vpp: u32, gbs: u32, zero: u8) -> Value {
    json!({
        "model": {"preset": "llama3-405b"},
        "cluster": {"num_gpus": 16384, "gpu": "h100-sxm"},
        "parallel": {"tp": 8, "pp": 16, "vpp": vpp, "schedule": "interleaved-1f1b",
            "pipeline_layout": layout(vpp), "zero": zero},
        "training": {"seq_length": 8192, "global_batch_size": gbs, "micro_batch_size": 1}
    })
}

#[test]
fn pipeline_sends_are_one_sp_activation_per_chunk_boundary_and_microbatch() {
    // m = 2048 / 128 = 16 microbatches. A middle rank sends each microbatch's output forward
    // and its input gradient backward at every one of its v chunks: 2 m v sends of
    // (8192 / 8) x 16,384 x 2 bytes = 32 MiB.
    let send = 8192 / 8 * 16_384 * 2u64;
    assert_eq!(send, 32 << 20);
    for vpp in [2u64, 4, 8] {
        let e = est(llama3(vpp as u32, 2048, 1));
        assert_eq!(e.schedule.microbatches, 16);
        assert_eq!(
            e.communication.per_step_bytes_per_gpu[CommKind::Pp],
            2 * 16 * vpp * send,
            "vpp {vpp}"
        );
    }
}

#[test]
fn interleaving_divides_warm_up_and_cool_down_by_v() {
    // The same ranks' work in v = 2 and v = 4 chunks: the per-microbatch time of a rank is
    // unchanged, so the warm-up and cool-down halve ((p-1)/(v m) of it).
    let (v2, v4) = (est(llama3(2, 2048, 1)), est(llama3(4, 2048, 1)));
    let (w2, w4) = (v2.time.warmup_cooldown_s, v4.time.warmup_cooldown_s);
    assert!((w2 / w4 - 2.0).abs() < 0.01, "{w2} {w4}");
    // And the ideal-time fraction is (p-1)/(v m) = 15/64 at v = 4, m = 16, of the critical
    // rank's own work (compute and exposed communication), to within the stage imbalance
    // the layout's shorter outer stages leave (one layer in eight).
    let t = &v4.time;
    let per_rank = t.compute_s + t.exposed_comm_s;
    let want = 15.0 / 64.0 * per_rank;
    assert!(
        (t.warmup_cooldown_s / want - 1.0).abs() < 0.125,
        "{} against {want}",
        t.warmup_cooldown_s
    );
}

#[test]
fn gradient_reduction_runs_once_a_step_after_each_ranks_last_backward() {
    // Megatron-Core's distributed optimizer (ZeRO-1): its schedules disable gradient sync
    // until each chunk's last microbatch, so the tail after the last backward is the same
    // whatever the microbatch count or the interleaving; and the per-step traffic on the
    // data-parallel group does not grow with the microbatches.
    let base = est(llama3(4, 2048, 1));
    for other in [est(llama3(2, 2048, 1)), est(llama3(4, 4096, 1))] {
        assert!(
            (other.time.dp_tail_s / base.time.dp_tail_s - 1.0).abs() < 1e-9,
            "{} {}",
            other.time.dp_tail_s,
            base.time.dp_tail_s
        );
        assert_eq!(
            other.communication.per_step_bytes_per_gpu[CommKind::Dp],
            base.communication.per_step_bytes_per_gpu[CommKind::Dp]
        );
    }
    // ZeRO-2 outside DeepSpeed and torch FSDP2's pipelining is Megatron-FSDP's optim_grads,
    // which reduce-scatters every microbatch: 16 of them, and at 32 microbatches 32.
    let z2 = |gbs| est(llama3(4, gbs, 2)).communication.per_step_bytes_per_gpu[CommKind::Dp];
    let (a, b) = (z2(2048), z2(4096));
    assert!(b > a && b < 2 * a, "{a} {b}");
}
