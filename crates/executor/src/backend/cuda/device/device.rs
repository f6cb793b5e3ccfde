//! One rank's CUDA device: allocation from the caching pool (zero-filled), upload and
//! download, the linear layers' GEMMs on cuBLASLt, same-dtype copies, events on the compute
//! stream, and the memory report (the tracker's categories next to the pool's reserved bytes
//! and the driver's `cuMemGetInfo`). Work is queued on the compute stream; only a download
//! waits for it.

use crate::backend::cuda::device::context::{drv, RankGpu};
use crate::backend::cuda::device::matmul::{operands, GemmArgs, GemmDesc, LinearInputs, LinearOp};
use crate::backend::cuda::device::pool::PoolError;
use crate::backend::cuda::device::tensor::{from_device_bytes, to_device_bytes, CudaTensor};
use crate::backend::cuda::diag::error::CudaError;
use crate::backend::cuda::diag::probe::Library;
use crate::backend::{DeviceTensor, View, ViewMut};
use crate::tracker::{Category, MemoryTracker};
use cudarc::driver::{result as dr, CudaEvent};
use parsim_plan::run_report::MemoryBreakdown;
use parsim_plan::DType;
use std::cell::Cell;

/// The rank's memory as the run report shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceMemory {
    /// Requested bytes by category at the peak (the engine's prediction's terms).
    pub peak: MemoryBreakdown,
    /// Bytes the pool holds from the device now and at most.
    pub reserved_bytes: u64,
    pub peak_reserved_bytes: u64,
    /// The GPU's used bytes by the driver (every process and context on it) and its total.
    pub driver_used_bytes: u64,
    pub driver_total_bytes: u64,
}

/// One rank's device (each rank has its own streams, pool and cuBLASLt handle, also when
/// ranks share a GPU).
pub struct CudaDevice {
    pub gpu: RankGpu,
    tracker: MemoryTracker,
    /// FLOPs and seconds of the GEMMs (seconds from events, filled by the step timer).
    gemm: Cell<(f64, f64)>,
}

fn pool_err(e: PoolError) -> CudaError {
    match e {
        PoolError::Cuda(c) => c,
        oom @ PoolError::OutOfMemory { .. } => {
            CudaError::call(Library::Driver, "cuMemAlloc", oom.to_string())
        }
    }
}

impl CudaDevice {
    pub fn new(gpu: RankGpu) -> CudaDevice {
        CudaDevice {
            gpu,
            tracker: MemoryTracker::new(),
            gemm: Cell::new((0.0, 0.0)),
        }
    }

    pub fn memory(&self) -> &MemoryTracker {
        &self.tracker
    }

    fn stream(&self) -> cudarc::driver::sys::CUstream {
        self.gpu.streams.compute.cu_stream()
    }

    /// A zero-filled tensor.
    pub fn alloc(
        &self,
        cat: Category,
        dtype: DType,
        shape: &[usize],
    ) -> Result<CudaTensor, CudaError> {
        let bytes = shape.iter().product::<usize>() as u64 * dtype.size_bytes();
        let block = self
            .gpu
            .pool
            .lock()
            .map_err(|_| CudaError::call(Library::Driver, "cuMemAlloc", "pool lock poisoned"))?
            .alloc(bytes)
            .map_err(pool_err)?;
        // SAFETY: the block holds at least `bytes`; the memset is ordered on the compute
        // stream before any use of the tensor.
        unsafe { dr::memset_d8_async(block.ptr, 0, bytes as usize, self.stream()) }
            .map_err(drv("cuMemsetD8Async"))?;
        Ok(CudaTensor::new(
            block,
            self.gpu.pool.clone(),
            &self.tracker,
            cat,
            dtype,
            shape,
        ))
    }

    /// A tensor holding `data` rounded to `dtype`.
    pub fn upload(
        &self,
        cat: Category,
        dtype: DType,
        shape: &[usize],
        data: &[f32],
    ) -> Result<CudaTensor, CudaError> {
        let t = self.alloc(cat, dtype, shape)?;
        let bytes = to_device_bytes(dtype, data);
        // SAFETY: the tensor holds `bytes.len()` bytes; the stream is synchronised before
        // the host buffer is dropped.
        unsafe { dr::memcpy_htod_async(t.ptr_at(0), &bytes, self.stream()) }
            .map_err(drv("cuMemcpyHtoDAsync"))?;
        self.gpu
            .streams
            .compute
            .synchronize()
            .map_err(drv("cuStreamSynchronize"))?;
        Ok(t)
    }

