//! SwiGLU and GeLU on `activation.cu` (CPU twin: cpu/ops/activation.rs).

pub mod kernel;
mod op;
