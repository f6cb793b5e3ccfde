//! Errors of schedule generation and simulation.
//!
//! Every message names the configuration field at fault (`parallel.pp`, `parallel.vpp`,
//! `training.global_batch_size` for the microbatch count, `parallel.schedule`) and the rule it
//! breaks, so that a user can fix the input without reading the source.

use thiserror::Error;

/// Why a pipeline program could not be generated or simulated.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum ScheduleError {
    /// `parallel.pp` is zero.
    #[error("parallel.pp must be at least 1 (got {pp})")]
    ZeroPp { pp: u32 },

    /// `parallel.vpp` is zero.
    #[error("parallel.vpp must be at least 1 (got {vpp})")]
    ZeroVpp { vpp: u32 },

    /// The microbatch count is zero.
    #[error(
        "the number of microbatches (training.global_batch_size / (micro_batch_size * dp)) \
         must be at least 1 (got {microbatches})"
    )]
    ZeroMicrobatches { microbatches: u32 },

    /// The schedule runs one chunk per rank but `parallel.vpp` is not 1.
    #[error(
        "parallel.vpp = {vpp} is not allowed with parallel.schedule = \"{schedule}\": \
         this schedule places exactly one model chunk per rank, so parallel.vpp must be 1 \
         (use \"interleaved-1f1b\", \"zb-v\" or \"dualpipe-v\" for several chunks per rank)"
    )]
    VppMustBeOne { schedule: &'static str, vpp: u32 },

    /// A V-shaped schedule (ZB-V, DualPipe-V) got a `parallel.vpp` other than 2.
    #[error(
        "parallel.vpp = {vpp} is not allowed with parallel.schedule = \"{schedule}\": \
         the V shape places exactly two chunks (stages r and 2*pp-1-r) on rank r, \
         so parallel.vpp must be 2"
    )]
    VppMustBeTwo { schedule: &'static str, vpp: u32 },

    /// Megatron-LM's interleaved schedule needs at least `pp` microbatches in a group.
    #[error(
        "interleaved-1f1b with parallel.pp = {pp} needs at least pp microbatches \
         (training.global_batch_size gives {microbatches}); Megatron-LM requires \
         pp <= microbatch_group_size_per_vp_stage <= microbatches"
    )]
    InterleavedTooFewMicrobatches { pp: u32, microbatches: u32 },

    /// The microbatch group size of the interleaved schedule is out of `[pp, microbatches]`.
    #[error(
        "microbatch_group_size_per_vp_stage = {group} must lie in [parallel.pp = {pp}, \
         microbatches = {microbatches}] (Megatron-LM's interleaved schedule)"
    )]
    InterleavedGroupOutOfRange {
        group: u32,
        pp: u32,
        microbatches: u32,
    },

    /// The last microbatch group of the interleaved schedule would be shorter than `pp`.
    #[error(
        "interleaved-1f1b: the number of microbatches ({microbatches}, from \
         training.global_batch_size) leaves a last group of {remainder} microbatches when \
         grouped by microbatch_group_size_per_vp_stage = {group}; Megatron-LM requires the \
         remainder to be 0 or at least parallel.pp = {pp} (with the default group size pp \
         this means: microbatches must be a multiple of parallel.pp; choose a group size N in \
         [pp, microbatches] with microbatches % N == 0 or >= pp to run other counts)"
    )]
    InterleavedRemainder {
        microbatches: u32,
        group: u32,
        remainder: u32,
        pp: u32,
    },

    /// DualPipe-V needs at least `2 * pp` microbatches.
    #[error(
        "dualpipe-v with parallel.pp = {pp} needs at least 2 * pp = {need} microbatches \
         (training.global_batch_size gives {microbatches}); DeepSeek's DualPipeV asserts \
         num_chunks >= num_ranks * 2"
    )]
    DualPipeTooFewMicrobatches {
        pp: u32,
        need: u32,
        microbatches: u32,
    },

    /// The program would hold more than [`super::MAX_CELLS`] stage-microbatch pairs.
    #[error(
        "parallel.pp * parallel.vpp * microbatches = {stages} * {microbatches} is too large \
         to simulate (at most 2^22 = 4194304 stage-microbatch pairs, about a gigabyte)"
    )]
    TooLarge { stages: u64, microbatches: u32 },

    /// The durations add up past the largest finite number: no makespan to report.
    #[error(
        "the simulated makespan overflows ({makespan}): the per-stage durations (F, B, W, \
         p2p) add up past the largest finite number; use smaller durations or another unit"
    )]
    NonFinite { makespan: f64 },

    /// The cost table does not match the program.
    #[error("schedule costs: {0}")]
    BadCosts(String),

    /// The program is inconsistent (an action out of range, duplicated or on the wrong rank).
    #[error("invalid pipeline program: {0}")]
    InvalidProgram(String),

    /// No rank can make progress but some actions are left.
    #[error("pipeline deadlock: {0}")]
    Deadlock(String),
}

impl ScheduleError {
    /// The configuration field at fault, as its message names it: `parallel.pp`,
    /// `parallel.vpp`, `training.global_batch_size` (which sets the microbatch count) or
    /// `parallel.schedule` for the rest. Front ends attach the error to that field.
    pub fn field(&self) -> &'static str {
        match self {
            ScheduleError::ZeroPp { .. } => "parallel.pp",
            ScheduleError::ZeroVpp { .. }
            | ScheduleError::VppMustBeOne { .. }
            | ScheduleError::VppMustBeTwo { .. } => "parallel.vpp",
            ScheduleError::ZeroMicrobatches { .. }
            | ScheduleError::InterleavedTooFewMicrobatches { .. }
            | ScheduleError::InterleavedGroupOutOfRange { .. }
            | ScheduleError::InterleavedRemainder { .. }
            | ScheduleError::DualPipeTooFewMicrobatches { .. } => "training.global_batch_size",
            ScheduleError::TooLarge { .. }
            | ScheduleError::NonFinite { .. }
            | ScheduleError::BadCosts(_)
            | ScheduleError::InvalidProgram(_)
            | ScheduleError::Deadlock(_) => "parallel.schedule",
        }
    }
}
