//! What the Muon optimizer takes of a block (Jordan et al. 2024, "Muon: An optimizer for
//! hidden layers"; Liu et al. 2025, "Muon is Scalable for LLM Training"), as Megatron-Core
//! splits it (megatron/core/optimizer/muon.py, `get_megatron_muon_optimizer`): every trainable
//! 2-D weight but the embedding and the output layer goes to Muon, one momentum buffer each;
//! norms, biases, embeddings and the output layer stay with Adam.
//!
//! The update orthogonalises each matrix's momentum by Newton-Schulz iterations (Emerging-
//! Optimizers' `newton_schulz_step`: A = X X^T, B = bA + cA A, X = aX + B X, on X oriented so
//! its rows are the shorter side, m <= n): 2m^2 n + 2m^3 + 2m^2 n = 4m^2 n + 2m^3 FLOPs an
//! iteration, [`NS_STEPS`] iterations a step. Under tensor parallelism Megatron-Bridge's
//! default `muon_tp_mode = "blockwise"` orthogonalises each rank's shard on its own (no
//! gather), so the shapes are this rank's shards; `muon_split_qkv` (on by default) treats the
//! fused QKV weight as its query, key and value matrices.

use super::op::{Op, OpKind, ParamClass};
use super::Block;

/// Newton-Schulz iterations a step (Megatron's `--muon-num-ns-steps`, default 5).
pub const NS_STEPS: u64 = crate::config::MUON_NS_STEPS;

/// This rank's Muon share of a block.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct MuonSums {
    /// Trainable matrix elements Muon updates: non-expert and routed-expert.
    pub dense: u64,
    pub expert: u64,
    /// Newton-Schulz FLOPs of one optimizer step on this rank's shards.
    pub ns_flops: f64,
}

/// FLOPs of one Newton-Schulz iteration on an `rows` x `cols` matrix (either orientation).
pub fn ns_iteration_flops(rows: u64, cols: u64) -> f64 {
    let (m, n) = (rows.min(cols) as f64, rows.max(cols) as f64);
    4.0 * m * m * n + 2.0 * m * m * m
}

/// The matrices Muon updates in an op: `(copies, elements of each)`, a trainable matmul's
/// weight `k` x `n` a copy (the routed experts hold one a local expert; a bias in the same op
/// stays with Adam), but the output layer's.
pub fn matrices(o: &Op) -> Option<(u64, u64)> {
    let (OpKind::Matmul { n, k, .. }, Some(p)) = (o.kind, o.params) else {
        return None;
    };
    if !p.trainable || o.name == "output.layer" || n * k == 0 {
        return None;
    }
    let copies = p.rank / (n * k);
    (copies > 0).then_some((copies, n * k))
}

impl MuonSums {
    /// The block's matrices on this rank: each trainable matmul's weight, `k` x `n` a copy
    /// (the routed experts hold one a local expert; a bias in the same op stays with Adam).
    /// `heads` and `groups` split the fused QKV weight into its query, key and value parts.
    pub fn of(b: &Block, heads: u64, groups: u64) -> MuonSums {
        let mut s = MuonSums::default();
        for o in &b.ops {
            let (Some((copies, _)), OpKind::Matmul { n, k, .. }, Some(p)) =
                (matrices(o), o.kind, o.params)
            else {
                continue;
            };
            let elements = copies * n * k;
            if p.class == ParamClass::Expert {
                s.expert += elements;
            } else {
                s.dense += elements;
            }
            let per_copy = if o.name == "attn.qkv" && heads + 2 * groups > 0 {
                let q = n * heads / (heads + 2 * groups);
                let kv = (n - q) / 2;
                ns_iteration_flops(q, k) + 2.0 * ns_iteration_flops(kv, k)
            } else {
                ns_iteration_flops(n, k)
            };
            s.ns_flops += copies as f64 * per_copy * NS_STEPS as f64;
        }
        s
    }

    pub fn add(&mut self, o: &MuonSums, times: u64) {
        self.dense += o.dense * times;
        self.expert += o.expert * times;
        self.ns_flops += o.ns_flops * times as f64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_iteration_is_three_matmuls_on_the_short_side() {
        // X 2 x 3 (m 2, n 3): X X^T 2*2*3*2 = 24, A A 2*2*2*2 = 16, B X 2*2*2*3 = 24.
        assert_eq!(ns_iteration_flops(2, 3), 64.0);
        assert_eq!(ns_iteration_flops(3, 2), 64.0);
    }
}
