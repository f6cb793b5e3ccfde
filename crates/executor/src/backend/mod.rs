//! What a backend implements. [`Backend`] names its device tensor, event, process group and
//! per-rank device; the device allocates, uploads and downloads tensors, counts them in the
//! rank's [`MemoryTracker`](crate::tracker::MemoryTracker), and runs the [`TensorOps`] and
//! [`DeviceCollectives`] of a training step on device tensors, every one fallible. Model code
//! calls these and touches no element on the host (Burn and candle structure their backends
//! the same way: associated storage types, monomorphised model code).
//!
//! One concept per file: `tensor` (device tensors and their flat views), `types` (the types
//! the traits are written over), `device` ([`Backend`], [`Device`]), `ops/` (the op families,
//! one file each with its host-side argument types, and [`TensorOps`], their union),
//! `collectives` ([`DeviceCollectives`] and the point-to-point exchange), `bf16` (the rounding
//! both backends store with). The `cpu` backend is the reference; the `cuda` backend
//! implements the same traits on device buffers.

pub mod bf16;
pub mod collectives;
pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod device;
pub mod ops;
pub mod tensor;
pub mod types;

pub use collectives::{
    flat_shard, member_index, overlap, DeviceCollectives, Pending, RecvInto, ReduceOp, SendFrom,
};
pub use device::{Backend, Device};
pub use ops::TensorOps;
pub use tensor::{check_copy, check_upload, DeviceTensor, View, ViewMut};
pub use types::{BackendTypes, ProcessGroup};
