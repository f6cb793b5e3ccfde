//! parsim-plan: the contract between the engine and the executor. The engine lowers a
//! configuration into a [`Plan`] (shard shapes, process groups, per-rank actions); the
//! executor plays it and answers with a [`RunReport`] and, when asked, its [`trace`]s. Plain
//! data (serde) only, so the engine, the GUI and the web build use it without the executor.

pub mod dtype;
pub mod error;
pub mod group;
pub mod nonfinite;
pub mod op_timing;
pub mod pieces;
pub mod plan;
pub mod run;
pub mod run_report;
pub mod trace;
mod validate;

pub use dtype::DType;
pub use error::PlanError;
pub use group::{Coords, GroupKind, Groups};
pub use op_timing::{OpKey, OpTiming};
pub use plan::Plan;
pub use run_report::RunReport;
