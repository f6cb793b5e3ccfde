//! What a collective costs over the cluster's links. All-reduce, all-gather and reduce-scatter
//! are timed by NCCL's own tuning model ([`nccl`]: ring, tree and NVLink SHARP by message
//! size, over the group's NVLink and its share of the node's NICs) where the profile names an
//! NCCL generation (`links.nccl`); pipeline sends and profiles without one use the
//! alpha-beta ring model (Thakur et al. 2005, "Optimization of Collective Communication
//! Operations in MPICH") on NVLink inside a node and on the network across nodes; an
//! all-to-all across nodes sends each peer's slice over the link to that peer ([`all_to_all`]).

pub mod all_to_all;
pub mod ep_dispatch;
mod model_cache;
pub mod nccl;
pub mod nccl_search;

use crate::config::{GpuProfile, Link, NcclArch};
use crate::layout::{GroupKind, Layout};
use crate::model::CollectiveKind;
use nccl::{CollectiveModel, Fabric, Graphs};
use parsim_plan::op_timing::Placement;

/// Seconds of a ring collective: alpha + factor x B / bandwidth, with the ring factors
/// ([`CollectiveKind::bus_factor`]) 2(n-1)/n (all-reduce), (n-1)/n (all-gather,
/// reduce-scatter, all-to-all) and 1 (broadcast, send).
pub fn ring_s(kind: CollectiveKind, bytes: f64, n: u32, bandwidth: f64, latency_s: f64) -> f64 {
    if n <= 1 || bytes <= 0.0 {
        return 0.0;
    }
    latency_s + kind.bus_factor(n) * bytes / bandwidth
}

/// A collective the profile's tables time: `wire_s` on the wire, plus the measured host gap
/// and synchronisation (`tables.collective.rendezvous_s`), which the timings keep apart.
fn table_time(t: &crate::config::tables::RateTables, wire_s: f64) -> CollectiveTime {
    CollectiveTime {
        wire_s,
        pipeline_s: 0.0,
        host_gap_s: t.host_gap_s() + t.collective_rendezvous_s(),
    }
}

/// How one group kind sits on the cluster: its size, members per NVLink domain, domains spanned
/// (a domain is a node unless `cluster.nvlink_domain_size` joins several: NCCL's multi-node
/// NVLink sees a GB200 NVL72 rack as one node).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GroupGeometry {
    pub size: u32,
    pub per_node: u32,
    pub nodes: u32,
}

impl GroupGeometry {
    /// A group of `n` ranks where only its placement is known (a measured op's key): all in one
    /// NVLink domain, or across the network with one member per domain (the flat ring on the
    /// inter-node link; NCCL's hierarchy is not assumed).
    pub fn of_placement(placement: Placement, n: u32) -> GroupGeometry {
        match placement {
            Placement::IntraNode => GroupGeometry {
                size: n,
                per_node: n,
                nodes: 1,
            },
            Placement::InterNode => GroupGeometry {
                size: n,
                per_node: 1,
                nodes: n,
            },
        }
    }
}

/// The group a collective runs over: a kind of the layout's groups (its shape and NCCL models
/// read off the layout), or a shape given outright.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum CollectiveGroup {
    Kind(GroupKind),
    Shape(GroupGeometry),
}

/// One collective's seconds.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CollectiveTime {
    /// From the first byte sent to the last received, latency included.
    pub wire_s: f64,
    /// Of `wire_s`, NCCL's chunk pipeline inside a node, which a copy-engine transfer does not
    /// pay (0 where NCCL's model did not time it).
    pub pipeline_s: f64,
    /// The measured host gap and synchronisation (`tables.collective.rendezvous_s`), where
    /// the profile's collective table timed it (else 0).
    pub host_gap_s: f64,
}

impl CollectiveTime {
    /// `wire_s` on the wire, nothing else.
    fn on_wire(wire_s: f64) -> CollectiveTime {
        CollectiveTime {
            wire_s,
            ..CollectiveTime::default()
        }
    }
}

/// The cluster's links as every group kind of one configuration sees them (from the rank
/// layout): the intra- and inter-node link classes and each kind's geometry.
#[derive(Debug, Clone)]
pub struct Network {
    pub intra: Link,
    pub inter: Link,
    geometry: [GroupGeometry; GroupKind::ALL.len()],
    /// NCCL's generation from the profile, `None` for the alpha-beta model.
    nccl: Option<NcclArch>,
    /// NCCL's constants per distinct group shape and tuned collective (as [`tuned_index`]),
    /// computed once per layout so that a call is a few multiply-adds.
    models: Vec<[CollectiveModel; 3]>,
    /// Per group kind (as [`GroupKind::ALL`]): its shape's entry in `models`.
    model_of: [usize; GroupKind::ALL.len()],
    /// The profile's collective and host-gap tables when it has a collective table
    /// ([`Self::table_collective_s`]).
    tables: Option<Box<crate::config::RateTables>>,
    /// How the EP group's all-to-all calls run when not NCCL's all-to-all
    /// ([`ep_dispatch::EpDispatch`]).
    ep_dispatch: Option<ep_dispatch::EpDispatch>,
}

