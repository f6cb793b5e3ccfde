//! The `cuda` backend: cudarc (driver, NVRTC, cuBLASLt, NCCL through cudarc's `nccl`
//! feature), every library loaded at run time so the crate builds and runs everywhere and
//! `--backend cuda` fails with a clear error where a library is missing.
//!
//! By concern: [`device`] (context, streams, memory pool, tensors), [`compile`] (NVRTC, ptxas
//! reports, the kernel cache and the list of kernel files), [`comm`] (NCCL and the shared-GPU
//! collectives), [`ops`] (one folder per op family: its `TensorOps` methods, the launch
//! wrappers and the `.cu` kernel), [`diag`] (the error type, the library probe, `doctor`), and
//! [`rank`], one rank's device that ties them together.

pub mod comm;
pub mod compile;
pub mod device;
pub mod diag;
pub mod ops;
pub mod rank;

pub use diag::error::CudaError;
pub use diag::library::Library;
pub use diag::probe;

/// The CUDA backend (one rank per thread or process, tensors in GPU memory). Its
/// [`crate::backend::Backend`] types are bound in [`rank`].
#[derive(Debug, Clone, Copy, Default)]
pub struct Cuda;
