//! A validated configuration with its derived quantities: DP, microbatches, layer placement.

use super::{rules, ClusterConfig, Config, ConfigError, GpuProfile, NvlinkDomain, ScheduleKind};
use serde::Serialize;
use std::ops::Range;
use std::sync::Arc;

/// Which layers each global pipeline stage (model chunk) holds and which rank runs it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PipelinePlacement {
    /// Pipeline rank of each global stage 0..pp*vpp.
    pub stage_rank: Vec<u32>,
    /// Decoder layers of each global stage (contiguous, in stage order).
    pub stage_layers: Vec<Range<u32>>,
}

impl PipelinePlacement {
    /// The pipeline rank of each global stage: stage s runs on rank s mod pp (Megatron's loop
    /// placement) or, for V-shaped schedules, stages r and 2pp-1-r on rank r.
    pub fn stage_ranks(pp: u32, vpp: u32, schedule: ScheduleKind) -> Vec<u32> {
        (0..pp * vpp)
            .map(|s| Self::stage_rank_of(s, pp, schedule))
            .collect()
    }

    /// The pipeline rank of global stage `s` ([`PipelinePlacement::stage_ranks`]).
    pub fn stage_rank_of(s: u32, pp: u32, schedule: ScheduleKind) -> u32 {
        let v_shape = matches!(schedule, ScheduleKind::ZbV | ScheduleKind::DualPipeV);
        // (A V holds exactly 2 chunks per rank; the schedule rule refuses other vpp.)
        if v_shape && s >= pp && s < 2 * pp {
            2 * pp - 1 - s
        } else {
            s % pp
        }
    }

    /// Places `stage_layers[s]` consecutive layers on global stage s (ranks as
    /// [`PipelinePlacement::stage_ranks`]).
    pub fn new(pp: u32, vpp: u32, stage_layers: &[u32], schedule: ScheduleKind) -> Self {
        let stage_rank = Self::stage_ranks(pp, vpp, schedule);
        let mut next = 0;
        let stage_layers = stage_layers
            .iter()
            .map(|&n| {
                let range = next..next + n;
                next += n;
                range
            })
            .collect();
        PipelinePlacement {
            stage_rank,
            stage_layers,
        }
    }

    /// Global stages held by pipeline rank `rank`, in stage order.
    pub fn stages_of_rank(&self, rank: u32) -> impl Iterator<Item = usize> + '_ {
        self.stage_rank
            .iter()
            .enumerate()
            .filter(move |(_, &r)| r == rank)
            .map(|(s, _)| s)
    }

    pub fn num_stages(&self) -> usize {
        self.stage_rank.len()
    }
}

/// A configuration that passed validation, with DP derived and SP normalised.
#[derive(Debug, Clone)]
pub struct Resolved {
    pub config: Config,
    /// Shared: a search resolves many mixes on one profile.
    pub gpu: Arc<GpuProfile>,
    /// Data-parallel degree (EP folds into it).
    pub dp: u32,
    /// Microbatches per pipeline per step: global batch / (micro batch x dp).
    pub microbatches: u32,
    pub placement: PipelinePlacement,
    /// Non-fatal adjustments and caveats, shown to the user.
    pub warnings: Vec<String>,
    /// The NVLink domain and how it was chosen (`cluster.nvlink_domain_size` holds its size
    /// where it is not the node).
    pub nvlink_domain: NvlinkDomain,
}

/// Applies `cluster.nics_per_node` and `cluster.nic_bandwidth_bytes_per_s` to the profile's
/// inter-node link: each GPU's share of the node's NICs (nics x rate / gpus per node).
fn apply_nics(cluster: &ClusterConfig, gpu: &mut GpuProfile) -> Result<(), ConfigError> {
    let field = |name: &str, message: String| ConfigError::Field {
        origin: "configuration".into(),
        field: format!("cluster.{name}"),
        message,
    };
    if let Some(n) = cluster.nics_per_node {
        if !(1..=64).contains(&n) {
            return Err(field(
                "nics_per_node",
                format!("must be between 1 and 64 NICs per node, got {n}"),
            ));
        }
    }
    if let Some(bw) = cluster.nic_bandwidth_bytes_per_s {
        if !(bw.is_finite() && bw > 0.0 && bw <= 1e13) {
            return Err(field(
                "nic_bandwidth_bytes_per_s",
                format!("must be a positive rate of at most 1e13 bytes/s, got {bw}"),
            ));
        }
    }
    if cluster.nics_per_node.is_none() && cluster.nic_bandwidth_bytes_per_s.is_none() {
        return Ok(());
    }
    let per_node = cluster.per_node().max(1) as f64;
    let nics = cluster.nics_per_node.map_or(per_node, |n| n as f64);
    let rate = cluster
        .nic_bandwidth_bytes_per_s
        .unwrap_or(gpu.links.inter_node.bandwidth_bytes_per_s);
    gpu.links.inter_node.bandwidth_bytes_per_s = nics * rate / per_node;
    Ok(())
}

