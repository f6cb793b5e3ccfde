//! The op families on the CUDA backend, one folder each: the `.cu` kernel, its typed launch
//! wrappers (`kernel.rs`) and the family's op trait for [`CudaRank`] (`mod.rs`), every op one or
//! more launches (or cuBLASLt for the linear layers) on the rank's compute stream, with the
//! operands staged to the kernel's dtype by [`CudaRank`]'s helpers. Host metadata (tokens,
//! positions, routes) is uploaded as small index arrays; the only host reads are the loss rows of
//! `ce_loss` and the routers' n x k chosen experts and gates (routing.rs: the capacity's drops are
//! host metadata, as the split sizes of the dispatch all-to-all are on the host for NCCL too).

pub mod activation;
pub mod adam;
pub mod cross_entropy;
pub mod dropout;
pub mod elementwise;
pub mod embedding;
pub mod flash;
pub mod heads;
pub mod launch;
pub mod linear;
pub mod moe;
pub mod norm;
pub mod rotary;
pub mod ulysses;

use crate::backend::cuda::rank::CudaRank;
use crate::backend::cuda::Cuda;
use crate::backend::ops::MambaOps;

/// No Mamba-2 kernels yet: the mixer's ops answer with the family's refusal (the CUDA runner
/// refuses hybrid plans before they start, `runner::cuda`).
impl MambaOps<Cuda> for CudaRank {}
