//! The data-parallel collective calls of one microbatch through a chunk, one entry per NCCL
//! call, as each sharding framework issues them: what the estimate times call by call, each at
//! its own size over its group's ranks, so that at thousands of ranks the per-call latency (and
//! NCCL's LL/LL128 choice for small calls) weighs as many times as there are calls.
//!
//! - DeepSpeed ZeRO-3 (`training.framework = "deepspeed"`, `zero = 3`; microsoft/DeepSpeed
//!   deepspeed/runtime/zero): `PartitionedParameterCoordinator.fetch_sub_module`
//!   (partitioned_param_coordinator.py) gathers, at each module's pre-forward (pre-backward)
//!   hook, that module's parameters not yet available in one `all_gather_coalesced` call, then
//!   prefetches the next parameters in use order until their elements reach
//!   min(`stage3_prefetch_bucket_size`, `stage3_max_live_parameters` - elements gathered) as one
//!   more call (so a parameter larger than the bucket is one call of its own); the module's
//!   parameters are released after it runs. Parameters of at most
//!   `stage3_param_persistence_threshold` elements are never partitioned
//!   (`Init._convert_to_deepspeed_param`, partition_parameters.py: `ds_persist`), so never
//!   gathered. Gradients: `DeepSpeedZeroOptimizer_Stage3.reduce_independent_p_g_buckets_and_remove_grads`
//!   (stage3.py) flushes the bucket before a gradient that would overflow
//!   `reduce_bucket_size`, and each flush is one `reduce_scatter_coalesced` call.
//! - FSDP (`framework = "fsdp"`, or `parallel.fsdp`): one all-gather per unit (a layer; each of
//!   an MTP module's three parts) before its forward and again before its backward (resharded
//!   after forward), one reduce-scatter per unit in backward. The root module (PyTorch FSDP's
//!   and FSDP2's, `reshard_after_forward = False`) holds what no layer unit wraps, the
//!   embedding and the output layer: one gather per microbatch, one reduce-scatter. Megatron-FSDP
//!   makes every block's units its own buckets, each gathered in forward and in backward
//!   (src/config/fsdp.rs).
//!
//! A module here is one op of the ledger holding parameters (a linear layer, a norm, the
//! embedding): the granularity DeepSpeed's hooks fetch at.

use crate::comm::{dp_collectives, replica_sets, Replicas};
use crate::config::{
    Framework, Fsdp, Resolved, DEEPSPEED_MAX_LIVE_PARAMS, DEEPSPEED_PERSISTENCE_THRESHOLD,
    DEEPSPEED_PREFETCH_BUCKET, DEEPSPEED_REDUCE_BUCKET,
};
use crate::model::{
    BlockKind, ChunkContents, Collective, CollectiveKind, Ledger, LedgerSummary, ParamClass, Phase,
};

/// How the step's data-parallel collectives are cut into calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Grouping {
    /// Megatron-Core's distributed optimizer without FSDP: gradient buckets of
    /// `ddp_bucket_size` (src/estimate/dp.rs), ZeRO-3 gathers one layer at a time.
    Generic,
    /// DeepSpeed ZeRO-3's prefetch groups and reduce buckets, in elements.
    Deepspeed {
        prefetch_bucket: u64,
        persistence_threshold: u64,
        max_live: u64,
        reduce_bucket: u64,
    },
    /// One gather and one reduce-scatter per FSDP unit; `root`: the embedding and output
    /// layer form the root unit, gathered once per microbatch.
    Units { root: bool },
}

