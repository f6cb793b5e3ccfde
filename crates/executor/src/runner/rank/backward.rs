//! A chunk's backward: input gradients block by block, the weight-gradient tasks run at once
//! (into the gradients or a ZeRO-2/3 bucket) or held for the W action.

use super::state::{BlockSaved, BlockTasks, Rank};
use super::views::{views, BlockViews};
use crate::backend::ops::*;
use crate::backend::{Backend, View, ViewMut};
use crate::error::{ExecError, StateError};
use crate::layers::blocks::{
    is_frozen_space, BlockKind, BlockLayout, DENSE_SPACE, EXPERT_SPACE, FROZEN_SPACE, SPACES,
};
use crate::layers::ends::{embedding_bwd, head_bwd, output_bwd};
use crate::layers::hybrid::{decoder_bwd, decoder_fwd};
use crate::layers::layer::LayerSaved;
use crate::layers::mtp::mtp_in_bwd;
use crate::layers::{Ctx, Sink, WTask};
use crate::tracker::Category;

/// The state a chunk's backward carries from block to block.
struct Flow<B: Backend> {
    /// The gradient of the next block's input (this block's output).
    dy: Option<B::Tensor>,
    /// Multi-token prediction: the gradient of the hidden states an MTP module took.
    mtp_dh: Option<B::Tensor>,
    /// Split backward: the weight-gradient tasks held for the W action, per block.
    held: BlockTasks<B>,
}

impl<B: Backend> Flow<B> {
    /// The output gradient the block's backward takes.
    fn grad(&mut self) -> B::Tensor {
        self.dy.take().expect("grad")
    }

    /// Sets the output gradient of the previous block to an output head's input gradient `d`,
    /// plus the MTP module's hidden-state gradient when one took that head's input.
    fn set_head_grad(&mut self, ctx: &mut Ctx<B>, mut d: B::Tensor) -> Result<(), ExecError> {
        if let Some(dh) = self.mtp_dh.take() {
            ctx.ops.axpy(1.0, View::all(&dh), ViewMut::all(&mut d))?;
        }
        self.dy = Some(d);
        Ok(())
    }
}

/// Where block `l`'s weight-gradient tasks go: run at once (into its space's gradients, or a
/// ZeRO-2/3 bucket allocated at the first task, after a full recompute's forward rerun), held
/// for the W action, or routed to the block an MTP block shares weights with.
struct GradSink<'g, B: Backend> {
    l: &'g BlockLayout,
    /// The layer's experts and adapters blocks, and the block an MTP block shares.
    le: Option<&'g BlockLayout>,
    la: Option<&'g BlockLayout>,
    shared_l: Option<&'g BlockLayout>,
    immediate: bool,
    use_bucket: bool,
    grads: &'g mut [B::Tensor; SPACES],
    bucket: Option<B::Tensor>,
    ebucket: Option<B::Tensor>,
    abucket: Option<B::Tensor>,
    /// Tasks held for the W action.
    kept: Vec<WTask<B>>,
    /// An MTP module's embedding and output-head gradients, for those blocks.
    routed: Vec<WTask<B>>,
}

