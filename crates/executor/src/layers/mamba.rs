//! A hybrid model's Mamba-2 layer (Dao and Gu 2024, "Transformers are SSMs", sec. 7;
//! Megatron-Core's MambaLayer and MambaMixer): pre-norm, in_proj (column-parallel: this TP
//! rank's heads, with their z, x and dt, and its whole B/C groups), the causal depthwise
//! convolution and SiLU over x, B and C, the SSD chunked scan with the D skip, the gated
//! RMSNorm, out_proj (row-parallel), hidden dropout and the residual. Under sequence
//! parallelism in_proj's input is all-gathered and out_proj's output reduce-scattered, as for
//! attention, so the scan sees whole sequences.
//!
//! It saves what the engine's ledger counts (`crates/engine/src/model/mamba.rs`): the norm's
//! and in_proj's inputs, the convolution's input, the scan's x/B/C, dt and dt x A (fp32) and
//! output (the gated norm's input), z, and out_proj's input. The chunk states are a forward
//! and backward scratch, as the ledger's.

use super::blocks::{seg, Init, Segment};
use super::blocks::{BlockLayout, Builder, RankDims};
use super::ctx::Ctx;
use super::dropout::{dropout_grad, hidden_dropout};
use super::wtask::{Sink, WTask};
use crate::backend::ops::*;
use crate::backend::{Backend, View, ViewMut};
use crate::error::ExecError;
use crate::rng::DropoutSite;
use crate::tracker::Category;
use parsim_plan::plan::{MambaShape, Plan};

/// The block's tensors: pre-norm, in_proj, the convolution [conv, k + 1] (taps, bias), the
/// SSM's A_log, D and dt bias [3, heads], the gated norm's weight, out_proj.
const NORM: usize = 0;
const IN_PROJ: usize = 1;
const CONV: usize = 2;
const SSM: usize = 3;
const GATE: usize = 4;
const OUT_PROJ: usize = 5;

/// What a Mamba-2 layer keeps for backward.
pub struct MambaSaved<B: Backend> {
    ln: B::Tensor,
    xbc_in: B::Tensor,
    xbc: B::Tensor,
    dt: B::Tensor,
    da: B::Tensor,
    y: B::Tensor,
    z: B::Tensor,
    yn: B::Tensor,
    mask: Option<B::Tensor>,
}

/// This rank's mixer geometry on one microbatch.
fn geo<B: Backend>(ctx: &Ctx<B>, a: &MambaShape) -> MambaGeo {
    let (m, t) = (&ctx.plan.model, ctx.rd.t);
    MambaGeo {
        b: m.micro_batch,
        s: m.seq,
        heads: a.heads / t,
        p: a.head_dim,
        groups: a.groups / t,
        n: a.state,
        k: a.conv_kernel,
        q: a.chunk,
        eps: m.norm_eps,
    }
}

fn shape<B: Backend>(ctx: &Ctx<B>) -> Result<(MambaShape, MambaGeo), ExecError> {
    let a = ctx.plan.model.mamba.ok_or(ExecError::Unsupported {
        field: "model.mamba",
        message: "a Mamba-2 layer needs the mixer's shape",
    })?;
    Ok((a, geo(ctx, &a)))
}

fn slice<'p, B: Backend>(
    p: &View<'p, B::Tensor>,
    l: &BlockLayout,
    t: usize,
) -> View<'p, B::Tensor> {
    p.sub(l.tensors[t].range())
}

/// Lays out Mamba-2 layer `l`'s block on TP rank `rd.tp_rank`: its heads' rows of z, x and dt
/// and its groups' rows of B and C in in_proj (Megatron's order z, x, B, C, dt), the same
/// channels of the convolution, its heads' A_log, D and dt bias, its inner columns of the
/// gated norm and out_proj.
pub(super) fn push_block(b: &mut Builder, plan: &Plan, l: u32, rd: &RankDims) {
    let m = &plan.model;
    let Some(a) = &m.mamba else {
        return;
    };
    let (h, std, t, r) = (rd.h, m.init_std, rd.t, rd.tp_rank);
    let pre = format!("layers.{l}.mamba");
    b.norm(&format!("layers.{l}.norm"), m.norm, h);
    let (inner, gn) = (a.inner(), a.groups * a.state);
    let (ir, gr, hr) = (inner / t, gn / t, a.heads / t);
    let rows = |base: usize, w: usize| base + r * w..base + (r + 1) * w;
    let proj = format!("{pre}.in_proj");
    let in_rows = [
        rows(0, ir),
        rows(inner, ir),
        rows(2 * inner, gr),
        rows(2 * inner + gn, gr),
        rows(2 * inner + 2 * gn, hr),
    ];
    let segs = in_rows
        .iter()
        .map(|rg| seg(proj.clone(), h, rg.clone(), 0..h, std));
    b.push(2 * ir + 2 * gr + hr, h, segs.collect(), false);
    // The convolution's taps and bias, [x, B, C] channels.
    let k1 = a.conv_kernel + 1;
    let conv = format!("{pre}.conv1d");
    let conv_rows = [rows(0, ir), rows(inner, gr), rows(inner + gn, gr)];
    let segs = conv_rows
        .iter()
        .map(|rg| seg(conv.clone(), k1, rg.clone(), 0..k1, 0.3));
    b.push(ir + 2 * gr, k1, segs.collect(), false);
    // A_log (A = -exp(A_log) near -1), D near 1 (Mamba's init) and dt's bias.
    let head = |name: &str, init| Segment {
        name: format!("{pre}.{name}"),
        global_cols: a.heads,
        rows: 0..1,
        cols: r * hr..(r + 1) * hr,
        init,
    };
    let ssm = vec![
        head("A_log", Init::Uniform(0.5)),
        head("D", Init::One(0.1)),
        head("dt_bias", Init::Uniform(0.5)),
    ];
    b.push(3, hr, ssm, false);
    let gate = Segment {
        name: format!("{pre}.norm.weight"),
        global_cols: inner,
        rows: 0..1,
        cols: r * ir..(r + 1) * ir,
        init: Init::One(0.1),
    };
    b.push(1, ir, vec![gate], false);
    let out = format!("{pre}.out_proj");
    b.push(
        h,
        ir,
        vec![seg(out, inner, 0..h, r * ir..(r + 1) * ir, std)],
        false,
    );
}

