//! The op trait of Ulysses' all-to-all layouts for `CudaRank`: each op stages its operands on the
//! rank and launches its kernels.

use super::kernel;
use crate::backend::cuda::device::tensor::CudaTensor;
use crate::backend::cuda::rank::CudaRank;
use crate::backend::cuda::Cuda;
use crate::backend::ops::UlyssesOps;
use crate::backend::ops::*;
use crate::backend::DeviceTensor;
use crate::error::ExecError;

impl UlyssesOps<Cuda> for CudaRank {
    fn ulysses_pack(
        &self,
        geo: &UlyssesGeo,
        from: UlyssesLayout,
        xs: &[(&CudaTensor, UlyssesPart)],
        out: &mut CudaTensor,
    ) -> Result<(), ExecError> {
        let cr = self;
        let dt = out.dtype();
        let staged = xs
            .iter()
            .map(|(t, p)| cr.input(t, dt).map(|s| (s, *p)))
            .collect::<Result<Vec<_>, _>>()?;
        let parts: Vec<_> = staged.iter().map(|(s, p)| (s.ptr, *p)).collect();
        // SAFETY: each tensor holds its part on side `from`, out the chunk buffer, of dt.
        Ok(unsafe { kernel::pack(cr.s(), cr.k(), dt, geo, from, &parts, out.ptr_at(0)) }?)
    }

    fn ulysses_unpack(
        &self,
        geo: &UlyssesGeo,
        to: UlyssesLayout,
        recv: &CudaTensor,
        parts: &[UlyssesPart],
        outs: &mut [&mut CudaTensor],
    ) -> Result<(), ExecError> {
        let cr = self;
        let dt = recv.dtype();
        let staged = outs
            .iter()
            .map(|t| cr.output_at(t, 0..t.len(), dt, false))
            .collect::<Result<Vec<_>, _>>()?;
        let ptrs: Vec<_> = staged.iter().zip(parts).map(|(s, p)| (s.ptr, *p)).collect();
        // SAFETY: recv holds the chunk buffer, each output its part on side `to`, of dt.
        unsafe { kernel::unpack(cr.s(), cr.k(), dt, geo, to, recv.ptr_at(0), &ptrs) }?;
        for (s, t) in staged.into_iter().zip(outs.iter()) {
            cr.store(s, t, 0..t.len())?;
        }
        Ok(())
    }
}