    /// The elements of a view, widened to f32 (waits for the compute stream).
    pub fn download(&self, v: View<'_, CudaTensor>) -> Result<Vec<f32>, CudaError> {
        let d = v.tensor.dtype();
        let mut bytes = vec![0u8; v.len() * d.size_bytes() as usize];
        // SAFETY: the view lies inside the tensor; synchronised before `bytes` is read.
        unsafe { dr::memcpy_dtoh_async(&mut bytes, v.tensor.ptr_at(v.range.start), self.stream()) }
            .map_err(drv("cuMemcpyDtoHAsync"))?;
        self.gpu
            .streams
            .compute
            .synchronize()
            .map_err(drv("cuStreamSynchronize"))?;
        Ok(from_device_bytes(d, &bytes))
    }

    /// One of the linear layer's products, as the CPU backend's `linear_fwd` / `_dgrad` /
    /// `_wgrad` define them (`acc`: add to the output instead of overwriting it).
    pub fn linear(
        &self,
        op: LinearOp,
        dims: (usize, usize, usize),
        inputs: LinearInputs,
        (out, out_dtype): (u64, DType),
        acc: bool,
    ) -> Result<(), CudaError> {
        let g = GemmDesc::of(op, dims);
        let (a, b) = operands(op, inputs.x, inputs.w, inputs.dy);
        let operand_dtype = inputs.dtype;
        self.gpu.lt.gemm(
            &g,
            &GemmArgs {
                a,
                a_dtype: operand_dtype,
                b,
                b_dtype: operand_dtype,
                d: out,
                d_dtype: out_dtype,
                beta: if acc { 1.0 } else { 0.0 },
            },
            self.stream(),
        )?;
        let (f, s) = self.gemm.get();
        self.gemm.set((f + g.flops(), s));
        Ok(())
    }

    /// dst = src for views of one dtype (a dtype conversion is the cast kernel's work).
    pub fn copy_same_dtype(
        &self,
        src: View<'_, CudaTensor>,
        dst: ViewMut<'_, CudaTensor>,
    ) -> Result<(), CudaError> {
        let d = src.tensor.dtype();
        if d != dst.tensor.dtype() || src.len() != dst.len() {
            return Err(CudaError::call(
                Library::Driver,
                "cuMemcpyDtoDAsync",
                format!(
                    "copy of {} {:?} elements into {} {:?} elements",
                    src.len(),
                    d,
                    dst.len(),
                    dst.tensor.dtype()
                ),
            ));
        }
        // SAFETY: both views lie inside live tensors of the same dtype and length.
        unsafe {
            dr::memcpy_dtod_async(
                dst.tensor.ptr_at(dst.range.start),
                src.tensor.ptr_at(src.range.start),
                src.len() * d.size_bytes() as usize,
                self.stream(),
            )
        }
        .map_err(drv("cuMemcpyDtoDAsync"))
    }

    /// FLOPs and seconds of the GEMMs so far.
    pub fn gemm_stats(&self) -> (f64, f64) {
        self.gemm.get()
    }

    /// Adds GEMM seconds measured with events.
    pub fn add_gemm_seconds(&self, s: f64) {
        let (f, t) = self.gemm.get();
        self.gemm.set((f, t + s));
    }

    /// An event at the current point of the compute stream.
    pub fn record(&self) -> Result<CudaEvent, CudaError> {
        self.gpu.record(&self.gpu.streams.compute)
    }

    /// Makes the compute stream wait for `e`.
    pub fn wait(&self, e: &CudaEvent) -> Result<(), CudaError> {
        self.gpu.wait(&self.gpu.streams.compute, e)
    }

    /// The memory report: tracked peak by category, the pool's reserved bytes, the driver's.
    pub fn memory_report(&self) -> Result<DeviceMemory, CudaError> {
        let stats = self
            .gpu
            .pool
            .lock()
            .map_err(|_| CudaError::call(Library::Driver, "cuMemGetInfo", "pool lock poisoned"))?
            .stats();
        let (free, total) = self.gpu.mem_info()?;
        Ok(DeviceMemory {
            peak: self.tracker.peak(),
            reserved_bytes: stats.reserved_bytes,
            peak_reserved_bytes: stats.peak_reserved_bytes,
            driver_used_bytes: total - free,
            driver_total_bytes: total,
        })
    }
}
