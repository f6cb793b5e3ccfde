//! Multi-token prediction's input (DeepSeek-V3 Technical Report, sec. 2.2; Megatron-Core's
//! `MultiTokenPredictionLayer`): depth k combines the previous depth's hidden states h (the
//! main model's output for k = 1) with the embedding of the tokens k ahead,
//! h' = M_k [RMSNorm(Emb(t_{i+k})); RMSNorm(h_i)] (Megatron's column order: the embedding's
//! half first), then runs one transformer layer, its own final norm and the shared output
//! head. The embedding is the main model's (same weight, same vocab-parallel lookup).

use super::blocks::{BlockKind, BlockLayout};
use super::ctx::Ctx;
use super::ends::{embedding_bwd, embedding_fwd};
use super::wtask::{Sink, WTask};
use crate::backend::ops::*;
use crate::backend::{Backend, View, ViewMut};
use crate::error::ExecError;
use crate::tracker::Category;

/// Tensors of an MTP input block: the two norms, then `eh_proj`'s embedding and hidden halves.
const ENORM: usize = 0;
const HNORM: usize = 1;
const EH_E: usize = 2;
const EH_H: usize = 3;

/// What the input block keeps for backward: the embedding and the incoming hidden states
/// (the norms' inputs), their normed forms (the projection's inputs), and the shifted tokens.
pub struct MtpInSaved<B: Backend> {
    e: B::Tensor,
    h: B::Tensor,
    en: B::Tensor,
    hn: B::Tensor,
    tokens: Vec<u32>,
    /// The embedding's hidden-dropout mask (as the main embedding's), for its backward.
    mask: Option<B::Tensor>,
    /// How far ahead the tokens (and learned positions) are: the depth.
    shift: usize,
}

fn w<'p, B: Backend>(p: &View<'p, B::Tensor>, l: &BlockLayout, t: usize) -> View<'p, B::Tensor> {
    p.sub(l.tensors[t].range())
}

