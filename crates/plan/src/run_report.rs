//! What a run reports: per-rank step times, phase times, memory, GEMM rate, context-parallel
//! ring timings and MoE drops, and the run's losses and exported tensors. Plain data, the
//! same for every backend; the engine's `execute` command prints and serialises it.

use crate::op_timing::OpTiming;
use crate::plan::Coords;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Bytes per category.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryBreakdown {
    pub weights: u64,
    pub gradients: u64,
    pub optimizer: u64,
    pub activations: u64,
    pub buffers: u64,
}

impl MemoryBreakdown {
    pub fn total(&self) -> u64 {
        self.weights + self.gradients + self.optimizer + self.activations + self.buffers
    }
}

/// Seconds a rank spent per kind of action, per timed step (mean).
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
pub struct PhaseTimes {
    pub forward_s: f64,
    /// Full backward (B) and input-gradient (I) passes, with their weight gradients for B.
    pub backward_s: f64,
    /// Weight-gradient passes (W) of a split backward.
    pub backward_weight_s: f64,
    /// Sends and receives, waiting included.
    pub p2p_s: f64,
    /// Data-parallel reduction and Adam.
    pub optimizer_s: f64,
}

/// Seconds of one ring step (summed over the timed steps' calls).
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
pub struct StepTime {
    pub compute_s: f64,
    pub comm_s: f64,
}

/// What a rank measured of its context-parallel attention.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct CpStats {
    /// Unmasked score elements of the forward attention (recomputation excluded), all steps.
    pub score_elements: u64,
    /// Per ring step (index t = 0..cp; one step for Ulysses): forward and backward times.
    pub forward: Vec<StepTime>,
    pub backward: Vec<StepTime>,
}

/// One rank's measurements.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct RankReport {
    pub rank: u32,
    pub coords: Coords,
    /// Seconds of each timed step.
    pub step_s: Vec<f64>,
    /// Where the timed steps' time went.
    pub phases: PhaseTimes,
    /// Tracked bytes by category at the moment of the peak total.
    pub peak: MemoryBreakdown,
    /// Each category's own maximum (reached at different moments).
    pub category_max: MemoryBreakdown,
    /// Bytes the backend's allocator reserved at its peak (the CPU allocates exactly: equal
    /// to `peak`; a caching device allocator rounds up).
    pub reserved_peak: MemoryBreakdown,
    /// Source location of the allocation that reached the peak (diagnosis).
    pub peak_site: Option<String>,
    /// FLOPs and seconds of this rank's GEMMs over all steps.
    pub gemm_flops: f64,
    pub gemm_seconds: f64,
    /// Context-parallel attention: per ring step compute and communication seconds (timed
    /// steps, summed), and the causal work (cp > 1).
    pub cp: Option<CpStats>,
    /// Token-to-expert assignments the expert capacity dropped, over all steps (MoE).
    pub moe_dropped: u64,
    /// What the routing sent this rank's experts (MoE): the measure of the load imbalance.
    #[serde(default)]
    pub moe_load: MoeLoad,
    /// A GPU backend's own memory figures (absent on the CPU).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<DeviceMemoryReport>,
    /// Op-class timings of the timed steps, summed, one record per key (empty unless the
    /// run profiled its ops: `execute --profile-ops`, `--calibrate`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ops: Vec<OpTiming>,
}

/// The rows an MoE run's routing sent a rank's experts, summed over its MoE layers and the
/// forwards of all steps (a full recompute's reruns excluded), beside the assignments the rank
/// itself routed. Every member of an EP group routes as many tokens, so `routed` is the rank's
/// uniform share of received rows (a balanced router's), and routed / (E / ep) each expert's.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MoeLoad {
    /// The rank's uniform share of received rows (a balanced router's, before the capacity
    /// drops any): `assigned` x expert TP, as each expert slice runs the rows received by
    /// every member of its expert-TP group (the whole microbatch's tokens x top-k under
    /// expert-TP = tp, the rank's own under whole experts).
    pub routed: u64,
    /// The assignments of the tokens this rank itself routes (its sequence shard's under TP),
    /// before the capacity drops any: what `RankReport::moe_dropped` is a part of.
    #[serde(default)]
    pub assigned: u64,
    /// Rows each local expert received from the whole EP group (the kept assignments): local
    /// expert j is global expert ep_index x (E / ep) + j.
    pub expert_rows: Vec<u64>,
}

