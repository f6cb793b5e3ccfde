//! Communication volumes per step per GPU against hand counts.

use super::common::est;
use parsim::model::{CommKind, PerGroup};
use serde_json::json;

fn bytes(v: serde_json::Value) -> PerGroup<u64> {
    est(v).communication.per_step_bytes_per_gpu
}

#[test]
fn dp_allreduce_is_two_n_minus_one_over_n_of_the_gradients() {
    // Ring all-reduce sends 2(n-1)/n of the buffer; Llama-2-7B's fp32 gradients over n = 8.
    let b = bytes(
        json!({"model": {"preset": "llama2-7b"}, "cluster": {"num_gpus": 8},
                         "parallel": {"tp": 1, "sp": false, "zero": 0},
                         "training": {"seq_length": 1024, "global_batch_size": 8}}),
    );
    let grads = 6_738_415_616f64 * 4.0;
    assert_eq!(b[CommKind::Dp], (2.0 * 7.0 / 8.0 * grads).round() as u64);
    assert_eq!(
        b[CommKind::Tp] + b[CommKind::Cp] + b[CommKind::Pp] + b[CommKind::Ep],
        0
    );
}

#[test]
fn zero1_sends_reduce_scatter_plus_all_gather() {
    // (n-1)/n of the fp32 gradients plus (n-1)/n of the bf16 weights, once per step.
    let b = bytes(
        json!({"model": {"preset": "llama2-7b"}, "cluster": {"num_gpus": 8},
                         "parallel": {"tp": 1, "sp": false, "zero": 1},
                         "training": {"seq_length": 1024, "global_batch_size": 16}}),
    );
    let p = 6_738_415_616f64;
    assert_eq!(
        b[CommKind::Dp],
        (7.0 / 8.0 * (4.0 * p + 2.0 * p)).round() as u64
    );
}

#[test]
fn sequence_parallel_moves_the_all_reduce_volume_plus_the_backward_regather() {
    // Korthikanti et al. 2022: all-gather + reduce-scatter move what one all-reduce moves.
    // Megatron re-gathers each column-parallel input in backward: one more all-gather of
    // (t-1)/t x n h per column-parallel layer (QKV, fc1 and the output layer) per microbatch.
    let base = |sp: bool| {
        json!({"model": {"preset": "llama2-7b", "num_layers": 2}, "cluster": {"num_gpus": 4},
               "parallel": {"tp": 4, "sp": sp, "zero": 0},
               "training": {"seq_length": 1024, "global_batch_size": 1, "recompute": "none"}})
    };
    let with = bytes(base(true))[CommKind::Tp] as f64;
    let without = bytes(base(false))[CommKind::Tp] as f64;
    let (n, h, t) = (1024f64, 4096f64, 4f64);
    let unit = (t - 1.0) / t * n * h * 2.0;
    let regather = (2.0 * 2.0 + 1.0) * unit;
    // With SP the embedding's all-reduce becomes a reduce-scatter + all-gather (same volume),
    // and the replicated norm weights' gradients are all-reduced once per step.
    let norms = 2.0 * (t - 1.0) / t * ((2 * 2 + 1) as f64 * 4096.0 * 4.0);
    assert!(
        (with - without - regather - norms).abs() <= 2.0,
        "{with} {without}"
    );
}

#[test]
fn ring_attention_passes_kv_cp_minus_one_times_each_way() {
    // Per layer and microbatch: K and V of the local shard (n/cp tokens, g heads of d) cross
    // cp-1 hops forward; K/V and dK/dV cross cp-1 hops backward: 3(cp-1) x 2 x (n/cp) g d x 2.
    let cp = 4u64;
    let b = bytes(
        json!({"model": {"preset": "llama3-8b", "num_layers": 2}, "cluster": {"num_gpus": cp},
                         "parallel": {"tp": 1, "sp": false, "cp": cp, "cp_comm": "p2p", "zero": 0},
                         "training": {"seq_length": 8192, "global_batch_size": 1, "recompute": "none"}}),
    );
    let kv = 2 * (8192 / cp) * 8 * 128 * 2;
    assert_eq!(b[CommKind::Cp], 2 * 3 * (cp - 1) * kv);
}

#[test]
fn expert_all_to_all_moves_top_k_copies() {
    // Dispatch and combine, forward and backward: 4 x (ep-1)/ep x n k h x 2 per MoE layer.
    let ep = 8u64;
    let b = bytes(
        json!({"model": {"preset": "mixtral-8x7b", "num_layers": 1}, "cluster": {"num_gpus": ep},
                         "parallel": {"tp": 1, "sp": false, "ep": ep, "zero": 0},
                         "training": {"seq_length": 4096, "global_batch_size": 8, "recompute": "none"}}),
    );
    let per_mb = 4.0 * (ep as f64 - 1.0) / ep as f64 * (4096.0 * 2.0 * 4096.0 * 2.0);
    assert_eq!(b[CommKind::Ep], per_mb.round() as u64);
}
