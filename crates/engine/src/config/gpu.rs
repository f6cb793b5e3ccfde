//! Hardware profiles: peak rates, memory, links and efficiencies of one GPU kind, loaded from
//! the TOML files shipped in calibration/ (embedded in the binary) or from a user's file.

use super::enums::Precision;
use super::error::ConfigError;
use super::tables::RateTables;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Dense tensor-core peak rates in FLOP/s per dtype. `fp32` is the TF32 rate used for fp32 matmuls.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PeakFlops {
    pub bf16: f64,
    pub fp16: f64,
    /// `None` on GPUs without FP8 tensor cores.
    pub fp8: Option<f64>,
    /// FP4 (NVFP4 / MXFP4) dense rate; `None` on GPUs without FP4 tensor cores (before
    /// Blackwell and CDNA 4).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fp4: Option<f64>,
    pub fp32: f64,
}

/// One class of link (NVLink inside a node, the network across nodes).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Link {
    /// Per GPU, per direction.
    pub bandwidth_bytes_per_s: f64,
    pub latency_s: f64,
    /// Achieved fraction of the bandwidth for large messages.
    pub efficiency: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Links {
    /// Which NCCL tuning model times the node's all-reduce, all-gather and reduce-scatter
    /// (src/network/nccl.rs: NVLink links and NVLink SHARP by generation); `None` keeps the
    /// alpha-beta ring model on `intra_node` / `inter_node` for GPUs NCCL's constants do not
    /// cover (MI300X on RCCL, B200, the CPU backend).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nccl: Option<NcclArch>,
    /// GPUs that share one NVLink domain on this system (72 on a GB200/GB300 NVL72 rack): the
    /// rack `cluster.nvlink_domain_size` defaults from (`ClusterConfig::nvlink_domain_choice`);
    /// `None`: the node is the domain.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nvlink_domain_size: Option<u32>,
    /// The part of a rack a job is scheduled on when it does not fill whole racks (64 of an
    /// NVL72's 72: 16 of 18 trays), the domain of such jobs where they fill those.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nvlink_domain_job_size: Option<u32>,
    pub intra_node: Link,
    pub inter_node: Link,
    /// The GPU's link to its host's memory (PCIe, or NVLink-C2C on Grace systems), per
    /// direction, which activation offloading moves saved tensors over; `None`: offloading
    /// is refused on this profile.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<Link>,
}

/// The GPU generation whose NCCL tuning constants apply (NCCL's src/graph/tuning.cc caps per
/// compute capability): DGX A100-class (SM80, NVLink3 x 12), DGX H100-class (SM90, NVLink4
/// x 18 with NVLink SHARP) or Blackwell (SM100, NVLink5 x 18 with NVLink SHARP, over a whole
/// NVL72 rack with multi-node NVLink).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NcclArch {
    Ampere,
    Hopper,
    Blackwell,
}

/// Achieved fractions of peak (fitted by calibration).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Efficiency {
    /// Fraction of the dense peak a large, well-shaped GEMM reaches.
    pub matmul: f64,
    /// Fraction of the dense peak the fused attention kernel reaches.
    pub attention: f64,
    /// Fraction of the HBM bandwidth memory-bound kernels reach.
    pub memory_bound: f64,
    /// Fixed cost of one kernel launch (and its tail), per GEMM or memory-bound op.
    #[serde(default = "default_kernel_overhead_s")]
    pub kernel_overhead_s: f64,
    /// Fraction of *overlapped* communication time that still lengthens the step: concurrent
    /// NCCL kernels take SMs and HBM bandwidth from the compute they hide behind. 0 = free.
    #[serde(default)]
    pub overlap_interference: f64,
    /// Waiting at synchronising collectives, as a fraction of the compute between them: the
    /// members of a TP, CP or EP group never finish their share at the same instant (clock
    /// and scheduling jitter, uneven work), and each collective waits for the last. Applied
    /// to every block that issues such a collective. 0 = members in lockstep (the default;
    /// fitted by `parsim calibrate` where op timings or step times show it).
    #[serde(default)]
    pub sync_skew: f64,
}

impl Efficiency {
    /// Seconds a transfer of `comm_s` costs the step when only `exposed_s` of it is exposed:
    /// the exposed part plus `overlap_interference` of the part hidden behind compute.
    pub fn charged_s(&self, comm_s: f64, exposed_s: f64) -> f64 {
        exposed_s + self.overlap_interference * (comm_s - exposed_s).max(0.0)
    }
}

