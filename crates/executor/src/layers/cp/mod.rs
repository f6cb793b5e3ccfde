//! Context parallelism's attention core (every other op is token-wise and runs unchanged on the
//! rank's sequence shard): the ring of K/V blocks (Liu et al. 2023, Ring Attention; zigzag as
//! Megatron's CP balances it), the all-gather of K/V (Megatron's all-gather CP), and
//! DeepSpeed-Ulysses' all-to-alls (Jacobs et al. 2023). Each needs flash attention's log-sum-exp,
//! so CP runs keep it (or recompute it under selective recomputation).

mod allgather;
mod common;
mod ring;
mod ulysses;

pub use common::{CoreSaved, Grads};

use crate::backend::ops::*;
use crate::backend::{Backend, DeviceTensor, View, ViewMut};
use crate::error::ExecError;
use crate::layers::ctx::Ctx;
use crate::layers::modern::{self, Part};
use crate::layers::wtask::{Sink, WTask};
use crate::tracker::Category;
use common::shape;
use parsim_plan::plan::CpComm;

/// Forward of the attention core of layer `layer` on the sequence shards `q`, `k`, `v`
/// (rotary applied), with the layer's attention sinks if any: the output [n, a_r d] (the
/// projection's input) and what backward needs.
pub fn forward<B: Backend>(
    ctx: &mut Ctx<B>,
    layer: u32,
    q: B::Tensor,
    k: B::Tensor,
    v: B::Tensor,
    keep: Keep,
    sinks: Option<View<'_, B::Tensor>>,
) -> Result<(B::Tensor, CoreSaved<B>), ExecError> {
    set_sinks(ctx, sinks, false)?;
    let comm = ctx.cp.as_ref().map(|c| c.comm).expect("cp context");
    let r = match comm {
        CpComm::Ring | CpComm::Zigzag => ring::forward(ctx, layer, q, k, v, keep),
        CpComm::AllGather => allgather::forward(ctx, layer, q, k, v, keep),
        CpComm::A2a => ulysses::forward(ctx, layer, q, k, v, keep),
    };
    set_sinks(ctx, None, false)?;
    r
}

/// Hands the layer's sink logits (a copy of this TP rank's heads) to the CP passes, with a
/// zeroed gradient when `grad`; `None` clears them.
fn set_sinks<B: Backend>(
    ctx: &mut Ctx<B>,
    sinks: Option<View<'_, B::Tensor>>,
    grad: bool,
) -> Result<(), ExecError> {
    let (logits, dsinks) = match sinks {
        Some(z) => {
            let mut t = ctx.zeros_f32(Category::Buffers, &[z.len()])?;
            ctx.ops.copy(z, ViewMut::all(&mut t))?;
            let g = if grad {
                Some(ctx.zeros_f32(Category::Buffers, &[t.len()])?)
            } else {
                None
            };
            (Some(t), g)
        }
        None => (None, None),
    };
    let cp = ctx.cp.as_mut().expect("cp context");
    cp.sinks = logits;
    cp.dsinks = dsinks;
    Ok(())
}

/// FlashAttention-2's D = rowsum(dO * O) per row and head of the sequence shard, [n, a_r]:
/// computed before the output `o` goes to the projection's weight gradient.
pub fn row_delta<B: Backend>(
    ctx: &Ctx<B>,
    dout: &B::Tensor,
    o: &B::Tensor,
) -> Result<B::Tensor, ExecError> {
    let sh = shape(ctx);
    let rows = dout.rows() / sh.b;
    let mut out = ctx.zeros_f32(Category::Buffers, &[sh.b * rows * sh.hq])?;
    ctx.ops.flash_delta(&sh, rows, dout, o, &mut out)?;
    Ok(out)
}

/// Backward of the attention core: dQ, dK, dV as sequence shards [n, ..] (rotary not yet
/// undone) from the output gradient `dout` and its [`row_delta`]; with attention sinks their
/// gradient (this rank's rows) goes to `sink`.
pub fn backward<B: Backend>(
    ctx: &mut Ctx<B>,
    layer: u32,
    s: CoreSaved<B>,
    delta: B::Tensor,
    dout: B::Tensor,
    sinks: Option<View<'_, B::Tensor>>,
    sink: &mut Sink<B>,
) -> Result<Grads<B>, ExecError> {
    let has_sinks = sinks.is_some();
    set_sinks(ctx, sinks, true)?;
    let comm = ctx.cp.as_ref().map(|c| c.comm).expect("cp context");
    let r = match comm {
        CpComm::Ring | CpComm::Zigzag => ring::backward(ctx, layer, s, delta, dout),
        CpComm::AllGather => allgather::backward(ctx, layer, s, delta, dout),
        CpComm::A2a => ulysses::backward(ctx, layer, s, delta, dout),
    };
    let g = ctx.cp.as_mut().and_then(|c| c.dsinks.take());
    set_sinks(ctx, None, false)?;
    let r = r?;
    if let (true, Some(grad)) = (has_sinks, g) {
        let tensor = modern::tensor(&ctx.plan.model, layer, Part::Sinks)
            .ok_or(crate::error::StateError::SinksWithoutLse)?;
        sink(ctx, WTask::Ready { tensor, grad })?;
    }
    Ok(r)
}
