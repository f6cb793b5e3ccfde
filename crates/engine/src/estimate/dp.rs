//! Data-parallel time of a step as the framework runs it (`training.framework`): gradient
//! reduction in the framework's buckets, ZeRO-3 parameter gathers exposed beyond the compute
//! each layer's prefetch hides them behind, and the tail left after the last backward.

use crate::comm::{dp_collectives, replica_sets, StepCollective, StepRole};
use crate::config::{zero3_exposed_s, Resolved};
use crate::dp_calls::microbatch_calls;
use crate::model::{
    rank_params, ChunkContents, Collective, CollectiveKind, Ledger, LedgerSummary, Phase,
};
use crate::network::Network;

/// Parameters of one wrapped unit (a layer, the embedding, the output) of `chunks`, and the
/// number of units: FSDP's bucket and the granularity of ZeRO-3's gathers.
fn units(s: &LedgerSummary, chunks: &[ChunkContents]) -> (u64, u64) {
    let n: u64 = chunks
        .iter()
        .flat_map(|c| c.blocks(s))
        .map(|(_, n)| n)
        .sum();
    let p = rank_params(chunks, s);
    let params = p.rank_dense + p.rank_expert;
    (params / n.max(1), n)
}

/// Parameters per gradient bucket: `parallel.ddp_bucket_size`, else one unit under FSDP
/// (`parallel.fsdp`: Megatron-FSDP and FSDP2 reduce each unit's gradients as one
/// collective), else the framework's.
fn bucket_params(r: &Resolved, layer_params: u64) -> u64 {
    let par = &r.config.parallel;
    par.ddp_bucket_size.unwrap_or_else(|| match par.fsdp {
        Some(_) => layer_params.max(1),
        None => r
            .config
            .training
            .framework
            .grad_bucket_params(r.dp, layer_params),
    })
}

/// Seconds of collective `c` issued in buckets of at most `bucket_bytes` (of the gradient
/// payload): whole buckets, then the remainder, each timed as its own NCCL call.
pub(super) fn bucketed_s(network: &Network, c: &Collective, bucket_bytes: u64) -> f64 {
    let one = |bytes: u64| network.collective_s(c.group, c.kind, bytes, c.group_size);
    let bucket = bucket_bytes.max(1);
    if c.payload_bytes <= bucket {
        return one(c.payload_bytes);
    }
    let full = c.payload_bytes / bucket;
    let rest = c.payload_bytes % bucket;
    full as f64 * one(bucket) + one(rest)
}

/// Which data-parallel collectives overlap compute: the configuration's switches, none under
/// blocking launches (`training.launch_blocking`: the host waits out each collective first).
#[derive(Debug, Clone, Copy)]
struct DpOverlap {
    grad_reduce: bool,
    param_gather: bool,
}

impl DpOverlap {
    fn of(r: &Resolved) -> DpOverlap {
        let par = &r.config.parallel;
        let asynchronous = !r.config.training.launch_blocking;
        DpOverlap {
            grad_reduce: par.overlap_grad_reduce && asynchronous,
            param_gather: par.overlap_param_gather && asynchronous,
        }
    }
}

/// ZeRO-2/3 collectives issued every microbatch for a chunk's parameters (the chunk's own
/// [`dp_collectives`]: the gradient reduce-scatter in backward, in the framework's buckets,
/// and ZeRO-3's parameter all-gather before forward and backward), exposed beyond the compute
/// they overlap with: (forward, backward) seconds. DeepSpeed and FSDP issue the calls
/// [`microbatch_calls`] lists, each timed at its own size; the generic model one gather per
/// layer and `bucketed_s`'s buckets. ZeRO-3 gathers hide behind the previous layer's compute
/// only as far as the framework prefetches ([`zero3_exposed_s`]).
pub(super) fn per_microbatch_dp_s(
    r: &Resolved,
    network: &Network,
    l: &Ledger,
    s: &LedgerSummary,
    c: &ChunkContents,
    fwd_compute: f64,
    bwd_compute: f64,
) -> (f64, f64) {
    let par = &r.config.parallel;
    let overlap = DpOverlap::of(r);
    if par.zero < 2 {
        return (0.0, 0.0);
    }
    let (layer_params, layers) = units(s, std::slice::from_ref(c));
    let time =
        |c: &Collective| network.collective_s(c.group, c.kind, c.payload_bytes, c.group_size);
    let calls = microbatch_calls(r, l, s, c);
    let (fwd_gather, bwd_gather_all, reduce) = match &calls {
        Some(m) => (
            m.of(CollectiveKind::AllGather, Phase::Forward)
                .map(time)
                .sum(),
            m.of(CollectiveKind::AllGather, Phase::Backward)
                .map(time)
                .sum(),
            m.calls
                .iter()
                .filter(|c| c.kind != CollectiveKind::AllGather)
                .map(time)
                .sum(),
        ),
        None => {
            let (g, r) = generic_s(r, network, s, c, layer_params, layers);
            (g, g, r)
        }
    };
    let e = &r.gpu.efficiency;
    let ahead = calls.as_ref().and_then(|m| m.prefetch_ahead_params);
    let prefetch = par.zero3_prefetch_params.unwrap_or_else(|| {
        r.config
            .training
            .framework
            .prefetch_params(layer_params, ahead)
    });
    let hidden = |comm: f64, compute: f64| {
        let exposed = zero3_exposed_s(comm, compute, layers, layer_params, prefetch);
        e.charged_s(comm, exposed)
    };
    let (fwd_exposed, bwd_gather) = if overlap.param_gather {
        (
            hidden(fwd_gather, fwd_compute),
            hidden(bwd_gather_all, bwd_compute),
        )
    } else {
        (fwd_gather, bwd_gather_all)
    };
    if crate::config::syncs_once_per_step(&r.config) {
        // torch FSDP2 under pipelining: the first microbatch's forward gathers the stage's
        // units once (held to the step's end; a one-off on the rank's path, spread over its
        // microbatches' forwards), and the reductions wait for the last backward (the tail).
        return (fwd_exposed / f64::from(r.microbatches.max(1)), 0.0);
    }
    let bwd_exposed = if overlap.grad_reduce {
        // The backward's gathers come first on the communication stream; the reduction
        // overlaps with whatever compute they leave.
        let left = (bwd_compute - (bwd_gather_all - bwd_gather)).max(0.0);
        bwd_gather + e.charged_s(reduce, (reduce - left).max(0.0))
    } else {
        bwd_gather + reduce
    };
    (fwd_exposed, bwd_exposed)
}

