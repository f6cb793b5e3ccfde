//! The CUDA [`Backend`]: [`Cuda`] names the tensor ([`CudaTensor`]), the event (a CUDA event on a
//! stream), the process group ([`CudaGroup`]), the device ([`CudaRank`]: one rank's GPU with its
//! loaded kernels) and the collectives ([`crate::backend::cuda::comm::collectives::CudaComm`]).
//! This file holds the [`Device`] half and the staging helpers the ops share: kernels take one
//! dtype for their main operands, so an operand of the other dtype is converted into a temporary
//! (and an output converted back), which keeps every op correct for any dtype mix the model code
//! passes, at the cost of an extra pass where the dtypes differ.

use crate::backend::cuda::comm::collectives::{CudaComm, CudaGroup, Joins};
use crate::backend::cuda::compile::kernels::Kernels;
use crate::backend::cuda::device::context::{drv, elapsed_s};
use crate::backend::cuda::device::device::CudaDevice;
use crate::backend::cuda::device::tensor::CudaTensor;
use crate::backend::cuda::diag::error::CudaError;
use crate::backend::cuda::ops::elementwise::kernel as elementwise;
use crate::backend::cuda::Cuda;
use crate::backend::ops::MambaOps;
use crate::backend::ops::*;
use crate::backend::{Backend, Device, DeviceTensor, View};
use crate::error::ExecError;
use crate::tracker::{Category, MemoryTracker};
use cudarc::driver::{result as dr, CudaEvent, CudaStream};
use parsim_plan::DType;
use std::cell::RefCell;
use std::ops::Range;
use std::sync::Arc;

/// No Mamba-2 kernels yet: the mixer's ops answer with the family's refusal (the CUDA runner
/// refuses hybrid plans before they start, `runner::cuda`).
impl MambaOps<Cuda> for CudaRank {}

impl Backend for Cuda {
    const NAME: &'static str = "cuda";
    type Tensor = CudaTensor;
    type Event = CudaEvent;
    type Group = CudaGroup;
    type Device = CudaRank;
    type Comm = CudaComm;
}

/// One rank's device: its GPU (streams, pool, cuBLASLt), the kernels loaded in its context,
/// and the events around each GEMM (read when the GEMM time is asked for).
pub struct CudaRank {
    pub dev: CudaDevice,
    pub kernels: Arc<Kernels>,
    gemm_events: RefCell<Vec<(CudaEvent, CudaEvent)>>,
    /// Overlapped collectives the compute stream joins at the next action boundary.
    joins: Arc<Joins<CudaEvent>>,
}

/// An operand at the dtype a kernel takes: the tensor's own address, or a converted
/// temporary that lives as long as this value.
pub struct Staged {
    pub ptr: u64,
    temp: Option<CudaTensor>,
}

impl CudaRank {
    pub fn new(dev: CudaDevice, kernels: Arc<Kernels>, joins: Arc<Joins<CudaEvent>>) -> CudaRank {
        CudaRank {
            dev,
            kernels,
            gemm_events: RefCell::new(Vec::new()),
            joins,
        }
    }

    /// The compute stream every op is queued on.
    pub fn s(&self) -> &CudaStream {
        &self.dev.gpu.streams.compute
    }

    pub fn k(&self) -> &Kernels {
        &self.kernels
    }

    /// A zero-filled temporary of `n` elements (counted as a buffer).
    pub fn temp(&self, dtype: DType, n: usize) -> Result<CudaTensor, CudaError> {
        self.dev.alloc(Category::Buffers, dtype, &[n])
    }

    /// `n` elements at `src` (of `sd`) into `dst` (of `dd`): a copy, or the cast kernel.
    pub fn convert(
        &self,
        src: u64,
        sd: DType,
        dst: u64,
        dd: DType,
        n: usize,
    ) -> Result<(), CudaError> {
        if n == 0 {
            return Ok(());
        }
        let (s, k) = (self.s(), self.k());
        // SAFETY: the callers pass addresses of live tensors holding `n` elements of the
        // dtypes named, ordered on the compute stream.
        unsafe {
            match (sd, dd) {
                (DType::F32, DType::Bf16) => elementwise::cast_f32_to_bf16(s, k, src, dst, n),
                (DType::Bf16, DType::F32) => elementwise::cast_bf16_to_f32(s, k, src, dst, n),
                _ if src == dst => Ok(()),
                _ => dr::memcpy_dtod_async(dst, src, n * sd.size_bytes() as usize, s.cu_stream())
                    .map_err(drv("cuMemcpyDtoDAsync")),
            }
        }
    }

