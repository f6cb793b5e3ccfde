//! The memory of a rank that its action list does not change: weights, low-precision copies,
//! gradients, optimizer states, the fixed and phase buffers and the framework's own lines
//! (src/memory/deepspeed.rs), worked out once per set of alike ranks; and the rank's total
//! with its activation walk.

use super::alloc_trace::{RankTrace, TraceInputs};
use super::walk::ChunkBytes;
use super::{
    activation_peak, allocator, chunk_bytes, deepspeed, fsdp2, hands_off, optimizer_offload,
    runtime, updated_params, walk, ActivationPeak, PhaseBuffers, Pipeline, RankPhases, StageMemory,
};
use crate::config::{Recompute, Resolved};
use crate::model::{
    held_blocks, optimizer_bytes, rank_params, ChunkContents, Ledger, LedgerSummary,
};

/// A rank's optimizer state: Adam's (and Muon's on its matrices) over the parameters it
/// updates, or under Muon with the distributed optimizer the layer-wise optimizer's share of
/// whole parameters (model/layer_wise.rs).
fn optimizer_state(
    r: &Resolved,
    s: &LedgerSummary,
    l: &Ledger,
    chunks: &[ChunkContents],
    p: &crate::model::ParamSums,
) -> u64 {
    let tr = &r.config.training;
    if tr.optimizer == crate::config::Optimizer::Muon && r.config.parallel.zero >= 1 {
        use crate::model::layer_wise;
        let tensors = layer_wise::state_tensors(chunks.iter().flat_map(|c| c.ledger_blocks(l)));
        return layer_wise::state_bytes(
            tr,
            &tensors,
            r.dense_replicas() as u64,
            r.expert_dp() as u64,
        );
    }
    let muon = crate::model::rank_muon(chunks, s);
    optimizer_bytes(tr, updated_params(r, p), muon.dense + muon.expert).0
}

/// A rank's optimizer state split into (GPU, host) bytes under CPU optimizer offload
/// (src/memory/optimizer_offload.rs): the offloaded parameters' state leaves the GPU.
fn optimizer_split(
    r: &Resolved,
    s: &LedgerSummary,
    l: &Ledger,
    chunks: &[ChunkContents],
    p: &crate::model::ParamSums,
) -> (u64, u64) {
    let mut state = optimizer_state(r, s, l, chunks, p);
    if fsdp2::master_shard_bytes(r).is_some() {
        // torch FSDP2's fp32 shard is the master copy, counted with the weights.
        let master = crate::model::OptimizerState::of(&r.config.training).master_bytes;
        state = state.saturating_sub(updated_params(r, p) * master);
    }
    let offloaded = optimizer_offload::offloaded_params(r, updated_params(r, p));
    let host = optimizer_offload::host_state_bytes(r, offloaded).min(state);
    (state - host, host)
}

/// A rank's low-precision weight copies and the bytes its weights shrink by: the cached
/// copies of every quantised weight of its blocks (none under ZeRO-3, where each gathered
/// block is cast as it runs and freed with it); with `training.fp8_param_gather` the weights
/// are held in the recipe's format (8 bits, NVFP4's 4), so they shrink to their rowwise copy
/// (their shard's under ZeRO-3) and the cache loses that copy, which is the weight itself.
fn low_precision_weights(r: &Resolved, s: &LedgerSummary, chunks: &[ChunkContents]) -> (u64, u64) {
    let mut q = crate::model::low_precision::QuantizedWeights::default();
    for c in chunks {
        for (b, n) in c.blocks(s) {
            q.add(&b.quantized, n);
        }
    }
    let tr = &r.config.training;
    let zero3 = crate::config::held_zero(&r.config) >= 3;
    let cache = if zero3 { 0 } else { q.cache_bytes };
    let recipe = match crate::model::low_precision::Recipe::of(r) {
        Some(recipe) if tr.fp8_param_gather => recipe,
        _ => return (cache, 0),
    };
    let (dense, expert) = if zero3 {
        (
            q.dense_elements.div_ceil(r.dense_replicas() as u64),
            q.expert_elements.div_ceil(r.expert_dp() as u64),
        )
    } else {
        (q.dense_elements, q.expert_elements)
    };
    let held = recipe.held_weight_bytes(dense) + recipe.held_weight_bytes(expert);
    let narrowed = ((dense + expert) * tr.weight_bytes()).saturating_sub(held);
    let rowwise = if zero3 { 0 } else { held };
    (cache.saturating_sub(rowwise), narrowed)
}

