//! Rank layout: rank <-> (tp, cp, ep, dp, pp) coordinates for an order string (fastest first,
//! Megatron's default tp-cp-ep-dp-pp), the members of each process group, and whether a group
//! crosses a node boundary.
//!
//! EP folds into DP: the order's `ep` axis has ep ranks and its `dp` axis dp/ep ranks (the
//! expert data-parallel index); the dense DP index combines the two in their order.

use serde::Serialize;
use std::fmt;

/// One axis of the rank grid.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Axis {
    Tp,
    Cp,
    Ep,
    /// The expert-data-parallel part of DP (size dp / ep).
    Dp,
    Pp,
}

/// A process group kind: the axes its members vary along.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum GroupKind {
    Tp,
    Cp,
    Pp,
    /// Dense data parallel (varies ep and the expert-dp axis).
    Dp,
    /// Expert parallel.
    Ep,
    /// Data parallel of the routed experts: the ranks holding the same experts (the expert-dp
    /// axis, and CP, which Megatron folds into the expert-data-parallel group).
    ExpertDp,
    /// DP x CP: the replicas of dense parameters, over which gradients reduce and the
    /// distributed optimizer shards.
    DpCp,
}

impl GroupKind {
    pub const ALL: [GroupKind; 7] = [
        GroupKind::Tp,
        GroupKind::Cp,
        GroupKind::Pp,
        GroupKind::Dp,
        GroupKind::Ep,
        GroupKind::ExpertDp,
        GroupKind::DpCp,
    ];

    fn axes(self) -> &'static [Axis] {
        match self {
            GroupKind::Tp => &[Axis::Tp],
            GroupKind::Cp => &[Axis::Cp],
            GroupKind::Pp => &[Axis::Pp],
            GroupKind::Dp => &[Axis::Ep, Axis::Dp],
            GroupKind::Ep => &[Axis::Ep],
            GroupKind::ExpertDp => &[Axis::Cp, Axis::Dp],
            GroupKind::DpCp => &[Axis::Cp, Axis::Ep, Axis::Dp],
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            GroupKind::Tp => "tp",
            GroupKind::Cp => "cp",
            GroupKind::Pp => "pp",
            GroupKind::Dp => "dp",
            GroupKind::Ep => "ep",
            GroupKind::ExpertDp => "expert_dp",
            GroupKind::DpCp => "dp_cp",
        }
    }
}

impl fmt::Display for GroupKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A rank's coordinates; `dp` is the dense data-parallel index (0..dp).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Coords {
    pub tp: u32,
    pub cp: u32,
    pub ep: u32,
    pub dp: u32,
    pub pp: u32,
}

/// Errors building a layout.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum LayoutError {
    #[error("parallel.order: '{0}' must name tp, cp, ep, dp and pp once each, separated by '-'")]
    Order(String),
    #[error("parallel.ep: ep ({ep}) must divide dp ({dp})")]
    EpDp { ep: u32, dp: u32 },
    #[error("a degree is zero")]
    Zero,
}

/// The rank grid of one configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Layout {
    /// Axes fastest first, with their sizes.
    axes: [(Axis, u32); 5],
    pub tp: u32,
    pub cp: u32,
    pub ep: u32,
    pub dp: u32,
    pub pp: u32,
    pub gpus_per_node: u32,
}

