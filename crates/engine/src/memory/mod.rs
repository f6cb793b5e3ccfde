//! Per-rank memory, pipeline stage by pipeline stage: weights, gradients, optimizer states
//! (sharded by ZeRO over the group that really holds replicas), activations of the in-flight
//! microbatches, and buffers.

use crate::config::{Recompute, Resolved};
use crate::model::{held_blocks, BlockSummary, ChunkContents, Ledger, LedgerSummary, ParamSums};
use crate::schedule::{ActionKind, ComputeAction};
use serde::Serialize;
use walk::ChunkBytes;

mod alike;
mod alloc_trace;
mod allocator;
mod caching_allocator;
mod deepspeed;
pub mod fsdp2;
pub mod optimizer_offload;
mod rank_static;
mod runtime;
mod walk;

use alike::AlikeRanks;
pub use alike::RankStaticMemo;
use rank_static::RankStatic;
pub use runtime::{NcclBuffers, RuntimeLines};

/// Memory of one pipeline rank (the most loaded rank of that stage), in bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct StageMemory {
    pub stage: u32,
    pub weights: u64,
    /// A low-precision recipe's cached weight copies, transposes and scale tensors
    /// (src/model/low_precision.rs); zero without a recipe.
    #[serde(skip_serializing_if = "is_zero")]
    pub low_precision_weights: u64,
    pub gradients: u64,
    pub optimizer: u64,
    pub activations: u64,
    pub buffers: u64,
    pub total: u64,
    /// Host memory holding the offloaded layers' saved activations
    /// (`training.offload_activation_layers`; src/offload.rs); zero without offloading.
    #[serde(skip_serializing_if = "is_zero")]
    pub host_offload: u64,
    /// Host memory holding the offloaded optimizer state (`training.optimizer_offload_fraction`;
    /// src/memory/optimizer_offload.rs), which the `optimizer` line no longer holds; zero
    /// without CPU optimizer offload.
    #[serde(skip_serializing_if = "is_zero")]
    pub host_optimizer: u64,
    /// The framework's gradient reduce bucket(s) (DeepSpeed's `reduce_bucket_size`;
    /// src/memory/deepspeed.rs), within `total` at the moment it lives; zero where the
    /// framework's bucket is a view of a buffer counted elsewhere.
    #[serde(skip_serializing_if = "is_zero")]
    pub reduce_bucket: u64,
    /// The optimizer step's flat gradient copies (DeepSpeed; src/memory/deepspeed.rs), live
    /// only during the step, within `total` when the step is the rank's worst moment.
    #[serde(skip_serializing_if = "is_zero")]
    pub step_grads: u64,
    /// The step's fp32 overflow-check and fp64 norm copies of its largest gradient piece
    /// (DeepSpeed ZeRO-1/2; src/memory/deepspeed.rs), one at a time, before the flat copies.
    #[serde(skip_serializing_if = "is_zero")]
    pub grad_check_copies: u64,
    /// What the caching allocator keeps reserved beyond `total` (src/memory/allocator.rs):
    /// `total + allocator_cache` is what `torch.cuda.max_memory_reserved()` and nvidia-smi show.
    #[serde(skip_serializing_if = "is_zero")]
    pub allocator_cache: u64,
    /// The CUDA context (src/memory/runtime.rs), within `buffers`; zero on a profile without
    /// `[runtime_memory]`, whose `runtime_overhead_bytes` holds it.
    #[serde(skip_serializing_if = "is_zero")]
    pub cuda_context: u64,
    /// The BLAS workspace of the GEMM stream (src/memory/runtime.rs), within `buffers`.
    #[serde(skip_serializing_if = "is_zero")]
    pub blas_workspace: u64,
    /// NCCL's connection buffers by process group (src/memory/runtime.rs), within `buffers`.
    #[serde(skip_serializing_if = "no_nccl")]
    pub nccl_buffers: NcclBuffers,
    /// The rest of `buffers` line by line, for the memory lines of the table and the GUI
    /// (src/report/memory_lines.rs); not in the JSON, whose figures it only splits.
    #[serde(skip)]
    pub buffer_parts: BufferParts,
}

