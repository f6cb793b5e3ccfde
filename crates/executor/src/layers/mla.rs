//! Multi-head latent attention's projections (DeepSeek-V2, "DeepSeek-V2: A Strong,
//! Economical, and Efficient Mixture-of-Experts Language Model", section 2.1): the block input
//! goes through one replicated down-projection to the query latent, the key/value latent and
//! the decoupled rotary key (shared by all heads); each latent through its RMSNorm and a
//! column-parallel up-projection to this rank's heads. Rotary applies to the rotary parts
//! only. As Megatron replicates the down-projections over TP, the latents' gradients are
//! all-reduced over TP in backward, so the down-projection and latent-norm gradients are whole
//! on every rank. Saves each latent before and after its norm, and Q, K, V (as the engine's
//! ledger counts: q_norm, q_up, kv_norm and kv_up inputs, the core's Q, K, V).

use super::blocks::BlockLayout;
use super::ctx::Ctx;
use super::params::{mla_down_rows, mla_q_rows, mla_up_tensors};
use super::wtask::{Sink, WTask};
use crate::backend::ops::*;
use crate::backend::{Backend, DeviceCollectives, DeviceTensor, ReduceOp, View, ViewMut};
use crate::error::ExecError;
use crate::tracker::Category;
use parsim_plan::plan::MlaShape;

/// The fused down-projection's tensor (the QKV slot of a layer block).
const DOWN: usize = 1;

/// What MLA's projections keep for backward (besides Q, K, V and the block input).
pub struct MlaSaved<B: Backend> {
    /// Query latent before and after its norm, [n, q_lora_rank] (none without a query latent).
    pub cq: Option<(B::Tensor, B::Tensor)>,
    /// Key/value latent before and after its norm, [n, kv_lora_rank].
    pub ckv: B::Tensor,
    pub ckv_n: B::Tensor,
}

/// Q, K and V of this rank's heads.
pub type QkvTensors<B> = (
    <B as Backend>::Tensor,
    <B as Backend>::Tensor,
    <B as Backend>::Tensor,
);

/// Indices of the norms and up-projections at the end of the layer block.
struct Up {
    /// The query latent's norm and up-projection (none without a query latent).
    q: Option<(usize, usize)>,
    kv_norm: usize,
    kv_up: usize,
}

fn up(l: &BlockLayout, a: &MlaShape) -> Up {
    let b = l.tensors.len() - mla_up_tensors(a);
    let q = (a.q_lora_rank > 0).then_some((b, b + 1));
    let kv = b + 2 * usize::from(q.is_some());
    Up {
        q,
        kv_norm: kv,
        kv_up: kv + 1,
    }
}

fn w<'p, B: Backend>(p: &View<'p, B::Tensor>, l: &BlockLayout, t: usize) -> View<'p, B::Tensor> {
    p.sub(l.tensors[t].range())
}

fn shape<B: Backend>(ctx: &Ctx<B>) -> MlaShape {
    ctx.plan.model.mla.expect("an MLA layer")
}

