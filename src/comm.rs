//! Communication volume per step per GPU, by group: the ledger's collectives for every
//! microbatch through a rank's chunks, pipeline sends, and the once-per-step data-parallel
//! gradient and parameter traffic of ZeRO 0-3.

use crate::config::Resolved;
use crate::layout::GroupKind;
use crate::model::{
    rank_params, ChunkContents, Collective, CollectiveKind, GroupBytes, Ledger, LedgerSummary,
    Phase,
};

fn coll(kind: CollectiveKind, group: GroupKind, size: u32, payload: u64, count: u32) -> Collective {
    Collective {
        kind,
        group,
        group_size: size,
        phase: Phase::Backward,
        payload_bytes: payload,
        count,
    }
}

/// Parameters replicated over a data-parallel group, and how they are kept.
#[derive(Debug, Clone, Copy)]
pub struct Replicas {
    pub group: GroupKind,
    /// Ranks holding a replica.
    pub n: u32,
    pub params: u64,
    pub trainable: u64,
    pub grad_bytes: u64,
    pub weight_bytes: u64,
}

/// The two replica sets of a rank's parameters: dense weights over DP x CP (the distributed
/// optimizer's group), routed experts over the expert data-parallel group.
pub fn replica_sets(r: &Resolved, p: &crate::model::ParamSums) -> [Replicas; 2] {
    let tr = &r.config.training;
    let dense = Replicas {
        group: GroupKind::DpCp,
        n: r.dense_replicas(),
        params: p.rank_dense,
        trainable: p.rank_dense_trainable,
        grad_bytes: tr.grad_dtype.bytes(),
        weight_bytes: tr.weight_bytes(),
    };
    let experts = Replicas {
        group: GroupKind::ExpertDp,
        n: r.expert_dp(),
        params: p.rank_expert,
        trainable: p.rank_expert_trainable,
        ..dense
    };
    [dense, experts]
}

/// Data-parallel traffic of one step: ZeRO-0 all-reduces gradients once per step; ZeRO-1
/// reduce-scatters them and all-gathers updated parameters once per step; ZeRO-2
/// reduce-scatters every microbatch (the gradients are sharded); ZeRO-3 also all-gathers
/// parameters before each forward and backward.
pub fn dp_collectives(zero: u8, r: Replicas, microbatches: u32) -> Vec<Collective> {
    let Replicas {
        group,
        n,
        params,
        trainable,
        grad_bytes,
        weight_bytes,
    } = r;
    if n <= 1 || params == 0 {
        return Vec::new();
    }
    let g = trainable * grad_bytes;
    let w_upd = trainable * weight_bytes;
    let w_all = params * weight_bytes;
    match zero {
        0 => vec![coll(CollectiveKind::AllReduce, group, n, g, 1)],
        1 => vec![
            coll(CollectiveKind::ReduceScatter, group, n, g, 1),
            coll(CollectiveKind::AllGather, group, n, w_upd, 1),
        ],
        2 => vec![
            coll(CollectiveKind::ReduceScatter, group, n, g, microbatches),
            coll(CollectiveKind::AllGather, group, n, w_upd, 1),
        ],
        _ => vec![
            coll(CollectiveKind::ReduceScatter, group, n, g, microbatches),
            coll(CollectiveKind::AllGather, group, n, w_all, 2 * microbatches),
        ],
    }
}

/// Wire bytes per step sent by pipeline rank `rank`'s GPUs, per group.
pub fn rank_step_bytes(
    r: &Resolved,
    s: &LedgerSummary,
    l: &Ledger,
    chunks: &[ChunkContents],
) -> GroupBytes {
    let m = r.microbatches;
    let tr = &r.config.training;
    let par = &r.config.parallel;
    let mut g = GroupBytes::default();
    for c in chunks {
        for (b, n) in c.blocks(s) {
            g.add(&b.comm, (n * m as u64) as f64);
        }
    }
    // Pipeline: each microbatch's activation leaves every chunk but the last stage, and its
    // gradient every chunk but the first.
    let boundary = l.dims.residual_bytes() as f64;
    let last = r.placement.num_stages() - 1;
    for c in chunks {
        let sends = (c.stage != last) as u32 + (c.stage != 0) as u32;
        g.pp += boundary * (sends * m) as f64;
    }
    // Tied embeddings split over stages: the two copies' gradients are all-reduced once.
    let first_rank = r.placement.stage_rank[0];
    let last_rank = r.placement.stage_rank[last];
    let holds_end = chunks.iter().any(|c| c.embedding || c.output);
    if r.config.model.tied_embeddings && first_rank != last_rank && holds_end && !l.dims.lora {
        let emb = l.dims.vocab_rank() * l.dims.h * tr.grad_dtype.bytes();
        g.pp += coll(CollectiveKind::AllReduce, GroupKind::Pp, 2, emb, 1).wire_bytes();
    }
    for set in replica_sets(r, &rank_params(chunks, s)) {
        for c in dp_collectives(par.zero, set, m) {
            g.dp += c.wire_bytes();
        }
    }
    // With SP, gradients of TP-replicated weights (norms, router) differ per TP rank and are
    // all-reduced over TP once per step (Megatron's allreduce of layernorm grads).
    if l.dims.sp {
        let replicated: u64 = chunks
            .iter()
            .flat_map(|c| c.blocks(s))
            .map(|(b, n)| b.params.tp_replicated * n)
            .sum();
        if !l.dims.lora {
            g.tp += coll(
                CollectiveKind::AllReduce,
                GroupKind::Tp,
                par.tp,
                replicated * tr.grad_dtype.bytes(),
                1,
            )
            .wire_bytes();
        }
    }
    g
}
