//! What the software stack holds on every GPU beside the framework's tensors, from the GPU
//! profile's `[runtime_memory]` (src/config/runtime_memory.rs): the CUDA context, the BLAS
//! workspace, and NCCL's connection buffers for each process group the plan creates.
//!
//! NCCL (github.com/NVIDIA/nccl, src/init.cc `computeBuffSizes`) gives every connection of a
//! collective channel one buffer per protocol: LL `NCCL_LL_LINES_PER_THREAD x
//! NCCL_LL_MAX_NTHREADS x NCCL_STEPS x 16` = 8 x 512 x 8 x 16 B (512 KiB), LL128
//! `NCCL_LL128_ELEMS_PER_THREAD x NCCL_LL128_MAX_NTHREADS x NCCL_STEPS x 8` = 120 x 640 x 8 x 8 B
//! (4.69 MiB), Simple `NCCL_BUFFSIZE` 4 MiB (src/include/device.h for the constants). A ring
//! channel connects each rank to its previous and next member:
//! - over NVLink (src/transport/p2p.cc) the three buffers of a connection sit in one GPU's memory,
//!   so each rank holds one set per channel;
//! - over the network with GPUDirect RDMA (src/transport/net.cc, `recvProxyConnect` and
//!   `sendProxyConnect`) the receiving side holds all three in device memory and the sending
//!   side LL128 and Simple (its LL buffer is in host memory): a rank whose neighbours are both
//!   across the network holds both, one whose ring enters its node through it the receiving set.
//!
//! Channels: a ring inside an NVLink domain takes the profile's `nccl_channels_nvlink`; a ring
//! across domains two per NIC of a node (the rings NCCL's search finds, one per NIC, doubled by
//! src/graph/connect.cc: `nChannels = min(MAXCHANNELS, nChannels * 2)`; NVIDIA/nccl#514 shows 8
//! channels on 4 NICs), at most the NVLink figure.
//!
//! Point-to-point (the pipeline's sends and receives, and an NCCL all-to-all to each peer) runs
//! on PyTorch's two-rank communicator per peer pair (ProcessGroupNCCL's send/recv keys) with
//! NCCL's p2p buffers: `NCCL_NCHANNELS_PER_NET_PEER` (2) channels a peer, each of
//! `p2pChunkSize x NCCL_STEPS` (src/init.cc: 128 KiB chunks over the network, 512 KiB over
//! NVLink), for each direction.
//!
//! Not counted (named gaps): NCCL's tree connections (connected only where the tree algorithm
//! runs, NCCL_RUNTIME_CONNECT), NVLS and CollNet buffers, the embedding group of tied weights,
//! DeepEP's buffers.

use crate::config::Resolved;
use crate::layout::Layout;
use parsim_plan::GroupKind;
use serde::Serialize;

/// NCCL's LL buffer of one connection (512 KiB).
pub const NCCL_LL_BYTES: u64 = 8 * 512 * 8 * 16;
/// NCCL's LL128 buffer of one connection (4,915,200 bytes).
pub const NCCL_LL128_BYTES: u64 = 120 * 640 * 8 * 8;
/// NCCL's Simple buffer of one connection (`NCCL_BUFFSIZE`, 4 MiB).
pub const NCCL_SIMPLE_BYTES: u64 = 1 << 22;
/// Point-to-point channels per peer (`NCCL_NCHANNELS_PER_NET_PEER`).
pub const NCCL_P2P_CHANNELS_PER_PEER: u64 = 2;
/// NCCL's pipeline steps per buffer (`NCCL_STEPS`).
const NCCL_STEPS: u64 = 8;
/// p2p chunk sizes (`NCCL_P2P_NET_CHUNKSIZE`, `NCCL_P2P_NVL_CHUNKSIZE`).
const P2P_NET_CHUNK_BYTES: u64 = 128 << 10;
const P2P_NVL_CHUNK_BYTES: u64 = 512 << 10;

/// NCCL's buffers of one rank by the process group they serve, in bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct NcclBuffers {
    pub tp: u64,
    pub cp: u64,
    /// The dense data-parallel replicas (DP x CP), where gradients reduce.
    pub dp: u64,
    /// The pipeline's point-to-point communicators.
    pub pp: u64,
    /// The expert-parallel all-to-all and the experts' data-parallel group.
    pub ep: u64,
}

impl NcclBuffers {
    pub fn total(&self) -> u64 {
        self.tp + self.cp + self.dp + self.pp + self.ep
    }
}

/// The runtime lines of a rank, in bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RuntimeLines {
    pub cuda_context: u64,
    pub blas_workspace: u64,
    pub nccl: NcclBuffers,
}