/// Q [n, a_r (nope + rope)], K [n, a_r (nope + rope)] and V [n, a_r v] of this rank's heads
/// from the normed block input `ln1` [n_sp, h].
pub fn mla_fwd<B: Backend>(
    ctx: &mut Ctx<B>,
    l: &BlockLayout,
    p: &View<'_, B::Tensor>,
    ln1: &B::Tensor,
) -> Result<(QkvTensors<B>, MlaSaved<B>), ExecError> {
    let a = shape(ctx);
    let m = &ctx.plan.model;
    let (spec, theta) = (NormSpec::of(m), m.rope_theta);
    let (n, h, ar) = (ctx.n, ctx.rd.h, ctx.rd.a_r);
    let (qr, kvr, dr) = (a.q_lora_rank, a.kv_lora_rank, a.qk_rope);
    let (act, buf) = (Category::Activations, Category::Buffers);
    let u = up(l, &a);

    // One GEMM for the query's rows (its latent, or without one this rank's heads), the
    // key/value latent and the shared rotary key.
    let (qn, qp) = (ar * a.qk_nope, ar * dr);
    let q_rows = mla_q_rows(&a, ar);
    let dw = mla_down_rows(&a, ar);
    let mut down = ctx.zeros(buf, &[n, dw])?;
    ctx.with_gathered(ln1, |c, xg| {
        c.ops
            .linear_fwd(xg, w::<B>(p, l, DOWN), (n, h, dw), &mut down)
    })?;
    let mut q_first = ctx.zeros(if qr > 0 { act } else { buf }, &[n, q_rows])?;
    let mut ckv = ctx.zeros(act, &[n, kvr])?;
    let mut kpe = ctx.zeros(buf, &[n, dr])?;
    ctx.ops.qkv_split(&down, &mut q_first, &mut ckv, &mut kpe)?;
    drop(down);
    let mut ckv_n = ctx.zeros(act, &[n, kvr])?;
    ctx.ops
        .norm_fwd(spec, &ckv, w::<B>(p, l, u.kv_norm), &mut ckv_n)?;

    // Query: no-rotary and rotary parts of every head, rotary applied, then per-head concat.
    let (qup, cq) = match u.q {
        Some((q_norm, q_up)) => {
            let cq = q_first;
            let mut cq_n = ctx.zeros(act, &[n, qr])?;
            ctx.ops
                .norm_fwd(spec, &cq, w::<B>(p, l, q_norm), &mut cq_n)?;
            let mut qup = ctx.zeros(buf, &[n, qn + qp])?;
            ctx.ops
                .linear_fwd(&cq_n, w::<B>(p, l, q_up), (n, qr, qn + qp), &mut qup)?;
            (qup, Some((cq, cq_n)))
        }
        None => (q_first, None),
    };
    let mut q_nope = ctx.zeros(buf, &[n, qn])?;
    let mut q_rope = ctx.zeros(buf, &[n, qp])?;
    let mut none = ctx.zeros(buf, &[n, 0])?;
    ctx.ops
        .qkv_split(&qup, &mut q_nope, &mut q_rope, &mut none)?;
    drop(qup);
    ctx.ops
        .rotary(&mut q_rope, ar, &ctx.positions, theta, false)?;
    let mut q = ctx.zeros(act, &[n, ar * a.qk()])?;
    ctx.ops.heads_concat(&q_nope, &q_rope, ar, &mut q)?;
    drop((q_nope, q_rope));

    // Keys: per-head no-rotary part and the shared rotary key; values.
    ctx.ops.rotary(&mut kpe, 1, &ctx.positions, theta, false)?;
    let vw = ar * a.v;
    let mut kvup = ctx.zeros(buf, &[n, qn + vw])?;
    ctx.ops
        .linear_fwd(&ckv_n, w::<B>(p, l, u.kv_up), (n, kvr, qn + vw), &mut kvup)?;
    let mut k_nope = ctx.zeros(buf, &[n, qn])?;
    let mut v = ctx.zeros(act, &[n, vw])?;
    ctx.ops.qkv_split(&kvup, &mut k_nope, &mut v, &mut none)?;
    drop(kvup);
    let mut k = ctx.zeros(act, &[n, ar * a.qk()])?;
    ctx.ops.heads_concat(&k_nope, &kpe, ar, &mut k)?;
    drop((k_nope, kpe, none));
    let saved = MlaSaved { cq, ckv, ckv_n };
    Ok(((q, k, v), saved))
}