impl Layout {
    pub fn new(
        order: &str,
        tp: u32,
        cp: u32,
        ep: u32,
        dp: u32,
        pp: u32,
        gpus_per_node: u32,
    ) -> Result<Layout, LayoutError> {
        if [tp, cp, ep, dp, pp, gpus_per_node].contains(&0) {
            return Err(LayoutError::Zero);
        }
        if dp % ep != 0 {
            return Err(LayoutError::EpDp { ep, dp });
        }
        let names: Vec<&str> = order.split('-').collect();
        let mut axes = [(Axis::Tp, 0); 5];
        let mut seen = [false; 5];
        if names.len() != 5 {
            return Err(LayoutError::Order(order.into()));
        }
        for (i, n) in names.iter().enumerate() {
            let (axis, size, idx) = match *n {
                "tp" => (Axis::Tp, tp, 0),
                "cp" => (Axis::Cp, cp, 1),
                "ep" => (Axis::Ep, ep, 2),
                "dp" => (Axis::Dp, dp / ep, 3),
                "pp" => (Axis::Pp, pp, 4),
                _ => return Err(LayoutError::Order(order.into())),
            };
            if seen[idx] {
                return Err(LayoutError::Order(order.into()));
            }
            seen[idx] = true;
            axes[i] = (axis, size);
        }
        Ok(Layout {
            axes,
            tp,
            cp,
            ep,
            dp,
            pp,
            gpus_per_node,
        })
    }

    /// The layout of a resolved configuration.
    pub fn of(r: &crate::config::Resolved) -> Layout {
        let p = &r.config.parallel;
        Layout::new(
            &p.order,
            p.tp,
            p.cp,
            p.ep,
            r.dp,
            p.pp,
            r.config.cluster.gpus_per_node,
        )
        .expect("validated configuration has a valid layout")
    }

    pub fn world(&self) -> u32 {
        self.axes.iter().map(|(_, s)| s).product()
    }

    fn position(&self, axis: Axis) -> usize {
        self.axes
            .iter()
            .position(|(a, _)| *a == axis)
            .expect("axis present")
    }

    fn digits(&self, rank: u32) -> [u32; 5] {
        let mut d = [0; 5];
        let mut r = rank;
        for (i, (_, size)) in self.axes.iter().enumerate() {
            d[i] = r % size;
            r /= size;
        }
        d
    }

    fn compose(&self, d: &[u32; 5]) -> u32 {
        let mut rank = 0;
        for i in (0..5).rev() {
            rank = rank * self.axes[i].1 + d[i];
        }
        rank
    }

    /// Coordinates of `rank`.
    pub fn coords(&self, rank: u32) -> Coords {
        let d = self.digits(rank);
        let at = |a: Axis| d[self.position(a)];
        let (ep_i, edp_i) = (at(Axis::Ep), at(Axis::Dp));
        let dense_dp = if self.position(Axis::Ep) < self.position(Axis::Dp) {
            ep_i + self.ep * edp_i
        } else {
            edp_i + (self.dp / self.ep) * ep_i
        };
        Coords {
            tp: at(Axis::Tp),
            cp: at(Axis::Cp),
            ep: ep_i,
            dp: dense_dp,
            pp: at(Axis::Pp),
        }
    }

    /// The rank at `c` (inverse of [`Layout::coords`]).
    pub fn rank(&self, c: Coords) -> u32 {
        let (ep_i, edp_i) = if self.position(Axis::Ep) < self.position(Axis::Dp) {
            (c.dp % self.ep, c.dp / self.ep)
        } else {
            let edp = self.dp / self.ep;
            (c.dp / edp, c.dp % edp)
        };
        let mut d = [0; 5];
        for (i, (a, _)) in self.axes.iter().enumerate() {
            d[i] = match a {
                Axis::Tp => c.tp,
                Axis::Cp => c.cp,
                Axis::Ep => ep_i,
                Axis::Dp => edp_i,
                Axis::Pp => c.pp,
            };
        }
        self.compose(&d)
    }

    /// Members (ascending) of the `kind` group that contains `rank`.
    pub fn group_of(&self, kind: GroupKind, rank: u32) -> Vec<u32> {
        let base = self.digits(rank);
        // Fastest-varying axis first: then the members come out in increasing rank order.
        let mut varied: Vec<usize> = kind.axes().iter().map(|a| self.position(*a)).collect();
        varied.sort_unstable();
        let size: u32 = varied.iter().map(|&i| self.axes[i].1).product();
        let members: Vec<u32> = (0..size)
            .map(|mut k| {
                let mut d = base;
                for &i in &varied {
                    d[i] = k % self.axes[i].1;
                    k /= self.axes[i].1;
                }
                self.compose(&d)
            })
            .collect();
        debug_assert!(members.windows(2).all(|w| w[0] < w[1]));
        members
    }

