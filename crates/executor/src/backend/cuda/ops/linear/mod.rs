//! The linear layers on cuBLASLt ([`matmul`]): forward, input and weight gradients, the bias
//! as rank-1 GEMMs, and the fused projection's split and merge as 2-D copies.

pub mod matmul;

use crate::backend::cuda::device::tensor::CudaTensor;
use crate::backend::cuda::diag::error::CudaError;
use crate::backend::cuda::ops::launch::F32;
use crate::backend::cuda::rank::CudaRank;
use crate::backend::cuda::Cuda;
use crate::backend::ops::{BiasOps, LayoutOps, LinearOps};
use crate::backend::{DeviceTensor, View, ViewMut};
use crate::error::ExecError;
use cudarc::driver::sys;
use parsim_plan::DType;

use matmul::LinearOp;

impl CudaRank {
    /// One GEMM of the linear layer: operands at `od` (the activation's dtype), the output
    /// staged to f32 where the operands are f32 and the output bf16 (cuBLASLt takes bf16
    /// output only from bf16 inputs).
    #[allow(clippy::too_many_arguments)]
    fn gemm(
        &self,
        op: LinearOp,
        dims: (usize, usize, usize),
        od: DType,
        x: u64,
        w: u64,
        dy: u64,
        out: &CudaTensor,
        range: std::ops::Range<usize>,
        acc: bool,
    ) -> Result<(), CudaError> {
        let want = if od == F32 { F32 } else { out.dtype() };
        let o = self.output_at(out, range.clone(), want, acc)?;
        let ev = self.gemm_begin()?;
        self.dev.linear(op, dims, x, w, dy, od, o.ptr, want, acc)?;
        self.gemm_end(ev)?;
        self.store(o, out, range)
    }

    /// Column blocks of rows: dst[:, dst_col..+width] = src[:, src_col..+width] over `n` rows
    /// of one dtype (`cuMemcpy2DAsync`, the fused projection's split and merge).
    #[allow(clippy::too_many_arguments)]
    fn copy_cols(
        &self,
        src: u64,
        src_cols: usize,
        src_col: usize,
        dst: u64,
        dst_cols: usize,
        dst_col: usize,
        width: usize,
        n: usize,
        dt: DType,
    ) -> Result<(), CudaError> {
        if width == 0 || n == 0 {
            return Ok(());
        }
        let es = dt.size_bytes() as usize;
        let p = memcpy_2d(
            src,
            src_cols * es,
            src_col * es,
            dst,
            dst_cols * es,
            dst_col * es,
            width * es,
            n,
        );
        // SAFETY: both buffers hold n rows of their pitch.
        unsafe { sys::cuMemcpy2DAsync_v2(&p, self.s().cu_stream()) }
            .result()
            .map_err(crate::backend::cuda::device::context::drv(
                "cuMemcpy2DAsync",
            ))
    }
}

/// The descriptor of a device-to-device 2-D copy: `height` rows of `width_bytes` from column
/// byte `src_x` of rows `src_pitch` apart to column byte `dst_x` of rows `dst_pitch` apart.
/// Built field by field: `CUmemorytype` has no zero value, so a zeroed descriptor is invalid.
#[allow(clippy::too_many_arguments)]
fn memcpy_2d(
    src: u64,
    src_pitch: usize,
    src_x: usize,
    dst: u64,
    dst_pitch: usize,
    dst_x: usize,
    width_bytes: usize,
    height: usize,
) -> sys::CUDA_MEMCPY2D {
    sys::CUDA_MEMCPY2D {
        srcXInBytes: src_x,
        srcY: 0,
        srcMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
        srcHost: std::ptr::null(),
        srcDevice: src,
        srcArray: std::ptr::null_mut(),
        srcPitch: src_pitch,
        dstXInBytes: dst_x,
        dstY: 0,
        dstMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
        dstHost: std::ptr::null_mut(),
        dstDevice: dst,
        dstArray: std::ptr::null_mut(),
        dstPitch: dst_pitch,
        WidthInBytes: width_bytes,
        Height: height,
    }
}

impl LinearOps<Cuda> for CudaRank {
    fn linear_fwd(
        &self,
        x: &CudaTensor,
        w: View<'_, CudaTensor>,
        dims: (usize, usize, usize),
        y: &mut CudaTensor,
    ) -> Result<(), ExecError> {
        let cr = self;
        let od = x.dtype();
        let ws = cr.input_view(&w, od)?;
        let r = 0..y.len();
        Ok(cr.gemm(LinearOp::Fwd, dims, od, x.ptr_at(0), ws.ptr, 0, y, r, false)?)
    }