impl<B: Backend> GradSink<'_, B> {
    fn take(&mut self, c: &mut Ctx<B>, t: WTask<B>) -> Result<(), ExecError> {
        let l = self.l;
        if l.space == FROZEN_SPACE && !t.is_adapter() && !t.is_expert() {
            // LoRA: a frozen weight's gradient is not computed (the frozen experts
            // send none; an expert task is their adapters').
            return Ok(());
        }
        let to_shared = matches!(
            (&t, l.kind),
            (WTask::Embedding { .. }, BlockKind::MtpIn(_))
                | (WTask::Linear { tensor: 1, .. }, BlockKind::MtpOut(_))
        );
        if let (true, Some(sl)) = (to_shared, self.shared_l) {
            let t = if self.immediate { t } else { t.hold(c, sl)? };
            self.routed.push(t);
            return Ok(());
        }
        if !self.immediate {
            self.kept.push(t.hold(c, l)?);
            return Ok(());
        }
        let (tl, bk, sp) = if t.is_expert() {
            let le = self
                .le
                .ok_or_else(|| ExecError::from(StateError::ExpertGradientWithoutBlock))?;
            (le, &mut self.ebucket, EXPERT_SPACE)
        } else if t.is_adapter() {
            let la = self
                .la
                .ok_or_else(|| ExecError::from(StateError::AdapterGradientWithoutBlock))?;
            (la, &mut self.abucket, DENSE_SPACE)
        } else {
            (l, &mut self.bucket, DENSE_SPACE)
        };
        if self.use_bucket {
            if bk.is_none() {
                *bk = Some(c.zeros_f32(Category::Buffers, &[tl.range.len()])?);
            }
            let b = bk.as_mut().expect("bucket");
            t.run(c, tl, ViewMut::all(b))
        } else {
            t.run(
                c,
                tl,
                ViewMut {
                    tensor: &mut self.grads[sp],
                    range: tl.range.clone(),
                },
            )
        }
    }
}

/// A layer's saved state for backward under full recomputation: its forward rerun from the
/// saved input `x` (whose load-balancing loss and drops were counted in forward).
fn rerun_layer<B: Backend>(
    ctx: &mut Ctx<B>,
    l: &BlockLayout,
    v: &BlockViews<'_, B>,
    x: B::Tensor,
) -> Result<LayerSaved<B>, ExecError> {
    let stats = (ctx.moe_aux_loss, ctx.moe_dropped);
    ctx.recomputing = true;
    let r = decoder_fwd(ctx, l, v.p.clone(), v.experts.clone(), v.ad.clone(), x);
    ctx.recomputing = false;
    let (y, ls) = r?;
    (ctx.moe_aux_loss, ctx.moe_dropped) = stats;
    drop(y);
    Ok(ls)
}

/// Backward of block `l` from its saved state `s`, the weight-gradient tasks sent to `sink`;
/// `scale` is the loss's gradient scale.
fn block_bwd<B: Backend>(
    ctx: &mut Ctx<B>,
    l: &BlockLayout,
    v: BlockViews<'_, B>,
    s: BlockSaved<B>,
    (scale, mtp_scale): (f32, f32),
    flow: &mut Flow<B>,
    sink: &mut Sink<B>,
) -> Result<(), ExecError> {
    match s {
        BlockSaved::Output(os) => {
            let d = output_bwd(ctx, l, v.p, os, scale, sink)?;
            flow.set_head_grad(ctx, d)?;
        }
        BlockSaved::MtpOut(os) => {
            let (ob, head) = v.shared.expect("output block");
            let head = head.sub(ob.tensors[1].range());
            let norm = v.p.sub(l.tensors[0].range());
            let d = head_bwd(ctx, norm, head, os, scale * mtp_scale, sink)?;
            flow.set_head_grad(ctx, d)?;
        }
        BlockSaved::MtpIn(ms) => {
            let d = flow.grad();
            flow.mtp_dh = Some(mtp_in_bwd(ctx, l, v.p, *ms, d, sink)?);
        }
        BlockSaved::Layer(ls) => {
            let dy = flow.grad();
            flow.dy = Some(decoder_bwd(ctx, l, v.p, (v.experts, v.ad), *ls, dy, sink)?);
        }
        BlockSaved::LayerInput(x) => {
            let ls = rerun_layer(ctx, l, &v, x)?;
            let dy = flow.grad();
            flow.dy = Some(decoder_bwd(ctx, l, v.p, (v.experts, v.ad), ls, dy, sink)?);
        }
        BlockSaved::Embedding(tokens, mask) => {
            embedding_bwd(ctx, tokens, mask, flow.grad(), 0, sink)?
        }
        BlockSaved::Experts => {}
    }
    Ok(())
}

