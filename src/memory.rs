//! Per-rank memory, pipeline stage by pipeline stage: weights, gradients, optimizer states
//! (sharded by ZeRO over the group that really holds replicas), activations of the in-flight
//! microbatches, and buffers.

use crate::comm::Links;
use crate::config::{Recompute, Resolved};
use crate::model::{Block, GroupBytes, Ledger, ParamSums};
use crate::schedule::{Action, ActionKind};
use crate::time::{block_times, BlockTimes, Overlaps, Rates};
use serde::Serialize;

/// Sums of one block computed once (the estimate multiplies them by layer counts).
#[derive(Debug, Clone, Copy, Default)]
pub struct BlockSummary {
    pub params: ParamSums,
    /// Saved bytes per microbatch under the configured recompute.
    pub saved: u64,
    /// Saved bytes per microbatch without recomputation (what a recomputed layer rebuilds).
    pub saved_all: u64,
    /// Bytes held from a split backward's I to its W per microbatch
    /// ([`Block::wgrad_pending_bytes`]).
    pub wgrad_pending: u64,
    /// The largest transient of the block's full backward ([`Block::backward_temp_full_bytes`]).
    pub backward_temp: u64,
    /// The same for a split backward's input-gradient pass ([`Block::backward_temp_bytes`]).
    pub backward_temp_split: u64,
    /// The largest forward transient above the block's saved set
    /// ([`Block::forward_temp_bytes`]).
    pub temp: u64,
    /// Wire bytes per microbatch, per group, recomputation included.
    pub comm: GroupBytes,
    pub model_flops: f64,
    /// This rank's FLOPs per microbatch, forward / input-gradient / weight-gradient.
    pub rank_fwd: f64,
    pub rank_dgrad: f64,
    pub rank_wgrad: f64,
    /// Forward FLOPs rerun by recomputation: model count, this rank.
    pub recompute_model: f64,
    pub recompute_rank: f64,
    /// Per-microbatch times on this rank (zero when summarised without a time model).
    pub times: BlockTimes,
}

/// What the time model needs to time a block.
#[derive(Debug, Clone, Copy)]
pub struct TimingContext<'a> {
    pub rates: Rates<'a>,
    pub links: &'a Links,
    pub overlaps: Overlaps,
    pub cp_comm: crate::config::CpComm,
}

impl BlockSummary {
    pub fn of(b: &Block, recompute: Recompute) -> BlockSummary {
        Self::timed(b, recompute, None)
    }

    /// Summarises a block, timing it when a context is given.
    pub fn timed(b: &Block, recompute: Recompute, t: Option<&TimingContext>) -> BlockSummary {
        let mf = b.model_flops();
        let rf = b.rank_flops();
        let (recompute_model, recompute_rank) = b.recompute_flops(recompute);
        BlockSummary {
            params: b.params(),
            saved: b.saved_bytes(recompute),
            saved_all: b.saved_all_bytes(),
            wgrad_pending: 0,
            backward_temp: 0,
            backward_temp_split: 0,
            temp: b.forward_temp_bytes(recompute),
            comm: b.comm_bytes(recompute),
            model_flops: mf.total(),
            rank_fwd: rf.fwd,
            rank_dgrad: rf.dgrad,
            rank_wgrad: rf.wgrad,
            recompute_model,
            recompute_rank,
            times: t.map_or_else(BlockTimes::default, |t| {
                block_times(b, &t.rates, t.links, t.overlaps, recompute, t.cp_comm)
            }),
        }
    }
}

/// Block summaries of a ledger.
#[derive(Debug, Clone)]
pub struct LedgerSummary {
    pub embedding: BlockSummary,
    pub dense: BlockSummary,
    pub moe: Option<BlockSummary>,
    pub output: BlockSummary,
    pub mtp: Option<BlockSummary>,
}

impl LedgerSummary {
    /// Sums without times (parameters, memory, FLOPs, communication volume).
    pub fn of(l: &Ledger, recompute: Recompute) -> LedgerSummary {
        Self::timed(l, recompute, None)
    }

