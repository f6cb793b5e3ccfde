//! One decoder layer: norm, QKV (column-parallel), rotary, causal GQA attention, output
//! projection (row-parallel), residual; norm, fc1 (column-parallel), SwiGLU/GeLU, fc2
//! (row-parallel), residual. Saves exactly what the engine's op ledger counts (docs/engine.md):
//! each norm's input, the QKV and fc1 inputs (sequence shards with SP), Q, K, V, the softmax
//! (or the log-sum-exp with flash attention; neither under selective recompute), the
//! projection and fc2 inputs, and the activation's input. An MoE layer runs the experts block
//! of `moe.rs` after the pre-MLP norm instead of the dense MLP.

use super::bias::{self, Site};
use super::blocks::{BlockKind, BlockLayout};
use super::cp;
use super::ctx::Ctx;
use super::dropout::{dropout_grad, hidden_dropout};
use super::lora::{self, Adapters, LoraSaved, Target};
use super::mamba::MambaSaved;
use super::mla::{mla_bwd, mla_fwd, MlaSaved, QkvTensors};
use super::modern::{self, Part};
use super::moe::{moe_bwd, moe_fwd, MoeSaved};
use super::wtask::{Sink, WTask};

use crate::backend::ops::*;
use crate::backend::View;
use crate::backend::{Backend, Device, DeviceTensor};
use crate::error::{ExecError, StateError};
use crate::rng::DropoutSite;
use crate::tracker::Category;
use parsim_plan::plan::Recompute;

pub(super) const ATTN_NORM: usize = 0;
const QKV: usize = 1;
const PROJ: usize = 2;
pub(super) const MLP_NORM: usize = 3;
const FC1: usize = 4;
const FC2: usize = 5;

/// What a layer keeps from forward to backward.
pub struct LayerSaved<B: Backend> {
    pub x: B::Tensor,
    pub ln1: B::Tensor,
    pub q: B::Tensor,
    pub k: B::Tensor,
    pub v: B::Tensor,
    pub attn: AttnSaved<B::Tensor>,
    pub o: B::Tensor,
    pub x1: B::Tensor,
    pub ln2: B::Tensor,
    pub u: B::Tensor,
    pub act: B::Tensor,
    /// An MoE layer's experts block (then `u` and `act` are empty).
    pub moe: Option<Box<MoeSaved<B>>>,
    /// MLA's latents (DeepSeek-V2), when the model has MLA.
    pub mla: Option<Box<MlaSaved<B>>>,
    /// LoRA's rank-r intermediates, when the layer has adapters.
    pub lora: Option<Box<LoraSaved<B>>>,
    /// The hidden dropouts' 1-byte keep masks (attention, MLP), as Megatron saves them.
    pub masks: [Option<B::Tensor>; 2],
    /// QK norm's inputs (queries, keys), when the model has it.
    pub qk: Option<Box<[B::Tensor; 2]>>,
    /// A hybrid model's layer: its one sublayer's state (every field above but `x` empty).
    pub hybrid: Option<Box<HybridSaved<B>>>,
}

/// What a hybrid layer's sublayer keeps for backward (its input is the layer's `x`).
pub enum HybridSaved<B: Backend> {
    Mamba(MambaSaved<B>),
    Attention {
        parts: AttnParts<B>,
        mask: Option<B::Tensor>,
    },
    /// The MLP's normed input, fc1's output and activation, or the experts' state.
    Ffn {
        ln2: B::Tensor,
        u: B::Tensor,
        act: B::Tensor,
        moe: Option<Box<MoeSaved<B>>>,
        mask: Option<B::Tensor>,
    },
}

/// An MoE layer's experts block and its parameters.
pub type Experts<'e, B> = Option<(
    &'e BlockLayout,
    View<'e, <B as Backend>::Tensor>,
    FrozenExperts<'e, B>,
)>;

/// Under LoRA with routed-expert adapters, the frozen routed experts' block and parameters.
pub type FrozenExperts<'e, B> = Option<(&'e BlockLayout, View<'e, <B as Backend>::Tensor>)>;

/// B::Tensor `t` of block `l` within the block's parameters `p`.
fn slice<'p, T: DeviceTensor>(p: &View<'p, T>, l: &BlockLayout, t: usize) -> View<'p, T> {
    p.sub(l.tensors[t].range())
}

