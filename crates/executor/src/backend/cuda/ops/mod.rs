//! The op families on the CUDA backend, one folder each: the `.cu` kernel, its typed launch
//! wrappers (`kernel.rs`) and the family's op trait for `CudaRank` (`op.rs`; `mod.rs` only
//! declares them, so the rank and the collectives reach a kernel without passing the ops that
//! use the rank), every op one or more launches (or cuBLASLt for the linear layers) on the
//! rank's compute stream, with the operands staged to the kernel's dtype by the rank's
//! helpers. Host metadata (tokens,
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
