//! The pipeline's ends: the vocab-parallel embedding (first stage) and the final norm, output
//! layer and vocab-parallel cross-entropy (last stage), as Megatron-LM shards them.

use super::blocks::BlockLayout;
use super::ctx::Ctx;
use super::dropout::{apply_saved, hidden_dropout};
use super::positions;
use super::wtask::{Sink, WTask};
use crate::backend::ops::*;
use crate::backend::{Backend, Device};
use crate::backend::{DeviceCollectives, ReduceOp, View, ViewMut};
use crate::error::ExecError;
use crate::rng::DropoutSite;
use crate::tracker::Category;

/// Embedding forward: each TP rank looks up its vocabulary rows (zeros elsewhere) and the
/// partial sums are all-reduced, or reduce-scattered into the sequence shard with SP. With
/// learned positions, those `shift` ahead (a multi-token-prediction depth's, [`positions`]).
pub fn embedding_fwd<B: Backend>(
    ctx: &mut Ctx<B>,
    l: &BlockLayout,
    p: View<'_, B::Tensor>,
    tokens: &[u32],
    shift: usize,
) -> Result<(B::Tensor, Option<B::Tensor>), ExecError> {
    let (h, v_r) = (ctx.rd.h, ctx.rd.v_r);
    let lo = ctx.rd.tp_rank * v_r;
    let mut partial = ctx.zeros(Category::Buffers, &[ctx.n, h])?;
    ctx.ops
        .embedding_gather(p.sub(l.tensors[0].range()), tokens, lo, &mut partial)?;
    positions::add_rows(ctx, l, &p, &mut partial, shift)?;
    let mut x = ctx.reduce_to_region(partial, Category::Activations)?;
    let mask = hidden_dropout(ctx, 0, DropoutSite::Embedding, &mut x)?;
    Ok((x, mask))
}

/// Embedding backward: only the weight-gradient task (the tokens have no gradient), through
/// the forward's saved dropout mask.
pub fn embedding_bwd<B: Backend>(
    ctx: &mut Ctx<B>,
    tokens: Vec<u32>,
    mask: Option<B::Tensor>,
    mut dy: B::Tensor,
    shift: usize,
    sink: &mut Sink<B>,
) -> Result<(), ExecError> {
    apply_saved(ctx, mask.as_ref(), &mut dy)?;
    drop(mask);
    let dyg = ctx.expand_grad(&dy)?;
    drop(dy);
    sink(
        ctx,
        WTask::Embedding {
            tokens,
            dy: dyg,
            dy_shard: false,
            shift,
        },
    )
}

/// What the output block keeps: the final norm's input, the output layer's input (sequence
/// shard with SP) and the fp32 softmax of the vocab-parallel cross-entropy.
pub struct OutputSaved<B: Backend> {
    pub x: B::Tensor,
    pub lnf: B::Tensor,
    pub probs: B::Tensor,
    pub targets: Vec<u32>,
}

/// Final norm, output layer, vocab-parallel cross-entropy (three small TP all-reduces: the row
/// maximum, the sum of exponentials, the target logit). Returns the sum of token losses.
pub fn output_fwd<B: Backend>(
    ctx: &mut Ctx<B>,
    l: &BlockLayout,
    p: View<'_, B::Tensor>,
    x: B::Tensor,
    targets: Vec<u32>,
) -> Result<(f64, OutputSaved<B>), ExecError> {
    let norm = p.sub(l.tensors[0].range());
    head_fwd(ctx, norm, p.sub(l.tensors[1].range()), x, targets)
}

