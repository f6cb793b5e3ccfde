//! The training framework as a setting (`training.framework`): each framework's documented
//! overlap and bucketing defaults, applied under the user's explicit flags.
//!
//! Sources of the defaults:
//! - Megatron-Core (and NeMo, which runs it): `DistributedDataParallelConfig`
//!   (docs.nvidia.com/megatron-core/developer-guide/latest/apidocs/core/
//!   core.distributed.distributed_data_parallel_config.html): `bucket_size` None = max(40M,
//!   1M x dp) parameters; `overlap_grad_reduce` / `overlap_param_gather` are off in the library
//!   and turned on by NeMo's and Megatron-LM's performance recipes, which this default follows;
//!   `--tp-comm-overlap` is opt-in.
//! - DeepSpeed: the ZeRO section of www.deepspeed.ai/docs/config-json/: `reduce_bucket_size`
//!   5e8 elements, `stage3_prefetch_bucket_size` 5e7 elements, `overlap_comm` false except for
//!   stage 3 (where DeepSpeed turns it on); no TP communication overlap.
//! - PyTorch FSDP: docs.pytorch.org/docs/stable/notes/fsdp.html ("FSDP Prefetch Nuances"):
//!   one all-gather per wrapped unit (a transformer layer under the usual auto-wrap policy),
//!   implicit forward prefetching always on, `backward_prefetch = BACKWARD_PRE` by default;
//!   gradients reduce-scattered per unit on a separate stream during backward.
//! - Pipeline sends and receives (`parallel.pp_p2p`): DeepSpeed's `PipelineEngine`
//!   (deepspeed/runtime/pipe/engine.py, `_exec_send_activations` ... `_exec_recv_grads`,
//!   blocking `p2p.send` / `p2p.recv` instructions between the compute instructions) blocks;
//!   Megatron-Core's p2p is asynchronous; FSDP has no pipeline (overlapped, which costs as
//!   nothing there).

use super::enums::{PpP2p, ScheduleKind};
use super::parallel::ParallelConfig;
use serde::{Deserialize, Serialize};

/// Which training framework runs the step.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Framework {
    /// Megatron-Core (Megatron-LM, NeMo).
    #[default]
    #[serde(alias = "nemo")]
    MegatronCore,
    /// DeepSpeed with ZeRO.
    Deepspeed,
    /// PyTorch FullyShardedDataParallel (per-layer wrapping).
    Fsdp,
}

/// DeepSpeed's `reduce_bucket_size` default, elements.
pub const DEEPSPEED_REDUCE_BUCKET: u64 = 500_000_000;
/// DeepSpeed's `stage3_prefetch_bucket_size` default, elements: each prefetch all-gather's
/// size (src/dp_calls.rs).
pub const DEEPSPEED_PREFETCH_BUCKET: u64 = 50_000_000;
/// DeepSpeed's `stage3_param_persistence_threshold` default, elements: parameters this small
/// or smaller are never partitioned.
pub const DEEPSPEED_PERSISTENCE_THRESHOLD: u64 = 100_000;
/// DeepSpeed's `stage3_max_live_parameters` default, elements: how much a rank may hold
/// gathered, which bounds its prefetch.
pub const DEEPSPEED_MAX_LIVE_PARAMS: u64 = 1_000_000_000;

/// The overlap switches a framework turns on by default.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OverlapDefaults {
    pub tp_comm_overlap: bool,
    pub overlap_grad_reduce: bool,
    pub overlap_param_gather: bool,
}

impl Framework {
    pub const ALL: [Framework; 3] = [
        Framework::MegatronCore,
        Framework::Deepspeed,
        Framework::Fsdp,
    ];