impl MoeLoad {
    /// Rows the rank's experts received in all.
    pub fn received(&self) -> u64 {
        self.expert_rows.iter().sum()
    }

    /// The rank's received rows over its uniform share; `None` without routing.
    pub fn rank_load(&self) -> Option<f64> {
        (self.routed > 0).then(|| self.received() as f64 / self.routed as f64)
    }

    /// The hottest local expert's rows over an expert's uniform share (routed / local experts).
    pub fn hottest_expert_load(&self) -> Option<f64> {
        let local = self.expert_rows.len() as f64;
        let max = self.expert_rows.iter().copied().max()?;
        (self.routed > 0).then(|| max as f64 * local / self.routed as f64)
    }

    /// Adds one MoE layer's forward: `assigned` assignments of the rank's own tokens, its
    /// experts split over `etp` ranks, `rows[j]` received by local expert j.
    pub fn add(&mut self, assigned: u64, etp: u64, rows: impl ExactSizeIterator<Item = u64>) {
        if self.expert_rows.len() < rows.len() {
            self.expert_rows.resize(rows.len(), 0);
        }
        self.routed += assigned * etp;
        self.assigned += assigned;
        for (acc, r) in self.expert_rows.iter_mut().zip(rows) {
            *acc += r;
        }
    }
}

/// What a GPU rank's allocator and driver say about memory, next to the tracked categories
/// (`peak`, `reserved_peak`): the caching pool's bytes held from the device at its peak (the
/// tracked reserved bytes plus the cached free blocks and the cuBLASLt workspace), and
/// `cuMemGetInfo`'s used and total bytes of the GPU at the end of the run (every process and
/// context on it, the CUDA context itself included).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceMemoryReport {
    pub pool_reserved_peak_bytes: u64,
    pub driver_used_bytes: u64,
    pub driver_total_bytes: u64,
}

impl RankReport {
    /// Median of the timed steps (0 when there are none).
    pub fn median_step_s(&self) -> f64 {
        let mut v = self.step_s.clone();
        v.sort_by(|a, b| a.total_cmp(b));
        match v.len() {
            0 => 0.0,
            k if k % 2 == 1 => v[k / 2],
            k => 0.5 * (v[k / 2 - 1] + v[k / 2]),
        }
    }
}

/// A whole run (serialisable: a worker process sends its report to rank 0 as JSON).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct RunReport {
    pub world: u32,
    /// The global mean token loss of every step (warm-up included), computed on the
    /// parameters before that step's update; with MoE layers it includes the load-balancing
    /// loss. Non-finite values travel as strings in JSON ([`crate::nonfinite`]).
    #[serde(with = "crate::nonfinite")]
    pub loss: Vec<f64>,
    /// The load-balancing part of `loss` (Fedus et al. 2021, eq. 4): per MoE layer and
    /// microbatch, averaged over the microbatches of the step and summed over the layers.
    #[serde(with = "crate::nonfinite")]
    pub aux_loss: Vec<f64>,
    pub ranks: Vec<RankReport>,
    /// Global parameter tensors after the last step (flat, row-major), when asked for.
    pub params: Option<BTreeMap<String, Vec<f32>>>,
    /// Global gradient tensors of the last step, when asked for.
    pub grads: Option<BTreeMap<String, Vec<f32>>>,
    /// A launched process's share of `params` (and `grads`): the pieces of the global
    /// tensors its rank holds, which rank 0 merges into whole tensors
    /// (the launcher's `worker::combine`); `None` in one process and once merged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub param_pieces: Option<crate::pieces::TensorPieces>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grad_pieces: Option<crate::pieces::TensorPieces>,
    /// Per rank, every action of the timed steps with its start and end, when asked for.
    pub traces: Option<Vec<crate::trace::RankTrace>>,
}
