//! Megatron's hidden dropout (after the embedding, the attention output projection and the
//! MLP's down projection, before the residual add) on this rank's region rows. Each row is
//! named by its global token (sample of the global batch, position in the sequence), so the
//! counter-based mask ([`crate::rng`]) is the single-rank run's whatever the TP/SP/CP/PP/DP mix.
//! The forward keeps the 1-byte keep mask for the backward, as Megatron does (and the engine
//! counts).
//!
//! Attention dropout (of the softmax probabilities, inside the flash attention) is keyed by
//! (seed, step, global layer, global query head, global query token = sample x seq + query
//! position, key position) ([`crate::rng::AttnDropout`] gives the exact Philox counter and key):
//! a TP rank's head h is global head tp_rank x heads_per_rank + h (plus the Ulysses head group),
//! so every TP split and CP layout (ring, zigzag, all-gather, Ulysses) draws the single-rank
//! mask, and backward regenerates it from the same coordinates instead of keeping it, as
//! FlashAttention-2 does. No mask is saved, as the engine's flash-attention memory assumes.

use super::blocks::{BlockKind, BlockLayout};
use super::ctx::Ctx;
use crate::backend::ops::*;
use crate::backend::{Backend, DeviceTensor, ProcessGroup, View, ViewMut};
use crate::error::ExecError;
use crate::rng::{global_token, AttnDropout, DropoutKey, DropoutSite};
use crate::tracker::Category;

/// Global batch index of the current microbatch's first sequence.
fn first_sample<B: Backend>(ctx: &Ctx<B>) -> u64 {
    (u64::from(ctx.dp_rank) * u64::from(ctx.plan.microbatches) + u64::from(ctx.mb))
        * ctx.plan.model.micro_batch as u64
}

/// The attention-dropout coordinates of global layer `layer` on this rank's heads (`head0`
/// is the TP rank's first head; Ulysses adds its head group); `None` when the rate is 0.
pub fn attention_dropout<B: Backend>(ctx: &Ctx<B>, layer: u32) -> Option<AttnDropout> {
    let m = &ctx.plan.model;
    (m.attention_dropout > 0.0).then(|| AttnDropout {
        seed: ctx.plan.seed,
        step: ctx.step,
        layer,
        p: m.attention_dropout,
        head0: (ctx.rd.tp_rank * ctx.rd.a_r) as u32,
        sample0: first_sample(ctx),
        seq: m.seq as u64,
    })
}

/// Global token indices of the rows of this rank's region ([n_sp, h]) for the current
/// microbatch: the CP rank's positions of each sample, batch-major, then the SP shard.
pub fn region_tokens<B: Backend>(ctx: &Ctx<B>) -> Vec<u64> {
    let m = &ctx.plan.model;
    let first_sample = first_sample(ctx);
    let all: Vec<u64> = (0..m.micro_batch as u64)
        .flat_map(|s| {
            ctx.positions
                .iter()
                .map(move |&p| global_token(first_sample + s, m.seq as u64, u64::from(p)))
        })
        .collect();
    let lo = if ctx.sp { ctx.tp.index() * ctx.n_sp } else { 0 };
    all[lo..lo + ctx.n_sp].to_vec()
}

/// Applies the hidden dropout of `site` at global layer `layer` to a region tensor in place
/// and returns its 1-byte keep mask (an activation), which Megatron saves for the backward;
/// `None` when the rate is 0.
pub fn hidden_dropout<B: Backend>(
    ctx: &Ctx<B>,
    layer: u32,
    site: DropoutSite,
    x: &mut B::Tensor,
) -> Result<Option<B::Tensor>, ExecError> {
    let p = ctx.plan.model.hidden_dropout;
    if p == 0.0 {
        return Ok(None);
    }
    let key = DropoutKey {
        seed: ctx.plan.seed,
        step: ctx.step,
        layer,
        site,
        p,
    };
    let tokens = region_tokens(ctx);
    ctx.ops
        .dropout_save(&key, &tokens, 0, ViewMut::all(x))
        .map(Some)
}

/// Applies a saved mask to an output gradient in place (inverted dropout's scale included).
pub fn apply_saved<B: Backend>(
    ctx: &Ctx<B>,
    mask: Option<&B::Tensor>,
    dy: &mut B::Tensor,
) -> Result<(), ExecError> {
    match mask {
        Some(m) => {
            let scale = 1.0 / (1.0 - ctx.plan.model.hidden_dropout);
            ctx.ops.dropout_apply(m, scale, ViewMut::all(dy))
        }
        None => Ok(()),
    }
}

/// The gradient of a dropped-out block output from the residual's gradient `dy` and the
/// forward's saved mask: a masked copy (`dy` itself flows on through the residual); `None`
/// when there is no mask (rate 0).
pub fn dropout_grad<B: Backend>(
    ctx: &Ctx<B>,
    mask: Option<&B::Tensor>,
    dy: &B::Tensor,
) -> Result<Option<B::Tensor>, ExecError> {
    let Some(m) = mask else { return Ok(None) };
    let mut d = ctx.zeros(Category::Buffers, dy.shape())?;
    ctx.ops.copy(View::all(dy), ViewMut::all(&mut d))?;
    apply_saved(ctx, Some(m), &mut d)?;
    Ok(Some(d))
}

/// The global decoder layer of a block (0 for the embedding and output blocks).
pub fn block_layer(l: &BlockLayout) -> u32 {
    match l.kind {
        BlockKind::Layer(i) => i,
        _ => 0,
    }
}