    /// The name in configurations and on the command line.
    pub const fn name(self) -> &'static str {
        match self {
            Framework::MegatronCore => "megatron-core",
            Framework::Deepspeed => "deepspeed",
            Framework::Fsdp => "fsdp",
        }
    }

    /// The pipeline schedules the framework's mainline runs:
    /// - Megatron-Core: `get_forward_backward_func` in megatron/core/pipeline_parallel/
    ///   schedules.py (NVIDIA/Megatron-LM, commit d98e8a64) picks
    ///   `forward_backward_pipelining_without_interleaving` (1F1B) or, with virtual stages,
    ///   `..._with_interleaving`; there is no GPipe, zero-bubble or DualPipe schedule.
    /// - DeepSpeed: `PipelineEngine` runs `TrainSchedule` (deepspeed/runtime/pipe/schedule.py),
    ///   a one-forward-one-backward schedule.
    /// - FSDP (torchtitan): torch.distributed.pipelining's `ScheduleGPipe`, `Schedule1F1B`,
    ///   `ScheduleInterleaved1F1B`, `ScheduleInterleavedZeroBubble` (ZB-H1's ZB1P),
    ///   `ScheduleZBVZeroBubble` and `ScheduleDualPipeV` (torch/distributed/pipelining/
    ///   schedules.py).
    pub fn schedules(self) -> &'static [ScheduleKind] {
        match self {
            Framework::MegatronCore => &[ScheduleKind::OneFOneB, ScheduleKind::Interleaved1F1B],
            Framework::Deepspeed => &[ScheduleKind::OneFOneB],
            Framework::Fsdp => ScheduleKind::ALL,
        }
    }

    /// Where [`Framework::schedules`] is read, in a few words.
    pub fn schedules_source(self) -> &'static str {
        match self {
            Framework::MegatronCore => {
                "Megatron-LM's get_forward_backward_func (megatron/core/pipeline_parallel/schedules.py)"
            }
            Framework::Deepspeed => "DeepSpeed's PipelineEngine TrainSchedule",
            Framework::Fsdp => "torch.distributed.pipelining's schedules",
        }
    }

    /// Parses a configuration or command-line value (`nemo` = megatron-core).
    pub fn parse(s: &str) -> Option<Framework> {
        match s {
            "megatron-core" | "nemo" => Some(Framework::MegatronCore),
            "deepspeed" => Some(Framework::Deepspeed),
            "fsdp" => Some(Framework::Fsdp),
            _ => None,
        }
    }

    /// The overlap switches on by default at ZeRO stage `zero`.
    pub fn overlap_defaults(self, zero: u8) -> OverlapDefaults {
        match self {
            Framework::MegatronCore => OverlapDefaults {
                tp_comm_overlap: false,
                overlap_grad_reduce: true,
                overlap_param_gather: true,
            },
            // overlap_comm: off by default, on for stage 3 (with its parameter prefetch).
            Framework::Deepspeed => OverlapDefaults {
                tp_comm_overlap: false,
                overlap_grad_reduce: zero >= 3,
                overlap_param_gather: zero >= 3,
            },
            Framework::Fsdp => OverlapDefaults {
                tp_comm_overlap: false,
                overlap_grad_reduce: true,
                overlap_param_gather: true,
            },
        }
    }

    /// Parameters per data-parallel gradient bucket when `parallel.ddp_bucket_size` is unset:
    /// Megatron-Core max(40M, 1M x dp), DeepSpeed's 5e8 elements, FSDP one wrapped layer.
    pub fn grad_bucket_params(self, dp: u32, layer_params: u64) -> u64 {
        match self {
            Framework::MegatronCore => 40_000_000u64.max(1_000_000 * dp as u64),
            Framework::Deepspeed => DEEPSPEED_REDUCE_BUCKET,
            Framework::Fsdp => layer_params.max(1),
        }
    }

    /// Parameters ZeRO-3 gathers ahead of the layer computing, when
    /// `parallel.zero3_prefetch_params` is unset: Megatron-Core dispatches the next bucket's
    /// gather as the current one computes and FSDP the next unit's (one layer ahead);
    /// DeepSpeed's depth is what its prefetch reaches (`deepspeed_ahead`, from
    /// src/dp_calls.rs: each module's hook prefetches one more `stage3_prefetch_bucket_size`
    /// group until `stage3_max_live_parameters` are held).
    pub fn prefetch_params(self, layer_params: u64, deepspeed_ahead: Option<u64>) -> u64 {
        match self {
            Framework::MegatronCore | Framework::Fsdp => layer_params,
            Framework::Deepspeed => deepspeed_ahead.unwrap_or(DEEPSPEED_PREFETCH_BUCKET),
        }
    }

    /// How this framework's pipeline engine runs its sends and receives when
    /// `parallel.pp_p2p` is unset: DeepSpeed's blocks, the others overlap.
    pub fn pp_p2p(self) -> PpP2p {
        match self {
            Framework::Deepspeed => PpP2p::Blocking,
            Framework::MegatronCore | Framework::Fsdp => PpP2p::Overlapped,
        }
    }

    /// Sets `p`'s overlap switches to this framework's defaults at `p.zero`.
    pub fn apply_defaults(self, p: &mut ParallelConfig) {
        let d = self.overlap_defaults(p.zero);
        p.tp_comm_overlap = d.tp_comm_overlap;
        p.overlap_grad_reduce = d.overlap_grad_reduce;
        p.overlap_param_gather = d.overlap_param_gather;
    }

    /// The settings of `p` that differ from this framework's defaults (explicit overrides),
    /// as `field = value` lines for `--explain` and the breakdown.
    pub fn overrides(self, p: &ParallelConfig) -> Vec<String> {
        let d = self.overlap_defaults(p.zero);
        let mut out = Vec::new();
        let mut flag = |name: &str, got: bool, default: bool| {
            if got != default {
                out.push(format!(
                    "parallel.{name} = {got} (overrides {}'s default {default})",
                    self.name()
                ));
            }
        };
        flag("tp_comm_overlap", p.tp_comm_overlap, d.tp_comm_overlap);
        flag(
            "overlap_grad_reduce",
            p.overlap_grad_reduce,
            d.overlap_grad_reduce,
        );
        flag(
            "overlap_param_gather",
            p.overlap_param_gather,
            d.overlap_param_gather,
        );
        if let Some(b) = p.ddp_bucket_size {
            out.push(format!(
                "parallel.ddp_bucket_size = {b} (overrides {}'s bucket)",
                self.name()
            ));
        }
        let deepspeed = [
            ("zero3_prefetch_params", p.zero3_prefetch_params),
            ("zero3_prefetch_bucket_size", p.zero3_prefetch_bucket_size),
            (
                "zero3_param_persistence_threshold",
                p.zero3_param_persistence_threshold,
            ),
            ("zero3_max_live_parameters", p.zero3_max_live_parameters),
        ];
        for (name, v) in deepspeed {
            if let Some(b) = v {
                out.push(format!(
                    "parallel.{name} = {b} (overrides {}'s prefetch)",
                    self.name()
                ));
            }
        }
        if let Some(v) = p.pp_p2p.filter(|v| *v != self.pp_p2p()) {
            out.push(format!(
                "parallel.pp_p2p = \"{v}\" (overrides {}'s default \"{}\")",
                self.name(),
                self.pp_p2p()
            ));
        }
        out
    }
}

