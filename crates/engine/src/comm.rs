//! Communication volume per step per GPU, by group: the ledger's collectives for every
//! microbatch through a rank's chunks, pipeline sends, and the once-per-step data-parallel
//! gradient and parameter traffic of ZeRO 0-3.

use crate::config::Resolved;
use crate::layout::GroupKind;
use crate::model::{
    rank_params, ChunkContents, Collective, CollectiveKind, Ledger, LedgerSummary, PerGroup, Phase,
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
    /// Of `params`, the quantised weights `training.fp8_param_gather` gathers in the recipe's
    /// format, and their bytes so ([`crate::model::low_precision::Recipe::held_weight_bytes`]).
    pub narrow_params: u64,
    pub narrow_bytes: u64,
}

/// The two replica sets of a rank's parameters: dense weights over DP x CP (the distributed
/// optimizer's group), routed experts over the expert data-parallel group.
pub fn replica_sets(r: &Resolved, s: &LedgerSummary, chunks: &[ChunkContents]) -> [Replicas; 2] {
    let tr = &r.config.training;
    let p = &rank_params(chunks, s);
    // The quantised weights gathered in the recipe's format (dense, expert).
    let mut q = crate::model::low_precision::QuantizedWeights::default();
    let recipe = crate::model::low_precision::Recipe::of(r).filter(|_| tr.fp8_param_gather);
    if recipe.is_some() {
        for c in chunks {
            for (b, n) in c.blocks(s) {
                q.add(&b.quantized, n);
            }
        }
    }
    let held = |elements: u64| recipe.map_or(0, |f| f.held_weight_bytes(elements));
    let dense = Replicas {
        group: GroupKind::DpCp,
        n: r.dense_replicas(),
        params: p.rank_dense,
        trainable: p.rank_dense_trainable,
        grad_bytes: tr.grad_dtype.bytes(),
        weight_bytes: tr.weight_bytes(),
        narrow_params: q.dense_elements,
        narrow_bytes: held(q.dense_elements),
    };
    let experts = Replicas {
        group: GroupKind::ExpertDp,
        n: r.expert_dp(),
        params: p.rank_expert,
        trainable: p.rank_expert_trainable,
        narrow_params: q.expert_elements,
        narrow_bytes: held(q.expert_elements),
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
        narrow_params,
        narrow_bytes,
    } = r;
    if n <= 1 || params == 0 {
        return Vec::new();
    }
    let g = trainable * grad_bytes;
    // Quantised weights gathered in the recipe's format move `narrow_bytes` in place of their
    // bf16 bytes; the updated ones (trainable) their share of that saving.
    let narrow = narrow_params.min(params);
    let saved = (narrow * weight_bytes).saturating_sub(narrow_bytes);
    let saved_upd = if narrow == 0 {
        0
    } else {
        (saved as u128 * narrow.min(trainable) as u128 / narrow as u128) as u64
    };
    let w_upd = (trainable * weight_bytes).saturating_sub(saved_upd);
    let w_all = params * weight_bytes - saved;
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

/// What a collective outside the blocks' ops is for: when it runs and what it moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepRole {
    /// Data-parallel gradient all-reduce or reduce-scatter (ZeRO 0-3).
    GradReduce,
    /// Data-parallel all-gather of updated (ZeRO-1/2) or sharded (ZeRO-3) parameters.
    ParamGather,
    /// The copies of the word embedding on the first and last pipeline ranks (a tied output
    /// layer, the multi-token-prediction modules' embedding) sum their gradients over
    /// Megatron's embedding group.
    EmbeddingGroupGrads,
    /// With SP, TP-replicated weights (norms, router) sum their gradients over TP
    /// (Megatron's all-reduce of layernorm gradients).
    ReplicatedGrads,
}

/// A collective a pipeline rank issues for its parameters rather than per op.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepCollective {
    pub role: StepRole,
    pub coll: Collective,
}

/// The step-level collectives of pipeline rank holding `chunks`, built once for both the
/// volume (here) and the time model (the estimate's data-parallel tail): each replica set's
/// data-parallel traffic ([`dp_collectives`]), the embedding group's gradient all-reduce
/// when the two ends sit on different ranks (tied embeddings, multi-token prediction), and with SP the all-reduce of TP-replicated gradients.
/// Under torch FSDP2 with pipelining ([`crate::config::syncs_once_per_step`]) ZeRO-3 gathers
/// and reduce-scatters once a step.
pub fn step_collectives(
    r: &Resolved,
    s: &LedgerSummary,
    l: &Ledger,
    chunks: &[ChunkContents],
) -> Vec<StepCollective> {
    let par = &r.config.parallel;
    let gb = r.config.training.grad_dtype.bytes();
    let mut out = Vec::with_capacity(6);
    // torch FSDP2 under pipeline parallelism gathers once and reduces once a step.
    let once = crate::config::syncs_once_per_step(&r.config);
    let syncs = if once { 1 } else { r.microbatches };
    for set in replica_sets(r, s, chunks) {
        for mut c in dp_collectives(par.zero, set, syncs) {
            let role = match c.kind {
                CollectiveKind::AllGather => StepRole::ParamGather,
                _ => StepRole::GradReduce,
            };
            if once && role == StepRole::ParamGather {
                c.count = 1;
            }
            out.push(StepCollective { role, coll: c });
        }
    }
    let last = r.placement.num_stages() - 1;
    let split = r.placement.stage_rank[0] != r.placement.stage_rank[last];
    let holds_end = chunks.iter().any(|c| c.embedding || c.output);
    let m = &r.config.model;
    let mtp = m.mtp_num_layers > 0;
    if (m.tied_embeddings || mtp) && split && holds_end && !l.dims.lora {
        let mut emb = l.dims.vocab_rank() * l.dims.h * gb;
        if mtp && m.position_embedding == crate::config::PositionEmbedding::Learned {
            emb += m.max_position_embeddings * l.dims.h * gb;
        }
        out.push(StepCollective {
            role: StepRole::EmbeddingGroupGrads,
            coll: coll(CollectiveKind::AllReduce, GroupKind::Pp, 2, emb, 1),
        });
    }
    // Under LoRA the norms are frozen; the replicated adapter factors take their place.
    let replicated: u64 = chunks
        .iter()
        .flat_map(|c| c.blocks(s))
        .map(|(b, n)| {
            let p = &b.params;
            n * if l.dims.lora {
                p.lora_replicated
            } else {
                p.tp_replicated
            }
        })
        .sum();
    if l.dims.sp && (!l.dims.lora || replicated > 0) {
        out.push(StepCollective {
            role: StepRole::ReplicatedGrads,
            coll: coll(
                CollectiveKind::AllReduce,
                GroupKind::Tp,
                par.tp,
                replicated * gb,
                1,
            ),
        });
    }
    out
}

