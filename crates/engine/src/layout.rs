//! Rank layout: rank <-> (tp, cp, ep, dp, pp) coordinates for an order string (fastest first,
//! Megatron's default tp-cp-ep-dp-pp), the members of each process group, and whether a group
//! crosses a node boundary or an NVLink domain's (ranks fill nodes, and nodes fill domains, in
//! order: a GB200 NVL72 rack is one domain of 18 nodes of 4 GPUs).
//!
//! Two grids lie over the same ranks, in the same order string, as Megatron-Core's
//! `initialize_model_parallel` (megatron/core/parallel_state.py) builds them with its
//! `RankGenerator`: the dense grid (tp, cp, dp, pp; its `ep` axis has one rank, as Megatron's
//! `decoder_rank_generator` passes ep = 1) holds the TP, CP, DP and PP groups; the expert grid
//! of MoE Parallel Folding (Liu et al. 2025, "MoE Parallel Folding: Heterogeneous Parallelism
//! Mappings for Efficient Large-Scale MoE Model Training with Megatron Core"; Megatron's
//! `expert_decoder_rank_generator`) has tp = expert_tp, cp = 1, ep, and dp = the expert
//! data-parallel size tp x cp x dp / (expert_tp x ep), and holds the EP, expert-DP and expert-TP
//! groups. EP need not divide DP: only expert_tp x ep must divide tp x cp x dp
//! ([`Layout::with_expert_tp`]).

use arrayvec::ArrayVec;
pub use parsim_plan::group::{Coords, GroupKind};
use serde::Serialize;

/// One axis of the rank grid.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Axis {
    Tp,
    Cp,
    /// Expert parallelism: one rank on the dense grid, ep on the expert grid.
    Ep,
    /// Data parallelism: dp on the dense grid, the expert data-parallel size on the expert one.
    Dp,
    Pp,
}

/// The axes a group's members vary along, on its grid (the dense grid for the dense groups,
/// the expert grid for EP, expert DP and expert TP).
fn axes(kind: GroupKind) -> &'static [Axis] {
    match kind {
        GroupKind::Tp => &[Axis::Tp],
        GroupKind::Cp => &[Axis::Cp],
        GroupKind::Pp => &[Axis::Pp],
        GroupKind::Dp => &[Axis::Ep, Axis::Dp],
        GroupKind::Ep => &[Axis::Ep],
        GroupKind::ExpertDp => &[Axis::Cp, Axis::Dp],
        GroupKind::DpCp => &[Axis::Cp, Axis::Ep, Axis::Dp],
        GroupKind::ExpertTp => &[Axis::Tp],
    }
}

/// Errors building a layout.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum LayoutError {
    #[error("parallel.order: '{0}' must name tp, cp, ep, dp and pp once each, separated by '-'")]
    Order(String),
    #[error("a degree is zero")]
    Zero,
    #[error(
        "tp x cp x dp x pp = {world} ranks: a rank is a 32-bit number, so at most {}",
        u32::MAX
    )]
    TooLarge { world: u128 },
    #[error(
        "parallel.expert_tp: expert_tp x ep ({etp} x {ep}) must divide tp x cp x dp ({ranks})"
    )]
    ExpertTp { etp: u32, ep: u32, ranks: u64 },
    #[error("parallel.order: the expert grid (MoE Parallel Folding: tp = expert_tp, cp folded into expert data parallelism) must have the dense grid's pipeline groups, as Megatron-Core asserts; put pp last in the order")]
    ExpertPipeline,
}

/// The rank grid's axes with their sizes, fastest first.
type Grid = [(Axis, u32); 5];

fn position(grid: &Grid, axis: Axis) -> usize {
    grid.iter()
        .position(|(a, _)| *a == axis)
        .expect("axis present")
}

/// A rank's digit on each axis of `grid`.
fn digits(grid: &Grid, rank: u32) -> [u32; 5] {
    let mut d = [0; 5];
    let mut r = rank;
    for (i, (_, size)) in grid.iter().enumerate() {
        d[i] = r % size;
        r /= size;
    }
    d
}

/// The rank with digits `d` on `grid` (inverse of [`digits`]).
fn compose(grid: &Grid, d: &[u32; 5]) -> u32 {
    let mut rank = 0;
    for i in (0..5).rev() {
        rank = rank * grid[i].1 + d[i];
    }
    rank
}