    fn linear_dgrad(
        &self,
        dy: &CudaTensor,
        w: View<'_, CudaTensor>,
        dims: (usize, usize, usize),
        dx: &mut CudaTensor,
        acc: bool,
    ) -> Result<(), ExecError> {
        let cr = self;
        let od = dy.dtype();
        let ws = cr.input_view(&w, od)?;
        let r = 0..dx.len();
        Ok(cr.gemm(
            LinearOp::Dgrad,
            dims,
            od,
            0,
            ws.ptr,
            dy.ptr_at(0),
            dx,
            r,
            acc,
        )?)
    }

    fn linear_wgrad(
        &self,
        dy: &CudaTensor,
        x: &CudaTensor,
        dims: (usize, usize, usize),
        dw: ViewMut<'_, CudaTensor>,
    ) -> Result<(), ExecError> {
        let cr = self;
        let od = dy.dtype();
        let xs = cr.input(x, od)?;
        let r = dw.range.clone();
        Ok(cr.gemm(
            LinearOp::Wgrad,
            dims,
            od,
            xs.ptr,
            0,
            dy.ptr_at(0),
            dw.tensor,
            r,
            true,
        )?)
    }
}

impl BiasOps<Cuda> for CudaRank {
    /// y[n, o] += ones[n, 1] . b[1, o]: a rank-1 GEMM through cuBLASLt (no kernel of its own).
    fn bias_add(&self, y: &mut CudaTensor, b: View<'_, CudaTensor>) -> Result<(), ExecError> {
        let cr = self;
        let o = b.range.len();
        let n = y.len() / o.max(1);
        let ones = crate::backend::Device::upload(
            cr,
            crate::tracker::Category::Buffers,
            y.dtype(),
            &[n, 1],
            &vec![1.0; n],
        )?;
        cr.linear_dgrad(&ones, b, (n, o, 1), y, true)
    }

    /// db[o, 1] += dy[n, o]^T . ones[n, 1]: the column sums as a GEMM through cuBLASLt.
    fn bias_grad(&self, dy: &CudaTensor, db: ViewMut<'_, CudaTensor>) -> Result<(), ExecError> {
        let cr = self;
        let o = db.range.len();
        let n = dy.len() / o.max(1);
        let ones = crate::backend::Device::upload(
            cr,
            crate::tracker::Category::Buffers,
            dy.dtype(),
            &[n, 1],
            &vec![1.0; n],
        )?;
        cr.linear_wgrad(dy, &ones, (n, 1, o), db)
    }
}

impl LayoutOps<Cuda> for CudaRank {
    fn qkv_split(
        &self,
        qkv: &CudaTensor,
        q: &mut CudaTensor,
        k: &mut CudaTensor,
        v: &mut CudaTensor,
    ) -> Result<(), ExecError> {
        let cr = self;
        let (n, c) = (qkv.rows(), qkv.cols());
        let mut col = 0;
        for t in [q, k, v] {
            let src = cr.input(qkv, t.dtype())?;
            let w = t.cols();
            cr.copy_cols(src.ptr, c, col, t.ptr_at(0), w, 0, w, n, t.dtype())?;
            col += w;
        }
        Ok(())
    }

    fn qkv_merge(
        &self,
        q: &CudaTensor,
        k: &CudaTensor,
        v: &CudaTensor,
        qkv: &mut CudaTensor,
    ) -> Result<(), ExecError> {
        let cr = self;
        let (n, c, dt) = (qkv.rows(), qkv.cols(), qkv.dtype());
        let mut col = 0;
        for t in [q, k, v] {
            let src = cr.input(t, dt)?;
            let w = t.cols();
            cr.copy_cols(src.ptr, w, 0, qkv.ptr_at(0), c, col, w, n, dt)?;
            col += w;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The 2-D copy descriptor is built without a GPU: device to device, the pitches, column
    /// offsets and extent as given (a zeroed descriptor aborted the first GPU run: its memory
    /// type enum has no zero value).
    #[test]
    fn memcpy_2d_descriptor_names_device_memory_and_the_extent() {
        let p = memcpy_2d(0x1000, 96, 32, 0x2000, 64, 0, 32, 7);
        assert_eq!(p.srcMemoryType, sys::CUmemorytype::CU_MEMORYTYPE_DEVICE);
        assert_eq!(p.dstMemoryType, sys::CUmemorytype::CU_MEMORYTYPE_DEVICE);
        assert_eq!(
            (p.srcDevice, p.srcPitch, p.srcXInBytes, p.srcY),
            (0x1000, 96, 32, 0)
        );
        assert_eq!(
            (p.dstDevice, p.dstPitch, p.dstXInBytes, p.dstY),
            (0x2000, 64, 0, 0)
        );
        assert_eq!((p.WidthInBytes, p.Height), (32, 7));
        assert!(p.srcHost.is_null() && p.dstHost.is_null());
    }
}
