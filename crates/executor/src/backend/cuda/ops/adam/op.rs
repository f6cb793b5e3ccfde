//! The op trait of the optimizer step for `CudaRank`: each op stages its operands on the rank and
//! launches its kernels.

use super::kernel;
use crate::backend::cuda::device::tensor::CudaTensor;
use crate::backend::cuda::ops::launch::F32;
use crate::backend::cuda::rank::CudaRank;
use crate::backend::cuda::Cuda;
use crate::backend::ops::{AdamOps, AdamState};
use crate::backend::DeviceTensor;
use crate::error::ExecError;
use parsim_plan::plan::AdamConfig;
use parsim_plan::DType;

impl AdamOps<Cuda> for CudaRank {
    fn adam(&self, c: &AdamConfig, t: u32, s: AdamState<'_, CudaTensor>) -> Result<(), ExecError> {
        let cr = self;
        let AdamState {
            p,
            g,
            m,
            v,
            weight_copy,
        } = s;
        let n = p.len();
        let rp = p.range.clone();
        let ps = cr.output_at(p.tensor, rp.clone(), F32, true)?;
        let gs = cr.input_view(&g, F32)?;
        let ms = cr.output_at(m, 0..m.len(), F32, true)?;
        let vs = cr.output_at(v, 0..v.len(), F32, true)?;
        // The fused bf16 copy where the copy is bf16; an fp32 copy is a plain copy after.
        let fused = weight_copy
            .as_ref()
            .filter(|w| w.tensor.dtype() == DType::Bf16)
            .map_or(0, |w| w.tensor.ptr_at(w.range.start));
        // SAFETY: p, g, m, v hold n f32; the copy n bf16 or is null.
        unsafe {
            kernel::adam_step(
                cr.s(),
                cr.k(),
                c,
                t,
                ps.ptr,
                gs.ptr,
                ms.ptr,
                vs.ptr,
                n,
                fused,
            )
        }?;
        if let Some(w) = weight_copy.filter(|w| w.tensor.dtype() != DType::Bf16) {
            cr.convert(ps.ptr, F32, w.tensor.ptr_at(w.range.start), F32, n)?;
        }
        cr.store(ms, m, 0..m.len())?;
        cr.store(vs, v, 0..v.len())?;
        Ok(cr.store(ps, p.tensor, rp)?)
    }
}