impl Grouping {
    /// The grouping `r` runs: DeepSpeed's at ZeRO-2/3 (its settings or their documented
    /// defaults), FSDP's per unit under `framework = "fsdp"` or `parallel.fsdp` at ZeRO-2/3,
    /// else the generic bucket model.
    pub fn of(r: &Resolved) -> Grouping {
        let p = &r.config.parallel;
        if p.zero < 2 {
            return Grouping::Generic;
        }
        match (r.config.training.framework, p.fsdp) {
            (Framework::Deepspeed, _) => Grouping::Deepspeed {
                prefetch_bucket: p
                    .zero3_prefetch_bucket_size
                    .unwrap_or(DEEPSPEED_PREFETCH_BUCKET),
                persistence_threshold: p
                    .zero3_param_persistence_threshold
                    .unwrap_or(DEEPSPEED_PERSISTENCE_THRESHOLD),
                max_live: p
                    .zero3_max_live_parameters
                    .unwrap_or(DEEPSPEED_MAX_LIVE_PARAMS),
                reduce_bucket: p.ddp_bucket_size.unwrap_or(DEEPSPEED_REDUCE_BUCKET),
            },
            (Framework::Fsdp, None) | (_, Some(Fsdp::Torch)) => Grouping::Units { root: true },
            (_, Some(Fsdp::Megatron)) => Grouping::Units { root: false },
            (Framework::MegatronCore, None) => Grouping::Generic,
        }
    }
}

/// One microbatch's data-parallel calls through a chunk, in issue order per pass, and how far
/// ahead of the computing module DeepSpeed's prefetch has gathered.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MicrobatchCalls {
    /// Each call once (`count` 1), `phase` its pass: forward gathers, then backward gathers
    /// and gradient reductions interleaved as issued (gathers first within a unit).
    pub calls: Vec<Collective>,
    /// DeepSpeed: mean elements gathered ahead of the module computing, over its modules'
    /// hooks (both passes); `None` for the other groupings (one unit ahead).
    pub prefetch_ahead_params: Option<u64>,
}

impl MicrobatchCalls {
    /// The calls of `kind` in `phase`.
    pub fn of(&self, kind: CollectiveKind, phase: Phase) -> impl Iterator<Item = &Collective> {
        self.calls
            .iter()
            .filter(move |c| c.kind == kind && c.phase == phase)
    }
}

/// One module's parameters on this rank: (elements, trainable).
type Module = (u64, bool);

/// The chunk's units in forward order (embedding, layers, MTP, output), each a list of
/// modules per replica set (dense, expert), and whether it is the embedding or output layer.
fn units(l: &Ledger, c: &ChunkContents) -> Vec<([Vec<Module>; 2], bool)> {
    let mut blocks: Vec<_> = c.ledger_blocks(l).collect();
    blocks.sort_by_key(|(b, _)| match b.kind {
        BlockKind::Embedding => 0,
        BlockKind::Output => 2,
        _ => 1,
    });
    let mut out = Vec::new();
    for (b, n) in blocks {
        let end = matches!(b.kind, BlockKind::Embedding | BlockKind::Output);
        let one: Vec<[Vec<Module>; 2]> = b
            .gather_units()
            .map(|u| {
                let mut sets = [Vec::new(), Vec::new()];
                for p in b.ops[u].iter().filter_map(|o| o.params) {
                    sets[(p.class == ParamClass::Expert) as usize].push((p.rank, p.trainable));
                }
                sets
            })
            .collect();
        for _ in 0..n {
            out.extend(one.iter().cloned().map(|s| (s, end)));
        }
    }
    out
}

/// Bytes of `elements` of a replica set's collective of `kind` (its per-element bytes: the
/// weights' for a gather, fp8 gathers included, the gradients' for a reduction).
fn call(set: &Replicas, full: &Collective, elements: u64, per: u64, phase: Phase) -> Collective {
    let bytes = (elements as u128 * full.payload_bytes as u128 / per.max(1) as u128) as u64;
    Collective {
        phase,
        payload_bytes: bytes,
        count: 1,
        group: set.group,
        group_size: set.n,
        ..*full
    }
}

