//! Communication volume per step per GPU, by group: the ledger's collectives for every
//! microbatch through a rank's chunks, pipeline sends, and the once-per-step data-parallel
//! gradient and parameter traffic of ZeRO 0-3.

use crate::config::Resolved;
use crate::layout::GroupKind;
use crate::memory::{rank_params, ChunkContents, LedgerSummary};
use crate::model::{Collective, CollectiveKind, GroupBytes, Ledger, Phase};

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

/// Data-parallel traffic of one step for `params` parameters (`trainable` of them) replicated
/// over `n` ranks: ZeRO-0 all-reduces gradients once per step; ZeRO-1 reduce-scatters them and
/// all-gathers updated parameters once per step; ZeRO-2 reduce-scatters every microbatch (the
/// gradients are sharded); ZeRO-3 also all-gathers parameters before each forward and backward.
pub fn dp_collectives(
    zero: u8,
    n: u32,
    params: u64,
    trainable: u64,
    grad_bytes: u64,
    weight_bytes: u64,
    microbatches: u32,
    group: GroupKind,
) -> Vec<Collective> {
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
    let p = rank_params(chunks, s);
    let (gb, wb) = (tr.grad_dtype.bytes(), tr.weight_bytes());
    for c in dp_collectives(
        par.zero,
        r.dense_replicas(),
        p.rank_dense,
        p.rank_dense_trainable,
        gb,
        wb,
        m,
        GroupKind::DpCp,
    ) {
        g.dp += c.wire_bytes();
    }
    for c in dp_collectives(
        par.zero,
        r.expert_dp(),
        p.rank_expert,
        p.rank_expert_trainable,
        gb,
        wb,
        m,
        GroupKind::ExpertDp,
    ) {
        g.dp += c.wire_bytes();
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
                replicated * gb,
                1,
            )
            .wire_bytes();
        }
    }
    g
}
