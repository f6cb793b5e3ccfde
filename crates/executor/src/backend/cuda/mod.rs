//! The `cuda` backend: cudarc (driver, NVRTC, cuBLASLt, NCCL through cudarc's `nccl`
//! feature), every library loaded at run time so the crate builds and runs everywhere and
//! `--backend cuda` fails with a clear error where a library is missing.

pub mod error;
pub mod probe;

pub use error::CudaError;
pub use probe::Library;
pub mod attn;
pub mod cache;
pub mod collectives;
pub mod comms;
pub mod context;
pub mod device;
pub mod doctor;
pub mod exchange;
pub mod groups;
pub mod hub;
pub mod kernels;
pub mod launch;
pub mod local;
pub mod local_device;
pub mod matmul;
pub mod mla_dropout;
pub mod nccl;
pub mod nccl_id;
pub mod nvrtc;
pub mod ops;
pub mod overlap;
pub mod pool;
pub mod ptxas;
pub mod rank;
pub mod routing;
pub mod tensor;
