//! The `cuda` backend: cudarc (driver, NVRTC, cuBLASLt, NCCL through cudarc's `nccl`
//! feature), every library loaded at run time so the crate builds and runs everywhere and
//! `--backend cuda` fails with a clear error where a library is missing.

pub mod error;
pub mod probe;

pub use error::CudaError;
pub use probe::Library;
pub mod cache;
pub mod doctor;
pub mod kernels;
pub mod launch;
pub mod nvrtc;
pub mod ptxas;