/// The parts of [`StageMemory::buffers`] beside the runtime lines, in bytes: with
/// `cuda_context`, `blas_workspace` and `nccl_buffers` they sum to `buffers` exactly.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BufferParts {
    /// The GPU profile's `runtime_overhead_bytes` (a profile without `[runtime_memory]`).
    pub runtime_overhead: u64,
    /// The sequence-parallel all-gather buffer of the rank's largest block.
    pub sp_gather: u64,
    /// The pipeline's receive buffer (and the output handed on at the bottom of a V); the
    /// send buffer is a forward transient, among the phase buffers.
    pub pipeline: u64,
    /// torch FSDP2's root module (the embedding) held gathered from forward to backward.
    pub fsdp_root: u64,
    /// The rank's worst phase ([`PhaseBuffers::max`]): ZeRO-3's gathered units, gradient
    /// buckets, FSDP double buffers and the ops' transients.
    pub phase: u64,
    /// Whether DeepSpeed's reduce bucket is among the phase buffers (its backward hooks fill
    /// it) rather than live after the backward.
    pub reduce_bucket_in_phase: bool,
}

impl BufferParts {
    /// The fixed buffers beside the runtime lines (all but the phase).
    pub fn fixed(&self) -> u64 {
        self.runtime_overhead + self.sp_gather + self.pipeline + self.fsdp_root
    }
}

fn no_nccl(n: &NcclBuffers) -> bool {
    n.total() == 0
}

impl StageMemory {
    /// The caching allocator's reserved peak: the allocated peak and the blocks it cannot reuse.
    pub fn reserved(&self) -> u64 {
        self.total.saturating_add(self.allocator_cache)
    }
}

fn is_zero(x: &u64) -> bool {
    *x == 0
}

/// Buffers beyond the fixed ones (SP gather, pipeline send/receive, runtime), by phase.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PhaseBuffers {
    /// While any block runs forward: ZeRO-3's two gathered parameter sets (the one in use and
    /// the one beside it, as a prefetch holds them), and the largest forward transient of any op.
    pub forward: u64,
    /// While the output block (and the MTP modules after it) runs forward: the same for those
    /// blocks alone, the only transients live once the output block's saved set exists.
    pub output_forward: u64,
    /// While the output block runs backward: its gathered weights and backward transient
    /// (with its gradient bucket).
    pub output_backward: u64,
    /// While a decoder layer (or the embedding) runs backward: the same for the largest one.
    pub layer_backward: u64,
    /// During a split backward's W pass: the gradient bucket alone.
    pub weight_pass: u64,
    /// Bytes each in-flight microbatch keeps beside its saved set on a chunk that is not the
    /// last (its output) and on one that is not the first (its received input): DeepSpeed's
    /// pipeline buffers (src/memory/deepspeed.rs); not a phase buffer.
    pub kept_output: u64,
    pub kept_input: u64,
}

impl PhaseBuffers {
    pub fn max(&self) -> u64 {
        self.forward
            .max(self.output_forward)
            .max(self.output_backward)
            .max(self.layer_backward)
            .max(self.weight_pass)
    }
}

/// What a pipeline rank's phase buffers depend on beyond the blocks it runs.
#[derive(Debug, Clone, Copy)]
struct RankPhases {
    zero: u8,
    weight_bytes: u64,
    grad_bytes: u64,
    /// The schedule splits its backward (zero-bubble): W fills the gradient buckets.
    split: bool,
    /// ZeRO-3's two gathered parameter sets while a forward runs.
    gathered_sets: u64,
    /// A chunk's output waiting in the send buffer after its forward (0 at the bottom of a V,
    /// where the next stage is on the same rank).
    pp_send: u64,
    /// An FSDP implementation's double buffers in backward beyond the generic ZeRO model's
    /// (`Fsdp::extra_backward_units`): the prefetched unit's gathered weights and the
    /// previous unit's gradients still reduce-scattering, the rank's largest of each.
    fsdp_backward: u64,
    /// The gradient buffer of those alone (what a split backward's W pass adds).
    fsdp_grads: u64,
    /// The framework's gradient reduce bucket where its backward fills it (DeepSpeed ZeRO-1/2
    /// without a pipeline).
    framework_backward: u64,
    /// The vocabulary table's fresh weight gradient while the embedding or the output block
    /// runs backward (DeepSpeed: `AccumulateGrad`, src/memory/deepspeed.rs).
    table_wgrad: u64,
    /// [`PhaseBuffers::kept_output`] and [`PhaseBuffers::kept_input`].
    kept_output: u64,
    kept_input: u64,
}

