//! What a collective costs over the cluster's links: the alpha-beta ring model (Thakur et al.
//! 2005, "Optimization of Collective Communication Operations in MPICH") on NVLink inside a
//! node and on the network across nodes, hierarchical as NCCL builds it.

pub mod nccl;

use crate::config::{GpuProfile, Link};
use crate::layout::{GroupKind, Layout};
use crate::model::CollectiveKind;

/// Seconds of a ring collective: alpha + factor x B / bandwidth, with the ring factors
/// 2(n-1)/n (all-reduce), (n-1)/n (all-gather, reduce-scatter, all-to-all) and 1 (send).
pub fn ring_s(kind: CollectiveKind, bytes: f64, n: u32, bandwidth: f64, latency_s: f64) -> f64 {
    if n <= 1 || bytes <= 0.0 {
        return 0.0;
    }
    latency_s + kind.ring_factor(n) * bytes / bandwidth
}

/// How one group kind sits on the cluster: its size, members per node, nodes spanned.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GroupGeometry {
    pub size: u32,
    pub per_node: u32,
    pub nodes: u32,
}

/// The cluster's links as every group kind of one configuration sees them (from the rank
/// layout): the intra- and inter-node link classes and each kind's geometry.
#[derive(Debug, Clone)]
pub struct Network {
    pub intra: Link,
    pub inter: Link,
    geometry: [GroupGeometry; 7],
}

impl Network {
    /// Reads each group kind's geometry off the group of rank 0 (all groups of a kind have the
    /// same shape when ranks fill nodes in order).
    pub fn new(layout: &Layout, gpu: &GpuProfile) -> Network {
        // Kinds that vary the same non-trivial axes (e.g. dp and expert_dp when ep = 1) share
        // one computation.
        let mut seen: Vec<(Vec<usize>, GroupGeometry)> = Vec::with_capacity(7);
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
        Network {
            intra: gpu.links.intra_node.clone(),
            inter: gpu.links.inter_node.clone(),
            geometry,
        }
    }

    pub fn geometry(&self, kind: GroupKind) -> GroupGeometry {
        self.geometry[GroupKind::ALL
            .iter()
            .position(|&k| k == kind)
            .expect("known kind")]
    }

    /// True when the group kind spans nodes (so it runs on the inter-node links).
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

    /// Seconds of one collective of `payload` bytes over `n` ranks of group `kind`. Inside a node
    /// it runs on NVLink. Across nodes, with k > 1 members per node, the collectives NCCL
    /// builds from rings are hierarchical: every GPU drives its own NIC, so each node moves
    /// only 1/k of the data per GPU across the network. An all-reduce is a reduce-scatter in
    /// the node, an all-reduce across nodes on 1/k of the data and an all-gather in the node;
    /// an all-gather is an all-gather across nodes of 1/k of the output, then one in the node
    /// (a reduce-scatter the reverse). All-to-all and send/recv run at the inter-node link.
    pub fn collective_s(&self, kind: GroupKind, coll: CollectiveKind, payload: u64, n: u32) -> f64 {
        let g = self.geometry(kind);
        let b = payload as f64;
        let link = |l: &Link| l.bandwidth_bytes_per_s * l.efficiency;
        if g.nodes <= 1 || n <= 1 {
            return ring_s(coll, b, n, link(&self.intra), self.intra.latency_s);
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
            return 2.0 * intra + inter;
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
            return intra + inter;
        }
        ring_s(coll, b, n, link(&self.inter), self.inter.latency_s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
            geometry: [g; 7],
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
}
