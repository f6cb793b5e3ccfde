//! Errors of the executor: a plan or options that cannot run, actions out of order, a
//! collective called inconsistently, a rank's model state that contradicts its plan, and the
//! failure, abort or timeout of a rank.

/// Why a Plan could not run.
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    #[error("invalid plan: {0}")]
    Plan(#[from] PlanError),
    #[error("invalid run options: {0}")]
    Options(#[from] OptionsError),
    /// An action found nothing to work on: the plan's actions are out of order.
    #[error("rank {rank}: no {what} for stage {stage}, microbatch {mb} (actions out of order)")]
    OutOfOrder {
        rank: u32,
        what: &'static str,
        stage: u32,
        mb: u32,
    },
    #[error("W(stage {stage}, mb {mb}) before its I on rank {rank}")]
    WeightBeforeInput { rank: u32, stage: u32, mb: u32 },
    /// A collective was called with arguments that cannot match.
    #[error("{op}: {reason}")]
    Collective {
        op: &'static str,
        reason: CollectiveError,
    },
    /// A rank's model state contradicts its plan (an executor bug, not bad input).
    #[error("inconsistent model state: {0}")]
    State(#[from] StateError),
    #[error("rank {rank} failed: {message}")]
    Rank { rank: u32, message: String },
    #[error("rank {rank} stopped waiting because another rank failed")]
    Aborted { rank: u32 },
    /// The CUDA backend: a missing library or a failed CUDA, cuBLASLt or NCCL call.
    #[cfg(feature = "cuda")]
    #[error(transparent)]
    Cuda(#[from] crate::backend::cuda::CudaError),
    #[error("rank {rank} waited more than {seconds} s for a message or collective (deadlock?)")]
    Timeout { rank: u32, seconds: u64 },
    #[error("dropout: {0}")]
    Dropout(#[from] crate::rng::DropoutError),
    /// Exported parameters or gradients that the ranks do not cover.
    #[error(transparent)]
    Export(#[from] parsim_plan::pieces::MissingElements),
    /// Operands of a device call whose sizes cannot match, naming the call and the rule.
    #[error("{op}: {rule}")]
    Shape { op: &'static str, rule: String },
    /// A feature of the plan that this backend does not run yet, naming the plan's field.
    #[error("{field}: {message}")]
    Unsupported {
        field: &'static str,
        message: &'static str,
    },
    /// An op the backend has no kernel for (the op family's default refusal).
    #[error("the {backend} backend does not run the op {op}")]
    UnsupportedOp {
        op: &'static str,
        backend: &'static str,
    },
}

use parsim_plan::PlanError;

/// Run options that cannot apply to a plan.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum OptionsError {
    #[error("export_grads needs zero 0 or 1 (full gradients), not zero {zero}")]
    ExportGradsNeedsFullGradients { zero: u8 },
    #[error("steps ({steps}) must exceed warmup ({warmup})")]
    StepsNotAboveWarmup { steps: u32, warmup: u32 },
}

/// Arguments of a collective that cannot match.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CollectiveError {
    #[error("{expected} counts expected, got {send} send and {recv} receive counts")]
    CountCount {
        expected: usize,
        send: usize,
        recv: usize,
    },
    #[error("buffer lengths differ from the sums of the counts")]
    CountSums,
    #[error("member {member} sends {sent} elements, {expected} expected")]
    CountMismatch {
        member: usize,
        sent: usize,
        expected: usize,
    },
    #[error("rank {rank} is not a member of group {members:?}")]
    NotAMember { rank: u32, members: Vec<u32> },
}

/// A rank's model state that contradicts its plan.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum StateError {
    #[error("an MoE layer in a model without MoeShape")]
    MoeWithoutShape,
    #[error("an MoE layer without an EP group")]
    MoeWithoutEpGroup,
    #[error("an expert gradient without an experts block")]
    ExpertGradientWithoutBlock,
    #[error("a LoRA adapter gradient without an adapters block")]
    AdapterGradientWithoutBlock,
    #[error("an MoE layer's saved state and experts block disagree")]
    MoeSavedMismatch,
    #[error("an attention with sinks kept no log-sum-exp")]
    SinksWithoutLse,
    #[error("a hybrid layer's saved state reached a transformer layer's backward")]
    HybridSavedMismatch,
    #[error("a multi-token-prediction module needs the {0} block on its rank")]
    MtpWithoutBlock(String),
    #[error("gradient buckets of stages {0:?} were not reduced before the optimizer step")]
    GradBucketsNotIssued(Vec<u32>),
    #[error("profile_ops: an action's timed ops took {ops_s} s, more than the action's {action_s} s (op timings overlap)")]
    OverlappingOpTimes { ops_s: f64, action_s: f64 },
}
