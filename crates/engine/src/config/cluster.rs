//! The cluster: which GPU, how many, how many per node.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterConfig {
    /// A profile name from calibration/ (e.g. `h100-sxm`) or a path to a profile TOML.
    pub gpu: String,
    pub num_gpus: u32,
    /// GPUs per node: the host, whose CPU memory and NICs its GPUs share. Default: the GPU
    /// profile's `gpus_per_node` (4 on a GB200/GB300 compute tray, 8 on an HGX/DGX board);
    /// a resolved configuration always holds it ([`super::Resolved`] fills it in).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpus_per_node: Option<u32>,
    /// GPUs that share one NVLink domain (`--nvlink-domain-size`): a group inside one runs at
    /// NVLink rates even across hosts (72 on a GB200/GB300 NVL72 rack). Default: chosen from
    /// the profile's racks ([`ClusterConfig::nvlink_domain_choice`]), else the node. A whole
    /// number of nodes; the GPUs fill whole domains or fit in one.
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
            gpus_per_node: None,
            nvlink_domain_size: None,
            memory_margin_fraction: None,
            nics_per_node: None,
            nic_bandwidth_bytes_per_s: None,
        }
    }
}

/// How the NVLink domain's size was chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DomainRule {
    /// Given: `cluster.nvlink_domain_size` (`--nvlink-domain-size`).
    Given,
    /// The profile's NVLink reaches no further than a node: the node is the domain.
    Node,
    /// A job of at most one rack: all its GPUs sit in one rack, one domain.
    OneRack,
    /// The job fills whole racks: the rack is the domain.
    WholeRacks,
    /// The job fills whole racks of the part a job is scheduled on (64 of 72: 16 of 18 trays).
    PartialRacks,
    /// The job fills neither: each node is its own domain (a warning says so).
    NodeFallback,
}

/// The NVLink domain of a cluster: its size and how it was chosen.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NvlinkDomain {
    pub size: u32,
    pub rule: DomainRule,
    /// One line: the size and why, as the estimate header, `parsim layout` and the GUI say it
    /// ("automatic: racks of 64 ..."; never a bare 0 for automatic).
    pub reason: String,
    /// For [`DomainRule::NodeFallback`]: the warning naming the field, which the estimate,
    /// its JSON and the search's table carry.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub warning: Option<String>,
}

impl NvlinkDomain {
    /// Whether the choice says more than "the node is the domain, as always".
    pub fn is_worth_saying(&self) -> bool {
        self.rule != DomainRule::Node
    }
}

impl ClusterConfig {
    /// GPUs per node on `gpu`: `gpus_per_node`, else the profile's.
    pub fn gpus_per_node_on(&self, gpu: &super::GpuProfile) -> u32 {
        self.gpus_per_node.unwrap_or(gpu.gpus_per_node)
    }

    /// GPUs per node as set; a configuration that leaves it out and was not resolved reads
    /// [`super::DEFAULT_GPUS_PER_NODE`] (resolution fills in the profile's,
    /// [`super::Config::fill_profile_defaults`]).
    pub fn per_node(&self) -> u32 {
        self.gpus_per_node.unwrap_or(super::DEFAULT_GPUS_PER_NODE)
    }

    /// GPUs per NVLink domain on `gpu` ([`ClusterConfig::nvlink_domain_choice`]).
    pub fn nvlink_domain(&self, gpu: &super::GpuProfile) -> u32 {
        self.nvlink_domain_choice(gpu).size
    }

    /// The NVLink domain on `gpu` and how it is chosen: `nvlink_domain_size` where given;
    /// else, on a profile whose NVLink spans racks of `links.nvlink_domain_size` GPUs (an
    /// NVL72), a job of at most one rack is one domain of all its GPUs, a job that fills whole
    /// racks takes the rack, one that fills whole racks of `links.nvlink_domain_job_size`
    /// (64: 16 of 18 trays, as NVIDIA schedules jobs) takes those, and any other count falls
    /// back to the node; else the node.
    pub fn nvlink_domain_choice(&self, gpu: &super::GpuProfile) -> NvlinkDomain {
        let per_node = self.gpus_per_node_on(gpu);
        let n = self.num_gpus;
        let pick = |size: u32, rule: DomainRule, reason: String| NvlinkDomain {
            size,
            rule,
            reason,
            warning: None,
        };
        if let Some(d) = self.nvlink_domain_size {
            return pick(
                d,
                DomainRule::Given,
                format!("set to {d} GPUs (cluster.nvlink_domain_size)"),
            );
        }
        let Some(rack) = gpu.links.nvlink_domain_size.filter(|&r| r > per_node) else {
            return pick(
                per_node,
                DomainRule::Node,
                format!("automatic: each node of {per_node} GPUs"),
            );
        };
        let fills = |d: u32| d > 0 && d % per_node == 0 && n % d == 0;
        if n <= rack {
            return pick(
                n,
                DomainRule::OneRack,
                format!(
                    "automatic: all {n} GPUs in one domain (a job of at most one rack of {rack})"
                ),
            );
        }
        if fills(rack) {
            return pick(
                rack,
                DomainRule::WholeRacks,
                format!(
                    "automatic: racks of {rack} ({n} GPUs fill {} racks)",
                    n / rack
                ),
            );
        }
        if let Some(part) = gpu
            .links
            .nvlink_domain_job_size
            .filter(|&d| fills(d) && d < rack)
        {
            return pick(
                part,
                DomainRule::PartialRacks,
                format!(
                    "automatic: racks of {part}, {} of {} nodes each ({n} GPUs fill {} of them, not whole racks of {rack})",
                    part / per_node,
                    rack / per_node,
                    n / part
                ),
            );
        }
        let racks = match gpu.links.nvlink_domain_job_size {
            Some(d) => format!("racks of {rack} or {d}"),
            None => format!("racks of {rack}"),
        };
        NvlinkDomain {
            warning: Some(format!(
                "cluster.nvlink_domain_size: {n} GPUs fill no whole {} {racks}, so each node of {per_node} GPUs is its own NVLink domain; give a GPU count that fills racks, or set it",
                gpu.name
            )),
            ..pick(
                per_node,
                DomainRule::NodeFallback,
                format!("automatic: each node of {per_node} GPUs ({n} GPUs fill no whole {racks})"),
            )
        }
    }
}