/// The memory margin when a profile names none: 5% of device memory, the order of the
/// fragmentation PyTorch's caching allocator shows on large training runs.
pub const DEFAULT_MEMORY_MARGIN_FRACTION: f64 = 0.05;

fn default_memory_margin_fraction() -> f64 {
    DEFAULT_MEMORY_MARGIN_FRACTION
}
/// The largest latency or kernel overhead a profile may give, in seconds.
const MAX_FIXED_COST_S: f64 = 1.0;

fn default_kernel_overhead_s() -> f64 {
    4.0e-6
}

/// The GEMM shape model: output tiles spread over the streaming multiprocessors in waves
/// (wave quantisation: a last, partial wave costs a full one).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GemmShape {
    /// Streaming multiprocessors (compute units).
    pub sms: u32,
    /// Output tile rows and columns of one thread block.
    pub tile_m: u32,
    pub tile_n: u32,
    /// Whether the GEMM library shares a partial last wave's work over every SM (stream-K
    /// scheduling, as cuBLAS's persistent kernels do on Hopper and later) instead of leaving
    /// SMs idle; see `time::Rates::gemm_s`.
    #[serde(default)]
    pub stream_k: bool,
    /// The best bf16 GEMM rate measured on this GPU over its dense bf16 peak (Bekman's
    /// Maximum Achievable Matmul FLOPS, calibration/data/gemm-rates.json); `None` where no
    /// measurement is published. It carries a family's fitted `efficiency.matmul` to a GPU
    /// without published training runs, and with the FP8 figure times FP8 GEMMs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub achievable_bf16_fraction: Option<f64>,
    /// The same for FP8 (e4m3) GEMMs over the dense FP8 peak.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub achievable_fp8_fraction: Option<f64>,
    /// The same for NVFP4 GEMMs over the dense FP4 peak (calibration/data/
    /// gemm-rates-blackwell.json); absent, NVFP4 GEMMs take the FP8 share.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub achievable_fp4_fraction: Option<f64>,
    /// The best HBM bandwidth share a memory-bound GEMM (few rows against its weights: a
    /// grouped expert GEMM's small groups) streams its operands at, measured on this GPU's
    /// memory system (calibration/data/grouped-gemm-rates.json); absent, a GEMM's memory side
    /// runs at `efficiency.memory_bound`, as elementwise kernels do.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operand_stream_fraction: Option<f64>,
}

impl Default for GemmShape {
    /// H100 SXM: 132 SMs; cuBLAS's common 128 x 256 bf16 tile.
    fn default() -> Self {
        GemmShape {
            sms: 132,
            tile_m: 128,
            tile_n: 256,
            stream_k: false,
            achievable_bf16_fraction: None,
            achievable_fp8_fraction: None,
            achievable_fp4_fraction: None,
            operand_stream_fraction: None,
        }
    }
}

/// A GPU's board power, in watts: what it draws idle and its thermal design power (the most it
/// draws under sustained load), and the power of the node it ships in besides its GPUs, each
/// with its source in the profile file.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuPower {
    pub idle_w: f64,
    pub tdp_w: f64,
    /// One node of the profile's `gpus_per_node` GPUs besides them (CPUs, memory, NICs, fans,
    /// its share of a rack's switches and power shelves), at most: the system's maximum power
    /// less its GPUs' TDP. `None`: the run assumes DGX H100's per GPU, and says so.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_w_per_node: Option<f64>,
}

/// GPUs per node when a profile names none: an HGX/DGX board of eight.
pub const DEFAULT_GPUS_PER_NODE: u32 = 8;

fn is_unstated(m: &super::RuntimeMemory) -> bool {
    !m.is_stated()
}

fn default_gpus_per_node() -> u32 {
    DEFAULT_GPUS_PER_NODE
}

/// What a profile's figures rest on, one phrase per kind of figure: the rows of
/// docs/accuracy.md's "What each profile rests on" (`calibrate::markdown`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Evidence {
    /// Peak rates, memory and links: a datasheet, a vendor system table, a measurement.
    pub peaks: String,
    /// The measured GEMM shares (`gemm.achievable_*_fraction`), or why there are none.
    pub gemm_share: String,
    /// How collectives are timed and what that was checked against.
    pub collectives: String,
    /// Where the efficiencies come from (a fit, a family's values, a measured sweep).
    pub efficiencies: String,
}

