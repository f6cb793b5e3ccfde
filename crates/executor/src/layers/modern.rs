//! Issue 31's layer parts beside the plain decoder layer's: QK norm (Qwen3: the model's norm
//! over each query and key head, its two gains shared by the heads and replicated over TP),
//! learned attention sinks (GPT-OSS: one logit per query head in every softmax's denominator,
//! split over TP with the heads) and the router's linear bias (GPT-OSS: one trained bias per
//! expert on the router logits, replicated as the router). Their tensors follow a layer's
//! biases in its block, in that order (before MLA's up-projections, which are found from the
//! block's end).
//!
//! A QK-norm gain sees only this TP rank's heads, so its gradient is a partial sum over TP
//! with or without SP: it is all-reduced over TP as soon as it is computed. A sink's gradient
//! is whole for its heads over the rank's rows (partial over CP and DP, reduced with the
//! others); the router bias's is partial over TP exactly as the router's weight.

use super::blocks::{seg, BlockLayout, Builder, RankDims};
use super::ctx::Ctx;
use super::dropout::block_layer;
use super::wtask::{Sink, WTask};
use crate::backend::ops::*;
use crate::backend::{Backend, DeviceTensor};
use crate::backend::{DeviceCollectives, ReduceOp, View, ViewMut};
use crate::error::ExecError;
use crate::tracker::Category;
use parsim_plan::plan::{ModelShape, Plan};

/// Which of the parts a tensor is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    QNorm,
    KNorm,
    Sinks,
    RouterBias,
}

/// The block tensor of `part` in layer `layer`, or `None` when the layer has none.
pub fn tensor(m: &ModelShape, layer: u32, part: Part) -> Option<usize> {
    let a = &m.attention;
    let first = super::bias::end(m, layer);
    let qk = 2 * usize::from(a.qk_norm);
    let router = m.is_moe_layer(layer) && m.moe.as_ref().is_some_and(|e| e.router_linear_bias);
    match part {
        Part::QNorm => a.qk_norm.then_some(first),
        Part::KNorm => a.qk_norm.then_some(first + 1),
        Part::Sinks => a.sinks.then_some(first + qk),
        Part::RouterBias => router.then_some(first + qk + usize::from(a.sinks)),
    }
}

/// Appends layer `l`'s parts (name prefix `p`) to its block, after its biases.
pub(super) fn push(b: &mut Builder, plan: &Plan, l: u32, p: &str, rd: &RankDims) {
    let m = &plan.model;
    let std = m.init_std;
    if m.attention.qk_norm {
        // Not `tp_replicated`: the gradient is summed over TP when computed.
        b.norm_of(&format!("{p}.q_norm"), m.norm, rd.d, false);
        b.norm_of(&format!("{p}.k_norm"), m.norm, rd.d, false);
    }
    if m.attention.sinks {
        let (r, a) = (rd.tp_rank, rd.a_r);
        let s = seg(format!("{p}.sinks"), 1, r * a..(r + 1) * a, 0..1, std);
        b.push(a, 1, vec![s], false);
    }
    if tensor(m, l, Part::RouterBias).is_some() {
        let e = m.moe.as_ref().map_or(0, |x| x.num_experts);
        let s = seg(format!("{p}.router_linear_bias"), 1, 0..e, 0..1, std);
        b.push(e, 1, vec![s], plan.parallel.moe_routes_sp_shard());
    }
}

/// The view of `part` in layer block `l` with parameters `p` (the part must exist).
fn view<'p, B: Backend>(
    ctx: &Ctx<B>,
    l: &BlockLayout,
    p: &View<'p, B::Tensor>,
    part: Part,
) -> Option<(usize, View<'p, B::Tensor>)> {
    let t = tensor(&ctx.plan.model, block_layer(l), part)?;
    Some((t, p.sub(l.tensors[t].range())))
}

/// QK norm's forward on `x` [n, heads d] in place (each head's d features normalised with the
/// gain of `part`); returns its input [n heads, d], which backward needs, or `None` without
/// QK norm.
pub fn qk_norm_fwd<B: Backend>(
    ctx: &Ctx<B>,
    l: &BlockLayout,
    p: &View<'_, B::Tensor>,
    part: Part,
    x: &mut B::Tensor,
) -> Result<Option<B::Tensor>, ExecError> {
    let Some((_, w)) = view(ctx, l, p, part) else {
        return Ok(None);
    };
    let m = &ctx.plan.model;
    let d = ctx.rd.d;
    let rows = x.len() / d;
    let mut input = ctx.zeros(Category::Activations, &[rows, d])?;
    ctx.ops.copy(View::all(x), ViewMut::all(&mut input))?;
    let mut y = ctx.zeros(Category::Buffers, &[rows, d])?;
    ctx.ops.norm_fwd(NormSpec::of(m), &input, w, &mut y)?;
    ctx.ops.copy(View::all(&y), ViewMut::all(x))?;
    Ok(Some(input))
}

