//! Ops that have no CUDA kernel yet and run as a host round trip: download, the CPU twin
//! (executor/src/backend/cpu/ops), upload. Correct and slow: DeepSeek-V3's scored router and its
//! backward (whose top-k and capacity drops are host metadata anyway) and Philox dropout.

use super::rank::CudaRank;
use super::tensor::CudaTensor;
use crate::backend::cpu::ops::{dropout, mla, moe as host_moe, router};
use crate::backend::{Device, DeviceTensor, Routing, TensorOps, View, ViewMut};
use crate::error::ExecError;
use crate::memory::Category;
use crate::plan::MoeShape;
use crate::rng::DropoutKey;

/// Writes host values into a device view (through a staging tensor of the view's dtype).
fn write_back(
    rank: &CudaRank,
    data: &[f32],
    dst: ViewMut<'_, CudaTensor>,
) -> Result<(), ExecError> {
    let tmp = rank.upload(Category::Buffers, dst.tensor.dtype(), &[data.len()], data)?;
    rank.copy(View::all(&tmp), dst)
}

/// [`TensorOps::moe_route_scored`] on the host.
pub(super) fn moe_route_scored(
    rank: &CudaRank,
    logits: &mut CudaTensor,
    bias: Option<&[f32]>,
    moe: &MoeShape,
) -> Result<(Routing, f64, Vec<usize>), ExecError> {
    let (n, e) = (logits.rows(), logits.cols());
    let mut s = rank.download(View::all(logits))?;
    router::scores(&mut s, e, moe.router.score);
    let (r, chosen) = router::route(&s, n, bias, moe);
    let aux = host_moe::aux_loss(moe.aux_loss_coeff, &s, n, &r.fraction);
    write_back(rank, &s, ViewMut::all(logits))?;
    Ok((r, aux, chosen))
}

/// [`TensorOps::moe_router_scored_bwd`] on the host.
pub(super) fn moe_router_scored_bwd(
    rank: &CudaRank,
    d: &mut CudaTensor,
    scores: &CudaTensor,
    chosen: &[usize],
    moe: &MoeShape,
    fraction: &[f64],
    aux_scale: f64,
) -> Result<(), ExecError> {
    let mut dh = rank.download(View::all(d))?;
    let sh = rank.download(View::all(scores))?;
    router::router_bwd(&mut dh, &sh, chosen, moe, fraction, aux_scale);
    write_back(rank, &dh, ViewMut::all(d))
}

/// [`TensorOps::dropout_inplace`] on the host.
pub(super) fn dropout_inplace(
    rank: &CudaRank,
    key: &DropoutKey,
    tokens: &[u64],
    col_offset: u64,
    mut x: ViewMut<'_, CudaTensor>,
) -> Result<(), ExecError> {
    let mut xh = rank.download(View {
        tensor: &*x.tensor,
        range: x.range.clone(),
    })?;
    dropout::dropout_inplace(key, tokens, col_offset, &mut xh)?;
    write_back(rank, &xh, x.reborrow())
}

/// [`TensorOps::heads_concat`] on the host.
pub(super) fn heads_concat(
    rank: &CudaRank,
    a: &CudaTensor,
    b: &CudaTensor,
    heads: usize,
    out: &mut CudaTensor,
) -> Result<(), ExecError> {
    let (ah, bh) = (rank.download(View::all(a))?, rank.download(View::all(b))?);
    let mut oh = vec![0.0; out.len()];
    mla::heads_concat(&ah, &bh, &mut oh, out.rows(), heads);
    write_back(rank, &oh, ViewMut::all(out))
}

/// [`TensorOps::heads_split`] on the host.
pub(super) fn heads_split(
    rank: &CudaRank,
    dout: &CudaTensor,
    heads: usize,
    da: &mut CudaTensor,
    db: &mut CudaTensor,
) -> Result<(), ExecError> {
    let dh = rank.download(View::all(dout))?;
    let (mut ah, mut bh) = (vec![0.0; da.len()], vec![0.0; db.len()]);
    mla::heads_split(&dh, &mut ah, &mut bh, dout.rows(), heads);
    write_back(rank, &ah, ViewMut::all(da))?;
    write_back(rank, &bh, ViewMut::all(db))
}