    /// Positions (fastest first) of the axes a `kind` group varies along that have more than one
    /// rank: two kinds with the same list have the same groups.
    pub fn varied_axes(&self, kind: GroupKind) -> Vec<usize> {
        let mut v: Vec<usize> = kind
            .axes()
            .iter()
            .map(|a| self.position(*a))
            .filter(|&i| self.axes[i].1 > 1)
            .collect();
        v.sort_unstable();
        v
    }

    /// Size, members in the first member's node, and nodes spanned of the `kind` group that
    /// contains `rank`, without building the member list.
    pub fn group_geometry(&self, kind: GroupKind, rank: u32) -> (u32, u32, u32) {
        let base = self.digits(rank);
        let varied = self.varied_axes(kind);
        let size: u32 = varied.iter().map(|&i| self.axes[i].1).product();
        let (mut first, mut per_node, mut nodes, mut last) = (u32::MAX, 0, 0, u32::MAX);
        for mut k in 0..size {
            let mut d = base;
            for &i in &varied {
                d[i] = k % self.axes[i].1;
                k /= self.axes[i].1;
            }
            // Members come in increasing rank order, so nodes do too.
            let node = self.node_of(self.compose(&d));
            if first == u32::MAX {
                first = node;
            }
            if node == first {
                per_node += 1;
            }
            if node != last {
                nodes += 1;
                last = node;
            }
        }
        (size, per_node, nodes)
    }

    /// Every group of `kind`, ordered by their lowest rank.
    pub fn groups(&self, kind: GroupKind) -> Vec<Vec<u32>> {
        let mut out = Vec::new();
        let mut seen = vec![false; self.world() as usize];
        for r in 0..self.world() {
            if !seen[r as usize] {
                let g = self.group_of(kind, r);
                for &m in &g {
                    seen[m as usize] = true;
                }
                out.push(g);
            }
        }
        out
    }

    /// Node index of a rank (ranks fill nodes in order).
    pub fn node_of(&self, rank: u32) -> u32 {
        rank / self.gpus_per_node
    }

    /// True when the members span more than one node.
    pub fn crosses_nodes(&self, members: &[u32]) -> bool {
        members
            .windows(2)
            .any(|w| self.node_of(w[0]) != self.node_of(w[1]))
    }

    /// True when the `kind` group of rank 0 spans nodes (all groups of a kind have the same
    /// shape, so this holds for every group when ranks fill whole nodes).
    pub fn kind_crosses_nodes(&self, kind: GroupKind) -> bool {
        self.groups(kind).iter().any(|g| self.crosses_nodes(g))
    }

