//! The MoE token dispatchers as Megatron-Core runs them (megatron/core/transformer/moe/
//! token_dispatcher.py), each over the EP group at its own rate: `alltoall` is NCCL's
//! all-to-all of every (token, expert) row (the network's alpha-beta model); `allgather`
//! gathers every rank's hidden states over the group and reduce-scatters the outputs (NCCL's
//! tuned all-gather); `flex` runs DeepEP's or HybridEP's fused kernels, which send each token
//! once per destination rank over NVLink, once per destination NVLink domain over RDMA, at
//! the bandwidths their authors publish (calibration/data/ep-dispatch.json).

use super::{CollectiveGroup, CollectiveTime, GroupGeometry, Network};
use crate::config::{Config, FlexBackend, NcclArch, TokenDispatcher};
use crate::layout::GroupKind;
use crate::model::CollectiveKind;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::sync::OnceLock;

const TABLE_JSON: &str = include_str!("../../../../calibration/data/ep-dispatch.json");

/// Which link a flex dispatch's bottleneck bytes cross.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Fabric {
    Nvlink,
    Rdma,
}

/// One published measurement of a backend's dispatch and combine.
#[derive(Debug, Clone, Deserialize)]
pub struct DispatchPoint {
    pub backend: FlexBackend,
    pub fabric: Fabric,
    pub arch: NcclArch,
    pub ranks: u32,
    pub sms: u32,
    /// BF16 dispatch, GB/s; `None` where only an FP8 dispatch was measured.
    pub dispatch_bf16_gb_s: Option<f64>,
    pub combine_gb_s: f64,
    /// The test bed's link per GPU and direction (spec), GB/s.
    pub link_gb_s: f64,
    pub source: String,
}

impl DispatchPoint {
    /// Fractions of the test bed's link the dispatch and the combine reach (BF16 payloads).
    fn efficiencies(&self) -> (f64, f64) {
        let combine = self.combine_gb_s / self.link_gb_s;
        let dispatch = self.dispatch_bf16_gb_s.unwrap_or(self.combine_gb_s) / self.link_gb_s;
        (dispatch, combine)
    }
}

/// The data file.
#[derive(Debug, Clone, Deserialize)]
pub struct DispatchTable {
    pub sources: BTreeMap<String, String>,
    pub points: Vec<DispatchPoint>,
}

/// The shipped table; `None` only if the file does not parse (a test keeps it parsing).
pub fn table() -> Option<&'static DispatchTable> {
    static TABLE: OnceLock<Option<DispatchTable>> = OnceLock::new();
    TABLE
        .get_or_init(|| serde_json::from_str(TABLE_JSON).ok())
        .as_ref()
}

/// DeepEP's normal kernels keep at most this many NVLink peers (DeepEP csrc/kernels/
/// configs.cuh, `NUM_MAX_NVL_PEERS`); beyond, its groups of 8 talk over RDMA.
pub const DEEPEP_MAX_NVL_PEERS: u32 = 8;

/// Efficiencies (dispatch, combine) of `backend` over `fabric` at `ranks`, from the points
/// measured on `arch` (else on any generation: the fraction of a link carries, the link is
/// the profile's): linear in log2(ranks) between the measured counts, the nearest end's
/// outside them. `None` where no point covers the backend and fabric.
pub fn efficiencies(
    backend: FlexBackend,
    fabric: Fabric,
    arch: Option<NcclArch>,
    ranks: u32,
) -> Option<(f64, f64)> {
    let t = table()?;
    let of = |same_arch: bool| -> Vec<&DispatchPoint> {
        let mut v: Vec<&DispatchPoint> = t
            .points
            .iter()
            .filter(|p| p.backend == backend && p.fabric == fabric)
            .filter(|p| !same_arch || Some(p.arch) == arch)
            .collect();
        v.sort_by_key(|p| p.ranks);
        v
    };
    let mut pts = of(true);
    if pts.is_empty() {
        pts = of(false);
    }
    let (first, last) = (pts.first()?, pts.last()?);
    if ranks <= first.ranks {
        return Some(first.efficiencies());
    }
    if ranks >= last.ranks {
        return Some(last.efficiencies());
    }
    let upper = pts.iter().position(|p| p.ranks >= ranks)?;
    let (a, b) = (pts[upper - 1], pts[upper]);
    let w = (f64::from(ranks).log2() - f64::from(a.ranks).log2())
        / (f64::from(b.ranks).log2() - f64::from(a.ranks).log2());
    let (ad, ac) = a.efficiencies();
    let (bd, bc) = b.efficiencies();
    Some((ad + w * (bd - ad), ac + w * (bc - ac)))
}

