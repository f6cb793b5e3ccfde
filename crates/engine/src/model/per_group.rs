//! Figures per communication kind: one container ([`PerGroup`]) keyed by [`CommKind`],
//! iterated in one fixed order and serialised as the `--json` contract's objects
//! (docs/design.md: `tp`, `cp`, `pp`, `dp`, `ep`, `expert_tp`, and `host` where it is not
//! zero). What the reports say of each kind is one entry of [`CommKind::info`], so a new
//! parallel kind is a new key here, not a new field in every struct, table and card.

use crate::layout::GroupKind;
use serde::ser::{Serialize, SerializeMap, Serializer};
use std::ops::{Index, IndexMut};

/// A communication kind: the key of a per-group figure. Process groups fold into it (`dp` sums
/// dense DP, expert DP and DP x CP); `host` is activation offloading's copies over the host
/// link.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CommKind {
    Tp,
    Cp,
    Pp,
    Dp,
    Ep,
    /// The expert-TP all-gather and reduce-scatter of an MoE layer's routed rows.
    ExpertTp,
    Host,
}

/// A kind's line in the step breakdown (`estimate::breakdown`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepTerm {
    pub label: &'static str,
    /// What a step it dominates is bound by.
    pub bound: &'static str,
    /// What helps when it is the largest overhead.
    pub advice: &'static str,
    /// Shown with the communication during the step (after compute, before the pipeline's idle
    /// terms), else after the optimizer.
    pub during_step: bool,
    /// Its place among the communication terms of its part of the breakdown.
    pub rank: u8,
}

/// What the reports say of a kind.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CommKindInfo {
    /// The JSON key (and the CLI table's row name).
    pub key: &'static str,
    /// The GUI's row name.
    pub name: &'static str,
    /// The process group whose size and placement the tables show beside it (`dp`: DP x CP,
    /// the replicas its bytes include); `None` for the host link, which is no group.
    pub group: Option<GroupKind>,
    /// A zero figure is left out of the JSON (the host link: absent without offloading).
    pub optional: bool,
    pub term: StepTerm,
}

impl CommKind {
    /// Every kind, in the order the JSON, the tables and the cards list them.
    pub const ALL: [CommKind; 7] = [
        CommKind::Tp,
        CommKind::Cp,
        CommKind::Pp,
        CommKind::Dp,
        CommKind::Ep,
        CommKind::ExpertTp,
        CommKind::Host,
    ];

    /// The kind a process group's traffic counts under.
    pub fn of_group(g: GroupKind) -> CommKind {
        match g {
            GroupKind::Tp => CommKind::Tp,
            GroupKind::Cp => CommKind::Cp,
            GroupKind::Pp => CommKind::Pp,
            GroupKind::Ep => CommKind::Ep,
            GroupKind::ExpertTp => CommKind::ExpertTp,
            GroupKind::Dp | GroupKind::ExpertDp | GroupKind::DpCp => CommKind::Dp,
        }
    }

    /// The JSON key.
    pub fn key(self) -> &'static str {
        self.info().key
    }

    /// What the reports say of this kind.
    pub fn info(self) -> CommKindInfo {
        let info = |key, name, group, term| CommKindInfo {
            key,
            name,
            group,
            optional: false,
            term,
        };
        let term = |label, bound, advice, during_step, rank| StepTerm {
            label,
            bound,
            advice,
            during_step,
            rank,
        };
        match self {
            CommKind::Tp => info(
                "tp",
                "TP",
                Some(GroupKind::Tp),
                term(
                    "exposed TP communication",
                    "TP-communication",
                    "lower TP, keep TP inside a node, or --tp-comm-overlap",
                    true,
                    0,
                ),
            ),
            CommKind::Cp => info(
                "cp",
                "CP",
                Some(GroupKind::Cp),
                term(
                    "exposed CP communication",
                    "CP-communication",
                    "overlap the ring or lower CP",
                    true,
                    1,
                ),
            ),
            CommKind::Ep => info(
                "ep",
                "EP",
                Some(GroupKind::Ep),
                term(
                    "expert all-to-all waits",
                    "EP-all-to-all",
                    "keep EP inside a node, or overlap the all-to-all (DualPipeV)",
                    true,
                    2,
                ),
            ),
            CommKind::ExpertTp => info(
                "expert_tp",
                "expert_TP",
                Some(GroupKind::ExpertTp),
                term(
                    "expert-TP all-gather/reduce-scatter",
                    "expert-TP-communication",
                    "a lower expert_tp (MoE Parallel Folding lets it differ from tp), or keep the expert-TP group inside a node",
                    true,
                    3,
                ),
            ),
            CommKind::Dp => info(
                "dp",
                "DP",
                Some(GroupKind::DpCp),
                term(
                    "exposed DP communication (in the step)",
                    "DP-communication",
                    "overlap gradient reduction and parameter gathers, or a lower ZeRO stage",
                    true,
                    4,
                ),
            ),
            CommKind::Pp => info(
                "pp",
                "PP",
                Some(GroupKind::Pp),
                term(
                    "exposed PP communication",
                    "PP-communication",
                    "fewer pipeline hops (lower pp or vpp) or faster links between stages",
                    false,
                    0,
                ),
            ),
            CommKind::Host => CommKindInfo {
                optional: true,
                ..info(
                    "host",
                    "host",
                    None,
                    term(
                        "activation offload copies (host link)",
                        "host-link",
                        "offload fewer layers (training.offload_activation_layers)",
                        false,
                        1,
                    ),
                )
            },
        }
    }
}