/// Forward of a Mamba-2 layer on the residual shard `x` [n_sp, h]: its output and what it
/// saves (besides `x`).
pub fn mamba_fwd<B: Backend>(
    ctx: &mut Ctx<B>,
    l: &BlockLayout,
    p: &View<'_, B::Tensor>,
    layer: u32,
    x: &B::Tensor,
) -> Result<(B::Tensor, MambaSaved<B>), ExecError> {
    let (_, g) = shape(ctx)?;
    let m = &ctx.plan.model;
    let (n, n_sp, h) = (ctx.n, ctx.n_sp, ctx.rd.h);
    let (a, bf) = (Category::Activations, Category::Buffers);
    let mut ln = ctx.zeros(a, &[n_sp, h])?;
    ctx.ops
        .norm_fwd(NormSpec::of(m), x, slice::<B>(p, l, NORM), &mut ln)?;
    let mut proj = ctx.zeros(bf, &[n, g.proj()])?;
    ctx.with_gathered(&ln, |c, xg| {
        let w = slice::<B>(p, l, IN_PROJ);
        c.ops.linear_fwd(xg, w, (n, h, g.proj()), &mut proj)
    })?;
    let mut z = ctx.zeros(a, &[n, g.inner()])?;
    let mut xbc_in = ctx.zeros(a, &[n, g.conv()])?;
    let mut dt_raw = ctx.zeros(bf, &[n, g.heads])?;
    ctx.ops
        .mamba_split(&proj, &mut z, &mut xbc_in, &mut dt_raw)?;
    drop(proj);
    let mut xbc = ctx.zeros(a, &[n, g.conv()])?;
    ctx.ops
        .mamba_conv_fwd(&g, &xbc_in, slice::<B>(p, l, CONV), &mut xbc)?;
    let mut y = ctx.zeros(a, &[n, g.inner()])?;
    let mut dt = ctx.zeros_f32(a, &[n, g.heads])?;
    let mut da = ctx.zeros_f32(a, &[n, g.heads])?;
    let mut states = ctx.zeros_f32(bf, &[g.states_len()])?;
    let ssm = slice::<B>(p, l, SSM);
    ctx.ops.mamba_ssd_fwd(
        &g,
        SsdInputs {
            xbc: &xbc,
            dt: &dt_raw,
            ssm,
        },
        SsdOutputs {
            y: &mut y,
            dt: &mut dt,
            da: &mut da,
        },
        &mut states,
    )?;
    drop((states, dt_raw));
    let mut yn = ctx.zeros(a, &[n, g.inner()])?;
    ctx.ops.mamba_gate_fwd(
        &g,
        GateInputs {
            y: &y,
            z: &z,
            w: slice::<B>(p, l, GATE),
        },
        &mut yn,
    )?;
    let mut partial = ctx.zeros(bf, &[n, h])?;
    ctx.ops.linear_fwd(
        &yn,
        slice::<B>(p, l, OUT_PROJ),
        (n, g.inner(), h),
        &mut partial,
    )?;
    let mut out = ctx.reduce_to_region(partial, bf)?;
    let mask = hidden_dropout(ctx, layer, DropoutSite::Attention, &mut out)?;
    let mut res = ctx.zeros(a, &[n_sp, h])?;
    ctx.ops.add(x, &out, &mut res)?;
    drop(out);
    let saved = MambaSaved {
        ln,
        xbc_in,
        xbc,
        dt,
        da,
        y,
        z,
        yn,
        mask,
    };
    Ok((res, saved))
}