/// The tuned collectives' slot in [`Network`]'s cache.
fn tuned_index(coll: CollectiveKind) -> Option<usize> {
    match coll {
        CollectiveKind::AllReduce => Some(0),
        CollectiveKind::AllGather => Some(1),
        CollectiveKind::ReduceScatter => Some(2),
        CollectiveKind::AllToAll | CollectiveKind::Broadcast | CollectiveKind::SendRecv => None,
    }
}

const TUNED: [CollectiveKind; 3] = [
    CollectiveKind::AllReduce,
    CollectiveKind::AllGather,
    CollectiveKind::ReduceScatter,
];

/// NCCL's models of `colls` over `n` ranks of a group with `per_node` members on each of
/// `nodes` nodes, sharing one topology search: NVLink inside, and across nodes the members' own
/// NICs (rail-optimised: each GPU's share of the node's NICs is `inter.bandwidth_bytes_per_s`,
/// after `cluster.nics_per_node`). The model the nccl-tests tables check, the chunk pipeline's
/// overhead inside a node included ([`nccl::PIPELINE_OVERHEAD_S`]); a TP transfer
/// Megatron-Core overlaps through its userbuffers (copy engines, not NCCL kernels) leaves that
/// part out ([`Network::collective_parts_s`]).
fn nccl_models<const K: usize>(
    arch: NcclArch,
    inter: &Link,
    colls: [CollectiveKind; K],
    n: u32,
    per_node: u32,
    nodes: u32,
) -> [CollectiveModel; K] {
    let fabric = Fabric::of(arch, per_node.max(1), inter.bandwidth_bytes_per_s);
    let graphs = Graphs::search(&fabric, n, nodes.max(1));
    colls.map(|c| CollectiveModel::with_graphs(&fabric, &graphs, c, n, nodes.max(1)))
}

impl Network {
    /// Reads each group kind's geometry off the group of rank 0 (all groups of a kind have the
    /// same shape when ranks fill nodes in order).
    pub fn new(layout: &Layout, gpu: &GpuProfile) -> Network {
        // Kinds that vary the same non-trivial axes (e.g. dp and expert_dp when ep = 1) share
        // one computation.
        let mut seen: Vec<(arrayvec::ArrayVec<(u32, u32), 5>, GroupGeometry)> =
            Vec::with_capacity(GroupKind::ALL.len());
        let geometry = GroupKind::ALL.map(|k| {
            let axes = layout.varied_axes(k);
            if let Some((_, g)) = seen.iter().find(|(a, _)| *a == axes) {
                return *g;
            }
            let (size, per_node, nodes) = layout.group_geometry(k, 0);
            let g = GroupGeometry {
                size,
                per_node,
                nodes,
            };
            seen.push((axes, g));
            g
        });
        let nccl = gpu.links.nccl;
        let inter = &gpu.links.inter_node;
        // One topology search per distinct shape: kinds of the same shape share its models.
        let mut models: Vec<[CollectiveModel; 3]> = Vec::new();
        let mut model_of = [0usize; GroupKind::ALL.len()];
        if let Some(arch) = nccl {
            for (i, g) in geometry.iter().enumerate() {
                model_of[i] = match geometry[..i].iter().position(|h| h == g) {
                    Some(j) => model_of[j],
                    None => {
                        let key = model_cache::ShapeKey {
                            arch,
                            nic_bytes_per_s_bits: inter.bandwidth_bytes_per_s.to_bits(),
                            ranks: g.size,
                            per_node: g.per_node,
                            nodes: g.nodes,
                        };
                        models.push(model_cache::with_models(
                            key,
                            || nccl_models(arch, inter, TUNED, g.size, g.per_node, g.nodes),
                            |m| m.clone(),
                        ));
                        models.len() - 1
                    }
                };
            }
        }
        Network {
            geometry,
            models,
            model_of,
            ..Network::of_links(gpu)
        }
    }

