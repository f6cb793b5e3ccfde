//! The shared experts of an MoE layer (DeepSeekMoE, Dai et al. 2024; DeepSeek-V2/V3): one
//! dense MLP of intermediate size `moe.shared_ffn` (all shared experts together) that every
//! token passes through, its output added to the routed experts' combined output, ungated.
//! Its weights sit in the layer's (dense) block after the router, so they reduce over DP; with
//! linear biases its fc1 bias is added here, its fc2 bias by the MoE block after the reduction
//! ([`super::bias`]).
//!
//! Under LoRA with fc1/fc2 targets the shared experts carry the dense MLP's adapters (NeMo's
//! LoRA wraps their `linear_fc1`/`linear_fc2` as the dense MLP's; the engine's
//! `moe.shared.fc1_lora`/`fc2_lora`), in the layer's adapters block: fc1's on the region input
//! as [`super::lora::col_fwd`], fc2's added to the reduced output ([`shared_fc2_lora`]).

use super::blocks::BlockLayout;
use super::ctx::Ctx;
use super::lora::{self, Adapters, LoraSaved, Target};
use super::wtask::{Sink, WTask};
use crate::backend::ops::*;
use crate::backend::{Backend, Device, View, ViewMut};
use crate::error::ExecError;
use crate::tracker::Category;
use parsim_plan::plan::Activation;

/// The shared experts' fc1 and fc2 in an MoE layer's block (after the router).
pub const SHARED_FC1: usize = super::blocks::ROUTER + 1;
pub const SHARED_FC2: usize = SHARED_FC1 + 1;

/// What the shared experts keep for backward (their input is the block's `ln2`).
pub struct SharedSaved<B: Backend> {
    u: B::Tensor,
    act: B::Tensor,
}

/// The layer's adapters, its saved adapter intermediates and the block's input on its region
/// (the sequence shard under SP): what the shared experts' LoRA adapters need.
pub struct SharedLora<'s, 'a, B: Backend> {
    pub ad: &'s Adapters<'a, B>,
    pub ls: &'s mut LoraSaved<B>,
    pub x_reg: &'s B::Tensor,
}

/// This TP rank's intermediate size and fc1 width (split over TP as the dense MLP).
fn widths<B: Backend>(ctx: &Ctx<B>) -> Option<(usize, usize)> {
    let f = ctx.plan.model.moe.as_ref()?.shared_ffn / ctx.rd.t;
    let w1 = match ctx.plan.model.activation {
        Activation::Swiglu => 2 * f,
        Activation::Gelu => f,
    };
    (f > 0).then_some((f, w1))
}

/// Adds the shared experts' output on `ln2` [n, h] to `out` [n, h] (a partial sum over TP,
/// without fc2's adapter: [`shared_fc2_lora`] adds it after the reduction); `None` without
/// them.
pub fn shared_fwd<B: Backend>(
    ctx: &mut Ctx<B>,
    l: &BlockLayout,
    p: View<'_, B::Tensor>,
    ln2: &B::Tensor,
    out: &mut B::Tensor,
    lo: SharedLora<'_, '_, B>,
) -> Result<Option<SharedSaved<B>>, ExecError> {
    let Some((f, w1)) = widths(ctx) else {
        return Ok(None);
    };
    let (n, h) = (ctx.n, ctx.rd.h);
    let a = Category::Activations;
    let mut u = ctx.zeros(a, &[n, w1])?;
    ctx.ops.linear_fwd(
        ln2,
        p.sub(l.tensors[SHARED_FC1].range()),
        (n, h, w1),
        &mut u,
    )?;
    if let Some(ad) = lo.ad {
        lora::col_fwd(ctx, ad, Target::Fc1, lo.x_reg, &mut u, lo.ls)?;
    }
    super::bias::add(ctx, l, &p, super::bias::Site::Fc1, &mut u)?;
    let mut act = ctx.zeros(a, &[n, f])?;
    ctx.ops.act_fwd(ctx.plan.model.activation, &u, &mut act)?;
    let mut y = ctx.zeros(Category::Buffers, &[n, h])?;
    ctx.ops.linear_fwd(
        &act,
        p.sub(l.tensors[SHARED_FC2].range()),
        (n, f, h),
        &mut y,
    )?;
    ctx.ops.axpy(1.0, View::all(&y), ViewMut::all(out))?;
    Ok(Some(SharedSaved { u, act }))
}

