//! The CPU backend: ranks are threads of one process, tensors fp32, matmul through
//! `matrixmultiply`, collectives over shared memory. The reference for correctness.
//!
//! Files: `tensor` (the tracked host tensor), `device` ([`Cpu`] and its [`Device`]), `ops/`
//! (the op kernels by family on host slices, and [`TensorOps`] over them), `collectives`
//! (the shared-memory world and the host-slice [`Collectives`]), `comm` (the
//! [`DeviceCollectives`] over them).
//!
//! [`Device`]: crate::backend::Device
//! [`TensorOps`]: crate::backend::TensorOps
//! [`DeviceCollectives`]: crate::backend::DeviceCollectives

pub mod collectives;
pub mod comm;
pub mod device;
pub mod ops;
pub mod tensor;

pub use crate::tracker::{Category, MemoryTracker};
pub use collectives::{Collectives, CpuComm, Group, World};
pub use device::{Cpu, CpuEvent};
use ops::gemm::GemmCounter;
pub use tensor::Tensor;

/// One rank's CPU device: its tensor ops, the allocation of its tensors, its memory tracker
/// and its GEMM counters (per rank, so ranks that share a thread, or a rank whose tensors
/// are freed on another thread, still count apart). Clones share the tracker and counters.
#[derive(Debug, Clone, Default)]
pub struct CpuOps {
    memory: MemoryTracker,
    gemm: GemmCounter,
}

impl CpuOps {
    /// A device with its own tracker and counters.
    pub fn new() -> CpuOps {
        CpuOps::default()
    }

    /// The device's memory tracker.
    pub fn memory(&self) -> &MemoryTracker {
        &self.memory
    }

    /// The device's GEMM FLOPs and seconds.
    pub fn gemm_counter(&self) -> &GemmCounter {
        &self.gemm
    }

    /// A zero-filled tensor.
    #[track_caller]
    pub fn zeros(&self, cat: Category, shape: &[usize]) -> Tensor {
        let n = shape.iter().product();
        Tensor::new(&self.memory, cat, shape, vec![0.0; n])
    }

    /// Wraps `data` (its length must be the shape's product).
    #[track_caller]
    pub fn from_vec(&self, cat: Category, shape: &[usize], data: Vec<f32>) -> Tensor {
        Tensor::new(&self.memory, cat, shape, data)
    }

    /// A tracked copy of a slice.
    #[track_caller]
    pub fn copy_of(&self, cat: Category, shape: &[usize], src: &[f32]) -> Tensor {
        Tensor::new(&self.memory, cat, shape, src.to_vec())
    }
}
