//! RMSNorm / LayerNorm on `norm.cu` (CPU twin: cpu/ops/norm.rs): [`kernel`] holds the launches.

pub mod kernel;
mod op;
