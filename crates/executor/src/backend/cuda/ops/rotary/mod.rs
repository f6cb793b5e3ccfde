//! Rotary position embedding on `rotary.cu` (CPU twin: cpu/ops/rotary.rs).

pub mod kernel;
mod op;