/// Input gradient of a Mamba-2 layer (input `x`): dx [n_sp, h] from dy [n_sp, h]; the projections'
/// weight-gradient tasks go to `sink`, the convolution's, the SSM's and the gated norm's
/// gradients ready.
pub fn mamba_bwd<B: Backend>(
    ctx: &mut Ctx<B>,
    l: &BlockLayout,
    p: &View<'_, B::Tensor>,
    s: MambaSaved<B>,
    x: B::Tensor,
    dy: B::Tensor,
    sink: &mut Sink<B>,
) -> Result<B::Tensor, ExecError> {
    let (_, g) = shape(ctx)?;
    let (n, h, sp) = (ctx.n, ctx.rd.h, ctx.sp);
    let bf = Category::Buffers;
    let MambaSaved {
        ln,
        xbc_in,
        xbc,
        dt,
        da,
        y,
        z,
        yn,
        mask,
    } = s;
    drop(da);
    let d_out = dropout_grad(ctx, mask.as_ref(), &dy)?;
    drop(mask);
    let dyg = ctx.expand_grad(d_out.as_ref().unwrap_or(&dy))?;
    drop(d_out);
    let mut d_yn = ctx.zeros(bf, &[n, g.inner()])?;
    let w_out = slice::<B>(p, l, OUT_PROJ);
    ctx.ops
        .linear_dgrad(&dyg, w_out, (n, g.inner(), h), &mut d_yn, false)?;
    let task = WTask::Linear {
        tensor: OUT_PROJ,
        x: yn,
        dy: dyg,
        i: g.inner(),
        o: h,
        gather_x: false,
        dy_gathered: sp,
        dy_shard: false,
    };
    sink(ctx, task)?;
    let mut d_y = ctx.zeros(bf, &[n, g.inner()])?;
    let mut d_z = ctx.zeros(bf, &[n, g.inner()])?;
    let mut d_gate = ctx.zeros_f32(bf, &[l.tensors[GATE].len()])?;
    let w_gate = slice::<B>(p, l, GATE);
    let dg = ViewMut::all(&mut d_gate);
    ctx.ops.mamba_gate_bwd(
        &g,
        GateInputs {
            y: &y,
            z: &z,
            w: w_gate,
        },
        &d_yn,
        GateGrads {
            dy: &mut d_y,
            dz: &mut d_z,
            dw: dg,
        },
    )?;
    drop((y, z, d_yn));
    sink(
        ctx,
        WTask::Ready {
            tensor: GATE,
            grad: d_gate,
        },
    )?;
    let mut d_xbc = ctx.zeros(bf, &[n, g.conv()])?;
    let mut d_dt = ctx.zeros(bf, &[n, g.heads])?;
    let mut d_ssm = ctx.zeros_f32(bf, &[l.tensors[SSM].len()])?;
    let mut states = ctx.zeros_f32(bf, &[g.states_len()])?;
    let (ssm, ds) = (slice::<B>(p, l, SSM), ViewMut::all(&mut d_ssm));
    ctx.ops.mamba_ssd_bwd(
        &g,
        SsdInputs {
            xbc: &xbc,
            dt: &dt,
            ssm,
        },
        &d_y,
        SsdGrads {
            dxbc: &mut d_xbc,
            ddt_raw: &mut d_dt,
            dssm: ds,
        },
        &mut states,
    )?;
    drop((states, xbc, dt, d_y));
    sink(
        ctx,
        WTask::Ready {
            tensor: SSM,
            grad: d_ssm,
        },
    )?;
    let mut d_in = ctx.zeros(bf, &[n, g.conv()])?;
    let mut d_conv = ctx.zeros_f32(bf, &[l.tensors[CONV].len()])?;
    let (w_conv, dc) = (slice::<B>(p, l, CONV), ViewMut::all(&mut d_conv));
    ctx.ops
        .mamba_conv_bwd(&g, &xbc_in, w_conv, &d_xbc, &mut d_in, dc)?;
    drop((xbc_in, d_xbc));
    sink(
        ctx,
        WTask::Ready {
            tensor: CONV,
            grad: d_conv,
        },
    )?;
    let mut d_proj = ctx.zeros(bf, &[n, g.proj()])?;
    ctx.ops.mamba_merge(&d_z, &d_in, &d_dt, &mut d_proj)?;
    drop((d_z, d_in, d_dt));
    let mut part = ctx.zeros(bf, &[n, h])?;
    let w_in = slice::<B>(p, l, IN_PROJ);
    ctx.ops
        .linear_dgrad(&d_proj, w_in, (n, h, g.proj()), &mut part, false)?;
    let d_ln = ctx.reduce_to_region(part, bf)?;
    let task = WTask::Linear {
        tensor: IN_PROJ,
        x: ln,
        dy: d_proj,
        i: h,
        o: g.proj(),
        gather_x: sp,
        dy_gathered: false,
        dy_shard: false,
    };
    sink(ctx, task)?;
    // The pre-norm: its input gradient added to the residual's (dy's buffer).
    let spec = NormSpec::of(&ctx.plan.model);
    let mut dx = dy;
    let w = slice::<B>(p, l, NORM);
    ctx.ops.norm_dgrad(spec, &x, w, &d_ln, &mut dx, true)?;
    sink(
        ctx,
        WTask::Norm {
            tensor: NORM,
            x,
            dy: d_ln,
        },
    )?;
    Ok(dx)
}
