//! torchtitan's per-op selective activation checkpointing (`activation_checkpoint.mode =
//! "selective"`, `selective_ac_option = "op"`): torchtitan/distributed/activation_checkpoint.py
//! `_apply_op_sac` wraps each transformer block in one checkpoint whose policy keeps the
//! outputs of the ops on llama3's `_op_sac_save_list` (torchtitan/models/llama3/infra/
//! parallelize.py: `aten.mm`, the SDPA kernels, `reduce_scatter_tensor`, `aten.max`) but for
//! every second matmul, and recomputes everything else. The block's matmuls run wq, wk, wv,
//! wo, w1, w3, w2, so wq, wv, w1 and w2 are kept and wk, wo and w3 rerun (torchtitan's later
//! policy names the same four: `save_mm_modules = {"wq", "wv", "w1", "w2"}` for Llama3).
//!
//! Between a layer's forward and backward it then holds: its input (the checkpoint's), the
//! outputs of wq and wv, the attention's output and log-sum-exp, w1's output, w2's output
//! (before its reduction over TP) and, with sequence parallelism, the reduce-scattered
//! outputs of wo and w2. The backward's recompute reruns the norms, wk (its share of the fused
//! QKV projection), RoPE, wo, w3 (half the fused fc1), the activation, and the sequence-
//! parallel all-gathers, whose outputs are not kept; it rebuilds the rest of the layer's
//! tensors at once, held through the layer's backward.

use super::dims::Dims;
use super::op::{Op, OpKind, PartialRerun, Saved, TensorRole};

/// Marks one dense layer's ops (forward order) as torchtitan's per-op policy saves and reruns
/// them. The configuration rules admit the policy on the layer it describes: llama3's (no
/// biases, SwiGLU, flash attention, no dropout, no CP, sequence parallelism with TP).
pub fn apply(ops: &mut [Op], d: &Dims) {
    let reduce_scattered = d.t > 1 && d.sp;
    let (a_r, g_r) = (d.a / d.t, d.g / d.t);
    let mut rebuilt = 0;
    for o in ops.iter_mut() {
        for s in &mut o.saved {
            let kept = (o.name == "attn.norm" && s.role == TensorRole::Input)
                || (o.name == "attn.core" && s.role == TensorRole::SoftmaxLse);
            s.selective = !kept;
            if !kept {
                rebuilt += s.bytes;
            }
        }
        o.recomputed_by_selective = true;
        let output = |bytes: u64| Saved {
            role: TensorRole::Output,
            bytes,
            selective: false,
        };
        match o.name {
            "attn.qkv" => {
                // wq's and wv's outputs kept; wk reruns, and the all-gather of its input.
                let row = d.n * d.d * d.act;
                o.saved.push(output(row * a_r));
                o.saved.push(output(row * g_r));
                o.partial_rerun = Some(PartialRerun {
                    compute_share: d.g as f64 / (d.a + 2 * d.g) as f64,
                    comms: true,
                });
            }
            "attn.core" => {
                o.recomputed_by_selective = false;
                o.saved.push(output(d.n * a_r * d.d * d.act));
            }
            "attn.proj" => {
                // wo reruns; its reduce-scattered output is kept.
                if reduce_scattered {
                    o.saved.push(output(d.n_sp * d.h * d.act));
                }
                o.partial_rerun = Some(PartialRerun {
                    compute_share: 1.0,
                    comms: !reduce_scattered,
                });
            }
            "mlp.fc1" => {
                // w1's output kept (the first half of the fused w1|w3); w3 reruns.
                if let OpKind::Matmul { m, n, .. } = o.kind {
                    o.saved.push(output(m * (n / 2) * d.act));
                }
                o.partial_rerun = Some(PartialRerun {
                    compute_share: 0.5,
                    comms: true,
                });
            }
            "mlp.fc2" => {
                o.recomputed_by_selective = false;
                if let OpKind::Matmul { m, n, .. } = o.kind {
                    o.saved.push(output(m * n * d.act));
                }
                if reduce_scattered {
                    o.saved.push(output(d.n_sp * d.h * d.act));
                }
            }
            _ => {}
        }
    }
    // The recompute rebuilds the dropped tensors before the layer's backward, which holds
    // them from its first op (the layer's last).
    if let Some(last) = ops.last_mut() {
        last.backward_scratch_bytes += rebuilt;
    }
}

#[cfg(test)]
mod tests {
    use crate::config::{Config, Layer, Recompute, Resolved};
    use crate::model::Ledger;

    /// llama3 8B (h 4096, 32 heads, 8 KV heads of 128, SwiGLU 14336) at TP 2 with sequence
    /// parallelism, one 8192-token sequence in bf16.
    fn ledger(modules: &[&str]) -> Ledger {
        let v = serde_json::json!({
            "model": {"preset": "llama3-8b"},
            "cluster": {"num_gpus": 2},
            "parallel": {"tp": 2, "sp": true},
            "training": {"seq_length": 8192, "micro_batch_size": 1, "global_batch_size": 1,
                         "framework": "fsdp", "recompute": "selective",
                         "recompute_modules": modules}
        });
        let cfg = Config::from_layers(&[Layer::overrides(v)]).expect("loads");
        Ledger::build(&Resolved::new(cfg).expect("validates"))
    }

    /// One layer keeps, in bf16 (2 bytes), by hand from the save list: its input (n/t x h),
    /// wq's output (n x 16 heads x 128), wv's (n x 4 x 128), the attention output (n x 16 x
    /// 128), w1's (n x 14336/2), w2's before the reduce-scatter (n x h) and the two
    /// reduce-scattered outputs of wo and w2 (n/t x h each); plus the fp32 log-sum-exp
    /// (16 heads x n x 4 bytes).
    #[test]
    fn a_layer_keeps_exactly_the_save_lists_outputs() {
        let (n, n_sp, h) = (8192u64, 4096u64, 4096u64);
        let elements =
            n_sp * h + n * 16 * 128 + n * 4 * 128 + n * 16 * 128 + n * 7168 + n * h + 2 * n_sp * h;
        let by_hand = 2 * elements + 16 * n * 4;
        let layer = ledger(&["per_op"]).dense;
        assert_eq!(layer.saved_bytes(Recompute::Selective), by_hand);
        // Everything else the layer saved is rebuilt and held from its first backward op.
        let plain = ledger(&["core_attn"]).dense;
        let kept_of_ledger = n_sp * h * 2 + 16 * n * 4;
        let scratch = |l: &crate::model::Block| l.ops.last().unwrap().backward_scratch_bytes;
        assert_eq!(
            scratch(&layer) - scratch(&plain),
            plain.saved_all_bytes() - kept_of_ledger
        );
    }

    /// The rerun is wk, wo and w3 of the matmuls, by hand: 2 n h (4 x 128) / t + 2 n (16 x
    /// 128) h / t + 2 n h 14336 / t FLOPs on this rank.
    #[test]
    fn the_rerun_is_wk_wo_and_w3() {
        let (n, h, t) = (8192f64, 4096f64, 2f64);
        let wk = 2.0 * n * h * 8.0 * 128.0 / t;
        let wo = 2.0 * n * 32.0 * 128.0 * h / t;
        let w3 = 2.0 * n * h * 14336.0 / t;
        let (_, rank) = ledger(&["per_op"])
            .dense
            .recompute_flops(Recompute::Selective);
        assert!(
            (rank - (wk + wo + w3)).abs() <= 1e-9 * rank,
            "{rank} vs {}",
            wk + wo + w3
        );
    }
}
