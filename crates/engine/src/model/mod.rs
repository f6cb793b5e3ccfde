//! The op ledger: one description of the model as blocks of ops (docs/design.md). Parameter counts,
//! FLOPs, activation memory and communication are all sums over it.
//!
//! A [`Ledger`] is built once per configuration, with one block per kind (embedding, dense
//! layer, MoE layer, output, MTP module), each sized for one microbatch on the most loaded rank.

mod attention;
pub mod cast_kernels;
mod dims;
mod embedding;
pub mod layer_wise;
mod linear;
pub mod low_precision;
mod mamba;
mod mlp;
mod moe;
mod moe_latent;
mod moe_lora;
pub mod muon;
mod norm;
pub mod op;
mod optimizer;
pub mod per_group;
mod per_op;
mod recompute;
pub mod summary;

pub use dims::Dims;
pub use mamba::ssd_flops;
pub use mlp::fc1_width;
pub use moe::{imbalance_of_rank_load, rank_load_factor};
pub use op::{
    Collective, CollectiveKind, Flops, Op, OpKind, OpRole, ParamClass, Params, Phase, RingCalls,
    Saved, TensorRole,
};
pub use optimizer::{optimizer_bytes, OptimizerState};
pub use per_group::{CommKind, PerGroup};
pub use summary::{
    chunks_per_rank, held_blocks, rank_muon, rank_params, BlockSummary, BlockTimes, ChunkContents,
    LedgerSummary,
};

use crate::config::{AttentionSpan, HybridLayer, Recompute, RecomputeModule, Resolved};
use crate::layout::GroupKind;
use serde::Serialize;
use std::ops::Range;

/// What a block is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BlockKind {
    Embedding,
    DenseLayer,
    MoeLayer,
    Output,
    Mtp,
}

/// Parameter sums of a block.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct ParamSums {
    /// Unsharded count (one model replica).
    pub total: u64,
    /// This rank's non-expert parameters.
    pub rank_dense: u64,
    /// This rank's routed-expert parameters.
    pub rank_expert: u64,
    pub rank_dense_trainable: u64,
    pub rank_expert_trainable: u64,
    /// Unsharded count of TP-replicated parameters (norms, router, row biases).
    pub tp_replicated: u64,
    /// Unsharded count of routed-expert parameters.
    pub expert_total: u64,
    /// LoRA: adapter elements replicated over TP (see `Op::lora_replicated_params`).
    #[serde(skip_serializing_if = "op::is_zero")]
    pub lora_replicated: u64,
}

impl ParamSums {
    pub fn rank(&self) -> u64 {
        self.rank_dense + self.rank_expert
    }

    pub fn add(&mut self, o: &ParamSums, times: u64) {
        self.total += o.total * times;
        self.rank_dense += o.rank_dense * times;
        self.rank_expert += o.rank_expert * times;
        self.rank_dense_trainable += o.rank_dense_trainable * times;
        self.rank_expert_trainable += o.rank_expert_trainable * times;
        self.tp_replicated += o.tp_replicated * times;
        self.expert_total += o.expert_total * times;
        self.lora_replicated += o.lora_replicated * times;
    }
}

/// A block of ops: a transformer layer, or the embedding/output ends.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Block {
    pub kind: BlockKind,
    pub ops: Vec<Op>,
    /// The layer's input (the residual stream shard), which full recompute keeps.
    pub input_bytes: u64,
    /// Where its ZeRO-3 gather units start after the first op (empty: the block is one unit).
    /// The MTP module is three, as Megatron-Core builds it and the executor runs it: its input
    /// projection, its transformer layer and its head, each gathered on its own.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub unit_starts: Vec<usize>,
    /// A layer a low-precision recipe keeps in bf16 (`training.bf16_layers_at_start` /
    /// `_end`): its GEMMs run at the bf16 rate and it has no quantise kernels.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub high_precision: bool,
}

impl Block {
    /// Transformer layers (and MTP modules) are what activation recomputation applies to.
    pub fn is_layer(&self) -> bool {
        matches!(
            self.kind,
            BlockKind::DenseLayer | BlockKind::MoeLayer | BlockKind::Mtp
        )
    }