/// The global index of a decoder layer's block.
pub(super) fn layer_index(l: &BlockLayout) -> u32 {
    match l.kind {
        BlockKind::Layer(i) => i,
        _ => 0,
    }
}

fn attn_shape<B: Backend>(ctx: &Ctx<B>, layer: u32) -> AttnShape {
    let m = &ctx.plan.model;
    AttnShape {
        dropout: super::dropout::attention_dropout(ctx, layer),
        b: m.micro_batch,
        s: m.seq,
        heads: ctx.rd.a_r,
        kv_heads: ctx.rd.g_r,
        d: ctx.rd.d,
        dv: ctx.rd.dv,
        span: m.span(layer),
    }
}

/// Forward of one layer on the residual shard `x` [n_sp, h]; returns the output and the
/// saved tensors (the caller keeps only `x` under full recompute).
pub fn layer_fwd<B: Backend>(
    ctx: &mut Ctx<B>,
    l: &BlockLayout,
    p: View<'_, B::Tensor>,
    experts: Experts<B>,
    ad: Adapters<B>,
    x: B::Tensor,
) -> Result<(B::Tensor, LayerSaved<B>), ExecError> {
    let keep = keep(ctx);
    let (n_sp, h) = (ctx.n_sp, ctx.rd.h);
    let a = Category::Activations;
    let mut ls = LoraSaved::default();

    let (attn_out, ap, attn_mask) = attention_fwd(ctx, l, &p, (&ad, &mut ls), keep, &x)?;
    let AttnParts {
        ln1,
        q,
        k,
        v,
        attn,
        o,
        mla,
        qk,
    } = ap;
    let mut x1 = ctx.zeros(a, &[n_sp, h])?;
    ctx.ops.add(&x, &attn_out, &mut x1)?;
    drop(attn_out);

    let (mut mlp_out, ln2, u, act, moe) = ffn_fwd(ctx, l, &p, experts, (&ad, &mut ls), &x1)?;
    let mlp_mask = hidden_dropout(ctx, layer_index(l), DropoutSite::Mlp, &mut mlp_out)?;
    let mut y = ctx.zeros(a, &[n_sp, h])?;
    ctx.ops.add(&x1, &mlp_out, &mut y)?;
    drop(mlp_out);
    Ok((
        y,
        LayerSaved {
            x,
            ln1,
            q,
            k,
            v,
            attn,
            o,
            x1,
            ln2,
            u,
            act,
            moe,
            mla,
            lora: ad.is_some().then(|| Box::new(ls)),
            masks: [attn_mask, mlp_mask],
            qk,
            hybrid: None,
        },
    ))
}

/// What attention keeps for backward: the softmax, its log-sum-exp (flash attention) or
/// nothing (selective recompute).
pub(super) fn keep<B: Backend>(ctx: &Ctx<B>) -> Keep {
    match (ctx.recompute, ctx.plan.model.flash) {
        (Recompute::Selective, _) => Keep::Nothing,
        (_, true) => Keep::Lse,
        (_, false) => Keep::Probs,
    }
}

