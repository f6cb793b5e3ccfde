//! LoRA adapters (Hu et al. 2021) on the routed experts' fc1 and fc2: one pair A [r, in],
//! B [out, r] per expert, as NeMo's LoRA wraps each expert's `linear_fc1`/`linear_fc2` (the
//! engine's `src/model/moe_lora.rs`). They make up the MoE layer's experts block (expert space:
//! reduced and sharded over expert DP); the frozen experts then make up the frozen-experts
//! block after it (frozen expert space: sharded over expert DP under ZeRO-3).
//!
//! Under expert TP every member runs all the expert's gathered rows, so fc1's A (whole) sees
//! them all and its rank-r gradient is a partial sum over expert TP (each member's B rows),
//! all-reduced; fc2's A is split by input columns like the weight, its A x all-reduced over
//! expert TP in forward, and its B (whole) adds B u once, on expert-TP rank 0, to the output
//! rows that are partial sums over expert TP (as the input gradient of fc1's A is).

use super::blocks::{fc1_rows, seg, BlockLayout, Builder, RankDims};
use super::ctx::Ctx;
use super::wtask::{Sink, WTask};
use crate::backend::ops::*;
use crate::backend::{Backend, ReduceOp, View, ViewMut};
use crate::backend::{DeviceCollectives, DeviceTensor};
use crate::error::ExecError;
use crate::tracker::Category;
use parsim_plan::plan::{Activation, LoraShape, Plan};

/// True when the routed experts carry adapters (LoRA on fc1 or fc2 of an MoE model).
pub fn routed(plan: &Plan) -> bool {
    plan.model.moe.is_some() && plan.lora.is_some_and(|l| l.fc1 || l.fc2)
}

/// Appends expert `q`'s adapters: fc1's A [r, h] and B [w1_r, r] (gate and up rows under
/// SwiGLU), then fc2's A [r, f_r] and B [h, r], each when targeted.
pub(super) fn push(
    b: &mut Builder,
    lora: &LoraShape,
    rd: &RankDims,
    q: &str,
    act: Activation,
    ffn: usize,
    std: f32,
) {
    let (h, r, et) = (rd.h, lora.rank, (rd.et, rd.et_rank));
    let b_std = if lora.seeded_b { std } else { 0.0 };
    if lora.fc1 {
        b.push(
            r,
            h,
            vec![seg(format!("{q}.fc1_lora_a"), h, 0..r, 0..h, std)],
            false,
        );
        let (rows, segs) = fc1_rows(act, format!("{q}.fc1_lora_b"), r, ffn, et, b_std);
        b.push(rows, r, segs, false);
    }
    if lora.fc2 {
        let fr = ffn / rd.et;
        let own = rd.et_rank * fr..(rd.et_rank + 1) * fr;
        b.push(
            r,
            fr,
            vec![seg(format!("{q}.fc2_lora_a"), ffn, 0..r, own, std)],
            false,
        );
        b.push(
            h,
            r,
            vec![seg(format!("{q}.fc2_lora_b"), r, 0..h, 0..r, b_std)],
            false,
        );
    }
}

/// Indices of local expert `j`'s (A, B) for fc1 and fc2 in the experts block.
pub fn tensors(lora: &LoraShape, j: usize) -> (Option<usize>, Option<usize>) {
    let per = 2 * usize::from(lora.fc1) + 2 * usize::from(lora.fc2);
    let base = per * j;
    let fc1 = lora.fc1.then_some(base);
    let fc2 = lora.fc2.then_some(base + 2 * usize::from(lora.fc1));
    (fc1, fc2)
}

fn view<'p, T: DeviceTensor>(le: &BlockLayout, pe: &View<'p, T>, t: usize) -> View<'p, T> {
    pe.sub(le.tensors[t].range())
}

/// u = s z on a fresh tensor of category `cat`.
fn scaled<B: Backend>(ctx: &Ctx<B>, z: &B::Tensor, cat: Category) -> Result<B::Tensor, ExecError> {
    let s = ctx.plan.lora.map_or(1.0, |l| l.scale());
    let mut u = ctx.zeros(cat, z.shape())?;
    ctx.ops.axpy(s, View::all(z), ViewMut::all(&mut u))?;
    Ok(u)
}

/// Sums a rank-r tensor over expert TP (every member's partial).
fn reduce_et<B: Backend>(ctx: &mut Ctx<B>, z: &mut B::Tensor) -> Result<(), ExecError> {
    if ctx.rd.et > 1 {
        ctx.comm
            .all_reduce(&ctx.etp, ViewMut::all(z), ReduceOp::Sum)?;
    }
    Ok(())
}

/// dW[o, i] += dy^T x of tensor `t` of the experts block, to the sink.
fn wgrad<B: Backend>(
    ctx: &mut Ctx<B>,
    t: usize,
    dy: &B::Tensor,
    x: &B::Tensor,
    dims: (usize, usize, usize),
    sink: &mut Sink<B>,
) -> Result<(), ExecError> {
    super::lora::wgrad_as(ctx, dy, x, dims, sink, |grad| WTask::ExpertReady {
        tensor: t,
        grad,
    })
}

