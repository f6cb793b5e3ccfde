//! LoRA adapters (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models") beside
//! the frozen projections of a decoder layer: y = W x + (alpha / r) B A x with A [r, in] and
//! B [out, r]; only A and B train. Targets are the engine's: the fused QKV projection and fc1
//! (column-parallel), the attention output projection and fc2 (row-parallel).
//!
//! Tensor parallelism follows Hugging Face PEFT's `LoraParallelLinear` for Megatron layers
//! (peft/tuners/lora/tp_layer.py: a row-parallel base gets a row-parallel A and a plain B, a
//! column-parallel base a plain A and a column-parallel B). NeMo/Megatron-Bridge's
//! `ParallelLinearAdapter` agrees for row-parallel layers but splits a column-parallel layer's
//! A over its rank dimension (a `ColumnParallelLinear` with `gather_output`); we keep A whole
//! there, so no gather of A x is needed. The replicated factor works on the residual
//! (sequence-parallel) region, as Megatron keeps norms there:
//! - column-parallel base: A replicated and applied to the block's normed input on its
//!   region (the sequence shard under SP), the rank-r result all-gathered over TP under SP; B
//!   split by output rows like W. Backward: dB local; d(Ax) is a partial sum over TP (each
//!   rank's B rows), reduce-scattered to the region under SP (all-reduced without SP); dA and
//!   the input gradient then follow on the region.
//! - row-parallel base: A split by input columns like W, A x a partial sum over TP that is
//!   reduced to the region (reduce-scatter under SP, all-reduce otherwise) as the base output
//!   is; B replicated and applied on the region. Backward: the rank-r gradient is all-gathered
//!   over TP under SP, then dA and the input gradient are local.
//!
//! Under SP the replicated factors (A of column-parallel, B of row-parallel layers) see only
//! their sequence shard, so their gradients are partial sums reduced over TP like the norms'
//! (`tp_replicated`). The scale alpha / r is applied to the rank-r intermediate u = s A x, the
//! tensor saved for backward (the engine's `LoraIntermediate`).

use super::blocks::{seg, Builder, RankDims};
use super::ctx::Ctx;
use super::wtask::{Sink, WTask};
use crate::backend::ops::*;
use crate::backend::{Backend, ReduceOp, View, ViewMut};
use crate::backend::{DeviceCollectives, DeviceTensor};
use crate::error::ExecError;
use crate::tracker::Category;
use parsim_plan::plan::LoraShape;

/// A target projection: index 0 QKV, 1 the attention output projection, 2 fc1, 3 fc2.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    Qkv,
    Proj,
    Fc1,
    Fc2,
}

impl Target {
    fn on(self, lora: &LoraShape) -> bool {
        match self {
            Target::Qkv => lora.qkv,
            Target::Proj => lora.proj,
            Target::Fc1 => lora.fc1,
            Target::Fc2 => lora.fc2,
        }
    }

    const ALL: [Target; 4] = [Target::Qkv, Target::Proj, Target::Fc1, Target::Fc2];

    /// Index of this target's A in the adapters block (B follows it), when it is adapted.
    pub fn tensor(self, lora: &LoraShape) -> Option<usize> {
        let before = Target::ALL
            .iter()
            .take_while(|&&t| t != self)
            .filter(|t| t.on(lora))
            .count();
        self.on(lora).then_some(2 * before)
    }
}