/// Attention's output in the SP region (before the residual), from the block input `x`: the
/// norm, QKV (or MLA), the core (under CP, its exchanges), the projection, its bias and hidden
/// dropout; with what its backward needs and the dropout's mask.
#[allow(clippy::type_complexity)]
pub(super) fn attention_fwd<B: Backend>(
    ctx: &mut Ctx<B>,
    l: &BlockLayout,
    p: &View<'_, B::Tensor>,
    (ad, ls): (&Adapters<B>, &mut LoraSaved<B>),
    keep: Keep,
    x: &B::Tensor,
) -> Result<(B::Tensor, AttnParts<B>, Option<B::Tensor>), ExecError> {
    let m = &ctx.plan.model;
    let spec = NormSpec::of(m);
    let rd = ctx.rd;
    let (n, n_sp, h) = (ctx.n, ctx.n_sp, rd.h);
    let a = Category::Activations;
    let mut ln1 = ctx.zeros(a, &[n_sp, h])?;
    ctx.ops
        .norm_fwd(spec, x, slice(p, l, ATTN_NORM), &mut ln1)?;
    let (q, k, v, mla, qk) = if m.mla.is_some() {
        let ((q, k, v), ms) = mla_fwd(ctx, l, p, &ln1)?;
        (q, k, v, Some(Box::new(ms)), None)
    } else {
        let ((q, k, v), qk) = qkv_fwd(ctx, l, p, &ln1, ad, ls)?;
        (q, k, v, None, qk)
    };
    let ow = rd.a_r * rd.dv;
    let sinks = modern::sinks(ctx, l, p);
    let (o, q, k, v, attn) = if ctx.cp.is_some() {
        let (o, c) = cp::forward(ctx, layer_index(l), q, k, v, keep, sinks)?;
        (o, c.q, c.k, c.v, c.attn)
    } else {
        let mut o = ctx.zeros(a, &[n, ow])?;
        let sh = attn_shape(ctx, layer_index(l));
        let attn = match sinks {
            Some(z) => modern::attn_fwd_sinks(
                ctx,
                &sh,
                Qkv {
                    q: &q,
                    k: &k,
                    v: &v,
                },
                &mut o,
                keep,
                z,
            )?,
            None => ctx.ops.attn_fwd(
                &sh,
                Qkv {
                    q: &q,
                    k: &k,
                    v: &v,
                },
                &mut o,
                keep,
            )?,
        };
        (o, q, k, v, attn)
    };
    let mut partial = ctx.zeros(Category::Buffers, &[n, h])?;
    ctx.ops
        .linear_fwd(&o, slice(p, l, PROJ), (n, ow, h), &mut partial)?;
    let mut attn_out = ctx.reduce_to_region(partial, Category::Buffers)?;
    if let Some(ad) = ad {
        lora::row_fwd(ctx, ad, Target::Proj, &o, &mut attn_out, ls)?;
    }
    bias::add(ctx, l, p, Site::Proj, &mut attn_out)?;
    let attn_mask = hidden_dropout(ctx, layer_index(l), DropoutSite::Attention, &mut attn_out)?;
    let parts = AttnParts {
        ln1,
        q,
        k,
        v,
        attn,
        o,
        mla,
        qk: qk.map(Box::new),
    };
    Ok((attn_out, parts, attn_mask))
}

/// The MLP's (or the experts') output in the SP region (before its dropout and the
/// residual), from the attention's residual `x1`; with its norm's output, fc1's output and
/// the activation (empty for the experts) and the experts' saved state.
#[allow(clippy::type_complexity)]
pub(super) fn ffn_fwd<B: Backend>(
    ctx: &mut Ctx<B>,
    l: &BlockLayout,
    p: &View<'_, B::Tensor>,
    experts: Experts<B>,
    (ad, ls): (&Adapters<B>, &mut LoraSaved<B>),
    x1: &B::Tensor,
) -> Result<
    (
        B::Tensor,
        B::Tensor,
        B::Tensor,
        B::Tensor,
        Option<Box<MoeSaved<B>>>,
    ),
    ExecError,
> {
    let m = &ctx.plan.model;
    let spec = NormSpec::of(m);
    let (n_sp, h) = (ctx.n_sp, ctx.rd.h);
    let a = Category::Activations;
    let mut ln2 = ctx.zeros(a, &[n_sp, h])?;
    ctx.ops
        .norm_fwd(spec, x1, slice(p, l, MLP_NORM), &mut ln2)?;
    let (mlp_out, u, act, moe) = if let Some((le, pe, fe)) = experts {
        let lora = (ad, ls);
        let (out, ms) = moe_fwd(ctx, l, p.clone(), (le, pe, fe), &ln2, lora)?;
        let empty = || ctx.zeros(a, &[0]);
        let (u, act) = (empty()?, empty()?);
        (out, u, act, Some(Box::new(ms)))
    } else {
        let (out, u, act) = mlp_fwd(ctx, l, p, (ad, ls), &ln2)?;
        (out, u, act, None)
    };
    Ok((mlp_out, ln2, u, act, moe))
}

/// The dense MLP's output, fc1's output and the activation (kept for backward).
type MlpOut<B> = (
    <B as Backend>::Tensor,
    <B as Backend>::Tensor,
    <B as Backend>::Tensor,
);

