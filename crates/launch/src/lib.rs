//! Launching a multi-process run: each process is one rank. Ranks come from torchrun's or
//! Slurm's variables ([`env`]), or from a local supervisor that starts N workers
//! ([`supervise`]); rank 0 serves the NCCL unique id over TCP ([`rendezvous`], framed by
//! [`wire`]), every wait bounded by a deadline; after the rendezvous each worker runs a
//! closure and sends its report to rank 0 ([`worker`]), and one failing rank stops the rest.

pub mod env;
pub mod nccl_shim;
pub mod nodelist;
pub mod rendezvous;
pub mod supervise;
pub mod unique_id;
pub mod wire;
pub mod worker;

pub use env::RankEnv;
pub use supervise::{supervise, LocalLaunch};
pub use unique_id::{IdSource, UniqueId};
pub use worker::{run_worker, WorkerOptions};

/// What a worker knows after the rendezvous: its place in the world and the NCCL unique id
/// that rank 0 handed out (the same 128 bytes on every rank).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchInfo {
    pub rank: u32,
    pub world_size: u32,
    pub local_rank: u32,
    pub local_world_size: u32,
    pub node_rank: u32,
    pub nnodes: u32,
    pub master_addr: String,
    pub master_port: u16,
    pub unique_id: [u8; 128],
    /// Whether `unique_id` came from NCCL or is a stand-in (no NCCL library at rank 0).
    pub id_source: IdSource,
}

/// Why a launch, a rendezvous or a worker failed.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// A launcher variable (or flag) that is missing, malformed or contradicts another.
    #[error("{name}={value:?}: {rule}")]
    Variable {
        name: String,
        value: String,
        rule: String,
    },
    /// A variable the launcher needs is not set.
    #[error("{name} is not set: {why}")]
    MissingVariable { name: String, why: String },
    /// Ranks that never reached rank 0 before the deadline.
    #[error("rendezvous at {addr} timed out after {timeout_s} s: rank(s) {missing} of {world_size} never connected")]
    MissingRanks {
        addr: String,
        timeout_s: f64,
        missing: String,
        world_size: u32,
    },
    /// Rank 0 could not be reached, or did not answer, before the deadline.
    #[error("rank {rank}: rank 0 at {addr} {what} within the rendezvous timeout of {timeout_s} s")]
    NoRankZero {
        rank: u32,
        addr: String,
        what: String,
        timeout_s: f64,
    },
    /// A message that breaks the rendezvous protocol (wrong program, version or world).
    #[error("rendezvous protocol: {0}")]
    Protocol(String),
    /// A socket operation failed.
    #[error("rendezvous {what} ({addr}): {source}")]
    Io {
        what: String,
        addr: String,
        #[source]
        source: std::io::Error,
    },
    /// Rank 0 aborted the rendezvous or the run (another rank failed, or it did).
    #[error("stopped by rank 0: {0}")]
    Stopped(String),
    /// A rank's own work failed; the message is that rank's error.
    #[error("rank {rank} failed: {message}")]
    RankFailed { rank: u32, message: String },
    /// A rank's loss (or its load-balancing part) is not finite: training diverged there.
    #[error("rank {rank}: {what} is {value} at step {step}")]
    NonFinite {
        rank: u32,
        what: &'static str,
        value: f64,
        /// 0-based, warm-up steps included.
        step: usize,
    },
    /// A rank's report could not be read or combined.
    #[error("rank {rank}'s report: {reason}")]
    Report { rank: u32, reason: String },
    /// A local worker process could not be started or watched.
    #[error("worker process (local rank {local_rank}): {source}")]
    Spawn {
        local_rank: u32,
        #[source]
        source: std::io::Error,
    },
}