    /// Sums with per-block times.
    pub fn timed(l: &Ledger, recompute: Recompute, t: Option<&TimingContext>) -> LedgerSummary {
        // The gradient arriving from the block above (residual-sized); the output block's
        // backward starts from the loss, with no incoming gradient.
        let sum_with = |b: &Block, incoming: u64| BlockSummary {
            wgrad_pending: b.wgrad_pending_bytes(l.dims.act),
            backward_temp: b.backward_temp_full_bytes(incoming),
            backward_temp_split: b.backward_temp_bytes(incoming),
            ..BlockSummary::timed(b, recompute, t)
        };
        let sum = |b: &Block| sum_with(b, l.dims.residual_bytes());
        LedgerSummary {
            embedding: sum(&l.embedding),
            dense: sum(&l.dense),
            moe: l.moe.as_ref().map(sum),
            output: sum_with(&l.output, 0),
            mtp: l.mtp.as_ref().map(sum),
        }
    }
}

/// What one global pipeline stage (model chunk) holds.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ChunkContents {
    pub stage: usize,
    pub embedding: bool,
    pub dense_layers: u32,
    pub moe_layers: u32,
    pub output: bool,
    pub mtp_layers: u32,
}

impl ChunkContents {
    /// The chunk's blocks with their multiplicities.
    pub fn blocks<'a>(
        &self,
        s: &'a LedgerSummary,
    ) -> impl Iterator<Item = (&'a BlockSummary, u64)> {
        let items: [(Option<&'a BlockSummary>, u64); 5] = [
            (Some(&s.embedding), self.embedding as u64),
            (Some(&s.dense), self.dense_layers as u64),
            (s.moe.as_ref(), self.moe_layers as u64),
            (Some(&s.output), self.output as u64),
            (s.mtp.as_ref(), self.mtp_layers as u64),
        ];
        items
            .into_iter()
            .filter_map(|(b, n)| b.filter(|_| n > 0).map(|b| (b, n)))
    }
}

/// The chunks of every pipeline rank, in stage order.
pub fn chunks_per_rank(r: &Resolved) -> Vec<Vec<ChunkContents>> {
    let m = &r.config.model;
    let pl = &r.placement;
    let last = pl.num_stages() - 1;
    let mut out = vec![Vec::new(); r.config.parallel.pp as usize];
    for (stage, layers) in pl.stage_layers.iter().enumerate() {
        let moe_layers = layers.clone().filter(|&l| m.is_moe_layer(l)).count() as u32;
        out[pl.stage_rank[stage] as usize].push(ChunkContents {
            stage,
            embedding: stage == 0,
            dense_layers: layers.len() as u32 - moe_layers,
            moe_layers,
            output: stage == last,
            mtp_layers: if stage == last { m.mtp_num_layers } else { 0 },
        });
    }
    out
}

/// Memory of one pipeline rank (the most loaded rank of that stage), in bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct StageMemory {
    pub stage: u32,
    pub weights: u64,
    pub gradients: u64,
    pub optimizer: u64,
    pub activations: u64,
    pub buffers: u64,
    pub total: u64,
}

/// Parameters held by one pipeline rank (before ZeRO-3 sharding).
pub fn rank_params(chunks: &[ChunkContents], s: &LedgerSummary) -> ParamSums {
    let mut p = ParamSums::default();
    for c in chunks {
        for (b, n) in c.blocks(s) {
            p.add(&b.params, n);
        }
    }
    p
}

/// Buffers beyond the fixed ones (SP gather, pipeline send/receive, runtime), by phase.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PhaseBuffers {
    /// While any block runs forward: ZeRO-3's gathered block and its prefetch, and the
    /// largest forward transient of any op.
    pub forward: u64,
    /// While the output block runs backward: its gathered weights, gradient bucket and
    /// backward transient.
    pub output_backward: u64,
    /// While a decoder layer (or the embedding) runs backward: the same for the largest one.
    pub layer_backward: u64,
    /// During a split backward's W pass: the gradient bucket alone.
    pub weight_pass: u64,
}

