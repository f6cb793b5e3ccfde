//! Context parallelism's attention core (every other op is token-wise and runs unchanged on the
//! rank's sequence shard): the ring of K/V blocks (Liu et al. 2023, Ring Attention; zigzag as
//! Megatron's CP balances it), the all-gather of K/V (Megatron's all-gather CP), and
//! DeepSpeed-Ulysses' all-to-alls (Jacobs et al. 2023). Each needs flash attention's log-sum-exp,
//! so CP runs keep it (or recompute it under selective recomputation).

mod allgather;
mod common;
mod ring;
pub mod state;
mod ulysses;

pub use common::{CoreSaved, Grads};
pub use state::CpCtx;

use crate::backend::{Backend, DeviceTensor, Keep, TensorOps};
use crate::error::ExecError;
use crate::layers::ctx::Ctx;
use crate::plan::CpComm;
use crate::tracker::Category;
use common::shape;

/// Forward of the attention core of layer `layer` on the sequence shards `q`, `k`, `v`
/// (rotary applied): the output [n, a_r d] (the projection's input) and what backward needs.
pub fn forward<B: Backend>(
    ctx: &mut Ctx<B>,
    layer: u32,
    q: B::Tensor,
    k: B::Tensor,
    v: B::Tensor,
    keep: Keep,
) -> Result<(B::Tensor, CoreSaved<B>), ExecError> {
    let comm = ctx.cp.as_ref().map(|c| c.comm).expect("cp context");
    match comm {
        CpComm::Ring | CpComm::Zigzag => ring::forward(ctx, layer, q, k, v, keep),
        CpComm::AllGather => allgather::forward(ctx, layer, q, k, v, keep),
        CpComm::A2a => ulysses::forward(ctx, layer, q, k, v, keep),
    }
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
/// undone) from the output gradient `dout` and its [`row_delta`].
pub fn backward<B: Backend>(
    ctx: &mut Ctx<B>,
    layer: u32,
    s: CoreSaved<B>,
    delta: B::Tensor,
    dout: B::Tensor,
) -> Result<Grads<B>, ExecError> {
    let comm = ctx.cp.as_ref().map(|c| c.comm).expect("cp context");
    match comm {
        CpComm::Ring | CpComm::Zigzag => ring::backward(ctx, layer, s, delta, dout),
        CpComm::AllGather => allgather::backward(ctx, layer, s, delta, dout),
        CpComm::A2a => ulysses::backward(ctx, layer, s, delta, dout),
    }
}
