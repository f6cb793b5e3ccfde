//! A chunk's backward: input gradients block by block, the weight-gradient tasks run at once
//! (into the gradients or a ZeRO-2/3 bucket) or held for the W action.

use super::state::{BlockSaved, BlockTasks, Rank};
use crate::backend::{Backend, TensorOps, View, ViewMut};
use crate::error::{ExecError, StateError};
use crate::layers::blocks::{is_frozen_space, BlockKind, DENSE_SPACE, EXPERT_SPACE, FROZEN_SPACE};
use crate::layers::ends::{embedding_bwd, head_bwd, output_bwd};
use crate::layers::layer::{layer_bwd, layer_fwd, Experts};
use crate::layers::lora::Adapters;
use crate::layers::mtp::mtp_in_bwd;
use crate::layers::{Ctx, WTask};
use crate::runner::zero::params_of;
use crate::tracker::Category;

impl<'a, B: Backend> Rank<'a, B> {
    /// Input gradients of a chunk. The weight-gradient tasks run as soon as the backward
    /// produces them (`immediate`, a full backward) or wait for the W action.
    pub(super) fn backward_input(
        &mut self,
        stage: u32,
        mb: u32,
        immediate: bool,
    ) -> Result<(), ExecError> {
        let bidx = self
            .stage_blocks
            .get(&stage)
            .cloned()
            .ok_or_else(|| self.missing("chunk", stage, mb))?;
        self.ctx.mb = mb;
        (self.ctx.step, self.ctx.dp_rank) = (self.step, self.rp.coords.dp);
        let saved = self
            .saved
            .remove(&(stage, mb))
            .ok_or_else(|| self.missing("forward", stage, mb))?;
        let last = self.blocks[bidx.end - 1].kind;
        let mut dy = if matches!(last, BlockKind::Output | BlockKind::MtpOut(_)) {
            None
        } else {
            Some(
                self.mailbox
                    .remove(&(stage + 1, mb, true))
                    .ok_or_else(|| self.missing("output gradient", stage, mb))?,
            )
        };
        let mut held: BlockTasks<B> = Vec::new();
        // Multi-token prediction: the gradient of the hidden states an MTP module took.
        let mut mtp_dh: Option<B::Tensor> = None;
        for (bi, s) in bidx.rev().zip(saved.into_iter().rev()) {
            if matches!(s, BlockSaved::Experts) {
                // Its backward runs with its layer's.
                continue;
            }
            let ei = self.experts_of(bi);
            let ai = self.adapters_of(bi);
            let fi = self.frozen_experts_of(bi);
            // ZeRO-3 in backward: the block in use (with its experts, adapters and frozen
            // experts) and its gradient bucket.
            self.cache
                .retain(|(b, _)| [Some(bi), ei, ai, fi].contains(&Some(*b)));
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
            let shared_l = shared.map(|o| &self.blocks[o]);
            let frozen = fh
                .as_ref()
                .map(|(fi, h)| (&self.blocks[*fi], params_of(&self.params, h)));
            let experts: Experts<B> = eh
                .as_ref()
                .map(|(ei, eh)| (&self.blocks[*ei], params_of(&self.params, eh), frozen));
            let ad: Adapters<B> = ah
                .as_ref()
                .map(|(ai, h)| (&self.blocks[*ai], params_of(&self.params, h)));
            let la = ai.map(|ai| &self.blocks[ai]);
            let l = &self.blocks[bi];
            let le = ei.map(|ei| &self.blocks[ei]);
            // ZeRO-2/3: the gradient bucket is allocated at the first weight gradient, after a
            // full recompute's forward rerun.
            let mut bucket: Option<B::Tensor> = None;
            let mut ebucket: Option<B::Tensor> = None;
            let mut abucket: Option<B::Tensor> = None;
            let use_bucket = immediate && self.zero >= 2;
            let grads = &mut self.grads;
            let mut kept = Vec::new();
            // An MTP module's embedding and output-head gradients, for those blocks.
            let mut routed = Vec::new();
            let mut sink = |c: &mut Ctx<B>, t: WTask<B>| -> Result<(), ExecError> {
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
                if let (true, Some(sl)) = (to_shared, shared_l) {
                    routed.push(if immediate { t } else { t.hold(c, sl)? });
                    return Ok(());
                }
                if !immediate {
                    kept.push(t.hold(c, l)?);
                    return Ok(());
                }
                let (tl, bk, sp) = if t.is_expert() {
                    let le =
                        le.ok_or_else(|| ExecError::from(StateError::ExpertGradientWithoutBlock))?;
                    (le, &mut ebucket, EXPERT_SPACE)
                } else if t.is_adapter() {
                    let la =
                        la.ok_or_else(|| ExecError::from(StateError::AdapterGradientWithoutBlock))?;
                    (la, &mut abucket, DENSE_SPACE)
                } else {
                    (l, &mut bucket, DENSE_SPACE)
                };
                if use_bucket {
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
                            tensor: &mut grads[sp],
                            range: tl.range.clone(),
                        },
                    )
                }
            };
            let ctx = &mut self.ctx;
            match s {
                BlockSaved::Output(os) => {
                    let mut d = output_bwd(ctx, l, p, os, self.grad_scale, &mut sink)?;
                    if let Some(dh) = mtp_dh.take() {
                        ctx.ops.axpy(1.0, View::all(&dh), ViewMut::all(&mut d))?;
                    }
                    dy = Some(d);
                }
                BlockSaved::MtpOut(os) => {
                    let obi = shared.expect("output block");
                    let head = sp_.expect("output parameters");
                    let head = head.sub(self.blocks[obi].tensors[1].range());
                    let norm = p.sub(l.tensors[0].range());
                    let scale = self.grad_scale * self.plan.model.mtp_loss_scale;
                    let mut d = head_bwd(ctx, norm, head, os, scale, &mut sink)?;
                    if let Some(dh) = mtp_dh.take() {
                        ctx.ops.axpy(1.0, View::all(&dh), ViewMut::all(&mut d))?;
                    }
                    dy = Some(d);
                }
                BlockSaved::MtpIn(ms) => {
                    let d = dy.take().expect("grad");
                    mtp_dh = Some(mtp_in_bwd(ctx, l, p, *ms, d, &mut sink)?);
                }
                BlockSaved::Layer(ls) => {
                    dy = Some(layer_bwd(
                        ctx,
                        l,
                        p,
                        experts,
                        ad,
                        *ls,
                        dy.take().expect("grad"),
                        &mut sink,
                    )?);
                }
                BlockSaved::LayerInput(x) => {
                    // The rerun's load-balancing loss and drops were counted in forward.
                    let stats = (ctx.moe_aux_loss, ctx.moe_dropped);
                    ctx.recomputing = true;
                    let r = layer_fwd(ctx, l, p.clone(), experts.clone(), ad.clone(), x);
                    ctx.recomputing = false;
                    let (y, ls) = r?;
                    (ctx.moe_aux_loss, ctx.moe_dropped) = stats;
                    drop(y);
                    dy = Some(layer_bwd(
                        ctx,
                        l,
                        p,
                        experts,
                        ad,
                        ls,
                        dy.take().expect("grad"),
                        &mut sink,
                    )?);
                }
                BlockSaved::Embedding(tokens, mask) => {
                    embedding_bwd(ctx, tokens, mask, dy.take().expect("grad"), 0, &mut sink)?
                }
                BlockSaved::Experts => {}
            }

            drop((h, eh, ah, sh));
            if let Some(b) = bucket {
                self.flush_bucket(bi, b)?;
            }
            if let (Some(sbi), false) = (shared, routed.is_empty()) {
                if immediate {
                    self.run_tasks(sbi, routed)?;
                } else {
                    held.push((sbi, routed));
                }
            }
            // LoRA's frozen experts (without their adapters) have no gradient to flush.
            let trained = ei.filter(|&ei| !is_frozen_space(self.blocks[ei].space));
            if let (Some(ei), true) = (trained, use_bucket) {
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
                held.push((bi, kept));
            }
        }
        if let Some(dx) = dy {
            self.mailbox.insert((stage, mb, true), dx);
        }
        if !immediate {
            self.wtasks.insert((stage, mb), held);
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
