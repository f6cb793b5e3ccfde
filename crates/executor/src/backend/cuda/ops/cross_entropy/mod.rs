//! The cross-entropy loss in row passes on `cross_entropy.cu` (CPU twin:
//! cpu/ops/cross_entropy.rs); the loss rows are the only host read.

pub mod kernel;
mod op;
