//! The ledger's aggregates: each block's sums computed once (parameters, saved and transient
//! bytes, wire bytes, FLOPs, and its times when a time model is given), and which blocks each
//! pipeline rank's chunks hold.

use super::{Block, Ledger, ParamSums, PerGroup};
use crate::config::{ModelConfig, Recompute, Resolved, MAX_LAYER_VARIANTS};
use arrayvec::ArrayVec;

/// Per-microbatch times of one block on this rank.
#[derive(Debug, Clone, Copy, Default)]
pub struct BlockTimes {
    pub fwd_s: f64,
    pub dgrad_s: f64,
    pub wgrad_s: f64,
    /// Forward rerun by recomputation (in the backward, before the input gradient).
    pub recompute_s: f64,
    /// Exposed communication in the forward and backward, per group.
    pub exposed_fwd: PerGroup,
    pub exposed_bwd: PerGroup,
}

impl BlockTimes {
    pub fn exposed_fwd_s(&self) -> f64 {
        self.exposed_fwd.total()
    }

    pub fn exposed_bwd_s(&self) -> f64 {
        self.exposed_bwd.total()
    }
}

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
    /// The largest transient of the block's full backward, ZeRO-2/3's gradient buckets and
    /// ZeRO-3's gathered weights of the running unit included
    /// ([`Block::backward_temp_full_bytes`]).
    pub backward_temp: u64,
    /// The same for a split backward's input-gradient pass ([`Block::backward_temp_bytes`]).
    pub backward_temp_split: u64,
    /// The largest forward transient above the block's saved set
    /// ([`Block::forward_temp_bytes`]).
    pub temp: u64,
    /// The sequence-parallel gather buffer this block needs ([`Block::sp_gather_bytes`]).
    pub sp_gather: u64,
    /// The most parameters ZeRO-3's forward gathers at once for it: a unit's dense part, and
    /// its experts ([`Block::largest_gather_sets`]).
    pub gather_dense: u64,
    pub gather_expert: u64,
    /// Wire bytes per microbatch, per group, recomputation included.
    pub comm: PerGroup,
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
    /// The low-precision recipe's weights in the block (zero without one).
    pub quantized: super::low_precision::QuantizedWeights,
    /// What the Muon optimizer takes of the block (its matrices and their Newton-Schulz
    /// FLOPs); zero when summarised without the ledger's dimensions.
    pub muon: super::muon::MuonSums,
}

impl BlockSummary {
    pub fn of(b: &Block, recompute: Recompute) -> BlockSummary {
        Self::timed(b, recompute, BlockTimes::default())
    }

    /// Summarises a block with its times (from the time model).
    pub fn timed(b: &Block, recompute: Recompute, times: BlockTimes) -> BlockSummary {
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
            sp_gather: b.sp_gather_bytes(),
            gather_dense: b.largest_gather_sets().0,
            gather_expert: b.largest_gather_sets().1,
            comm: b.comm_bytes(recompute),
            model_flops: mf.total(),
            rank_fwd: rf.fwd,
            rank_dgrad: rf.dgrad,
            rank_wgrad: rf.wgrad,
            recompute_model,
            recompute_rank,
            times,
            quantized: super::low_precision::QuantizedWeights::of(&b.ops),
            muon: super::muon::MuonSums::default(),
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
    /// The ledger's other layer kinds ([`Ledger::variants`]), in its order.
    pub variants: Vec<BlockSummary>,
    /// The layers a low-precision recipe keeps in bf16 ([`Ledger::dense_hp`]).
    pub dense_hp: Option<BlockSummary>,
    pub moe_hp: Option<BlockSummary>,
}

impl LedgerSummary {
    /// Sums without times (parameters, memory, FLOPs, communication volume).
    pub fn of(l: &Ledger, recompute: Recompute) -> LedgerSummary {
        Self::timed(l, recompute, |_| BlockTimes::default())
    }

