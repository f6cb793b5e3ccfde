//! The CPU backend's tensor ops, one family per file: the kernels, each forward and backward,
//! on host slices (each the reference, the CPU twin, of its CUDA kernel), and the family's op
//! trait for the rank's [`CpuOps`](super::device::CpuOps), which runs them on the tensors'
//! storage. A write into a bf16 tensor rounds each element to bf16 (nearest, ties to even)
//! after fp32 accumulation, where a GPU kernel would round when storing its fp32 result.

pub mod activation;
pub mod adam;
pub mod attention;
#[cfg(test)]
mod attention_variants;
pub mod bias;
pub mod cross_entropy;
pub mod dropout;
pub mod elementwise;
pub mod embedding;
pub mod flash;
pub mod gemm;
pub mod heads;
pub mod layout;
pub mod mamba;
pub mod moe;
pub mod norm;
pub mod rotary;
pub mod router;
pub mod routes;
pub mod ulysses;
