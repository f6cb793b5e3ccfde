//! The cluster: which GPU, how many, how many per node.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterConfig {
    /// A profile name from calibration/ (e.g. `h100-sxm`) or a path to a profile TOML.
    pub gpu: String,
    pub num_gpus: u32,
    pub gpus_per_node: u32,
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
            memory_margin_fraction: None,
            nics_per_node: None,
            nic_bandwidth_bytes_per_s: None,
        }
    }
}
