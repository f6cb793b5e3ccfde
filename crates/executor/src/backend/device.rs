//! A backend and its per-rank device: [`Backend`] names a backend's types, [`Device`]
//! allocates, uploads and downloads the rank's tensors and runs its [`TensorOps`].

use super::collectives::DeviceCollectives;
use super::ops::BlockShape;
use super::ops::TensorOps;
use super::tensor::{DeviceTensor, View};
use super::types::{BackendTypes, ProcessGroup};
use crate::error::ExecError;
use crate::tracker::{Category, MemoryTracker};
use parsim_plan::DType;

/// A backend: its associated types. Model code is generic over `B: Backend` and monomorphised
/// per backend.
pub trait Backend: Sized + 'static {
    /// The backend's name in messages (`cpu`, `cuda`), as `--backend` spells it.
    const NAME: &'static str;
    /// A tensor in device memory, with its shape, dtype and memory category.
    type Tensor: DeviceTensor;
    /// A point in a device stream that another stream (or the host) can wait for.
    type Event;
    /// A process group (NCCL communicator, or the CPU's shared-memory group).
    type Group: ProcessGroup + Clone;
    /// One rank's device: allocation, the rank's tracker, tensor ops.
    type Device: Device<Self>;
    /// One rank's collectives on device tensors.
    type Comm: DeviceCollectives<Self>;
}

impl<B: Backend> BackendTypes for B {
    const NAME: &'static str = B::NAME;
    type Tensor = B::Tensor;
    type Event = B::Event;
    type Group = B::Group;
}

/// One rank's device: allocation, upload and download (download only for the loss, exports and
/// tests), events, and the tensor ops.
pub trait Device<B: BackendTypes>: TensorOps<B> {
    /// The rank's tracker of requested and reserved bytes by category.
    fn memory(&self) -> &MemoryTracker;
    /// A zero-filled tensor.
    fn alloc(&self, cat: Category, dtype: DType, shape: &[usize]) -> Result<B::Tensor, ExecError>;
    /// A tensor holding `data` (rounded to `dtype`).
    fn upload(
        &self,
        cat: Category,
        dtype: DType,
        shape: &[usize],
        data: &[f32],
    ) -> Result<B::Tensor, ExecError>;
    /// The elements of a view, widened to f32.
    fn download(&self, t: View<'_, B::Tensor>) -> Result<Vec<f32>, ExecError>;
    /// FLOPs and seconds of the device's matrix multiplications so far.
    fn gemm_stats(&self) -> (f64, f64);
    /// Moves a tensor to another memory category (a temporary kept as an activation).
    fn recat(&self, t: B::Tensor, cat: Category) -> B::Tensor;
    /// An event at the current point of the compute stream.
    fn record(&self) -> Result<B::Event, ExecError>;
    /// Makes the compute stream wait for `e`.
    fn wait(&self, e: &B::Event) -> Result<(), ExecError>;
    /// Seconds from `start` to `end` (waiting for `end`): step and phase times come from
    /// events, since a device's host calls return before its work ends.
    fn elapsed_s(&self, start: &B::Event, end: &B::Event) -> Result<f64, ExecError>;
    /// The name of the attention kernel a call of shape `sh` on `dtype` inputs runs (op
    /// profiling keys attention rates by implementation).
    fn attention_kernel(&self, dtype: DType, sh: &BlockShape) -> &'static str;
}
