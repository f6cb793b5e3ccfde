//! The op trait of the norms for `CudaRank`: each op stages its operands on the rank and launches
//! its kernels.

use super::kernel;
use crate::backend::cuda::device::tensor::CudaTensor;
use crate::backend::cuda::ops::launch::F32;
use crate::backend::cuda::rank::CudaRank;
use crate::backend::cuda::Cuda;
use crate::backend::ops::{NormOps, NormSpec};
use crate::backend::{DeviceTensor, View, ViewMut};
use crate::error::ExecError;
use parsim_plan::plan::Norm;

impl NormOps<Cuda> for CudaRank {
    fn norm_fwd(
        &self,
        spec: NormSpec,
        x: &CudaTensor,
        p: View<'_, CudaTensor>,
        y: &mut CudaTensor,
    ) -> Result<(), ExecError> {
        let (cr, kind, eps) = (self, spec.kind, spec.eps);
        let dt = x.dtype();
        let ps = cr.input_view(&p, F32)?;
        let ys = cr.output_at(y, 0..y.len(), dt, false)?;
        let ln = kind == Norm::LayerNorm;
        // SAFETY: x and y hold rows x cols of dt, p the gain (and bias) in f32.
        unsafe {
            kernel::norm_fwd(
                cr.s(),
                cr.k(),
                dt,
                ln,
                x.ptr_at(0),
                ps.ptr,
                ys.ptr,
                x.rows(),
                x.cols(),
                eps,
            )
        }?;
        Ok(cr.store(ys, y, 0..y.len())?)
    }

    fn norm_dgrad(
        &self,
        spec: NormSpec,
        x: &CudaTensor,
        p: View<'_, CudaTensor>,
        dy: &CudaTensor,
        dx: &mut CudaTensor,
        acc: bool,
    ) -> Result<(), ExecError> {
        let (cr, kind, eps) = (self, spec.kind, spec.eps);
        let dt = x.dtype();
        let ps = cr.input_view(&p, F32)?;
        let dys = cr.input(dy, dt)?;
        let dxs = cr.output_at(dx, 0..dx.len(), dt, acc)?;
        let ln = kind == Norm::LayerNorm;
        // SAFETY: as norm_fwd, dy and dx like x.
        unsafe {
            kernel::norm_dgrad(
                cr.s(),
                cr.k(),
                dt,
                ln,
                x.ptr_at(0),
                ps.ptr,
                dys.ptr,
                dxs.ptr,
                x.rows(),
                x.cols(),
                eps,
                acc,
            )
        }?;
        Ok(cr.store(dxs, dx, 0..dx.len())?)
    }

    fn norm_wgrad(
        &self,
        spec: NormSpec,
        x: &CudaTensor,
        dy: &CudaTensor,
        dp: ViewMut<'_, CudaTensor>,
    ) -> Result<(), ExecError> {
        let (cr, kind, eps) = (self, spec.kind, spec.eps);
        let dt = x.dtype();
        let dys = cr.input(dy, dt)?;
        let r = dp.range.clone();
        let dps = cr.output_at(dp.tensor, r.clone(), F32, true)?;
        let ln = kind == Norm::LayerNorm;
        // SAFETY: x, dy rows x cols of dt; dp the parameter gradient in f32 (added to).
        unsafe {
            kernel::norm_wgrad(
                cr.s(),
                cr.k(),
                dt,
                ln,
                x.ptr_at(0),
                dys.ptr,
                dps.ptr,
                x.rows(),
                x.cols(),
                eps,
            )
        }?;
        Ok(cr.store(dps, dp.tensor, r)?)
    }
}