/// Wire bytes per step sent by pipeline rank `rank`'s GPUs, per group: its blocks' collectives
/// for every microbatch, pipeline sends, and its step-level collectives.
pub fn rank_step_bytes(
    r: &Resolved,
    s: &LedgerSummary,
    l: &Ledger,
    chunks: &[ChunkContents],
    step: &[StepCollective],
) -> PerGroup {
    let m = r.microbatches;
    let mut g = PerGroup::default();
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
        g.add_group(GroupKind::Pp, boundary * (sends * m) as f64);
    }
    for sc in step {
        g.add_group(sc.coll.group, sc.coll.wire_bytes());
    }
    g
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Config, Layer};
    use crate::model::{chunks_per_rank, CommKind};

    fn resolved(v: serde_json::Value) -> Resolved {
        Resolved::new(Config::from_layers(&[Layer::overrides(v)]).expect("loads")).expect("valid")
    }

    /// Multi-token prediction with the two ends on different pipeline ranks (untied): both
    /// ranks hold a copy of the word embedding (the last for its MTP modules, as Megatron-Core)
    /// and all-reduce its gradient over the embedding group, v/t x h in the gradient dtype;
    /// with both ends on one rank (PP 1) there is no such all-reduce.
    #[test]
    fn mtp_embedding_copies_sum_their_gradients_over_the_embedding_group() {
        for (pp, split) in [(2u32, true), (1, false)] {
            let r = resolved(serde_json::json!({
                "model": {"mtp_num_layers": 1, "tied_embeddings": false},
                "cluster": {"num_gpus": 8},
                "parallel": {"tp": 2, "pp": pp},
            }));
            let l = Ledger::build(&r);
            let s = LedgerSummary::of(&l, r.config.training.recompute);
            let gb = r.config.training.grad_dtype.bytes();
            for ch in chunks_per_rank(&r) {
                let group: Vec<u64> = step_collectives(&r, &s, &l, &ch)
                    .iter()
                    .filter(|c| c.role == StepRole::EmbeddingGroupGrads)
                    .map(|c| c.coll.payload_bytes)
                    .collect();
                let want = if split {
                    vec![l.dims.vocab_rank() * l.dims.h * gb]
                } else {
                    vec![]
                };
                assert_eq!(group, want, "pp {pp}");
            }
        }
    }

    /// Tied embeddings split over two pipeline ranks, TP 2 with SP, ZeRO-1: each rank's list
    /// holds the DP reduce-scatter and gather, the tied-embedding and the norm all-reduces, and
    /// the volume is their wire bytes.
    #[test]
    fn step_collectives_are_the_one_list_volume_is_summed_from() {
        let r = resolved(serde_json::json!({
            "model": {"tied_embeddings": true},
            "cluster": {"num_gpus": 16},
            "parallel": {"tp": 2, "pp": 2, "zero": 1},
        }));
        let l = Ledger::build(&r);
        let s = LedgerSummary::of(&l, r.config.training.recompute);
        for ch in chunks_per_rank(&r) {
            let step = step_collectives(&r, &s, &l, &ch);
            let roles: Vec<StepRole> = step.iter().map(|c| c.role).collect();
            assert_eq!(
                roles,
                [
                    StepRole::GradReduce,
                    StepRole::ParamGather,
                    StepRole::EmbeddingGroupGrads,
                    StepRole::ReplicatedGrads
                ]
            );
            let with = rank_step_bytes(&r, &s, &l, &ch, &step);
            let without = rank_step_bytes(&r, &s, &l, &ch, &[]);
            let dp: f64 = step[..2].iter().map(|c| c.coll.wire_bytes()).sum();
            assert_eq!(with[CommKind::Dp] - without[CommKind::Dp], dp);
            assert_eq!(
                with[CommKind::Pp] - without[CommKind::Pp],
                step[2].coll.wire_bytes()
            );
            assert_eq!(
                with[CommKind::Tp] - without[CommKind::Tp],
                step[3].coll.wire_bytes()
            );
        }
    }
}
