//! One rank's GPU: its context, the compute, collective and pipeline streams (with events to
//! order them, so that a collective overlaps the computation it does not feed), the caching
//! pool over `cuMemAlloc`, the cuBLASLt handle, and the driver's own view of free memory
//! (`cuMemGetInfo`) for the run report. Every call checked; the driver is probed first since
//! cudarc panics when it is missing.

use crate::backend::cuda::device::matmul::{Lt, WORKSPACE_BYTES};
use crate::backend::cuda::device::pool::{Pool, PoolError, RawDevice};
use crate::backend::cuda::diag::error::CudaError;
use crate::backend::cuda::diag::probe::{require, Library};
use cudarc::driver::{sys, CudaContext, CudaEvent, CudaStream, DriverError};
use std::sync::{Arc, Mutex};

/// A driver error as a [`CudaError`] naming the call.
pub fn drv(call: &'static str) -> impl Fn(DriverError) -> CudaError {
    move |e| CudaError::call(Library::Driver, call, format!("{e:?}"))
}

/// The GPUs this process sees (after `CUDA_VISIBLE_DEVICES`); an error naming the library
/// when there is no driver, [`CudaError::NoDevice`] when it sees none.
pub fn visible_gpus() -> Result<u32, CudaError> {
    require(Library::Driver)?;
    let n = CudaContext::device_count().map_err(drv("cuDeviceGetCount"))?;
    if n <= 0 {
        return Err(CudaError::NoDevice {
            visible: std::env::var("CUDA_VISIBLE_DEVICES").unwrap_or_else(|_| "unset".into()),
        });
    }
    Ok(n as u32)
}

/// The name of GPU `ordinal` (`cuDeviceGetName`), for provenance.
pub fn gpu_name(ordinal: u32) -> Result<String, CudaError> {
    require(Library::Driver)?;
    cudarc::driver::result::init().map_err(drv("cuInit"))?;
    let dev = cudarc::driver::result::device::get(ordinal as i32).map_err(drv("cuDeviceGet"))?;
    cudarc::driver::result::device::get_name(dev).map_err(drv("cuDeviceGetName"))
}

/// `cuMemAlloc` / `cuMemFree` in one context.
#[derive(Debug)]
pub struct DriverMemory {
    ctx: Arc<CudaContext>,
}

impl RawDevice for DriverMemory {
    fn malloc(&mut self, bytes: u64) -> Result<Option<u64>, CudaError> {
        self.ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
        // SAFETY: a plain device allocation in the bound context; the pool frees it once.
        match unsafe { cudarc::driver::result::malloc_sync(bytes as usize) } {
            Ok(p) => Ok(Some(p)),
            Err(DriverError(sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY)) => Ok(None),
            Err(e) => Err(drv("cuMemAlloc")(e)),
        }
    }
    fn free(&mut self, ptr: u64) -> Result<(), CudaError> {
        self.ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
        // SAFETY: `ptr` came from `malloc` above and is freed once, after the device
        // finished with it (the pool's caller synchronises before emptying the cache).
        unsafe { cudarc::driver::result::free_sync(ptr) }.map_err(drv("cuMemFree"))
    }
}

/// The streams of a rank: the engine's overlap model needs compute, collectives (the DP
/// gradient reductions during backward), the CP ring exchange during attention and the
/// pipeline's sends and receives to progress independently.
pub struct Streams {
    pub compute: Arc<CudaStream>,
    pub comm: Arc<CudaStream>,
    pub pipe: Arc<CudaStream>,
    /// The CP ring's posted K/V and dK/dV exchanges (see [`crate::backend::cuda::comm::overlap`]).
    pub ring: Arc<CudaStream>,
    /// ZeRO 0/1 gradient buckets reduced during the last backward, joined at the optimizer
    /// step (apart from `comm`, so that the TP collectives of the backward still running
    /// do not queue behind them, as PyTorch gives each process group its own NCCL stream).
    pub grad: Arc<CudaStream>,
}

/// One rank's device.
pub struct RankGpu {
    pub ctx: Arc<CudaContext>,
    pub streams: Streams,
    pub pool: Arc<Mutex<Pool<DriverMemory>>>,
    pub lt: Lt,
    /// The cuBLASLt workspace (outside the tracked categories, as the engine's runtime
    /// overhead).
    workspace: u64,
}

impl RankGpu {
    /// Opens GPU `ordinal` (context, five streams, pool, cuBLASLt handle and workspace).
    pub fn open(ordinal: u32) -> Result<RankGpu, CudaError> {
        require(Library::Driver)?;
        require(Library::CublasLt)?;
        let ctx = CudaContext::new(ordinal as usize).map_err(drv("cuDevicePrimaryCtxRetain"))?;
        let stream = |ctx: &Arc<CudaContext>| ctx.new_stream().map_err(drv("cuStreamCreate"));
        let streams = Streams {
            compute: stream(&ctx)?,
            comm: stream(&ctx)?,
            pipe: stream(&ctx)?,
            ring: stream(&ctx)?,
            grad: stream(&ctx)?,
        };
        let mut pool = Pool::new(DriverMemory { ctx: ctx.clone() });
        let ws = pool.alloc(WORKSPACE_BYTES).map_err(|e| match e {
            PoolError::Cuda(c) => c,
            PoolError::OutOfMemory { .. } => {
                CudaError::call(Library::Driver, "cuMemAlloc", e.to_string())
            }
        })?;
        let lt = Lt::new(ws.ptr)?;
        Ok(RankGpu {
            ctx,
            streams,
            pool: Arc::new(Mutex::new(pool)),
            lt,
            workspace: ws.ptr,
        })
    }

    /// An event at the current end of `stream` (timing enabled for the step timer).
    pub fn record(&self, stream: &CudaStream) -> Result<CudaEvent, CudaError> {
        stream
            .record_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(drv("cuEventRecord"))
    }

    /// Makes `stream` wait for `e` (no host blocking).
    pub fn wait(&self, stream: &CudaStream, e: &CudaEvent) -> Result<(), CudaError> {
        stream.wait(e).map_err(drv("cuStreamWaitEvent"))
    }

    /// Free and total bytes of the GPU as the driver sees them (every process's use).
    pub fn mem_info(&self) -> Result<(u64, u64), CudaError> {
        self.ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
        let (free, total) = self.ctx.mem_get_info().map_err(drv("cuMemGetInfo"))?;
        Ok((free as u64, total as u64))
    }

    /// The cuBLASLt workspace's address.
    pub fn workspace(&self) -> u64 {
        self.workspace
    }
}

/// Milliseconds between two recorded events, waiting for the second: the step and phase
/// times of the run report come from these, never from host clocks around async work.
pub fn elapsed_s(start: &CudaEvent, end: &CudaEvent) -> Result<f64, CudaError> {
    end.synchronize().map_err(drv("cuEventSynchronize"))?;
    let ms = start.elapsed_ms(end).map_err(drv("cuEventElapsedTime"))?;
    Ok(ms as f64 / 1e3)
}
