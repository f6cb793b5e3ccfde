//! Ulysses sequence parallelism's pack and unpack around the all-to-all on `ulysses.cu`
//! (CPU twin: cpu/ops/ulysses.rs).

pub mod kernel;
mod op;
