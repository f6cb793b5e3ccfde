//! Collective time as NCCL's own tuning model predicts it (NVIDIA/nccl, src/graph/tuning.cc):
//! for each algorithm (Ring, Tree, NVLink SHARP) and protocol (LL, LL128, Simple) a base
//! latency, a latency per hop on NVLink or the network, a bus bandwidth of channels x
//! per-channel bandwidth cut by the protocol's overhead, and the pair of least predicted time
//! wins (or the best protocol of a forced algorithm, as `NCCL_ALGO` does). The channels and
//! their speeds are those NCCL's topology search gives ([`super::nccl_search`]); the
//! size-dependent corrections are `ncclTopoGetAlgoTime`'s. Reimplemented from the published
//! source (read at NVIDIA/nccl 5067397, 2026-06-11); every constant is NCCL's default.

use super::nccl_search::{self as search, Graph};
use crate::model::CollectiveKind;

/// NCCL's algorithms as this model knows them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algorithm {
    Ring,
    Tree,
    /// NVLink SHARP: the NVSwitch reduces in the fabric (Hopper and later).
    Nvls,
}

/// NCCL's wire protocols: LL (8-byte flag+data stores, lowest latency), LL128 (128-byte lines
/// with 8 bytes of flags) and Simple (bulk copies with fences, full bandwidth).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    Ll,
    Ll128,
    Simple,
}

const ALGORITHMS: [Algorithm; 3] = [Algorithm::Ring, Algorithm::Tree, Algorithm::Nvls];
const PROTOCOLS: [Protocol; 3] = [Protocol::Ll, Protocol::Ll128, Protocol::Simple];

/// GPU generation, which picks NCCL's per-architecture caps (named by the profile's
/// `links.nccl`).
pub use crate::config::NcclArch as Arch;

/// What NCCL's topology search sees of one cluster: NVLink inside a node and NICs across;
/// the search turns it into channels and per-channel speeds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Fabric {
    pub arch: Arch,
    /// NVLink links per GPU (12 on A100, 18 on H100).
    pub nvlinks_per_gpu: u32,
    /// NCCL's bandwidth figure per NVLink link (topo.h: 20.0 GB/s on SM80, 20.6 on SM90).
    pub nvlink_bytes_per_s: f64,
    /// Whether the NVSwitches reduce in the fabric (NVLink SHARP; H100 systems).
    pub nvls: bool,
    /// NICs per node (the rails) and the line rate of each.
    pub nics_per_node: u32,
    pub nic_bytes_per_s: f64,
}

impl Fabric {
    /// The node of generation `arch` with `nics_per_node` NICs of `nic_bytes_per_s` each.
    pub fn of(arch: Arch, nics_per_node: u32, nic_bytes_per_s: f64) -> Fabric {
        let node = match arch {
            Arch::Ampere => Fabric::dgx_a100(),
            Arch::Hopper => Fabric::dgx_h100(),
            Arch::Blackwell => Fabric::nvl72(),
        };
        Fabric {
            nics_per_node,
            nic_bytes_per_s,
            ..node
        }
    }

    /// DGX A100: 8 A100 on NVSwitch, 12 NVLink3 links each, 8 HDR 200 Gb/s NICs.
    pub fn dgx_a100() -> Fabric {
        Fabric {
            arch: Arch::Ampere,
            nvlinks_per_gpu: 12,
            nvlink_bytes_per_s: 20.0e9,
            nvls: false,
            nics_per_node: 8,
            nic_bytes_per_s: 25.0e9,
        }
    }

    /// DGX H100: 8 H100 on NVSwitch with NVLink SHARP, 18 NVLink4 links, 8 NDR 400 Gb/s NICs.
    pub fn dgx_h100() -> Fabric {
        Fabric {
            arch: Arch::Hopper,
            nvlinks_per_gpu: 18,
            nvlink_bytes_per_s: 20.6e9,
            nvls: true,
            nics_per_node: 8,
            nic_bytes_per_s: 50.0e9,
        }
    }