/// Ranks spanned by the axes of `grid` before pp: the stride of the pipeline axis, which fixes
/// the pipeline groups (two grids of one world with the same pp size and stride share them).
fn pipeline_stride(grid: &Grid) -> u64 {
    grid.iter()
        .take_while(|(a, _)| *a != Axis::Pp)
        .map(|&(_, s)| u64::from(s))
        .product()
}

/// The rank grid of one configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Layout {
    /// The dense grid's axes fastest first, with their sizes (ep has one rank).
    axes: Grid,
    /// The expert grid of MoE Parallel Folding: the axes of `axes` with tp = expert_tp, cp =
    /// 1, ep, and dp = the expert data-parallel size. The Ep, ExpertDp and ExpertTp groups lie
    /// on it.
    expert: Grid,
    /// True once [`Layout::with_expert_tp`] placed an MoE model's expert groups (a dense
    /// model's layout has no expert groups to report).
    moe: bool,
    /// Expert tensor parallelism (= tp until [`Layout::with_expert_tp`]).
    pub etp: u32,
    pub tp: u32,
    pub cp: u32,
    pub ep: u32,
    pub dp: u32,
    pub pp: u32,
    pub gpus_per_node: u32,
    /// GPUs per NVLink domain (= `gpus_per_node` unless [`Layout::with_nvlink_domain`]): a
    /// group inside one domain runs on NVLink even across nodes.
    pub nvlink_domain_size: u32,
}