/// fc1's adapter forward on expert `j`'s rows `x` [c, h]: adds B s A x to `u` [c, w1_r];
/// returns the saved s A x [c, r].
pub fn fc1_fwd<B: Backend>(
    ctx: &mut Ctx<B>,
    (le, pe): (&BlockLayout, &View<'_, B::Tensor>),
    j: usize,
    x: &B::Tensor,
    u: &mut B::Tensor,
) -> Result<Option<B::Tensor>, ExecError> {
    let Some(lora) = ctx.plan.lora else {
        return Ok(None);
    };
    let (Some(t), _) = tensors(&lora, j) else {
        return Ok(None);
    };
    let (c, h, r, w1) = (x.rows(), ctx.rd.h, lora.rank, u.cols());
    let mut z = ctx.zeros(Category::Buffers, &[c, r])?;
    ctx.ops.linear_fwd(x, view(le, pe, t), (c, h, r), &mut z)?;
    let s = scaled(ctx, &z, Category::Activations)?;
    drop(z);
    let mut out = ctx.zeros(Category::Buffers, &[c, w1])?;
    ctx.ops
        .linear_fwd(&s, view(le, pe, t + 1), (c, r, w1), &mut out)?;
    ctx.ops.axpy(1.0, View::all(&out), ViewMut::all(u))?;
    Ok(Some(s))
}

/// fc2's adapter forward on expert `j`'s activation `act` [c, f_r]: adds B s A act to the
/// output rows `y` [c, h] on expert-TP rank 0; returns the saved s A act [c, r].
pub fn fc2_fwd<B: Backend>(
    ctx: &mut Ctx<B>,
    (le, pe): (&BlockLayout, &View<'_, B::Tensor>),
    j: usize,
    act: &B::Tensor,
    y: &mut B::Tensor,
) -> Result<Option<B::Tensor>, ExecError> {
    let Some(lora) = ctx.plan.lora else {
        return Ok(None);
    };
    let (_, Some(t)) = tensors(&lora, j) else {
        return Ok(None);
    };
    let (c, h, r, f) = (act.rows(), ctx.rd.h, lora.rank, act.cols());
    let mut z = ctx.zeros(Category::Buffers, &[c, r])?;
    ctx.ops
        .linear_fwd(act, view(le, pe, t), (c, f, r), &mut z)?;
    reduce_et(ctx, &mut z)?;
    let s = scaled(ctx, &z, Category::Activations)?;
    drop(z);
    if ctx.rd.et_rank == 0 {
        let mut out = ctx.zeros(Category::Buffers, &[c, h])?;
        ctx.ops
            .linear_fwd(&s, view(le, pe, t + 1), (c, r, h), &mut out)?;
        ctx.ops.axpy(1.0, View::all(&out), ViewMut::all(y))?;
    }
    Ok(Some(s))
}

/// fc2's adapter backward from expert `j`'s output gradient `dy` [c, h] (whole on every
/// expert-TP member): sends dB and dA, adds the activation gradient to `dact` [c, f_r].
pub fn fc2_bwd<B: Backend>(
    ctx: &mut Ctx<B>,
    (le, pe): (&BlockLayout, &View<'_, B::Tensor>),
    j: usize,
    s: B::Tensor,
    (act, dy): (&B::Tensor, &B::Tensor),
    dact: &mut B::Tensor,
    sink: &mut Sink<B>,
) -> Result<(), ExecError> {
    let Some(lora) = ctx.plan.lora else {
        return Ok(());
    };
    let (_, Some(t)) = tensors(&lora, j) else {
        return Ok(());
    };
    let (c, h, r, f) = (dy.rows(), ctx.rd.h, lora.rank, act.cols());
    wgrad(ctx, t + 1, dy, &s, (c, r, h), sink)?;
    drop(s);
    let mut ds = ctx.zeros(Category::Buffers, &[c, r])?;
    ctx.ops
        .linear_dgrad(dy, view(le, pe, t + 1), (c, r, h), &mut ds, false)?;
    let dz = scaled(ctx, &ds, Category::Buffers)?;
    drop(ds);
    wgrad(ctx, t, &dz, act, (c, f, r), sink)?;
    ctx.ops
        .linear_dgrad(&dz, view(le, pe, t), (c, f, r), dact, true)
}

/// fc1's adapter backward from expert `j`'s fc1 output gradient `du` [c, w1_r]: sends dB and
/// dA, adds the input gradient to `dx` [c, h] (a partial sum over expert TP) on rank 0.
pub fn fc1_bwd<B: Backend>(
    ctx: &mut Ctx<B>,
    (le, pe): (&BlockLayout, &View<'_, B::Tensor>),
    j: usize,
    s: B::Tensor,
    (x, du): (&B::Tensor, &B::Tensor),
    dx: &mut B::Tensor,
    sink: &mut Sink<B>,
) -> Result<(), ExecError> {
    let Some(lora) = ctx.plan.lora else {
        return Ok(());
    };
    let (Some(t), _) = tensors(&lora, j) else {
        return Ok(());
    };
    let (c, h, r, w1) = (du.rows(), ctx.rd.h, lora.rank, du.cols());
    wgrad(ctx, t + 1, du, &s, (c, r, w1), sink)?;
    drop(s);
    let mut ds = ctx.zeros(Category::Buffers, &[c, r])?;
    ctx.ops
        .linear_dgrad(du, view(le, pe, t + 1), (c, r, w1), &mut ds, false)?;
    reduce_et(ctx, &mut ds)?;
    let dz = scaled(ctx, &ds, Category::Buffers)?;
    drop(ds);
    wgrad(ctx, t, &dz, x, (c, h, r), sink)?;
    if ctx.rd.et_rank == 0 {
        ctx.ops
            .linear_dgrad(&dz, view(le, pe, t), (c, h, r), dx, true)?;
    }
    Ok(())
}
