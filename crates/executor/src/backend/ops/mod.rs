//! The tensor ops of a training step, one trait per op family (as burn's backend crates split
//! theirs), each op a method with a default body that refuses it by name
//! ([`ExecError::UnsupportedOp`](crate::error::ExecError::UnsupportedOp)): a backend overrides
//! the ops it runs, and [`TensorOps`] is the union of the families, held by every device that
//! implements them all.
//!
//! Each family's file lists its ops once (`op_list!`, family.rs, which also makes the
//! `<family>_ops!` macro that hands the list on): the op's doc, its signature (without `&self`
//! and `Result`) and what it costs when timed (`= memory(bytes)`, `= gemm(m, n, k, dtype)` or
//! `= attention(..)`, the timing layer's words, `traced_ops/cost.rs`). The list makes the
//! family's trait here and the timed forwarding in `traced_ops`, so a new op of a family is written in its family's list, its CPU twin
//! (`cpu/ops/<family>.rs`) and its CUDA kernel (`cuda/ops/<family>/`), and nowhere else.
//! Every op is fallible (a device kernel can fail to launch); tensors are row-major, `n` rows
//! of `i` inputs and `o` outputs for linear layers (weights [o, i]); accumulation is fp32
//! whatever the tensors' dtype.

pub(crate) mod family;

pub mod activation;
pub mod adam;
pub mod attention;
pub mod bias;
pub mod cross_entropy;
pub mod dropout;
pub mod elementwise;
pub mod embedding;
pub mod flash;
pub mod heads;
pub mod layout;
pub mod linear;
pub mod mamba;
pub mod moe;
pub mod norm;
pub mod rotary;
pub mod ulysses;

pub use activation::*;
pub use adam::*;
pub use attention::*;
pub use bias::*;
pub use cross_entropy::*;
pub use dropout::*;
pub use elementwise::*;
pub use embedding::*;
pub use flash::*;
pub use heads::*;
pub use layout::*;
pub use linear::*;
pub use mamba::*;
pub use moe::*;
pub use norm::*;
pub use rotary::*;
pub use ulysses::*;

use family::op_union;

op_union! {
    /// Every op family: what a device runs for a training step. Implemented for every type
    /// that implements all the families, never by hand.
    TensorOps: LinearOps, BiasOps, NormOps, RotaryOps, ActivationOps, ElementwiseOps,
        LayoutOps, EmbeddingOps, HeadsOps, CrossEntropyOps, AttentionOps, FlashOps,
        UlyssesOps, MoeOps, DropoutOps, AdamOps, MambaOps,
}
