//! The op trait of dropout for `CudaRank`: each op stages its operands on the rank and launches its
//! kernels.

use super::kernel;
use crate::backend::cuda::device::tensor::CudaTensor;
use crate::backend::cuda::rank::CudaRank;
use crate::backend::cuda::Cuda;
use crate::backend::ops::{DropoutOps, ElementwiseOps};
use crate::backend::{DeviceTensor, View, ViewMut};
use crate::error::ExecError;
use parsim_plan::DType;

use crate::backend::cpu::ops::dropout as host_dropout;
use crate::rng::DropoutKey;

impl DropoutOps<Cuda> for CudaRank {
    /// Inverted dropout in place on a view: row i is global token `tokens[i]`, column j element
    /// `col_offset + j`. The same key and row checks as the CPU twin, with the same errors.
    fn dropout_inplace(
        &self,
        key: &DropoutKey,
        tokens: &[u64],
        col_offset: u64,
        x: ViewMut<'_, CudaTensor>,
    ) -> Result<(), ExecError> {
        let r = self;
        let len = x.range.len();
        host_dropout::check(key, tokens, len)?;
        if key.p == 0.0 || len == 0 {
            return Ok(());
        }
        let toks = r.upload_u64(tokens)?;
        let dt = x.tensor.dtype();
        // SAFETY: the view's elements lie in the tensor (rows x cols of its dtype); tokens rows
        // u64.
        unsafe {
            kernel::dropout(
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

    /// The dropout on the device (`backend/cuda/ops/dropout/dropout.cu`); the 1-byte mask Megatron
    /// keeps is drawn on the host from the same key and uploaded (no mask-writing kernel yet).
    fn dropout_save(
        &self,
        key: &crate::rng::DropoutKey,
        tokens: &[u64],
        col_offset: u64,
        x: ViewMut<'_, CudaTensor>,
    ) -> Result<CudaTensor, ExecError> {
        let cr = self;
        let n = x.range.len();
        cr.dropout_inplace(key, tokens, col_offset, x)?;
        let mut keep = vec![0.0; n];
        key.fill_mask(tokens, col_offset, &mut keep);
        keep.iter_mut()
            .for_each(|m| *m = f32::from(u8::from(*m != 0.0)));
        crate::backend::Device::upload(
            cr,
            crate::tracker::Category::Activations,
            DType::U8,
            &[n],
            &keep,
        )
    }

    /// A host round trip (no kernel yet): the mask and the view downloaded, multiplied, written
    /// back.
    fn dropout_apply(
        &self,
        mask: &CudaTensor,
        scale: f32,
        x: ViewMut<'_, CudaTensor>,
    ) -> Result<(), ExecError> {
        let cr = self;
        use crate::backend::Device;
        let keep = cr.download(View::all(mask))?;
        let mut xh = cr.download(View {
            tensor: &*x.tensor,
            range: x.range.clone(),
        })?;
        xh.iter_mut().zip(&keep).for_each(|(v, k)| *v *= k * scale);
        let tmp = cr.upload(
            crate::tracker::Category::Buffers,
            x.tensor.dtype(),
            &[xh.len()],
            &xh,
        )?;
        cr.copy(View::all(&tmp), x)
    }
}