impl Layout {
    /// The grids of tp x cp x dp x pp ranks in `order` with `ep`-way expert parallelism (its
    /// expert TP Megatron's default, tp, where that fits; see [`Layout::with_expert_tp`]).
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
        // Ranks are u32 (and so every product of degrees below, each dividing the world).
        let world = [tp, cp, dp, pp]
            .iter()
            .map(|&d| u128::from(d))
            .product::<u128>();
        if world > u128::from(u32::MAX) {
            return Err(LayoutError::TooLarge { world });
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
                "ep" => (Axis::Ep, 1, 2),
                "dp" => (Axis::Dp, dp, 3),
                "pp" => (Axis::Pp, pp, 4),
                _ => return Err(LayoutError::Order(order.into())),
            };
            if seen[idx] {
                return Err(LayoutError::Order(order.into()));
            }
            seen[idx] = true;
            axes[i] = (axis, size);
        }
        let mut l = Layout {
            axes,
            expert: axes,
            moe: false,
            etp: tp,
            tp,
            cp,
            ep,
            dp,
            pp,
            gpus_per_node,
            nvlink_domain_size: gpus_per_node,
        };
        // Megatron's default expert_tp = tp where tp x ep divides tp x cp x dp; otherwise the
        // largest expert_tp dividing tp that fits, for [`Layout::with_expert_tp`] to replace.
        let ranks = u64::from(tp) * u64::from(cp) * u64::from(dp);
        let etp = (1..=tp)
            .rev()
            .find(|&e| tp % e == 0 && ranks % (u64::from(e) * u64::from(ep)) == 0)
            .unwrap_or(tp);
        l.etp = etp;
        l.expert = l.expert_grid(etp)?;
        Ok(l)
    }

    /// The expert grid for expert TP `etp`: the dense grid's order with tp = `etp`, cp = 1,
    /// ep, and dp = tp x cp x dp / (`etp` x ep), or an error when `etp` x ep does not divide
    /// tp x cp x dp (Megatron-Core's `expert_data_parallel_size` would not be whole).
    fn expert_grid(&self, etp: u32) -> Result<Grid, LayoutError> {
        if etp == 0 {
            return Err(LayoutError::Zero);
        }
        let ranks = u64::from(self.tp) * u64::from(self.cp) * u64::from(self.dp);
        let cells = u64::from(etp) * u64::from(self.ep);
        if ranks % cells != 0 {
            return Err(LayoutError::ExpertTp {
                etp,
                ep: self.ep,
                ranks,
            });
        }
        let edp = u32::try_from(ranks / cells).map_err(|_| LayoutError::ExpertTp {
            etp,
            ep: self.ep,
            ranks,
        })?;
        let (ep, pp) = (self.ep, self.pp);
        Ok(self.axes.map(|(a, _)| {
            let size = match a {
                Axis::Tp => etp,
                Axis::Cp => 1,
                Axis::Ep => ep,
                Axis::Dp => edp,
                Axis::Pp => pp,
            };
            (a, size)
        }))
    }

    /// This layout with NVLink domains of `size` GPUs (consecutive ranks, whole nodes).
    pub fn with_nvlink_domain(mut self, size: u32) -> Result<Layout, LayoutError> {
        if size == 0 {
            return Err(LayoutError::Zero);
        }
        self.nvlink_domain_size = size;
        Ok(self)
    }

    /// The layout of a resolved configuration; an MoE model's expert groups folded with its
    /// expert_tp (a dense model has no expert groups to fold).
    pub fn of(r: &crate::config::Resolved) -> Layout {
        let p = &r.config.parallel;
        Layout::new(
            &p.order,
            p.tp,
            p.cp,
            p.ep,
            r.dp,
            p.pp,
            r.config.cluster.per_node(),
        )
        .and_then(|l| l.with_nvlink_domain(r.nvlink_domain.size))
        .and_then(|l| l.with_experts_of(&r.config))
        .expect("validated configuration has a valid layout")
    }

    /// This layout with `cfg`'s expert groups: an MoE model's folded with its expert_tp
    /// ([`Layout::with_expert_tp`]); a dense model has no experts, so nothing to fold.
    pub fn with_experts_of(self, cfg: &crate::config::Config) -> Result<Layout, LayoutError> {
        if cfg.model.is_moe() {
            self.with_expert_tp(cfg.parallel.etp())
        } else {
            Ok(self)
        }
    }

    /// This layout with the expert groups of MoE Parallel Folding for expert TP `etp`, as
    /// Megatron-Core's `expert_decoder_rank_generator` builds them: the same order with tp =
    /// `etp`, cp = 1 (CP folds into expert data parallelism), ep, and dp = tp x cp x dp /
    /// (`etp` x ep). With `etp` = tp, cp = 1 and ep dividing dp, the EP and expert-DP groups
    /// split the dense DP group; otherwise, e.g. tp 8, expert_tp 1, ep 8, the EP group is 8
    /// consecutive ranks, and with ep above dp it spans TP or CP ranks too. Megatron-Core
    /// asserts both grids have the same pipeline groups; so does this.
    pub fn with_expert_tp(mut self, etp: u32) -> Result<Layout, LayoutError> {
        let grid = self.expert_grid(etp)?;
        if self.pp > 1 && pipeline_stride(&grid) != pipeline_stride(&self.axes) {
            return Err(LayoutError::ExpertPipeline);
        }
        self.etp = etp;
        self.expert = grid;
        self.moe = true;
        Ok(self)
    }

    /// True when an MoE model's expert groups ([`Layout::with_expert_tp`]) do not simply split
    /// the dense DP group: expert_tp != tp, cp > 1, or ep not dividing dp (MoE Parallel
    /// Folding proper).
    pub fn is_folded(&self) -> bool {
        self.moe && (self.etp != self.tp || self.cp > 1 || self.dp % self.ep != 0)
    }

    /// True when the `kind` group lies on the expert grid (Ep, ExpertDp and ExpertTp).
    fn on_expert_grid(kind: GroupKind) -> bool {
        matches!(
            kind,
            GroupKind::Ep | GroupKind::ExpertDp | GroupKind::ExpertTp
        )
    }

    /// The grid a `kind` group lies on.
    fn grid(&self, kind: GroupKind) -> &Grid {
        if Self::on_expert_grid(kind) {
            &self.expert
        } else {
            &self.axes
        }
    }

    pub fn world(&self) -> u32 {
        self.axes.iter().map(|(_, s)| s).product()
    }

    fn position(&self, axis: Axis) -> usize {
        position(&self.axes, axis)
    }

    /// Coordinates of `rank`: the dense grid's digits, and the expert grid's ep digit.
    pub fn coords(&self, rank: u32) -> Coords {
        let d = digits(&self.axes, rank);
        let at = |a: Axis| d[self.position(a)];
        let e = digits(&self.expert, rank);
        Coords {
            tp: at(Axis::Tp),
            cp: at(Axis::Cp),
            ep: e[position(&self.expert, Axis::Ep)],
            dp: at(Axis::Dp),
            pp: at(Axis::Pp),
        }
    }

    /// The rank at `c`'s dense coordinates (inverse of [`Layout::coords`]; `c.ep` follows
    /// from them).
    pub fn rank(&self, c: Coords) -> u32 {
        let mut d = [0; 5];
        for (i, (a, _)) in self.axes.iter().enumerate() {
            d[i] = match a {
                Axis::Tp => c.tp,
                Axis::Cp => c.cp,
                Axis::Ep => 0,
                Axis::Dp => c.dp,
                Axis::Pp => c.pp,
            };
        }
        compose(&self.axes, &d)
    }

    /// Members (ascending) of the `kind` group that contains `rank`.
    pub fn group_of(&self, kind: GroupKind, rank: u32) -> Vec<u32> {
        members(self.grid(kind), axes(kind), rank)
    }

    /// Members (ascending) of the expert-TP group that contains `rank`: the ranks over which
    /// each routed expert's intermediate size splits (the expert grid's `tp` axis; the TP
    /// group when not folded).
    pub fn expert_tp_group(&self, rank: u32) -> Vec<u32> {
        self.group_of(GroupKind::ExpertTp, rank)
    }

    /// (rank stride, size) of each axis a `kind` group varies along that has more than one
    /// rank, fastest first: two kinds with the same list have the same groups, on either grid.
    pub fn varied_axes(&self, kind: GroupKind) -> ArrayVec<(u32, u32), 5> {
        let grid = self.grid(kind);
        varied_positions(grid, axes(kind))
            .into_iter()
            .map(|i| (grid[..i].iter().map(|&(_, s)| s).product(), grid[i].1))
            .collect()
    }

    /// Size, members in the first member's NVLink domain, and domains spanned of the `kind`
    /// group that contains `rank`, without building the member list: the link classes the group
    /// runs on (NVLink inside a domain, the network across). With the node as the domain (the
    /// default) these are members per node and nodes.
    pub fn group_geometry(&self, kind: GroupKind, rank: u32) -> (u32, u32, u32) {
        let grid = self.grid(kind);
        let mut base = digits(grid, rank);
        let varied = varied_positions(grid, axes(kind));
        // Members in increasing rank order (the fastest varied axis first), stepped as an
        // odometer: each varied axis adds its stride, and wrapping takes back its span.
        let mut odometer = [(0u64, 0u32, 0u32); 5]; // (stride, size, digit)
        for (slot, &i) in odometer.iter_mut().zip(&varied) {
            let stride: u64 = grid[..i].iter().map(|&(_, s)| u64::from(s)).product();
            *slot = (stride, grid[i].1, 0);
            base[i] = 0;
        }
        let odometer = &mut odometer[..varied.len()];
        let size: u32 = odometer.iter().map(|&(_, n, _)| n).product();
        let mut member = u64::from(compose(grid, &base));
        let span = u64::from(self.nvlink_domain_size);
        let domain = |m: u64| m / span;
        let first = domain(member);
        // The fastest axis walks a run of members in one arithmetic step (the others step
        // between runs): a run's domains are its ends' and those between (every one when a
        // step crosses a whole domain), and members in rising order keep its domains sorted.
        let (step, run) = odometer
            .first()
            .map_or((1, 1), |&(stride, n, _)| (stride, n));
        let outer = &mut odometer[varied.len().min(1)..];
        let (mut per_node, mut nodes, mut last) = (0u32, 0u32, u64::MAX);
        for _ in 0..size / run {
            let (lo, hi) = (domain(member), domain(member + step * u64::from(run - 1)));
            if lo == first {
                let in_first = ((first + 1) * span - member).div_ceil(step);
                per_node += in_first.min(u64::from(run)) as u32;
            }
            let spanned = if step >= span {
                run
            } else {
                (hi - lo + 1) as u32
            };
            nodes += spanned - u32::from(lo == last);
            last = hi;
            for (stride, n, digit) in outer.iter_mut() {
                *digit += 1;
                member += *stride;
                if *digit < *n {
                    break;
                }
                *digit = 0;
                member -= *stride * u64::from(*n);
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

    /// NVLink domain index of a rank (ranks fill domains in order).
    pub fn domain_of(&self, rank: u32) -> u32 {
        rank / self.nvlink_domain_size
    }

    /// True when the members span more than one NVLink domain (so the group uses the network).
    pub fn crosses_domains(&self, members: &[u32]) -> bool {
        members
            .windows(2)
            .any(|w| self.domain_of(w[0]) != self.domain_of(w[1]))
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

/// Positions on `grid` (fastest first) of `axes` that have more than one rank.
fn varied_positions(grid: &Grid, axes: &[Axis]) -> ArrayVec<usize, 5> {
    let mut v: ArrayVec<usize, 5> = axes
        .iter()
        .map(|a| position(grid, *a))
        .filter(|&i| grid[i].1 > 1)
        .collect();
    v.sort_unstable();
    v
}

/// Members (ascending) of the group of `rank` that varies `axes` of `grid`.
fn members(grid: &Grid, axes: &[Axis], rank: u32) -> Vec<u32> {
    let base = digits(grid, rank);
    // Fastest-varying axis first: then the members come out in increasing rank order.
    let varied = varied_positions(grid, axes);
    let size: u32 = varied.iter().map(|&i| grid[i].1).product();
    let members: Vec<u32> = (0..size)
        .map(|mut k| {
            let mut d = base;
            for &i in &varied {
                d[i] = k % grid[i].1;
                k /= grid[i].1;
            }
            compose(grid, &d)
        })
        .collect();
    debug_assert!(members.windows(2).all(|w| w[0] < w[1]));
    members
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
            // The expert grid's dp axis: tp x cp x dp / (expert_tp x ep) = 2 x 2 x 4 / (2 x 2).
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
                        // Megatron's expert grid folds CP into EP and expert DP: the EP
                        // group keeps tp and pp, and holds each EP index once.
                        GroupKind::Ep => {
                            assert_eq!((c.tp, c.pp), (c0.tp, c0.pp));
                            let eps: Vec<u32> = g.iter().map(|&x| l.coords(x).ep).collect();
                            assert_eq!(eps, (0..size).collect::<Vec<_>>());
                        }
                        _ => {}
                    }
                }
            }
        }
    }

    #[test]
    fn geometry_without_the_member_list_equals_the_member_list() {
        for order in ["tp-cp-ep-dp-pp", "pp-dp-ep-cp-tp", "tp-pp-dp-cp-ep"] {
            for (gpn, etp) in [
                (1, None),
                (2, None),
                (4, Some(1)),
                (8, None),
                (8, Some(8)),
                (16, Some(2)),
                (32, None),
            ] {
                let l = Layout::new(order, 4, 2, 2, 8, 4, gpn).unwrap();
                // Folded where Megatron's rule allows it (pp mid-order may be refused).
                let l = match etp {
                    Some(e) => l.clone().with_expert_tp(e).unwrap_or(l),
                    None => l,
                };
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

    /// Megatron-Core's expert rank generator (parallel_state.py, `RankGenerator(tp=expert_tp,
    /// ep=ep, dp=world / (expert_tp x ep x pp), cp=1, order)`), worked by hand for tp 8,
    /// expert_tp 1, ep 8 on 64 GPUs (dp 8): the expert grid is etp 1 x ep 8 x edp 8, so the EP
    /// groups are 8 consecutive ranks {8j..8j+7} (one node) and the expert-DP groups stride 8;
    /// the dense grid's ep axis had stride tp = 8 (8 nodes).
    #[test]
    fn expert_tp_1_under_tp_8_puts_ep_inside_a_node() {
        let dense = Layout::new("tp-cp-ep-dp-pp", 8, 1, 8, 8, 1, 8).unwrap();
        assert_eq!(
            dense.group_of(GroupKind::Ep, 0),
            (0..8).map(|j| 8 * j).collect::<Vec<_>>()
        );
        assert_eq!(dense.group_geometry(GroupKind::Ep, 0), (8, 1, 8));
        let l = dense.clone().with_expert_tp(1).unwrap();
        assert!(l.is_folded());
        for r in 0..64 {
            let j = r / 8;
            assert_eq!(
                l.group_of(GroupKind::Ep, r),
                (8 * j..8 * j + 8).collect::<Vec<_>>()
            );
            assert_eq!(
                l.group_of(GroupKind::ExpertDp, r),
                (0..8).map(|i| r % 8 + 8 * i).collect::<Vec<_>>()
            );
            assert_eq!(l.expert_tp_group(r), vec![r]);
            // The dense groups stay.
            assert_eq!(
                l.group_of(GroupKind::Tp, r),
                dense.group_of(GroupKind::Tp, r)
            );
            assert_eq!(
                l.group_of(GroupKind::Dp, r),
                dense.group_of(GroupKind::Dp, r)
            );
        }
        assert_eq!(l.group_geometry(GroupKind::Ep, 0), (8, 8, 1));
        assert_eq!(l.group_geometry(GroupKind::ExpertDp, 0), (8, 1, 8));
        assert!(!l.kind_crosses_nodes(GroupKind::Ep));
    }

    /// EP above DP (Megatron-Core's grid: only expert_tp x ep | tp x cp x dp): tp 2, ep 4, dp 2
    /// with expert_tp 1 is etp 1 x ep 4 x edp 1, so the EP group is the stage's 4 ranks while
    /// the dense DP group ({0, 2}, stride tp) keeps its 2; expert_tp 2 x ep 4 over 4 is refused.
    #[test]
    fn ep_above_dp_spans_the_stage() {
        let l = Layout::new("tp-cp-ep-dp-pp", 2, 1, 4, 2, 1, 8).unwrap();
        assert_eq!(l.etp, 1);
        assert_eq!(l.group_of(GroupKind::Ep, 3), vec![0, 1, 2, 3]);
        assert_eq!(l.group_of(GroupKind::Dp, 0), vec![0, 2]);
        assert_eq!(l.group_of(GroupKind::ExpertDp, 1), vec![1]);
        assert_eq!(
            (0..4).map(|r| l.coords(r).ep).collect::<Vec<_>>(),
            [0, 1, 2, 3]
        );
        assert!(matches!(
            l.with_expert_tp(2),
            Err(LayoutError::ExpertTp {
                etp: 2,
                ep: 4,
                ranks: 4
            })
        ));
    }

    /// With expert_tp = tp and cp = 1 the expert grid is the dense one (tp, ep, dp / ep in the
    /// same order), for any order: nothing is folded.
    #[test]
    fn expert_tp_equal_to_tp_without_cp_folds_nothing() {
        for order in ["tp-cp-ep-dp-pp", "pp-dp-ep-cp-tp", "tp-pp-dp-cp-ep"] {
            let dense = Layout::new(order, 4, 1, 2, 8, 2, 8).unwrap();
            let l = dense.clone().with_expert_tp(4).unwrap();
            assert!(!l.is_folded());
            for r in 0..l.world() {
                for kind in GroupKind::ALL {
                    assert_eq!(l.group_of(kind, r), dense.group_of(kind, r), "{order}");
                }
                assert_eq!(l.expert_tp_group(r), dense.group_of(GroupKind::Tp, r));
            }
        }
    }

    /// Megatron-Core asserts the expert grid keeps the pipeline groups: pp after tp with
    /// expert_tp 1 under tp 2 does not; an expert_tp that divides nothing is refused too.
    #[test]
    fn an_expert_grid_that_moves_the_pipeline_is_refused() {
        let l = Layout::new("tp-pp-cp-ep-dp", 2, 1, 1, 4, 2, 8).unwrap();
        assert_eq!(
            l.clone().with_expert_tp(1),
            Err(LayoutError::ExpertPipeline)
        );
        assert!(l.clone().with_expert_tp(2).is_ok());
        assert!(matches!(
            l.with_expert_tp(3),
            Err(LayoutError::ExpertTp { etp: 3, .. })
        ));
    }

    /// A GB200 NVL72 rack: trays (nodes) of 4 GPUs, one NVLink domain of 72. A TP group of 8
    /// spans two trays but one domain; DP groups of stride 8 over 144 GPUs span two racks, 9
    /// members in each; the node as the domain (the default) gives the per-node geometry.
    #[test]
    fn geometry_counts_nvlink_domains_not_nodes() {
        let l = Layout::new("tp-cp-ep-dp-pp", 8, 1, 1, 18, 1, 4)
            .unwrap()
            .with_nvlink_domain(72)
            .unwrap();
        assert_eq!(l.group_geometry(GroupKind::Tp, 0), (8, 8, 1));
        assert_eq!(l.group_geometry(GroupKind::Dp, 0), (18, 9, 2));
        let g = l.group_of(GroupKind::Tp, 0);
        assert!(l.crosses_nodes(&g) && !l.crosses_domains(&g));
        assert_eq!((l.node_of(75), l.domain_of(75)), (18, 1));
        let trays = Layout::new("tp-cp-ep-dp-pp", 8, 1, 1, 18, 1, 4).unwrap();
        assert_eq!(trays.group_geometry(GroupKind::Tp, 0), (8, 4, 2));
        assert_eq!(trays.clone().with_nvlink_domain(0), Err(LayoutError::Zero));
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

    /// A world past 2^32 - 1 ranks (rank numbers are u32) is refused, not wrapped.
    #[test]
    fn a_world_past_32_bits_is_refused() {
        let e = Layout::new("tp-cp-ep-dp-pp", 1 << 16, 1 << 16, 1, 2, 1, 8).unwrap_err();
        assert!(
            matches!(e, LayoutError::TooLarge { world } if world == 1 << 33),
            "{e}"
        );
        assert!(Layout::new("tp-cp-ep-dp-pp", 1 << 16, 1 << 14, 1, 2, 1, 8).is_ok());
    }
}
