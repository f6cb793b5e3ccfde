//! Pipeline actions and per-rank programs.
//!
//! Notation follows PyTorch's `torch.distributed.pipelining`: `F` is a forward, `B` a full
//! backward, `I` the input-gradient part of a split backward and `W` its weight-gradient part
//! (Qi et al. 2024, "Zero Bubble Pipeline Parallelism"). Stages are numbered globally
//! `0..num_stages`; microbatches are 0-based.
//!
//! Sends and receives are not listed: they are derivable. Forward `F(s, mb)` consumes the
//! output of `F(s-1, mb)`; `B/I(s, mb)` consumes the input gradient produced by
//! `B/I(s+1, mb)` (or the loss of `F(s, mb)` on the last stage); `W(s, mb)` consumes
//! what `I(s, mb)` left. When the producer runs on another rank, the simulator charges one
//! point-to-point hop; on the same rank (the bottom of the V in ZB-V and DualPipe-V) nothing.

use crate::config::ScheduleKind;
use serde::Serialize;
use std::fmt;

/// What an action computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub enum ActionKind {
    /// Forward of one chunk for one microbatch.
    F,
    /// Full backward (input and weight gradients together).
    B,
    /// Backward for the input gradient only (on the critical path).
    I,
    /// Backward for the weight gradient only (can be deferred to fill bubbles).
    W,
}

impl ActionKind {
    /// The one-letter name used in JSON, traces and the timeline.
    pub fn letter(self) -> &'static str {
        match self {
            ActionKind::F => "F",
            ActionKind::B => "B",
            ActionKind::I => "I",
            ActionKind::W => "W",
        }
    }
}

impl fmt::Display for ActionKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.letter())
    }
}

/// Whether an action runs alone or as half of an overlapped forward-and-backward slot
/// (DualPipe-V, DeepSeek-V3 report §3.2.1: the forward of one microbatch overlapped with the
/// backward of another on the same rank).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize)]
pub enum Overlap {
    /// Runs on its own.
    #[default]
    None,
    /// First half of an overlapped slot (always the forward); the next action is the second.
    First,
    /// Second half of an overlapped slot (always the full backward).
    Second,
}

/// One computation on one rank: a forward, backward or backward part of one stage for one
/// microbatch (lowering turns each into a `parsim_plan::plan::Action` and adds the sends,
/// receives and optimizer step around them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ComputeAction {
    /// Forward, backward or a backward part.
    pub kind: ActionKind,
    /// Global stage (model chunk) index, `0..num_stages`.
    pub stage: u32,
    /// Microbatch index, 0-based.
    pub microbatch: u32,
    /// Part of an overlapped F&B slot or not.
    pub overlap: Overlap,
}

impl ComputeAction {
    /// A stand-alone action.
    pub fn new(kind: ActionKind, stage: u32, microbatch: u32) -> Self {
        ComputeAction {
            kind,
            stage,
            microbatch,
            overlap: Overlap::None,
        }
    }
}

impl fmt::Display for ComputeAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}(stage {}, mb {})",
            self.kind, self.stage, self.microbatch
        )
    }
}

/// How global stages are laid out on pipeline ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Placement {
    /// Stage `s` on rank `s mod pp` (one chunk per rank when vpp = 1; Megatron's loop
    /// placement for interleaved 1F1B, Narayanan et al. 2021).
    Loop,
    /// Stages `r` and `2*pp-1-r` on rank `r` (ZB-V, DualPipe-V).
    V,
}

/// The ordered actions of every pipeline rank for one training step.
#[derive(Debug, Clone, PartialEq)]
pub struct Program {
    /// Which schedule produced it.
    pub kind: ScheduleKind,
    /// Pipeline ranks.
    pub pp: u32,
    /// Model chunks per rank.
    pub vpp: u32,
    /// Microbatches per step.
    pub microbatches: u32,
    /// Stage-to-rank layout.
    pub placement: Placement,
    /// `ranks[r]` is rank r's actions in execution order.
    pub ranks: Vec<Vec<ComputeAction>>,
}

impl Program {
    /// Number of global stages, `pp * vpp`.
    pub fn num_stages(&self) -> u32 {
        self.pp * self.vpp
    }

    /// The rank that runs global stage `stage`.
    pub fn rank_of_stage(&self, stage: u32) -> u32 {
        rank_of_stage(self.placement, self.pp, stage)
    }

    /// The chunk index of `stage` on its rank (0 for the first chunk a rank holds).
    pub fn chunk_of_stage(&self, stage: u32) -> u32 {
        match self.placement {
            Placement::Loop => stage / self.pp,
            Placement::V => u32::from(stage >= self.pp),
        }
    }

    /// Total number of actions over all ranks.
    pub fn num_actions(&self) -> usize {
        self.ranks.iter().map(Vec::len).sum()
    }

    /// Whether any action is a split backward part (I or W).
    pub fn splits_backward(&self) -> bool {
        self.ranks
            .iter()
            .flatten()
            .any(|a| matches!(a.kind, ActionKind::I | ActionKind::W))
    }
}

/// The rank of `stage` under `placement` with `pp` ranks.
pub fn rank_of_stage(placement: Placement, pp: u32, stage: u32) -> u32 {
    match placement {
        Placement::Loop => stage % pp,
        Placement::V => {
            if stage < pp {
                stage
            } else {
                2 * pp - 1 - stage
            }
        }
    }
}