    /// One NVLink 5 domain of Blackwell GPUs (GB200/GB300 NVL72, or an HGX B200/B300 node):
    /// 18 NVLink 5 links each (topo.h `SM100_NVLINK_BW` 40.1 GB/s) to NVSwitches with NVLink
    /// SHARP, one 400 Gb/s NIC per GPU. With multi-node NVLink (MNNVL) NCCL sees the whole
    /// domain as one node, so a group inside the rack is searched as the GPUs of one node.
    pub fn nvl72() -> Fabric {
        Fabric {
            arch: Arch::Blackwell,
            nvlinks_per_gpu: 18,
            nvlink_bytes_per_s: 40.1e9,
            nvls: true,
            nics_per_node: 72,
            nic_bytes_per_s: 50.0e9,
        }
    }
}

/// Microseconds: NCCL's base latency by algorithm and protocol (LL, LL128, Simple).
fn base_latency_us(a: Algorithm, p: Protocol) -> f64 {
    match (a, p) {
        (Algorithm::Tree, Protocol::Ll) => 6.8,
        (Algorithm::Ring, Protocol::Ll) => 6.6,
        (Algorithm::Tree | Algorithm::Ring, Protocol::Ll128) => 14.0,
        (Algorithm::Tree | Algorithm::Ring, Protocol::Simple) => 8.4,
        (Algorithm::Nvls, _) => 0.0,
    }
}

/// Microseconds per hop on NVLink (`net` false) or on the network (`net` true).
fn hop_latency_us(net: bool, a: Algorithm, p: Protocol) -> f64 {
    let row = match (net, a) {
        (false, Algorithm::Tree) => [0.6, 1.25, 4.0],
        (false, Algorithm::Ring) => [0.6, 1.9, 3.4],
        (false, Algorithm::Nvls) => [0.0, 0.0, 25.0],
        (true, Algorithm::Tree) => [5.0, 8.5, 14.0],
        (true, Algorithm::Ring) => [2.7, 4.0, 14.0],
        (true, Algorithm::Nvls) => [0.0, 0.0, 18.0],
    };
    row[p as usize]
}

/// GB/s caps NCCL applies by architecture and node count (index 0: one node, 1: two, 2: more).
struct Caps {
    ll_max: f64,
    ring_ll128_per_ch: f64,
    tree_per_ch: f64,
    tree_ll128_per_ch: f64,
    nvls_efficiency: f64,
}

fn caps(arch: Arch, nodes: u32) -> Caps {
    let i = (nodes.min(3) - 1) as usize;
    match arch {
        // Multi-node LL caps follow the CPU (Intel row assumed).
        Arch::Ampere => Caps {
            ll_max: [87.7, 39.0, 20.4][i],
            ring_ll128_per_ch: 20.0,
            tree_per_ch: [24.0, 23.6, 17.8][i],
            tree_ll128_per_ch: 20.0,
            nvls_efficiency: 0.0,
        },
        Arch::Hopper => Caps {
            ll_max: [141.0, 39.0, 20.4][i],
            ring_ll128_per_ch: 36.7,
            tree_per_ch: [38.7, 41.4, 36.0][i],
            tree_ll128_per_ch: [36.7, 36.7, 29.0][i],
            nvls_efficiency: 0.85,
        },
        // tuning.cc's Blackwell rows (N1/N2/N4); the multi-node LL cap follows the CPU as above.
        Arch::Blackwell => Caps {
            ll_max: [2.0 * 141.0, 39.0, 20.4][i],
            ring_ll128_per_ch: 40.0,
            tree_per_ch: [70.0, 42.8, 24.0][i],
            tree_ll128_per_ch: [55.6, 31.67, 20.0][i],
            nvls_efficiency: 0.74,
        },
    }
}

/// One (algorithm, protocol) pair's constants for one collective on one group: the latency
/// in seconds, the algorithm bandwidth (bytes of payload per second) and the size-dependent
/// corrections of NCCL's `ncclTopoGetAlgoTime`.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Choice {
    algorithm: Algorithm,
    protocol: Protocol,
    latency_s: f64,
    alg_bytes_per_s: f64,
    /// Tree all-reduce: bandwidth times NCCL's `treeCorrectionFactor` for the size.
    tree_correction: bool,
    /// Ring/Simple all-reduce across nodes: latency x 1.4 from this many bytes on (64 bytes
    /// per channel per rank, NCCL's "plateau effect of ring").
    plateau_from_bytes: Option<f64>,
    /// Inside a node, the rate the chunk pipeline's overhead ([`PIPELINE_OVERHEAD_S`]) is
    /// reckoned at: the algorithm's Simple bandwidth (the graph's full rate, whatever the
    /// protocol's encoding costs). None across nodes.
    pipeline_bytes_per_s: Option<f64>,
}

