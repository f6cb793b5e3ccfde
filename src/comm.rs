//! Communication volume per step per GPU, by group: the ledger's collectives for every
//! microbatch through a rank's chunks, pipeline sends, and the once-per-step data-parallel
//! gradient and parameter traffic of ZeRO 0-3.

use crate::config::Resolved;
use crate::layout::GroupKind;
use crate::memory::{rank_params, ChunkContents, LedgerSummary};
use crate::model::{Collective, CollectiveKind, GroupBytes, Ledger, Phase};

fn coll(kind: CollectiveKind, group: GroupKind, size: u32, payload: u64, count: u32) -> Collective {
    Collective {
        kind,
        group,
        group_size: size,
        phase: Phase::Backward,
        payload_bytes: payload,
        count,
    }
}

/// Parameters replicated over a data-parallel group, and how they are kept.
#[derive(Debug, Clone, Copy)]
pub struct Replicas {
    pub group: GroupKind,
    /// Ranks holding a replica.
    pub n: u32,
    pub params: u64,
    pub trainable: u64,
    pub grad_bytes: u64,
    pub weight_bytes: u64,
}

/// The two replica sets of a rank's parameters: dense weights over DP x CP (the distributed
/// optimizer's group), routed experts over the expert data-parallel group.
pub fn replica_sets(r: &Resolved, p: &crate::model::ParamSums) -> [Replicas; 2] {
    let tr = &r.config.training;
    let dense = Replicas {
        group: GroupKind::DpCp,
        n: r.dense_replicas(),
        params: p.rank_dense,
        trainable: p.rank_dense_trainable,
        grad_bytes: tr.grad_dtype.bytes(),
        weight_bytes: tr.weight_bytes(),
    };
    let experts = Replicas {
        group: GroupKind::ExpertDp,
        n: r.expert_dp(),
        params: p.rank_expert,
        trainable: p.rank_expert_trainable,
        ..dense
    };
    [dense, experts]
}

/// Data-parallel traffic of one step: ZeRO-0 all-reduces gradients once per step; ZeRO-1
/// reduce-scatters them and all-gathers updated parameters once per step; ZeRO-2
/// reduce-scatters every microbatch (the gradients are sharded); ZeRO-3 also all-gathers
/// parameters before each forward and backward.
pub fn dp_collectives(zero: u8, r: Replicas, microbatches: u32) -> Vec<Collective> {
    let Replicas {
        group,
        n,
        params,
        trainable,
        grad_bytes,
        weight_bytes,
    } = r;
    if n <= 1 || params == 0 {
        return Vec::new();
    }
    let g = trainable * grad_bytes;
    let w_upd = trainable * weight_bytes;
    let w_all = params * weight_bytes;
    match zero {
        0 => vec![coll(CollectiveKind::AllReduce, group, n, g, 1)],
        1 => vec![
            coll(CollectiveKind::ReduceScatter, group, n, g, 1),
            coll(CollectiveKind::AllGather, group, n, w_upd, 1),
        ],
        2 => vec![
            coll(CollectiveKind::ReduceScatter, group, n, g, microbatches),
            coll(CollectiveKind::AllGather, group, n, w_upd, 1),
        ],
        _ => vec![
            coll(CollectiveKind::ReduceScatter, group, n, g, microbatches),
            coll(CollectiveKind::AllGather, group, n, w_all, 2 * microbatches),
        ],
    }
}

/// Wire bytes per step sent by pipeline rank `rank`'s GPUs, per group.
pub fn rank_step_bytes(
    r: &Resolved,
    s: &LedgerSummary,
    l: &Ledger,
    chunks: &[ChunkContents],
) -> GroupBytes {
    let m = r.microbatches;
    let tr = &r.config.training;
    let par = &r.config.parallel;
    let mut g = GroupBytes::default();
    for c in chunks {
        for (b, n) in c.blocks(s) {
            g.add(&b.comm, (n * m as u64) as f64);
        }
    }
    // Pipeline: each microbatch's activation leaves every chunk but the last stage, and its
    // gradient every chunk but the first.
    let boundary = l.dims.residual_bytes() as f64;
    let last = r.placement.num_stages() - 1;
    for c in chunks {
        let sends = (c.stage != last) as u32 + (c.stage != 0) as u32;
        g.pp += boundary * (sends * m) as f64;
    }
    // Tied embeddings split over stages: the two copies' gradients are all-reduced once.
    let first_rank = r.placement.stage_rank[0];
    let last_rank = r.placement.stage_rank[last];
    let holds_end = chunks.iter().any(|c| c.embedding || c.output);
    if r.config.model.tied_embeddings && first_rank != last_rank && holds_end && !l.dims.lora {
        let emb = l.dims.vocab_rank() * l.dims.h * tr.grad_dtype.bytes();
        g.pp += coll(CollectiveKind::AllReduce, GroupKind::Pp, 2, emb, 1).wire_bytes();
    }
    for set in replica_sets(r, &rank_params(chunks, s)) {
        for c in dp_collectives(par.zero, set, m) {
            g.dp += c.wire_bytes();
        }
    }
    // With SP, gradients of TP-replicated weights (norms, router) differ per TP rank and are
    // all-reduced over TP once per step (Megatron's allreduce of layernorm grads).
    if l.dims.sp {
        let replicated: u64 = chunks
            .iter()
            .flat_map(|c| c.blocks(s))
            .map(|(b, n)| b.params.tp_replicated * n)
            .sum();
        if !l.dims.lora {
            g.tp += coll(
                CollectiveKind::AllReduce,
                GroupKind::Tp,
                par.tp,
                replicated * tr.grad_dtype.bytes(),
                1,
            )
            .wire_bytes();
        }
    }
    g
}

/// Seconds of a ring collective: alpha + factor x B / bandwidth, with the ring factors
/// 2(n-1)/n (all-reduce), (n-1)/n (all-gather, reduce-scatter, all-to-all) and 1 (send).
pub fn ring_s(kind: CollectiveKind, bytes: f64, n: u32, bandwidth: f64, latency_s: f64) -> f64 {
    if n <= 1 || bytes <= 0.0 {
        return 0.0;
    }
    let nf = n as f64;
    let factor = match kind {
        CollectiveKind::AllReduce => 2.0 * (nf - 1.0) / nf,
        CollectiveKind::AllGather | CollectiveKind::ReduceScatter | CollectiveKind::AllToAll => {
            (nf - 1.0) / nf
        }
        CollectiveKind::SendRecv => 1.0,
    };
    latency_s + factor * bytes / bandwidth
}

/// How one group kind sits on the cluster: its size, members per node, nodes spanned.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GroupGeometry {
    pub size: u32,
    pub per_node: u32,
    pub nodes: u32,
}

/// Link classes of every group kind of one configuration (from the rank layout).
#[derive(Debug, Clone)]
pub struct Links {
    pub intra: crate::config::Link,
    pub inter: crate::config::Link,
    geometry: [GroupGeometry; 7],
}

impl Links {
    /// Reads each group kind's geometry off the group of rank 0 (all groups of a kind have the
    /// same shape when ranks fill nodes in order).
    pub fn new(layout: &crate::layout::Layout, gpu: &crate::config::GpuProfile) -> Links {
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
        Links {
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
        let link = |l: &crate::config::Link| l.bandwidth_bytes_per_s * l.efficiency;
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
    use crate::config::Link;

    fn links(per_node: u32, nodes: u32) -> Links {
        let g = GroupGeometry {
            size: per_node * nodes,
            per_node,
            nodes,
        };
        Links {
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