impl PhaseBuffers {
    pub fn max(&self) -> u64 {
        self.forward
            .max(self.output_backward)
            .max(self.layer_backward)
            .max(self.weight_pass)
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
/// taken with the buffers of the phase that runs then (`phase`), since activations and
/// buffers peak at different times.
pub fn activation_peak(
    actions: &[Action],
    chunks: &[ChunkContents],
    s: &LedgerSummary,
    recompute: Recompute,
    phase: &PhaseBuffers,
) -> ActivationPeak {
    #[derive(Default, Clone, Copy)]
    struct Chunk {
        saved: i128,
        pending: i128,
        /// Saved bytes of the output block, which comes after the layers: freed first in
        /// backward, created last in forward.
        tail: i128,
        /// Full recompute: what the layer being rebuilt adds to its kept input.
        rebuilt: i128,
    }
    let chunk = |stage: u32| -> Chunk {
        let mut c = Chunk::default();
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
            }
        }
        c
    };
    // A rank holds one or two chunks: a short list beats a hash map.
    let by_stage: Vec<(u32, Chunk)> = chunks
        .iter()
        .map(|c| (c.stage as u32, chunk(c.stage as u32)))
        .collect();
    let (fwd, out_bwd, layer_bwd, wpass) = (
        phase.forward as i128,
        phase.output_backward as i128,
        phase.layer_backward as i128,
        phase.weight_pass as i128,
    );
    let mut live: i128 = 0;
    let mut peak: i128 = 0;
    let mut with: i128 = 0;
    let mut at = |a: i128, buf: i128, peak: &mut i128| {
        *peak = (*peak).max(a);
        with = with.max(a + buf);
    };
    for a in actions {
        let c = by_stage
            .iter()
            .find(|(st, _)| *st == a.stage)
            .map(|(_, c)| *c)
            .unwrap_or_default();
        match a.kind {
            ActionKind::F => {
                live += c.saved;
                // Full recompute: each layer's forward builds its whole set before keeping
                // only its input; the last layer does so before the output block's set exists.
                at(live - c.tail + c.rebuilt, fwd, &mut peak);
                at(live, fwd, &mut peak);
            }
            ActionKind::B | ActionKind::I => {
                // The output block's backward runs first, with everything still live; then
                // the layers, rebuilt one by one under full recompute.
                if c.tail > 0 {
                    at(live, out_bwd, &mut peak);
                }
                at(live - c.tail + c.rebuilt, layer_bwd, &mut peak);
                if a.kind == ActionKind::I {
                    // The pending set is built while the saved set is freed.
                    at(live + (c.pending - c.saved).max(0), layer_bwd, &mut peak);
                    live += c.pending - c.saved;
                } else {
                    live -= c.saved;
                }
            }
            ActionKind::W => {
                at(live, wpass, &mut peak);
                live -= c.pending;
            }
        }
        at(live, 0, &mut peak);
    }
    ActivationPeak {
        activations: peak.max(0) as u64,
        with_buffers: with.max(0) as u64,
    }
}