impl Choice {
    /// NCCL's predicted seconds for `bytes`: (latency, transfer), what NCCL ranks pairs by.
    fn nccl_time_s(&self, bytes: f64) -> (f64, f64) {
        let mut bw = self.alg_bytes_per_s;
        if self.tree_correction {
            bw *= tree_correction(self.protocol, bytes);
        }
        let latency_s = match self.plateau_from_bytes {
            Some(from) if bytes >= from => self.latency_s * RING_PLATEAU,
            _ => self.latency_s,
        };
        (latency_s, bytes / bw)
    }

    fn time_s(&self, bytes: f64) -> f64 {
        let (latency_s, transfer_s) = self.nccl_time_s(bytes);
        latency_s + transfer_s
    }
}

/// The chunk pipeline's overhead K (seconds) in the time of a collective inside a node:
/// NCCL moves a message through each channel in chunks, each paying a fixed cost tau on top of
/// its transfer, and a pipeline of P stages fed chunks of the best size takes
/// `S/B + (P-1) tau + 2 sqrt((P-1) tau S/B)` (Johnsson and Ho 1989, "Optimum broadcasting and
/// personalized communication in hypercubes": the optimal-pipelining bound). NCCL's tuning
/// model has the first two terms; this adds the third, `2 sqrt(K x S/B)` with K = (P-1) tau,
/// which is what makes nccl-tests' bus bandwidth ramp slowly between 1 MiB and 1 GiB.
///
/// K is the one constant set from data here: the value of least worst-case error over the 13
/// rows (1 MiB to 4 GiB) of Azure's published ND A100 v4 all-reduce table
/// (calibration/data/nccl-tests.json, scanned in 0.1 us steps; tests/calibration/nccl_busbw.rs re-derives
/// it). It is checked on the tables it was not set from: the ND H100 v5 table (NVLS, another
/// GPU and algorithm) and the plateau figures. Across nodes it does not apply: NCCL's own
/// "plateau effect of ring" latency covers the network rings there.
pub const PIPELINE_OVERHEAD_S: f64 = 8.2e-6;

/// Hops of the chunk pipeline [`PIPELINE_OVERHEAD_S`] was set on: the 7 between the 8 GPUs
/// of an HGX node. A group of n > 8 GPUs of one NVLink domain (NVL72) passes each chunk over
/// n - 1 hops, so its K is stretched by (n - 1) / 7; smaller groups keep K as set (no table of
/// fewer GPUs to set a per-hop cost on).
const PIPELINE_REFERENCE_HOPS: f64 = 7.0;

/// The factor on K for a group of `ranks` GPUs in one node (NVLink domain).
fn pipeline_depth(ranks: u32) -> f64 {
    (f64::from(ranks.saturating_sub(1)) / PIPELINE_REFERENCE_HOPS).max(1.0)
}

/// tuning.cc: `lat *= 1.4` for Ring/Simple all-reduce across nodes once the chunks are full
/// (SM80 and later).
const RING_PLATEAU: f64 = 1.4;

/// tuning.cc `treeCorrectionFactor[protocol][log2(bytes / 64)]` for 64 B .. 256 MiB (1 beyond):
/// NCCL's static correction of the tree's medium-size bandwidth.
fn tree_correction(p: Protocol, bytes: f64) -> f64 {
    const F: [[f64; 24]; 3] = [
        [
            1.0, 1.0, 1.0, 1.0, 0.9, 0.8, 0.7, 0.7, 0.7, 0.7, 0.6, 0.5, 0.4, 0.4, 0.5, 0.6, 0.7,
            0.8, 0.9, 1.0, 1.0, 1.0, 1.0, 1.0,
        ],
        [
            1.0, 1.0, 1.0, 1.0, 1.0, 0.9, 0.8, 0.8, 0.8, 0.7, 0.6, 0.6, 0.6, 0.6, 0.6, 0.6, 0.8,
            0.9, 0.9, 0.9, 0.9, 1.0, 1.0, 1.0,
        ],
        [
            0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.8, 0.7, 0.6, 0.6, 0.5, 0.5, 0.5, 0.5, 0.6, 0.7,
            0.8, 0.7, 0.7, 0.8, 0.9, 0.9, 0.9,
        ],
    ];
    let chunks = (bytes / 64.0).floor();
    if chunks < 1.0 {
        return 1.0;
    }
    // log2i of NCCL: the floor of log2; sizes past 2^22 chunks (256 MiB) are uncorrected.
    let log = chunks.log2().floor() as usize;
    if log < 23 {
        F[p as usize][log]
    } else {
        1.0
    }
}