/// The dense MLP's forward on the normed input `ln2`: fc1 (column-parallel), the activation,
/// fc2 (row-parallel); returns the output in the SP region, fc1's output and the activation.
fn mlp_fwd<B: Backend>(
    ctx: &mut Ctx<B>,
    l: &BlockLayout,
    p: &View<'_, B::Tensor>,
    (ad, ls): (&Adapters<B>, &mut LoraSaved<B>),
    ln2: &B::Tensor,
) -> Result<MlpOut<B>, ExecError> {
    let rd = ctx.rd;
    let (n, h, a) = (ctx.n, rd.h, Category::Activations);
    let act_kind = ctx.plan.model.activation;
    let fc1 = rd.fc1_r;
    let mut u = ctx.zeros(a, &[n, fc1])?;
    ctx.with_gathered(ln2, |c, xg| {
        c.ops.linear_fwd(xg, slice(p, l, FC1), (n, h, fc1), &mut u)
    })?;
    if let Some(ad) = ad {
        lora::col_fwd(ctx, ad, Target::Fc1, ln2, &mut u, ls)?;
    }
    bias::add(ctx, l, p, Site::Fc1, &mut u)?;
    let mut act = ctx.zeros(a, &[n, rd.f_r])?;
    ctx.ops.act_fwd(act_kind, &u, &mut act)?;
    let mut partial = ctx.zeros(Category::Buffers, &[n, h])?;
    ctx.ops
        .linear_fwd(&act, slice(p, l, FC2), (n, rd.f_r, h), &mut partial)?;
    let mut mlp_out = ctx.reduce_to_region(partial, Category::Buffers)?;
    if let Some(ad) = ad {
        lora::row_fwd(ctx, ad, Target::Fc2, &act, &mut mlp_out, ls)?;
    }
    bias::add(ctx, l, p, Site::Fc2, &mut mlp_out)?;
    Ok((mlp_out, u, act))
}

/// QK norm's inputs (queries, keys), saved for its backward.
type QkInputs<B> = [<B as Backend>::Tensor; 2];

/// Q, K and V of this rank's heads through the fused QKV projection (column-parallel), QK
/// norm (before rotary, as Qwen3) and rotary, from the normed block input `ln1` [n_sp, h];
/// with QK norm also its inputs.
fn qkv_fwd<B: Backend>(
    ctx: &mut Ctx<B>,
    l: &BlockLayout,
    p: &View<'_, B::Tensor>,
    ln1: &B::Tensor,
    ad: &Adapters<B>,
    ls: &mut LoraSaved<B>,
) -> Result<(QkvTensors<B>, Option<QkInputs<B>>), ExecError> {
    let rd = ctx.rd;
    let (n, h, d) = (ctx.n, rd.h, rd.d);
    let theta = ctx.plan.model.rope_theta;
    let a = Category::Activations;
    let qkv_r = rd.qkv_r();
    let mut qkv = ctx.zeros(Category::Buffers, &[n, qkv_r])?;
    ctx.with_gathered(ln1, |c, xg| {
        c.ops
            .linear_fwd(xg, slice(p, l, QKV), (n, h, qkv_r), &mut qkv)
    })?;
    if let Some(ad) = ad {
        lora::col_fwd(ctx, ad, Target::Qkv, ln1, &mut qkv, ls)?;
    }
    bias::add(ctx, l, p, Site::Qkv, &mut qkv)?;
    let (qw, kw) = (rd.a_r * d, rd.g_r * d);
    let mut q = ctx.zeros(a, &[n, qw])?;
    let mut k = ctx.zeros(a, &[n, kw])?;
    let mut v = ctx.zeros(a, &[n, kw])?;
    ctx.ops.qkv_split(&qkv, &mut q, &mut k, &mut v)?;
    drop(qkv);
    let qn = modern::qk_norm_fwd(ctx, l, p, Part::QNorm, &mut q)?;
    let kn = modern::qk_norm_fwd(ctx, l, p, Part::KNorm, &mut k)?;
    // Learned absolute positions (GPT-2/3) replace rotary.
    if ctx.plan.model.learned_positions == 0 {
        ctx.ops
            .rotary(&mut q, rd.a_r, &ctx.positions, theta, false)?;
        ctx.ops
            .rotary(&mut k, rd.g_r, &ctx.positions, theta, false)?;
    }
    Ok(((q, k, v), qn.zip(kn).map(|(a, b)| [a, b])))
}

