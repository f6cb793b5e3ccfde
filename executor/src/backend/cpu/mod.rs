//! The CPU backend: ranks are threads of one process, tensors fp32, matmul through
//! `matrixmultiply`, collectives over shared memory. The reference for correctness.

pub mod collectives;
pub mod device;
pub mod ops;
pub mod tensor;

use super::HostOps;
use crate::plan::{Activation, AdamConfig, Norm};

pub use crate::memory::{Category, MemoryBreakdown, MemoryTracker};
pub use collectives::{CpuComm, Group, World};
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

impl HostOps for CpuOps {
    fn linear_fwd(&self, x: &[f32], w: &[f32], n: usize, i: usize, o: usize, y: &mut [f32]) {
        ops::gemm::linear_fwd(&self.gemm, x, w, n, i, o, y)
    }
    fn linear_dgrad(
        &self,
        dy: &[f32],
        w: &[f32],
        n: usize,
        i: usize,
        o: usize,
        dx: &mut [f32],
        acc: bool,
    ) {
        ops::gemm::linear_dgrad(&self.gemm, dy, w, n, i, o, dx, acc)
    }
    fn linear_wgrad(&self, dy: &[f32], x: &[f32], n: usize, i: usize, o: usize, dw: &mut [f32]) {
        ops::gemm::linear_wgrad(&self.gemm, dy, x, n, i, o, dw)
    }
    fn norm_fwd(&self, kind: Norm, x: &[f32], p: &[f32], h: usize, eps: f32, y: &mut [f32]) {
        ops::norm::norm_fwd(kind, x, p, h, eps, y)
    }
    fn norm_dgrad(
        &self,
        kind: Norm,
        x: &[f32],
        p: &[f32],
        dy: &[f32],
        h: usize,
        eps: f32,
        dx: &mut [f32],
    ) {
        ops::norm::norm_dgrad(kind, x, p, dy, h, eps, dx)
    }
    fn norm_dgrad_acc(
        &self,
        kind: Norm,
        x: &[f32],
        p: &[f32],
        dy: &[f32],
        h: usize,
        eps: f32,
        dx: &mut [f32],
    ) {
        ops::norm::norm_dgrad_acc(kind, x, p, dy, h, eps, dx)
    }
    fn norm_wgrad(&self, kind: Norm, x: &[f32], dy: &[f32], h: usize, eps: f32, dp: &mut [f32]) {
        ops::norm::norm_wgrad(kind, x, dy, h, eps, dp)
    }
    fn rotary(
        &self,
        x: &mut [f32],
        rows: usize,
        heads: usize,
        d: usize,
        positions: &[u32],
        theta: f32,
        inverse: bool,
    ) {
        ops::rotary::rotary(x, rows, heads, d, positions, theta, inverse)
    }
    fn act_fwd(&self, kind: Activation, u: &[f32], n: usize, f: usize, out: &mut [f32]) {
        ops::activation::act_fwd(kind, u, n, f, out)
    }
    fn act_bwd(
        &self,
        kind: Activation,
        u: &[f32],
        dout: &[f32],
        n: usize,
        f: usize,
        du: &mut [f32],
    ) {
        ops::activation::act_bwd(kind, u, dout, n, f, du)
    }
    fn act_bwd_inplace(&self, kind: Activation, u: &mut [f32], dout: &[f32], n: usize, f: usize) {
        ops::activation::act_bwd_inplace(kind, u, dout, n, f)
    }
    fn adam(&self, c: &AdamConfig, t: u32, p: &mut [f32], g: &[f32], m: &mut [f32], v: &mut [f32]) {
        ops::adam::adam_step(c, t, p, g, m, v)
    }
}