/// The allocation sequence of a DeepSpeed rank of one chunk (src/memory/alloc_trace.rs).
fn traced(
    r: &Resolved,
    l: &Ledger,
    chunks: &[ChunkContents],
    ds: &deepspeed::DeepspeedBuffers,
) -> Option<std::sync::Arc<RankTrace>> {
    let [only] = chunks else {
        return None;
    };
    if *ds == deepspeed::DeepspeedBuffers::default() {
        return None;
    }
    let inputs = TraceInputs {
        recompute: r.config.training.recompute,
        grad_bytes: r.config.training.grad_dtype.bytes(),
        residual_bytes: l.dims.residual_bytes(),
        kept_output: if only.output { 0 } else { ds.kept_output },
        kept_input: if only.embedding { 0 } else { ds.kept_input },
    };
    let trace = RankTrace::of(l, only, inputs, &ds.step_allocs);
    Some(std::sync::Arc::new(trace))
}

/// Steps the allocation sequence is replayed for. Measured figures are often of a later step
/// (BLOOM tr11's of iteration 2, bigscience-workshop/bigscience train/tr11-176B-ml/
/// chronicles-prequel.md), whose allocator starts from the segments the first left; on every
/// BLOOM row a second step reserves nothing more than the first (the first step's backward
/// allocates the gradients between the activations, as every later one does, and its step
/// takes the same segments), so one is replayed.
const TRACED_ITERATIONS: u32 = 1;

/// The fixed buffers of a rank holding `chunks` (`held`: their blocks) beside the runtime
/// lines, with `pipeline` bytes of pipeline buffers: the profile's runtime overhead, the SP
/// all-gather buffer, and torch FSDP2's root module (the embedding) gathered from forward to
/// backward on the rank holding it.
fn fixed_parts(
    r: &Resolved,
    s: &LedgerSummary,
    chunks: &[ChunkContents],
    held: &[&crate::model::BlockSummary],
    pipeline: u64,
) -> super::BufferParts {
    let zero = crate::config::held_zero(&r.config);
    let root = r.config.parallel.fsdp.is_some_and(|f| f.holds_root(zero))
        && chunks.iter().any(|c| c.embedding);
    super::BufferParts {
        runtime_overhead: r.gpu.runtime_overhead_bytes,
        sp_gather: held.iter().map(|b| b.sp_gather).max().unwrap_or(0),
        pipeline,
        fsdp_root: if root {
            s.embedding.params.rank() * r.config.training.weight_bytes()
        } else {
            0
        },
        ..super::BufferParts::default()
    }
}

/// The memory of a rank that depends only on the blocks it holds, whether it splits its
/// backward and whether it hands off inside the rank: all but the activation walk.
#[derive(Debug, Clone)]
pub(super) struct RankStatic {
    weights: u64,
    low_precision_weights: u64,
    grads: u64,
    optimizer: u64,
    /// The optimizer state offloaded to host memory (src/memory/optimizer_offload.rs).
    host_optimizer: u64,
    fixed: u64,
    pub(super) split: bool,
    pub(super) handoff: bool,
    rank_phases: RankPhases,
    /// The rank's worst phase buffers (all its chunks).
    phase: PhaseBuffers,
    /// The framework's own lines (src/memory/deepspeed.rs).
    ds: deepspeed::DeepspeedBuffers,
    /// The CUDA context, BLAS workspace and NCCL buffers (src/memory/runtime.rs), in `fixed`.
    runtime: runtime::RuntimeLines,
    /// The rest of `fixed` line by line, and the worst phase.
    parts: super::BufferParts,
    /// Blocks the backward leaves cached (for the allocator): the largest one tensor of the
    /// walk, and the vocabulary table's weight-gradient transient.
    cached: [u64; 2],
    /// The rank's allocation sequence for the caching allocator (src/memory/alloc_trace.rs):
    /// DeepSpeed ranks of one chunk.
    trace: Option<std::sync::Arc<RankTrace>>,
}