/// Input gradient of one layer: dx [n_sp, h] from dy [n_sp, h]; each weight-gradient task goes
/// to `sink` as soon as its tensors exist (so a full backward frees them at once).
pub fn layer_bwd<B: Backend>(
    ctx: &mut Ctx<B>,
    l: &BlockLayout,
    p: View<'_, B::Tensor>,
    (experts, ad): (Experts<B>, Adapters<B>),
    s: LayerSaved<B>,
    dy: B::Tensor,
    sink: &mut Sink<B>,
) -> Result<B::Tensor, ExecError> {
    let LayerSaved {
        x,
        ln1,
        q,
        k,
        v,
        attn,
        o,
        x1,
        ln2,
        u,
        act,
        moe,
        mla,
        lora: ls,
        masks: [attn_mask, mlp_mask],
        qk,
        hybrid,
    } = s;
    if hybrid.is_some() {
        return Err(StateError::HybridSavedMismatch.into());
    }
    let mut ls = ls.map(|b| *b).unwrap_or_default();

    // MLP: fc2 (row-parallel), activation, fc1 (column-parallel), norm; or the experts.
    let d_mlp = dropout_grad(ctx, mlp_mask.as_ref(), &dy)?;
    drop(mlp_mask);
    let dy_mlp = d_mlp.as_ref().unwrap_or(&dy);
    let d_ln2 = match (moe, experts) {
        (Some(ms), Some(ex)) => {
            let lora = (&ad, &mut ls);
            moe_bwd(ctx, (l, p.clone()), ex, (ln2, *ms), dy_mlp, lora, sink)?
        }
        (Some(_), None) | (None, Some(_)) => return Err(StateError::MoeSavedMismatch.into()),
        (None, None) => mlp_bwd(ctx, l, &p, (&ad, &mut ls), (ln2, u, act), dy_mlp, sink)?,
    };
    drop(d_mlp);
    // The residual's gradient takes dy's buffer; the norm's input gradient is added to it.
    let dx1 = norm_bwd(ctx, l, &p, MLP_NORM, (x1, d_ln2), dy, sink)?;
    let saved = AttnParts {
        ln1,
        q,
        k,
        v,
        attn,
        o,
        mla,
        qk,
    };
    let d_ln1 = attention_bwd(ctx, l, &p, (saved, attn_mask), &dx1, (&ad, &mut ls), sink)?;
    norm_bwd(ctx, l, &p, ATTN_NORM, (x, d_ln1), dx1, sink)
}

/// Norm `tensor`'s input gradient from its output gradient `dy` (input `x`), added to the
/// residual's gradient `dres`; the gain's (and bias's) gradient task goes to `sink`.
pub(super) fn norm_bwd<B: Backend>(
    ctx: &mut Ctx<B>,
    l: &BlockLayout,
    p: &View<'_, B::Tensor>,
    tensor: usize,
    (x, dy): (B::Tensor, B::Tensor),
    mut dres: B::Tensor,
    sink: &mut Sink<B>,
) -> Result<B::Tensor, ExecError> {
    let m = &ctx.plan.model;
    let spec = NormSpec::of(m);
    ctx.ops
        .norm_dgrad(spec, &x, slice(p, l, tensor), &dy, &mut dres, true)?;
    sink(ctx, WTask::Norm { tensor, x, dy })?;
    Ok(dres)
}