impl<'a, B: Backend> Rank<'a, B> {
    /// Input gradients of a chunk. The weight-gradient tasks run as soon as the backward
    /// produces them (`immediate`, a full backward) or wait for the W action.
    pub(super) fn backward_input(
        &mut self,
        stage: u32,
        mb: u32,
        immediate: bool,
    ) -> Result<(), ExecError> {
        let bidx = self.chunk(stage, mb)?;
        let saved = self
            .saved
            .remove(&(stage, mb))
            .ok_or_else(|| self.missing("forward", stage, mb))?;
        let last = self.blocks[bidx.end - 1].kind;
        let dy = if matches!(last, BlockKind::Output | BlockKind::MtpOut(_)) {
            None
        } else {
            Some(
                self.mailbox
                    .remove(&(stage + 1, mb, true))
                    .ok_or_else(|| self.missing("output gradient", stage, mb))?,
            )
        };
        let mut flow = Flow {
            dy,
            mtp_dh: None,
            held: Vec::new(),
        };
        for (bi, s) in bidx.rev().zip(saved.into_iter().rev()) {
            if matches!(s, BlockSaved::Experts) {
                // Its backward runs with its layer's.
                continue;
            }
            self.backward_block(stage, bi, s, immediate, &mut flow)?;
        }
        if let Some(dx) = flow.dy {
            self.mailbox.insert((stage, mb, true), dx);
        }
        if !immediate {
            self.wtasks.insert((stage, mb), flow.held);
        }
        Ok(())
    }

    /// Backward of block `bi` of chunk `stage` from its saved state `s`, then its gradient
    /// buckets flushed (ZeRO-2/3) and, for a full backward, the block's gradients final.
    fn backward_block(
        &mut self,
        stage: u32,
        bi: usize,
        s: BlockSaved<B>,
        immediate: bool,
        flow: &mut Flow<B>,
    ) -> Result<(), ExecError> {
        let ei = self.experts_of(bi);
        let ai = self.adapters_of(bi);
        let fi = self.frozen_experts_of(bi);
        // ZeRO-3 in backward: the block in use (with its experts, adapters and frozen
        // experts) and its gradient bucket.
        self.cache
            .retain(|(b, _)| [Some(bi), ei, ai, fi].contains(&Some(*b)));
        let bp = self.block_params(bi)?;
        let shared = bp.shared;
        let v = views::<B>(&bp, &self.params, &self.blocks);
        let l = &self.blocks[bi];
        let mut gs = GradSink {
            l,
            le: ei.map(|ei| &self.blocks[ei]),
            la: ai.map(|ai| &self.blocks[ai]),
            shared_l: shared.map(|o| &self.blocks[o]),
            immediate,
            use_bucket: immediate && self.zero >= 2,
            grads: &mut self.grads,
            bucket: None,
            ebucket: None,
            abucket: None,
            kept: Vec::new(),
            routed: Vec::new(),
        };
        let scales = (self.grad_scale, self.plan.model.mtp_loss_scale);
        let mut sink = |c: &mut Ctx<B>, t: WTask<B>| gs.take(c, t);
        block_bwd(&mut self.ctx, l, v, s, scales, flow, &mut sink)?;
        let GradSink {
            bucket,
            ebucket,
            abucket,
            kept,
            routed,
            ..
        } = gs;
        drop(bp);
        if let Some(b) = bucket {
            self.flush_bucket(bi, b)?;
        }
        if let (Some(sbi), false) = (shared, routed.is_empty()) {
            if immediate {
                self.run_tasks(sbi, routed)?;
            } else {
                flow.held.push((sbi, routed));
            }
        }
        // LoRA's frozen experts (without their adapters) have no gradient to flush.
        let trained = ei.filter(|&ei| !is_frozen_space(self.blocks[ei].space));
        if let (Some(ei), true) = (trained, immediate && self.zero >= 2) {
            // Every member of the expert-DP group flushes, even with no tokens routed here.
            let b = match ebucket {
                Some(b) => b,
                None => self
                    .ctx
                    .zeros_f32(Category::Buffers, &[self.blocks[ei].range.len()])?,
            };
            self.flush_bucket(ei, b)?;
        }
        if let (Some(ai), Some(b)) = (ai, abucket) {
            self.flush_bucket(ai, b)?;
        }
        if immediate {
            self.block_final(stage, bi)?;
        } else {
            flow.held.push((bi, kept));
        }
        Ok(())
    }