/// What a pipeline rank runs, for its activation peak.
#[derive(Debug, Clone, Copy)]
pub enum Pipeline<'a> {
    /// Its action list from the schedule generator: the exact walk of [`activation_peak`].
    Actions(&'a [Action]),
    /// Only the peak number of live chunk sets (programs too long to walk, or a lower bound):
    /// that many sets of the rank's average chunk, plus the layer full recompute rebuilds;
    /// `split` when the schedule splits its backward (its W pass fills the gradient bucket).
    Inflight { sets: u32, split: bool },
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
    let tr = &r.config.training;
    let par = &r.config.parallel;
    let d = &l.dims;
    let p = rank_params(chunks, s);
    let dense_rep = r.dense_replicas() as u64;
    let expert_rep = r.expert_dp() as u64;
    let shard = |n: u64, reps: u64| n.div_ceil(reps);
    let w = tr.weight_bytes();
    let g = tr.grad_dtype.bytes();
    let o = tr.optimizer_bytes_per_param();
    let zero = par.zero;
    let weights = if zero >= 3 {
        (shard(p.rank_dense, dense_rep) + shard(p.rank_expert, expert_rep)) * w
    } else {
        p.rank() * w
    };
    let grads = if zero >= 2 {
        (shard(p.rank_dense_trainable, dense_rep) + shard(p.rank_expert_trainable, expert_rep)) * g
    } else {
        (p.rank_dense_trainable + p.rank_expert_trainable) * g
    };
    let optimizer = if zero >= 1 {
        (shard(p.rank_dense_trainable, dense_rep) + shard(p.rank_expert_trainable, expert_rep)) * o
    } else {
        (p.rank_dense_trainable + p.rank_expert_trainable) * o
    };

    // Buffers: runtime overhead, the SP all-gather buffer, pipeline send/receive buffers,
    // then, by phase, ZeRO's gathered blocks and gradient bucket and the ops' transients:
    // - forward: ZeRO-3's gathered block and the prefetched next one, and the largest
    //   forward transient of any op;
    // - backward of a block: its gathered weights (ZeRO-3), its gradient bucket (ZeRO-2/3: a
    //   block's gradients at full size before they are reduce-scattered into the shard, as
    //   DeepSpeed's reduce bucket) and its backward transient; a split backward (zero-bubble
    //   schedules) fills the bucket only in its W pass, where nothing else is transient.
    let mut fixed = r.gpu.runtime_overhead_bytes;
    if d.sp {
        fixed += d.n * d.h * d.act;
    }
    // Pipeline: the receive buffer, and a send buffer. A chunk's output waits in it from its
    // forward to the send right after (a forward transient), unless the next stage sits on
    // the same rank (the bottom of a V), where it waits for that chunk's forward.
    let handoff = chunks
        .iter()
        .any(|a| chunks.iter().any(|b| b.stage == a.stage + 1));
    let pp_send = if par.pp > 1 { d.residual_bytes() } else { 0 };
    if par.pp > 1 {
        fixed += pp_send + if handoff { pp_send } else { 0 };
    }
    let blocks = || chunks.iter().flat_map(|c| c.blocks(s)).map(|(b, _)| b);
    let gathered_of = |b: &BlockSummary| if zero >= 3 { b.params.rank() * w } else { 0 };
    let bucket_of = |b: &BlockSummary| {
        if zero >= 2 {
            (b.params.rank_dense_trainable + b.params.rank_expert_trainable) * g
        } else {
            0
        }
    };
    let split = match pipeline {
        Pipeline::Actions(actions) => actions.iter().any(|a| a.kind == ActionKind::I),
        Pipeline::Inflight { split, .. } => split,
    };
    let backward_of = |b: &BlockSummary| {
        gathered_of(b)
            + if split {
                b.backward_temp_split
            } else {
                bucket_of(b) + b.backward_temp
            }
    };
    let has_output = chunks.iter().any(|c| c.output);
    let phase = PhaseBuffers {
        forward: 2 * blocks().map(gathered_of).max().unwrap_or(0)
            + blocks()
                .map(|b| b.temp)
                .max()
                .unwrap_or(0)
                .max(if handoff { 0 } else { pp_send }),
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
        weight_pass: if split {
            blocks().map(bucket_of).max().unwrap_or(0)
        } else {
            0
        },
    };

    // Activations: the chunk sets live at the worst moment of this rank's action list; the
    // total takes each moment with the buffers of the phase running then.
    let peak = match pipeline {
        Pipeline::Actions(actions) => activation_peak(actions, chunks, s, tr.recompute, &phase),
        Pipeline::Inflight { sets, .. } => {
            // That many sets of the rank's average chunk, plus the layer being rebuilt.
            let v = chunks.len().max(1) as u64;
            let per_microbatch: u64 = chunks
                .iter()
                .flat_map(|c| c.blocks(s))
                .map(|(b, n)| b.saved * n)
                .sum();
            let rebuilt = blocks()
                .filter(|b| tr.recompute == Recompute::Full && b.saved != b.saved_all)
                .map(|b| b.saved_all - b.saved)
                .max()
                .unwrap_or(0);
            let a = (per_microbatch * sets as u64).div_ceil(v) + rebuilt;
            ActivationPeak {
                activations: a,
                with_buffers: a + phase.max(),
            }
        }
    };
    let activations = peak.activations;
    let buffers = fixed + phase.max();
    // The worst moment, not the sum of each category's worst (which can be larger).
    let total = weights + grads + optimizer + fixed + peak.with_buffers;
    StageMemory {
        stage: rank,
        weights,
        gradients: grads,
        optimizer,
        activations,
        buffers,
        total,
    }
}