/// The generic model's seconds of one pass's ZeRO-3 gathers (one per layer, at the mean
/// layer's size) and of a microbatch's gradient reduction in `bucket_params`'s buckets.
fn generic_s(
    r: &Resolved,
    network: &Network,
    s: &LedgerSummary,
    c: &ChunkContents,
    layer_params: u64,
    layers: u64,
) -> (f64, f64) {
    let par = &r.config.parallel;
    let gb = r.config.training.grad_dtype.bytes();
    let bucket_bytes = bucket_params(r, layer_params) * gb;
    let mut gather = 0.0;
    let mut reduce = 0.0;
    for set in replica_sets(r, s, std::slice::from_ref(c)) {
        for dc in dp_collectives(par.zero, set, 1) {
            match dc.kind {
                // One gather per layer (the granularity every framework gathers at).
                CollectiveKind::AllGather if par.zero >= 3 => {
                    let per_layer = dc.payload_bytes / layers.max(1);
                    gather += layers as f64
                        * network.collective_s(dc.group, dc.kind, per_layer, dc.group_size);
                }
                CollectiveKind::AllGather => {}
                _ => reduce += bucketed_s(network, &dc, bucket_bytes),
            }
        }
    }
    (gather, reduce)
}

/// Data-parallel work left after a rank's last backward, from its step-level collectives:
/// the last gradient bucket (all of it without `overlap_grad_reduce` at ZeRO 0-1; at ZeRO-2/3
/// a reduction not overlapped is charged in each backward already), the parameter
/// all-gather of ZeRO-1/2 unless overlapped with the next forward, the tied-embedding and
/// TP-replicated gradient all-reduces.
pub(super) fn dp_tail_s(
    r: &Resolved,
    network: &Network,
    l: &Ledger,
    s: &LedgerSummary,
    chunks: &[ChunkContents],
    step: &[StepCollective],
) -> f64 {
    let par = &r.config.parallel;
    let overlap = DpOverlap::of(r);
    let gb = r.config.training.grad_dtype.bytes();
    let (layer_params, _) = units(s, chunks);
    let bucket_bytes = bucket_params(r, layer_params) * gb;
    let e = &r.gpu.efficiency;
    let time =
        |c: &Collective| network.collective_s(c.group, c.kind, c.payload_bytes, c.group_size);
    // DeepSpeed's and FSDP's reductions of one microbatch as issued, the first chunk's (whose
    // backward ends the step) last.
    let mut reduce_calls: Option<Vec<Collective>> = None;
    for ch in chunks.iter().rev() {
        if let Some(m) = microbatch_calls(r, l, s, ch) {
            let calls = m
                .calls
                .into_iter()
                .filter(|c| c.kind != CollectiveKind::AllGather);
            reduce_calls.get_or_insert_with(Vec::new).extend(calls);
        }
    }
    let once = crate::config::syncs_once_per_step(&r.config);
    let mut tail = 0.0;
    for StepCollective { role, coll: c } in step {
        tail += match role {
            // ZeRO-3 gathers are per microbatch (in the stage costs); ZeRO-1/2 gather the
            // updated weights once, hidden behind the next forward when overlapped.
            StepRole::ParamGather if par.zero >= 3 => 0.0,
            // torch FSDP2 under pipelining: every unit's reduce-scatter after the stage's last
            // backward (the stage calls the post-backward hooks itself), with no compute of
            // this rank left to hide behind; the other ranks' drain hides it (each rank's tail
            // runs from its own last backward).
            StepRole::GradReduce if once => match &reduce_calls {
                Some(calls) => calls.iter().filter(|k| k.group == c.group).map(time).sum(),
                None => bucketed_s(network, c, bucket_bytes),
            },
            StepRole::ParamGather if overlap.param_gather => e.charged_s(
                network.collective_s(c.group, c.kind, c.payload_bytes, c.group_size),
                0.0,
            ),
            // ZeRO-2/3 reduce every microbatch in its backward, where a reduction not
            // overlapped is charged whole (the stage costs): nothing of it is left after.
            StepRole::GradReduce if par.zero >= 2 && !overlap.grad_reduce => 0.0,
            StepRole::GradReduce if reduce_calls.is_some() => {
                let mut own = reduce_calls.iter().flatten().filter(|k| k.group == c.group);
                let full: f64 = own.clone().map(time).sum();
                let last = own.next_back().map_or(0.0, time);
                if overlap.grad_reduce {
                    e.charged_s(full, last.min(full))
                } else {
                    full
                }
            }
            StepRole::GradReduce => {
                let full = bucketed_s(network, c, bucket_bytes);
                if overlap.grad_reduce {
                    let last = network.collective_s(
                        c.group,
                        c.kind,
                        c.payload_bytes.min(bucket_bytes),
                        c.group_size,
                    );
                    e.charged_s(full, last.min(full))
                } else {
                    full
                }
            }
            _ => network.collective_s(c.group, c.kind, c.payload_bytes, c.group_size),
        };
    }
    tail
}
