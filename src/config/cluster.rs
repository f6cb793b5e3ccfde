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
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig {
            gpu: "h100-sxm".into(),
            num_gpus: 8,
            gpus_per_node: 8,
            memory_margin_fraction: None,
        }
    }
}
