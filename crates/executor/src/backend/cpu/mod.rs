//! The CPU backend: ranks are threads of one process, tensors fp32, matmul through
//! `matrixmultiply`, collectives over shared memory. The reference for correctness.
//!
//! Files: `tensor` (the tracked host tensor), `device` ([`Cpu`], the rank's [`CpuOps`] and its
//! [`Device`]), `gemm_counter` (a rank's GEMM FLOPs and seconds), `ops/` (one file per op
//! family: its kernels on host slices and its op trait over them, together [`TensorOps`]),
//! `collectives` (the shared-memory world and the host-slice [`Collectives`]), `comm` (the
//! [`DeviceCollectives`] over them).
//!
//! [`Device`]: crate::backend::Device
//! [`TensorOps`]: crate::backend::TensorOps
//! [`DeviceCollectives`]: crate::backend::DeviceCollectives

pub mod collectives;
pub mod comm;
pub mod device;
pub mod gemm_counter;
pub mod ops;
pub mod rendezvous;
pub mod tensor;

pub use collectives::{Collectives, CpuComm, Group, World};
pub use device::{Cpu, CpuEvent, CpuOps};
pub use tensor::Tensor;