    /// Cheap check: does the `kind` group of `rank` span nodes?
    pub fn group_crosses_nodes(&self, kind: GroupKind, rank: u32) -> bool {
        self.crosses_nodes(&self.group_of(kind, rank))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn megatron_context_parallel_doc_example() {
        // Megatron-LM docs, context_parallel.html: "TP 8, CP 2 on 16 GPUs: TP groups
        // [0..7] and [8..15]; CP groups [0, 8], [1, 9], ..., [7, 15]".
        let l = Layout::new("tp-cp-ep-dp-pp", 8, 2, 1, 1, 1, 8).unwrap();
        assert_eq!(
            l.groups(GroupKind::Tp),
            vec![(0..8).collect::<Vec<_>>(), (8..16).collect()]
        );
        let cp = l.groups(GroupKind::Cp);
        assert_eq!(cp.len(), 8);
        for (i, g) in cp.iter().enumerate() {
            assert_eq!(g, &vec![i as u32, i as u32 + 8]);
        }
        assert!(!l.kind_crosses_nodes(GroupKind::Tp));
        assert!(l.kind_crosses_nodes(GroupKind::Cp));
    }

    #[test]
    fn coords_round_trip_for_every_order() {
        for order in [
            "tp-cp-ep-dp-pp",
            "tp-cp-dp-ep-pp",
            "pp-dp-ep-cp-tp",
            "tp-pp-dp-cp-ep",
        ] {
            let l = Layout::new(order, 2, 2, 2, 4, 3, 8).unwrap();
            let mut seen = std::collections::HashSet::new();
            for r in 0..l.world() {
                let c = l.coords(r);
                assert!(c.dp < 4 && c.ep < 2 && c.tp < 2 && c.cp < 2 && c.pp < 3);
                assert_eq!(l.rank(c), r, "{order}");
                assert!(seen.insert((c.tp, c.cp, c.dp, c.pp)));
            }
        }
    }

    #[test]
    fn groups_partition_the_world_and_have_the_right_sizes() {
        let l = Layout::new("tp-cp-ep-dp-pp", 2, 2, 2, 4, 2, 8).unwrap();
        let sizes = [
            (GroupKind::Tp, 2),
            (GroupKind::Cp, 2),
            (GroupKind::Pp, 2),
            (GroupKind::Dp, 4),
            (GroupKind::Ep, 2),
            // The expert-dp axis (4 / ep 2) x CP 2.
            (GroupKind::ExpertDp, 4),
            (GroupKind::DpCp, 8),
        ];
        for (kind, size) in sizes {
            let gs = l.groups(kind);
            assert_eq!(gs.len() as u32 * size, l.world(), "{kind}");
            let mut all: Vec<u32> = gs.iter().flatten().copied().collect();
            all.sort_unstable();
            assert_eq!(all, (0..l.world()).collect::<Vec<_>>());
            // Members of a group share every coordinate the group does not vary.
            for g in &gs {
                assert_eq!(g.len() as u32, size);
                let c0 = l.coords(g[0]);
                for &m in g {
                    let c = l.coords(m);
                    match kind {
                        GroupKind::Tp => assert_eq!((c.cp, c.dp, c.pp), (c0.cp, c0.dp, c0.pp)),
                        GroupKind::Dp => assert_eq!((c.tp, c.cp, c.pp), (c0.tp, c0.cp, c0.pp)),
                        GroupKind::Ep => assert_eq!(
                            (c.tp, c.cp, c.pp, c.dp / 2),
                            (c0.tp, c0.cp, c0.pp, c0.dp / 2)
                        ),
                        _ => {}
                    }
                }
            }
        }
    }

    #[test]
    fn geometry_without_the_member_list_equals_the_member_list() {
        for order in ["tp-cp-ep-dp-pp", "pp-dp-ep-cp-tp", "tp-pp-dp-cp-ep"] {
            for gpn in [1, 4, 8, 16] {
                let l = Layout::new(order, 4, 2, 2, 8, 4, gpn).unwrap();
                for kind in GroupKind::ALL {
                    for rank in [0, 5, 77, l.world() - 1] {
                        let g = l.group_of(kind, rank);
                        let mut nodes: Vec<u32> = g.iter().map(|&r| l.node_of(r)).collect();
                        let first = nodes[0];
                        let per_node = nodes.iter().filter(|&&n| n == first).count() as u32;
                        nodes.dedup();
                        let expect = (g.len() as u32, per_node, nodes.len() as u32);
                        assert_eq!(
                            l.group_geometry(kind, rank),
                            expect,
                            "{order} gpn {gpn} {kind} rank {rank}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn bad_order_is_rejected() {
        assert!(matches!(
            Layout::new("tp-cp-dp-pp", 1, 1, 1, 1, 1, 8),
            Err(LayoutError::Order(_))
        ));
        assert!(matches!(
            Layout::new("tp-tp-ep-dp-pp", 1, 1, 1, 1, 1, 8),
            Err(LayoutError::Order(_))
        ));
    }
}
