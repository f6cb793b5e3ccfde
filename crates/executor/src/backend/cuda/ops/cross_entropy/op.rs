//! The op trait of the vocab-parallel cross-entropy pieces for `CudaRank`: each op stages its
//! operands on the rank and launches its kernels.

use super::kernel;
use crate::backend::cuda::device::tensor::CudaTensor;
use crate::backend::cuda::ops::launch::F32;
use crate::backend::cuda::rank::CudaRank;
use crate::backend::cuda::Cuda;
use crate::backend::ops::CrossEntropyOps;
use crate::backend::{DeviceTensor, View};
use crate::error::ExecError;

impl CrossEntropyOps<Cuda> for CudaRank {
    fn ce_row_max(&self, logits: &CudaTensor, max: &mut CudaTensor) -> Result<(), ExecError> {
        let cr = self;
        let ms = cr.output_at(max, 0..max.len(), F32, false)?;
        // SAFETY: logits n x v of their dtype, max n f32.
        unsafe {
            kernel::ce_row_max(
                cr.s(),
                cr.k(),
                logits.dtype(),
                logits.ptr_at(0),
                logits.rows(),
                logits.cols(),
                ms.ptr,
            )
        }?;
        Ok(cr.store(ms, max, 0..max.len())?)
    }

    fn ce_exp(
        &self,
        logits: &CudaTensor,
        max: &CudaTensor,
        probs: &mut CudaTensor,
        sum: &mut CudaTensor,
    ) -> Result<(), ExecError> {
        let cr = self;
        let ms = cr.input(max, F32)?;
        let ps = cr.output_at(probs, 0..probs.len(), F32, false)?;
        let ss = cr.output_at(sum, 0..sum.len(), F32, false)?;
        // SAFETY: logits n x v of their dtype; probs n x v, max and sum n, f32.
        unsafe {
            kernel::ce_exp_rows(
                cr.s(),
                cr.k(),
                logits.dtype(),
                logits.ptr_at(0),
                logits.rows(),
                logits.cols(),
                ms.ptr,
                ps.ptr,
                ss.ptr,
            )
        }?;
        cr.store(ps, probs, 0..probs.len())?;
        Ok(cr.store(ss, sum, 0..sum.len())?)
    }

    fn ce_target_logit(
        &self,
        logits: &CudaTensor,
        targets: &[u32],
        lo: usize,
        out: &mut CudaTensor,
    ) -> Result<(), ExecError> {
        let cr = self;
        let t = cr.upload_u32(targets)?;
        let os = cr.output_at(out, 0..out.len(), F32, false)?;
        // SAFETY: logits n x v of their dtype, targets n u32, out n f32.
        unsafe {
            kernel::ce_target_logit(
                cr.s(),
                cr.k(),
                logits.dtype(),
                logits.ptr_at(0),
                logits.rows(),
                logits.cols(),
                t.ptr_at(0),
                lo,
                os.ptr,
            )
        }?;
        Ok(cr.store(os, out, 0..out.len())?)
    }

    fn ce_loss(
        &self,
        probs: &mut CudaTensor,
        sum: &CudaTensor,
        max: &CudaTensor,
        target_logit: &CudaTensor,
    ) -> Result<f64, ExecError> {
        let cr = self;
        let n = probs.rows();
        let ps = cr.output_at(probs, 0..probs.len(), F32, true)?;
        let (ss, ms, ts) = (
            cr.input(sum, F32)?,
            cr.input(max, F32)?,
            cr.input(target_logit, F32)?,
        );
        let rows = cr.temp(F32, n)?;
        // SAFETY: probs n x v, the others n, f32.
        unsafe {
            kernel::ce_loss(
                cr.s(),
                cr.k(),
                ps.ptr,
                n,
                probs.cols(),
                ss.ptr,
                ms.ptr,
                ts.ptr,
                rows.ptr_at(0),
            )
        }?;
        cr.store(ps, probs, 0..probs.len())?;
        let host = cr.dev.download(View::all(&rows))?;
        Ok(host.iter().map(|&x| x as f64).sum())
    }

    fn ce_grad(
        &self,
        probs: &mut CudaTensor,
        targets: &[u32],
        lo: usize,
        scale: f32,
    ) -> Result<(), ExecError> {
        let cr = self;
        let t = cr.upload_u32(targets)?;
        let ps = cr.output_at(probs, 0..probs.len(), F32, true)?;
        // SAFETY: probs n x v f32, targets n u32.
        unsafe {
            kernel::ce_grad(
                cr.s(),
                cr.k(),
                ps.ptr,
                probs.rows(),
                probs.cols(),
                t.ptr_at(0),
                lo,
                scale,
            )
        }?;
        Ok(cr.store(ps, probs, 0..probs.len())?)
    }
}
