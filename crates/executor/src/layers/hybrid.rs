//! Any decoder layer ([`decoder_fwd`], [`decoder_bwd`]): a transformer layer
//! ([`super::layer`]), or a hybrid model's layer (Megatron's `--hybrid-layer-pattern`,
//! Nemotron-H): one sublayer with its own pre-norm and residual: a Mamba-2 mixer
//! ([`super::mamba`]), attention alone, or the MLP (or the experts) alone, the latter two as
//! the halves of a transformer layer.

use super::blocks::BlockLayout;
use super::ctx::Ctx;
use super::dropout::{dropout_grad, hidden_dropout};
use super::layer::{attention_bwd, attention_fwd, ffn_fwd, keep, layer_bwd, layer_fwd};
use super::layer::{layer_index, mlp_bwd, norm_bwd};
use super::layer::{Experts, HybridSaved, LayerSaved, ATTN_NORM, MLP_NORM};
use super::lora::{Adapters, LoraSaved};
use super::mamba::{mamba_bwd, mamba_fwd};
use super::moe::moe_bwd;
use super::wtask::Sink;
use crate::backend::ops::*;
use crate::backend::{Backend, View};
use crate::error::{ExecError, StateError};
use crate::rng::DropoutSite;
use crate::tracker::Category;
use parsim_plan::plan::HybridLayer;

/// Forward of decoder layer `l` on the residual shard `x` [n_sp, h]: its output and what it
/// saves (the caller keeps only `x` under full recompute).
pub fn decoder_fwd<B: Backend>(
    ctx: &mut Ctx<B>,
    l: &BlockLayout,
    p: View<'_, B::Tensor>,
    experts: Experts<B>,
    ad: Adapters<B>,
    x: B::Tensor,
) -> Result<(B::Tensor, LayerSaved<B>), ExecError> {
    match ctx.plan.model.hybrid_layer(layer_index(l)) {
        Some(kind) => hybrid_fwd(ctx, l, p, experts, kind, x),
        None => layer_fwd(ctx, l, p, experts, ad, x),
    }
}

/// Input gradient of decoder layer `l`: dx [n_sp, h] from dy [n_sp, h]; each weight-gradient
/// task goes to `sink`.
pub fn decoder_bwd<B: Backend>(
    ctx: &mut Ctx<B>,
    l: &BlockLayout,
    p: View<'_, B::Tensor>,
    (experts, ad): (Experts<B>, Adapters<B>),
    mut s: LayerSaved<B>,
    dy: B::Tensor,
    sink: &mut Sink<B>,
) -> Result<B::Tensor, ExecError> {
    match s.hybrid.take() {
        Some(hs) => hybrid_bwd(ctx, l, p, experts, (*hs, s.x), dy, sink),
        None => layer_bwd(ctx, l, p, (experts, ad), s, dy, sink),
    }
}

/// Forward of hybrid layer `l` of kind `kind` on the residual shard `x` [n_sp, h].
fn hybrid_fwd<B: Backend>(
    ctx: &mut Ctx<B>,
    l: &BlockLayout,
    p: View<'_, B::Tensor>,
    experts: Experts<B>,
    kind: HybridLayer,
    x: B::Tensor,
) -> Result<(B::Tensor, LayerSaved<B>), ExecError> {
    let layer = layer_index(l);
    let a = Category::Activations;
    let ad: Adapters<B> = None;
    let mut ls = LoraSaved::default();
    let (out, hs) = match kind {
        HybridLayer::Mamba => {
            let (y, ms) = mamba_fwd(ctx, l, &p, layer, &x)?;
            (y, HybridSaved::Mamba(ms))
        }
        HybridLayer::Attention => {
            let keep = keep(ctx);
            let (o, parts, mask) = attention_fwd(ctx, l, &p, (&ad, &mut ls), keep, &x)?;
            let mut y = ctx.zeros(a, &[ctx.n_sp, ctx.rd.h])?;
            ctx.ops.add(&x, &o, &mut y)?;
            (y, HybridSaved::Attention { parts, mask })
        }
        HybridLayer::Mlp | HybridLayer::Moe => {
            let (mut o, ln2, u, act, moe) = ffn_fwd(ctx, l, &p, experts, (&ad, &mut ls), &x)?;
            let mask = hidden_dropout(ctx, layer, DropoutSite::Mlp, &mut o)?;
            let mut y = ctx.zeros(a, &[ctx.n_sp, ctx.rd.h])?;
            ctx.ops.add(&x, &o, &mut y)?;
            let hs = HybridSaved::Ffn {
                ln2,
                u,
                act,
                moe,
                mask,
            };
            (y, hs)
        }
    };
    let e = || ctx.zeros(a, &[0]);
    let saved = LayerSaved {
        x,
        ln1: e()?,
        q: e()?,
        k: e()?,
        v: e()?,
        attn: AttnSaved::None,
        o: e()?,
        x1: e()?,
        ln2: e()?,
        u: e()?,
        act: e()?,
        moe: None,
        mla: None,
        lora: None,
        masks: [None, None],
        qk: None,
        hybrid: Some(Box::new(hs)),
    };
    Ok((out, saved))
}

/// Input gradient of hybrid layer `l` (input `x`) from dy [n_sp, h].
fn hybrid_bwd<B: Backend>(
    ctx: &mut Ctx<B>,
    l: &BlockLayout,
    p: View<'_, B::Tensor>,
    experts: Experts<B>,
    (hs, x): (HybridSaved<B>, B::Tensor),
    dy: B::Tensor,
    sink: &mut Sink<B>,
) -> Result<B::Tensor, ExecError> {
    let ad: Adapters<B> = None;
    let mut ls = LoraSaved::default();
    match hs {
        HybridSaved::Mamba(ms) => mamba_bwd(ctx, l, &p, ms, x, dy, sink),
        HybridSaved::Attention { parts, mask } => {
            let lora = (&ad, &mut ls);
            let d_ln1 = attention_bwd(ctx, l, &p, (parts, mask), &dy, lora, sink)?;
            norm_bwd(ctx, l, &p, ATTN_NORM, (x, d_ln1), dy, sink)
        }
        HybridSaved::Ffn {
            ln2,
            u,
            act,
            moe,
            mask,
        } => {
            let d = dropout_grad(ctx, mask.as_ref(), &dy)?;
            drop(mask);
            let dyv = d.as_ref().unwrap_or(&dy);
            let lora = (&ad, &mut ls);
            let d_ln2 = match (moe, experts) {
                (Some(ms), Some(ex)) => {
                    moe_bwd(ctx, (l, p.clone()), ex, (ln2, *ms), dyv, lora, sink)?
                }
                (None, None) => mlp_bwd(ctx, l, &p, lora, (ln2, u, act), dyv, sink)?,
                _ => return Err(StateError::MoeSavedMismatch.into()),
            };
            drop(d);
            norm_bwd(ctx, l, &p, MLP_NORM, (x, d_ln2), dy, sink)
        }
    }
}