    /// The links of `gpu` with no layout: every group kind a single rank, so only
    /// [`CollectiveGroup::Shape`] groups have a price (a measured op names its group's size and
    /// placement, not its kind).
    pub fn of_links(gpu: &GpuProfile) -> Network {
        let one = GroupGeometry {
            size: 1,
            per_node: 1,
            nodes: 1,
        };
        Network {
            intra: gpu.links.intra_node.clone(),
            inter: gpu.links.inter_node.clone(),
            geometry: [one; GroupKind::ALL.len()],
            nccl: gpu.links.nccl,
            models: Vec::new(),
            model_of: [0; GroupKind::ALL.len()],
            // Only the parts a collective reads: the GEMM and attention tables are most of a
            // profile's tables, and an estimate builds its network once per call.
            tables: gpu.tables.collective.as_ref().map(|c| {
                Box::new(crate::config::RateTables {
                    collective: Some(c.clone()),
                    host_gap: gpu.tables.host_gap.clone(),
                    ..Default::default()
                })
            }),
            ep_dispatch: None,
        }
    }

    /// These links with the EP group's all-to-all calls timed as `dispatch` runs them (the
    /// configuration's token dispatcher, [`ep_dispatch::EpDispatch::of`]).
    pub fn with_ep_dispatch(mut self, dispatch: Option<ep_dispatch::EpDispatch>) -> Network {
        self.ep_dispatch = dispatch;
        self
    }

    /// One collective from the profile's measured bus bandwidth for its op, group size and
    /// placement (nccl-tests' busbw: seconds = bus factor x bytes / busbw), with the measured
    /// host gap, when the collective table covers `payload` bytes. With `past_curve`, a call
    /// outside its curve's bytes runs the alpha-beta ring at the share of the link's bandwidth
    /// that op's own timings ran at ([`crate::config::tables::CollectiveCurve::link_efficiency`],
    /// with the same host gap), where the curve has one and the group sits on one link kind (in
    /// one node, or one member per node).
    fn table_collective(
        &self,
        g: GroupGeometry,
        coll: CollectiveKind,
        payload: u64,
        n: u32,
        past_curve: bool,
    ) -> Option<CollectiveTime> {
        let t = self.tables.as_deref()?;
        let placement = if g.nodes > 1 {
            Placement::InterNode
        } else {
            Placement::IntraNode
        };
        if let Some(busbw) = t.collective_bus_bytes_per_s(coll, n, placement, payload) {
            return Some(table_time(t, coll.bus_factor(n) * payload as f64 / busbw));
        }
        let link = match (past_curve, g.nodes, g.per_node) {
            (false, _, _) => return None,
            (true, ..=1, _) => &self.intra,
            (true, _, 1) => &self.inter,
            _ => return None,
        };
        let e = t.collective_link_efficiency(coll, n, placement)?;
        let bandwidth = link.bandwidth_bytes_per_s * e;
        Some(table_time(
            t,
            ring_s(coll, payload as f64, n, bandwidth, link.latency_s),
        ))
    }

    /// [`Self::collective_s`] from the profile's collective table alone, `None` where it does
    /// not cover the call.
    pub fn table_collective_s(
        &self,
        kind: GroupKind,
        coll: CollectiveKind,
        payload: u64,
        n: u32,
    ) -> Option<f64> {
        self.table_collective(self.geometry(kind), coll, payload, n, false)
            .map(|t| t.wire_s + t.host_gap_s)
    }

    fn kind_index(kind: GroupKind) -> usize {
        GroupKind::ALL
            .iter()
            .position(|&k| k == kind)
            .expect("known kind")
    }

    pub fn geometry(&self, kind: GroupKind) -> GroupGeometry {
        self.geometry[Self::kind_index(kind)]
    }

    /// True when the group kind spans NVLink domains (so it runs on the inter-node links; a
    /// domain is a node unless `cluster.nvlink_domain_size` joins several).
    pub fn crosses_nodes(&self, kind: GroupKind) -> bool {
        self.geometry(kind).nodes > 1
    }

    /// The latency of the link class group kind `kind` runs on.
    pub fn latency_s(&self, kind: GroupKind) -> f64 {
        if self.crosses_nodes(kind) {
            self.inter.latency_s
        } else {
            self.intra.latency_s
        }
    }

    /// Seconds of one collective of `payload` bytes over `n` ranks of group `kind`
    /// ([`Self::collective_time`]: on the wire, and the host gap where a table timed it).
    pub fn collective_s(&self, kind: GroupKind, coll: CollectiveKind, payload: u64, n: u32) -> f64 {
        let t = self.collective_time(CollectiveGroup::Kind(kind), coll, payload, n);
        t.wire_s + t.host_gap_s
    }

