//! Element-wise ops on `elementwise.cu` (add, axpy, fill, and the dtype casts that stage
//! operands; CPU twin: cpu/ops/elementwise.rs).

pub mod kernel;
mod op;