/// NCCL's predicted time for one collective kind on one group shape, with every
/// (algorithm, protocol) pair's constants computed once (no allocation per call).
#[derive(Debug, Clone)]
pub struct CollectiveModel {
    choices: [Option<Choice>; 9],
    /// K of the chunk pipeline ([`PIPELINE_OVERHEAD_S`] unless overridden).
    pipeline_overhead_s: f64,
    /// K's factor for the group's hops ([`pipeline_depth`]).
    pipeline_depth: f64,
}

/// The prediction for one call: seconds and the pair NCCL would pick.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Prediction {
    pub time_s: f64,
    /// The part of `time_s` that is the chunk pipeline's overhead inside a node (0 across
    /// nodes): what a copy-engine transfer outside NCCL (Megatron-Core's userbuffers) does not
    /// pay.
    pub pipeline_s: f64,
    pub algorithm: Algorithm,
    pub protocol: Protocol,
}

/// The group NCCL tunes for: ranks, nodes, ranks per node and the collective.
#[derive(Debug, Clone, Copy)]
struct Shape {
    coll: CollectiveKind,
    ranks: u32,
    nodes: u32,
    ppn: f64,
}

impl Shape {
    fn all_reduce(&self) -> bool {
        self.coll == CollectiveKind::AllReduce
    }

    /// Ring steps: 2(n-1) for all-reduce, n-1 for all-gather and reduce-scatter.
    fn nsteps(&self) -> f64 {
        let n = (self.ranks - 1) as f64;
        if self.all_reduce() {
            2.0 * n
        } else {
            n
        }
    }
}

/// The graphs NCCL's topology search builds for one group shape ([`super::nccl_search`]):
/// the ring's (the tree reuses its channels) and, on one NVSwitch node, NVLS's.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Graphs {
    ring: Graph,
    nvls: Option<Graph>,
}

impl Graphs {
    /// Searches `fabric` for `ranks` GPUs on `nodes` nodes (ranks spread evenly).
    pub fn search(fabric: &Fabric, ranks: u32, nodes: u32) -> Graphs {
        let nodes = nodes.max(1);
        let link_gbps = fabric.nvlinks_per_gpu as f64 * fabric.nvlink_bytes_per_s / 1e9;
        let ring = if nodes == 1 {
            search::ring_intra(fabric.arch, link_gbps)
        } else {
            search::ring_inter(
                fabric.arch,
                fabric.nics_per_node,
                fabric.nic_bytes_per_s / 1e9,
                ranks as f64 / nodes as f64,
                link_gbps,
            )
        };
        // NVLink SHARP here: one node of an NVSwitch system (NVLS across nodes needs CollNet).
        let nvls = if fabric.nvls && nodes == 1 {
            search::nvls(fabric.arch, ranks, link_gbps)
        } else {
            None
        };
        Graphs { ring, nvls }
    }
}

impl CollectiveModel {
    /// Constants for `coll` over `ranks` GPUs on `nodes` nodes (ranks spread evenly).
    /// Only all-reduce, all-gather and reduce-scatter are modelled (NCCL's tuned collectives).
    pub fn new(fabric: &Fabric, coll: CollectiveKind, ranks: u32, nodes: u32) -> CollectiveModel {
        let graphs = Graphs::search(fabric, ranks, nodes);
        CollectiveModel::with_graphs(fabric, &graphs, coll, ranks, nodes)
    }