impl RankPhases {
    /// The phase buffers while the blocks of `chunks` run: the rank's (all its chunks) for the
    /// buffers category, one chunk's for the moments of that chunk's passes, which hold only
    /// its own blocks' transients.
    fn of(&self, s: &LedgerSummary, chunks: &[ChunkContents]) -> PhaseBuffers {
        let held = held_blocks(chunks, s);
        let blocks = || held.iter().copied();
        let (zero, w, g) = (self.zero, self.weight_bytes, self.grad_bytes);
        let gathered_of = |b: &BlockSummary| if zero >= 3 { b.params.rank() * w } else { 0 };
        let bucket_of = |b: &BlockSummary| {
            if zero >= 2 {
                (b.params.rank_dense_trainable + b.params.rank_expert_trainable) * g
            } else {
                0
            }
        };
        // A full backward's transient counts the buckets from their first weight gradient on
        // and the gathered weights of the unit running (the MTP module's three units apart).
        let table = |b: &BlockSummary| std::ptr::eq(b, &s.embedding) || std::ptr::eq(b, &s.output);
        let backward_of = |b: &BlockSummary| {
            self.fsdp_backward
                + self.framework_backward
                + if table(b) { self.table_wgrad } else { 0 }
                + if self.split {
                    gathered_of(b) + b.backward_temp_split
                } else {
                    b.backward_temp
                }
        };
        let has_output = chunks.iter().any(|c| c.output);
        let after_layers = |b: &&BlockSummary| {
            std::ptr::eq(*b, &s.output) || s.mtp.as_ref().is_some_and(|m| std::ptr::eq(*b, m))
        };
        // ZeRO-3 while the blocks after the layers run (the output block, the MTP modules):
        // the unit in use, one of theirs, and the unit before it (the last layer's experts or
        // dense part for the output block), at most the rank's largest, in place of the
        // rank's two largest.
        let unit = |b: &BlockSummary| b.gather_dense.max(b.gather_expert);
        let after_layers_gathered = if zero >= 3 {
            let own = blocks().filter(after_layers).map(unit).max().unwrap_or(0);
            (own + blocks().map(unit).max().unwrap_or(0)) * w
        } else {
            0
        };
        PhaseBuffers {
            forward: self.gathered_sets
                + blocks()
                    .map(|b| b.temp)
                    .max()
                    .unwrap_or(0)
                    .max(self.pp_send),
            output_forward: if has_output {
                after_layers_gathered
                    + blocks()
                        .filter(after_layers)
                        .map(|b| b.temp)
                        .max()
                        .unwrap_or(0)
            } else {
                0
            },
            output_backward: if has_output {
                backward_of(&s.output)
            } else {
                0
            },
            layer_backward: blocks()
                .filter(|b| !std::ptr::eq(*b, &s.output))
                .map(backward_of)
                .max()
                .unwrap_or(0),
            weight_pass: if self.split {
                self.fsdp_grads + blocks().map(bucket_of).max().unwrap_or(0)
            } else {
                0
            },
            kept_output: self.kept_output,
            kept_input: self.kept_input,
        }
    }
}

/// The activation peak of a rank, and the worst moment of activations plus phase buffers.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ActivationPeak {
    /// The most activation bytes live at once.
    pub activations: u64,
    /// The most activation bytes plus the buffers of the phase running at that moment.
    pub with_buffers: u64,
}

/// Peak activation bytes of a pipeline rank playing `actions` over its `chunks`: a chunk's
/// saved set lives from its F to its B; a split backward (Qi et al. 2024) frees the set at I
/// but keeps what W needs (each linear layer's input and output gradient) until W. Each chunk
/// is counted with its own contents (the first holds the embedding, the last the output layer
/// and its fp32 softmax). Under full recompute a layer's whole set exists while its forward
/// runs and while it is rebuilt in backward, on top of the kept inputs. Each moment is also
/// taken with the buffers of the phase that runs then, in the chunk that runs it (`phases`,
/// by stage: a chunk's pass holds only its own blocks' transients), since activations and
/// buffers peak at different times.
pub fn activation_peak(
    actions: &[ComputeAction],
    chunks: &[ChunkContents],
    s: &LedgerSummary,
    recompute: Recompute,
    phases: &[(u32, PhaseBuffers)],
) -> ActivationPeak {
    let chunk = |stage: u32| chunk_bytes(chunks, s, recompute, phases, stage);
    // A rank holds a few chunks: a short list beats a hash map. Each with the buffers of its
    // passes, looked up once here rather than per action.
    let (peak, with) = match chunks {
        [only] => walk::peaks(actions, &[chunk(only.stage as u32)], None),
        _ => {
            let by_stage: Vec<ChunkBytes<i128>> =
                chunks.iter().map(|c| chunk(c.stage as u32)).collect();
            walk::peaks(actions, &by_stage, None)
        }
    };
    ActivationPeak {
        activations: peak.max(0) as u64,
        with_buffers: with.max(0) as u64,
    }
}

