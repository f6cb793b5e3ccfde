//! The op trait of the vocab-parallel embedding for `CudaRank`: each op stages its operands on the
//! rank and launches its kernels.

use super::kernel;
use crate::backend::cuda::device::tensor::CudaTensor;
use crate::backend::cuda::ops::launch::F32;
use crate::backend::cuda::rank::CudaRank;
use crate::backend::cuda::Cuda;
use crate::backend::ops::EmbeddingOps;
use crate::backend::{DeviceTensor, View, ViewMut};
use crate::error::ExecError;

impl EmbeddingOps<Cuda> for CudaRank {
    fn embedding_gather(
        &self,
        table: View<'_, CudaTensor>,
        tokens: &[u32],
        lo: usize,
        out: &mut CudaTensor,
    ) -> Result<(), ExecError> {
        let cr = self;
        let (dt, h) = (out.dtype(), out.cols());
        let ts = cr.input_view(&table, dt)?;
        let tok = cr.upload_u32(tokens)?;
        let rows = table.len() / h.max(1);
        // SAFETY: the table holds rows x h, out tokens.len() x h, of dt.
        Ok(unsafe {
            kernel::embedding_gather(
                cr.s(),
                cr.k(),
                dt,
                ts.ptr,
                rows,
                tok.ptr_at(0),
                tokens.len(),
                lo,
                h,
                out.ptr_at(0),
            )
        }?)
    }

    fn embedding_scatter_add(
        &self,
        dy: &CudaTensor,
        tokens: &[u32],
        lo: usize,
        grad: ViewMut<'_, CudaTensor>,
    ) -> Result<(), ExecError> {
        let cr = self;
        let h = dy.cols();
        let tok = cr.upload_u32(tokens)?;
        let r = grad.range.clone();
        let gs = cr.output_at(grad.tensor, r.clone(), F32, true)?;
        // SAFETY: dy holds tokens.len() x h of its dtype, the gradient rows x h f32.
        unsafe {
            kernel::embedding_scatter_add(
                cr.s(),
                cr.k(),
                dy.dtype(),
                dy.ptr_at(0),
                tok.ptr_at(0),
                tokens.len(),
                lo,
                h,
                gs.ptr,
                r.len() / h.max(1),
            )
        }?;
        Ok(cr.store(gs, grad.tensor, r)?)
    }
}