/// The MTP layer's input [n_sp, h] from the incoming hidden states `h` [n_sp, h] and the
/// tokens `tokens` (k ahead), through the embedding block `emb` (layout, parameters).
/// `eh_proj` is column-parallel: this rank computes its h/t output features of the gathered
/// sequence; Megatron then all-gathers the features and scatters the sequence under SP, which
/// is what reducing this rank's features, placed among zeros, into the SP region gives.
pub fn mtp_in_fwd<B: Backend>(
    ctx: &mut Ctx<B>,
    l: &BlockLayout,
    p: View<'_, B::Tensor>,
    emb: (&BlockLayout, View<'_, B::Tensor>),
    h: B::Tensor,
    tokens: Vec<u32>,
) -> Result<(B::Tensor, MtpInSaved<B>), ExecError> {
    let m = &ctx.plan.model;
    let spec = NormSpec::of(m);
    let (n, n_sp, hd, t, r) = (ctx.n, ctx.n_sp, ctx.rd.h, ctx.rd.t, ctx.rd.tp_rank);
    let hr = hd / t;
    let (act, buf) = (Category::Activations, Category::Buffers);
    // Depth k + 1 of block MtpIn(k): its tokens, and Megatron's rolled position ids, k + 1 ahead.
    let shift = match l.kind {
        BlockKind::MtpIn(k) => k as usize + 1,
        _ => 1,
    };
    let (e, mask) = embedding_fwd(ctx, emb.0, emb.1, &tokens, shift)?;
    let mut en = ctx.zeros(act, &[n_sp, hd])?;
    ctx.ops.norm_fwd(spec, &e, w::<B>(&p, l, ENORM), &mut en)?;
    let mut hn = ctx.zeros(act, &[n_sp, hd])?;
    ctx.ops.norm_fwd(spec, &h, w::<B>(&p, l, HNORM), &mut hn)?;
    let mut y = ctx.zeros(buf, &[n, hr])?;
    ctx.with_gathered(&en, |c, xg| {
        c.ops
            .linear_fwd(xg, w::<B>(&p, l, EH_E), (n, hd, hr), &mut y)
    })?;
    let mut yh = ctx.zeros(buf, &[n, hr])?;
    ctx.with_gathered(&hn, |c, xg| {
        c.ops
            .linear_fwd(xg, w::<B>(&p, l, EH_H), (n, hd, hr), &mut yh)
    })?;
    ctx.ops.axpy(1.0, View::all(&yh), ViewMut::all(&mut y))?;
    drop(yh);
    let left = ctx.zeros(buf, &[n, r * hr])?;
    let right = ctx.zeros(buf, &[n, (t - 1 - r) * hr])?;
    let mut full = ctx.zeros(buf, &[n, hd])?;
    ctx.ops.qkv_merge(&left, &y, &right, &mut full)?;
    drop((left, y, right));
    let x = ctx.reduce_to_region(full, act)?;
    Ok((
        x,
        MtpInSaved {
            e,
            h,
            en,
            hn,
            tokens,
            mask,
            shift,
        },
    ))
}

/// The incoming hidden states' gradient [n_sp, h] from the MTP layer input's `dy` [n_sp, h];
/// the weight tasks (the embedding's included, tagged [`WTask::Embedding`]) go to `sink`.
pub fn mtp_in_bwd<B: Backend>(
    ctx: &mut Ctx<B>,
    l: &BlockLayout,
    p: View<'_, B::Tensor>,
    s: MtpInSaved<B>,
    dy: B::Tensor,
    sink: &mut Sink<B>,
) -> Result<B::Tensor, ExecError> {
    let m = &ctx.plan.model;
    let spec = NormSpec::of(m);
    let (n, n_sp, hd, t, r) = (ctx.n, ctx.n_sp, ctx.rd.h, ctx.rd.t, ctx.rd.tp_rank);
    let hr = hd / t;
    let (sp, buf) = (ctx.sp, Category::Buffers);
    // This rank's output features' gradient over the whole sequence.
    let dyg = ctx.expand_grad(&dy)?;
    drop(dy);
    let mut left = ctx.zeros(buf, &[n, r * hr])?;
    let mut right = ctx.zeros(buf, &[n, (t - 1 - r) * hr])?;
    let mut dyr = ctx.zeros(buf, &[n, hr])?;
    ctx.ops.qkv_split(&dyg, &mut left, &mut dyr, &mut right)?;
    drop((dyg, left, right));
    let mut d_normed = Vec::with_capacity(2);
    for half in [EH_E, EH_H] {
        let mut part = ctx.zeros(buf, &[n, hd])?;
        ctx.ops
            .linear_dgrad(&dyr, w::<B>(&p, l, half), (n, hd, hr), &mut part, false)?;
        d_normed.push(ctx.reduce_to_region(part, buf)?);
    }
    let mut dyr_h = ctx.zeros(buf, &[n, hr])?;
    ctx.ops.copy(View::all(&dyr), ViewMut::all(&mut dyr_h))?;
    for (tensor, x, dy) in [(EH_E, s.en, dyr), (EH_H, s.hn, dyr_h)] {
        sink(
            ctx,
            WTask::Linear {
                tensor,
                x,
                dy,
                i: hd,
                o: hr,
                gather_x: sp,
                dy_gathered: false,
                dy_shard: false,
            },
        )?;
    }
    let d_hn = d_normed.pop().expect("hidden half");
    let d_en = d_normed.pop().expect("embedding half");
    let mut d_e = ctx.zeros(buf, &[n_sp, hd])?;
    ctx.ops
        .norm_dgrad(spec, &s.e, w::<B>(&p, l, ENORM), &d_en, &mut d_e, false)?;
    sink(
        ctx,
        WTask::Norm {
            tensor: ENORM,
            x: s.e,
            dy: d_en,
        },
    )?;
    let mut d_h = ctx.zeros(buf, &[n_sp, hd])?;
    ctx.ops
        .norm_dgrad(spec, &s.h, w::<B>(&p, l, HNORM), &d_hn, &mut d_h, false)?;
    sink(
        ctx,
        WTask::Norm {
            tensor: HNORM,
            x: s.h,
            dy: d_hn,
        },
    )?;
    embedding_bwd(ctx, s.tokens, s.mask, d_e, s.shift, sink)?;
    Ok(d_h)
}
