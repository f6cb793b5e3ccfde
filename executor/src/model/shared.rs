//! The shared experts of an MoE layer (DeepSeekMoE, Dai et al. 2024; DeepSeek-V2/V3): one
//! dense MLP of intermediate size `moe.shared_ffn` (all shared experts together) that every
//! token passes through, its output added to the routed experts' combined output, ungated.
//! Its weights sit in the layer's (dense) block after the router, so they reduce over DP; with
//! linear biases its fc1 bias is added here, its fc2 bias by the MoE block after the reduction
//! ([`super::bias`]).

use super::params::BlockLayout;
use super::{Ctx, Sink, WTask};
use crate::backend::{Backend, Device, TensorOps, View, ViewMut};
use crate::error::ExecError;
use crate::memory::Category;
use crate::plan::Activation;

/// The shared experts' fc1 and fc2 in an MoE layer's block (after the router).
pub const SHARED_FC1: usize = super::moe::ROUTER + 1;
pub const SHARED_FC2: usize = SHARED_FC1 + 1;

/// What the shared experts keep for backward (their input is the block's `ln2`).
pub struct SharedSaved<B: Backend> {
    u: B::Tensor,
    act: B::Tensor,
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

/// Adds the shared experts' output on `ln2` [n, h] to `out` [n, h]; `None` without them.
pub fn shared_fwd<B: Backend>(
    ctx: &mut Ctx<B>,
    l: &BlockLayout,
    p: View<'_, B::Tensor>,
    ln2: &B::Tensor,
    out: &mut B::Tensor,
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

/// Backward of the shared experts: adds their (TP-partial) input gradient to `d_ln2` [n, h]
/// from the block's whole output gradient `dy` [n, h]; their weight-gradient tasks (fc1's
/// input: `ln2`, this rank's SP shard when SP is on) go to `sink`.
#[allow(clippy::too_many_arguments)]
pub fn shared_bwd<B: Backend>(
    ctx: &mut Ctx<B>,
    l: &BlockLayout,
    p: View<'_, B::Tensor>,
    s: SharedSaved<B>,
    ln2: B::Tensor,
    dy: B::Tensor,
    d_ln2: &mut B::Tensor,
    sink: &mut Sink<B>,
) -> Result<(), ExecError> {
    let Some((f, w1)) = widths(ctx) else {
        return Ok(());
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
    )
}
