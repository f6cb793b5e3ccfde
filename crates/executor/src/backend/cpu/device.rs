//! The CPU backend's [`Backend`]: its tensors are host buffers, its device the rank's
//! [`CpuOps`], its collectives the shared-memory [`CpuComm`]. Every op runs to completion
//! before it returns, so events are plain markers.

use super::tensor::{src, store_all};
use super::{CpuComm, CpuOps, Group, Tensor};
use crate::backend::{check_upload, Backend, BlockShape, Device, View};
use crate::error::ExecError;
use crate::tracker::{Category, MemoryTracker};
use parsim_plan::DType;

#[derive(Debug, Clone, Copy, Default)]
pub struct Cpu;

/// A point in the CPU's (synchronous) stream: already reached when made, so its time is the
/// host clock's.
#[derive(Debug, Clone, Copy)]
pub struct CpuEvent(std::time::Instant);

impl Backend for Cpu {
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
