//! The CPU backend's [`Backend`]: its tensors are host buffers, its device the rank's
//! [`CpuOps`], its collectives the shared-memory [`CpuComm`]. Every op runs to completion
//! before it returns, so events are plain markers.

use super::collectives::{CpuComm, Group};
use super::gemm_counter::GemmCounter;
use super::tensor::{src, store_all, Tensor};
use crate::backend::ops::*;
use crate::backend::{check_upload, Backend, Device, View};
use crate::error::ExecError;
use crate::tracker::{Category, MemoryTracker};
use parsim_plan::DType;

#[derive(Debug, Clone, Copy, Default)]
pub struct Cpu;

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

/// A point in the CPU's (synchronous) stream: already reached when made, so its time is the
/// host clock's.
#[derive(Debug, Clone, Copy)]
pub struct CpuEvent(std::time::Instant);

impl Backend for Cpu {
    const NAME: &'static str = "cpu";
    type Tensor = Tensor;
    type Event = CpuEvent;
    type Group = Group;
    type Device = CpuOps;
    type Comm = CpuComm;
}

impl Device<Cpu> for CpuOps {
    fn memory(&self) -> &MemoryTracker {
        CpuOps::memory(self)
    }

    #[track_caller]
    fn alloc(&self, cat: Category, dtype: DType, shape: &[usize]) -> Result<Tensor, ExecError> {
        let n = shape.iter().product();
        Ok(Tensor::typed(
            self.memory(),
            cat,
            dtype,
            shape,
            vec![0.0; n],
        ))
    }

    #[track_caller]
    fn upload(
        &self,
        cat: Category,
        dtype: DType,
        shape: &[usize],
        data: &[f32],
    ) -> Result<Tensor, ExecError> {
        check_upload(shape, data.len())?;
        let mut t = Tensor::typed(self.memory(), cat, dtype, shape, data.to_vec());
        store_all(&mut t);
        Ok(t)
    }

    fn download(&self, t: View<'_, Tensor>) -> Result<Vec<f32>, ExecError> {
        Ok(src(&t).to_vec())
    }

    fn gemm_stats(&self) -> (f64, f64) {
        self.gemm_counter().get()
    }

    fn recat(&self, t: Tensor, cat: Category) -> Tensor {
        t.recat(cat)
    }

    fn record(&self) -> Result<CpuEvent, ExecError> {
        Ok(CpuEvent(std::time::Instant::now()))
    }

    fn wait(&self, _e: &CpuEvent) -> Result<(), ExecError> {
        Ok(())
    }

    fn elapsed_s(&self, start: &CpuEvent, end: &CpuEvent) -> Result<f64, ExecError> {
        Ok(end.0.saturating_duration_since(start.0).as_secs_f64())
    }

    /// One scalar implementation for every shape and dtype (cpu/ops/flash.rs).
    fn attention_kernel(&self, _dtype: DType, _sh: &BlockShape) -> &'static str {
        "cpu"
    }
}