    /// One collective of `payload` bytes over `n` ranks of `group`. The profile's collective
    /// table times it where it covers it. Else, inside a node it runs on NVLink. Across nodes,
    /// with k > 1 members per node, the collectives NCCL builds from rings are hierarchical:
    /// every GPU drives its own NIC, so each node moves only 1/k of the data per GPU across the
    /// network. An all-reduce is a reduce-scatter in the node, an all-reduce across nodes on
    /// 1/k of the data and an all-gather in the node; an all-gather is an all-gather across
    /// nodes of 1/k of the output, then one in the node (a reduce-scatter the reverse).
    /// An all-to-all sends the slices for peers in the node over NVLink and the rest over the
    /// network at once ([`all_to_all::all_to_all_s`]); send/recv runs at the inter-node link.
    ///
    /// With an NCCL generation in the profile, all-reduce, all-gather and reduce-scatter are
    /// NCCL's predicted time instead ([`nccl::CollectiveModel`]), for the group's placement,
    /// with the part of it that is NCCL's chunk pipeline inside a node.
    pub fn collective_time(
        &self,
        group: CollectiveGroup,
        coll: CollectiveKind,
        payload: u64,
        n: u32,
    ) -> CollectiveTime {
        let g = match group {
            CollectiveGroup::Kind(kind) => self.geometry(kind),
            CollectiveGroup::Shape(g) => g,
        };
        let b = payload as f64;
        if n <= 1 || payload == 0 {
            return CollectiveTime::default();
        }
        if let (CollectiveGroup::Kind(GroupKind::Ep), CollectiveKind::AllToAll, Some(d)) =
            (group, coll, self.ep_dispatch)
        {
            if let Some(t) = self.dispatch_time(d, g, payload, n) {
                return t;
            }
        }
        if let Some(t) = self.table_collective(g, coll, payload, n, true) {
            return t;
        }
        if let (Some(arch), Some(c)) = (self.nccl, tuned_index(coll)) {
            let predicted = match group {
                CollectiveGroup::Kind(kind) if n == g.size && !self.models.is_empty() => {
                    self.models[self.model_of[Self::kind_index(kind)]][c].predict(b)
                }
                // A sub-group (the two ends of tied embeddings on the pipeline group), or a
                // shape given outright.
                _ => {
                    let nodes = g.nodes.min(n);
                    let per_node = n.div_ceil(nodes);
                    let key = model_cache::ShapeKey {
                        arch,
                        nic_bytes_per_s_bits: self.inter.bandwidth_bytes_per_s.to_bits(),
                        ranks: n,
                        per_node,
                        nodes,
                    };
                    model_cache::with_models(
                        key,
                        || nccl_models(arch, &self.inter, TUNED, n, per_node, nodes),
                        |m| m[c].predict(b),
                    )
                }
            };
            if let Some(p) = predicted {
                return CollectiveTime {
                    wire_s: p.time_s,
                    pipeline_s: p.pipeline_s,
                    host_gap_s: 0.0,
                };
            }
        }
        let link = |l: &Link| l.bandwidth_bytes_per_s * l.efficiency;
        if g.nodes <= 1 || n <= 1 {
            return CollectiveTime::on_wire(ring_s(
                coll,
                b,
                n,
                link(&self.intra),
                self.intra.latency_s,
            ));
        }
        if coll == CollectiveKind::AllReduce && g.per_node > 1 {
            let k = g.per_node;
            let intra = ring_s(
                CollectiveKind::ReduceScatter,
                b,
                k,
                link(&self.intra),
                self.intra.latency_s,
            );
            let inter = ring_s(
                CollectiveKind::AllReduce,
                b / k as f64,
                g.nodes,
                link(&self.inter),
                self.inter.latency_s,
            );
            return CollectiveTime::on_wire(2.0 * intra + inter);
        }
        if matches!(
            coll,
            CollectiveKind::AllGather | CollectiveKind::ReduceScatter
        ) && g.per_node > 1
        {
            let k = g.per_node;
            let intra = ring_s(coll, b, k, link(&self.intra), self.intra.latency_s);
            let inter = ring_s(
                coll,
                b / k as f64,
                g.nodes,
                link(&self.inter),
                self.inter.latency_s,
            );
            return CollectiveTime::on_wire(intra + inter);
        }
        if coll == CollectiveKind::AllToAll {
            return CollectiveTime::on_wire(all_to_all::all_to_all_s(
                b,
                n,
                g.nodes.min(n),
                &self.intra,
                &self.inter,
            ));
        }
        CollectiveTime::on_wire(ring_s(coll, b, n, link(&self.inter), self.inter.latency_s))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nccl_model(
        arch: NcclArch,
        inter: &Link,
        coll: CollectiveKind,
        n: u32,
        per_node: u32,
        nodes: u32,
    ) -> CollectiveModel {
        let [model] = nccl_models(arch, inter, [coll], n, per_node, nodes);
        model
    }

    fn links(per_node: u32, nodes: u32) -> Network {
        let g = GroupGeometry {
            size: per_node * nodes,
            per_node,
            nodes,
        };
        Network {
            intra: Link {
                bandwidth_bytes_per_s: 400e9,
                latency_s: 5e-6,
                efficiency: 1.0,
            },
            inter: Link {
                bandwidth_bytes_per_s: 50e9,
                latency_s: 1e-5,
                efficiency: 1.0,
            },
            geometry: [g; GroupKind::ALL.len()],
            nccl: None,
            models: Vec::new(),
            model_of: [0; GroupKind::ALL.len()],
            tables: None,
            ep_dispatch: None,
        }
    }

    /// Across nodes with k ranks per node, an all-gather or reduce-scatter is a ring across the
    /// nodes on 1/k of the data plus a ring inside the node on all of it.
    #[test]
    fn inter_node_gather_and_scatter_are_hierarchical() {
        let l = links(8, 4);
        let b = 8e9;
        for kind in [CollectiveKind::AllGather, CollectiveKind::ReduceScatter] {
            let t = l.collective_s(GroupKind::DpCp, kind, b as u64, 32);
            let want = (5e-6 + 7.0 / 8.0 * b / 400e9) + (1e-5 + 3.0 / 4.0 * (b / 8.0) / 50e9);
            assert!((t / want - 1.0).abs() < 1e-9, "{kind:?}: {t} vs {want}");
            // Far cheaper than pushing the whole payload through one NIC per GPU.
            let flat = ring_s(kind, b, 32, 50e9, 1e-5);
            assert!(t < 0.3 * flat);
        }
        // One rank per node: nothing to share inside the node, the flat ring on the network.
        let l = links(1, 4);
        let t = l.collective_s(GroupKind::DpCp, CollectiveKind::AllGather, 1 << 30, 4);
        let flat = ring_s(
            CollectiveKind::AllGather,
            (1u64 << 30) as f64,
            4,
            50e9,
            1e-5,
        );
        assert!((t / flat - 1.0).abs() < 1e-12);
    }

    /// With an NCCL generation the tuned collectives follow NCCL's model for the group's
    /// placement: bounded by the rail a data-parallel group with one member per node owns
    /// (one 50 GB/s NIC: bus bandwidth at most 50 GB/s, more than 80% of it at 1 GiB), while a
    /// node-local group reaches NVLink rates; all-to-all keeps the alpha-beta model.
    #[test]
    fn nccl_model_times_tuned_collectives_by_placement() {
        let mut l = links(1, 4);
        l.nccl = Some(NcclArch::Hopper);
        l.models = vec![TUNED.map(|c| nccl_model(NcclArch::Hopper, &l.inter, c, 4, 1, 4))];
        let b = (1u64 << 30) as f64;
        let t = l.collective_s(GroupKind::DpCp, CollectiveKind::AllReduce, b as u64, 4);
        let busbw = CollectiveKind::AllReduce.bus_factor(4) * b / t;
        assert!((0.8 * 50e9..=50e9).contains(&busbw), "{busbw}");
        // Small messages pay NCCL's latencies (several microseconds), not bytes/bandwidth.
        let small = l.collective_s(GroupKind::DpCp, CollectiveKind::AllReduce, 4096, 4);
        assert!(small > 5e-6 && small < 1e-4, "{small}");
        let a2a = l.collective_s(GroupKind::DpCp, CollectiveKind::AllToAll, b as u64, 4);
        assert!((a2a / ring_s(CollectiveKind::AllToAll, b, 4, 50e9, 1e-5) - 1.0).abs() < 1e-12);
        // Eight ranks in one node: NVLink rates (over 300 GB/s bus bandwidth for all-gather).
        let mut node = links(8, 1);
        node.nccl = Some(NcclArch::Hopper);
        node.models = vec![TUNED.map(|c| nccl_model(NcclArch::Hopper, &node.inter, c, 8, 8, 1))];
        let t = node.collective_s(GroupKind::Tp, CollectiveKind::AllGather, b as u64, 8);
        assert!(CollectiveKind::AllGather.bus_factor(8) * b / t > 300e9);
    }
}