/// Seconds of ZeRO-3 parameter gathering left exposed over `layers` layers of a chunk:
/// `gather_s` of all-gathers against `compute_s` of compute, gathering `prefetch_params` ahead
/// of layers of `layer_params` each. The first layer's gather has nothing to hide behind
/// (PyTorch's FSDP notes); each later layer's prefetched share f = min(1, prefetch/layer)
/// hides behind the previous layer's compute, the rest waits: per layer
/// (1 - f) g + max(0, f g - c).
pub fn zero3_exposed_s(
    gather_s: f64,
    compute_s: f64,
    layers: u64,
    layer_params: u64,
    prefetch_params: u64,
) -> f64 {
    if layers == 0 || gather_s <= 0.0 {
        return gather_s.max(0.0);
    }
    let n = layers as f64;
    let g = gather_s / n;
    let c = compute_s.max(0.0) / n;
    let f = (prefetch_params as f64 / layer_params.max(1) as f64).min(1.0);
    g + (n - 1.0) * ((1.0 - f) * g + (f * g - c).max(0.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// No prefetch exposes every gather; a full layer of prefetch exposes the first layer and
    /// only what outlasts compute after it; exposure never grows with a deeper prefetch.
    #[test]
    fn exposed_gather_follows_prefetch_depth() {
        let (g, c, l, lp) = (8.0, 16.0, 8, 100);
        assert_eq!(zero3_exposed_s(g, c, l, lp, 0), g);
        assert_eq!(zero3_exposed_s(g, c, l, lp, 100), 1.0);
        // Gathers outlasting compute: the first layer plus (g - c) per later layer.
        assert_eq!(zero3_exposed_s(16.0, 8.0, 8, lp, 100), 2.0 + 7.0);
        let mut last = f64::INFINITY;
        for p in [0, 10, 50, 100, 1000] {
            let e = zero3_exposed_s(g, c, l, lp, p);
            assert!(e <= last && e >= 1.0 - 1e-12, "{p}: {e}");
            last = e;
        }
    }

    #[test]
    fn names_round_trip_and_nemo_is_megatron() {
        for f in Framework::ALL {
            assert_eq!(Framework::parse(f.name()), Some(f));
            let json = serde_json::to_value(f).unwrap();
            assert_eq!(json, f.name());
        }
        assert_eq!(Framework::parse("nemo"), Some(Framework::MegatronCore));
        assert_eq!(Framework::parse("jax"), None);
    }
}
