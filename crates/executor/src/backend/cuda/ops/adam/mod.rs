//! The Adam step on `adam.cu`, with the fused bf16 weight copy (CPU twin: cpu/ops/adam.rs).

pub mod kernel;
mod op;