/// Expected distinct groups a token's top-k experts fall in, `groups` groups holding
/// `experts` / `groups` experts each, for a router spreading the k choices uniformly without
/// replacement: groups x (1 - C(E - E/g, k) / C(E, k)). Node-limited routing
/// (`moe_router_group_topk`) would cap it lower; it is not applied.
pub fn distinct_groups(experts: u64, topk: u64, groups: u64) -> f64 {
    if groups <= 1 || experts == 0 {
        return groups.min(1) as f64;
    }
    let other = experts - experts / groups;
    let mut miss = 1.0;
    for i in 0..topk.min(experts) {
        if other < i + 1 {
            miss = 0.0;
            break;
        }
        miss *= (other - i) as f64 / (experts - i) as f64;
    }
    groups as f64 * (1.0 - miss)
}

/// How a configuration's MoE layers dispatch, for the network to time the EP group's
/// all-to-all calls by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EpDispatch {
    pub dispatcher: TokenDispatcher,
    pub backend: FlexBackend,
    pub experts: u64,
    pub topk: u64,
}

impl EpDispatch {
    /// The dispatcher of `c`; `None` for a dense model or the all-to-all dispatcher (the
    /// network's own all-to-all).
    pub fn of(c: &Config) -> Option<EpDispatch> {
        let (m, p) = (&c.model, &c.parallel);
        if !m.is_moe()
            || m.moe_router_topk == 0
            || p.moe_token_dispatcher == TokenDispatcher::AllToAll
        {
            return None;
        }
        Some(EpDispatch {
            dispatcher: p.moe_token_dispatcher,
            backend: p.moe_flex_dispatcher_backend,
            experts: u64::from(m.num_experts),
            topk: u64::from(m.moe_router_topk),
        })
    }
}