impl RuntimeLines {
    pub fn total(&self) -> u64 {
        self.cuda_context + self.blas_workspace + self.nccl.total()
    }

    /// The lines of every rank of `r` (zero where the profile states no runtime memory).
    pub fn of(r: &Resolved) -> RuntimeLines {
        let m = &r.gpu.runtime_memory;
        if !m.is_stated() {
            return RuntimeLines::default();
        }
        let eager = r.config.training.eager_module_loading;
        let layout = Layout::of(r);
        // One NIC per GPU unless the cluster says otherwise (`cluster.nics_per_node`).
        let nics = u64::from(
            r.config
                .cluster
                .nics_per_node
                .unwrap_or(r.config.cluster.per_node()),
        );
        let channels = Channels {
            nvlink: u64::from(m.nccl_channels_nvlink),
            network: (2 * nics).min(u64::from(m.nccl_channels_nvlink)),
        };
        let ring = |kind: GroupKind| channels.ring_bytes(layout.group_geometry(kind, 0));
        let p2p = |kind: GroupKind, peers: u64| {
            let (size, per_domain, _) = layout.group_geometry(kind, 0);
            p2p_bytes(peers.min(u64::from(size) - 1), size > per_domain)
        };
        let expert = r.config.model.is_moe();
        let pp = r.config.parallel.pp;
        RuntimeLines {
            // Validation refuses eager loading on a profile without that figure.
            cuda_context: m.context_bytes(eager).unwrap_or(m.cuda_context_bytes),
            blas_workspace: m.blas_workspace_bytes,
            nccl: NcclBuffers {
                tp: ring(GroupKind::Tp),
                cp: ring(GroupKind::Cp),
                dp: ring(GroupKind::DpCp),
                // The previous and the next stage (one where there are two stages).
                pp: if pp > 1 { p2p(GroupKind::Pp, 2) } else { 0 },
                ep: if expert {
                    let (ep, _, _) = layout.group_geometry(GroupKind::Ep, 0);
                    p2p(GroupKind::Ep, u64::from(ep)) + ring(GroupKind::ExpertDp)
                } else {
                    0
                },
            },
        }
    }
}

/// NCCL's ring channels inside an NVLink domain and across the network.
#[derive(Debug, Clone, Copy)]
struct Channels {
    nvlink: u64,
    network: u64,
}

impl Channels {
    /// A rank's ring buffers in a group of geometry (size, members in the first member's
    /// domain, domains spanned) ([`Layout::group_geometry`]).
    fn ring_bytes(&self, (size, per_domain, domains): (u32, u32, u32)) -> u64 {
        let set = NCCL_LL_BYTES + NCCL_LL128_BYTES + NCCL_SIMPLE_BYTES;
        if size <= 1 {
            0
        } else if domains <= 1 {
            self.nvlink * set
        } else if per_domain == 1 {
            // Both neighbours across the network: the receiving set and the sending side's
            // LL128 and Simple buffers.
            self.network * (set + NCCL_LL128_BYTES + NCCL_SIMPLE_BYTES)
        } else {
            self.network * set
        }
    }
}

/// A rank's point-to-point buffers to `peers` peers, each way, over the network or NVLink.
fn p2p_bytes(peers: u64, network: bool) -> u64 {
    let chunk = if network {
        P2P_NET_CHUNK_BYTES
    } else {
        P2P_NVL_CHUNK_BYTES
    };
    2 * peers * NCCL_P2P_CHANNELS_PER_PEER * chunk * NCCL_STEPS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nccls_buffer_constants_are_its_defaults() {
        // src/init.cc: DEFAULT_LL_BUFFSIZE, DEFAULT_LL128_BUFFSIZE, DEFAULT_BUFFSIZE.
        assert_eq!(NCCL_LL_BYTES, 524_288);
        assert_eq!(NCCL_LL128_BYTES, 4_915_200);
        assert_eq!(NCCL_SIMPLE_BYTES, 4 * 1024 * 1024);
    }

    #[test]
    fn a_ring_holds_one_set_a_channel_inside_a_domain_and_more_across() {
        let c = Channels {
            nvlink: 24,
            network: 8,
        };
        let set = 524_288 + 4_915_200 + 4_194_304;
        assert_eq!(c.ring_bytes((1, 1, 1)), 0);
        assert_eq!(c.ring_bytes((8, 8, 1)), 24 * set);
        assert_eq!(c.ring_bytes((4, 1, 4)), 8 * (set + 4_915_200 + 4_194_304));
        assert_eq!(c.ring_bytes((16, 8, 2)), 8 * set);
    }
}
