//! MLA's per-head concat and split on `heads.cu` (CPU twin: cpu/ops/heads.rs).

pub mod kernel;
mod op;