/// [`output_fwd`] with the final norm's weights `norm` and the output layer's `w` given apart
/// (a multi-token-prediction module has its own norm and shares the output layer).
pub fn head_fwd<B: Backend>(
    ctx: &mut Ctx<B>,
    norm: View<'_, B::Tensor>,
    w: View<'_, B::Tensor>,
    x: B::Tensor,
    targets: Vec<u32>,
) -> Result<(f64, OutputSaved<B>), ExecError> {
    let m = &ctx.plan.model;
    let (h, v_r, n, n_sp) = (ctx.rd.h, ctx.rd.v_r, ctx.n, ctx.n_sp);
    let mut lnf = ctx.zeros(Category::Activations, &[n_sp, h])?;
    ctx.ops.norm_fwd(NormSpec::of(m), &x, norm, &mut lnf)?;
    let mut logits = ctx.zeros(Category::Buffers, &[n, v_r])?;
    ctx.with_gathered(&lnf, |c, xg| {
        c.ops.linear_fwd(xg, w, (n, h, v_r), &mut logits)
    })?;
    let lo = ctx.rd.tp_rank * v_r;
    let row = |ctx: &Ctx<B>| ctx.zeros_f32(Category::Buffers, &[n]);
    let mut max = row(ctx)?;
    ctx.ops.ce_row_max(&logits, &mut max)?;
    ctx.comm
        .all_reduce(&ctx.tp, ViewMut::all(&mut max), ReduceOp::Max)?;
    let mut probs = ctx.zeros_f32(Category::Activations, &[n, v_r])?;
    let mut sum = row(ctx)?;
    ctx.ops.ce_exp(&logits, &max, &mut probs, &mut sum)?;
    ctx.comm
        .all_reduce(&ctx.tp, ViewMut::all(&mut sum), ReduceOp::Sum)?;
    let mut target_logit = row(ctx)?;
    ctx.ops
        .ce_target_logit(&logits, &targets, lo, &mut target_logit)?;
    ctx.comm
        .all_reduce(&ctx.tp, ViewMut::all(&mut target_logit), ReduceOp::Sum)?;
    drop(logits);
    let loss = ctx.ops.ce_loss(&mut probs, &sum, &max, &target_logit)?;
    Ok((
        loss,
        OutputSaved {
            x,
            lnf,
            probs,
            targets,
        },
    ))
}

/// Backward of the loss `scale * sum of token losses`: dx [n_sp, h]; weight tasks to `sink`.
pub fn output_bwd<B: Backend>(
    ctx: &mut Ctx<B>,
    l: &BlockLayout,
    p: View<'_, B::Tensor>,
    s: OutputSaved<B>,
    scale: f32,
    sink: &mut Sink<B>,
) -> Result<B::Tensor, ExecError> {
    let norm = p.sub(l.tensors[0].range());
    head_bwd(ctx, norm, p.sub(l.tensors[1].range()), s, scale, sink)
}

/// [`output_bwd`] with the norm's and the output layer's weights given apart; the weight
/// tasks name tensor 0 (the norm) and tensor 1 (the output layer), which the caller routes.
pub fn head_bwd<B: Backend>(
    ctx: &mut Ctx<B>,
    norm: View<'_, B::Tensor>,
    w: View<'_, B::Tensor>,
    s: OutputSaved<B>,
    scale: f32,
    sink: &mut Sink<B>,
) -> Result<B::Tensor, ExecError> {
    let m = &ctx.plan.model;
    let (h, v_r, n, n_sp) = (ctx.rd.h, ctx.rd.v_r, ctx.n, ctx.n_sp);
    let OutputSaved {
        x,
        lnf,
        probs,
        targets,
    } = s;
    let lo = ctx.rd.tp_rank * v_r;
    let mut dlogits = ctx.ops.recat(probs, Category::Buffers);
    ctx.ops.ce_grad(&mut dlogits, &targets, lo, scale)?;
    let mut part = ctx.zeros(Category::Buffers, &[n, h])?;
    ctx.ops
        .linear_dgrad(&dlogits, w, (n, h, v_r), &mut part, false)?;
    let d_lnf = ctx.reduce_to_region(part, Category::Buffers)?;
    let sp = ctx.sp;
    sink(
        ctx,
        WTask::Linear {
            tensor: 1,
            x: lnf,
            dy: dlogits,
            i: h,
            o: v_r,
            gather_x: sp,
            dy_gathered: false,
            dy_shard: false,
        },
    )?;
    let mut dx = ctx.zeros(Category::Buffers, &[n_sp, h])?;
    ctx.ops
        .norm_dgrad(NormSpec::of(m), &x, norm, &d_lnf, &mut dx, false)?;
    sink(
        ctx,
        WTask::Norm {
            tensor: 0,
            x,
            dy: d_lnf,
        },
    )?;
    Ok(dx)
}