    /// Sums with per-block times, `times` timing one block (the time model's
    /// `TimingContext::block_times`).
    pub fn timed(
        l: &Ledger,
        recompute: Recompute,
        times: impl Fn(&Block) -> BlockTimes,
    ) -> LedgerSummary {
        // The gradient arriving from the block above (residual-sized); the output block's
        // backward starts from the loss, with no incoming gradient.
        let sum_with = |b: &Block, incoming: u64| BlockSummary {
            wgrad_pending: b.wgrad_pending_bytes(l.dims.act),
            backward_temp: b.backward_temp_full_bytes(
                incoming,
                l.dims.grad_bucket,
                l.dims.zero3_gather,
            ),
            backward_temp_split: b.backward_temp_bytes(incoming),
            muon: super::muon::MuonSums::of(b, l.dims.a, l.dims.g),
            ..BlockSummary::timed(b, recompute, times(b))
        };
        let sum = |b: &Block| sum_with(b, l.dims.residual_bytes());
        LedgerSummary {
            embedding: sum(&l.embedding),
            dense: sum(&l.dense),
            moe: l.moe.as_ref().map(sum),
            output: sum_with(&l.output, 0),
            mtp: l.mtp.as_ref().map(sum),
            variants: l.variants.iter().map(sum).collect(),
            dense_hp: l.dense_hp.as_ref().map(sum),
            moe_hp: l.moe_hp.as_ref().map(sum),
        }
    }
}

/// The fixed blocks of a ledger or of its summary, which name them alike: embedding, dense,
/// MoE, output, MTP, and the dense and MoE layers a low-precision recipe keeps in bf16.
macro_rules! fixed_blocks {
    ($h:expr) => {
        [
            Some(&$h.embedding),
            Some(&$h.dense),
            $h.moe.as_ref(),
            Some(&$h.output),
            $h.mtp.as_ref(),
            $h.dense_hp.as_ref(),
            $h.moe_hp.as_ref(),
        ]
    };
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
    /// Layers of each of the ledger's other kinds ([`Ledger::variants`]).
    pub variant_layers: [u32; MAX_LAYER_VARIANTS],
    /// Dense and MoE layers a low-precision recipe keeps in bf16 (not in `dense_layers` /
    /// `moe_layers`).
    pub hp_dense_layers: u32,
    pub hp_moe_layers: u32,
}

impl ChunkContents {
    /// The chunk's blocks with their multiplicities.
    pub fn blocks<'a>(
        &self,
        s: &'a LedgerSummary,
    ) -> impl Iterator<Item = (&'a BlockSummary, u64)> {
        self.held(fixed_blocks!(s), &s.variants)
    }