    /// Elements `r` of `t`, read as `want`.
    pub fn input_at(
        &self,
        t: &CudaTensor,
        r: Range<usize>,
        want: DType,
    ) -> Result<Staged, CudaError> {
        if t.dtype() == want {
            return Ok(Staged {
                ptr: t.ptr_at(r.start),
                temp: None,
            });
        }
        let tmp = self.temp(want, r.len())?;
        self.convert(t.ptr_at(r.start), t.dtype(), tmp.ptr_at(0), want, r.len())?;
        Ok(Staged {
            ptr: tmp.ptr_at(0),
            temp: Some(tmp),
        })
    }

    /// The whole of `t` read as `want`.
    pub fn input(&self, t: &CudaTensor, want: DType) -> Result<Staged, CudaError> {
        self.input_at(t, 0..t.len(), want)
    }

    /// A view read as `want`.
    pub fn input_view(&self, v: &View<'_, CudaTensor>, want: DType) -> Result<Staged, CudaError> {
        self.input_at(v.tensor, v.range.clone(), want)
    }

    /// Elements `r` of `t` written as `want`; with `keep`, the temporary starts with their
    /// current values (an accumulating or in-place kernel). Pair with [`CudaRank::store`].
    pub fn output_at(
        &self,
        t: &CudaTensor,
        r: Range<usize>,
        want: DType,
        keep: bool,
    ) -> Result<Staged, CudaError> {
        if t.dtype() == want || !keep {
            return if t.dtype() == want {
                Ok(Staged {
                    ptr: t.ptr_at(r.start),
                    temp: None,
                })
            } else {
                let tmp = self.temp(want, r.len())?;
                Ok(Staged {
                    ptr: tmp.ptr_at(0),
                    temp: Some(tmp),
                })
            };
        }
        self.input_at(t, r, want)
    }

    /// Converts a staged output back into `t`'s elements `r` (nothing when it was direct).
    pub fn store(&self, st: Staged, t: &CudaTensor, r: Range<usize>) -> Result<(), CudaError> {
        if let Some(tmp) = &st.temp {
            self.convert(
                tmp.ptr_at(0),
                tmp.dtype(),
                t.ptr_at(r.start),
                t.dtype(),
                r.len(),
            )?;
        }
        Ok(())
    }

    /// Host indices as a device u32 array (4-byte slots of a temporary).
    pub fn upload_u32(&self, xs: &[u32]) -> Result<CudaTensor, CudaError> {
        let t = self.temp(DType::F32, xs.len())?;
        if !xs.is_empty() {
            // SAFETY: the temporary holds xs.len() 4-byte slots; a copy from pageable host
            // memory has read the host buffer when the call returns.
            unsafe { dr::memcpy_htod_async(t.ptr_at(0), xs, self.s().cu_stream()) }
                .map_err(drv("cuMemcpyHtoDAsync"))?;
        }
        Ok(t)
    }

    /// Host indices (usize) as a device u32 array, refusing an index beyond u32.
    pub fn upload_index(&self, what: &str, xs: &[usize]) -> Result<CudaTensor, CudaError> {
        let v = xs
            .iter()
            .map(|&x| u32::try_from(x))
            .collect::<Result<Vec<u32>, _>>()
            .map_err(|_| {
                crate::backend::cuda::ops::launch::shape_error(
                    what,
                    "an index exceeds u32 (4 294 967 295)",
                )
            })?;
        self.upload_u32(&v)
    }