/// QK norm's backward: `dx` [n, heads d] (the normed output's gradient) becomes the input's,
/// in place; the gain's gradient, summed over TP, goes to `sink`.
pub fn qk_norm_bwd<B: Backend>(
    ctx: &mut Ctx<B>,
    l: &BlockLayout,
    p: &View<'_, B::Tensor>,
    part: Part,
    input: B::Tensor,
    dx: &mut B::Tensor,
    sink: &mut Sink<B>,
) -> Result<(), ExecError> {
    let Some((t, w)) = view(ctx, l, p, part) else {
        return Ok(());
    };
    let m = &ctx.plan.model;
    let spec = NormSpec::of(m);
    let shape = [input.rows(), input.cols()];
    let b = Category::Buffers;
    let mut dy = ctx.zeros(b, &shape)?;
    ctx.ops.copy(View::all(dx), ViewMut::all(&mut dy))?;
    let mut din = ctx.zeros(b, &shape)?;
    ctx.ops.norm_dgrad(spec, &input, w, &dy, &mut din, false)?;
    let mut g = ctx.zeros_f32(b, &[l.tensors[t].len()])?;
    ctx.ops
        .norm_wgrad(spec, &input, &dy, ViewMut::all(&mut g))?;
    drop((dy, input));
    if ctx.rd.t > 1 {
        ctx.comm
            .all_reduce(&ctx.tp, ViewMut::all(&mut g), ReduceOp::Sum)?;
    }
    ctx.ops.copy(View::all(&din), ViewMut::all(dx))?;
    sink(ctx, WTask::Ready { tensor: t, grad: g })
}

/// The sink logits of layer block `l` (this TP rank's heads), when the model has sinks.
pub fn sinks<'p, B: Backend>(
    ctx: &Ctx<B>,
    l: &BlockLayout,
    p: &View<'p, B::Tensor>,
) -> Option<View<'p, B::Tensor>> {
    view(ctx, l, p, Part::Sinks).map(|(_, v)| v)
}

/// The block shape of a whole-sequence attention call (the layout the sink ops share).
pub fn block_of(sh: &AttnShape) -> BlockShape {
    BlockShape {
        b: sh.b,
        hq: sh.heads,
        hk: sh.kv_heads,
        d: sh.d,
        dv: sh.dv,
        dropout: sh.dropout,
        span: sh.span,
    }
}

/// Whole-sequence attention with sinks: the keys' attention keeping their log-sum-exp, then
/// the sinks folded into the output `o` and the log-sum-exp; returns what `keep` asks to save
/// (the log-sum-exp or, under selective recomputation, nothing).
pub fn attn_fwd_sinks<B: Backend>(
    ctx: &Ctx<B>,
    sh: &AttnShape,
    x: Qkv<'_, B::Tensor>,
    o: &mut B::Tensor,
    keep: Keep,
    sinks: View<'_, B::Tensor>,
) -> Result<AttnSaved<B::Tensor>, ExecError> {
    let AttnSaved::Lse(mut lse) = ctx.ops.attn_fwd(sh, x, o, Keep::Lse)? else {
        return Err(crate::error::StateError::SinksWithoutLse.into());
    };
    ctx.ops
        .attn_sink_fwd(&block_of(sh), sh.s, o, &mut lse, sinks)?;
    Ok(match keep {
        Keep::Nothing => AttnSaved::None,
        _ => AttnSaved::Lse(lse),
    })
}

/// The sinks' part of a whole-sequence attention's backward: the final log-sum-exp (saved, or
/// recomputed under selective recomputation) for the keys' backward, and the sink logits'
/// gradient from D = rowsum(dO * O) to `sink`. `o` is the attention's output.
pub fn sinks_bwd<B: Backend>(
    ctx: &mut Ctx<B>,
    l: &BlockLayout,
    p: &View<'_, B::Tensor>,
    sh: &AttnShape,
    (x, saved): (Qkv<'_, B::Tensor>, AttnSaved<B::Tensor>),
    (o, dout): (&B::Tensor, &B::Tensor),
    sink: &mut Sink<B>,
) -> Result<AttnSaved<B::Tensor>, ExecError> {
    let Some((t, logits)) = view(ctx, l, p, Part::Sinks) else {
        return Ok(saved);
    };
    let bs = block_of(sh);
    let lse = match saved {
        AttnSaved::Lse(l) => l,
        _ => {
            let mut o2 = ctx.zeros(Category::Buffers, &[o.rows(), o.cols()])?;
            let again = attn_fwd_sinks(ctx, sh, x, &mut o2, Keep::Lse, logits.clone())?;
            match again {
                AttnSaved::Lse(l) => l,
                _ => return Err(crate::error::StateError::SinksWithoutLse.into()),
            }
        }
    };
    let mut delta = ctx.zeros_f32(Category::Buffers, &[sh.b * sh.s * sh.heads])?;
    ctx.ops.flash_delta(&bs, sh.s, dout, o, &mut delta)?;
    let mut g = ctx.zeros_f32(Category::Buffers, &[sh.heads])?;
    ctx.ops
        .attn_sink_grad(&bs, sh.s, &lse, &delta, logits, ViewMut::all(&mut g))?;
    sink(ctx, WTask::Ready { tensor: t, grad: g })?;
    Ok(AttnSaved::Lse(lse))
}

/// The router's linear bias of MoE layer block `l`, when it has one: (tensor, view).
pub fn router_bias<'p, B: Backend>(
    ctx: &Ctx<B>,
    l: &BlockLayout,
    p: &View<'p, B::Tensor>,
) -> Option<(usize, View<'p, B::Tensor>)> {
    view(ctx, l, p, Part::RouterBias)
}
