//! Megatron-Core's layer-wise distributed optimizer, which Muon runs under as `dist_muon`
//! (Megatron-Bridge's `distributed_muon_with_cosine_annealing`; Megatron-LM's `--optimizer
//! muon --use-distributed-optimizer`; megatron/core/optimizer/layer_wise_optimizer.py,
//! `LayerWiseDistributedOptimizer`): every rank keeps the whole weights and gradients, and each
//! data-parallel rank updates whole parameters of its own, holding the fp32 master copy and
//! the optimizer state of those alone. Without a parameter layout (Megatron-Bridge builds none)
//! the parameters go to ranks by `_shard_params_ping_pong`: sorted by size, smallest first,
//! and dealt 0, 1, ..., dp-1, dp-1, ..., 0, 0, 1, ... over the data-parallel group (dp x cp),
//! the routed experts' apart over the expert data-parallel group. (Megatron-LM's own training
//! loop now supplies a layout that balances the shards by Newton-Schulz cost; parsim models the
//! ping-pong deal.)

use super::muon::matrices;
use super::op::ParamClass;
use super::optimizer::OptimizerState;
use super::Block;
use crate::config::TrainingConfig;

/// One parameter tensor as the optimizer sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StateTensor {
    pub elements: u64,
    /// A matrix Muon updates (else Adam's).
    pub muon: bool,
    /// A routed expert's (sharded over expert data parallelism).
    pub expert: bool,
}

/// The trainable parameter tensors of `blocks` (each block `n` times, in order): each Muon
/// matrix a tensor (a routed expert's per local expert), and the rest of an op's parameters
/// (biases, norms, embeddings, the output layer) a tensor of Adam's per copy.
pub fn state_tensors<'a>(blocks: impl Iterator<Item = (&'a Block, u64)>) -> Vec<StateTensor> {
    let mut out = Vec::new();
    for (b, n) in blocks {
        let mut one = Vec::new();
        for o in &b.ops {
            let Some(p) = o.params.filter(|p| p.trainable && p.rank > 0) else {
                continue;
            };
            let expert = p.class == ParamClass::Expert;
            let (copies, each) = matrices(o).unwrap_or((1, 0));
            let tensor = |elements, muon| StateTensor {
                elements,
                muon,
                expert,
            };
            let rest = (p.rank - copies * each) / copies;
            for _ in 0..copies {
                if each > 0 {
                    one.push(tensor(each, true));
                }
                if rest > 0 {
                    one.push(tensor(rest, false));
                }
            }
        }
        for _ in 0..n {
            out.extend_from_slice(&one);
        }
    }
    out
}

/// Optimizer-state bytes of the most loaded of `ranks` ranks dealt `tensors` ping-pong
/// (`_shard_params_ping_pong`): a stable sort by size, then rank 0, 1, ..., ranks - 1,
/// ranks - 1, ..., 0 over and over. One rank holds them all.
pub fn heaviest_share(t: &TrainingConfig, tensors: &[StateTensor], ranks: u64) -> u64 {
    let adam = OptimizerState::of(t);
    let muon = OptimizerState::muon(t);
    let bytes = |s: &StateTensor| {
        if s.muon {
            muon.state_bytes(s.elements)
        } else {
            adam.state_bytes(s.elements)
        }
    };
    let ranks = ranks.max(1) as usize;
    let mut sorted: Vec<&StateTensor> = tensors.iter().collect();
    sorted.sort_by_key(|s| s.elements);
    let mut load = vec![0u64; ranks];
    for (i, s) in sorted.into_iter().enumerate() {
        let turn = i % (2 * ranks);
        let rank = if turn < ranks {
            turn
        } else {
            2 * ranks - 1 - turn
        };
        load[rank] += bytes(s);
    }
    load.into_iter().max().unwrap_or(0)
}

/// A GPU's optimizer state under the layer-wise optimizer: the heaviest dense share over
/// `dense_ranks` (dp x cp) and the heaviest expert share over `expert_ranks` (expert data
/// parallelism). A GPU holds one share of each; the sum of the heaviest is the most any GPU
/// holds.
pub fn state_bytes(
    t: &TrainingConfig,
    tensors: &[StateTensor],
    dense_ranks: u64,
    expert_ranks: u64,
) -> u64 {
    let (expert, dense): (Vec<StateTensor>, Vec<StateTensor>) =
        tensors.iter().partition(|s| s.expert);
    heaviest_share(t, &dense, dense_ranks) + heaviest_share(t, &expert, expert_ranks)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tensor(elements: u64, muon: bool) -> StateTensor {
        StateTensor {
            elements,
            muon,
            expert: false,
        }
    }

    /// The docstring's example of `_shard_params_ping_pong`: 10 parameters p0..p9 (sorted)
    /// over 4 ranks go [p0, p7, p8], [p1, p6, p9], [p2, p5], [p3, p4]. With sizes 1..10 (Adam,
    /// 12 bytes each with fp32 master and moments) the ranks hold 1+8+9, 2+7+10, 3+6, 4+5
    /// elements: the heaviest 19 x 12 bytes.
    #[test]
    fn ping_pong_deals_as_megatron_documents() {
        let t = TrainingConfig::default();
        let tensors: Vec<_> = (1..=10).rev().map(|e| tensor(e, false)).collect();
        assert_eq!(heaviest_share(&t, &tensors, 4), 19 * 12);
        // One rank holds them all: 55 x 12.
        assert_eq!(heaviest_share(&t, &tensors, 1), 55 * 12);
        // Muon's matrices take the master and one momentum: 8 bytes an element.
        let m: Vec<_> = (1..=10).map(|e| tensor(e, true)).collect();
        assert_eq!(heaviest_share(&t, &m, 4), 19 * 8);
    }
}