/// One figure per communication kind (bytes or seconds, as the field holding it says): `f64`
/// unless it says otherwise (whole bytes in the JSON are `PerGroup<u64>`).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PerGroup<T = f64>([T; CommKind::ALL.len()]);

impl<T> Index<CommKind> for PerGroup<T> {
    type Output = T;
    fn index(&self, k: CommKind) -> &T {
        &self.0[k as usize]
    }
}

impl<T> IndexMut<CommKind> for PerGroup<T> {
    fn index_mut(&mut self, k: CommKind) -> &mut T {
        &mut self.0[k as usize]
    }
}

impl<T: Copy> PerGroup<T> {
    /// Each kind and its figure, in [`CommKind::ALL`]'s order.
    pub fn iter(&self) -> impl Iterator<Item = (CommKind, T)> + '_ {
        CommKind::ALL.iter().map(|&k| (k, self[k]))
    }

    /// The figures `f` makes of these.
    pub fn map<U>(&self, f: impl Fn(T) -> U) -> PerGroup<U> {
        PerGroup(self.0.map(f))
    }
}

impl PerGroup {
    /// Adds `x` to the kind group `g`'s traffic counts under.
    pub fn add_group(&mut self, g: GroupKind, x: f64) {
        self[CommKind::of_group(g)] += x;
    }

    /// Adds `k` times `o`, kind by kind.
    pub fn add(&mut self, o: &PerGroup, k: f64) {
        for (a, b) in self.0.iter_mut().zip(&o.0) {
            *a += b * k;
        }
    }

    /// The larger of this and `o`, kind by kind.
    pub fn max(&mut self, o: &PerGroup) {
        for (a, b) in self.0.iter_mut().zip(&o.0) {
            *a = a.max(*b);
        }
    }

    /// The sum over the kinds.
    pub fn total(&self) -> f64 {
        self.0.iter().sum()
    }
}

impl<T: Serialize + Default + PartialEq> Serialize for PerGroup<T> {
    /// An object of the kinds' keys in [`CommKind::ALL`]'s order, an optional kind left out
    /// where its figure is zero.
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let zero = T::default();
        let kept = || {
            CommKind::ALL
                .iter()
                .filter(|k| !(k.info().optional && self[**k] == zero))
        };
        let mut map = s.serialize_map(Some(kept().count()))?;
        for &k in kept() {
            map.serialize_entry(k.key(), &self[k])?;
        }
        map.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The JSON is today's contract (docs/design.md): tp, cp, pp, dp, ep, expert_tp in that
    /// order, the host link only where it is not zero; every process group counts under its
    /// own key, the data-parallel ones under `dp`.
    #[test]
    fn serialises_as_the_json_contract_and_folds_the_dp_groups() {
        let mut g = PerGroup::<f64>::default();
        for (i, kind) in GroupKind::ALL.iter().enumerate() {
            g.add_group(*kind, (i + 1) as f64);
        }
        // Tp 1, Cp 2, Pp 3, Dp 4 + ExpertDp 6 + DpCp 7, Ep 5, ExpertTp 8.
        let text = serde_json::to_string(&g).unwrap();
        assert_eq!(
            text,
            r#"{"tp":1.0,"cp":2.0,"pp":3.0,"dp":17.0,"ep":5.0,"expert_tp":8.0}"#
        );
        g[CommKind::Host] = 0.5;
        let text = serde_json::to_string(&g.map(|x| (2.0 * x) as u64)).unwrap();
        assert_eq!(
            text,
            r#"{"tp":2,"cp":4,"pp":6,"dp":34,"ep":10,"expert_tp":16,"host":1}"#
        );
        assert_eq!(g.total(), 36.5);
    }

    /// The step breakdown's ranks order each part's kinds without ties, and every kind but the
    /// host link names the process group the tables show.
    #[test]
    fn every_kind_has_its_own_place_and_group() {
        for during in [true, false] {
            let mut ranks: Vec<u8> = CommKind::ALL
                .iter()
                .map(|k| k.info().term)
                .filter(|t| t.during_step == during)
                .map(|t| t.rank)
                .collect();
            let n = ranks.len();
            ranks.sort_unstable();
            ranks.dedup();
            assert_eq!(ranks.len(), n);
        }
        for k in CommKind::ALL {
            assert_eq!(k.info().group.is_none(), k == CommKind::Host, "{k:?}");
            assert_eq!(CommKind::ALL[k as usize], k);
        }
    }
}
