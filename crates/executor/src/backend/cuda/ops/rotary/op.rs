//! The op trait of rotary embedding for `CudaRank`: each op stages its operands on the rank and
//! launches its kernels.

use super::kernel;
use crate::backend::cuda::device::tensor::CudaTensor;
use crate::backend::cuda::rank::CudaRank;
use crate::backend::cuda::Cuda;
use crate::backend::ops::RotaryOps;
use crate::backend::DeviceTensor;
use crate::error::ExecError;

impl RotaryOps<Cuda> for CudaRank {
    fn rotary(
        &self,
        x: &mut CudaTensor,
        heads: usize,
        positions: &[u32],
        theta: f32,
        inverse: bool,
    ) -> Result<(), ExecError> {
        let cr = self;
        let (rows, d) = (x.rows(), x.cols() / heads.max(1));
        let pos = cr.upload_u32(positions)?;
        // SAFETY: x holds rows x heads x d of its dtype; pos positions.len() u32.
        Ok(unsafe {
            kernel::rotary(
                cr.s(),
                cr.k(),
                x.dtype(),
                x.ptr_at(0),
                rows,
                heads,
                d,
                pos.ptr_at(0),
                positions.len(),
                theta,
                inverse,
            )
        }?)
    }
}