/// The bytes the activation walk adds for the chunks of `chunks` at `stage`, with the buffers
/// of their passes from `phases` (by stage).
fn chunk_bytes(
    chunks: &[ChunkContents],
    s: &LedgerSummary,
    recompute: Recompute,
    phases: &[(u32, PhaseBuffers)],
    stage: u32,
) -> ChunkBytes<i128> {
    let mut c: ChunkBytes<i128> = ChunkBytes {
        stage,
        ..ChunkBytes::default()
    };
    for ch in chunks.iter().filter(|c| c.stage == stage as usize) {
        for (b, n) in ch.blocks(s) {
            let n = n as i128;
            c.saved += b.saved as i128 * n;
            c.pending += b.wgrad_pending as i128 * n;
            if recompute == Recompute::Full && b.saved != b.saved_all {
                c.rebuilt = c.rebuilt.max((b.saved_all - b.saved) as i128);
            }
        }
        if ch.output {
            c.tail += s.output.saved as i128;
            c.tail_pending += s.output.wgrad_pending as i128;
        }
    }
    let phase = phases
        .iter()
        .find(|(st, _)| *st == stage)
        .map(|(_, p)| *p)
        .unwrap_or_default();
    for ch in chunks.iter().filter(|c| c.stage == stage as usize) {
        if !ch.output {
            c.saved += phase.kept_output as i128;
        }
        if !ch.embedding {
            c.saved += phase.kept_input as i128;
        }
    }
    c.fwd = phase.forward as i128;
    c.out_fwd = phase.output_forward as i128;
    c.out_bwd = phase.output_backward as i128;
    c.layer_bwd = phase.layer_backward as i128;
    c.wpass = phase.weight_pass as i128;
    c
}

/// What a pipeline rank runs, for its activation peak.
#[derive(Debug, Clone, Copy)]
pub enum Pipeline<'a> {
    /// Its action list from the schedule generator: the exact walk of [`activation_peak`].
    Actions(&'a [ComputeAction]),
    /// The same, for an action list of whole forwards and backwards of one stage with at most
    /// `sets` live ([`crate::schedule::whole_passes_sets`], kept with a generated program):
    /// the walk's result in closed form.
    WholePasses {
        actions: &'a [ComputeAction],
        sets: u32,
    },
    /// Only the peak number of live chunk sets (programs too long to walk, or a lower bound):
    /// that many sets of the rank's average chunk, plus the layer full recompute rebuilds;
    /// `split` when the schedule splits its backward (its W pass fills the gradient bucket).
    Inflight { sets: u32, split: bool },
}

/// Trainable parameters whose optimizer state a rank holds and updates: its shard over the
/// replica group under ZeRO-1 and above (Rajbhandari et al. 2020), else all of them. Memory
/// holds [`crate::model::OptimizerState::state_bytes`] of them; the step streams
/// [`crate::model::OptimizerState::step_bytes`] (Muon: [`crate::model::optimizer_bytes`]).
pub fn updated_params(r: &Resolved, p: &ParamSums) -> u64 {
    if r.config.parallel.zero >= 1 {
        p.rank_dense_trainable.div_ceil(r.dense_replicas() as u64)
            + p.rank_expert_trainable.div_ceil(r.expert_dp() as u64)
    } else {
        p.rank_dense_trainable + p.rank_expert_trainable
    }
}

/// Memory of pipeline rank `rank` holding `chunks` and running `pipeline`.
pub fn stage_memory(
    r: &Resolved,
    s: &LedgerSummary,
    l: &Ledger,
    rank: u32,
    chunks: &[ChunkContents],
    pipeline: Pipeline,
) -> StageMemory {
    let split = splits_backward(&pipeline);
    let st = RankStatic::of(r, s, l, chunks, split, RuntimeLines::of(r));
    st.memory(r, s, rank, chunks, pipeline, None)
}

