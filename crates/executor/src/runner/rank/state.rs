//! One rank's state across steps ([`Rank`]): its layout, flat parameter spaces and their
//! ZeRO shards, the saved activations and held weight-gradient tasks of the microbatches in
//! flight, and the pipeline mailbox. The step loop, forward, backward, pipeline messages,
//! ZeRO, gradient buckets and export are its methods, each in a file of [`super`].

use crate::backend::Backend;
use crate::error::{ExecError, StateError};
use crate::layers::blocks::{BlockKind, BlockLayout, SPACES};
use crate::layers::embedding_group::SharedWeight;
use crate::layers::ends::OutputSaved;
use crate::layers::layer::LayerSaved;
use crate::layers::mtp::MtpInSaved;
use crate::layers::{Ctx, WTask};
use crate::runner::grad_buckets::GradBuckets;
use crate::trace::Clock;
use parsim_plan::plan::{Plan, RankPlan};
use std::collections::{HashMap, VecDeque};
use std::ops::Range;
use std::rc::Rc;

pub(super) enum BlockSaved<B: Backend> {
    /// The tokens and the embedding dropout's saved mask.
    Embedding(Vec<u32>, Option<B::Tensor>),
    Layer(Box<LayerSaved<B>>),
    LayerInput(B::Tensor),
    Output(OutputSaved<B>),
    /// A block run with another (an MoE layer's experts, a LoRA layer's adapters, the MTP
    /// modules' embedding copy): its state is saved with that block.
    Experts,
    /// A multi-token-prediction module's input block and its final norm with the shared head.
    MtpIn(Box<MtpInSaved<B>>),
    MtpOut(OutputSaved<B>),
}

pub(super) type BlockTasks<B> = Vec<(usize, Vec<WTask<B>>)>;

/// One rank's state across steps.
pub(super) struct Rank<'a, B: Backend> {
    pub(super) plan: &'a Plan,
    pub(super) rp: &'a RankPlan,
    pub(super) ctx: Ctx<'a, B>,
    /// Per space (dense, experts, LoRA's frozen weights): the group over which gradients
    /// reduce and ZeRO shards (DP, expert DP, DP), this rank's shard, parameters, gradients
    /// and Adam moments (none for the frozen space).
    pub(super) groups: [B::Group; SPACES],
    pub(super) blocks: Vec<BlockLayout>,
    pub(super) stage_blocks: HashMap<u32, Range<usize>>,
    pub(super) zero: u8,
    pub(super) shards: [Range<usize>; SPACES],
    /// The embedding group's shared tensors held here (the tied word embedding; with multi-token
    /// prediction the word and position tables): their copies and the group.
    pub(super) tied: Vec<SharedWeight<B>>,
    pub(super) params: [B::Tensor; SPACES],
    /// Mixed precision: the fp32 master weights per space.
    pub(super) master: [Option<B::Tensor>; SPACES],
    pub(super) grads: [B::Tensor; SPACES],
    pub(super) m: [B::Tensor; SPACES],
    pub(super) v: [B::Tensor; SPACES],
    pub(super) step: u32,
    pub(super) cache: VecDeque<(usize, Rc<B::Tensor>)>,
    pub(super) saved: HashMap<(u32, u32), Vec<BlockSaved<B>>>,
    pub(super) wtasks: HashMap<(u32, u32), BlockTasks<B>>,
    pub(super) mailbox: HashMap<(u32, u32, bool), B::Tensor>,
    pub(super) recv_buf: Option<B::Tensor>,
    pub(super) loss_sum: f64,
    pub(super) grad_scale: f32,
    /// Tracing: the run's clock and when the last receive's message arrived.
    pub(super) clock: Option<Clock>,
    pub(super) recv_arrived_s: Option<f64>,
    /// ZeRO 0/1 gradient buckets reduced during the last backward (`None`: at the step).
    pub(super) buckets: Option<GradBuckets>,
    /// The index of the action being played in the rank's list.
    pub(super) action_index: usize,
}

/// The message tag of a pipeline send or receive.
pub(super) fn tag(stage: u32, mb: u32, grad: bool) -> u64 {
    ((stage as u64) << 33) | ((mb as u64) << 1) | grad as u64
}

impl<'a, B: Backend> Rank<'a, B> {
    pub(super) fn missing(&self, what: &'static str, stage: u32, mb: u32) -> ExecError {
        ExecError::OutOfOrder {
            rank: self.rp.rank,
            what,
            stage,
            mb,
        }
    }

    /// The index of this rank's block of kind `kind`.
    pub(super) fn block_of(&self, kind: BlockKind) -> Result<usize, ExecError> {
        self.blocks
            .iter()
            .position(|b| b.kind == kind)
            .ok_or_else(|| ExecError::from(StateError::MtpWithoutBlock(format!("{kind:?}"))))
    }

    /// The block whose weights MTP block `bi` shares: the embedding (or the last stage's copy
    /// of it) for an input block, the output layer for a final norm (none for other blocks).
    pub(super) fn mtp_shared_block(&self, bi: usize) -> Result<Option<usize>, ExecError> {
        match self.blocks[bi].kind {
            BlockKind::MtpIn(_) => self
                .block_of(BlockKind::Embedding)
                .or_else(|_| self.block_of(BlockKind::MtpEmbedding))
                .map(Some),
            BlockKind::MtpOut(_) => self.block_of(BlockKind::Output).map(Some),
            _ => Ok(None),
        }
    }

    /// The experts block of the MoE layer of block `bi`, when it is one.
    pub(super) fn experts_of(&self, bi: usize) -> Option<usize> {
        // Under LoRA the layer's adapters block comes between.
        let ei = bi + 1 + usize::from(self.adapters_of(bi).is_some());
        match (self.blocks[bi].kind, self.blocks.get(ei).map(|b| b.kind)) {
            (BlockKind::Layer(l), Some(BlockKind::Experts(e))) if l == e => Some(ei),
            _ => None,
        }
    }

    /// The frozen-experts block of the MoE layer of block `bi` (LoRA with routed-expert
    /// adapters: right after its experts block), when it has one.
    pub(super) fn frozen_experts_of(&self, bi: usize) -> Option<usize> {
        let fi = self.experts_of(bi)? + 1;
        match (self.blocks[bi].kind, self.blocks.get(fi).map(|b| b.kind)) {
            (BlockKind::Layer(l), Some(BlockKind::FrozenExperts(e))) if l == e => Some(fi),
            _ => None,
        }
    }

    /// The adapters block of LoRA layer block `bi`, when the run has adapters.
    pub(super) fn adapters_of(&self, bi: usize) -> Option<usize> {
        match (
            self.blocks[bi].kind,
            self.blocks.get(bi + 1).map(|b| b.kind),
        ) {
            (BlockKind::Layer(l), Some(BlockKind::Adapters(a))) if l == a => Some(bi + 1),
            _ => None,
        }
    }
}
