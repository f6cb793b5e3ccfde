//! The op trait of the MLP activations for `CudaRank`: each op stages its operands on the rank and
//! launches its kernels.

use super::kernel;
use crate::backend::cuda::device::tensor::CudaTensor;
use crate::backend::cuda::rank::CudaRank;
use crate::backend::cuda::Cuda;
use crate::backend::ops::ActivationOps;
use crate::backend::DeviceTensor;
use crate::error::ExecError;
use parsim_plan::plan::Activation;

impl ActivationOps<Cuda> for CudaRank {
    fn act_fwd(
        &self,
        kind: Activation,
        u: &CudaTensor,
        out: &mut CudaTensor,
    ) -> Result<(), ExecError> {
        let cr = self;
        let dt = out.dtype();
        let us = cr.input(u, dt)?;
        let (n, f) = (out.rows(), out.cols());
        // SAFETY: u holds n x (f or 2f), out n x f, of dt.
        Ok(unsafe { kernel::act_fwd(cr.s(), cr.k(), dt, kind, us.ptr, out.ptr_at(0), n, f) }?)
    }

    fn act_bwd_inplace(
        &self,
        kind: Activation,
        u: &mut CudaTensor,
        dout: &CudaTensor,
    ) -> Result<(), ExecError> {
        let cr = self;
        let dt = u.dtype();
        let ds = cr.input(dout, dt)?;
        let du = cr.temp(dt, u.len())?;
        let (n, f) = (dout.rows(), dout.cols());
        // SAFETY: u and du hold n x (f or 2f), dout n x f, of dt.
        unsafe {
            kernel::act_bwd(
                cr.s(),
                cr.k(),
                dt,
                kind,
                u.ptr_at(0),
                ds.ptr,
                du.ptr_at(0),
                n,
                f,
            )
        }?;
        Ok(cr.convert(du.ptr_at(0), dt, u.ptr_at(0), dt, u.len())?)
    }
}
