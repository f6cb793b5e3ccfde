//! A chunk's forward over its blocks: the microbatch's data, each block run with its
//! parameters (gathered under ZeRO-3), its saved state kept for backward.

use super::state::{BlockSaved, Rank};
use super::views::views;
use crate::backend::ops::*;
use crate::backend::{Backend, Device, DeviceTensor, View, ViewMut};
use crate::error::ExecError;
use crate::layers::blocks::BlockKind;
use crate::layers::data;
use crate::layers::ends::{embedding_fwd, head_fwd, output_fwd};
use crate::layers::hybrid::decoder_fwd;
use crate::layers::mtp::mtp_in_fwd;
use crate::tracker::Category;
use parsim_plan::plan::Recompute;
use std::ops::Range;

/// The state a chunk's forward carries from block to block.
struct Flow<B: Backend> {
    /// The next block's input.
    x: Option<B::Tensor>,
    tokens: Vec<u32>,
    targets: Option<Vec<u32>>,
    /// Multi-token prediction: the hidden states the next depth's module takes.
    mtp_h: Option<B::Tensor>,
    saved: Vec<BlockSaved<B>>,
}

impl<'a, B: Backend> Rank<'a, B> {
    /// The blocks of chunk `stage`, with the context set for microbatch `mb` of this step.
    pub(super) fn chunk(&mut self, stage: u32, mb: u32) -> Result<Range<usize>, ExecError> {
        let bidx = self
            .stage_blocks
            .get(&stage)
            .cloned()
            .ok_or_else(|| self.missing("chunk", stage, mb))?;
        self.ctx.mb = mb;
        (self.ctx.step, self.ctx.dp_rank) = (self.step, self.rp.coords.dp);
        Ok(bidx)
    }

    /// A copy of `x` as a saved activation.
    pub(super) fn copy_activation(&self, x: &B::Tensor) -> Result<B::Tensor, ExecError> {
        let mut t = self.ctx.zeros(Category::Activations, x.shape())?;
        self.ctx.ops.copy(View::all(x), ViewMut::all(&mut t))?;
        Ok(t)
    }

    /// (inputs, targets) of a whole sequence at this rank's context-parallel positions only.
    fn at_positions(&self, (x, y): (Vec<u32>, Vec<u32>)) -> (Vec<u32>, Vec<u32>) {
        if self.ctx.cp.is_some() {
            let (seq, pos) = (self.plan.model.seq, &self.ctx.positions);
            (
                data::at_positions(&x, seq, pos),
                data::at_positions(&y, seq, pos),
            )
        } else {
            (x, y)
        }
    }

    /// Multi-token prediction's (inputs, targets) `shift` tokens ahead for microbatch `mb`,
    /// this rank's context-parallel positions only.
    pub(super) fn mtp_data(&self, mb: u32, shift: usize) -> (Vec<u32>, Vec<u32>) {
        self.at_positions(data::shifted(
            &self.plan.model,
            self.plan.seed,
            self.plan.microbatches,
            self.rp.coords.dp,
            mb,
            shift,
        ))
    }

    /// Forward of chunk `stage` for microbatch `mb`: its input from the mailbox (or the
    /// embedding), its output left there to be sent, its blocks' state saved for backward.
    pub(super) fn forward(&mut self, stage: u32, mb: u32) -> Result<(), ExecError> {
        let bidx = self.chunk(stage, mb)?;
        let (tokens, targets) = self.at_positions(data::microbatch(
            &self.plan.model,
            self.plan.seed,
            self.plan.microbatches,
            self.rp.coords.dp,
            mb,
        ));
        let x = if matches!(self.blocks[bidx.start].kind, BlockKind::Embedding) {
            None
        } else {
            let t = self
                .mailbox
                .remove(&(stage.wrapping_sub(1), mb, false))
                .ok_or_else(|| self.missing("input activation", stage, mb))?;
            Some(self.ctx.ops.recat(t, Category::Activations))
        };
        let mut flow = Flow {
            x,
            tokens,
            targets: Some(targets),
            mtp_h: None,
            saved: Vec::with_capacity(bidx.len()),
        };
        for bi in bidx {
            self.forward_block(mb, bi, &mut flow)?;
        }
        if let Some(y) = flow.x {
            // Waiting to be sent (or handed to the next chunk on this rank): a send buffer.
            self.mailbox
                .insert((stage, mb, false), self.ctx.ops.recat(y, Category::Buffers));
        }
        self.saved.insert((stage, mb), flow.saved);
        Ok(())
    }