/// Appends layer `l`'s adapters to its block: for each target A then B, split over TP as the
/// module doc says. `ov` is the projection's global input width (heads x value head width),
/// `ffn` the MLP's intermediate size (an MoE layer's: its shared experts'). Hu et al. start B
/// at zero; `seeded_b` draws it as A.
pub(super) fn push_adapters(
    b: &mut Builder,
    lora: &LoraShape,
    rd: &RankDims,
    ov: usize,
    ffn: usize,
    l: u32,
    std: f32,
) {
    let (h, r, tr) = (rd.h, lora.rank, rd.tp_rank);
    let b_std = if lora.seeded_b { std } else { 0.0 };
    let p = format!("layers.{l}");
    let own = |w: usize| tr * w..(tr + 1) * w;
    // This rank's intermediate size of the adapted MLP, and whether its fc1 is gate and up.
    let (f_r, glu) = (ffn / rd.t, rd.fc1_r == 2 * rd.f_r);
    for t in Target::ALL.into_iter().filter(|t| t.on(lora)) {
        match t {
            Target::Qkv | Target::Fc1 => {
                let name = if t == Target::Qkv { "qkv" } else { "fc1" };
                b.push(
                    r,
                    h,
                    vec![seg(format!("{p}.{name}_lora_a"), h, 0..r, 0..h, std)],
                    true,
                );
                // B's rows follow the base layer's output rows (q, k, v or gate, up slices).
                let parts: Vec<(String, usize)> = if t == Target::Qkv {
                    let (qa, kg) = (rd.a_r * rd.d, rd.g_r * rd.d);
                    vec![("q".into(), qa), ("k".into(), kg), ("v".into(), kg)]
                } else {
                    if glu {
                        vec![("gate".into(), f_r), ("up".into(), f_r)]
                    } else {
                        vec![("fc1".into(), f_r)]
                    }
                };
                let rows: usize = parts.iter().map(|(_, w)| w).sum();
                let segs = parts
                    .iter()
                    .map(|(part, w)| {
                        seg(format!("{p}.{name}_lora_b.{part}"), r, own(*w), 0..r, b_std)
                    })
                    .collect();
                b.push(rows, r, segs, false);
            }
            Target::Proj | Target::Fc2 => {
                let (name, i_glob, i_r) = match t {
                    Target::Proj => ("proj", ov, rd.a_r * rd.dv),
                    _ => ("fc2", ffn, f_r),
                };
                b.push(
                    r,
                    i_r,
                    vec![seg(
                        format!("{p}.{name}_lora_a"),
                        i_glob,
                        0..r,
                        own(i_r),
                        std,
                    )],
                    false,
                );
                b.push(
                    h,
                    r,
                    vec![seg(format!("{p}.{name}_lora_b"), r, 0..h, 0..r, b_std)],
                    true,
                );
            }
        }
    }
}

/// A layer's adapters block and its parameters (`None`: full training).
pub type Adapters<'a, B> = Option<(
    &'a super::blocks::BlockLayout,
    View<'a, <B as Backend>::Tensor>,
)>;

/// The rank-r intermediates u = (alpha / r) A x saved for backward, per target (on the
/// region: the sequence shard under SP).
pub struct LoraSaved<B: Backend> {
    pub u: [Option<B::Tensor>; 4],
}

impl<B: Backend> Default for LoraSaved<B> {
    fn default() -> Self {
        LoraSaved {
            u: [None, None, None, None],
        }
    }
}

fn idx(t: Target) -> usize {
    match t {
        Target::Qkv => 0,
        Target::Proj => 1,
        Target::Fc1 => 2,
        Target::Fc2 => 3,
    }
}

/// Tensor `t` of the adapters block.
fn tensor<'p, T: DeviceTensor>(
    a: &(&super::blocks::BlockLayout, View<'p, T>),
    t: usize,
) -> View<'p, T> {
    a.1.sub(a.0.tensors[t].range())
}

/// u = s z on a fresh activation (the scale applied in the small rank-r space).
fn scaled<B: Backend>(
    ctx: &Ctx<B>,
    s: f32,
    z: &B::Tensor,
    cat: Category,
) -> Result<B::Tensor, ExecError> {
    let mut u = ctx.zeros(cat, z.shape())?;
    ctx.ops.axpy(s, View::all(z), ViewMut::all(&mut u))?;
    Ok(u)
}

/// A rank-r partial sum [n, r] reduced over TP to the region: reduce-scatter to [n_sp, r]
/// under SP, all-reduce otherwise.
fn reduce_r<B: Backend>(ctx: &mut Ctx<B>, mut part: B::Tensor) -> Result<B::Tensor, ExecError> {
    if ctx.sp {
        let mut out = ctx.zeros(Category::Buffers, &[ctx.n_sp, part.cols()])?;
        ctx.comm
            .reduce_scatter(&ctx.tp, View::all(&part), ViewMut::all(&mut out))?;
        Ok(out)
    } else {
        ctx.comm
            .all_reduce(&ctx.tp, ViewMut::all(&mut part), ReduceOp::Sum)?;
        Ok(part)
    }
}