/// DeepSpeed's all-gather calls over modules of `sizes` elements in use order
/// (`fetch_sub_module`: each hook gathers its module if not yet available, then prefetches one
/// group), and the summed elements gathered ahead at the hooks. Elements at most `persist`
/// are never gathered.
pub fn deepspeed_gathers(
    sizes: &[u64],
    prefetch_bucket: u64,
    persist: u64,
    max_live: u64,
) -> (Vec<u64>, u64) {
    let gathered = |s: u64| s > persist;
    let mut fetched = vec![false; sizes.len()];
    let (mut calls, mut available, mut next, mut ahead) = (Vec::new(), 0u64, 0usize, 0u64);
    for (i, &s) in sizes.iter().enumerate() {
        next = next.max(i + 1);
        if gathered(s) && !fetched[i] {
            fetched[i] = true;
            calls.push(s);
            available += s;
        }
        if prefetch_bucket > 0 {
            let room = max_live.saturating_sub(available).min(prefetch_bucket);
            let mut numel = 0;
            while next < sizes.len() && numel < room {
                if gathered(sizes[next]) && !fetched[next] {
                    fetched[next] = true;
                    numel += sizes[next];
                }
                next += 1;
            }
            if numel > 0 {
                calls.push(numel);
                available += numel;
            }
        }
        let own = if gathered(s) { s } else { 0 };
        ahead += available - own;
        available -= own;
    }
    (calls, ahead)
}

/// DeepSpeed's reduce buckets over gradients of `sizes` elements in the order backward
/// produces them: the bucket is flushed before a gradient that would overflow it, so a
/// gradient larger than the bucket is a call of its own.
pub fn deepspeed_reduce_buckets(sizes: &[u64], bucket: u64) -> Vec<u64> {
    let mut out = Vec::new();
    let mut held = 0u64;
    for &s in sizes.iter().filter(|s| **s > 0) {
        if held > 0 && held + s > bucket {
            out.push(held);
            held = 0;
        }
        held += s;
    }
    if held > 0 {
        out.push(held);
    }
    out
}

/// The data-parallel calls of one microbatch through chunk `c` under `r`'s grouping: ZeRO-3's
/// parameter gathers (forward and backward) and ZeRO-2/3's gradient reduce-scatters, per
/// replica set on its own group. `None` for the generic model, which times its buckets itself.
pub fn microbatch_calls(
    r: &Resolved,
    l: &Ledger,
    s: &LedgerSummary,
    c: &ChunkContents,
) -> Option<MicrobatchCalls> {
    let grouping = Grouping::of(r);
    if grouping == Grouping::Generic {
        return None;
    }
    let zero = r.config.parallel.zero;
    let units = units(l, c);
    let mut out = MicrobatchCalls::default();
    let mut ahead = (0u64, 0u64);
    for (k, set) in replica_sets(r, s, std::slice::from_ref(c))
        .into_iter()
        .enumerate()
    {
        let full = dp_collectives(zero, set, 1);
        let (Some(rs), gather) = (
            full.iter().find(|f| f.kind != CollectiveKind::AllGather),
            full.iter().find(|f| f.kind == CollectiveKind::AllGather),
        ) else {
            continue;
        };
        let gather = gather.filter(|_| zero >= 3);
        let reduce = |e: u64| call(&set, rs, e, set.trainable, Phase::Backward);
        let modules: Vec<Module> = units.iter().flat_map(|(u, _)| u[k].clone()).collect();
        match grouping {
            Grouping::Deepspeed {
                prefetch_bucket,
                persistence_threshold,
                max_live,
                reduce_bucket,
            } => {
                let sizes: Vec<u64> = modules.iter().map(|m| m.0).collect();
                if let Some(g) = gather {
                    let backward: Vec<u64> = sizes.iter().rev().copied().collect();
                    for (phase, order) in [(Phase::Forward, &sizes), (Phase::Backward, &backward)] {
                        let (calls, a) = deepspeed_gathers(
                            order,
                            prefetch_bucket,
                            persistence_threshold,
                            max_live,
                        );
                        ahead = (ahead.0 + a, ahead.1 + order.len() as u64);
                        out.calls.extend(
                            calls
                                .into_iter()
                                .map(|e| call(&set, g, e, set.params, phase)),
                        );
                    }
                }
                let grads: Vec<u64> = modules.iter().rev().filter(|m| m.1).map(|m| m.0).collect();
                out.calls.extend(
                    deepspeed_reduce_buckets(&grads, reduce_bucket)
                        .into_iter()
                        .map(reduce),
                );
            }
            Grouping::Units { root } => {
                unit_calls(&units, k, root, &set, gather, rs, &mut out.calls);
            }
            Grouping::Generic => {}
        }
    }
    if matches!(grouping, Grouping::Deepspeed { .. }) && ahead.1 > 0 {
        out.prefetch_ahead_params = Some(ahead.0 / ahead.1);
    }
    Some(out)
}