impl RankStatic {
    /// The parts of the memory of a rank holding `chunks` that its action list does not change;
    /// `runtime` is what every rank of `r` holds ([`runtime::RuntimeLines::of`]), which callers
    /// of many ranks work out once.
    pub(super) fn of(
        r: &Resolved,
        s: &LedgerSummary,
        l: &Ledger,
        chunks: &[ChunkContents],
        split: bool,
        runtime: runtime::RuntimeLines,
    ) -> RankStatic {
        let tr = &r.config.training;
        let par = &r.config.parallel;
        let d = &l.dims;
        let p = rank_params(chunks, s);
        let dense_rep = r.dense_replicas() as u64;
        let expert_rep = r.expert_dp() as u64;
        let shard = |n: u64, reps: u64| n.div_ceil(reps);
        let w = tr.weight_bytes();
        let g = tr.grad_dtype.bytes();
        // torch FSDP2 under pipelining holds the stage's parameters gathered and its gradients
        // unsharded (in the parameters' dtype) for the whole step, then reduce-scatters them
        // into the sharded gradients (`syncs_once_per_step`): no per-unit gather, bucket or
        // double buffer (`held_zero` is 1).
        let once = crate::config::syncs_once_per_step(&r.config);
        let zero = crate::config::held_zero(&r.config);
        let mut weights = if zero >= 3 {
            // torch FSDP2 holds its shard in fp32, the master copy (src/memory/fsdp2.rs).
            let shard_bytes = fsdp2::master_shard_bytes(r).unwrap_or(w);
            (shard(p.rank_dense, dense_rep) + shard(p.rank_expert, expert_rep)) * shard_bytes
        } else {
            p.rank() * w
        };
        let (low_precision_weights, narrowed) = low_precision_weights(r, s, chunks);
        weights -= narrowed;
        let sharded_grads =
            shard(p.rank_dense_trainable, dense_rep) + shard(p.rank_expert_trainable, expert_rep);
        let grads = if once {
            (p.rank_dense_trainable + p.rank_expert_trainable) * w + sharded_grads * g
        } else if zero >= 2 {
            sharded_grads * g
        } else {
            (p.rank_dense_trainable + p.rank_expert_trainable) * g
        };
        let (optimizer, host_optimizer) = optimizer_split(r, s, l, chunks, &p);

        // Buffers: runtime overhead, the SP all-gather buffer, pipeline send/receive buffers,
        // then, by phase, ZeRO's gathered blocks and gradient bucket and the ops' transients:
        // - forward: ZeRO-3's two gathered parameter sets (the one in use and the one beside it),
        //   and the largest forward transient of any op;
        // - backward of a block: its gathered weights (ZeRO-3) and its backward transient, which
        //   holds its gradient buckets (ZeRO-2/3: a space's gradients at full size before they
        //   are reduce-scattered into the shard, as DeepSpeed's reduce bucket) from its first
        //   weight gradient on; a split backward (zero-bubble schedules) fills the bucket only in
        //   its W pass, where nothing else is transient.
        // The buffers category takes the rank's worst phase; the activation walk takes each pass
        // with its own chunk's transients (`RankPhases::of` on that chunk alone).
        let held = held_blocks(chunks, s);
        let blocks = || held.iter().copied();
        // Pipeline: the receive buffer, and a send buffer. A chunk's output waits in it from its
        // forward to the send right after (a forward transient), unless the next stage sits on
        // the same rank (the bottom of a V), where it waits for that chunk's forward.
        let handoff = hands_off(chunks);
        let pp_send = if par.pp > 1 { d.residual_bytes() } else { 0 };
        let mut parts = fixed_parts(
            r,
            s,
            chunks,
            &held,
            pp_send + if handoff { pp_send } else { 0 },
        );
        let fixed = runtime.total() + parts.fixed();
        // ZeRO-3 gathers a block's experts apart from the rest of it (the expert space), so the
        // two sets forward holds (the one in use and the one beside it) are each a unit's dense
        // part or its experts: an MoE layer's two parts, or one part and the previous block's
        // (two experts parts are never adjacent; the neighbour may be another chunk's, so the
        // rank's largest): at most the largest dense part and the larger of the largest dense and
        // experts parts.
        let gathered_sets = if zero >= 3 {
            let dense = blocks().map(|b| b.gather_dense).max().unwrap_or(0);
            let expert = blocks().map(|b| b.gather_expert).max().unwrap_or(0);
            (dense + dense.max(expert)) * w
        } else {
            0
        };
        // FSDP (`parallel.fsdp`): the double buffers in backward, each the rank's largest unit
        // (a block's dense part or experts for the weights, its trainable parameters for the
        // gradients); torch FSDP2's root module (the embedding) gathered from forward to
        // backward on the rank holding it.
        let (fsdp_backward, fsdp_grads) = match par.fsdp {
            Some(f) => {
                let (units, bufs) = f.extra_backward_units(zero);
                let unit = blocks()
                    .map(|b| b.gather_dense.max(b.gather_expert))
                    .max()
                    .unwrap_or(0);
                let bucket = blocks()
                    .map(|b| b.params.rank_dense_trainable + b.params.rank_expert_trainable)
                    .max()
                    .unwrap_or(0);
                let grads = bufs * bucket * g;
                (units * unit * w + grads, grads)
            }
            None => (0, 0),
        };
        let ds = deepspeed::buffers(r, &p, deepspeed::RankTensors::of(r, d, chunks));
        let rank_phases = RankPhases {
            zero,
            weight_bytes: w,
            grad_bytes: g,
            split,
            gathered_sets,
            pp_send: if handoff { 0 } else { pp_send },
            fsdp_backward,
            fsdp_grads,
            framework_backward: if ds.bucket_in_backward {
                ds.reduce_bucket
            } else {
                0
            },
            kept_output: ds.kept_output,
            kept_input: ds.kept_input,
            table_wgrad: ds.table_wgrad,
        };
        let phase = rank_phases.of(s, chunks);
        (parts.phase, parts.reduce_bucket_in_phase) = (phase.max(), ds.bucket_in_backward);
        let trace = traced(r, l, chunks, &ds);
        // The blocks the backward leaves cached are at most a block's whole saved set or one
        // of its transients (an upper bound on any one tensor among them).
        let largest_cached = blocks()
            .map(|b| b.saved_all.max(b.temp).max(b.backward_temp))
            .max()
            .unwrap_or(0);
        RankStatic {
            weights,
            low_precision_weights,
            grads,
            optimizer,
            host_optimizer,
            fixed,
            split,
            handoff,
            rank_phases,
            phase,
            ds,
            runtime,
            parts,
            cached: [largest_cached, ds.table_wgrad],
            trace,
        }
    }