/// A region tensor [n_sp, r] all-gathered over TP to the full sequence [n, r] under SP (a copy
/// otherwise).
fn gather_r<B: Backend>(ctx: &mut Ctx<B>, x: &B::Tensor) -> Result<B::Tensor, ExecError> {
    let mut out = ctx.zeros(Category::Buffers, &[ctx.n, x.cols()])?;
    if ctx.sp {
        ctx.comm
            .all_gather(&ctx.tp, View::all(x), ViewMut::all(&mut out))?;
    } else {
        ctx.ops.copy(View::all(x), ViewMut::all(&mut out))?;
    }
    Ok(out)
}

/// Sends the adapter gradient dW[o, i] += dy^T x of tensor `t` to the sink.
fn wgrad<B: Backend>(
    ctx: &mut Ctx<B>,
    t: usize,
    dy: &B::Tensor,
    x: &B::Tensor,
    dims: (usize, usize, usize),
    sink: &mut Sink<B>,
) -> Result<(), ExecError> {
    wgrad_as(ctx, dy, x, dims, sink, |grad| WTask::Adapter {
        tensor: t,
        grad,
    })
}

/// dW[o, i] = dy^T x in a fresh fp32 buffer, sent to the sink as the task `task` makes of it
/// (a dense adapter's, or an expert adapter's).
pub(super) fn wgrad_as<B: Backend>(
    ctx: &mut Ctx<B>,
    dy: &B::Tensor,
    x: &B::Tensor,
    dims: (usize, usize, usize),
    sink: &mut Sink<B>,
    task: impl FnOnce(B::Tensor) -> WTask<B>,
) -> Result<(), ExecError> {
    let mut grad = ctx.zeros_f32(Category::Buffers, &[dims.1 * dims.2])?;
    ctx.ops.linear_wgrad(dy, x, dims, ViewMut::all(&mut grad))?;
    sink(ctx, task(grad))
}