    /// The same from graphs already searched for this group shape (one search serves the
    /// shape's three collectives).
    pub fn with_graphs(
        fabric: &Fabric,
        graphs: &Graphs,
        coll: CollectiveKind,
        ranks: u32,
        nodes: u32,
    ) -> CollectiveModel {
        let mut choices = [None; 9];
        if ranks <= 1
            || nodes == 0
            || !matches!(
                coll,
                CollectiveKind::AllReduce
                    | CollectiveKind::AllGather
                    | CollectiveKind::ReduceScatter
            )
        {
            return CollectiveModel {
                choices,
                pipeline_overhead_s: PIPELINE_OVERHEAD_S,
                pipeline_depth: 1.0,
            };
        }
        let shape = Shape {
            coll,
            ranks,
            nodes,
            ppn: ranks as f64 / nodes as f64,
        };
        let c = caps(fabric.arch, nodes);
        let (ring, nvls) = (graphs.ring, graphs.nvls);
        for (ai, &a) in ALGORITHMS.iter().enumerate() {
            // Tree runs all-reduce only.
            if a == Algorithm::Tree && !shape.all_reduce() {
                continue;
            }
            let graph = match (a, nvls) {
                (Algorithm::Nvls, Some(g)) => g,
                (Algorithm::Nvls, None) => continue,
                _ => ring,
            };
            for (pi, &p) in PROTOCOLS.iter().enumerate() {
                if a == Algorithm::Nvls && p != Protocol::Simple {
                    continue;
                }
                let bus = bus_gbps(a, p, graph, &c, shape);
                let alg = alg_gbps(a, bus, shape);
                let simple = alg_gbps(a, bus_gbps(a, Protocol::Simple, graph, &c, shape), shape);
                let latency_us = latency_us(a, p, coll, ranks, nodes, shape.ppn);
                let plateau = a == Algorithm::Ring
                    && p == Protocol::Simple
                    && nodes > 1
                    && shape.all_reduce();
                choices[ai * 3 + pi] = Some(Choice {
                    algorithm: a,
                    protocol: p,
                    latency_s: latency_us * 1e-6,
                    alg_bytes_per_s: alg * 1e9,
                    tree_correction: a == Algorithm::Tree,
                    plateau_from_bytes: plateau
                        .then_some(64.0 * graph.channels as f64 * ranks as f64),
                    pipeline_bytes_per_s: (nodes == 1).then_some(simple * 1e9),
                });
            }
        }
        CollectiveModel {
            choices,
            pipeline_overhead_s: PIPELINE_OVERHEAD_S,
            pipeline_depth: pipeline_depth(ranks),
        }
    }

    /// The same model with another chunk-pipeline overhead K (seconds): what the test that
    /// re-derives [`PIPELINE_OVERHEAD_S`] scans.
    pub fn with_pipeline_overhead(mut self, overhead_s: f64) -> CollectiveModel {
        self.pipeline_overhead_s = overhead_s;
        self
    }

    /// NCCL's pick for `bytes` of payload (the all-reduce buffer, the all-gather output, the
    /// reduce-scatter input): the pair of least latency + bytes / bandwidth. None when the
    /// collective is not modelled.
    pub fn predict(&self, bytes: f64) -> Option<Prediction> {
        self.best(bytes, |_| true)
    }

    /// The same with the algorithm forced (nccl-tests run with `NCCL_ALGO=RING`, say): NCCL
    /// still picks the protocol. None when the algorithm does not run this collective here.
    pub fn predict_with(&self, bytes: f64, algorithm: Algorithm) -> Option<Prediction> {
        self.best(bytes, |a| a == algorithm)
    }

    /// NCCL ranks the pairs by its own model; the pick then pays the chunk pipeline's overhead.
    fn best(&self, bytes: f64, allowed: impl Fn(Algorithm) -> bool) -> Option<Prediction> {
        let mut best: Option<(f64, &Choice)> = None;
        for c in self.choices.iter().flatten() {
            if !allowed(c.algorithm) {
                continue;
            }
            let t = c.time_s(bytes);
            if best.is_none_or(|(b, _)| t < b) {
                best = Some((t, c));
            }
        }
        best.map(|(t, c)| {
            let pipeline_s = c.pipeline_bytes_per_s.map_or(0.0, |bw| {
                2.0 * (self.pipeline_overhead_s * self.pipeline_depth * bytes / bw).sqrt()
            });
            Prediction {
                time_s: t + pipeline_s,
                pipeline_s,
                algorithm: c.algorithm,
                protocol: c.protocol,
            }
        })
    }
}