    pub fn params(&self) -> ParamSums {
        let mut s = ParamSums {
            lora_replicated: self.ops.iter().map(|o| o.lora_replicated_params).sum(),
            ..ParamSums::default()
        };
        for p in self.ops.iter().filter_map(|o| o.params) {
            s.total += p.total;
            match p.class {
                ParamClass::Expert => {
                    s.rank_expert += p.rank;
                    s.expert_total += p.total;
                    if p.trainable {
                        s.rank_expert_trainable += p.rank;
                    }
                }
                ParamClass::TpSharded | ParamClass::TpReplicated => {
                    s.rank_dense += p.rank;
                    if p.trainable {
                        s.rank_dense_trainable += p.rank;
                    }
                    if p.class == ParamClass::TpReplicated {
                        s.tp_replicated += p.total;
                    }
                }
            }
        }
        s
    }

    /// Its ZeRO-3 gather units, as op ranges ([`Block::unit_starts`], ascending), first to
    /// last; no allocation, since the search summarises blocks for every candidate.
    pub fn gather_units(&self) -> impl DoubleEndedIterator<Item = Range<usize>> + '_ {
        let n = self.ops.len();
        let k = self.unit_starts.len();
        (0..=k).map(move |j| {
            let start = if j == 0 { 0 } else { self.unit_starts[j - 1] };
            let end = if j == k { n } else { self.unit_starts[j] };
            start.min(n)..end.min(n)
        })
    }

    /// This rank's (dense, expert) parameters of the ops in `unit`.
    fn unit_params(&self, unit: Range<usize>) -> (u64, u64) {
        let mut sums = (0, 0);
        for p in self.ops[unit].iter().filter_map(|o| o.params) {
            if p.class == ParamClass::Expert {
                sums.1 += p.rank;
            } else {
                sums.0 += p.rank;
            }
        }
        sums
    }

    /// The largest sets ZeRO-3's forward gathers at once for this block: the largest dense
    /// part of a unit and its largest experts part (the expert space is gathered apart).
    pub fn largest_gather_sets(&self) -> (u64, u64) {
        self.gather_units()
            .map(|u| self.unit_params(u))
            .fold((0, 0), |(d, e), (dense, expert)| {
                (d.max(dense), e.max(expert))
            })
    }

    /// Every saved tensor's bytes (no recomputation).
    pub fn saved_all_bytes(&self) -> u64 {
        self.ops
            .iter()
            .flat_map(|o| &o.saved)
            .map(|s| s.bytes)
            .sum()
    }

    /// Bytes kept from forward to backward for one microbatch under `recompute`.
    pub fn saved_bytes(&self, recompute: Recompute) -> u64 {
        match recompute {
            Recompute::None => self.saved_all_bytes(),
            Recompute::Selective => self
                .ops
                .iter()
                .flat_map(|o| &o.saved)
                .filter(|s| !s.selective)
                .map(|s| s.bytes)
                .sum(),
            Recompute::Full if self.is_layer() => self.input_bytes,
            Recompute::Full => self.saved_all_bytes(),
        }
    }

    /// Bytes a split backward keeps from the input-gradient pass (I) to the weight-gradient
    /// pass (W) for one microbatch (Qi et al. 2024): each linear layer's saved input and its
    /// output gradient (m x n elements of `act` bytes; the sequence shard of it with SP for
    /// a row-parallel layer), the embedding's output gradient, and
    /// the small gradients of the other parameters (norms), computed in I and held in fp32.
    pub fn wgrad_pending_bytes(&self, act: u64) -> u64 {
        self.ops.iter().map(|o| op_wgrad_pending(o, act)).sum()
    }

    /// The largest transient of this block's backward when a split backward (Qi et al. 2024)
    /// holds every weight gradient's inputs until its W pass: the gradient arriving from the
    /// block above (`incoming` bytes, residual-sized) plus the widest gradient one op produces
    /// while the tensor it is the gradient of is still held (an op's input gradient is as large
    /// as the input it saved: the activation's n x fc1 / t, or dQ, dK, dV beside Q, K, V; or,
    /// with SP, an n x h partial sum before its reduce-scatter), on top of the block's whole
    /// saved set.
    pub fn backward_temp_bytes(&self, incoming: u64) -> u64 {
        let widest = self.ops.iter().map(Self::op_transient).max().unwrap_or(0);
        // With SP a column-parallel layer's input gradient is an n x h partial sum before its
        // reduce-scatter, as large as the row-parallel output before its own (the op's `temp`).
        incoming + widest.max(self.temp_bytes())
    }

    /// As [`Self::backward_temp_bytes`] for a full backward, whose weight gradients run at
    /// once: when op j's backward runs, the saved tensors of the ops after it are already
    /// freed, and the gradient of its output (`Op::grad_out_bytes`) is held beside its own
    /// (or its `temp`, the SP partial sum's size). Relative to the block's whole saved set.
    ///
    /// With `bucket_bytes` per trainable parameter (ZeRO-2/3's gradient buckets, 0 without),
    /// each parameter space's bucket (the experts', the rest's: Megatron keeps expert
    /// parameters apart) is held from its first weight gradient on, so it is counted at the
    /// ops from there down, not beside every saved tensor of the block: an MoE layer's dense
    /// bucket opens at the router, once the experts' saved tensors are freed.
    /// With `gather_bytes` per parameter (ZeRO-3's gathered weights, 0 below), the weights of
    /// the gather unit an op belongs to are held through its backward.
    pub fn backward_temp_full_bytes(
        &self,
        incoming: u64,
        bucket_bytes: u64,
        gather_bytes: u64,
    ) -> u64 {
        let trainable = |o: &Op| o.params.filter(|p| p.trainable);
        // Each parameter space's bucket in a unit: its trainable parameters x bucket_bytes.
        let space = |u: &Range<usize>, expert: bool| -> u64 {
            self.ops[u.clone()]
                .iter()
                .filter_map(trainable)
                .filter(|p| (p.class == ParamClass::Expert) == expert)
                .map(|p| p.rank)
                .sum::<u64>()
                * bucket_bytes
        };
        let mut later = 0u64;
        let mut worst = 0u64;
        // The saved bytes of an op whose input gradient took them over (`Op::grad_in_saved`):
        // freed only once the op before it has read that gradient.
        let mut deferred = 0u64;
        // Backward runs the units last to first; a unit's buckets are reduced and freed, and
        // its gathered weights released, when its backward ends.
        for u in self.gather_units().rev() {
            let (dense, expert) = self.unit_params(u.clone());
            let gathered = (dense + expert) * gather_bytes;
            let buckets = [space(&u, false), space(&u, true)];
            let mut opened = [false; 2];
            for o in self.ops[u].iter().rev() {
                if let Some(p) = trainable(o) {
                    opened[(p.class == ParamClass::Expert) as usize] = true;
                }
                let held: u64 = (0..2)
                    .filter(|&k| opened[k])
                    .map(|k| buckets[k])
                    .sum::<u64>()
                    + gathered;
                // An output gradient living in the next op's saved tensor is already counted.
                let grad_out = if deferred > 0 { 0 } else { o.grad_out_bytes };
                let temp = if o.grad_in_saved { 0 } else { o.temp_bytes };
                let here = (Self::op_transient(o) + grad_out).max(temp) + held;
                worst = worst.max(here.saturating_sub(later));
                later += std::mem::take(&mut deferred);
                let saved = o
                    .saved
                    .iter()
                    .filter(|s| !s.selective)
                    .map(|s| s.bytes)
                    .sum::<u64>();
                if o.grad_in_saved {
                    deferred = saved;
                } else {
                    later += saved;
                }
            }
        }
        incoming + worst
    }

    /// An op's saved (non-selective) bytes, the size of the gradients it produces, plus its
    /// backward scratch; only the scratch for an op that writes its input gradient over what
    /// it saved.
    fn op_transient(o: &Op) -> u64 {
        if o.grad_in_saved {
            return o.backward_scratch_bytes;
        }
        o.saved
            .iter()
            .filter(|s| !s.selective)
            .map(|s| s.bytes)
            .sum::<u64>()
            + o.backward_scratch_bytes
    }

    /// The largest forward transient above the block's whole saved set: op j's transient
    /// lives before the saved tensors of the ops after it exist (none of them are kept under
    /// full recomputation of a layer).
    pub fn forward_temp_bytes(&self, recompute: Recompute) -> u64 {
        let kept = |o: &Op| -> u64 {
            match recompute {
                Recompute::Full if self.is_layer() => 0,
                Recompute::Selective => o
                    .saved
                    .iter()
                    .filter(|s| !s.selective)
                    .map(|s| s.bytes)
                    .sum(),
                _ => o.saved.iter().map(|s| s.bytes).sum(),
            }
        };
        let mut later = 0u64;
        let mut worst = 0u64;
        for o in self.ops.iter().rev() {
            worst = worst.max(o.temp_bytes.saturating_sub(later));
            later += kept(o);
        }
        worst
    }

    /// The largest sequence-parallel gather (Korthikanti et al. 2022): the widest input an op
    /// all-gathers over TP in its forward, which lives in a buffer reused by every layer
    /// (Megatron's global memory buffer). Zero without SP.
    pub fn sp_gather_bytes(&self) -> u64 {
        self.ops
            .iter()
            .flat_map(|o| &o.comms)
            .filter(|c| {
                c.kind == CollectiveKind::AllGather
                    && c.group == GroupKind::Tp
                    && c.phase == Phase::Forward
            })
            .map(|c| c.payload_bytes)
            .max()
            .unwrap_or(0)
    }

    /// The largest transient allocation of any op.
    pub fn temp_bytes(&self) -> u64 {
        self.ops.iter().map(|o| o.temp_bytes).max().unwrap_or(0)
    }

    fn sum_flops(&self, rank: bool) -> Flops {
        let mut f = Flops::default();
        for o in &self.ops {
            f.add(if rank { &o.rank_flops } else { &o.model_flops });
        }
        f
    }

    /// Model FLOPs of one microbatch through this block (all ranks of one replica).
    pub fn model_flops(&self) -> Flops {
        self.sum_flops(false)
    }

    /// FLOPs this rank executes for one microbatch (without recomputation).
    pub fn rank_flops(&self) -> Flops {
        self.sum_flops(true)
    }

    /// True when `recompute` reruns op `o` of this block in its backward: the ops selective
    /// recompute marks, or every op of a layer under full recompute.
    pub fn reruns(&self, o: &Op, recompute: Recompute) -> bool {
        match recompute {
            Recompute::None => false,
            Recompute::Selective => o.recomputed_by_selective,
            Recompute::Full => self.is_layer(),
        }
    }

    /// The ops `recompute` reruns in backward.
    pub fn recomputed<'a>(&'a self, recompute: Recompute) -> impl Iterator<Item = &'a Op> + 'a {
        self.ops.iter().filter(move |o| self.reruns(o, recompute))
    }

    /// Forward FLOPs rerun in backward under `recompute`: (model count, this rank).
    pub fn recompute_flops(&self, recompute: Recompute) -> (f64, f64) {
        self.recomputed(recompute).fold((0.0, 0.0), |(m, r), o| {
            let share = o.rerun_compute_share();
            (m + o.model_flops.fwd * share, r + o.rank_flops.fwd * share)
        })
    }

    /// Wire bytes per group for one microbatch, including forward collectives that
    /// recomputation issues again.
    pub fn comm_bytes(&self, recompute: Recompute) -> PerGroup {
        let mut g = PerGroup::default();
        for o in &self.ops {
            for c in &o.comms {
                g.add_group(c.group, c.wire_bytes());
            }
        }
        for o in self
            .recomputed(recompute)
            .filter(|o| o.rerun_repeats_comms())
        {
            for c in o.comms.iter().filter(|c| c.phase == Phase::Forward) {
                g.add_group(c.group, c.wire_bytes());
            }
        }
        g
    }
}

