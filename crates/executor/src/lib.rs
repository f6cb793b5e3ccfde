//! parsim-executor: plays a [`Plan`](parsim_plan::Plan) (shard shapes, process groups, per-rank
//! actions) on a backend and measures it. It knows nothing of models, presets or
//! configuration files: the engine (`parsim::lower`) lowers a configuration into a Plan.
//!
//! Backends implement [`backend::Backend`]: device tensors, [`backend::TensorOps`] and
//! [`backend::DeviceCollectives`] on them, a per-rank memory tracker; the `cpu` backend
//! runs ranks as threads in fp32 and is the reference for correctness: any supported mix gives
//! the loss and parameters of the single-rank run.

pub mod backend;
pub mod error;
pub mod layers;
pub mod op_profile;
pub mod rng;
pub mod runner;
pub mod trace;
pub mod traced_comm;
pub mod traced_ops;
pub mod tracker;

pub use error::ExecError;
pub use runner::{run_cpu, RunOptions};