impl Resolved {
    /// Validates `config` (loading its GPU profile) into a resolved configuration.
    pub fn new(config: Config) -> Result<Resolved, ConfigError> {
        let gpu = GpuProfile::load(&config.cluster.gpu)?;
        Self::with_gpu(config, gpu)
    }

    /// As [`Resolved::new`] with an already-loaded profile.
    pub fn with_gpu(
        config: Config,
        gpu: impl Into<Arc<GpuProfile>>,
    ) -> Result<Resolved, ConfigError> {
        Self::with_gpu_checking(config, gpu, false)
    }

    /// As [`Resolved::with_gpu`] for a configuration that differs only in its pipeline split
    /// from one that passed it with the same profile: only the rules that read the split are
    /// checked again ([`rules::check_split`]), the rest held for the other. A search screens
    /// the mixes of one run this way.
    pub fn resplit(
        config: Config,
        gpu: impl Into<Arc<GpuProfile>>,
    ) -> Result<Resolved, ConfigError> {
        Self::with_gpu_checking(config, gpu, true)
    }

    fn with_gpu_checking(
        mut config: Config,
        gpu: impl Into<Arc<GpuProfile>>,
        split_only: bool,
    ) -> Result<Resolved, ConfigError> {
        let mut gpu: Arc<GpuProfile> = gpu.into();
        config.fill_profile_defaults(&gpu);
        if let Some(margin) = config.cluster.memory_margin_fraction {
            if !(margin.is_finite() && (0.0..1.0).contains(&margin)) {
                return Err(ConfigError::Field {
                    origin: "configuration".into(),
                    field: "cluster.memory_margin_fraction".into(),
                    message: format!("must be in [0, 1), got {margin}"),
                });
            }
            Arc::make_mut(&mut gpu).memory_margin_fraction = margin;
        }
        let c = &config.cluster;
        if c.nics_per_node.is_some() || c.nic_bandwidth_bytes_per_s.is_some() {
            apply_nics(c, Arc::make_mut(&mut gpu))?;
        }
        match config.training.attention_kernel.as_deref() {
            None => {}
            Some(crate::attention_rates::NO_PUBLISHED_KERNEL) => {
                let g = Arc::make_mut(&mut gpu);
                g.attention_kernel = None;
                g.tables.attention_kernel = None;
            }
            // A kernel implementation the profile measured: its own curves.
            Some(kernel) if gpu.tables.attention.contains_key(kernel) => {
                Arc::make_mut(&mut gpu).tables.attention_kernel = Some(kernel.to_string());
            }
            Some(kernel) => {
                let on = attention_kernel_on(release_kernel(kernel)?, &gpu)?;
                let g = Arc::make_mut(&mut gpu);
                g.attention_kernel = Some(on);
                g.tables.attention_kernel = None;
            }
        }
        let sink_warning = sink_attention(&config, &mut gpu);
        if split_only {
            rules::check_split(&config)?;
        } else {
            rules::check(&config, &gpu)?;
        }
        // The NVLink domain chosen from the profile's racks (GB200/GB300 NVL72) filled in
        // where it is not the node; a count that fills no racks is named in a warning.
        let nvlink_domain = config.cluster.nvlink_domain_choice(&gpu);
        if config.cluster.nvlink_domain_size.is_none()
            && nvlink_domain.size != config.cluster.per_node()
        {
            config.cluster.nvlink_domain_size = Some(nvlink_domain.size);
        }
        let mut warnings = rules::warnings(&config);
        warnings.extend(nvlink_domain.warning.clone());
        warnings.extend(sink_warning);
        let p = &config.parallel;
        let t = &config.training;
        let dp = rules::data_parallel(&config).expect("checked: the world divides");
        let microbatches = t.global_batch_size / (t.micro_batch_size * dp);
        let stage_layers = rules::stage_layer_counts(&config).expect("checked: the layers split");
        let placement = PipelinePlacement::new(p.pp, p.vpp, &stage_layers, p.schedule);
        // Megatron turns SP off without TP.
        config.parallel.sp = p.sp && p.tp > 1;
        config.parallel.dp = Some(dp as u32);
        Ok(Resolved {
            config,
            gpu,
            dp: dp as u32,
            microbatches: microbatches as u32,
            placement,
            warnings,
            nvlink_domain,
        })
    }

    /// Total GPUs.
    pub fn world(&self) -> u32 {
        self.config.cluster.num_gpus
    }

