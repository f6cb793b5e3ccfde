//! What the three CP attention cores share: message tags, the saved state, the online
//! softmax's statistics, the attention shape and timing.

use crate::backend::ops::*;
use crate::backend::{Backend, Device, View, ViewMut};
use crate::error::ExecError;
use crate::layers::ctx::{zeros, Ctx};
use crate::layers::dropout::attention_dropout;
use crate::traced_ops::TracedOps;
use crate::tracker::Category;
use std::time::Instant;

/// dQ, dK and dV of the attention core.
pub type Grads<B> = (
    <B as Backend>::Tensor,
    <B as Backend>::Tensor,
    <B as Backend>::Tensor,
);

/// Which pass a message belongs to (tags must not collide between them).
#[derive(Debug, Clone, Copy)]
pub(super) enum Pass {
    Forward = 1,
    Recompute = 2,
    Backward = 3,
}

/// Message tag of a CP exchange: the top bit keeps it apart from pipeline tags.
pub(super) fn tag(layer: u32, mb: u32, pass: Pass, step: usize, part: u64) -> u64 {
    (1u64 << 63)
        | ((layer as u64) << 40)
        | ((mb as u64 & 0xFF_FFFF) << 16)
        | ((pass as u64) << 12)
        | ((step as u64 & 0xFF) << 4)
        | part
}

/// What the attention core keeps for backward under CP: Q, K, V (head shards of the whole
/// sequence with Ulysses, sequence shards otherwise) and the log-sum-exp, unless recomputed.
pub struct CoreSaved<B: Backend> {
    pub q: B::Tensor,
    pub k: B::Tensor,
    pub v: B::Tensor,
    pub attn: AttnSaved<B::Tensor>,
}

/// The running statistics of the online softmax as tracked tensors.
pub(super) struct Stats<B: Backend> {
    pub(super) max: B::Tensor,
    pub(super) sum: B::Tensor,
}

impl<B: Backend> Stats<B> {
    /// Statistics before any key: maximum -inf, sum 0.
    pub(super) fn new(ops: &TracedOps<B>, len: usize) -> Result<Stats<B>, ExecError> {
        let mut max = zeros::<B>(ops, Category::Buffers, &[len])?;
        ops.fill(&mut max, f32::NEG_INFINITY)?;
        Ok(Stats {
            max,
            sum: zeros::<B>(ops, Category::Buffers, &[len])?,
        })
    }
}

impl<B: Backend> Stats<B> {
    /// Normalises the accumulated output `acc` of `rows` query rows per sequence by the
    /// statistics; returns the log-sum-exp [b hq rows] (fp32).
    #[track_caller]
    pub(super) fn finish(
        &self,
        ops: &TracedOps<B>,
        sh: &BlockShape,
        rows: usize,
        acc: &mut B::Tensor,
    ) -> Result<B::Tensor, ExecError> {
        let mut lse = zeros::<B>(ops, Category::Buffers, &[sh.b * sh.hq * rows])?;
        ops.flash_finish(sh, rows, acc, &self.max, &self.sum, &mut lse)?;
        Ok(lse)
    }
}

/// Attention sinks under CP: folds the layer's sink logits of heads `head0..head0 + sh.hq`
/// ([`CpCtx::sinks`](crate::layers::cp_state::CpCtx::sinks), when set) into a finished output `acc` [b, rows, hq, dv] and its
/// log-sum-exp.
pub(super) fn fold_sinks<B: Backend>(
    ops: &TracedOps<B>,
    sinks: Option<&B::Tensor>,
    sh: &BlockShape,
    rows: usize,
    head0: usize,
    acc: &mut B::Tensor,
    lse: &mut B::Tensor,
) -> Result<(), ExecError> {
    match sinks {
        Some(z) => ops.attn_sink_fwd(sh, rows, acc, lse, View::all(z).sub(head0..head0 + sh.hq)),
        None => Ok(()),
    }
}

/// The sink logits' gradient of heads `head0..head0 + sh.hq` over `rows` rows per sequence,
/// from the final log-sum-exp [b, hq, rows] and D [b, rows, hq], added into
/// [`CpCtx::dsinks`](crate::layers::cp_state::CpCtx::dsinks) (when set).
pub(super) fn sinks_grad<B: Backend>(
    ctx: &mut Ctx<B>,
    sh: &BlockShape,
    rows: usize,
    head0: usize,
    lse: &B::Tensor,
    delta: &B::Tensor,
) -> Result<(), ExecError> {
    let ops = &ctx.ops;
    let cp = ctx.cp.as_mut().expect("cp context");
    if let (Some(z), Some(g)) = (cp.sinks.as_ref(), cp.dsinks.as_mut()) {
        let r = head0..head0 + sh.hq;
        let logits = View::all(z).sub(r.clone());
        ops.attn_sink_grad(sh, rows, lse, delta, logits, ViewMut::all(g).sub(r))?;
    }
    Ok(())
}

/// Runs `f`, returning its result and the seconds it took.
pub(super) fn timed<R>(f: impl FnOnce() -> R) -> (R, f64) {
    let t = Instant::now();
    let r = f();
    (r, t.elapsed().as_secs_f64())
}

/// The shape of this rank's attention (its TP share of the heads).
pub(super) fn shape<B: Backend>(ctx: &Ctx<B>) -> BlockShape {
    BlockShape {
        b: ctx.plan.model.micro_batch,
        hq: ctx.rd.a_r,
        hk: ctx.rd.g_r,
        d: ctx.rd.d,
        dv: ctx.rd.dv,
        dropout: None,
        span: parsim_plan::plan::AttnSpan::Full,
    }
}

/// [`shape`] with the attention dropout and span (window, chunk) of global layer `layer`.
pub(super) fn layer_shape<B: Backend>(ctx: &Ctx<B>, layer: u32) -> BlockShape {
    BlockShape {
        dropout: attention_dropout(ctx, layer),
        span: ctx.plan.model.span(layer),
        ..shape(ctx)
    }
}

/// The log-sum-exp to keep (`Keep::Lse`) or nothing (selective recomputation).
pub(super) fn saved_lse<B: Backend>(
    ops: &TracedOps<B>,
    keep: Keep,
    lse: B::Tensor,
) -> AttnSaved<B::Tensor> {
    match keep {
        Keep::Nothing => AttnSaved::None,
        _ => AttnSaved::Lse(ops.recat(lse, Category::Activations)),
    }
}