/// A GPU kind's profile (docs/design.md, Calibration).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuProfile {
    pub name: String,
    pub description: String,
    /// The hardware generation (`ampere`, `hopper`, `blackwell`, `cdna`, `cpu`): step-time
    /// intervals pool measured residuals by it (the interval regime's `gpu_family`). Absent, or
    /// one no shipped profile declares: `other`, which no shipped residual is in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub family: Option<String>,
    /// The published-fit family whose fitted efficiencies the profile carries (`A100`, `H100`:
    /// `calibrate::fit::Family`, docs/accuracy.md). Absent: its efficiencies are its own (the
    /// CPU's, fitted by `parsim calibrate`), and the published fit leaves it alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub efficiency_family: Option<String>,
    /// GPUs per node (host: CPU memory, NICs) as the system ships: 4 on a GB200/GB300 NVL72
    /// compute tray, 8 on an HGX/DGX board. The default of `cluster.gpus_per_node`.
    #[serde(default = "default_gpus_per_node")]
    pub gpus_per_node: u32,
    /// The training precisions its tensor cores run (`training.precision`). Absent: bf16, fp16
    /// and fp32, plus fp8 with a `peak_flops.fp8` and mxfp8 and nvfp4 with a `peak_flops.fp4`,
    /// what a profile meant before it listed them ([`GpuProfile::runs`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub precisions: Vec<Precision>,
    /// Device memory as the driver reports it.
    pub memory_bytes: u64,
    /// Memory outside tensors that no line of `runtime_memory` states (all of it on a profile
    /// without that table: CUDA context, library workspaces).
    pub runtime_overhead_bytes: u64,
    /// The CUDA context, the BLAS workspace and NCCL's ring channels of this GPU generation
    /// (src/config/runtime_memory.rs), each a memory line of its own.
    #[serde(default, skip_serializing_if = "is_unstated")]
    pub runtime_memory: super::RuntimeMemory,
    /// Fraction of `memory_bytes` kept free for the allocator's fragmentation and reserve
    /// (PyTorch's caching allocator rounds blocks up and cannot always reuse freed ones), so
    /// that "fits" means fits with room. Default [`DEFAULT_MEMORY_MARGIN_FRACTION`].
    #[serde(default = "default_memory_margin_fraction")]
    pub memory_margin_fraction: f64,
    pub hbm_bytes_per_s: f64,
    pub peak_flops: PeakFlops,
    pub links: Links,
    pub efficiency: Efficiency,
    #[serde(default)]
    pub gemm: GemmShape,
    /// s x s fp32 score tiles the attention kernel keeps in device memory while it runs (one
    /// in forward, this many in backward): 0 for fused kernels, whose tiles live on chip; the
    /// CPU backend's kernel materialises a row of heads' scores at a time.
    #[serde(default)]
    pub attention_score_tiles: u32,
    /// The published fused-attention kernel ("gpu/kernel" in calibration/data/
    /// attention-kernels.json) whose measured rates time the attention core; without one the
    /// core runs at `efficiency.attention`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attention_kernel: Option<String>,
    /// Board power at idle and at its thermal design power (the run's energy, `planning`);
    /// `None` on profiles without published figures (energy is then left out).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub power: Option<GpuPower>,
    /// Measured rate tables (`[tables]`, [`RateTables`]): where one covers an op, it times
    /// the op instead of the analytic model.
    #[serde(default, skip_serializing_if = "RateTables::is_empty")]
    pub tables: RateTables,
    /// What the figures rest on, in a phrase each (docs/accuracy.md); `None` on a user's file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub evidence: Option<Evidence>,
    /// Field (or group of fields) -> where its value comes from.
    #[serde(default)]
    pub provenance: BTreeMap<String, String>,
}

/// The profiles shipped in calibration/, embedded so the binary works from any directory: a
/// new GPU is its TOML file and one line here; every list of GPUs (the `--gpu` help, the
/// published-fit families, the interval regime's families, who runs which precision, the
/// docs' table of what each profile rests on) derives from them ([`super::registry`]).
pub(super) const SHIPPED: &[(&str, &str)] = &[
    (
        "a100-40g",
        include_str!("../../../../calibration/a100-40g.toml"),
    ),
    (
        "a100-80g",
        include_str!("../../../../calibration/a100-80g.toml"),
    ),
    (
        "h100-sxm",
        include_str!("../../../../calibration/h100-sxm.toml"),
    ),
    ("h200", include_str!("../../../../calibration/h200.toml")),
    ("b200", include_str!("../../../../calibration/b200.toml")),
    ("b300", include_str!("../../../../calibration/b300.toml")),
    ("gb200", include_str!("../../../../calibration/gb200.toml")),
    ("gb300", include_str!("../../../../calibration/gb300.toml")),
    (
        "mi300x",
        include_str!("../../../../calibration/mi300x.toml"),
    ),
    (
        "mi355x",
        include_str!("../../../../calibration/mi355x.toml"),
    ),
    ("cpu", include_str!("../../../../calibration/cpu.toml")),
];