    /// Runs LoRA's held tasks of the routed experts' adapters into experts block `ei`.
    pub(super) fn run_expert_tasks(
        &mut self,
        ei: Option<usize>,
        tasks: Vec<WTask<B>>,
    ) -> Result<(), ExecError> {
        if tasks.is_empty() {
            return Ok(());
        }
        let ei = ei.ok_or_else(|| ExecError::from(StateError::ExpertGradientWithoutBlock))?;
        self.run_into(ei, tasks)
    }

    /// Runs `tasks` into block `bi`'s gradients: a bucket reduce-scattered when done under
    /// ZeRO-2/3, else the block's range of its space's gradients.
    pub(super) fn run_into(
        &mut self,
        bi: usize,
        tasks: impl IntoIterator<Item = WTask<B>>,
    ) -> Result<(), ExecError> {
        let l = &self.blocks[bi];
        let mut bucket = if self.zero >= 2 {
            Some(self.ctx.zeros_f32(Category::Buffers, &[l.range.len()])?)
        } else {
            None
        };
        for t in tasks {
            let g = match bucket.as_mut() {
                Some(b) => ViewMut::all(b),
                None => ViewMut {
                    tensor: &mut self.grads[l.space],
                    range: l.range.clone(),
                },
            };
            t.run(&mut self.ctx, l, g)?;
        }
        match bucket {
            Some(b) => self.flush_bucket(bi, b),
            None => Ok(()),
        }
    }

    /// Runs block `bi`'s held weight-gradient tasks (a W action), its experts' included.
    pub(super) fn run_tasks(&mut self, bi: usize, tasks: Vec<WTask<B>>) -> Result<(), ExecError> {
        let ei = self.experts_of(bi);
        if let Some(ai) = self.adapters_of(bi) {
            // LoRA: the layer's own block is frozen; its tasks are the adapters' (in the
            // adapters block) and the routed experts' adapters' (in their experts block).
            let (experts, tasks): (Vec<_>, Vec<_>) = tasks.into_iter().partition(|t| t.is_expert());
            self.run_into(ai, tasks.into_iter().filter(|t| t.is_adapter()))?;
            return self.run_expert_tasks(ei, experts);
        }
        let l = &self.blocks[bi];
        let le = ei.map(|ei| &self.blocks[ei]);
        let no_block = || ExecError::from(StateError::ExpertGradientWithoutBlock);
        if l.space == FROZEN_SPACE {
            return Ok(());
        }
        if self.zero < 2 {
            for t in tasks {
                if t.is_expert() {
                    let le = le.ok_or_else(no_block)?;
                    let g = ViewMut {
                        tensor: &mut self.grads[EXPERT_SPACE],
                        range: le.range.clone(),
                    };
                    t.run(&mut self.ctx, le, g)?;
                } else {
                    let g = ViewMut {
                        tensor: &mut self.grads[DENSE_SPACE],
                        range: l.range.clone(),
                    };
                    t.run(&mut self.ctx, l, g)?;
                }
            }
            return Ok(());
        }
        self.cache.clear();
        let mut bucket = self.ctx.zeros_f32(Category::Buffers, &[l.range.len()])?;
        let mut ebucket = match le {
            Some(le) => Some(self.ctx.zeros_f32(Category::Buffers, &[le.range.len()])?),
            None => None,
        };
        for t in tasks {
            if t.is_expert() {
                let (le, b) = le.zip(ebucket.as_mut()).ok_or_else(no_block)?;
                t.run(&mut self.ctx, le, ViewMut::all(b))?;
            } else {
                t.run(&mut self.ctx, l, ViewMut::all(&mut bucket))?;
            }
        }
        self.flush_bucket(bi, bucket)?;
        if let (Some(ei), Some(b)) = (ei, ebucket) {
            self.flush_bucket(ei, b)?;
        }
        Ok(())
    }
}
