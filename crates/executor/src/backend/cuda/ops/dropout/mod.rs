//! Philox dropout on `dropout.cu` (CPU twin: cpu/ops/dropout.rs).

pub mod kernel;
mod op;
