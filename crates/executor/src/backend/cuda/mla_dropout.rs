//! Two of the model's reshaping and masking ops on device kernels: MLA's per-head concat and
//! split (kernels/heads.cu, CPU twin cpu/ops/mla.rs) and Philox dropout in place
//! (kernels/dropout.cu, CPU twin cpu/ops/dropout.rs).

use super::error::CudaError;
use super::launch::{dropout as drop_k, heads};
use super::rank::CudaRank;
use super::tensor::CudaTensor;
use crate::backend::cpu::ops::dropout as host_dropout;
use crate::backend::{DeviceTensor, ViewMut};
use crate::error::ExecError;
use crate::rng::DropoutKey;

/// out [n, heads, da + db] from a and b (at out's dtype).
pub fn heads_concat(
    r: &CudaRank,
    a: &CudaTensor,
    b: &CudaTensor,
    heads: usize,
    out: &mut CudaTensor,
) -> Result<(), CudaError> {
    let dt = out.dtype();
    let (sa, sb) = (r.input(a, dt)?, r.input(b, dt)?);
    // SAFETY: a, b staged at out's dtype with their own lengths; out its own.
    unsafe {
        heads::concat(
            r.s(),
            r.k(),
            dt,
            (sa.ptr, a.len()),
            (sb.ptr, b.len()),
            (out.ptr_at(0), out.len()),
            out.rows(),
            heads,
        )
    }
}

/// The backward of [`heads_concat`]: da and db from dout (at dout's dtype).
pub fn heads_split(
    r: &CudaRank,
    dout: &CudaTensor,
    heads: usize,
    da: &mut CudaTensor,
    db: &mut CudaTensor,
) -> Result<(), CudaError> {
    let dt = dout.dtype();
    let oa = r.output_at(da, 0..da.len(), dt, false)?;
    let ob = r.output_at(db, 0..db.len(), dt, false)?;
    // SAFETY: dout, and da, db staged at dout's dtype, with their own lengths.
    unsafe {
        heads::split(
            r.s(),
            r.k(),
            dt,
            (dout.ptr_at(0), dout.len()),
            (oa.ptr, da.len()),
            (ob.ptr, db.len()),
            dout.rows(),
            heads,
        )
    }?;
    r.store(oa, da, 0..da.len())?;
    r.store(ob, db, 0..db.len())
}

/// Inverted dropout in place on a view: row i is global token `tokens[i]`, column j element
/// `col_offset + j`. The same key and row checks as the CPU twin, with the same errors.
pub fn dropout_inplace(
    r: &CudaRank,
    key: &DropoutKey,
    tokens: &[u64],
    col_offset: u64,
    x: ViewMut<'_, CudaTensor>,
) -> Result<(), ExecError> {
    let len = x.range.len();
    host_dropout::check(key, tokens, len)?;
    if key.p == 0.0 || len == 0 {
        return Ok(());
    }
    let toks = r.upload_u64(tokens)?;
    let dt = x.tensor.dtype();
    // SAFETY: the view's elements lie in the tensor (rows x cols of its dtype); tokens rows u64.
    unsafe {
        drop_k::dropout(
            r.s(),
            r.k(),
            dt,
            key,
            x.tensor.ptr_at(x.range.start),
            toks.ptr_at(0),
            tokens.len(),
            len / tokens.len(),
            col_offset,
        )
    }?;
    Ok(())
}