    /// Forward of block `bi` in microbatch `mb`.
    fn forward_block(&mut self, mb: u32, bi: usize, flow: &mut Flow<B>) -> Result<(), ExecError> {
        let mtp = self.plan.model.mtp_layers;
        if matches!(
            self.blocks[bi].kind,
            BlockKind::Experts(_)
                | BlockKind::FrozenExperts(_)
                | BlockKind::Adapters(_)
                | BlockKind::MtpEmbedding
        ) {
            // Run with its layer (or with the MTP modules, for the embedding's copy).
            flow.saved.push(BlockSaved::Experts);
            return Ok(());
        }
        // An MTP module's blocks use the embedding's or the output layer's weights too.
        let bp = self.block_params(bi)?;
        let v = views::<B>(&bp, &self.params, &self.blocks);
        let l = &self.blocks[bi];
        match l.kind {
            BlockKind::Embedding => {
                let (y, mask) = embedding_fwd(&mut self.ctx, l, v.p, &flow.tokens, 0)?;
                flow.x = Some(y);
                flow.saved
                    .push(BlockSaved::Embedding(flow.tokens.clone(), mask));
            }
            BlockKind::Layer(_) => {
                let input = flow.x.take().expect("layer input");
                let (y, s) = decoder_fwd(&mut self.ctx, l, v.p, v.experts, v.ad, input)?;
                if self.ctx.recompute == Recompute::Full {
                    flow.saved.push(BlockSaved::LayerInput(s.x));
                } else {
                    flow.saved.push(BlockSaved::Layer(Box::new(s)));
                }
                flow.x = Some(y);
            }
            BlockKind::Output => {
                let input = flow.x.take().expect("output input");
                if mtp > 0 {
                    flow.mtp_h = Some(self.copy_activation(&input)?);
                }
                let targets = flow.targets.take().expect("targets");
                let (loss, s) = output_fwd(&mut self.ctx, l, v.p, input, targets)?;
                if self.rp.coords.tp == 0 {
                    self.loss_sum += loss;
                }
                flow.saved.push(BlockSaved::Output(s));
            }
            BlockKind::MtpIn(k) => {
                let (tokens, _) = self.mtp_data(mb, k as usize + 1);
                let emb = v.shared.expect("embedding block");
                let hin = flow.mtp_h.take().expect("MTP hidden states");
                let (y, s) = mtp_in_fwd(&mut self.ctx, l, v.p, emb, hin, tokens)?;
                flow.saved.push(BlockSaved::MtpIn(Box::new(s)));
                flow.x = Some(y);
            }
            BlockKind::MtpOut(k) => {
                let input = flow.x.take().expect("MTP output input");
                if k + 1 < mtp {
                    flow.mtp_h = Some(self.copy_activation(&input)?);
                }
                let (_, targets) = self.mtp_data(mb, k as usize + 1);
                let (ob, head) = v.shared.expect("output block");
                let head = head.sub(ob.tensors[1].range());
                let norm = v.p.sub(l.tensors[0].range());
                let (loss, s) = head_fwd(&mut self.ctx, norm, head, input, targets)?;
                if self.rp.coords.tp == 0 {
                    self.loss_sum += self.plan.model.mtp_loss_scale as f64 * loss;
                }
                flow.saved.push(BlockSaved::MtpOut(s));
            }
            BlockKind::Experts(_)
            | BlockKind::FrozenExperts(_)
            | BlockKind::Adapters(_)
            | BlockKind::MtpEmbedding => {}
        }
        Ok(())
    }
}
