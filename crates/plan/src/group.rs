//! The vocabulary of process groups both sides of the contract speak: which group a rank
//! belongs to ([`GroupKind`]), the members of each of a rank's groups ([`Groups`]) and where it
//! sits on the rank grid ([`Coords`]).

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
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

/// A rank's process groups keyed by kind: the members (global ranks, ascending) of the group of
/// each kind that holds the rank. A new parallel kind is a new key, not a new field; a Plan's
/// JSON writes them as `{"tp": [0, 1], "cp": [0], ...}`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Groups(BTreeMap<GroupKind, Vec<u32>>);

impl Groups {
    /// The rank's group of each kind in [`GroupKind::ALL`], made by `members`.
    pub fn of_every_kind(mut members: impl FnMut(GroupKind) -> Vec<u32>) -> Groups {
        Groups(GroupKind::ALL.iter().map(|&k| (k, members(k))).collect())
    }

    /// Every kind's group holding `rank` alone (a one-rank run).
    pub fn alone(rank: u32) -> Groups {
        Groups::of_every_kind(|_| vec![rank])
    }

    /// The members of the `kind` group (empty when the plan states none).
    pub fn get(&self, kind: GroupKind) -> &[u32] {
        self.0.get(&kind).map_or(&[], Vec::as_slice)
    }

    /// Sets the members of the `kind` group.
    pub fn insert(&mut self, kind: GroupKind, members: Vec<u32>) {
        self.0.insert(kind, members);
    }

    /// Each kind stated, with its members, in kind order.
    pub fn iter(&self) -> impl Iterator<Item = (GroupKind, &[u32])> {
        self.0.iter().map(|(&k, m)| (k, m.as_slice()))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_are_keyed_by_kind_and_written_as_a_map_of_kind_names() {
        let mut g = Groups::alone(3);
        assert_eq!(g.iter().count(), GroupKind::ALL.len());
        assert!(GroupKind::ALL.iter().all(|&k| g.get(k) == [3]));
        g.insert(GroupKind::Tp, vec![2, 3]);
        assert_eq!(g.get(GroupKind::Tp), [2, 3]);
        assert!(Groups::default().get(GroupKind::DpCp).is_empty());
        // Readable JSON: one key per kind, as its snake_case name, in kind order.
        let json = serde_json::to_string(&g).unwrap();
        assert!(
            json.starts_with(r#"{"tp":[2,3],"cp":[3],"pp":[3],"dp":[3],"#),
            "{json}"
        );
        assert!(json.contains(r#""dp_cp":[3]"#) && json.contains(r#""expert_tp":[3]"#));
        let back: Groups = serde_json::from_str(&json).unwrap();
        assert_eq!(back, g);
    }
}
