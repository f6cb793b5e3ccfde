//! Errors of the executor.

/// Why a Plan could not run.
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    #[error("invalid plan: {0}")]
    Plan(String),
    #[error("rank {rank} failed: {message}")]
    Rank { rank: u32, message: String },
    #[error("rank {rank} stopped waiting because another rank failed")]
    Aborted { rank: u32 },
    #[error("rank {rank} waited more than {seconds} s for a message or collective (deadlock?)")]
    Timeout { rank: u32, seconds: u64 },
}
