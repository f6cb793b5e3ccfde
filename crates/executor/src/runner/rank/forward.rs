//! A chunk's forward over its blocks: the microbatch's data, each block run with its
//! parameters (gathered under ZeRO-3), its saved state kept for backward.

use super::state::{BlockSaved, Rank};
use crate::backend::{Backend, Device, DeviceTensor, TensorOps, View, ViewMut};
use crate::error::ExecError;
use crate::layers::blocks::BlockKind;
use crate::layers::data;
use crate::layers::ends::{embedding_fwd, head_fwd, output_fwd};
use crate::layers::layer::{layer_fwd, Experts};
use crate::layers::lora::Adapters;
use crate::layers::mtp::mtp_in_fwd;
use crate::plan::Recompute;
use crate::runner::zero::params_of;
use crate::tracker::Category;

impl<'a, B: Backend> Rank<'a, B> {
    /// A copy of `x` as a saved activation.
    pub(super) fn copy_activation(&self, x: &B::Tensor) -> Result<B::Tensor, ExecError> {
        let mut t = self.ctx.zeros(Category::Activations, x.shape())?;
        self.ctx.ops.copy(View::all(x), ViewMut::all(&mut t))?;
        Ok(t)
    }

    /// Multi-token prediction's (inputs, targets) `shift` tokens ahead for microbatch `mb`,
    /// this rank's context-parallel positions only.
    pub(super) fn mtp_data(&self, mb: u32, shift: usize) -> (Vec<u32>, Vec<u32>) {
        let (seq, pos) = (self.plan.model.seq, &self.ctx.positions);
        let (x, y) = data::shifted(
            &self.plan.model,
            self.plan.seed,
            self.plan.microbatches,
            self.rp.coords.dp,
            mb,
            shift,
        );
        if self.ctx.cp.is_some() {
            (
                data::at_positions(&x, seq, pos),
                data::at_positions(&y, seq, pos),
            )
        } else {
            (x, y)
        }
    }

