//! Tensors of the CUDA backend: a block of the rank's caching pool with a shape, a dtype and a
//! memory category, counted by the rank's tracker (requested bytes, and the block's size as
//! reserved) from creation to drop, when the block goes back to the pool. bf16 elements are
//! stored as their upper 16 bits, rounded to nearest even on upload as the CPU twin rounds.

use crate::backend::bf16::round_bf16;
use crate::backend::cuda::device::context::{drv, DriverMemory};
use crate::backend::cuda::device::pool::{Block, Pool};
use crate::backend::DeviceTensor;
use crate::tracker::{Category, MemoryTracker};
use cudarc::driver::CudaEvent;
use parsim_plan::DType;
use std::sync::{Arc, Mutex};

/// A tracked tensor in device memory.
pub struct CudaTensor {
    block: Option<Block>,
    pool: Arc<Mutex<Pool<DriverMemory>>>,
    tracker: MemoryTracker,
    shape: Vec<usize>,
    dtype: DType,
    cat: Category,
    /// Events of other streams' work on this tensor (an overlapped collective): its block
    /// goes back to the pool only once they have passed.
    fences: Mutex<Vec<Arc<CudaEvent>>>,
}

impl DeviceTensor for CudaTensor {
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn dtype(&self) -> DType {
        self.dtype
    }
    fn category(&self) -> Category {
        self.cat
    }
}

impl CudaTensor {
    /// Wraps a pool block holding `shape` of `dtype`, counting it in `tracker`.
    pub(crate) fn new(
        block: Block,
        pool: Arc<Mutex<Pool<DriverMemory>>>,
        tracker: &MemoryTracker,
        cat: Category,
        dtype: DType,
        shape: &[usize],
    ) -> CudaTensor {
        let requested = shape.iter().product::<usize>() as u64 * dtype.size_bytes();
        tracker.alloc(cat, requested, block.size_bytes);
        CudaTensor {
            block: Some(block),
            pool,
            tracker: tracker.clone(),
            shape: shape.to_vec(),
            dtype,
            cat,
            fences: Mutex::new(Vec::new()),
        }
    }

    /// Marks the tensor as used by another stream's work up to `done`.
    pub fn fence(&self, done: Arc<CudaEvent>) {
        if let Ok(mut f) = self.fences.lock() {
            f.push(done);
        }
    }

    /// The device address of element `i` (the kernels' and libraries' view of the tensor).
    pub fn ptr_at(&self, i: usize) -> u64 {
        self.block.as_ref().map_or(0, |b| b.ptr) + i as u64 * self.dtype.size_bytes()
    }

    /// The same memory in another category (the tracker moves its bytes).
    pub fn recat(mut self, cat: Category) -> CudaTensor {
        let size = self.block.as_ref().map_or(0, |b| b.size_bytes);
        self.tracker.free(self.cat, self.size_bytes(), size);
        self.tracker.alloc(cat, self.size_bytes(), size);
        self.cat = cat;
        self
    }
}

impl Drop for CudaTensor {
    fn drop(&mut self) {
        if let Some(b) = self.block.take() {
            self.tracker.free(self.cat, self.size_bytes(), b.size_bytes);
            let fences = self
                .fences
                .get_mut()
                .map(std::mem::take)
                .unwrap_or_default();
            // A poisoned pool means a rank thread panicked; the run is failing anyway.
            if let Ok(mut p) = self.pool.lock() {
                if fences.is_empty() {
                    p.release(b);
                } else {
                    let fence = move || {
                        for e in &fences {
                            if !e.try_is_complete().map_err(drv("cuEventQuery"))? {
                                return Ok(false);
                            }
                        }
                        Ok(true)
                    };
                    p.release_when(b, Box::new(fence));
                }
            }
        }
    }
}

/// The bytes of `data` as a tensor of `dtype` holds them (bf16: rounded to nearest even,
/// upper 16 bits of the f32, little-endian).
pub fn to_device_bytes(dtype: DType, data: &[f32]) -> Vec<u8> {
    match dtype {
        DType::F32 => data.iter().flat_map(|x| x.to_le_bytes()).collect(),
        DType::Bf16 => data
            .iter()
            .flat_map(|&x| ((round_bf16(x).to_bits() >> 16) as u16).to_le_bytes())
            .collect(),
        DType::U8 => data.iter().map(|&x| x as u8).collect(),
    }
}

/// The elements of device bytes of `dtype`, widened to f32.
pub fn from_device_bytes(dtype: DType, bytes: &[u8]) -> Vec<f32> {
    match dtype {
        DType::F32 => bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
        DType::Bf16 => bytes
            .chunks_exact(2)
            .map(|c| f32::from_bits((u16::from_le_bytes([c[0], c[1]]) as u32) << 16))
            .collect(),
        DType::U8 => bytes.iter().map(|&b| f32::from(b)).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_bytes_round_like_the_cpu_twin_and_widen_exactly() {
        let xs = [
            1.0f32,
            -2.5,
            1.0 + 1.0 / 256.0,
            std::f32::consts::PI,
            1e-20,
            -65504.0,
            0.0,
        ];
        let back = from_device_bytes(DType::Bf16, &to_device_bytes(DType::Bf16, &xs));
        for (x, y) in xs.iter().zip(&back) {
            // The CPU backend's rounding, then exact widening.
            assert_eq!(*y, round_bf16(*x), "{x}");
        }
        // 1 + 2^-8 is halfway between bf16 neighbours 1 and 1 + 2^-7: ties to even gives 1.
        assert_eq!(back[2], 1.0);
        assert_eq!(to_device_bytes(DType::Bf16, &xs).len(), 2 * xs.len());
    }

    #[test]
    fn f32_bytes_round_trip_bit_exactly() {
        let xs = [f32::MIN_POSITIVE, -0.0, 123.456, f32::MAX];
        let back = from_device_bytes(DType::F32, &to_device_bytes(DType::F32, &xs));
        for (x, y) in xs.iter().zip(&back) {
            assert_eq!(x.to_bits(), y.to_bits());
        }
    }
}