/// The normed block input's gradient [n_sp, h] from dQ, dK, dV; the weight-gradient tasks go
/// to `sink`.
pub fn mla_bwd<B: Backend>(
    ctx: &mut Ctx<B>,
    l: &BlockLayout,
    p: &View<'_, B::Tensor>,
    s: MlaSaved<B>,
    ln1: B::Tensor,
    [dq, dk, dv]: [B::Tensor; 3],
    sink: &mut Sink<B>,
) -> Result<B::Tensor, ExecError> {
    let a = shape(ctx);
    let theta = ctx.plan.model.rope_theta;
    let (n, h, ar) = (ctx.n, ctx.rd.h, ctx.rd.a_r);
    let (kvr, dr) = (a.kv_lora_rank, a.qk_rope);
    let (qn, qp, vw) = (ar * a.qk_nope, ar * dr, ar * a.v);
    let buf = Category::Buffers;
    let u = up(l, &a);
    let none = ctx.zeros(buf, &[n, 0])?;

    // Query side: split the heads, undo the rotation.
    let mut dq_nope = ctx.zeros(buf, &[n, qn])?;
    let mut dq_rope = ctx.zeros(buf, &[n, qp])?;
    ctx.ops.heads_split(&dq, ar, &mut dq_nope, &mut dq_rope)?;
    drop(dq);
    ctx.ops
        .rotary(&mut dq_rope, ar, &ctx.positions, theta, true)?;
    let mut dqup = ctx.zeros(buf, &[n, qn + qp])?;
    ctx.ops.qkv_merge(&dq_nope, &dq_rope, &none, &mut dqup)?;
    drop((dq_nope, dq_rope));

    // Key/value side: the shared rotary key's gradient sums the heads.
    let mut dk_nope = ctx.zeros(buf, &[n, qn])?;
    let mut dkpe = ctx.zeros(buf, &[n, dr])?;
    ctx.ops.heads_split(&dk, ar, &mut dk_nope, &mut dkpe)?;
    drop(dk);
    ctx.ops.rotary(&mut dkpe, 1, &ctx.positions, theta, true)?;
    let mut dkvup = ctx.zeros(buf, &[n, qn + vw])?;
    ctx.ops.qkv_merge(&dk_nope, &dv, &none, &mut dkvup)?;
    drop((dk_nope, dv));
    let mut d_ckvn = ctx.zeros(buf, &[n, kvr])?;
    ctx.ops.linear_dgrad(
        &dkvup,
        w::<B>(p, l, u.kv_up),
        (n, kvr, qn + vw),
        &mut d_ckvn,
        false,
    )?;
    sink(ctx, linear(u.kv_up, s.ckv_n, dkvup, kvr, qn + vw))?;

    // The latents' gradients are partial sums over this rank's heads: all-reduce over TP.
    for t in [&mut d_ckvn, &mut dkpe] {
        ctx.comm
            .all_reduce(&ctx.tp, ViewMut::all(t), ReduceOp::Sum)?;
    }
    let d_ckv = norm_bwd(ctx, p, l, u.kv_norm, s.ckv, d_ckvn, sink)?;
    // The query's rows of the down-projection: the latent's gradient (whole, like the key/value
    // latent's), or without a latent this rank's heads' gradient (a partial sum of the input's).
    let q_rows = mla_q_rows(&a, ar);
    let d_qfirst = match (u.q, s.cq) {
        (Some((q_norm, q_up)), Some((cq, cq_n))) => {
            let qr = a.q_lora_rank;
            let mut d_cqn = ctx.zeros(buf, &[n, qr])?;
            ctx.ops.linear_dgrad(
                &dqup,
                w::<B>(p, l, q_up),
                (n, qr, qn + qp),
                &mut d_cqn,
                false,
            )?;
            sink(ctx, linear(q_up, cq_n, dqup, qr, qn + qp))?;
            ctx.comm
                .all_reduce(&ctx.tp, ViewMut::all(&mut d_cqn), ReduceOp::Sum)?;
            norm_bwd(ctx, p, l, q_norm, cq, d_cqn, sink)?
        }
        _ => dqup,
    };

    // The down-projection: the key/value rows' input gradient is whole on every rank, so this
    // rank keeps its SP shard; the plain query rows' is reduced over TP into the region.
    let dw = mla_down_rows(&a, ar);
    let mut ddown = ctx.zeros(buf, &[n, dw])?;
    ctx.ops.qkv_merge(&d_qfirst, &d_ckv, &dkpe, &mut ddown)?;
    let d_region = if a.q_lora_rank > 0 {
        drop((d_qfirst, d_ckv, dkpe, none));
        let mut d_full = ctx.zeros(buf, &[n, h])?;
        ctx.ops
            .linear_dgrad(&ddown, w::<B>(p, l, DOWN), (n, h, dw), &mut d_full, false)?;
        region_of(ctx, d_full)?
    } else {
        let (kw, wd) = (kvr + dr, w::<B>(p, l, DOWN));
        let mut dkv = ctx.zeros(buf, &[n, kw])?;
        ctx.ops.qkv_merge(&d_ckv, &dkpe, &none, &mut dkv)?;
        drop((d_ckv, dkpe, none));
        let mut d_kv = ctx.zeros(buf, &[n, h])?;
        let kv_rows = wd.sub(q_rows * h..dw * h);
        ctx.ops
            .linear_dgrad(&dkv, kv_rows, (n, h, kw), &mut d_kv, false)?;
        drop(dkv);
        let mut part = ctx.zeros(buf, &[n, h])?;
        let q_w = wd.sub(0..q_rows * h);
        ctx.ops
            .linear_dgrad(&d_qfirst, q_w, (n, h, q_rows), &mut part, false)?;
        drop(d_qfirst);
        let mut d = ctx.reduce_to_region(part, Category::Activations)?;
        let lo = if ctx.sp {
            ctx.rd.tp_rank * ctx.n_sp * h
        } else {
            0
        };
        ctx.ops.axpy(
            1.0,
            View::all(&d_kv).sub(lo..lo + ctx.n_sp * h),
            ViewMut::all(&mut d),
        )?;
        d
    };
    let sp = ctx.sp;
    let mut task = linear(DOWN, ln1, ddown, h, dw);
    if let WTask::Linear { gather_x, .. } = &mut task {
        *gather_x = sp;
    }
    sink(ctx, task)?;
    Ok(d_region)
}