/// fc2's adapter of the shared experts: adds (alpha / r) B A act to their output `y_reg`
/// [n_sp, h], reduced to the region.
pub fn shared_fc2_lora<B: Backend>(
    ctx: &mut Ctx<B>,
    s: &SharedSaved<B>,
    (ad, ls): (&Adapters<B>, &mut LoraSaved<B>),
    y_reg: &mut B::Tensor,
) -> Result<(), ExecError> {
    match ad {
        Some(ad) => lora::row_fwd(ctx, ad, Target::Fc2, &s.act, y_reg, ls),
        None => Ok(()),
    }
}

/// Backward of the shared experts: adds their (TP-partial) input gradient to `d_ln2` [n, h]
/// from the block's whole output gradient `dy` [n, h] (`dy_reg` [n_sp, h] on the region);
/// their weight-gradient tasks (fc1's input: `ln2`, this rank's SP shard when SP is on) go to
/// `sink`. Returns the adapters' input gradient on the region [n_sp, h] (already reduced),
/// which the caller adds after reducing `d_ln2`.
pub fn shared_bwd<B: Backend>(
    ctx: &mut Ctx<B>,
    (l, p): (&BlockLayout, View<'_, B::Tensor>),
    (s, ln2): (SharedSaved<B>, B::Tensor),
    (dy, dy_reg): (B::Tensor, &B::Tensor),
    d_ln2: &mut B::Tensor,
    (ad, ls): (&Adapters<B>, &mut LoraSaved<B>),
    sink: &mut Sink<B>,
) -> Result<Option<B::Tensor>, ExecError> {
    let Some((f, w1)) = widths(ctx) else {
        return Ok(None);
    };
    let (n, h) = (ctx.n, ctx.rd.h);
    let b = Category::Buffers;
    let act_kind = ctx.plan.model.activation;
    let sp = ctx.sp;
    let mut d_act = ctx.zeros(b, &[n, f])?;
    ctx.ops.linear_dgrad(
        &dy,
        p.sub(l.tensors[SHARED_FC2].range()),
        (n, f, h),
        &mut d_act,
        false,
    )?;
    if let Some(ad) = ad {
        lora::row_bwd(ctx, ad, Target::Fc2, ls, (&s.act, dy_reg), &mut d_act, sink)?;
    }
    sink(
        ctx,
        WTask::Linear {
            tensor: SHARED_FC2,
            x: s.act,
            dy,
            i: f,
            o: h,
            gather_x: false,
            dy_gathered: sp,
            dy_shard: false,
        },
    )?;
    let mut du = ctx.ops.recat(s.u, b);
    ctx.ops.act_bwd_inplace(act_kind, &mut du, &d_act)?;
    drop(d_act);
    super::bias::grad(ctx, l, super::bias::Site::Fc1, &du, sink)?;
    ctx.ops.linear_dgrad(
        &du,
        p.sub(l.tensors[SHARED_FC1].range()),
        (n, h, w1),
        d_ln2,
        true,
    )?;
    let d_reg = match ad {
        Some(ad) => {
            let mut d = ctx.zeros(b, &[ctx.n_sp, h])?;
            lora::col_bwd(ctx, ad, Target::Fc1, ls, (&ln2, &du), &mut d, sink)?;
            Some(d)
        }
        None => None,
    };
    sink(
        ctx,
        WTask::Linear {
            tensor: SHARED_FC1,
            x: ln2,
            dy: du,
            i: h,
            o: w1,
            gather_x: sp,
            dy_gathered: false,
            dy_shard: false,
        },
    )?;
    Ok(d_reg)
}
