//! Attention: the block kernels of `flash.cu` ([`kernel`]) and the tensor-core ones of
//! `flash_mma.cu` ([`mma`]), whole-sequence attention in [`attn`] (CPU twin: cpu/ops/flash.rs).

pub mod attn;
pub mod kernel;
pub mod mma;
mod op;