    /// Expert data-parallel degree: world / (expert TP x EP x PP).
    pub fn expert_dp(&self) -> u32 {
        let p = &self.config.parallel;
        self.world() / (p.etp() * p.ep * p.pp)
    }

    /// The group that holds replicas of dense parameters (Megatron's distributed optimizer
    /// shards over DP x CP).
    pub fn dense_replicas(&self) -> u32 {
        self.dp * self.config.parallel.cp
    }
}

/// Learned sinks under Megatron-Core (Transformer Engine's attention): TE disables
/// FlashAttention for them (`get_attention_backend`), so the profile's FlashAttention default
/// gives way to cuDNN's fused kernel ([`crate::attention_backend::kernel_for_sinks`]) unless
/// `training.attention_kernel` names one. Returns a warning where TE has no backend at all
/// (sinks under a CP exchange other than a2a).
fn sink_attention(config: &Config, gpu: &mut Arc<GpuProfile>) -> Option<String> {
    use crate::attention_backend::{selected, CpExchange, Features, CUDNN_WITH_SINKS};
    if !config.model.attention_sinks || config.training.framework != super::Framework::MegatronCore
    {
        return None;
    }
    if config.training.attention_kernel.is_none() {
        if let Some(k) = gpu
            .attention_kernel
            .as_deref()
            .and_then(crate::attention_backend::kernel_for_sinks)
        {
            Arc::make_mut(gpu).attention_kernel = Some(k);
        }
    }
    let p = &config.parallel;
    let exchange = match p.cp_comm {
        super::CpComm::A2a => CpExchange::A2a,
        super::CpComm::Allgather => CpExchange::AllGather,
        super::CpComm::P2p | super::CpComm::Zigzag => CpExchange::P2p,
    };
    let features = Features {
        sinks: true,
        window: config.model.window_size.is_some(),
        context_parallel: (p.cp > 1).then_some(exchange),
        cudnn: CUDNN_WITH_SINKS,
        hopper_or_later: true,
    };
    selected(&features).is_none().then(|| {
        format!(
            "model.attention_sinks with parallel.cp {} and cp_comm {:?}: Transformer Engine runs sink attention under context parallelism only with the a2a exchange (get_attention_backend); this run would find no attention backend",
            p.cp, p.cp_comm
        )
    })
}

/// The published kernel `kernel` ("flash-attention-2", ...) on the GPU `gpu`'s rate table
/// (the table its profile's `attention_kernel` names), or an error naming
/// `training.attention_kernel` and the kernels published for that GPU.
/// `training.attention_kernel` may name a software release ("cudnn-9.4.0",
/// "ngc-pytorch-25.04"; calibration/data/attention-kernels.json's `releases`): the kernel whose
/// published rates are that release's cuDNN, refused naming the field where none are published.
fn release_kernel(name: &str) -> Result<&str, ConfigError> {
    let Some(r) = crate::attention_rates::release(name) else {
        return Ok(name);
    };
    r.kernel.as_deref().ok_or_else(|| ConfigError::Field {
        origin: "configuration".into(),
        field: "training.attention_kernel".into(),
        message: format!(
            "release {:?} runs cuDNN {}, whose fused-attention rates are not published ({}); name a kernel with published rates instead (e.g. cudnn-9.1, cudnn-9.4, cudnn-9.19, flash-attention-3)",
            r.release,
            r.cudnn,
            r.why.as_deref().unwrap_or("no source")
        ),
    })
}

fn attention_kernel_on(kernel: &str, gpu: &GpuProfile) -> Result<String, ConfigError> {
    let field_error = |message: String| ConfigError::Field {
        origin: "configuration".into(),
        field: "training.attention_kernel".into(),
        message,
    };
    let measured = gpu.tables.attention_kernels();
    let measured_note = if measured.is_empty() {
        String::new()
    } else {
        format!(
            "; measured in the profile's tables: {}",
            measured.join(", ")
        )
    };
    let Some(table) = gpu
        .attention_kernel
        .as_deref()
        .and_then(|name| name.split_once('/'))
        .map(|(table, _)| table)
    else {
        return Err(field_error(format!(
            "GPU profile {:?} has no published attention kernel rates (calibration/data/attention-kernels.json){measured_note}; leave training.attention_kernel unset to time attention at efficiency.attention",
            gpu.name
        )));
    };
    let name = format!("{table}/{kernel}");
    if crate::attention_rates::attention_kernel(&name).is_some() {
        return Ok(name);
    }
    let known: Vec<&str> = crate::attention_rates::attention_kernels()
        .iter()
        .filter_map(|k| k.name.strip_prefix(table)?.strip_prefix('/'))
        .collect();
    Err(field_error(format!(
        "{kernel:?} has no published rates on {table} (known: {}){measured_note}",
        known.join(", ")
    )))
}