/// GB/s of bus bandwidth of one (algorithm, protocol) on `graph`: channels x per-channel
/// bandwidth with tuning.cc's refinements (NVLS efficiency, LL at half and capped, LL128 at
/// 0.92 and per-channel caps, the tree's caps).
fn bus_gbps(a: Algorithm, p: Protocol, graph: Graph, c: &Caps, s: Shape) -> f64 {
    let n_ch = graph.channels as f64;
    let mut bw = graph.bw_gbps;
    if a == Algorithm::Nvls {
        // NVLS busBW per channel: efficiency x (n-1)/n of the channel; all-reduce pipelines
        // the reduce and the broadcast, the others move (ppn-1)/ppn of the data.
        bw *= c.nvls_efficiency * (n_ch - 1.0) / n_ch;
        bw *= if s.all_reduce() {
            2.0
        } else {
            (s.ppn - 1.0) / s.ppn
        };
    }
    let mut bus = n_ch * bw;
    match (a, p) {
        (Algorithm::Ring, Protocol::Ll) => bus = c.ll_max.min(bus * 0.5),
        (Algorithm::Ring, Protocol::Ll128) => bus = (bus * 0.92).min(n_ch * c.ring_ll128_per_ch),
        _ => {}
    }
    if a == Algorithm::Tree {
        bus = (bus * 0.92).min(n_ch * c.tree_per_ch);
        match p {
            Protocol::Ll => bus = (bus / 3.8).min(c.ll_max),
            Protocol::Ll128 => {
                let f = if s.nodes == 1 {
                    7.0 / 9.0
                } else {
                    120.0 / 128.0
                };
                bus = (bus * f).min(n_ch * c.tree_ll128_per_ch);
            }
            Protocol::Simple => {}
        }
    }
    bus
}

/// Bus to algorithm bandwidth as tuning.cc converts it: rings and NVLS all-reduce by
/// nRanks / nsteps, the tree by 0.5; NVLS all-gather and reduce-scatter keep the bus figure.
fn alg_gbps(a: Algorithm, bus: f64, s: Shape) -> f64 {
    match a {
        Algorithm::Nvls if !s.all_reduce() => bus,
        Algorithm::Ring | Algorithm::Nvls => bus * s.ranks as f64 / s.nsteps(),
        Algorithm::Tree => bus * 0.5,
    }
}

