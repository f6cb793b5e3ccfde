//! The op trait of MLA's heads for `CudaRank`: each op stages its operands on the rank and launches
//! its kernels.

use super::kernel;
use crate::backend::cuda::device::tensor::CudaTensor;
use crate::backend::cuda::rank::CudaRank;
use crate::backend::cuda::Cuda;
use crate::backend::ops::HeadsOps;
use crate::backend::DeviceTensor;
use crate::error::ExecError;

impl HeadsOps<Cuda> for CudaRank {
    /// out [n, heads, da + db] from a and b (at out's dtype).
    fn heads_concat(
        &self,
        a: &CudaTensor,
        b: &CudaTensor,
        heads: usize,
        out: &mut CudaTensor,
    ) -> Result<(), ExecError> {
        let r = self;
        let dt = out.dtype();
        let (sa, sb) = (r.input(a, dt)?, r.input(b, dt)?);
        // SAFETY: a, b staged at out's dtype with their own lengths; out its own.
        Ok(unsafe {
            kernel::concat(
                r.s(),
                r.k(),
                dt,
                (sa.ptr, a.len()),
                (sb.ptr, b.len()),
                (out.ptr_at(0), out.len()),
                out.rows(),
                heads,
            )
        }?)
    }

    /// The backward of [`heads_concat`]: da and db from dout (at dout's dtype).
    fn heads_split(
        &self,
        dout: &CudaTensor,
        heads: usize,
        da: &mut CudaTensor,
        db: &mut CudaTensor,
    ) -> Result<(), ExecError> {
        let r = self;
        let dt = dout.dtype();
        let oa = r.output_at(da, 0..da.len(), dt, false)?;
        let ob = r.output_at(db, 0..db.len(), dt, false)?;
        // SAFETY: dout, and da, db staged at dout's dtype, with their own lengths.
        unsafe {
            kernel::split(
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
        Ok(r.store(ob, db, 0..db.len())?)
    }
}