/// The dense MLP's backward: fc2 (row-parallel), the activation, fc1 (column-parallel), from
/// the saved (normed input, fc1 output, activation) and the output gradient `dy_mlp`; returns
/// the normed input's gradient [n_sp, h].
pub(super) fn mlp_bwd<B: Backend>(
    ctx: &mut Ctx<B>,
    l: &BlockLayout,
    p: &View<'_, B::Tensor>,
    (ad, ls): (&Adapters<B>, &mut LoraSaved<B>),
    (ln2, u, act): (B::Tensor, B::Tensor, B::Tensor),
    dy_mlp: &B::Tensor,
    sink: &mut Sink<B>,
) -> Result<B::Tensor, ExecError> {
    let rd = ctx.rd;
    let (n, h, sp) = (ctx.n, rd.h, ctx.sp);
    let b = Category::Buffers;
    let act_kind = ctx.plan.model.activation;
    bias::grad(ctx, l, Site::Fc2, dy_mlp, sink)?;
    let dyg = ctx.expand_grad(dy_mlp)?;
    let mut d_act = ctx.zeros(b, &[n, rd.f_r])?;
    ctx.ops
        .linear_dgrad(&dyg, slice(p, l, FC2), (n, rd.f_r, h), &mut d_act, false)?;
    if let Some(ad) = ad {
        lora::row_bwd(ctx, ad, Target::Fc2, ls, (&act, dy_mlp), &mut d_act, sink)?;
    }
    sink(
        ctx,
        WTask::Linear {
            tensor: FC2,
            x: act,
            dy: dyg,
            i: rd.f_r,
            o: h,
            gather_x: false,
            dy_gathered: sp,
            dy_shard: false,
        },
    )?;
    // In place: the activation's input is needed by nothing else, so its gradient takes its
    // buffer (no n x fc1 transient).
    let mut du = ctx.ops.recat(u, b);
    ctx.ops.act_bwd_inplace(act_kind, &mut du, &d_act)?;
    drop(d_act);
    bias::grad(ctx, l, Site::Fc1, &du, sink)?;
    let mut part = ctx.zeros(b, &[n, h])?;
    ctx.ops
        .linear_dgrad(&du, slice(p, l, FC1), (n, h, rd.fc1_r), &mut part, false)?;
    let mut d_ln2 = ctx.reduce_to_region(part, b)?;
    if let Some(ad) = ad {
        lora::col_bwd(ctx, ad, Target::Fc1, ls, (&ln2, &du), &mut d_ln2, sink)?;
    }
    sink(
        ctx,
        WTask::Linear {
            tensor: FC1,
            x: ln2,
            dy: du,
            i: h,
            o: rd.fc1_r,
            gather_x: sp,
            dy_gathered: false,
            dy_shard: false,
        },
    )?;
    Ok(d_ln2)
}

/// What attention's backward takes of a layer's saved state.
pub struct AttnParts<B: Backend> {
    ln1: B::Tensor,
    q: B::Tensor,
    k: B::Tensor,
    v: B::Tensor,
    attn: AttnSaved<B::Tensor>,
    o: B::Tensor,
    mla: Option<Box<MlaSaved<B>>>,
    qk: Option<Box<[B::Tensor; 2]>>,
}

/// Attention's backward: the projection (row-parallel), the core (under CP, its exchanges),
/// rotary, QKV or MLA (column-parallel), from the residual's gradient `dx1`; returns the normed
/// input's gradient [n_sp, h].
pub(super) fn attention_bwd<B: Backend>(
    ctx: &mut Ctx<B>,
    l: &BlockLayout,
    p: &View<'_, B::Tensor>,
    (s, attn_mask): (AttnParts<B>, Option<B::Tensor>),
    dx1: &B::Tensor,
    (ad, ls): (&Adapters<B>, &mut LoraSaved<B>),
    sink: &mut Sink<B>,
) -> Result<B::Tensor, ExecError> {
    let rd = ctx.rd;
    let (n, h, d, sp) = (ctx.n, rd.h, rd.d, ctx.sp);
    let b = Category::Buffers;
    let AttnParts {
        ln1,
        q,
        k,
        v,
        attn,
        o,
        mla,
        qk,
    } = s;
    // Attention: projection (row-parallel), core, rotary, QKV (column-parallel), norm.
    let (qw, kw, ow) = (rd.a_r * d, rd.g_r * d, rd.a_r * rd.dv);
    let d_attn = dropout_grad(ctx, attn_mask.as_ref(), dx1)?;
    drop(attn_mask);
    bias::grad(ctx, l, Site::Proj, d_attn.as_ref().unwrap_or(dx1), sink)?;
    let dxg = ctx.expand_grad(d_attn.as_ref().unwrap_or(dx1))?;
    let mut d_o = ctx.zeros(b, &[n, ow])?;
    ctx.ops
        .linear_dgrad(&dxg, slice(p, l, PROJ), (n, ow, h), &mut d_o, false)?;
    if let Some(ad) = ad {
        let dy_reg = d_attn.as_ref().unwrap_or(dx1);
        lora::row_bwd(ctx, ad, Target::Proj, ls, (&o, dy_reg), &mut d_o, sink)?;
    }
    drop(d_attn);
    // Context parallelism needs rowsum(dO * O) before the output goes to the weight gradient,
    // and so do the sinks' gradient and (selective recomputation) log-sum-exp without it.
    let (delta, attn) = match ctx.cp {
        Some(_) => (Some(cp::row_delta(ctx, &d_o, &o)?), attn),
        None => {
            let sh = attn_shape(ctx, layer_index(l));
            let qkv = Qkv {
                q: &q,
                k: &k,
                v: &v,
            };
            let attn = modern::sinks_bwd(ctx, l, p, &sh, (qkv, attn), (&o, &d_o), sink)?;
            (None, attn)
        }
    };
    sink(
        ctx,
        WTask::Linear {
            tensor: PROJ,
            x: o,
            dy: dxg,
            i: ow,
            o: h,
            gather_x: false,
            dy_gathered: sp,
            dy_shard: false,
        },
    )?;
    let (dq, dk, dv) = if let Some(delta) = delta {
        let saved = cp::CoreSaved { q, k, v, attn };
        let sinks = modern::sinks(ctx, l, p);
        cp::backward(ctx, layer_index(l), saved, delta, d_o, sinks, sink)?
    } else {
        let mut dq = ctx.zeros(b, &[n, qw])?;
        let mut dk = ctx.zeros(b, &[n, kw])?;
        let mut dv = ctx.zeros(b, &[n, rd.g_r * rd.dv])?;
        let sh = attn_shape(ctx, layer_index(l));
        let grads = QkvGrads {
            dq: &mut dq,
            dk: &mut dk,
            dv: &mut dv,
        };
        let x = Qkv {
            q: &q,
            k: &k,
            v: &v,
        };
        ctx.ops.attn_bwd(&sh, x, &attn, &d_o, grads)?;
        drop((q, k, v, attn, d_o));
        (dq, dk, dv)
    };
    let d_ln1 = match mla {
        Some(ms) => mla_bwd(ctx, l, p, *ms, ln1, [dq, dk, dv], sink)?,
        None => qkv_bwd(ctx, l, p, (ln1, qk), [dq, dk, dv], (ad, ls), sink)?,
    };
    Ok(d_ln1)
}