    /// Host u64 values (global token indices) as a device array (two 4-byte slots each).
    pub fn upload_u64(&self, xs: &[u64]) -> Result<CudaTensor, CudaError> {
        let t = self.temp(DType::F32, 2 * xs.len())?;
        if !xs.is_empty() {
            // SAFETY: the temporary holds 2 xs.len() 4-byte slots = xs.len() u64; a copy from
            // pageable host memory has read the host buffer when the call returns.
            unsafe { dr::memcpy_htod_async(t.ptr_at(0), xs, self.s().cu_stream()) }
                .map_err(drv("cuMemcpyHtoDAsync"))?;
        }
        Ok(t)
    }

    /// A device u32 array held in the 4-byte slots of an f32 tensor (see
    /// [`CudaRank::upload_u32`]), read back bit for bit (waits for the compute stream).
    pub fn download_u32(&self, t: &CudaTensor) -> Result<Vec<u32>, CudaError> {
        let v = self.dev.download(View::all(t))?;
        Ok(v.into_iter().map(f32::to_bits).collect())
    }

    /// Host f32 values as a device array.
    pub fn upload_f32(&self, xs: &[f32]) -> Result<CudaTensor, CudaError> {
        self.dev
            .upload(Category::Buffers, DType::F32, &[xs.len()], xs)
    }

    /// Events around one GEMM, for its time.
    pub fn gemm_begin(&self) -> Result<CudaEvent, CudaError> {
        self.dev.record()
    }

    pub fn gemm_end(&self, start: CudaEvent) -> Result<(), CudaError> {
        let end = self.dev.record()?;
        self.gemm_events.borrow_mut().push((start, end));
        Ok(())
    }
}

impl Device<Cuda> for CudaRank {
    fn memory(&self) -> &MemoryTracker {
        self.dev.memory()
    }

    fn alloc(&self, cat: Category, dtype: DType, shape: &[usize]) -> Result<CudaTensor, ExecError> {
        Ok(self.dev.alloc(cat, dtype, shape)?)
    }

    fn upload(
        &self,
        cat: Category,
        dtype: DType,
        shape: &[usize],
        data: &[f32],
    ) -> Result<CudaTensor, ExecError> {
        crate::backend::check_upload(shape, data.len())?;
        Ok(self.dev.upload(cat, dtype, shape, data)?)
    }

    fn download(&self, t: View<'_, CudaTensor>) -> Result<Vec<f32>, ExecError> {
        Ok(self.dev.download(t)?)
    }

    /// FLOPs counted at each GEMM; seconds from the events around them (read here, which
    /// waits for the last GEMM).
    fn gemm_stats(&self) -> (f64, f64) {
        let evs = std::mem::take(&mut *self.gemm_events.borrow_mut());
        let s: f64 = evs.iter().filter_map(|(a, b)| elapsed_s(a, b).ok()).sum();
        self.dev.add_gemm_seconds(s);
        self.dev.gemm_stats()
    }

    fn recat(&self, t: CudaTensor, cat: Category) -> CudaTensor {
        t.recat(cat)
    }

    /// The runner records an event before and after every action: the compute stream first
    /// joins the overlapped collectives (the gradient buckets' reduce-scatters of the last
    /// backward), so the next action sees their results and the action's time includes
    /// what of them was not hidden.
    fn record(&self) -> Result<CudaEvent, ExecError> {
        for e in self.joins.drain() {
            self.dev.wait(&e)?;
        }
        Ok(self.dev.record()?)
    }

    fn wait(&self, e: &CudaEvent) -> Result<(), ExecError> {
        Ok(self.dev.wait(e)?)
    }

    fn elapsed_s(&self, start: &CudaEvent, end: &CudaEvent) -> Result<f64, ExecError> {
        Ok(elapsed_s(start, end)?)
    }

    /// The tensor-core kernels (flash_mma.cu) where they take the shape, the scalar ones
    /// (flash.cu) elsewhere; the tensors' alignment, which the pool's blocks meet, is not
    /// known here.
    fn attention_kernel(&self, dtype: DType, sh: &BlockShape) -> &'static str {
        if crate::backend::cuda::ops::flash::mma::supports(dtype, sh, &[], &[]) {
            "flash_mma"
        } else {
            "flash_scalar"
        }
    }
}