    /// The ledger's blocks this chunk holds, with their multiplicities.
    pub fn ledger_blocks<'a>(&self, l: &'a Ledger) -> impl Iterator<Item = (&'a Block, u64)> {
        self.held(fixed_blocks!(l), &l.variants)
    }

    /// The blocks of `fixed` (as [`fixed_blocks!`] lists them) and `variants` this chunk holds,
    /// with their multiplicities.
    fn held<'a, T>(
        &self,
        fixed: [Option<&'a T>; 7],
        variants: &'a [T],
    ) -> impl Iterator<Item = (&'a T, u64)> + use<'a, T> {
        let [embedding, dense, moe, output, mtp, dense_hp, moe_hp] = fixed;
        let items: [(Option<&'a T>, u64); 7] = [
            (embedding, self.embedding as u64),
            (dense, self.dense_layers as u64),
            (moe, self.moe_layers as u64),
            (output, self.output as u64),
            (mtp, self.mtp_layers as u64),
            (dense_hp, self.hp_dense_layers as u64),
            (moe_hp, self.hp_moe_layers as u64),
        ];
        let variants = variants
            .iter()
            .zip(self.variant_layers)
            .map(|(b, n)| (Some(b), n as u64));
        items
            .into_iter()
            .chain(variants)
            .filter_map(|(b, n)| b.filter(|_| n > 0).map(|b| (b, n)))
    }

    /// Transformer layers in the chunk (MTP modules included).
    pub fn layers(&self) -> u32 {
        self.dense_layers
            + self.moe_layers
            + self.hp_dense_layers
            + self.hp_moe_layers
            + self.mtp_layers
            + self.variant_layers.iter().sum::<u32>()
    }

    /// Every block of one model replica: all layers, the embedding, the output and the MTP
    /// modules, as if one chunk held them.
    pub fn whole_model(m: &ModelConfig) -> ChunkContents {
        let mut c = ChunkContents {
            embedding: true,
            output: true,
            mtp_layers: m.mtp_num_layers,
            ..ChunkContents::default()
        };
        c.count_layers(m, &m.layer_variants(), 0..m.num_layers, (0, 0));
        c
    }

    /// Adds the layers `layers` (0-based decoder layers) by kind; of the full-attention dense
    /// and MoE layers, the first `bf16.0` and last `bf16.1` of the model as bf16 layers.
    fn count_layers(
        &mut self,
        m: &ModelConfig,
        variants: &[crate::config::LayerKind],
        layers: std::ops::Range<u32>,
        bf16: (u32, u32),
    ) {
        let hp = |l: u32| l < bf16.0 || l >= m.num_layers.saturating_sub(bf16.1);
        if variants.is_empty() && bf16 == (0, 0) {
            // MoE from layer `moe_first_k_dense` on (no pattern): counted, not walked.
            let moe = if !m.is_moe() {
                0
            } else if m.moe_layer_pattern.is_empty() && m.hybrid_layer_pattern.is_none() {
                let from = layers.start.max(m.moe_first_k_dense);
                layers.end.saturating_sub(from)
            } else {
                layers.clone().filter(|&l| m.is_moe_layer(l)).count() as u32
            };
            self.moe_layers += moe;
            self.dense_layers += layers.len() as u32 - moe;
            return;
        }
        for l in layers {
            match m.variant_of(l, variants) {
                Some(i) => self.variant_layers[i] += 1,
                None if m.is_moe_layer(l) && hp(l) => self.hp_moe_layers += 1,
                None if m.is_moe_layer(l) => self.moe_layers += 1,
                None if hp(l) => self.hp_dense_layers += 1,
                None => self.dense_layers += 1,
            }
        }
    }
}

/// The chunks of every pipeline rank, in stage order.
pub fn chunks_per_rank(r: &Resolved) -> Vec<Vec<ChunkContents>> {
    let m = &r.config.model;
    // The layers a low-precision recipe keeps in bf16 (the ledger's `dense_hp` / `moe_hp`).
    let bf16 = r.config.training.bf16_layers();
    let variants = m.layer_variants();
    let pl = &r.placement;
    let last = pl.num_stages() - 1;
    let vpp = r.config.parallel.vpp as usize;
    let mut out: Vec<Vec<ChunkContents>> = (0..r.config.parallel.pp)
        .map(|_| Vec::with_capacity(vpp))
        .collect();
    for (stage, layers) in pl.stage_layers.iter().enumerate() {
        let mut c = ChunkContents {
            stage,
            embedding: stage == 0,
            output: stage == last,
            mtp_layers: if stage == last { m.mtp_num_layers } else { 0 },
            ..ChunkContents::default()
        };
        c.count_layers(m, &variants, layers.clone(), bf16);
        out[pl.stage_rank[stage] as usize].push(c);
    }
    out
}

/// Parameters held by one pipeline rank (before ZeRO-3 sharding).
/// The distinct blocks of a rank's `chunks`, whatever their counts: what per-block maxima (the
/// phase buffers, the largest gathered unit) read, gathered once rather than walking every
/// chunk's blocks for each.
pub fn held_blocks<'a>(
    chunks: &[ChunkContents],
    s: &'a LedgerSummary,
) -> ArrayVec<&'a BlockSummary, { 7 + MAX_LAYER_VARIANTS }> {
    let mut held: ArrayVec<&'a BlockSummary, { 7 + MAX_LAYER_VARIANTS }> = ArrayVec::new();
    for c in chunks {
        for (b, _) in c.blocks(s) {
            if !held.iter().any(|h| std::ptr::eq(*h, b)) {
                held.push(b);
            }
        }
    }
    held
}

/// This rank's Muon share over its chunks ([`super::muon::MuonSums`]).
pub fn rank_muon(chunks: &[ChunkContents], s: &LedgerSummary) -> super::muon::MuonSums {
    let mut m = super::muon::MuonSums::default();
    for c in chunks {
        for (b, n) in c.blocks(s) {
            m.add(&b.muon, n);
        }
    }
    m
}

/// This rank's parameters over its chunks.
pub fn rank_params(chunks: &[ChunkContents], s: &LedgerSummary) -> ParamSums {
    let mut p = ParamSums::default();
    for c in chunks {
        for (b, n) in c.blocks(s) {
            p.add(&b.params, n);
        }
    }
    p
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::presets::preset;

    /// MoE layers from `moe_first_k_dense` on are counted by range arithmetic; the count equals
    /// asking each layer of every range (DeepSeek-V3's three dense layers first, and a model
    /// with no MoE layer).
    #[test]
    fn counted_moe_layers_equal_the_layers_asked_one_by_one() {
        for name in ["deepseek-v3", "llama3-8b"] {
            let m = preset(name).unwrap();
            for a in 0..=m.num_layers {
                for b in a..=m.num_layers {
                    let mut c = ChunkContents::default();
                    c.count_layers(&m, &[], a..b, (0, 0));
                    let moe = (a..b).filter(|&l| m.is_moe_layer(l)).count() as u32;
                    assert_eq!(
                        (c.moe_layers, c.dense_layers),
                        (moe, b - a - moe),
                        "{name} {a}..{b}"
                    );
                }
            }
        }
    }
}
