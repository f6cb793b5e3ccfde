//! The vocabulary of process groups both sides of the contract speak: which group a rank
//! belongs to ([`GroupKind`]) and where it sits on the rank grid ([`Coords`]).

use serde::{Deserialize, Serialize};
use std::fmt;

/// A process group kind: the axes its members vary along (Megatron-Core's
/// `initialize_model_parallel` builds each one; the expert groups lie on MoE Parallel
/// Folding's expert grid).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GroupKind {
    Tp,
    Cp,
    Pp,
    /// Dense data parallel (the dense grid's dp axis).
    Dp,
    /// Expert parallel.
    Ep,
    /// Data parallel of the routed experts: the ranks holding the same experts (the expert
    /// grid's dp axis, into which Megatron folds CP).
    ExpertDp,
    /// DP x CP: the replicas of dense parameters, over which gradients reduce and the
    /// distributed optimizer shards.
    DpCp,
    /// Expert tensor parallel: the ranks over which each routed expert splits, which
    /// all-gather the rows the EP all-to-all delivers (the expert grid's tp axis).
    ExpertTp,
}

impl GroupKind {
    pub const ALL: [GroupKind; 8] = [
        GroupKind::Tp,
        GroupKind::Cp,
        GroupKind::Pp,
        GroupKind::Dp,
        GroupKind::Ep,
        GroupKind::ExpertDp,
        GroupKind::DpCp,
        GroupKind::ExpertTp,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            GroupKind::Tp => "tp",
            GroupKind::Cp => "cp",
            GroupKind::Pp => "pp",
            GroupKind::Dp => "dp",
            GroupKind::Ep => "ep",
            GroupKind::ExpertDp => "expert_dp",
            GroupKind::DpCp => "dp_cp",
            GroupKind::ExpertTp => "expert_tp",
        }
    }
}

impl fmt::Display for GroupKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A rank's coordinates (Megatron order tp-cp-ep-dp-pp by default): `tp`, `cp`, `dp` and `pp`
/// on the dense grid (`dp` in 0..dp), `ep` its index on the expert grid's ep axis (the experts
/// it holds).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
pub struct Coords {
    pub tp: u32,
    pub cp: u32,
    pub ep: u32,
    pub dp: u32,
    pub pp: u32,
}