/// Column-parallel target `t` forward: adds (alpha/r) B A x to the base output `y` [n, o_r],
/// `x_reg` the base layer's input on its region [n_sp, h].
pub fn col_fwd<B: Backend>(
    ctx: &mut Ctx<B>,
    a: &(&super::blocks::BlockLayout, View<'_, B::Tensor>),
    t: Target,
    x_reg: &B::Tensor,
    y: &mut B::Tensor,
    saved: &mut LoraSaved<B>,
) -> Result<(), ExecError> {
    let lora = ctx.plan.lora.expect("lora plan");
    let Some(ti) = t.tensor(&lora) else {
        return Ok(());
    };
    let (n, n_sp, h, r, o) = (ctx.n, ctx.n_sp, ctx.rd.h, lora.rank, y.cols());
    let mut z = ctx.zeros(Category::Buffers, &[n_sp, r])?;
    ctx.ops
        .linear_fwd(x_reg, tensor(a, ti), (n_sp, h, r), &mut z)?;
    let u = scaled(ctx, lora.scale(), &z, Category::Activations)?;
    drop(z);
    let ug = gather_r(ctx, &u)?;
    let mut out = ctx.zeros(Category::Buffers, &[n, o])?;
    ctx.ops
        .linear_fwd(&ug, tensor(a, ti + 1), (n, r, o), &mut out)?;
    ctx.ops.axpy(1.0, View::all(&out), ViewMut::all(y))?;
    saved.u[idx(t)] = Some(u);
    Ok(())
}

/// Column-parallel target `t` backward from the output gradient `dy` [n, o_r]: sends dA and
/// dB, and adds the adapter's input gradient to `dx_reg` [n_sp, h] (already reduced to the
/// region); `x_reg` is the saved region input.
pub fn col_bwd<B: Backend>(
    ctx: &mut Ctx<B>,
    a: &(&super::blocks::BlockLayout, View<'_, B::Tensor>),
    t: Target,
    saved: &mut LoraSaved<B>,
    (x_reg, dy): (&B::Tensor, &B::Tensor),
    dx_reg: &mut B::Tensor,
    sink: &mut Sink<B>,
) -> Result<(), ExecError> {
    let lora = ctx.plan.lora.expect("lora plan");
    let (Some(ti), Some(u)) = (t.tensor(&lora), saved.u[idx(t)].take()) else {
        return Ok(());
    };
    let (n, n_sp, h, r, o) = (ctx.n, ctx.n_sp, ctx.rd.h, lora.rank, dy.cols());
    let ug = gather_r(ctx, &u)?;
    drop(u);
    wgrad(ctx, ti + 1, dy, &ug, (n, r, o), sink)?;
    drop(ug);
    let mut dug = ctx.zeros(Category::Buffers, &[n, r])?;
    ctx.ops
        .linear_dgrad(dy, tensor(a, ti + 1), (n, r, o), &mut dug, false)?;
    let du = reduce_r(ctx, dug)?;
    let dz = scaled(ctx, lora.scale(), &du, Category::Buffers)?;
    drop(du);
    wgrad(ctx, ti, &dz, x_reg, (n_sp, h, r), sink)?;
    ctx.ops
        .linear_dgrad(&dz, tensor(a, ti), (n_sp, h, r), dx_reg, true)
}

/// Row-parallel target `t` forward: adds (alpha/r) B A x to the base output on its region
/// `y_reg` [n_sp, h], `x` the base layer's (TP-split) input [n, i_r].
pub fn row_fwd<B: Backend>(
    ctx: &mut Ctx<B>,
    a: &(&super::blocks::BlockLayout, View<'_, B::Tensor>),
    t: Target,
    x: &B::Tensor,
    y_reg: &mut B::Tensor,
    saved: &mut LoraSaved<B>,
) -> Result<(), ExecError> {
    let lora = ctx.plan.lora.expect("lora plan");
    let Some(ti) = t.tensor(&lora) else {
        return Ok(());
    };
    let (n, n_sp, h, r, i) = (ctx.n, ctx.n_sp, ctx.rd.h, lora.rank, x.cols());
    let mut z = ctx.zeros(Category::Buffers, &[n, r])?;
    ctx.ops.linear_fwd(x, tensor(a, ti), (n, i, r), &mut z)?;
    let z = reduce_r(ctx, z)?;
    let u = scaled(ctx, lora.scale(), &z, Category::Activations)?;
    drop(z);
    let mut out = ctx.zeros(Category::Buffers, &[n_sp, h])?;
    ctx.ops
        .linear_fwd(&u, tensor(a, ti + 1), (n_sp, r, h), &mut out)?;
    ctx.ops.axpy(1.0, View::all(&out), ViewMut::all(y_reg))?;
    saved.u[idx(t)] = Some(u);
    Ok(())
}

/// Row-parallel target `t` backward from the region output gradient `dy_reg` [n_sp, h]:
/// sends dA and dB, and adds the adapter's input gradient to `dx` [n, i_r]; `x` is the saved
/// (TP-split) input.
pub fn row_bwd<B: Backend>(
    ctx: &mut Ctx<B>,
    a: &(&super::blocks::BlockLayout, View<'_, B::Tensor>),
    t: Target,
    saved: &mut LoraSaved<B>,
    (x, dy_reg): (&B::Tensor, &B::Tensor),
    dx: &mut B::Tensor,
    sink: &mut Sink<B>,
) -> Result<(), ExecError> {
    let lora = ctx.plan.lora.expect("lora plan");
    let (Some(ti), Some(u)) = (t.tensor(&lora), saved.u[idx(t)].take()) else {
        return Ok(());
    };
    let (n, n_sp, h, r, i) = (ctx.n, ctx.n_sp, ctx.rd.h, lora.rank, x.cols());
    wgrad(ctx, ti + 1, dy_reg, &u, (n_sp, r, h), sink)?;
    drop(u);
    let mut du = ctx.zeros(Category::Buffers, &[n_sp, r])?;
    ctx.ops
        .linear_dgrad(dy_reg, tensor(a, ti + 1), (n_sp, r, h), &mut du, false)?;
    let dz = scaled(ctx, lora.scale(), &du, Category::Buffers)?;
    drop(du);
    let dzg = gather_r(ctx, &dz)?;
    drop(dz);
    wgrad(ctx, ti, &dzg, x, (n, i, r), sink)?;
    ctx.ops
        .linear_dgrad(&dzg, tensor(a, ti), (n, i, r), dx, true)
}