    pub(super) fn forward(&mut self, stage: u32, mb: u32) -> Result<(), ExecError> {
        let bidx = self
            .stage_blocks
            .get(&stage)
            .cloned()
            .ok_or_else(|| self.missing("chunk", stage, mb))?;
        self.ctx.mb = mb;
        (self.ctx.step, self.ctx.dp_rank) = (self.step, self.rp.coords.dp);
        let (tokens, targets) = data::microbatch(
            &self.plan.model,
            self.plan.seed,
            self.plan.microbatches,
            self.rp.coords.dp,
            mb,
        );
        let (tokens, targets) = if self.ctx.cp.is_some() {
            let (seq, pos) = (self.plan.model.seq, &self.ctx.positions);
            (
                data::at_positions(&tokens, seq, pos),
                data::at_positions(&targets, seq, pos),
            )
        } else {
            (tokens, targets)
        };
        let mut x = if matches!(self.blocks[bidx.start].kind, BlockKind::Embedding) {
            None
        } else {
            let t = self
                .mailbox
                .remove(&(stage.wrapping_sub(1), mb, false))
                .ok_or_else(|| self.missing("input activation", stage, mb))?;
            Some(self.ctx.ops.recat(t, Category::Activations))
        };
        let mut saved = Vec::with_capacity(bidx.len());
        let mut targets = Some(targets);
        // Multi-token prediction: the hidden states the next depth's module takes.
        let mtp = self.plan.model.mtp_layers;
        let mut mtp_h: Option<B::Tensor> = None;
        for bi in bidx {
            if matches!(
                self.blocks[bi].kind,
                BlockKind::Experts(_)
                    | BlockKind::FrozenExperts(_)
                    | BlockKind::Adapters(_)
                    | BlockKind::MtpEmbedding
            ) {
                // Run with its layer (or with the MTP modules, for the embedding's copy).
                saved.push(BlockSaved::Experts);
                continue;
            }
            // An MTP module's blocks use the embedding's or the output layer's weights too.
            let shared = self.mtp_shared_block(bi)?;
            let sh = match shared {
                Some(o) => Some(self.block_handles(o)?.0),
                None => None,
            };
            let (h, eh) = self.block_handles(bi)?;
            let ah = self.adapter_handle(bi)?;
            let fh = self.frozen_experts_handle(bi)?;
            let p = params_of(&self.params, &h);
            let sp_ = sh.as_ref().map(|h| params_of(&self.params, h));
            let frozen = fh
                .as_ref()
                .map(|(fi, h)| (&self.blocks[*fi], params_of(&self.params, h)));
            let experts: Experts<B> = eh
                .as_ref()
                .map(|(ei, eh)| (&self.blocks[*ei], params_of(&self.params, eh), frozen));
            let ad: Adapters<B> = ah
                .as_ref()
                .map(|(ai, h)| (&self.blocks[*ai], params_of(&self.params, h)));
            let l = &self.blocks[bi];
            match l.kind {
                BlockKind::Embedding => {
                    let (y, mask) = embedding_fwd(&mut self.ctx, l, p, &tokens, 0)?;
                    x = Some(y);
                    saved.push(BlockSaved::Embedding(tokens.clone(), mask));
                }
                BlockKind::Layer(_) => {
                    let input = x.take().expect("layer input");
                    let (y, s) = layer_fwd(&mut self.ctx, l, p, experts, ad, input)?;
                    if self.ctx.recompute == Recompute::Full {
                        saved.push(BlockSaved::LayerInput(s.x));
                    } else {
                        saved.push(BlockSaved::Layer(Box::new(s)));
                    }
                    x = Some(y);
                }
                BlockKind::Output => {
                    let input = x.take().expect("output input");
                    if mtp > 0 {
                        mtp_h = Some(self.copy_activation(&input)?);
                    }
                    let (loss, s) =
                        output_fwd(&mut self.ctx, l, p, input, targets.take().expect("targets"))?;
                    if self.rp.coords.tp == 0 {
                        self.loss_sum += loss;
                    }
                    saved.push(BlockSaved::Output(s));
                }
                BlockKind::MtpIn(k) => {
                    let (tokens, _) = self.mtp_data(mb, k as usize + 1);
                    let ebi = shared.expect("embedding block");
                    let emb = (&self.blocks[ebi], sp_.expect("embedding parameters"));
                    let hin = mtp_h.take().expect("MTP hidden states");
                    let (y, s) = mtp_in_fwd(&mut self.ctx, l, p, emb, hin, tokens)?;
                    saved.push(BlockSaved::MtpIn(Box::new(s)));
                    x = Some(y);
                }
                BlockKind::MtpOut(k) => {
                    let input = x.take().expect("MTP output input");
                    if k + 1 < mtp {
                        mtp_h = Some(self.copy_activation(&input)?);
                    }
                    let (_, targets) = self.mtp_data(mb, k as usize + 1);
                    let obi = shared.expect("output block");
                    let head = sp_.expect("output parameters");
                    let head = head.sub(self.blocks[obi].tensors[1].range());
                    let norm = p.sub(l.tensors[0].range());
                    let (loss, s) = head_fwd(&mut self.ctx, norm, head, input, targets)?;
                    if self.rp.coords.tp == 0 {
                        self.loss_sum += self.plan.model.mtp_loss_scale as f64 * loss;
                    }
                    saved.push(BlockSaved::MtpOut(s));
                }
                BlockKind::Experts(_)
                | BlockKind::FrozenExperts(_)
                | BlockKind::Adapters(_)
                | BlockKind::MtpEmbedding => {}
            }
        }
        if let Some(y) = x {
            // Waiting to be sent (or handed to the next chunk on this rank): a send buffer.
            self.mailbox
                .insert((stage, mb, false), self.ctx.ops.recat(y, Category::Buffers));
        }
        self.saved.insert((stage, mb), saved);
        Ok(())
    }
}