/// Microseconds of latency of one call: the base, plus one hop per ring step (network hops
/// where the ring leaves a node), or up and down the tree (intra chain, log2 across nodes).
fn latency_us(
    a: Algorithm,
    p: Protocol,
    coll: CollectiveKind,
    ranks: u32,
    nodes: u32,
    ppn: f64,
) -> f64 {
    let base = base_latency_us(a, p);
    let intra = hop_latency_us(false, a, p);
    // With one rank per node NCCL charges the tree's network latency.
    let inter_algo = if ppn <= 1.0 && a != Algorithm::Nvls {
        Algorithm::Tree
    } else {
        a
    };
    let inter = hop_latency_us(true, inter_algo, p);
    let all_reduce = coll == CollectiveKind::AllReduce;
    match a {
        Algorithm::Ring => {
            let nsteps = if all_reduce {
                2 * (ranks - 1)
            } else {
                ranks - 1
            } as f64;
            let inter_steps = match (nodes > 1, all_reduce) {
                (false, _) => 0.0,
                (true, true) => 2.0 * (nodes - 1) as f64,
                (true, false) => (nodes - 1) as f64,
            };
            // Across nodes every ring step pays at least the network overhead per step
            // (x86: 1 us; Simple pays it three times).
            let intra_hop = if nodes > 1 {
                let overhead = if p == Protocol::Simple { 3.0 } else { 1.0 };
                intra.max(overhead)
            } else {
                intra
            };
            base + (nsteps - inter_steps) * intra_hop + inter_steps * inter
        }
        Algorithm::Tree => {
            base + 2.0 * ((ppn - 1.0) * intra + (nodes as f64).log2().floor() * inter)
        }
        Algorithm::Nvls => intra + if nodes > 1 { inter } else { 0.0 },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn choice(m: &CollectiveModel, a: Algorithm, p: Protocol) -> Choice {
        m.choices
            .iter()
            .flatten()
            .find(|c| c.algorithm == a && c.protocol == p)
            .copied()
            .expect("pair modelled")
    }

    /// NVLS all-reduce on 8 H100s by tuning.cc's formula, worked by hand: 8 channels x 40 GB/s
    /// (the search) x nvlsEfficiency 0.85 x 7/8 x 2 = 476 GB/s of bus bandwidth, to algorithm
    /// bandwidth x nRanks / nsteps = 476 x 8/14 = 272 GB/s; latency the 25 us NVLink hop.
    /// (nccl-tests' busbw is then 272 x 14/8 = 476: the maintainers' "~480".)
    #[test]
    fn nvls_all_reduce_on_eight_h100s() {
        let m = CollectiveModel::new(&Fabric::dgx_h100(), CollectiveKind::AllReduce, 8, 1);
        let c = choice(&m, Algorithm::Nvls, Protocol::Simple);
        assert!((c.alg_bytes_per_s / 272e9 - 1.0).abs() < 1e-6, "{c:?}");
        assert!((c.latency_s - 25e-6).abs() < 1e-12);
        // NVLS all-gather keeps the bus figure: 8 x 40 x 0.85 x 7/8 x 7/8 = 208.25 GB/s.
        let ag = CollectiveModel::new(&Fabric::dgx_h100(), CollectiveKind::AllGather, 8, 1);
        let c = choice(&ag, Algorithm::Nvls, Protocol::Simple);
        assert!((c.alg_bytes_per_s / 208.25e9 - 1.0).abs() < 1e-6, "{c:?}");
    }

    /// The chunk pipeline by hand, 1 GiB all-reduce on 8 H100s (NVLS, 272 GB/s algorithm
    /// bandwidth): NCCL's 25 us + 2^30 / 272e9 = 3947.58 us, plus 2 sqrt(8.2 us x 3947.58 us)
    /// = 359.83 us: 4332.41 us. Across nodes nothing is added.
    #[test]
    fn chunk_pipeline_overhead_by_hand() {
        let m = CollectiveModel::new(&Fabric::dgx_h100(), CollectiveKind::AllReduce, 8, 1);
        let p = m.predict((1u64 << 30) as f64).unwrap();
        assert_eq!(p.algorithm, Algorithm::Nvls);
        assert!((p.time_s / 4332.41e-6 - 1.0).abs() < 1e-5, "{p:?}");
        let none = m.clone().with_pipeline_overhead(0.0);
        let bare = none.predict((1u64 << 30) as f64).unwrap().time_s;
        assert!((bare / 3972.58e-6 - 1.0).abs() < 1e-5, "{bare}");
        let across = CollectiveModel::new(&Fabric::dgx_h100(), CollectiveKind::AllGather, 16, 2);
        let b = (1u64 << 28) as f64;
        assert_eq!(
            across.predict(b),
            across.clone().with_pipeline_overhead(0.0).predict(b)
        );
    }

    /// treeCorrectionFactor by hand: 1 MiB is 2^14 chunks of 64 B, so LL128 takes index 14
    /// (0.6) and Simple 0.5; 63 B is no chunk (1.0); 512 MiB is past the table (1.0).
    #[test]
    fn tree_correction_reads_nccl_table_by_log_size() {
        assert_eq!(tree_correction(Protocol::Ll128, (1u64 << 20) as f64), 0.6);
        assert_eq!(tree_correction(Protocol::Simple, (1u64 << 20) as f64), 0.5);
        assert_eq!(tree_correction(Protocol::Ll, 63.0), 1.0);
        assert_eq!(tree_correction(Protocol::Simple, (1u64 << 29) as f64), 1.0);
    }

    /// Ring/Simple all-reduce across two H100 nodes: 8 channels (one per NDR NIC), so the
    /// latency grows by 1.4 from 64 x 8 x 16 = 8192 bytes on, and not for all-gather.
    #[test]
    fn ring_plateau_latency_across_nodes() {
        let h = Fabric::dgx_h100();
        let m = CollectiveModel::new(&h, CollectiveKind::AllReduce, 16, 2);
        let c = choice(&m, Algorithm::Ring, Protocol::Simple);
        assert_eq!(c.plateau_from_bytes, Some(8192.0));
        let below = c.time_s(8191.0) - 8191.0 / c.alg_bytes_per_s;
        let above = c.time_s(8192.0) - 8192.0 / c.alg_bytes_per_s;
        assert!((below - c.latency_s).abs() < 1e-15);
        assert!((above - 1.4 * c.latency_s).abs() < 1e-15);
        let ag = CollectiveModel::new(&h, CollectiveKind::AllGather, 16, 2);
        assert_eq!(
            choice(&ag, Algorithm::Ring, Protocol::Simple).plateau_from_bytes,
            None
        );
    }
}
