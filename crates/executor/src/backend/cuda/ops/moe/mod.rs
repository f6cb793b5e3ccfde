//! Mixture of experts on `moe.cu`: the routers ([`routing`]), the row gathers and scatters of
//! the dispatch and combine, and the routers' backward (CPU twin: cpu/ops/moe.rs).

pub mod kernel;
mod op;
pub mod routing;