impl Network {
    /// One of the EP group's dispatch or combine calls of `payload` bytes (the rank's kept
    /// (token, expert) rows, k copies of each token) over `n` ranks of geometry `g`, as `d`
    /// runs it; `None` for NCCL's all-to-all (the caller's model).
    ///
    /// - allgather: an all-gather of every member's tokens, once each (payload / k x n out;
    ///   its combine, a reduce-scatter, moves as much).
    /// - flex: the bytes the kernels' bottleneck link carries, each token once per
    ///   destination rank over NVLink (one NVLink domain holds the group; at most 8 peers for
    ///   DeepEP) or once per destination domain over RDMA, at the table's fraction of the
    ///   profile's link ([`efficiencies`]) plus the link's latency. The ledger does not say
    ///   which of the pair a call is, so each is charged the mean of the dispatch and the
    ///   combine time.
    pub(super) fn dispatch_time(
        &self,
        d: EpDispatch,
        g: GroupGeometry,
        payload: u64,
        n: u32,
    ) -> Option<CollectiveTime> {
        let token_bytes = payload as f64 / d.topk.max(1) as f64;
        match d.dispatcher {
            TokenDispatcher::AllToAll => None,
            TokenDispatcher::AllGather => {
                let gathered = (token_bytes * f64::from(n)).round() as u64;
                Some(self.collective_time(
                    CollectiveGroup::Kind(GroupKind::Ep),
                    CollectiveKind::AllGather,
                    gathered,
                    n,
                ))
            }
            TokenDispatcher::Flex => {
                let peers = match d.backend {
                    FlexBackend::DeepEp => g.per_node.min(DEEPEP_MAX_NVL_PEERS),
                    FlexBackend::HybridEp => g.per_node,
                }
                .max(1);
                let domains = if g.nodes <= 1 && n <= peers {
                    1
                } else {
                    n.div_ceil(peers)
                };
                let (fabric, link, groups) = if domains <= 1 {
                    (Fabric::Nvlink, &self.intra, u64::from(n))
                } else {
                    (Fabric::Rdma, &self.inter, u64::from(domains))
                };
                let (ed, ec) = efficiencies(d.backend, fabric, self.nccl, n)?;
                let bytes = token_bytes * distinct_groups(d.experts, d.topk, groups);
                let bw = link.bandwidth_bytes_per_s;
                let s = link.latency_s + bytes * 0.5 * (1.0 / (ed * bw) + 1.0 / (ec * bw));
                Some(CollectiveTime {
                    wire_s: s,
                    ..CollectiveTime::default()
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The data file parses, every point cites a source it lists, and no efficiency exceeds
    /// what its accounting allows (RDMA points count the local domain's rows too, so they
    /// may pass the NIC by a little: DeepEP's 32-rank 57 GB/s on a 50 GB/s NIC).
    #[test]
    fn the_table_parses_and_cites_its_sources() {
        let t = table().expect("calibration/data/ep-dispatch.json parses");
        assert!(!t.points.is_empty());
        for p in &t.points {
            assert!(t.sources.contains_key(&p.source), "{}", p.source);
            let (d, c) = p.efficiencies();
            assert!(d > 0.1 && c > 0.1 && d < 1.25 && c < 1.25, "{p:?}");
        }
    }

    /// By hand: E = 8 experts in 2 groups of 4, top-2: the chance both fall in the other
    /// group is (4/8)(3/7) = 3/14, so 2 x (1 - 3/14) = 11/7 groups; one group is 1; a group
    /// per expert is k exactly.
    #[test]
    fn distinct_groups_by_hand() {
        assert!((distinct_groups(8, 2, 2) - 11.0 / 7.0).abs() < 1e-12);
        assert_eq!(distinct_groups(8, 2, 1), 1.0);
        assert!((distinct_groups(256, 8, 256) - 8.0).abs() < 1e-9);
    }

    /// At a measured rank count the table's own point comes back (HybridEP on GB200 at 16
    /// ranks: 523.48 and 521.55 of 900 GB/s); between two, linear in log2(ranks) (23 ranks
    /// between HybridEP's 16- and 32-rank H100 points); beyond the last, the last.
    #[test]
    fn efficiencies_at_and_between_table_points() {
        let (d, c) = efficiencies(
            FlexBackend::HybridEp,
            Fabric::Nvlink,
            Some(NcclArch::Blackwell),
            16,
        )
        .unwrap();
        assert!((d - 523.48 / 900.0).abs() < 1e-12 && (c - 521.55 / 900.0).abs() < 1e-12);
        let (d, _) = efficiencies(
            FlexBackend::HybridEp,
            Fabric::Rdma,
            Some(NcclArch::Hopper),
            23,
        )
        .unwrap();
        let w = (23f64.log2() - 4.0) / (5.0 - 4.0);
        let want = (54.47 + w * (47.36 - 54.47)) / 50.0;
        assert!((d - want).abs() < 1e-12, "{d} vs {want}");
        let (d, _) = efficiencies(
            FlexBackend::HybridEp,
            Fabric::Rdma,
            Some(NcclArch::Hopper),
            512,
        )
        .unwrap();
        assert!((d - 41.24 / 50.0).abs() < 1e-12);
        // No Hopper NVLink point for HybridEP: Blackwell's fraction carries.
        let (d, _) = efficiencies(
            FlexBackend::HybridEp,
            Fabric::Nvlink,
            Some(NcclArch::Hopper),
            8,
        )
        .unwrap();
        assert!((d - 545.71 / 900.0).abs() < 1e-12);
    }

    use crate::config::GpuProfile;
    use crate::layout::Layout;

    /// H100 links with an EP group of `ep` over nodes of 8 (tp = cp = pp = 1).
    fn h100(ep: u32, d: Option<EpDispatch>) -> Network {
        let gpu = GpuProfile::load("h100-sxm").unwrap();
        let layout = Layout::new("tp-cp-ep-dp-pp", 1, 1, ep, ep, 1, 8).unwrap();
        Network::new(&layout, &gpu).with_ep_dispatch(d)
    }

    fn flex(backend: FlexBackend, experts: u64, topk: u64) -> EpDispatch {
        EpDispatch {
            dispatcher: TokenDispatcher::Flex,
            backend,
            experts,
            topk,
        }
    }

    fn ep_call_s(net: &Network, payload: u64, n: u32) -> f64 {
        net.collective_s(GroupKind::Ep, CollectiveKind::AllToAll, payload, n)
    }

    /// DeepEP over 16 H100s on two nodes, at its own table point (docs/legacy.md: 43 GB/s
    /// RDMA at EP 16, of a 50 GB/s ConnectX-7): 16 experts, top-2, so a token's two experts
    /// miss the other node with probability (8/16)(7/15) = 7/30 and it crosses to
    /// 2 x (1 - 7/30) = 23/15 nodes. A rank's 2 MB of (token, expert) rows is 1 MB of tokens,
    /// so each call moves 23/15 MB over RDMA at 43/50 of the profile's 50 GB/s NIC, after the
    /// NIC's 10 us latency.
    #[test]
    fn deepep_time_at_its_table_point_by_hand() {
        let net = h100(16, Some(flex(FlexBackend::DeepEp, 16, 2)));
        let payload = 2_000_000;
        let want = 1.0e-5 + 1.0e6 * 23.0 / 15.0 / (43.0 / 50.0 * 50e9);
        let got = ep_call_s(&net, payload, 16);
        assert!((got / want - 1.0).abs() < 1e-9, "{got} vs {want}");
    }

    /// Where the tables say so, the fused kernels beat NCCL's all-to-all of every (token,
    /// expert) row: DeepSeek-V3's routing (256 experts, top-8) over 16, 32 and 64 H100s
    /// across nodes, DeepEP and HybridEP both, and over 8 in one node; on GB200's NVLink at 8
    /// ranks HybridEP beats DeepEP (545.71/568.94 against 512.72/425.95 GB/s, the hybrid-ep
    /// branch's GB200 table). The allgather dispatcher is NCCL's all-gather of every token of
    /// the group, once each: ep / k times the rows' bytes gathered.
    #[test]
    fn flex_beats_all_to_all_where_the_tables_say_so() {
        let payload = 8 * 4096 * 7168 * 2;
        for ep in [8, 16, 32, 64] {
            let nccl = ep_call_s(&h100(ep, None), payload, ep);
            for b in [FlexBackend::DeepEp, FlexBackend::HybridEp] {
                let fused = ep_call_s(&h100(ep, Some(flex(b, 256, 8))), payload, ep);
                assert!(fused < nccl, "ep {ep} {b}: {fused} vs {nccl}");
            }
        }
        let gather = Some(EpDispatch {
            dispatcher: TokenDispatcher::AllGather,
            ..flex(FlexBackend::DeepEp, 256, 8)
        });
        let net = h100(64, gather);
        let gathered = net.collective_s(
            GroupKind::Ep,
            CollectiveKind::AllGather,
            payload / 8 * 64,
            64,
        );
        assert_eq!(ep_call_s(&net, payload, 64), gathered);
        let gpu = GpuProfile::load("gb200").unwrap();
        let layout = Layout::new("tp-cp-ep-dp-pp", 1, 1, 8, 8, 1, 4)
            .and_then(|l| l.with_nvlink_domain(72))
            .unwrap();
        let on = |b| {
            let net = Network::new(&layout, &gpu).with_ep_dispatch(Some(flex(b, 256, 8)));
            ep_call_s(&net, payload, 8)
        };
        assert!(on(FlexBackend::HybridEp) < on(FlexBackend::DeepEp));
    }
}