/// The normed block input's gradient [n_sp, h] through rotary, QK norm and the fused QKV
/// projection.
fn qkv_bwd<B: Backend>(
    ctx: &mut Ctx<B>,
    l: &BlockLayout,
    p: &View<'_, B::Tensor>,
    (ln1, qk): (B::Tensor, Option<Box<QkInputs<B>>>),
    [mut dq, mut dk, dv]: [B::Tensor; 3],
    (ad, ls): (&Adapters<B>, &mut LoraSaved<B>),
    sink: &mut Sink<B>,
) -> Result<B::Tensor, ExecError> {
    let rd = ctx.rd;
    let (n, h) = (ctx.n, rd.h);
    let theta = ctx.plan.model.rope_theta;
    let b = Category::Buffers;
    // Learned absolute positions (GPT-2/3) replace rotary.
    if ctx.plan.model.learned_positions == 0 {
        ctx.ops
            .rotary(&mut dq, rd.a_r, &ctx.positions, theta, true)?;
        ctx.ops
            .rotary(&mut dk, rd.g_r, &ctx.positions, theta, true)?;
    }
    if let Some(qk) = qk {
        let [qn, kn] = *qk;
        modern::qk_norm_bwd(ctx, l, p, Part::QNorm, qn, &mut dq, sink)?;
        modern::qk_norm_bwd(ctx, l, p, Part::KNorm, kn, &mut dk, sink)?;
    }
    let qkv_r = rd.qkv_r();
    let mut dqkv = ctx.zeros(b, &[n, qkv_r])?;
    ctx.ops.qkv_merge(&dq, &dk, &dv, &mut dqkv)?;
    drop((dq, dk, dv));
    bias::grad(ctx, l, Site::Qkv, &dqkv, sink)?;
    let mut part = ctx.zeros(b, &[n, h])?;
    ctx.ops
        .linear_dgrad(&dqkv, slice(p, l, QKV), (n, h, qkv_r), &mut part, false)?;
    let mut d_ln1 = ctx.reduce_to_region(part, b)?;
    if let Some(ad) = ad {
        lora::col_bwd(ctx, ad, Target::Qkv, ls, (&ln1, &dqkv), &mut d_ln1, sink)?;
    }
    let sp = ctx.sp;
    sink(
        ctx,
        WTask::Linear {
            tensor: QKV,
            x: ln1,
            dy: dqkv,
            i: h,
            o: qkv_r,
            gather_x: sp,
            dy_gathered: false,
            dy_shard: false,
        },
    )?;
    Ok(d_ln1)
}
