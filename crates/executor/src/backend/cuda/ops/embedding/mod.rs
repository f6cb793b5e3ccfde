//! The embedding gather and its gradient's scatter-add on `embedding.cu` (CPU twin:
//! cpu/ops/embedding.rs).

pub mod kernel;
mod op;