    /// What the activation walk adds for a rank of the one chunk `only`.
    pub(super) fn single_bytes(
        &self,
        s: &LedgerSummary,
        recompute: Recompute,
        only: &ChunkContents,
    ) -> ChunkBytes<i128> {
        let stage = only.stage as u32;
        let only = std::slice::from_ref(only);
        chunk_bytes(only, s, recompute, &[(stage, self.phase)], stage)
    }

    /// The rank's memory with its activation walk over `pipeline`; `single`, for a rank of
    /// one chunk, the walk's bytes of an alike rank (its stage aside), else worked out here.
    pub(super) fn memory(
        &self,
        r: &Resolved,
        s: &LedgerSummary,
        rank: u32,
        chunks: &[ChunkContents],
        pipeline: Pipeline,
        single: Option<&ChunkBytes<i128>>,
    ) -> StageMemory {
        let tr = &r.config.training;
        let &RankStatic {
            weights,
            low_precision_weights,
            grads,
            optimizer,
            fixed,
            rank_phases,
            phase,
            ..
        } = self;
        let blocks = || chunks.iter().flat_map(|c| c.blocks(s)).map(|(b, _)| b);
        // Activations: the chunk sets live at the worst moment of this rank's action list; the
        // total takes each moment with the buffers of the phase running then.
        let peak = match pipeline {
            // A rank of one chunk (no interleaving) has its rank-wide phases as that chunk's.
            Pipeline::Actions(actions) | Pipeline::WholePasses { actions, .. } => match chunks {
                [only] => {
                    let whole = match pipeline {
                        Pipeline::WholePasses { sets, .. } => Some(sets),
                        _ => None,
                    };
                    // Alike ranks share their bytes; this one walks at its own stage.
                    let stage = only.stage as u32;
                    let c = match single {
                        Some(c) => ChunkBytes { stage, ..*c },
                        None => self.single_bytes(s, tr.recompute, only),
                    };
                    let (peak, with) = walk::peaks(actions, &[c], whole);
                    ActivationPeak {
                        activations: peak.max(0) as u64,
                        with_buffers: with.max(0) as u64,
                    }
                }
                _ => {
                    let phases: Vec<(u32, PhaseBuffers)> = chunks
                        .iter()
                        .map(|c| (c.stage as u32, rank_phases.of(s, std::slice::from_ref(c))))
                        .collect();
                    activation_peak(actions, chunks, s, tr.recompute, &phases)
                }
            },
            Pipeline::Inflight { sets, .. } => {
                // That many sets of the rank's average chunk, plus the layer being rebuilt.
                let v = chunks.len().max(1) as u64;
                let kept: u64 = chunks
                    .iter()
                    .map(|c| {
                        u64::from(!c.output) * phase.kept_output
                            + u64::from(!c.embedding) * phase.kept_input
                    })
                    .sum();
                let per_microbatch: u64 = chunks
                    .iter()
                    .flat_map(|c| c.blocks(s))
                    .map(|(b, n)| b.saved * n)
                    .sum::<u64>()
                    + kept;
                let rebuilt = blocks()
                    .filter(|b| tr.recompute == Recompute::Full && b.saved != b.saved_all)
                    .map(|b| b.saved_all - b.saved)
                    .max()
                    .unwrap_or(0);
                // Saturating: GPipe keeps every microbatch live, up to 2^30 of them, which is
                // reported as not fitting rather than wrapping.
                let a = per_microbatch
                    .saturating_mul(sets as u64)
                    .div_ceil(v)
                    .saturating_add(rebuilt);
                ActivationPeak {
                    activations: a,
                    with_buffers: a.saturating_add(phase.max()),
                }
            }
        };
        // Activation offloading: the offloaded layers' saved sets leave the GPU for the host.
        let offloaded = tr.offload_activation_layers;
        let (peak, host_offload) = if offloaded > 0 {
            let layer = crate::offload::Layers::of(s, chunks).mean_saved_bytes();
            let off = crate::offload::off_gpu_layers(r.config.model.num_layers, offloaded);
            let freed = off as u64 * layer;
            (
                ActivationPeak {
                    activations: peak.activations.saturating_sub(freed),
                    with_buffers: peak.with_buffers.saturating_sub(freed),
                },
                offloaded as u64 * layer,
            )
        } else {
            (peak, 0)
        };
        let activations = peak.activations;
        // The worst moment, not the sum of each category's worst (which can be larger): a
        // moment of the activation walk, or one after the backward, when no activation lives
        // (the framework's bucket when it reduces then, its step's copies less the gradients
        // it released before them).
        let resident = weights + low_precision_weights + grads + optimizer + fixed;
        let backward_total = resident.saturating_add(peak.with_buffers);
        let total = backward_total.max(resident.saturating_add(self.ds.after_backward));
        // The allocator's reserve beyond the allocated peak: from the rank's allocation sequence
        // where it is traced, else from the step's new segments beside the backward's blocks.
        let replayed = match (&self.trace, pipeline) {
            (Some(t), Pipeline::Actions(actions) | Pipeline::WholePasses { actions, .. }) => {
                t.replay(actions, TRACED_ITERATIONS)
            }
            _ => None,
        };
        let allocator_cache = match replayed {
            Some((reserved, allocated)) => {
                let beyond = reserved.saturating_sub(allocated);
                total
                    .saturating_add(beyond)
                    .min(r.gpu.memory_bytes.max(total))
                    - total
            }
            None => {
                let new_segments = allocator::new_segment_bytes(&self.cached, &self.ds.step_allocs);
                allocator::cache_bytes(backward_total, new_segments, total, r.gpu.memory_bytes)
            }
        };
        StageMemory {
            stage: rank,
            weights,
            low_precision_weights,
            gradients: grads,
            optimizer,
            activations,
            buffers: fixed + phase.max(),
            total,
            host_offload,
            host_optimizer: self.host_optimizer,
            reduce_bucket: self.ds.reduce_bucket,
            step_grads: self.ds.step_grads,
            grad_check_copies: self.ds.grad_check_copies,
            allocator_cache,
            cuda_context: self.runtime.cuda_context,
            blas_workspace: self.runtime.blas_workspace,
            nccl_buffers: self.runtime.nccl,
            buffer_parts: self.parts,
        }
    }
}