/// What a split backward's W pass needs of one op, held from its I pass (Qi et al. 2024):
/// a trainable linear layer's input and its output gradient.
pub fn op_wgrad_pending(o: &Op, act: u64) -> u64 {
    let Some(p) = o.params.filter(|p| p.trainable) else {
        return 0;
    };
    // With SP an output that is reduce-scattered forward has its gradient all-gathered
    // backward; W keeps only this rank's sequence shard of it and gathers it again (as it
    // does the shard of a column-parallel input).
    let shards = o
        .comms
        .iter()
        .find(|c| {
            c.kind == CollectiveKind::ReduceScatter
                && c.phase == Phase::Forward
                && c.group == crate::layout::GroupKind::Tp
        })
        .map_or(1, |c| c.group_size as u64);
    match o.kind {
        OpKind::Matmul { m, n, .. } => {
            let input: u64 = o
                .saved
                .iter()
                .filter(|s| s.role == TensorRole::Input)
                .map(|s| s.bytes)
                .sum();
            input + m * n * act / shards
        }
        OpKind::MemoryBound { bytes } if o.role == OpRole::WordEmbedding => bytes / shards,
        _ => p.rank * 4,
    }
}

/// The ledger of one configuration.
#[derive(Debug, Clone, Serialize)]
pub struct Ledger {
    pub dims: Dims,
    pub embedding: Block,
    /// A full-attention dense layer.
    pub dense: Block,
    /// A full-attention MoE layer.
    pub moe: Option<Block>,
    pub output: Block,
    pub mtp: Option<Block>,
    /// The other layer kinds (sliding-window or chunked attention), one block each, in the
    /// order of [`crate::config::ModelConfig::layer_variants`].
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub variants: Vec<Block>,
    /// The dense and MoE layers a low-precision recipe keeps in bf16 (its first and last
    /// layers, `training.bf16_layers_at_start` / `_end`); absent without such layers.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dense_hp: Option<Block>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub moe_hp: Option<Block>,
}