/// The input gradient of a latent's norm (tensor `t`) from its output gradient `dy`; the
/// weight-gradient task goes to `sink`.
fn norm_bwd<B: Backend>(
    ctx: &mut Ctx<B>,
    p: &View<'_, B::Tensor>,
    l: &BlockLayout,
    t: usize,
    x: B::Tensor,
    dy: B::Tensor,
    sink: &mut Sink<B>,
) -> Result<B::Tensor, ExecError> {
    let m = &ctx.plan.model;
    let spec = NormSpec::of(m);
    let mut dx = ctx.zeros(Category::Buffers, &[ctx.n, x.cols()])?;
    ctx.ops
        .norm_dgrad(spec, &x, w::<B>(p, l, t), &dy, &mut dx, false)?;
    sink(ctx, WTask::Norm { tensor: t, x, dy })?;
    Ok(dx)
}

/// This rank's SP region of a gradient whole on every TP rank.
fn region_of<B: Backend>(ctx: &mut Ctx<B>, full: B::Tensor) -> Result<B::Tensor, ExecError> {
    if ctx.sp {
        ctx.own_shard(&full)
    } else {
        Ok(full)
    }
}

/// dW += dY^T X for tensor `tensor` [o, i] with X and dY whole on this rank.
fn linear<B: Backend>(tensor: usize, x: B::Tensor, dy: B::Tensor, i: usize, o: usize) -> WTask<B> {
    WTask::Linear {
        tensor,
        x,
        dy,
        i,
        o,
        gather_x: false,
        dy_gathered: false,
        dy_shard: false,
    }
}