/// FSDP's calls for replica set `k`: each unit gathered before its forward and again before
/// its backward, its gradients reduce-scattered after its backward; with `root`, the embedding
/// and output layer are one unit gathered once and reduce-scattered last.
fn unit_calls(
    units: &[([Vec<Module>; 2], bool)],
    k: usize,
    root: bool,
    set: &Replicas,
    gather: Option<&Collective>,
    rs: &Collective,
    out: &mut Vec<Collective>,
) {
    let elems = |m: &[Module], trainable: bool| -> u64 {
        m.iter().filter(|x| x.1 || !trainable).map(|x| x.0).sum()
    };
    let in_root = |end: bool| root && end;
    let root_unit: Vec<Module> = units
        .iter()
        .filter(|(_, end)| in_root(*end))
        .flat_map(|(u, _)| u[k].clone())
        .collect();
    let layers: Vec<&[Module]> = units
        .iter()
        .filter(|(_, end)| !in_root(*end))
        .map(|(u, _)| u[k].as_slice())
        .collect();
    let mut push = |kind: &Collective, e: u64, per: u64, phase: Phase| {
        if e > 0 {
            out.push(call(set, kind, e, per, phase));
        }
    };
    if let Some(g) = gather {
        push(g, elems(&root_unit, false), set.params, Phase::Forward);
        for u in &layers {
            push(g, elems(u, false), set.params, Phase::Forward);
        }
    }
    for u in layers.iter().rev() {
        if let Some(g) = gather {
            push(g, elems(u, false), set.params, Phase::Backward);
        }
        push(rs, elems(u, true), set.trainable, Phase::Backward);
    }
    push(rs, elems(&root_unit, true), set.trainable, Phase::Backward);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Below the bucket, parameters are grouped until their sum reaches it; a parameter larger
    /// than the bucket is one call; persistent ones are skipped; no prefetch gathers each
    /// module at its own hook.
    #[test]
    fn deepspeed_groups_follow_fetch_sub_module() {
        // First module alone (nothing prefetched yet), then groups reaching 10.
        let (calls, _) = deepspeed_gathers(&[4, 4, 4, 4, 4, 4], 10, 0, u64::MAX);
        assert_eq!(calls, [4, 12, 8]);
        let (calls, _) = deepspeed_gathers(&[30, 30, 30], 10, 0, u64::MAX);
        assert_eq!(calls, [30, 30, 30]);
        let (calls, _) = deepspeed_gathers(&[30, 1, 30, 1, 30], 10, 1, u64::MAX);
        assert_eq!(calls, [30, 30, 30]);
        let (calls, ahead) = deepspeed_gathers(&[4, 4, 4], 0, 0, u64::MAX);
        assert_eq!((calls, ahead), (vec![4, 4, 4], 0));
        // The live cap bounds each prefetch group to the room left.
        let (calls, _) = deepspeed_gathers(&[4, 4, 4, 4], 100, 0, 6);
        assert_eq!(calls, [4, 4, 4, 4]);
    }

    #[test]
    fn reduce_buckets_flush_before_overflow() {
        assert_eq!(deepspeed_reduce_buckets(&[3, 3, 3, 3], 7), [6, 6]);
        assert_eq!(deepspeed_reduce_buckets(&[3, 20, 3], 7), [3, 20, 3]);
        assert_eq!(deepspeed_reduce_buckets(&[0, 7, 0], 7), [7]);
    }
}
