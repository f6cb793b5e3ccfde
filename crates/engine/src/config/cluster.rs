//! The cluster: which GPU, how many, how many per node.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterConfig {
    /// A profile name from calibration/ (e.g. `h100-sxm`) or a path to a profile TOML.
    pub gpu: String,
    pub num_gpus: u32,
    /// GPUs per node: the host, whose CPU memory and NICs its GPUs share (4 on a GB200
    /// compute tray).
    pub gpus_per_node: u32,
    /// GPUs that share one NVLink domain (`--nvlink-domain-size`): a group inside one runs at
    /// NVLink rates even across hosts (72 on a GB200/GB300 NVL72 rack). Default: the GPU
    /// profile's `links.nvlink_domain_size`, else `gpus_per_node` (the node is the domain).
    /// A whole number of nodes; the GPUs fill whole domains or fit in one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nvlink_domain_size: Option<u32>,
    /// Overrides the profile's `memory_margin_fraction` (`--memory-margin`): the fraction of
    /// device memory kept free for allocator fragmentation and reserve.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_margin_fraction: Option<f64>,
    /// NICs per node: the rails of a rail-optimised fabric (NIC i of every node on rail i).
    /// Default: one per GPU, as on DGX A100/H100. Fewer NICs share their line rate among the
    /// node's GPUs, so each GPU's share of the network is nics x rate / gpus_per_node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nics_per_node: Option<u32>,
    /// Line rate of one NIC, bytes/s per direction. Default: the profile's
    /// `links.inter_node.bandwidth_bytes_per_s` (one NIC per GPU).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nic_bandwidth_bytes_per_s: Option<f64>,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig {
            gpu: "h100-sxm".into(),
            num_gpus: 8,
            gpus_per_node: 8,
            nvlink_domain_size: None,
            memory_margin_fraction: None,
            nics_per_node: None,
            nic_bandwidth_bytes_per_s: None,
        }
    }
}

impl ClusterConfig {
    /// GPUs per NVLink domain on `gpu`: `nvlink_domain_size`, else the profile's where it
    /// fits this cluster ([`ClusterConfig::domain_fits`]), else `gpus_per_node`.
    pub fn nvlink_domain(&self, gpu: &super::GpuProfile) -> u32 {
        self.nvlink_domain_size
            .or(self.profile_domain(gpu))
            .unwrap_or(self.gpus_per_node)
    }

    /// The profile's NVLink domain when it fits this cluster (2,048 GPUs do not fill racks of
    /// 72: those run as 64 per rack, or the node is the domain).
    pub fn profile_domain(&self, gpu: &super::GpuProfile) -> Option<u32> {
        gpu.links
            .nvlink_domain_size
            .filter(|&d| self.domain_fits(d))
    }

    /// Whether domains of `domain` GPUs hold whole nodes and the GPUs fill whole domains (or
    /// fit in one): the rules `cluster.nvlink_domain_size` must meet.
    pub fn domain_fits(&self, domain: u32) -> bool {
        domain > 0
            && self.gpus_per_node > 0
            && domain % self.gpus_per_node == 0
            && (self.num_gpus <= domain || self.num_gpus % domain == 0)
    }
}
