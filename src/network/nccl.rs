//! Collective time as NCCL's own tuning model predicts it (NVIDIA/nccl, src/graph/tuning.cc):
//! for each algorithm (Ring, Tree, NVLink SHARP) and protocol (LL, LL128, Simple) a base
//! latency, a latency per hop on NVLink or the network, a bus bandwidth of channels x
//! per-channel bandwidth cut by the protocol's overhead, and the pair of least predicted time
//! wins. Reimplemented from the published model; constants are NCCL's defaults (2.2x).

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

/// What NCCL's topology search sees of one cluster: NVLink inside a node and NICs across.
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
    /// Channels of the ring and tree graphs (NCCL's search finds one or two per NIC or link set).
    pub channels: u32,
}

impl Fabric {
    /// The node of generation `arch` with `nics_per_node` NICs of `nic_bytes_per_s` each.
    pub fn of(arch: Arch, nics_per_node: u32, nic_bytes_per_s: f64) -> Fabric {
        let node = match arch {
            Arch::Ampere => Fabric::dgx_a100(),
            Arch::Hopper => Fabric::dgx_h100(),
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
            channels: 16,
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
            channels: 16,
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
    }
}

/// One (algorithm, protocol) pair's constants for one collective on one group: the latency
/// in seconds and the algorithm bandwidth (bytes of payload per second).
#[derive(Debug, Clone, Copy, PartialEq)]
struct Choice {
    algorithm: Algorithm,
    protocol: Protocol,
    latency_s: f64,
    alg_bytes_per_s: f64,
}

/// NCCL's predicted time for one collective kind on one group shape, with every
/// (algorithm, protocol) pair's constants computed once (no allocation per call).
#[derive(Debug, Clone)]
pub struct CollectiveModel {
    choices: [Option<Choice>; 9],
}

/// The prediction for one call: seconds and the pair NCCL would pick.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Prediction {
    pub time_s: f64,
    pub algorithm: Algorithm,
    pub protocol: Protocol,
}

impl CollectiveModel {
    /// Constants for `coll` over `ranks` GPUs on `nodes` nodes (ranks spread evenly).
    /// Only all-reduce, all-gather and reduce-scatter are modelled (NCCL's tuned collectives).
    pub fn new(fabric: &Fabric, coll: CollectiveKind, ranks: u32, nodes: u32) -> CollectiveModel {
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
            return CollectiveModel { choices };
        }
        let ppn = ranks as f64 / nodes as f64;
        let ch = fabric.channels as f64;
        let c = caps(fabric.arch, nodes);
        // Per-channel bandwidths in GB/s, as the topology search reports them.
        let bw_intra = fabric.nvlinks_per_gpu as f64 * fabric.nvlink_bytes_per_s / 1e9 / ch;
        let bw_inter = fabric.nics_per_node as f64 * fabric.nic_bytes_per_s / 1e9 / ch;
        let all_reduce = coll == CollectiveKind::AllReduce;
        let nsteps = if all_reduce {
            2 * (ranks - 1)
        } else {
            ranks - 1
        } as f64;
        for (ai, &a) in ALGORITHMS.iter().enumerate() {
            // Tree runs all-reduce only; NVLink SHARP needs the switch and (here) one node.
            if a == Algorithm::Tree && !all_reduce {
                continue;
            }
            if a == Algorithm::Nvls && (!fabric.nvls || nodes > 1) {
                continue;
            }
            for (pi, &p) in PROTOCOLS.iter().enumerate() {
                if a == Algorithm::Nvls && p != Protocol::Simple {
                    continue;
                }
                let bw = if nodes <= 2 {
                    bw_intra
                } else {
                    bw_inter.min(bw_intra)
                };
                let (n_ch, bw) = if a == Algorithm::Nvls {
                    // NVLS channels are one per GPU pulling from the switch.
                    let n = ppn;
                    let per = ch * bw_intra / n;
                    let mut intra = per * c.nvls_efficiency * (n - 1.0) / n;
                    intra *= if all_reduce { 2.0 } else { (ppn - 1.0) / ppn };
                    (n, intra)
                } else if nodes > 1 {
                    (ch, bw.min(bw_inter))
                } else {
                    (ch, bw)
                };
                let mut bus = n_ch * bw;
                match (a, p) {
                    (Algorithm::Ring, Protocol::Ll) => bus = c.ll_max.min(bus * 0.5),
                    (Algorithm::Ring, Protocol::Ll128) => {
                        bus = (bus * 0.92).min(n_ch * c.ring_ll128_per_ch)
                    }
                    _ => {}
                }
                if a == Algorithm::Tree {
                    bus = (bus * 0.92).min(n_ch * c.tree_per_ch);
                    match p {
                        Protocol::Ll => bus = (bus / 3.8).min(c.ll_max),
                        Protocol::Ll128 => {
                            let f = if nodes == 1 { 7.0 / 9.0 } else { 120.0 / 128.0 };
                            bus = (bus * f).min(n_ch * c.tree_ll128_per_ch);
                        }
                        Protocol::Simple => {}
                    }
                }
                // Bus bandwidth to algorithm bandwidth.
                let alg = if a == Algorithm::Tree {
                    bus * 0.5
                } else {
                    bus * ranks as f64 / nsteps
                };
                let latency_us = latency_us(a, p, coll, ranks, nodes, ppn);
                choices[ai * 3 + pi] = Some(Choice {
                    algorithm: a,
                    protocol: p,
                    latency_s: latency_us * 1e-6,
                    alg_bytes_per_s: alg * 1e9,
                });
            }
        }
        CollectiveModel { choices }
    }

    /// NCCL's pick for `bytes` of payload (the all-reduce buffer, the all-gather output, the
    /// reduce-scatter input): the pair of least latency + bytes / bandwidth. None when the
    /// collective is not modelled.
    pub fn predict(&self, bytes: f64) -> Option<Prediction> {
        let mut best: Option<Prediction> = None;
        for c in self.choices.iter().flatten() {
            let time_s = c.latency_s + bytes / c.alg_bytes_per_s;
            if best.is_none_or(|b| time_s < b.time_s) {
                best = Some(Prediction {
                    time_s,
                    algorithm: c.algorithm,
                    protocol: c.protocol,
                });
            }
        }
        best
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