/// How `parsim calibrate` begins the provenance of every value it fits.
pub const CALIBRATE_PROVENANCE: &str = "fitted by `parsim calibrate`";

impl GpuProfile {
    /// Whether the profile was fitted by `parsim calibrate` to runs measured on its machine:
    /// a value's provenance says so, or it carries measured rate tables.
    pub fn calibrated_on_machine(&self) -> bool {
        !self.tables.is_empty()
            || self
                .provenance
                .values()
                .any(|v| v.starts_with(CALIBRATE_PROVENANCE))
    }

    /// Device memory a configuration may use: `memory_bytes` less the margin.
    pub fn usable_memory_bytes(&self) -> u64 {
        let margin = self.memory_margin_fraction.clamp(0.0, 1.0);
        (self.memory_bytes as f64 * (1.0 - margin)).floor() as u64
    }

    /// Parses profile TOML; `origin` names it in errors.
    pub fn parse(text: &str, origin: &str) -> Result<GpuProfile, ConfigError> {
        let profile: GpuProfile = super::load::parse_toml_typed(text, origin)?;
        profile.check(origin)?;
        Ok(profile)
    }

    /// `power`: finite, 0 <= idle_w <= tdp_w, tdp_w > 0, host_w_per_node >= 0.
    fn check_power(&self, origin: &str) -> Result<(), ConfigError> {
        if let Some(p) = &self.power {
            let ok = p.tdp_w.is_finite()
                && p.tdp_w > 0.0
                && p.idle_w.is_finite()
                && p.idle_w >= 0.0
                && p.idle_w <= p.tdp_w;
            if !ok {
                return Err(ConfigError::Field {
                    origin: origin.to_string(),
                    field: "power".into(),
                    message: format!(
                        "needs 0 <= idle_w <= tdp_w and tdp_w > 0, finite (got idle_w {}, tdp_w {})",
                        p.idle_w, p.tdp_w
                    ),
                });
            }
            if let Some(h) = p.host_w_per_node.filter(|h| !(h.is_finite() && *h >= 0.0)) {
                return Err(ConfigError::Field {
                    origin: origin.to_string(),
                    field: "power.host_w_per_node".into(),
                    message: format!("must be a finite number of watts, 0 or more, got {h}"),
                });
            }
        }
        Ok(())
    }

    /// `tables`: every measured table well formed ([`RateTables::check`]), by field.
    fn check_tables(&self, origin: &str) -> Result<(), ConfigError> {
        self.tables
            .check()
            .map_err(|(field, message)| ConfigError::Field {
                origin: origin.to_string(),
                field,
                message,
            })
    }

    /// Whether its tensor cores run `precision` (`precisions`, or what the peaks imply where
    /// the profile lists none).
    pub fn runs(&self, precision: Precision) -> bool {
        if !self.precisions.is_empty() {
            return self.precisions.contains(&precision);
        }
        match precision {
            Precision::Bf16 | Precision::Fp16 | Precision::Fp32 => true,
            Precision::Fp8 => self.peak_flops.fp8.is_some(),
            Precision::Mxfp8 | Precision::Nvfp4 => self.peak_flops.fp4.is_some(),
        }
    }

    /// The precisions it runs, in `Precision::ALL`'s order.
    pub fn precisions_run(&self) -> Vec<Precision> {
        Precision::ALL
            .iter()
            .copied()
            .filter(|p| self.runs(*p))
            .collect()
    }