impl Ledger {
    /// Builds the ledger of a resolved configuration.
    pub fn build(r: &Resolved) -> Ledger {
        let d = Dims::new(r);
        let m = &r.config.model;
        let tr = &r.config.training;
        let input_bytes = d.residual_bytes();
        let recipe = low_precision::Recipe::of(r);
        // A layer the recipe keeps in bf16 saves its linear inputs in bf16 too.
        let dh = Dims {
            quantized: None,
            proj_input_original: false,
            ..d.clone()
        };
        let build = |kind: BlockKind, span: AttentionSpan, hp: bool| {
            let d = if hp { &dh } else { &d };
            let mut ops = Vec::with_capacity(24);
            attention::attention_block(&mut ops, m, tr, d, span);
            match kind {
                BlockKind::MoeLayer => moe::moe_block(&mut ops, m, tr, d),
                _ => mlp::mlp_block(&mut ops, m, tr, d),
            }
            recompute::apply_modules(&mut ops, tr.recompute_modules());
            if tr.recomputes(RecomputeModule::PerOp) {
                per_op::apply(&mut ops, d);
            }
            match &recipe {
                Some(q) if !hp => low_precision::add_quantize_ops(&mut ops, q),
                _ => {}
            }
            Block {
                kind,
                ops,
                input_bytes,
                unit_starts: Vec::new(),
                high_precision: hp,
            }
        };
        let layer = |kind, span| build(kind, span, false);
        let dense = layer(BlockKind::DenseLayer, AttentionSpan::Full);
        let moe = m
            .is_moe()
            .then(|| layer(BlockKind::MoeLayer, AttentionSpan::Full));
        let keeps_bf16 = recipe.is_some() && tr.bf16_layers() != (0, 0);
        let dense_hp = keeps_bf16.then(|| build(BlockKind::DenseLayer, AttentionSpan::Full, true));
        let moe_hp = (keeps_bf16 && m.is_moe())
            .then(|| build(BlockKind::MoeLayer, AttentionSpan::Full, true));
        let variants = m
            .layer_variants()
            .into_iter()
            .map(|k| {
                let kind = if k.moe {
                    BlockKind::MoeLayer
                } else {
                    BlockKind::DenseLayer
                };
                let Some(h) = k.hybrid else {
                    return layer(kind, k.span);
                };
                // A hybrid layer holds one sublayer with its own pre-norm.
                let mut ops = Vec::with_capacity(16);
                match h {
                    HybridLayer::Attention => {
                        attention::attention_block(&mut ops, m, tr, &d, AttentionSpan::Full)
                    }
                    HybridLayer::Mlp => mlp::mlp_block(&mut ops, m, tr, &d),
                    HybridLayer::Moe => moe::moe_block(&mut ops, m, tr, &d),
                    HybridLayer::Mamba => {
                        if let Some(mc) = &m.mamba {
                            mamba::mamba_layer(&mut ops, m, mc, &d)
                        }
                    }
                }
                recompute::apply_modules(&mut ops, tr.recompute_modules());
                if let Some(q) = &recipe {
                    low_precision::add_quantize_ops(&mut ops, q);
                }
                Block {
                    kind,
                    ops,
                    input_bytes,
                    unit_starts: Vec::new(),
                    high_precision: false,
                }
            })
            .collect();
        let mut emb_ops = Vec::with_capacity(4);
        embedding::embedding_block(&mut emb_ops, m, &d);
        let mut out_ops = Vec::with_capacity(4);
        let last_stage_has_embedding =
            r.placement.stage_rank.last() == r.placement.stage_rank.first();
        let owns = !m.tied_embeddings || !last_stage_has_embedding;
        embedding::output_block(&mut out_ops, m, &d, owns, m.tied_embeddings && owns);
        if m.mtp_num_layers > 0 && !last_stage_has_embedding {
            embedding::mtp_embedding_copy(&mut out_ops, m, &d);
        }
        let mtp = (m.mtp_num_layers > 0).then(|| {
            let mut ops = Vec::new();
            embedding::mtp_prelude(&mut ops, m, &d);
            let body_start = ops.len();
            let body = moe.as_ref().unwrap_or(&dense);
            ops.extend(body.ops.iter().cloned());
            let head_start = ops.len();
            let mut head = Vec::new();
            embedding::output_block(&mut head, m, &d, false, false);
            ops.extend(head);
            Block {
                kind: BlockKind::Mtp,
                ops,
                input_bytes,
                unit_starts: vec![body_start, head_start],
                high_precision: false,
            }
        });
        Ledger {
            embedding: Block {
                kind: BlockKind::Embedding,
                ops: emb_ops,
                input_bytes: 0,
                unit_starts: Vec::new(),
                high_precision: false,
            },
            output: Block {
                kind: BlockKind::Output,
                ops: out_ops,
                input_bytes: 0,
                unit_starts: Vec::new(),
                high_precision: false,
            },
            dense,
            moe,
            mtp,
            variants,
            dense_hp,
            moe_hp,
            dims: d,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A block of three ops, forward order: a dense op (100 parameters, saves 1000 bytes),
    /// an expert op (50 parameters, saves 500, 200 of backward scratch), an op without
    /// parameters (saves 300, a 400-byte temporary).
    fn block() -> Block {
        let params = |rank, class| {
            Some(Params {
                total: rank,
                rank,
                class,
                trainable: true,
            })
        };
        let mut dense =
            Op::new("dense", OpKind::MemoryBound { bytes: 0 }).save(TensorRole::Input, 1000);
        dense.params = params(100, ParamClass::TpSharded);
        let mut expert =
            Op::new("expert", OpKind::MemoryBound { bytes: 0 }).save(TensorRole::Input, 500);
        expert.params = params(50, ParamClass::Expert);
        expert.backward_scratch_bytes = 200;
        let last = Op::new("last", OpKind::MemoryBound { bytes: 0 })
            .save(TensorRole::Input, 300)
            .temp(400);
        Block {
            kind: BlockKind::MoeLayer,
            ops: vec![dense, expert, last],
            input_bytes: 0,
            unit_starts: Vec::new(),
            high_precision: false,
        }
    }

    #[test]
    fn a_gradient_bucket_opens_at_its_spaces_first_weight_gradient() {
        // Backward, last op first (relative to the whole saved set, 10 bytes arriving):
        // - last: its temporary, 400;
        // - expert: its saved 500 + scratch 200, its bucket 50 x 4 = 200 opens, the last op's
        //   300 freed: 600;
        // - dense: its saved 1000, both buckets (200 + 100 x 4), 800 freed: 800.
        let b = block();
        assert_eq!(b.backward_temp_full_bytes(10, 4, 0), 10 + 800);
        // Without buckets the worst is 400 (last op; expert: 700 - 300).
        assert_eq!(b.backward_temp_full_bytes(10, 0, 0), 10 + 400);
        // Below the whole bucket (600) on top of the transient, the former count.
        assert!(b.backward_temp_full_bytes(10, 4, 0) < 10 + 400 + 600);
    }

    #[test]
    fn zero3_gathers_each_unit_apart() {
        // One unit: the whole block's 150 parameters x 2 bytes beside every op's transient;
        // backward as above without buckets (worst 400, at the last op) plus 300.
        let mut b = block();
        assert_eq!(b.backward_temp_full_bytes(10, 0, 2), 10 + 400 + 300);
        assert_eq!(b.largest_gather_sets(), (100, 50));
        // Units [dense] and [expert, last]: the last op holds the expert's 100 bytes (400 +
        // 100), the expert op 700 - 300 + 100, the dense op 1000 - 800 + its own 200.
        b.unit_starts = vec![1];
        assert_eq!(b.gather_units().collect::<Vec<_>>(), vec![0..1, 1..3]);
        assert_eq!(b.backward_temp_full_bytes(10, 0, 2), 10 + 500);
        assert_eq!(b.largest_gather_sets(), (100, 50));
        b.unit_starts = vec![2];
        // Units [dense, expert] and [last]: the sets are the dense part, 100, and the experts,
        // 50; the last op holds no gathered weights (400), the expert op 700 - 300 + 300.
        assert_eq!(b.largest_gather_sets(), (100, 50));
        assert_eq!(b.backward_temp_full_bytes(10, 0, 2), 10 + 700);
    }
}