/// [`stage_memory`] of every pipeline rank (`pipeline(rank)` is what it runs). Ranks that hold
/// the same blocks (the middle of a pipeline) differ only in their activation walk: the rest
/// of their memory is worked out once.
pub fn stage_memories<'p>(
    r: &Resolved,
    s: &LedgerSummary,
    l: &Ledger,
    chunks: &[Vec<ChunkContents>],
    pipeline: impl Fn(usize) -> Pipeline<'p>,
) -> Vec<StageMemory> {
    rank_memories(r, s, l, chunks, pipeline).collect()
}

/// The largest of [`stage_memories`]' allocated peaks (what decides a fit: the caching
/// allocator returns its cache before a request fails, src/memory/allocator.rs), or, once
/// some rank's exceeds `stop_above`, that rank's (a figure above the limit, without walking the
/// ranks left): a search only asks whether a mix fits.
pub fn peak_total_until<'p>(
    r: &Resolved,
    s: &LedgerSummary,
    l: &Ledger,
    chunks: &[Vec<ChunkContents>],
    pipeline: impl Fn(usize) -> Pipeline<'p>,
    stop_above: u64,
) -> u64 {
    let mut most = 0;
    for m in rank_memories(r, s, l, chunks, pipeline) {
        most = most.max(m.total);
        if most > stop_above {
            break;
        }
    }
    most
}

/// [`stage_memory`] of each pipeline rank in turn, worked out as the caller asks for it.
fn rank_memories<'a, 'p>(
    r: &'a Resolved,
    s: &'a LedgerSummary,
    l: &'a Ledger,
    chunks: &'a [Vec<ChunkContents>],
    pipeline: impl Fn(usize) -> Pipeline<'p> + 'a,
) -> impl Iterator<Item = StageMemory> + 'a {
    let mut alike = AlikeRanks::new(r, s, l, chunks);
    // Each set of alike ranks' walk bytes (ranks of one chunk), worked out by its first.
    let mut bytes: Vec<Option<ChunkBytes<i128>>> = Vec::new();
    let recompute = r.config.training.recompute;
    (0..chunks.len()).map(move |rank| {
        let pl = pipeline(rank);
        let (st, first, set) = alike.indexed(rank, splits_backward(&pl));
        if first {
            let single = match &chunks[rank][..] {
                [only] => Some(st.single_bytes(s, recompute, only)),
                _ => None,
            };
            bytes.push(single);
        }
        let single = bytes.get(set).and_then(Option::as_ref);
        st.memory(r, s, rank as u32, &chunks[rank], pl, single)
    })
}

/// The most loaded rank's total with `sets` activation sets in flight on each rank
/// ([`Pipeline::Inflight`]), as the largest of [`stage_memories`]' totals: under that
/// pipeline a rank's memory follows from what it holds alone, so only the first of each set
/// of alike ranks ([`AlikeRanks`]) is worked out.
pub fn inflight_peak_bytes(
    r: &Resolved,
    s: &LedgerSummary,
    l: &Ledger,
    chunks: &[Vec<ChunkContents>],
    sets: u32,
    split: bool,
) -> u64 {
    inflight_peak_bytes_memo(r, s, l, chunks, sets, split, None)
}

/// [`inflight_peak_bytes`] with the static memories taken from, and kept in, `memo` (see
/// [`RankStaticMemo`] for when that is valid).
pub fn inflight_peak_bytes_memo(
    r: &Resolved,
    s: &LedgerSummary,
    l: &Ledger,
    chunks: &[Vec<ChunkContents>],
    sets: u32,
    split: bool,
    memo: Option<&mut RankStaticMemo>,
) -> u64 {
    let mut alike = AlikeRanks::new(r, s, l, chunks);
    alike.memo = memo;
    let pl = Pipeline::Inflight { sets, split };
    (0..chunks.len())
        .filter_map(|rank| {
            alike.inflight_total(rank, split, sets, |st| {
                st.memory(r, s, rank as u32, &chunks[rank], pl, None).total
            })
        })
        .max()
        .unwrap_or(0)
}

/// True when two ranks hold the same blocks chunk by chunk (whatever their stages): their
/// parameters, step-level collectives, data-parallel tails and memory but for the activation
/// walk are the same.
pub fn same_blocks(a: &[ChunkContents], b: &[ChunkContents]) -> bool {
    a.len() == b.len()
        && a.iter().zip(b).all(|(x, y)| {
            ChunkContents {
                stage: y.stage,
                ..*x
            } == *y
        })
}

/// Whether `pipeline` splits its backward (zero-bubble schedules).
fn splits_backward(pipeline: &Pipeline) -> bool {
    match pipeline {
        Pipeline::Actions(actions) => actions.iter().any(|a| a.kind == ActionKind::I),
        Pipeline::WholePasses { .. } => false,
        Pipeline::Inflight { split, .. } => *split,
    }
}