    /// `family`, `efficiency_family` and `precisions`: names that are not blank, a peak for
    /// every precision listed.
    fn check_identity(&self, origin: &str) -> Result<(), ConfigError> {
        let bad = |field: &str, message: String| ConfigError::Field {
            origin: origin.to_string(),
            field: field.into(),
            message,
        };
        for (field, v) in [
            ("family", &self.family),
            ("efficiency_family", &self.efficiency_family),
        ] {
            if v.as_deref().is_some_and(|v| v.trim().is_empty()) {
                return Err(bad(field, "must name a family, got an empty string".into()));
            }
        }
        for p in &self.precisions {
            if self.peak_flops_for(*p).is_none() {
                return Err(bad(
                    "precisions",
                    format!(
                        "lists {p}, but peak_flops has no {} rate for it",
                        if *p == Precision::Nvfp4 { "fp4" } else { "fp8" }
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Rejects non-positive or non-finite rates and sizes.
    fn check(&self, origin: &str) -> Result<(), ConfigError> {
        self.check_identity(origin)?;
        self.check_power(origin)?;
        self.check_tables(origin)?;
        let positive = [
            ("hbm_bytes_per_s", self.hbm_bytes_per_s),
            ("peak_flops.bf16", self.peak_flops.bf16),
            ("peak_flops.fp16", self.peak_flops.fp16),
            ("peak_flops.fp32", self.peak_flops.fp32),
            (
                "links.intra_node.bandwidth_bytes_per_s",
                self.links.intra_node.bandwidth_bytes_per_s,
            ),
            (
                "links.inter_node.bandwidth_bytes_per_s",
                self.links.inter_node.bandwidth_bytes_per_s,
            ),
            ("efficiency.matmul", self.efficiency.matmul),
            ("efficiency.attention", self.efficiency.attention),
            ("efficiency.memory_bound", self.efficiency.memory_bound),
            (
                "links.intra_node.efficiency",
                self.links.intra_node.efficiency,
            ),
            (
                "links.inter_node.efficiency",
                self.links.inter_node.efficiency,
            ),
        ];
        // Values a profile may leave out, checked where given.
        let g = &self.gemm;
        let optional = [
            ("peak_flops.fp8", self.peak_flops.fp8),
            ("peak_flops.fp4", self.peak_flops.fp4),
            ("gemm.achievable_bf16_fraction", g.achievable_bf16_fraction),
            ("gemm.achievable_fp8_fraction", g.achievable_fp8_fraction),
            ("gemm.achievable_fp4_fraction", g.achievable_fp4_fraction),
            ("gemm.operand_stream_fraction", g.operand_stream_fraction),
        ]
        .into_iter()
        .filter_map(|(field, v)| v.map(|v| (field, v)));
        for (field, v) in positive.into_iter().chain(optional.clone()) {
            if !(v.is_finite() && v > 0.0) {
                return Err(ConfigError::Profile {
                    origin: origin.to_string(),
                    message: format!("{field} must be a positive finite number, got {v}"),
                });
            }
        }
        if self.gemm.sms == 0 || self.gemm.tile_m == 0 || self.gemm.tile_n == 0 {
            return Err(ConfigError::Profile {
                origin: origin.to_string(),
                message: "gemm.sms, gemm.tile_m and gemm.tile_n must be positive".into(),
            });
        }
        let margin = self.memory_margin_fraction;
        if !(margin.is_finite() && (0.0..1.0).contains(&margin)) {
            return Err(ConfigError::Profile {
                origin: origin.to_string(),
                message: format!("memory_margin_fraction must be in [0, 1), got {margin}"),
            });
        }
        // Fixed costs: non-negative, and at most a second (a larger one is a unit mistake and
        // overflows the step time to infinity).
        for (field, v) in [
            (
                "links.intra_node.latency_s",
                self.links.intra_node.latency_s,
            ),
            (
                "links.inter_node.latency_s",
                self.links.inter_node.latency_s,
            ),
            (
                "efficiency.kernel_overhead_s",
                self.efficiency.kernel_overhead_s,
            ),
        ] {
            if !(v.is_finite() && (0.0..=MAX_FIXED_COST_S).contains(&v)) {
                return Err(ConfigError::Profile {
                    origin: origin.to_string(),
                    message: format!(
                        "{field} must be in [0, {MAX_FIXED_COST_S}] seconds, got {v:?}"
                    ),
                });
            }
        }
        for (field, v) in [
            (
                "efficiency.overlap_interference",
                self.efficiency.overlap_interference,
            ),
            ("efficiency.sync_skew", self.efficiency.sync_skew),
        ] {
            if !(v.is_finite() && (0.0..=1.0).contains(&v)) {
                return Err(ConfigError::Profile {
                    origin: origin.to_string(),
                    message: format!("{field} must be in [0, 1], got {v}"),
                });
            }
        }
        for (field, v) in [
            ("efficiency.matmul", self.efficiency.matmul),
            ("efficiency.attention", self.efficiency.attention),
            ("efficiency.memory_bound", self.efficiency.memory_bound),
            (
                "links.intra_node.efficiency",
                self.links.intra_node.efficiency,
            ),
            (
                "links.inter_node.efficiency",
                self.links.inter_node.efficiency,
            ),
        ]
        .into_iter()
        .chain(optional.filter(|(field, _)| field.starts_with("gemm.")))
        {
            if v > 1.0 {
                return Err(ConfigError::Profile {
                    origin: origin.to_string(),
                    message: format!(
                        "{field} is an achieved fraction (of peak or of bandwidth) and must be at most 1, got {v}"
                    ),
                });
            }
        }
        self.check_attention_kernel(origin)?;
        if self.memory_bytes == 0 {
            return Err(ConfigError::Profile {
                origin: origin.to_string(),
                message: "memory_bytes must be positive".into(),
            });
        }
        if self.links.nvlink_domain_size == Some(0) {
            return Err(ConfigError::Profile {
                origin: origin.to_string(),
                message: "links.nvlink_domain_size must be at least 1 GPU".into(),
            });
        }
        self.check_nodes(origin)?;
        Ok(())
    }

    /// `gpus_per_node` at least 1; a domain a job is scheduled on is whole nodes inside the
    /// rack, and only with a rack.
    fn check_nodes(&self, origin: &str) -> Result<(), ConfigError> {
        let refuse = |message: String| {
            Err(ConfigError::Profile {
                origin: origin.to_string(),
                message,
            })
        };
        let per_node = self.gpus_per_node;
        if per_node == 0 {
            return refuse("gpus_per_node must be at least 1, got 0".into());
        }
        if let Some(part) = self.links.nvlink_domain_job_size {
            match self.links.nvlink_domain_size {
                Some(rack) if part > 0 && part < rack && part % per_node == 0 => {}
                rack => {
                    return refuse(format!(
                        "links.nvlink_domain_job_size ({part}) must be whole nodes of {per_node} GPUs inside links.nvlink_domain_size ({})",
                        rack.map_or("not given".into(), |r| r.to_string())
                    ))
                }
            }
        }
        Ok(())
    }

    /// A published attention kernel the profile names must be in the shipped rates.
    fn check_attention_kernel(&self, origin: &str) -> Result<(), ConfigError> {
        let Some(name) = &self.attention_kernel else {
            return Ok(());
        };
        if crate::attention_rates::attention_kernel(name).is_some() {
            return Ok(());
        }
        let known: Vec<&str> = crate::attention_rates::attention_kernels()
            .iter()
            .map(|k| k.name.as_str())
            .collect();
        Err(ConfigError::Profile {
            origin: origin.to_string(),
            message: format!(
                "attention_kernel {name:?} is not in calibration/data/attention-kernels.json (known: {})",
                known.join(", ")
            ),
        })
    }

    /// The GEMM efficiency of `precision`'s matmul dtype: `efficiency.matmul`, and for FP8 that
    /// scaled by the measured FP8 / bf16 ratio of achievable GEMM rates when the profile has
    /// both (FP8 GEMMs reach a smaller share of their doubled peak: 71% against 80% on H100).
    pub fn matmul_efficiency_for(&self, precision: Precision) -> f64 {
        let e = self.efficiency.matmul;
        match (
            precision,
            self.gemm.achievable_bf16_fraction,
            self.gemm.achievable_fp8_fraction,
        ) {
            // NVFP4 GEMMs take their own measured share of the FP4 peak where the profile
            // has one (calibration/data/gemm-rates-blackwell.json); MXFP8, and NVFP4
            // without one, FP8's: no achievable MXFP8 GEMM rate is published.
            (Precision::Nvfp4, Some(bf16), _) if self.gemm.achievable_fp4_fraction.is_some() => {
                (e * self.gemm.achievable_fp4_fraction.unwrap_or(bf16) / bf16).min(1.0)
            }
            (Precision::Fp8 | Precision::Mxfp8 | Precision::Nvfp4, Some(bf16), Some(fp8)) => {
                (e * fp8 / bf16).min(1.0)
            }
            _ => e,
        }
    }

    /// Dense peak FLOP/s for the matmul dtype of `precision`, if the GPU has it.
    pub fn peak_flops_for(&self, precision: Precision) -> Option<f64> {
        match precision {
            Precision::Bf16 => Some(self.peak_flops.bf16),
            Precision::Fp16 => Some(self.peak_flops.fp16),
            Precision::Fp8 | Precision::Mxfp8 => self.peak_flops.fp8,
            Precision::Fp32 => Some(self.peak_flops.fp32),
            Precision::Nvfp4 => self.peak_flops.fp4,
        }
    }
}
