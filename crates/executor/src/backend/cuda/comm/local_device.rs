//! The [`Mover`] of the shared-GPU collectives on a device: copies with `cuMemcpyAsync`
//! (unified addressing lets it read another rank's buffer, on this GPU or another of this
//! process), sums with the element-wise add kernel after copying the peer's part into the
//! member's scratch buffer, all on the member's stream, which `sync` waits for before the
//! schedule's barrier.

use crate::backend::cuda::comm::local::{Buf, Mover};
use crate::backend::cuda::device::context::drv;
use crate::backend::cuda::diag::error::CudaError;
use cudarc::driver::{sys, CudaStream};
use parsim_plan::DType;

/// The element-wise sum kernel: (stream, dtype, a, b, out, n) computes out = a + b; the
/// caller passes the kernel launch wrapper of `launch::elementwise::add`.
pub type AddKernel<'k> =
    &'k (dyn Fn(&CudaStream, DType, u64, u64, u64, usize) -> Result<(), CudaError> + Sync);

/// One member's mover.
pub struct DeviceMover<'a> {
    /// (input, output) base addresses posted by every member, in member order.
    pub posted: &'a [(u64, u64)],
    pub me: usize,
    pub dtype: DType,
    pub stream: &'a CudaStream,
    /// This member's scratch buffer, at least as long as the longest part it adds.
    pub scratch: u64,
    pub scratch_len: usize,
    pub add_kernel: AddKernel<'a>,
}

impl DeviceMover<'_> {
    fn addr(&self, member: usize, b: Buf, off: usize) -> u64 {
        let (i, o) = self.posted[member];
        let base = if b == Buf::In { i } else { o };
        base + off as u64 * self.dtype.size_bytes()
    }

    fn memcpy(&self, dst: u64, src: u64, len: usize) -> Result<(), CudaError> {
        let bytes = len * self.dtype.size_bytes() as usize;
        if bytes == 0 || dst == src {
            return Ok(());
        }
        // SAFETY: both ranges lie in posted (or scratch) buffers of at least `len`
        // elements, which no member writes in this phase (the schedule's barriers).
        unsafe { sys::cuMemcpyAsync(dst, src, bytes, self.stream.cu_stream()) }
            .result()
            .map_err(drv("cuMemcpyAsync"))
    }
}

impl Mover for DeviceMover<'_> {
    fn copy(
        &self,
        src: usize,
        sbuf: Buf,
        src_off: usize,
        dst: Buf,
        dst_off: usize,
        len: usize,
    ) -> Result<(), CudaError> {
        self.memcpy(
            self.addr(self.me, dst, dst_off),
            self.addr(src, sbuf, src_off),
            len,
        )
    }

    fn add(
        &self,
        src: usize,
        sbuf: Buf,
        src_off: usize,
        dst: Buf,
        dst_off: usize,
        len: usize,
    ) -> Result<(), CudaError> {
        if len > self.scratch_len {
            return Err(CudaError::call(
                crate::backend::cuda::diag::probe::Library::Driver,
                "cuMemcpyAsync",
                format!(
                    "shared-GPU sum of {len} elements exceeds the scratch buffer's {}",
                    self.scratch_len
                ),
            ));
        }
        self.memcpy(self.scratch, self.addr(src, sbuf, src_off), len)?;
        let own = self.addr(self.me, dst, dst_off);
        (self.add_kernel)(self.stream, self.dtype, own, self.scratch, own, len)
    }

    fn sync(&self) -> Result<(), CudaError> {
        self.stream
            .synchronize()
            .map_err(drv("cuStreamSynchronize"))
    }
}
