//! The op trait of the element-wise ops for `CudaRank`: each op stages its operands on the rank and
//! launches its kernels.

use super::kernel;
use crate::backend::cuda::device::tensor::CudaTensor;
use crate::backend::cuda::rank::CudaRank;
use crate::backend::cuda::Cuda;
use crate::backend::ops::ElementwiseOps;
use crate::backend::{DeviceTensor, View, ViewMut};
use crate::error::ExecError;

use crate::backend::cuda::ops::flash::attn;

impl ElementwiseOps<Cuda> for CudaRank {
    fn add(&self, a: &CudaTensor, b: &CudaTensor, out: &mut CudaTensor) -> Result<(), ExecError> {
        let cr = self;
        let dt = out.dtype();
        let (sa, sb) = (cr.input(a, dt)?, cr.input(b, dt)?);
        // SAFETY: three buffers of out.len() elements of dt.
        Ok(unsafe { kernel::add(cr.s(), cr.k(), dt, sa.ptr, sb.ptr, out.ptr_at(0), out.len()) }?)
    }

    fn axpy(
        &self,
        alpha: f32,
        x: View<'_, CudaTensor>,
        y: ViewMut<'_, CudaTensor>,
    ) -> Result<(), ExecError> {
        let cr = self;
        let dt = y.tensor.dtype();
        let xs = cr.input_view(&x, dt)?;
        // SAFETY: both views hold y.len() elements of dt.
        Ok(unsafe {
            kernel::axpy(
                cr.s(),
                cr.k(),
                dt,
                alpha,
                xs.ptr,
                y.tensor.ptr_at(y.range.start),
                y.len(),
            )
        }?)
    }

    fn copy(
        &self,
        src: View<'_, CudaTensor>,
        dst: ViewMut<'_, CudaTensor>,
    ) -> Result<(), ExecError> {
        let cr = self;
        crate::backend::check_copy(src.len(), dst.len())?;
        Ok(cr.convert(
            src.tensor.ptr_at(src.range.start),
            src.tensor.dtype(),
            dst.tensor.ptr_at(dst.range.start),
            dst.tensor.dtype(),
            src.len(),
        )?)
    }

    fn fill(&self, t: &mut CudaTensor, value: f32) -> Result<(), ExecError> {
        let cr = self;
        Ok(attn::fill(cr, t, value)?)
    }
}