/// Whether a chunk of the rank hands its output to the next stage on the same rank (the
/// bottom of a V).
fn hands_off(chunks: &[ChunkContents]) -> bool {
    chunks
        .iter()
        .any(|a| chunks.iter().any(|b| b.stage == a.stage + 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A ledger summary whose dense layer saves 100 bytes (20 kept for W) with a forward
    /// transient of 10 and a split-backward one of 50; the output block saves 30 (5 for W)
    /// with transients of 3 forward and 4 backward; an MoE layer's split backward holds 70.
    fn summary() -> LedgerSummary {
        let block = |saved, pending, temp, backward| BlockSummary {
            saved,
            saved_all: saved,
            wgrad_pending: pending,
            temp,
            backward_temp_split: backward,
            ..BlockSummary::default()
        };
        LedgerSummary {
            embedding: BlockSummary::default(),
            dense: block(100, 20, 10, 50),
            moe: Some(block(100, 20, 10, 70)),
            output: block(30, 5, 3, 4),
            mtp: None,
            variants: Vec::new(),
            dense_hp: None,
            moe_hp: None,
        }
    }

    fn phases() -> RankPhases {
        RankPhases {
            zero: 0,
            weight_bytes: 4,
            grad_bytes: 4,
            split: true,
            gathered_sets: 0,
            pp_send: 0,
            fsdp_backward: 0,
            fsdp_grads: 0,
            framework_backward: 0,
            table_wgrad: 0,
            kept_output: 0,
            kept_input: 0,
        }
    }

    #[test]
    fn the_layers_backward_transient_comes_once_the_output_blocks_set_is_freed() {
        // One chunk, a dense layer and the output block; F, I, W of one microbatch. By hand:
        // F leaves 130 live; the layer's forward ran before the output block's 30 existed
        // (100 + 10), the output block runs with all 130 and its own 3 (133). I: the output
        // block's backward with all 130 and its 4 (134); then the layer's with 50, once the
        // output block freed its 30 but for the 5 its W needs: 100 + 5 + 50 = 155. Taking the
        // layer's 50 with all 130 live gave 180, and the layer's 10 at the forward's end 140.
        let s = summary();
        let chunk = ChunkContents {
            stage: 0,
            dense_layers: 1,
            output: true,
            ..ChunkContents::default()
        };
        let p = phases().of(&s, &[chunk]);
        assert_eq!(
            (
                p.forward,
                p.output_forward,
                p.output_backward,
                p.layer_backward
            ),
            (10, 3, 4, 50)
        );
        let actions =
            [ActionKind::F, ActionKind::I, ActionKind::W].map(|k| ComputeAction::new(k, 0, 0));
        let peak = activation_peak(&actions, &[chunk], &s, Recompute::None, &[(0, p)]);
        assert_eq!(peak.activations, 130);
        assert_eq!(peak.with_buffers, 155);
    }

    #[test]
    fn a_chunks_passes_hold_only_its_own_blocks_transients() {
        // A V's first chunk (a dense layer) and last (an MoE layer): the dense chunk's backward
        // holds the dense layer's 50, not the MoE layer's 70; the rank's buffers take 70.
        let s = summary();
        let dense = ChunkContents {
            stage: 0,
            dense_layers: 1,
            ..ChunkContents::default()
        };
        let moe = ChunkContents {
            stage: 3,
            moe_layers: 1,
            ..ChunkContents::default()
        };
        assert_eq!(phases().of(&s, &[dense]).layer_backward, 50);
        assert_eq!(phases().of(&s, &[moe]).layer_backward, 70);
        assert_eq!(phases().of(&s, &[dense, moe]).max(), 70);
        // With the dense chunk's backward at its peak (two microbatches in flight), the
        // moment is 2 x 100 + 50 = 250, where the rank-wide phase gave 270.
        let actions = [
            ComputeAction::new(ActionKind::F, 0, 0),
            ComputeAction::new(ActionKind::F, 0, 1),
            ComputeAction::new(ActionKind::I, 0, 0),
        ];
        let per_chunk = [(0, phases().of(&s, &[dense])), (3, phases().of(&s, &[moe]))];
        let peak = activation_peak(&actions, &[dense, moe], &s, Recompute::None, &per_chunk);
        assert_eq!(peak.with_buffers, 250);
    }
}
