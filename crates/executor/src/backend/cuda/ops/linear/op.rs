//! The op trait of the linear layers, their biases and the fused projection's layout for
//! `CudaRank`: each op stages its operands on the rank and launches its kernels.

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

use crate::backend::cuda::device::matmul::{LinearInputs, LinearOp};

/// A strip of columns of a row-major buffer: the buffer at `ptr`, rows `cols` elements wide,
/// the strip starting at column `col` (in elements, or bytes where the caller says so).
#[derive(Debug, Clone, Copy)]
struct Strip {
    ptr: u64,
    cols: usize,
    col: usize,
}

impl CudaRank {
    /// One GEMM of the linear layer: operands at their dtype (the activation's), the output
    /// staged to f32 where the operands are f32 and the output bf16 (cuBLASLt takes bf16
    /// output only from bf16 inputs).
    fn gemm(
        &self,
        op: LinearOp,
        dims: (usize, usize, usize),
        inputs: LinearInputs,
        (out, range): (&CudaTensor, std::ops::Range<usize>),
        acc: bool,
    ) -> Result<(), CudaError> {
        let want = if inputs.dtype == F32 {
            F32
        } else {
            out.dtype()
        };
        let o = self.output_at(out, range.clone(), want, acc)?;
        let ev = self.gemm_begin()?;
        self.dev.linear(op, dims, inputs, (o.ptr, want), acc)?;
        self.gemm_end(ev)?;
        self.store(o, out, range)
    }

    /// Column strips of `n` rows of one dtype: dst's strip = src's, `width` columns wide
    /// (`cuMemcpy2DAsync`, the fused projection's split and merge).
    fn copy_cols(
        &self,
        src: Strip,
        dst: Strip,
        (width, n): (usize, usize),
        dt: DType,
    ) -> Result<(), CudaError> {
        if width == 0 || n == 0 {
            return Ok(());
        }
        let es = dt.size_bytes() as usize;
        let bytes = |s: Strip| Strip {
            ptr: s.ptr,
            cols: s.cols * es,
            col: s.col * es,
        };
        let p = memcpy_2d(bytes(src), bytes(dst), width * es, n);
        // SAFETY: both buffers hold n rows of their pitch.
        unsafe { sys::cuMemcpy2DAsync_v2(&p, self.s().cu_stream()) }
            .result()
            .map_err(crate::backend::cuda::device::context::drv(
                "cuMemcpy2DAsync",
            ))
    }
}

/// The descriptor of a device-to-device 2-D copy: `height` rows of `width_bytes` from `src`'s
/// strip to `dst`'s (pitches and columns in bytes). Built field by field: `CUmemorytype` has
/// no zero value, so a zeroed descriptor is invalid.
fn memcpy_2d(src: Strip, dst: Strip, width_bytes: usize, height: usize) -> sys::CUDA_MEMCPY2D {
    let (src_pitch, src_x, dst_pitch, dst_x) = (src.cols, src.col, dst.cols, dst.col);
    let (src, dst) = (src.ptr, dst.ptr);
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
        let inputs = LinearInputs {
            x: x.ptr_at(0),
            w: ws.ptr,
            dy: 0,
            dtype: od,
        };
        Ok(cr.gemm(LinearOp::Fwd, dims, inputs, (y, r), false)?)
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
        let inputs = LinearInputs {
            x: 0,
            w: ws.ptr,
            dy: dy.ptr_at(0),
            dtype: od,
        };
        Ok(cr.gemm(LinearOp::Dgrad, dims, inputs, (dx, r), acc)?)
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
        let inputs = LinearInputs {
            x: xs.ptr,
            w: 0,
            dy: dy.ptr_at(0),
            dtype: od,
        };
        Ok(cr.gemm(LinearOp::Wgrad, dims, inputs, (dw.tensor, r), true)?)
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
            let from = Strip {
                ptr: src.ptr,
                cols: c,
                col,
            };
            let to = Strip {
                ptr: t.ptr_at(0),
                cols: w,
                col: 0,
            };
            cr.copy_cols(from, to, (w, n), t.dtype())?;
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
            let from = Strip {
                ptr: src.ptr,
                cols: w,
                col: 0,
            };
            let to = Strip {
                ptr: qkv.ptr_at(0),
                cols: c,
                col,
            };
            cr.copy_cols(from, to, (w, n), dt)?;
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
        let at = |ptr, cols, col| Strip { ptr, cols, col };
        let p = memcpy_2d(at(0x1000, 96, 32), at(0x2000, 64, 0), 32, 7);
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
